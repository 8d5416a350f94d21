"""Epsilon in an attacker's terms: the best membership test a guarantee still allows.

A membership attacker who knows everything but whether one record was used tests
H0 "out" (output ~ M(D)) against H1 "in" (output ~ M(D')). Its trade-off curve, the highest
true-positive rate (TPR) at each false-positive rate (FPR), is bounded by the mechanism's
f-DP guarantee [DRS19]; this module computes that bound from a privacy profile delta(eps)
(the hockey-stick divergences, e.g. of a privacy loss distribution), as in [KGFP24]:

    every (eps, delta(eps)), eps >= 0, holding for both orders of the neighbours, gives
        TPR <= min(1, e^eps FPR + delta, 1 - e^-eps (1 - delta - FPR))  [DRS19, Prop. 2.5]
    and the bound is the minimum over the profile [DRS19, Prop. 2.12], i.e.
        f(alpha) = 1 - TPR(alpha) = sup_eps max(0, 1 - delta - e^eps alpha, e^-eps (1 - delta - alpha)).

Any finite set of profile points with deltas that are upper bounds gives a valid curve (each
point is a true (eps, delta)-DP statement), so every approximation here errs on the safe side:
the profile of DP-SGD is read off the pessimistic PLD of `pld.py` (connect-the-dots, an upper
bound on delta at every eps), and TPR is never under-stated.

    max advantage   max (TPR - FPR) = delta(0), the total-variation distance [KGFP24, Sec. 3]
    posterior       an attacker with prior `prior` that the record is in, after seeing the
                    output: its posterior is prior e^L / (prior e^L + 1 - prior), L the privacy
                    loss of that output. With probability at least 1 - delta (over the
                    mechanism's randomness, for a record that is in) L <= loss_bound, where
                        P(L > e') <= delta(eps) / (1 - e^(eps - e'))  for every eps < e'
                    (Markov on the hockey-stick: delta(eps) >= E[(1 - e^(eps - L)) 1{L > e'}]),
                    so posterior <= prior e^e' / (prior e^e' + 1 - prior) except with
                    probability delta. This is the "probabilistic DP" reading of the profile;
                    unlike the pure-DP formula prior e^eps / (...) it holds with delta > 0.

References
----------
[DRS19]  J. Dong, A. Roth, W. Su, "Gaussian Differential Privacy", JRSS B 2022 (arXiv:1905.02383,
         2019): trade-off functions, f-DP, Prop. 2.5 ((eps, delta)-DP as f_{eps,delta}) and
         Prop. 2.12 (f-DP <=> a family of (eps, delta)-DP guarantees); mu-GDP:
         TPR(alpha) = Phi(Phi^-1(alpha) + mu).
[KGFP24] B. Kulynych, J. F. Gomez, G. Kaissis, F. du Pin Calmon, C. Troncoso, "Attack-Aware
         Noise Calibration for Differential Privacy", NeurIPS 2024 (arXiv:2407.02191): advantage
         = delta(0), TPR/FPR from a PLD, calibrating the noise to an attack's TPR at a given FPR.
[CKS20]  C. Canonne, G. Kamath, T. Steinke, "The Discrete Gaussian for Differential Privacy",
         arXiv:2004.00010, Prop. 12 (v4): the RDP -> (eps, delta) conversion, inverted here.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.privacy import _validate
from engine.privacy import pld as _pld
from engine.privacy._search import find_boundary, log_of

__all__ = [
    "DEFAULT_FPR",
    "FPR_LEVELS",
    "PRIORS",
    "AttackRisk",
    "PrivacyProfile",
    "attack_risk",
    "calibrate_noise_multiplier_for_attack",
    "dpsgd_attack_risk",
    "dpsgd_privacy_profile",
    "epsilon_from_profile",
    "highest_tpr",
    "loss_bound",
    "max_advantage",
    "posterior_bound",
    "rdp_privacy_profile",
]

FPR_LEVELS = (0.01, 0.001)
"""False-positive rates at which the TPR bound is reported."""

PRIORS = (0.01, 0.5)
"""Attacker priors (probability that the record is in) at which the posterior is reported."""


def _default_fpr() -> np.ndarray:
    grid = np.unique(np.concatenate([[0.0], np.logspace(-6, 0, 61), np.linspace(0.0, 1.0, 101), FPR_LEVELS]))
    grid.flags.writeable = False
    return grid


DEFAULT_FPR: np.ndarray = _default_fpr()
"""FPR grid of the reported trade-off curve (read-only): 0, 1e-6..1 (10 per decade), 0..1 by 0.01."""

_U = float(np.finfo(float).eps)
_MAX_LOG_GAMMA = 700.0  # the curve ignores profile points beyond this eps (e^eps overflows there)
_WINDOW = 3  # neighbours checked around the envelope index found by search


@dataclass(frozen=True)
class PrivacyProfile:
    """delta(eps) at increasing eps >= 0 (starting at 0): each delta an upper bound for both
    orders of the neighbouring datasets, i.e. an (eps, delta)-DP statement."""

    epsilons: np.ndarray
    deltas: np.ndarray

    def __post_init__(self) -> None:
        eps = np.asarray(self.epsilons, dtype=float)
        dl = np.asarray(self.deltas, dtype=float)
        if eps.ndim != 1 or eps.shape != dl.shape or eps.size == 0:
            raise ValueError(f"a privacy profile needs one delta per epsilon; got {eps.shape} and {dl.shape}")
        if not (np.all(np.isfinite(eps)) and np.all(eps >= 0) and np.all(np.diff(eps) > 0) and eps[0] == 0.0):
            raise ValueError("profile epsilons must be finite, increasing and start at 0")
        if np.any(np.isnan(dl)) or np.any(dl < 0) or np.any(dl > 1):
            raise ValueError("profile deltas must be in [0, 1]")
        object.__setattr__(self, "epsilons", eps)
        object.__setattr__(self, "deltas", dl)


@dataclass(frozen=True)
class AttackRisk:
    """What a guarantee allows the best membership attacker; every figure an upper bound.

    `tradeoff_fpr`/`tradeoff_tpr`: the curve (highest TPR at each FPR). `tpr_at_fpr` and
    `posterior` are keyed by FPR and by prior. `loss_bound`: the privacy loss exceeded with
    probability at most `delta`, on which the posterior rests; `epsilon` is the (eps, delta)
    guarantee itself, for reference.
    """

    max_advantage: float
    tpr_at_fpr: dict[float, float]
    posterior: dict[float, float]
    tradeoff_fpr: np.ndarray
    tradeoff_tpr: np.ndarray
    epsilon: float
    delta: float
    loss_bound: float

    def to_json(self) -> dict:
        """The `dpw privacy risk --json` object (keys of the dicts as strings, e.g. "0.01")."""
        return {
            "max_advantage": self.max_advantage,
            "tpr_at_fpr": {f"{k:g}": v for k, v in self.tpr_at_fpr.items()},
            "posterior": {f"{k:g}": v for k, v in self.posterior.items()},
            "tradeoff": {"fpr": self.tradeoff_fpr.tolist(), "tpr": self.tradeoff_tpr.tolist()},
            "epsilon": _finite_or_none(self.epsilon),
            "delta": self.delta,
            "loss_bound": _finite_or_none(self.loss_bound),
        }


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None  # JSON has no infinity


# ---------------------------------------------------------------------------------------
# Profiles
# ---------------------------------------------------------------------------------------


def dpsgd_privacy_profile(
    *, sample_rate: float, noise_multiplier: float, steps: int, discretization: float | None = None
) -> PrivacyProfile:
    """Privacy profile of DP-SGD (Poisson-subsampled Gaussian over `steps`) from the pessimistic PLD.

    Both directions (add, remove) are composed by `pld.py`; the profile is read at every grid
    point eps >= 0 of the composed discrete PLDs (exact for those discrete pairs, which dominate
    the true ones [pld.py, DGKKM22]), the larger of the two directions, rounded up by a bound on
    the summation error. `discretization` as in `pld_epsilon`.
    """
    q, sigma, t, h = _pld._check(sample_rate, noise_multiplier, steps, discretization)
    if q == 0.0 or t == 0:
        return PrivacyProfile(epsilons=np.zeros(1), deltas=np.zeros(1))
    if sigma < _pld._SIGMA_FLOOR:  # no noise, or too little for the PLD (as pld_delta): no bound
        return PrivacyProfile(epsilons=np.zeros(1), deltas=np.ones(1))
    composed = (_pld._compose_direction(q, sigma, t, h, add, _pld._WINDOW_TAIL) for add in (False, True))
    directions = [_grid_profile(c) for c in composed]
    eps = np.unique(np.concatenate([grid for grid, _ in directions]))
    deltas = np.max([_interpolate_profile(grid, values, eps) for grid, values in directions], axis=0)
    return PrivacyProfile(epsilons=eps, deltas=np.minimum(deltas, 1.0))


def _grid_profile(c) -> tuple[np.ndarray, np.ndarray]:
    """(eps_k, delta_k) at each grid point eps_k = k h >= 0 of a composed discrete PLD.

    D_k = extra + sum_{j>k} g_j (1 - e^-(l_j - l_k)) is summed without cancellation as
    D_k = extra + (1 - e^-h) sum_{m>k} S_m with S_m = sum_{j>=m} g_j e^-(l_j - l_m) (all terms
    positive), and each value is raised by a bound on its relative round-off.
    """
    start = max(0, -c.first)  # index of loss 0 (the window always contains it)
    g = np.asarray(c.g[start:], dtype=float)
    n = g.size
    idx = np.arange(n)
    with np.errstate(divide="ignore"):
        log_terms = np.log(g) - idx * c.h
    log_cum = np.logaddexp.accumulate(log_terms[::-1])[::-1]  # log sum_{j>=m} g_j e^{-j h}
    s = np.exp(log_cum + idx * c.h)  # S_m <= total mass: no overflow; -inf (no mass) gives 0
    tail = np.concatenate([np.cumsum(s[::-1])[::-1][1:], [0.0]])  # sum_{m>k} S_m
    d = c.extra + -math.expm1(-c.h) * tail
    d = d * (1.0 + 8.0 * (n + 1000) * _U) + 1e-300
    eps = (c.first + start + idx) * c.h
    return eps, d


def _interpolate_profile(eps: np.ndarray, deltas: np.ndarray, at: np.ndarray) -> np.ndarray:
    """delta of a composed discrete PLD at `at`, from its values at the grid points `eps`.

    Between grid points the hockey-stick of a discrete pair is linear in gamma = e^eps, so the
    interpolation is linear in e^eps; beyond the top point only the mass at +inf is left,
    whose delta is the top point's value.
    """
    k = np.clip(np.searchsorted(eps, at, side="right") - 1, 0, eps.size - 1)
    out = deltas[k].copy()
    inside = k < eps.size - 1
    kk = k[inside]
    lo_e, hi_e = eps[kk], eps[kk + 1]
    w = np.expm1(at[inside] - lo_e) / np.expm1(hi_e - lo_e)  # in [0, 1): position in gamma
    out[inside] = deltas[kk] + w * (deltas[kk + 1] - deltas[kk])
    return out * (1.0 + 4.0 * _U)


def rdp_privacy_profile(*, orders, rdp, epsilons=None) -> PrivacyProfile:
    """Privacy profile implied by an RDP curve (e.g. PATE's guarantee), at `epsilons`.

    delta(eps) = min over orders alpha of exp((alpha - 1)(rdp - eps + log(1 - 1/alpha)) - log alpha),
    the conversion of [CKS20, Prop. 12] solved for delta, capped by the total-variation bound
    sqrt(1 - e^-min rdp) [Bretagnolle & Huber 1979] and by 1. RDP bounds both orders of
    the neighbours, so the profile does. Default epsilons: 0 to 60 in 6,001 steps of 0.01.
    """
    alphas, values = _validate.rdp_curve(orders, rdp)
    eps = np.linspace(0.0, 60.0, 6001) if epsilons is None else np.asarray(epsilons, dtype=float)
    log_delta = (alphas - 1.0) * (values - eps[:, None] + np.log1p(-1.0 / alphas)) - np.log(alphas)
    best = np.min(log_delta, axis=1)
    with np.errstate(over="ignore"):
        deltas = np.exp(best + 8.0 * _U * (np.abs(best) + 1.0))  # rounded up
    # Every delta(eps), eps >= 0, is at most the total variation <= sqrt(1 - e^-KL) [BH79], and
    # KL <= D_alpha for every alpha > 1.
    tv = math.sqrt(-math.expm1(-float(np.min(values)))) * (1.0 + 4.0 * _U)
    return PrivacyProfile(epsilons=eps, deltas=np.minimum(np.minimum(deltas, tv), 1.0))


# ---------------------------------------------------------------------------------------
# From a profile to attack figures
# ---------------------------------------------------------------------------------------


def highest_tpr(*, profile: PrivacyProfile, fpr) -> np.ndarray:
    """Upper bound on the TPR of any membership test at each FPR (the f-DP curve, 1 - f(alpha)).

    min over the profile of e^eps alpha + delta and 1 - e^-eps (1 - delta - alpha) [DRS19,
    Prop. 2.5/2.12], clipped to [alpha, 1] (TPR = FPR is always achievable by guessing). The
    minimum is found on the lower envelope of these lines; any profile point gives a valid bound.
    """
    alpha = np.asarray(fpr, dtype=float).ravel()
    if np.any(np.isnan(alpha)) or np.any(alpha < 0) or np.any(alpha > 1):
        raise ValueError("fpr must be in [0, 1] (a false-positive rate)")
    keep = profile.epsilons <= _MAX_LOG_GAMMA  # a subset of the points is still a valid bound
    eps, dl = profile.epsilons[keep], profile.deltas[keep]
    gamma = np.exp(eps)
    # Family 1: delta_k + gamma_k alpha; family 2: 1 - (1 - delta_k)/gamma_k + alpha/gamma_k.
    first = _lower_envelope(dl[::-1], gamma[::-1], alpha)
    second = _lower_envelope(1.0 - (1.0 - dl) / gamma, 1.0 / gamma, alpha)
    tpr = np.minimum(np.minimum(first, second), 1.0)
    # Round the result up by a few ulps (products and sums above), then TPR >= FPR.
    tpr = np.minimum(tpr + 8.0 * _U * (1.0 + tpr), 1.0)
    return np.maximum(tpr, alpha).reshape(np.shape(fpr))


def _lower_envelope(intercepts: np.ndarray, slopes: np.ndarray, x: np.ndarray) -> np.ndarray:
    """min_k intercepts_k + slopes_k x for lines given with decreasing slopes, at each x >= 0.

    For lines on a lower (concave) envelope the best index increases with x; it is located by
    searching the crossing points of neighbouring lines, and the lines around it are checked.
    Any index gives an upper bound on the minimum, so an irregular envelope costs tightness only.
    """
    n = intercepts.size
    if n == 1:
        return intercepts[0] + slopes[0] * x
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = (intercepts[1:] - intercepts[:-1]) / (slopes[:-1] - slopes[1:])
    cross = np.maximum.accumulate(np.where(np.isnan(cross), -np.inf, cross))
    k = np.searchsorted(cross, x, side="left")
    cand = np.clip(k[:, None] + np.arange(-_WINDOW, _WINDOW + 1)[None, :], 0, n - 1)
    values = intercepts[cand] + slopes[cand] * x[:, None]
    return np.min(values, axis=1)


def max_advantage(*, profile: PrivacyProfile) -> float:
    """Upper bound on max (TPR - FPR) over all membership tests: delta(0), the total variation."""
    return float(min(1.0, profile.deltas[0]))


def loss_bound(*, profile: PrivacyProfile, delta: float) -> float:
    """A privacy loss e' exceeded with probability at most `delta` (module docstring; inf if none).

    e' = min over profile points with delta_k < delta of eps_k - log(1 - delta_k / delta), the
    smallest e' with delta_k / (1 - e^(eps_k - e')) <= delta, rounded up.
    """
    d = _validate.delta(delta)
    ok = profile.deltas < d
    if not np.any(ok):
        return math.inf
    bound = float(np.min(profile.epsilons[ok] - np.log1p(-profile.deltas[ok] / d)))
    return bound + 8.0 * _U * abs(bound) + 1e-15


def posterior_bound(*, profile: PrivacyProfile, prior: float, delta: float) -> float:
    """Upper bound on the attacker's posterior that the record is in, except with probability `delta`.

    prior e^e' / (prior e^e' + 1 - prior) with e' = loss_bound(profile, delta): the Bayesian
    posterior after an output whose privacy loss is at most e' (module docstring); 1 when no
    such e' exists.
    """
    p = _probability("prior", prior)
    bound = loss_bound(profile=profile, delta=delta)
    if p == 0.0 or p == 1.0:
        return p
    if math.isinf(bound):
        return 1.0
    log_odds = math.log(p) - math.log1p(-p) + bound
    # logistic(x) <= e^x: used where e^-x would overflow, so the bound is never rounded down to 0.
    post = 1.0 / (1.0 + math.exp(-log_odds)) if log_odds > -700.0 else math.exp(log_odds)
    return min(1.0, post * (1.0 + 4.0 * _U))


def _probability(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1] (a probability); got {value!r}")
    return float(value)


def epsilon_from_profile(*, profile: PrivacyProfile, delta: float) -> float:
    """Smallest profile epsilon whose delta is <= `delta` (an upper bound on eps(delta); inf if none)."""
    d = _validate.delta(delta)
    ok = np.flatnonzero(profile.deltas <= d)
    return float(profile.epsilons[ok[0]]) if ok.size else math.inf


def attack_risk(
    *,
    profile: PrivacyProfile,
    delta: float,
    fpr_levels: Sequence[float] = FPR_LEVELS,
    priors: Sequence[float] = PRIORS,
    fpr=DEFAULT_FPR,
) -> AttackRisk:
    """All attack figures of a privacy profile: curve, max advantage, TPR at FPR levels, posteriors.

    `delta` is the failure probability of the posterior bound and the delta of the reported
    epsilon (normally the run's target delta).
    """
    d = _validate.delta(delta)
    grid = np.atleast_1d(np.asarray(fpr, dtype=float))
    levels = [float(a) for a in fpr_levels]
    tpr_levels = highest_tpr(profile=profile, fpr=np.asarray(levels)) if levels else np.zeros(0)
    bound = loss_bound(profile=profile, delta=d)
    posteriors = {float(p): posterior_bound(profile=profile, prior=p, delta=d) for p in priors}
    return AttackRisk(
        max_advantage=max_advantage(profile=profile),
        tpr_at_fpr={a: float(t) for a, t in zip(levels, tpr_levels)},
        posterior=posteriors,
        tradeoff_fpr=grid.copy(),
        tradeoff_tpr=highest_tpr(profile=profile, fpr=grid),
        epsilon=epsilon_from_profile(profile=profile, delta=d),
        delta=d,
        loss_bound=bound,
    )


def dpsgd_attack_risk(
    *,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    delta: float,
    fpr_levels: Sequence[float] = FPR_LEVELS,
    priors: Sequence[float] = PRIORS,
    fpr=DEFAULT_FPR,
) -> AttackRisk:
    """`attack_risk` of DP-SGD (Poisson-subsampled Gaussian composed over `steps`), from its PLD."""
    profile = dpsgd_privacy_profile(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps)
    return attack_risk(profile=profile, delta=delta, fpr_levels=fpr_levels, priors=priors, fpr=fpr)


# ---------------------------------------------------------------------------------------
# Calibration to an attack
# ---------------------------------------------------------------------------------------


def calibrate_noise_multiplier_for_attack(
    *,
    sample_rate: float,
    steps: int,
    target_tpr: float,
    fpr: float,
    tolerance: float = 1e-3,
    noise_range: tuple[float, float] = (0.1, 1000.0),
) -> float:
    """Smallest noise multiplier, on the grid of multiples of `tolerance`, whose attack TPR <= target.

    The TPR bound at `fpr` of DP-SGD falls as the noise grows; a search on sigma = m * tolerance
    (engine.privacy._search) returns the smallest m with highest_tpr(sigma) <= target_tpr
    [KGFP24, Sec. 4], i.e. rounded up so the target is met. ValueError when the target cannot be
    met within `noise_range`, or is already met at its lower end, or is below `fpr` (no mechanism
    does better than guessing).
    """
    q = _validate.sample_rate(sample_rate)
    t = _validate.steps(steps)
    tol = _validate.positive("tolerance", tolerance)
    alpha = _probability("fpr", fpr)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"fpr must be in (0, 1) (a false-positive rate); got {fpr!r}")
    target = _probability("target_tpr", target_tpr)
    if not alpha < target < 1.0:
        raise ValueError(
            f"target_tpr must be in (fpr, 1) = ({alpha:g}, 1): a test with TPR = FPR is always possible "
            f"(guessing); got {target_tpr!r}"
        )
    if tol > 0.1:
        raise ValueError(f"tolerance must be in (0, 0.1] (noise multiplier units); got {tolerance!r}")
    if q == 0.0 or t == 0:
        raise ValueError(
            f"nothing to calibrate: with sample_rate={sample_rate!r} and steps={steps!r} no example is used"
        )
    lo_sigma, hi_sigma = noise_range
    digits = max(0, -math.floor(math.log10(tol))) + 6

    def sigma_of(m: int) -> float:
        return round(m * tol, digits)

    @functools.lru_cache(maxsize=None)
    def tpr_of(m: int) -> float:
        profile = dpsgd_privacy_profile(sample_rate=q, noise_multiplier=sigma_of(m), steps=t)
        return float(highest_tpr(profile=profile, fpr=[alpha])[0])

    m_lo, m_hi = math.ceil(lo_sigma / tol - 1e-9), math.floor(hi_sigma / tol + 1e-9)
    tpr_top = tpr_of(m_hi)
    if tpr_top > target:
        raise ValueError(
            f"target_tpr={target:g} at fpr={alpha:g} cannot be reached with noise_multiplier <= {hi_sigma:g} "
            f"(TPR there is {tpr_top:.4g}); allow a higher TPR, fewer steps or a smaller sample rate"
        )
    def score(m: int) -> float:  # the TPR's excess over guessing, searched on the log scale
        return log_of(tpr_of(m) - alpha)

    good = find_boundary(score, log_of(target - alpha), m_hi, score(m_hi), m_lo - 1, math.inf, log_scale=True)
    if good == m_lo:
        raise ValueError(
            f"target_tpr={target:g} at fpr={alpha:g} is already met at noise_multiplier={lo_sigma:g} "
            f"(TPR {tpr_of(m_lo):.4g}); the calibrated value would be below the supported range"
        )
    return sigma_of(good)
