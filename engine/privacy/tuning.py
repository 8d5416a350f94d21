"""What a hyperparameter search costs: repeat a DP candidate K times, release only the best.

A private tuning study runs K candidate trainings on the same data (K drawn with secret
randomness, independently of the data), scores each, and releases only the best candidate
and its score. Its guarantee follows from each candidate's RDP curve [PS22]:

  K ~ truncated negative binomial D_{eta, gamma} (shape eta > -1, K >= 1):
      P[K = k] = (1-gamma)^k / (gamma^(-eta) - 1) * prod_{l=0}^{k-1} (l + eta)/(l + 1),
      E[K] = eta (1-gamma) / (gamma (1 - gamma^eta))          [PS22, Def. 1]
    eta = 1 is the geometric distribution [LT19], eta = 0 the logarithmic one (the limit:
    P[K = k] = (1-gamma)^k / (k log(1/gamma)), E[K] = (1/gamma - 1) / log(1/gamma)).
  K ~ Poisson(mu) (shape = inf; K = 0 is possible and then nothing is released).

The study is parametrised by the mean number of runs mu = E[K] and the shape eta, as in
dp-accounting's RepeatAndSelectDpEvent; gamma is solved from mu exactly (one root of a
monotone function), and the sampler and the bound use that same gamma.

References
----------
[PS22]  N. Papernot, T. Steinke, "Hyperparameter Tuning with Renyi Differential Privacy",
        ICLR 2022 (arXiv:2110.03620). Def. 1 (truncated negative binomial), Thm. 2 (its RDP
        bound), Thm. 6 (Poisson), and the pure-DP corollary: an eps-DP candidate gives a
        (2 + eta) eps-DP study.
[LT19]  J. Liu, K. Talwar, "Private Selection from Private Candidates", STOC 2019
        (geometric K: an eps-DP candidate gives a 3 eps-DP selection).
[CKS20] C. Canonne, G. Kamath, T. Steinke, "The Discrete Gaussian for Differential Privacy",
        arXiv:2004.00010, Prop. 12 (v4): RDP -> (eps, delta).
[KOV15] P. Kairouz, S. Oh, P. Viswanath, "The Composition Theorem for Differential Privacy",
        ICML 2015: every eps-DP mechanism is dominated by binary randomized response, so it is
        (eps_hat, (e^eps - e^eps_hat) / (1 + e^eps))-DP for eps_hat <= eps.
[vEH14] T. van Erven, P. Harremoes, "Renyi Divergence and Kullback-Leibler Divergence",
        IEEE Trans. Inf. Theory 2014, Thm. 3: D_alpha is non-decreasing in alpha.
[BH79]  J. Bretagnolle, C. Huber (1979): TV(P, Q) <= sqrt(1 - exp(-KL(P||Q))).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from engine.privacy import _validate
from engine.privacy.rdp import DEFAULT_ORDERS, compute_rdp, rdp_to_epsilon
from engine.privacy.types import Epsilon

__all__ = [
    "SHAPE_POISSON",
    "TuningEpsilon",
    "repeat_and_select_rdp",
    "num_runs_probability",
    "num_runs_quantiles",
    "sample_num_runs",
    "truncated_negative_binomial_gamma",
    "truncated_negative_binomial_mean",
    "tuning_epsilon",
]

SHAPE_POISSON: float = math.inf
"""`shape` that selects a Poisson number of runs [PS22, Thm. 6] instead of a truncated negative binomial."""

_MAX_MEAN_RUNS = 1e9  # beyond this the study is not a tuning search any more; also keeps the root finding sane
_MAX_BLOCK = 1 << 20  # probabilities of K computed at once by the sampler


@dataclass(frozen=True)
class TuningEpsilon:
    """A tuning study's guarantee (`epsilon`) next to one candidate's alone (`single_run`).

    Both come from the same RDP analysis at the same orders, so the difference is the price of
    the search. `gamma` is the truncated negative binomial's parameter (None for Poisson).
    """

    epsilon: Epsilon
    single_run: Epsilon
    mean_runs: float
    shape: float
    gamma: float | None


# ---- the distribution of K ------------------------------------------------------------------------


def truncated_negative_binomial_mean(*, gamma: float, shape: float) -> float:
    """E[K] for K ~ D_{eta, gamma} [PS22, Def. 1]: eta (1-gamma) / (gamma (1 - gamma^eta)); eta = 0: the limit."""
    eta = _finite_shape(shape)
    g = _real("gamma", gamma)
    if not 0.0 < g <= 1.0:
        raise ValueError(f"gamma must be in (0, 1] (the truncated negative binomial's parameter); got {gamma!r}")
    if g == 1.0:
        return 1.0
    return math.exp(_log_mean(eta, -math.log(g)))


def truncated_negative_binomial_gamma(*, mean_runs: float, shape: float) -> float:
    """The gamma in (0, 1] with E[K] = mean_runs for K ~ D_{shape, gamma} [PS22, Def. 1].

    E[K] increases strictly as gamma decreases (from 1 at gamma = 1 to infinity), so the root is
    unique; it is found in log(1/gamma) to full double precision. mean_runs = 1 gives gamma = 1 (K = 1).
    """
    eta = _finite_shape(shape)
    mu = _mean_runs(mean_runs)
    return math.exp(-_log_inverse_gamma(eta, mu))


def sample_num_runs(*, rng: np.random.Generator, mean_runs: float, shape: float, size=None):
    """Draw the number of candidate runs K of a private study from `rng` (the study's secret generator).

    shape = inf: Poisson(mean_runs), possibly 0 (then no run is made and nothing is released).
    Otherwise the truncated negative binomial D_{shape, gamma} with gamma from
    truncated_negative_binomial_gamma, K >= 1. Both by inversion of the distribution function,
    one `rng.random()` uniform per draw, so a numpy Generator and the hardened SecureGenerator of
    engine.randomness serve alike. Returns an int, or an int array of shape `size`.
    """
    if not callable(getattr(rng, "random", None)):
        raise ValueError(
            "rng must be a generator with a random(size) method (numpy.random.Generator or "
            f"engine.randomness.SecureGenerator: the study's secret stream); got {type(rng).__name__}"
        )
    eta = _shape(shape)
    mu = _mean_runs(mean_runs)
    if mu == 1.0 and not math.isinf(eta):
        draws = np.ones(size, dtype=np.int64) if size is not None else 1
    else:
        u = np.asarray(rng.random(size=size), dtype=float)
        if math.isinf(eta):
            log_pmf, first = _poisson_log_pmf(mu), 0
        else:
            log_pmf, first = _tnb_log_pmf(eta, _log_inverse_gamma(eta, mu)), 1
        draws = _inverse_cdf(log_pmf, first, np.atleast_1d(u)).reshape(u.shape)
    if size is None:
        return int(draws)
    return np.asarray(draws, dtype=np.int64)


def num_runs_quantiles(*, mean_runs: float, shape: float, probabilities) -> list[int]:
    """The smallest k with P[K <= k] >= p for each p, K distributed as `sample_num_runs` draws it:
    what a study's plan shows of its number of runs (e.g. its median and 90th percentile)."""
    eta = _shape(shape)
    mu = _mean_runs(mean_runs)
    p = np.asarray(probabilities, dtype=float)
    if p.ndim != 1 or np.any(~((p >= 0.0) & (p < 1.0))):
        raise ValueError(f"probabilities must be a list of numbers in [0, 1); got {probabilities!r}")
    if mu == 1.0 and not math.isinf(eta):
        return [1] * p.size
    if math.isinf(eta):
        log_pmf, first = _poisson_log_pmf(mu), 0
    else:
        log_pmf, first = _tnb_log_pmf(eta, _log_inverse_gamma(eta, mu)), 1
    # P[K <= k] >= p is the first k whose cumulative sum exceeds p minus one ulp-sized step.
    return [int(k) for k in _inverse_cdf(log_pmf, first, np.nextafter(p, -np.inf).clip(0.0))]


def num_runs_probability(*, mean_runs: float, shape: float, k: int) -> float:
    """P[K = k] for K as `sample_num_runs` draws it (Poisson's P[K = 0]: the study releases nothing)."""
    eta = _shape(shape)
    mu = _mean_runs(mean_runs)
    if mu == 1.0 and not math.isinf(eta):
        return 1.0 if k == 1 else 0.0
    if math.isinf(eta):
        return float(math.exp(_poisson_log_pmf(mu)(float(k)))) if k >= 0 else 0.0
    return float(math.exp(_tnb_log_pmf(eta, _log_inverse_gamma(eta, mu))(float(k)))) if k >= 1 else 0.0


# ---- the RDP of repeat-and-select ---------------------------------------------------------------


def repeat_and_select_rdp(
    *,
    orders,
    rdp,
    mean_runs: float,
    shape: float,
    pure_epsilon: float | None = None,
) -> np.ndarray:
    """RDP at `orders` of running a candidate K times and releasing only the best [PS22].

    `rdp` is one candidate's RDP curve at `orders` (its training and its score release together).
    Candidates whose settings are drawn at random per run (random search) are covered by the
    pointwise maximum of their curves (Renyi divergence is jointly quasi-convex [vEH14]).
    Truncated negative binomial (shape eta > -1) [PS22, Thm. 2], for each order lambda:
        rdp(lambda) + (1+eta) min_lhat [(1 - 1/lhat) rdp(lhat) + log(1/gamma)/lhat] + log(E[K])/(lambda-1),
    lhat over `orders` (and lhat = inf, giving (1+eta) eps, for an eps-DP candidate).
    Poisson (shape = inf) [PS22, Thm. 6]: rdp(lambda) + mu delta_hat + log(mu)/(lambda-1), where the
    candidate is (eps_hat, delta_hat)-DP at eps_hat = log(1 + 1/(lambda-1)); delta_hat comes from
    the RDP curve [CKS20, Prop. 12; BH79] and, for an eps-DP candidate, from [KOV15].
    Finally a bound at a larger order also holds at a smaller one [vEH14, Thm. 3], so each order
    takes the best bound at any order >= it. mean_runs = 1 with a finite shape means K = 1: the
    candidate's own curve. `pure_epsilon`: the candidate is also pure eps-DP (optional).
    """
    alphas, values = _validate.rdp_curve(orders, rdp)
    mu = _mean_runs(mean_runs)
    eta = _shape(shape)
    pure = None if pure_epsilon is None else _validate.epsilon(pure_epsilon, "pure_epsilon")
    if pure is not None:
        values = np.minimum(values, pure)  # an eps-DP candidate is (lambda, eps)-RDP at every order
    if math.isinf(eta):
        eps_hat = np.log1p(1.0 / (alphas - 1.0))
        delta_hat = _delta_from_rdp(alphas, values, eps_hat)
        if pure is not None:
            # (e^eps - e^eps_hat) / (1 + e^eps), written so that a large eps cannot overflow
            rr = np.maximum(-np.expm1(eps_hat - pure), 0.0) / (1.0 + math.exp(-pure))
            delta_hat = np.minimum(delta_hat, rr)
        with np.errstate(invalid="ignore"):
            out = values + mu * delta_hat + math.log(mu) / (alphas - 1.0)
    elif mu == 1.0:
        return values.copy()
    else:
        log_inv_gamma = _log_inverse_gamma(eta, mu)
        log_mean = max(math.log(mu), _log_mean(eta, log_inv_gamma))
        with np.errstate(invalid="ignore"):
            per_lhat = (1.0 - 1.0 / alphas) * values + log_inv_gamma / alphas
        best = float(np.min(per_lhat))
        if pure is not None:
            best = min(best, pure)
        with np.errstate(over="ignore"):  # a sum past float range is inf, an upper bound
            out = values + (1.0 + eta) * best + log_mean / (alphas - 1.0)
    out = np.where(np.isinf(values), np.inf, out)
    return _monotone_in_order(alphas, out)


def tuning_epsilon(
    *,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    delta: float,
    mean_runs: float,
    shape: float,
    orders=DEFAULT_ORDERS,
) -> TuningEpsilon:
    """(epsilon, delta) of a private study whose candidates are DP-SGD runs, and of one such run alone.

    Each candidate: `steps` Poisson-subsampled Gaussian steps (engine.privacy.rdp.compute_rdp);
    the study: repeat_and_select_rdp, converted by rdp_to_epsilon [CKS20, Prop. 12]. A private
    score, if any, adds its own RDP to the candidate's; this function covers the training alone.
    """
    d = _validate.delta(delta)
    mu = _mean_runs(mean_runs)
    eta = _shape(shape)
    alphas = _validate.orders(orders)
    rdp = compute_rdp(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps, orders=alphas)
    study = repeat_and_select_rdp(orders=alphas, rdp=rdp, mean_runs=mu, shape=eta)
    gamma = None if math.isinf(eta) else truncated_negative_binomial_gamma(mean_runs=mu, shape=eta)
    return TuningEpsilon(
        epsilon=rdp_to_epsilon(orders=alphas, rdp=study, delta=d),
        single_run=rdp_to_epsilon(orders=alphas, rdp=rdp, delta=d),
        mean_runs=mu,
        shape=eta,
        gamma=gamma,
    )


# ---- helpers ------------------------------------------------------------------------------------


def _delta_from_rdp(alphas: np.ndarray, rdp: np.ndarray, epsilons: np.ndarray) -> np.ndarray:
    """Smallest delta at each of `epsilons` implied by the RDP curve (min over orders, <= 1).

    Per order [CKS20, Prop. 12]: log delta = (alpha-1)(rdp - eps + log(1 - 1/alpha)) - log(alpha);
    and at any eps >= 0, delta <= TV <= sqrt(1 - exp(-rdp)) [BH79] (KL <= D_alpha).
    """
    a = alphas[None, :]
    r = rdp[None, :]
    e = np.asarray(epsilons, dtype=float)[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        log_cks = (a - 1.0) * (r - e + np.log1p(-1.0 / a)) - np.log(a)
        log_tv = 0.5 * np.log(-np.expm1(-r))
    log_delta = np.minimum(np.minimum(log_cks, log_tv), 0.0)
    log_delta = np.where(np.isinf(r), 0.0, log_delta)
    return np.exp(np.min(log_delta, axis=1))


def _monotone_in_order(alphas: np.ndarray, values: np.ndarray) -> np.ndarray:
    """values[i] -> min over orders >= alphas[i] of values [vEH14, Thm. 3]."""
    order = np.argsort(alphas, kind="stable")
    suffix_min = np.minimum.accumulate(values[order][::-1])[::-1]
    out = np.empty_like(values)
    out[order] = suffix_min
    return out


def _log_expm1(x: float) -> float:
    """log(exp(x) - 1) for x > 0 without overflow."""
    return x + math.log1p(-math.exp(-x)) if x > 1.0 else math.log(math.expm1(x))


def _log_expm1_ratio(y: float) -> float:
    """log(expm1(y) / y), 0 at y = 0; accurate for tiny |y| and without overflow for large y."""
    if y == 0.0:
        return 0.0
    if y > 0.0:
        return _log_expm1(y) - math.log(y)
    return math.log(-math.expm1(y)) - math.log(-y)


def _log_mean(eta: float, log_inv_gamma: float) -> float:
    """log E[K] for D_{eta, gamma}, L = log(1/gamma) > 0 [PS22, Def. 1].

    E[K] = (1/gamma - 1) eta / (1 - gamma^eta) = expm1(L) / (L h(-eta L)), h(y) = expm1(y)/y
    (h(0) = 1 gives the logarithmic case), so every factor keeps its relative precision.
    """
    big_l = log_inv_gamma
    return _log_expm1(big_l) - math.log(big_l) - _log_expm1_ratio(-eta * big_l)


def _log_normaliser(eta: float, log_inv_gamma: float) -> float:
    """log of (gamma^-eta - 1)/eta = L h(eta L) (L = log(1/gamma) at eta = 0): the pmf's normaliser
    once the weights are written as (1-gamma)^k Gamma(k+eta) / (Gamma(1+eta) k!)."""
    return math.log(log_inv_gamma) + _log_expm1_ratio(eta * log_inv_gamma)


def _log_inverse_gamma(eta: float, mu: float) -> float:
    """L = log(1/gamma) with E[K] = mu (0 for mu = 1); E[K] is strictly increasing in L."""
    if mu == 1.0:
        return 0.0
    target = math.log(mu)

    def gap(big_l: float) -> float:
        return _log_mean(eta, big_l) - target

    lo, hi = 1e-300, 1.0
    while gap(hi) < 0.0:
        lo, hi = hi, hi * 2.0
    if gap(lo) >= 0.0:  # mu so close to 1 that no representable L separates them
        return lo
    return float(optimize.brentq(gap, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500))


def _tnb_log_pmf(eta: float, log_inv_gamma: float):
    """k -> log P[K = k] for K ~ D_{eta, gamma}: (1-gamma)^k Gamma(k+eta) / (Gamma(1+eta) k!) / normaliser."""
    log_one_minus_gamma = math.log(-math.expm1(-log_inv_gamma))
    constant = special.gammaln(1.0 + eta) + _log_normaliser(eta, log_inv_gamma)
    return lambda k: k * log_one_minus_gamma + special.gammaln(k + eta) - special.gammaln(k + 1.0) - constant


def _poisson_log_pmf(mu: float):
    """k -> log P[K = k] for K ~ Poisson(mu)."""
    log_mu = math.log(mu)
    return lambda k: k * log_mu - mu - special.gammaln(k + 1.0)


def _inverse_cdf(log_pmf, first: int, u: np.ndarray) -> np.ndarray:
    """The smallest k >= first with P[K <= k] > u, for each u in [0, 1], K unimodal on first, first+1, ...

    The probabilities are computed in logs by blocks of k that double in length (up to _MAX_BLOCK,
    so memory stays bounded; the time is linear in the largest draw, less than running that many
    candidates) until every u is placed. A u above the last cumulative sum that rounding can reach
    (probability ~1e-16) gets the k where the decreasing tail stopped adding anything.
    """
    out = np.zeros(u.shape, dtype=np.int64)
    pending = np.arange(u.size)
    start, length, total = first, 1024, 0.0
    while pending.size:
        block_log_pmf = log_pmf(np.arange(start, start + length, dtype=float))
        cdf = total + np.cumsum(np.exp(block_log_pmf))
        idx = np.searchsorted(cdf, u[pending], side="right")
        placed = idx < length
        out[pending[placed]] = start + idx[placed]
        pending = pending[~placed]
        if cdf[-1] <= total and block_log_pmf[-1] < block_log_pmf[-2]:  # past the mode, adding nothing
            out[pending] = start + length - 1
            break
        total = float(cdf[-1])
        start += length
        length = min(2 * length, _MAX_BLOCK)
    return out


def _shape(value) -> float:
    """eta > -1, or inf for Poisson."""
    eta = _real("shape", value)
    if not eta > -1.0:
        raise ValueError(
            f"shape must be > -1 (truncated negative binomial; 0 = logarithmic, 1 = geometric) or inf (Poisson); got {value!r}"
        )
    return eta


def _finite_shape(value) -> float:
    eta = _shape(value)
    if math.isinf(eta):
        raise ValueError("shape must be finite here (a truncated negative binomial); inf means Poisson, which has no gamma")
    return eta


def _mean_runs(value) -> float:
    mu = _real("mean_runs", value)
    if not 1.0 <= mu <= _MAX_MEAN_RUNS:
        raise ValueError(f"mean_runs must be in [1, {_MAX_MEAN_RUNS:g}] (the expected number of candidate runs); got {value!r}")
    return mu


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(float(value)):
        raise ValueError(f"{name} must be a number; got {value!r}")
    return float(value)
