"""Privacy loss distribution (PLD) accountant for the Poisson-subsampled Gaussian mechanism.

Tight (epsilon, delta) for T compositions of one DP-SGD step, every approximation on the safe
side (delta over-estimated, hence epsilon over-estimated):

1. Dominating pairs. Up to scaling, one step with add/remove-one neighbours is dominated by
   remove: P = (1-q) N(0, s^2) + q N(1, s^2) vs Q = N(0, s^2), and by
   add:    P = N(0, s^2) vs Q = (1-q) N(0, s^2) + q N(1, s^2)   [ZDW22, Poisson subsampling],
   s = noise_multiplier. A fixed pair of neighbours is on one side for all steps, so each
   direction is composed on its own (dominating pairs compose, also adaptively [ZDW22]) and
   the larger delta is reported.
   delta(eps) = H_{e^eps}(P||Q) = E_P[(1 - e^(eps - L))_+], L = log dP/dQ the privacy loss.

2. Pessimistic discretisation ("connect the dots", [DGKKM22]). The loss axis is cut at the
   grid eps_i = i*h. As a function of gamma = e^eps, delta is convex, so the chord between
   grid points lies above it. The chord is exactly the hockey-stick curve of the discrete
   pair obtained by splitting the P-mass of every bin (eps_i, eps_{i+1}] between its two end
   points so that both its P- and Q-mass are kept:
       to eps_{i+1}:  u = (P(B) - e^eps_i Q(B)) / (1 - e^-h),   to eps_i:  P(B) - u.
   That pair dominates the true one for every eps (also eps < 0), so it may be composed.
   Mass below the lowest grid point is moved up onto it; above the highest point the split
   sends delta(eps_top) to loss +infinity (counted fully in delta). Bin probabilities come
   from erf/erfc on the side where they are accurate, and u is biased up by a bound on their
   round-off, so round-off also moves mass up.

3. Composition by one FFT: the T-fold convolution of the discrete PLD on a cyclic grid of
   N points ([KJH20] use the same transform). The window [L, U] is chosen with Chernoff
   bounds P(S >= U) <= M(lam)^T e^(-lam U) computed from the discrete PLD itself. Folded
   (wrapped-around) values are never smaller than the true ones inside the window, so using
   them over-estimates delta; the mass above U is bounded by the Chernoff bound and added to
   delta. So is a bound on the FFT round-off: raising F to the T-th power multiplies its
   error by T, so the few low frequencies that carry the result are recomputed in extended
   precision, and the rest is bounded by standard FFT error analysis (~1e-13 added to delta
   for 14,000 steps, ~1e-11 for a million).

4. Reading off epsilon: delta(eps) = extra + sum over atoms above eps of g (1 - e^(eps - l))
   is exact for the composed discrete pair between grid points, so epsilon is solved for in
   closed form on the bracketing grid interval and then rounded up by a few ulps.

References
----------
[ZDW22]  Y. Zhu, J. Dong, Y.-X. Wang, "Optimal Accounting of Differential Privacy via
         Characteristic Function", AISTATS 2022 (dominating pairs, their adaptive composition,
         and the dominating pairs of Poisson-subsampled mechanisms).
[DGKKM22] V. Doroshenko, B. Ghazi, P. Kamath, R. Kumar, P. Manurangsi, "Connect the Dots:
         Tighter Discrete Approximations of Privacy Loss Distributions", PETS 2022.
[KJH20]  A. Koskela, J. Jalko, A. Honkela, "Computing Tight Differential Privacy Guarantees
         Using FFT", AISTATS 2020.
[MM18]   S. Meiser, E. Mohammadi, "Tight on Budget? Tight Bounds for r-Fold Approximate
         Differential Privacy", CCS 2018 (privacy buckets: pessimistic rounding of losses).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import fft as sfft
from scipy import optimize, special

from engine.privacy import _validate
from engine.privacy.types import Epsilon

__all__ = ["DEFAULT_DISCRETIZATION", "SubsampledGaussian", "pld_delta", "pld_epsilon", "pld_epsilon_composed"]

DEFAULT_DISCRETIZATION = 1e-4
"""Largest grid step h on the privacy-loss axis used when `discretization` is None (auto)."""

_U = float(np.finfo(float).eps)
_SQRT2 = math.sqrt(2.0)
_SINGLE_TAIL = 1e-25  # loss mass left outside one step's grid (moved up, or sent to +inf)
_WINDOW_TAIL = 1e-15  # pld_delta: composed mass allowed outside the FFT window (bounded, added)
_MAX_SINGLE_BINS = 1 << 20  # one step's grid; a coarser h is used beyond this
_MAX_FFT = 1 << 21  # composed grid; a coarser h is used beyond this
_MAX_REFINED = 1 << 12  # low frequencies recomputed in extended precision (see _power_spectrum)
_REFINE_WORK = 1 << 21  # at most this many (frequency x atom) long-double terms
_LOSS_LIMIT = 600.0  # |loss| beyond this is not gridded (e^600 is still a finite float)
_GAMMA_LIMIT = 700.0  # e^eps is taken at most at this eps: a smaller gamma only moves mass up (pessimistic)
_SIGMA_FLOOR = 1e-100  # below this noise multiplier sigma^2 underflows: treated as no noise at all
_MAX_AUTO_H = 0.1  # the coarsest loss grid step picked automatically (as allowed for an explicit one)
_MAX_H = 10.0  # a composed loss too wide for _MAX_FFT points of this step (epsilon in the millions): inf


@dataclass(frozen=True)
class _Discrete:
    """A discrete privacy loss distribution: mass[k] = P(loss = (first + k) * h)."""

    h: float
    first: int
    mass: np.ndarray
    infinity: float  # P(loss = +inf)


@dataclass(frozen=True)
class _Composed:
    """T-fold composition on a window: g[k] >= P(loss = (first + k) h); `extra` is added to delta."""

    h: float
    first: int
    g: np.ndarray
    extra: float  # mass at +inf + mass above the window + FFT round-off bound


def pld_epsilon(
    *,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    delta: float,
    discretization: float | None = None,
) -> Epsilon:
    """Upper bound on epsilon at `delta` after `steps` Poisson-subsampled Gaussian steps (PLD).

    The worse of the add and remove directions; see the module docstring for how every step
    of the computation rounds towards a larger epsilon. `discretization` is the loss grid step
    h (smaller: tighter and slower). None (default) picks h = min(1e-4, s1 / 16), where
    s1 = min(q sqrt(e^(1/sigma^2) - 1), 1/sigma) is the scale of one step's privacy loss; the
    connect-the-dots error is second order in h / s1, which keeps epsilon within ~1e-4 to
    1e-3 (relative) of the h -> 0 limit. h grows beyond 1e-4 only when the composed loss is
    spread widely (sqrt(T) s1 > 1.6, epsilons in the tens). q = 256/60000, sigma = 1.1,
    14,063 steps takes ~0.1 s. Where the loss range would still need more than ~1-2 million
    grid points a coarser grid is used; the result is an upper bound whatever h is.
    """
    q, sigma, t, h = _check(sample_rate, noise_multiplier, steps, discretization)
    d = _validate.delta(delta)
    if q == 0.0 or t == 0:
        return Epsilon(value=0.0, delta=d, accountant="pld")
    if sigma < _SIGMA_FLOOR:
        return Epsilon(value=math.inf, delta=d, accountant="pld")
    tail = 1e-6 * d  # window tails and round-off may each add this much to delta
    value = max(_epsilon_of(_compose_direction(q, sigma, t, h, add, tail), d) for add in (False, True))
    return Epsilon(value=value, delta=d, accountant="pld")


def pld_delta(
    *,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    epsilon: float,
    discretization: float | None = None,
) -> float:
    """Upper bound on delta at `epsilon` after `steps` Poisson-subsampled Gaussian steps (PLD).

    Same construction as `pld_epsilon`; the result includes the (tiny) bounds on the mass
    outside the FFT window and on round-off, so it is never below ~1e-15.
    """
    q, sigma, t, h = _check(sample_rate, noise_multiplier, steps, discretization)
    eps = _validate.epsilon(epsilon)
    if q == 0.0 or t == 0:
        return 0.0
    if sigma < _SIGMA_FLOOR:
        return 1.0
    deltas = (_delta_of(_compose_direction(q, sigma, t, h, add, _WINDOW_TAIL), eps) for add in (False, True))
    return float(min(1.0, max(deltas)))


def _check(sample_rate, noise_multiplier, steps, discretization):
    q = _validate.sample_rate(sample_rate)
    sigma = _validate.noise_multiplier(noise_multiplier)
    t = _validate.steps(steps)
    if discretization is None:
        return q, sigma, t, _auto_discretization(q, sigma, t)
    h = _validate.positive("discretization", discretization)
    if h > 0.1:
        raise ValueError(f"discretization must be in (0, 0.1] (a step on the loss axis); got {discretization!r}")
    return q, sigma, t, h


def _auto_discretization(q: float, sigma: float, steps: int) -> float:
    """Grid step when none is given: min(s1/16, max(1e-4, sqrt(T) s1 / 2^14)), within [1e-6, 0.1].

    s1 = min(q sqrt(e^(1/sigma^2) - 1), 1/sigma) is the scale of one step's privacy loss
    (its standard deviation for small q, and 1/sigma exactly for q = 1). The connect-the-dots
    error is second order in h / s1; and once the composed loss spreads over sqrt(T) s1 >> 1
    (epsilons in the tens or more) a step of 1/16384 of that spread is plenty.
    """
    if q == 0.0 or sigma < _SIGMA_FLOOR:
        return DEFAULT_DISCRETIZATION
    scale = min(q * math.sqrt(math.expm1(min(1.0 / sigma**2, 700.0))), 1.0 / sigma)
    spread = math.sqrt(max(steps, 1)) * scale
    return min(_MAX_AUTO_H, max(1e-6, min(scale / 16.0, max(DEFAULT_DISCRETIZATION, spread / 16384.0))))


# ---------------------------------------------------------------------------------------
# One step: the mechanism in closed form
# ---------------------------------------------------------------------------------------


def _y_of_loss(x: np.ndarray, q: float, sigma: float) -> np.ndarray:
    """The output y with log(1 - q + q exp((2y-1)/(2 s^2))) = x (-inf where x <= log(1-q)).

    This is the remove-direction loss; the add-direction loss is its negative.
    """
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if q == 1.0:
            u = x
        else:
            # log(e^x - (1-q)) - log(q), written to avoid cancellation where it can be avoided.
            if q >= 0.5:
                small = np.log(np.exp(np.minimum(x, 1.0)) - (1.0 - q))
            else:
                small = np.log(np.expm1(np.minimum(x, 1.0)) + q)
            large = x + np.log1p(-(1.0 - q) * np.exp(-np.maximum(x, 1.0)))
            u = np.where(x > 1.0, large, small) - math.log(q)
            u = np.where(x <= math.log1p(-q), -np.inf, u)
    return sigma**2 * u + 0.5


def _gauss_intervals(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Phi(z[k+1]) - Phi(z[k]) for non-decreasing standardised cut points z, and error bounds.

    Each interval is taken from the side where it is accurate: erfc differences when both
    ends are in the same tail (|z| >= 1), erf differences in the middle. erf and erfc are
    accurate to a few ulps of their values, which gives the round-off bound returned.
    """
    r = z / _SQRT2
    with np.errstate(invalid="ignore"):
        erf = special.erf(r)
        tail = special.erfc(np.abs(r))  # 2 Phi(-|z|), accurate far out
    a, b = z[:-1], z[1:]
    upper = a >= 1.0  # both ends in the upper tail: Phi-bar(a) - Phi-bar(b)
    lower = b <= -1.0  # both in the lower tail: Phi(b) - Phi(a)
    with np.errstate(invalid="ignore"):
        mid = 0.5 * (erf[1:] - erf[:-1])
        up = 0.5 * (tail[:-1] - tail[1:])
        low = 0.5 * (tail[1:] - tail[:-1])
    value = np.where(upper, up, np.where(lower, low, mid))
    scale = np.where(upper, tail[:-1], np.where(lower, tail[1:], np.abs(erf[:-1]) + np.abs(erf[1:])))
    return np.maximum(value, 0.0), 8.0 * _U * scale


def _log_tail_above(x: float, q: float, sigma: float, add: bool) -> float:
    """log P(L > x) for the loss L of one step (under P of the given direction)."""
    if add:  # L = -remove_loss(y), y ~ N(0, s^2): L > x  <=>  y < y(-x)
        y = float(_y_of_loss(-x, q, sigma))
        return float(special.log_ndtr(y / sigma))
    y = float(_y_of_loss(x, q, sigma))  # y ~ mixture: L > x <=> y > y(x)
    return _log_mix(special.log_ndtr(-y / sigma), special.log_ndtr(-(y - 1.0) / sigma), q)


def _log_tail_below(x: float, q: float, sigma: float, add: bool) -> float:
    """log P(L <= x) for the loss L of one step (under P of the given direction)."""
    if add:
        y = float(_y_of_loss(-x, q, sigma))
        return float(special.log_ndtr(-y / sigma))
    y = float(_y_of_loss(x, q, sigma))
    return _log_mix(special.log_ndtr(y / sigma), special.log_ndtr((y - 1.0) / sigma), q)


def _log_mix(log_p0: float, log_p1: float, q: float) -> float:
    if q == 1.0:
        return float(log_p1)
    return float(np.logaddexp(math.log1p(-q) + log_p0, math.log(q) + log_p1))


def _solve_tail(fn, log_tau: float, start: float, step: float) -> float:
    """x with fn(x) = log_tau, searching from `start` in the direction of `step` (fn monotone)."""
    a = start
    fa = fn(a) - log_tau
    if fa <= 0.0:
        return a
    b = a + step
    while fn(b) - log_tau > 0.0:
        a, b = b, b + 2.0 * (b - a)
        if abs(b) > _LOSS_LIMIT:
            return math.copysign(_LOSS_LIMIT, b)
    return float(optimize.brentq(lambda x: fn(x) - log_tau, min(a, b), max(a, b), xtol=1e-9))


def _loss_range(q: float, sigma: float, add: bool) -> tuple[float, float]:
    """[lo, hi] on the loss axis outside which one step has mass <= _SINGLE_TAIL."""
    log_tau = math.log(_SINGLE_TAIL)
    natural = -math.log1p(-q) if q < 1.0 else math.inf  # add: L < -log(1-q); remove: L > log(1-q)
    centre = 0.5 / sigma**2 if q == 1.0 else 0.0
    hi = _solve_tail(lambda x: _log_tail_above(x, q, sigma, add), log_tau, centre, 1.0)
    lo = _solve_tail(lambda x: _log_tail_below(x, q, sigma, add), log_tau, centre, -1.0)
    if add:
        hi = min(hi, natural)
    else:
        lo = max(lo, -natural)
    return max(lo, -_LOSS_LIMIT), min(hi, _LOSS_LIMIT)


def _discretise(q: float, sigma: float, h: float, add: bool, lo: float, hi: float) -> _Discrete:
    """Connect-the-dots discretisation [DGKKM22] of one step on the grid i*h, lo <= i*h <= hi."""
    i_lo = math.floor(lo / h)
    i_hi = max(math.ceil(hi / h), i_lo + 1)
    eps = np.arange(i_lo, i_hi + 1) * h
    y = _y_of_loss(-eps if add else eps, q, sigma)
    # Nudge the cut points so that round-off in y moves mass to the higher-loss bin.
    nudge = 64.0 * _U * (np.abs(y) + sigma**2 * (1.0 + abs(math.log(q))))
    with np.errstate(invalid="ignore"):
        y = np.where(np.isfinite(y), y + (nudge if add else -nudge), y)
    # Intervals in y for: loss <= eps_lo, the bins between grid points, loss > eps_hi.
    # Loss increases with y for remove, decreases for add (then the cut points are reversed).
    cuts = np.concatenate([[-np.inf], y[::-1] if add else y, [np.inf]])
    g0, e0 = _gauss_intervals(cuts / sigma)
    g1, e1 = _gauss_intervals((cuts - 1.0) / sigma)
    if add:
        g0, e0, g1, e1 = g0[::-1], e0[::-1], g1[::-1], e1[::-1]
    mix, mix_err = (1.0 - q) * g0 + q * g1, (1.0 - q) * e0 + q * e1
    p, p_err, qq, q_err = (g0, e0, mix, mix_err) if add else (mix, mix_err, g0, e0)

    n = eps.size
    mass = np.zeros(n)
    mass[0] += p[0]  # everything with loss <= eps_lo is moved up onto eps_lo
    # Bins (eps_i, eps_{i+1}]: keep P and Q mass, so u goes up and P - u stays down.
    gamma = np.exp(np.minimum(eps[:-1], _GAMMA_LIMIT))
    pb, qb = p[1:n], qq[1:n]
    up = pb - gamma * qb + (p_err[1:n] + gamma * q_err[1:n] + 4.0 * _U * (pb + gamma * qb))
    up = np.clip(up / -math.expm1(-h), 0.0, pb)
    mass[1:] += up
    mass[:-1] += pb - up
    # Above eps_hi: delta(eps_hi) = P - e^eps_hi Q goes to +infinity, the rest onto eps_hi.
    p_top, q_top = p[n], qq[n]
    gamma_top = math.exp(min(eps[-1], _GAMMA_LIMIT))
    infinity = p_top - gamma_top * q_top + p_err[n] + gamma_top * q_err[n] + 4.0 * _U * (p_top + gamma_top * q_top)
    infinity = min(max(infinity, 0.0), p_top)
    mass[-1] += p_top - infinity
    return _Discrete(h=h, first=i_lo, mass=mass, infinity=float(infinity))


# ---------------------------------------------------------------------------------------
# Composition
# ---------------------------------------------------------------------------------------


def _chernoff_edge(log_mass: np.ndarray, loss: np.ndarray, steps: int, log_tau: float) -> tuple[float, float]:
    """x with P(S_T >= x) <= tau for S_T a sum of T independent draws of (loss, mass), and its lam.

    Chernoff: P(S_T >= x) <= exp(T K(lam) - lam x), K(lam) = log sum mass e^(lam loss), for
    every lam > 0; x = (T K(lam) - log tau) / lam. The objective is unimodal in lam (the
    numerator of its derivative, T (lam K' - K) + log tau, increases), so lam is searched on a
    coarse summary of the atoms (at most 4096 groups) and x is then computed from all atoms
    at that lam: any lam gives a valid bound, the search only makes it tight.
    """
    n = loss.size
    group = max(1, -(-n // 4096))
    if group > 1:
        pad = (-n) % group
        w = np.exp(log_mass - log_mass.max())
        w = np.concatenate([w, np.zeros(pad)]).reshape(-1, group)
        l_pad = np.concatenate([loss, np.full(pad, loss[-1])]).reshape(-1, group)
        w_sum = w.sum(axis=1)
        keep = w_sum > 0
        c_loss = (w * l_pad).sum(axis=1)[keep] / w_sum[keep]
        c_log_mass = np.log(w_sum[keep]) + log_mass.max()
    else:
        c_loss, c_log_mass = loss, log_mass

    def objective(s: float) -> float:
        lam = math.exp(s)
        return (steps * _log_sum_exp(c_log_mass + lam * c_loss) - log_tau) / lam

    res = optimize.minimize_scalar(
        objective, bounds=(math.log(1e-4), math.log(1e4)), method="bounded", options={"xatol": 0.02}
    )
    lam = math.exp(float(res.x))
    return (steps * _log_sum_exp(log_mass + lam * loss) - log_tau) / lam, lam


@dataclass(frozen=True)
class _Window:
    first: int  # grid index of the window's first point (<= 0)
    size: int  # FFT length
    log_above: float  # log of a bound on the composed mass at loss >= (first + size) h


def _window(single: _Discrete, steps: int, tail: float) -> _Window:
    """FFT window holding all but `tail` of the composed mass at each end (Chernoff bounds)."""
    h = single.h
    nz = np.flatnonzero(single.mass > 0.0)
    log_mass = np.log(single.mass[nz])
    loss = (single.first + nz) * h
    log_tau = math.log(tail)
    upper, lam_up = _chernoff_edge(log_mass, loss, steps, log_tau)
    lower_neg, _ = _chernoff_edge(log_mass, -loss, steps, log_tau)
    i_lo = math.floor(min(-lower_neg, 0.0) / h)
    i_hi = math.ceil(max(upper, 0.0) / h)
    n = sfft.next_fast_len(i_hi - i_lo + 1, real=True)
    log_above = steps * _log_sum_exp(log_mass + lam_up * loss) - lam_up * (i_lo + n) * h
    return _Window(first=i_lo, size=n, log_above=min(0.0, log_above))


def _compose(single: _Discrete, steps: int, window: _Window, slack: float) -> _Composed:
    """T-fold self-composition of `single` on an FFT window, pessimistically (module docstring)."""
    n = window.size
    x = np.bincount((single.first + np.arange(single.mass.size)) % n, weights=single.mass, minlength=n)
    if steps == 1:
        g, fft_err = x, 0.0  # nothing to compose: the folded single step itself
    else:
        f_t, power_err = _power_spectrum(x, steps, slack)
        g = sfft.irfft(f_t, n=n)
        # The normalised inverse transform maps a spectrum error v to at most ||v||_2 summed
        # over all outputs (Parseval); its own round-off is c log2(n) u ||g||_2 in 2-norm.
        fft_err = power_err + math.sqrt(n) * 5.0 * math.log2(n) * _U * float(np.linalg.norm(g))
    g = np.roll(np.maximum(g, 0.0), -(window.first % n))
    infinity = -math.expm1(steps * math.log1p(-single.infinity)) if single.infinity > 0 else 0.0
    return _Composed(h=single.h, first=window.first, g=g, extra=infinity + math.exp(window.log_above) + fft_err)


def _power_spectrum(x: np.ndarray, steps: int, slack: float) -> tuple[np.ndarray, float]:
    """rfft(x)^T, and a bound on the 2-norm (full spectrum) of its round-off error.

    Error analysis (first order in the unit round-off u; Higham, "Accuracy and Stability of
    Numerical Algorithms", 2nd ed., ch. 24 on the FFT): a double FFT gives each coefficient within
    c log2(n) u ||x||_1, and raising to the T-th power multiplies that by T |F_k|^(T-1). For
    the few low frequencies where |F_k|^(T-1) is not negligible (the ones that matter), F_k
    and F_k^T are therefore recomputed by direct summation in extended precision (long double,
    unit round-off u_ld ~ 1e-19 on x86), which removes the factor-T loss; elsewhere the double
    values are kept and bounded as above. Without extended precision (u_ld == u) this is
    still a valid bound, only a looser one. Refinement stops once the bound is below `slack`
    (a negligible part of the delta of interest) or a fixed amount of work is spent.
    """
    n = x.size
    c_log = 5.0 * math.log2(n)
    f = sfft.rfft(x)
    mod = np.abs(f)
    weights = np.full(f.size, 2.0)  # rfft holds half of the (Hermitian) spectrum
    weights[0] = 1.0
    if n % 2 == 0:
        weights[-1] = 1.0
    mass = float(np.sum(x))
    d_f = c_log * _U * mass  # per-coefficient error of the double FFT
    with np.errstate(under="ignore", divide="ignore"):
        log_amp = (steps - 1) * np.log(np.minimum(mod + d_f, 1.0))
        f_t = f**steps
        amp = np.exp(log_amp)
    err = steps * amp * d_f + 4.0 * steps * math.pi * _U * np.abs(f_t)  # per coefficient
    err2 = err**2
    # Refine the worst coefficients, as many as a fixed amount of work allows, and only where
    # the double-precision bound is not already negligible.
    n_atoms = int(np.count_nonzero(x >= 1e-12))
    budget = min(_MAX_REFINED, max(1, _REFINE_WORK // max(n_atoms, 1)))
    contrib = weights * err2
    order = np.argsort(-contrib)
    left = float(np.sum(contrib)) - np.cumsum(contrib[order])  # squared error left after refining a prefix
    needed = int(np.argmax(left <= slack**2)) + 1 if np.any(left <= slack**2) else order.size
    refine = np.sort(order[: min(needed, budget)])
    if math.sqrt(float(np.sum(contrib))) > slack and refine.size:
        exact, d_exact = _extended_coefficients(x, refine, steps)
        f_t[refine] = exact.astype(np.complex128)
        err2[refine] = (d_exact + _U * np.abs(f_t[refine])) ** 2
    return f_t, math.sqrt(float(np.sum(weights * err2)))


def _extended_coefficients(x: np.ndarray, freqs: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """F_k^T in long double for the given rfft frequencies, with error bounds (see _power_spectrum).

    F_k = sum_j x_j exp(-2 pi i j k / n) over all but the lightest atoms (pairwise sums,
    twiddles from two long-double tables, exp(-i(a B + b) t) = exp(-i a B t) exp(-i b t)); the
    remaining tiny atoms are added from a double FFT. F^T is taken in polar form.
    """
    ld = np.longdouble
    u_ld = float(np.finfo(ld).eps)
    n = x.size
    # The lightest atoms, of total mass <= min(1e-4, 1e-3 / T), go through the double FFT:
    # their share of each coefficient's error, T c log2(n) u * mass, stays below ~1e-16.
    nonzero = np.flatnonzero(x)
    by_mass = nonzero[np.argsort(x[nonzero], kind="stable")]
    n_small = int(np.searchsorted(np.cumsum(x[by_mass]), min(1e-4, 1e-3 / steps), side="right"))
    big = np.sort(by_mass[n_small:])
    small = x.copy()
    small[big] = 0.0
    f_small = sfft.rfft(small)[freqs]
    small_mass = float(np.sum(small))
    two_pi_over_n = np.arctan(ld(1)) * 8 / ld(n)
    block = max(1, math.isqrt(n))
    hi_angles = np.arange(-(-n // block) + 1, dtype=ld) * (block * two_pi_over_n)
    lo_angles = np.arange(block, dtype=ld) * two_pi_over_n
    cos_hi, sin_hi = np.cos(hi_angles), np.sin(hi_angles)
    cos_lo, sin_lo = np.cos(lo_angles), np.sin(lo_angles)
    xb = x[big].astype(ld)
    j = big.astype(np.int64)
    re = np.empty(freqs.size, dtype=ld)
    im = np.empty(freqs.size, dtype=ld)
    rows = max(1, (1 << 21) // max(1, big.size))
    for start in range(0, freqs.size, rows):
        k = freqs[start : start + rows].astype(np.int64)[:, None]
        m = (j[None, :] * k) % n
        a, b = m // block, m % block
        cos_t = cos_hi[a] * cos_lo[b] - sin_hi[a] * sin_lo[b]
        sin_t = sin_hi[a] * cos_lo[b] + cos_hi[a] * sin_lo[b]
        re[start : start + rows] = np.sum(xb * cos_t, axis=1)
        im[start : start + rows] = -np.sum(xb * sin_t, axis=1)
    re += f_small.real.astype(ld)
    im += f_small.imag.astype(ld)
    radius = np.hypot(re, im)
    angle = np.arctan2(im, re)
    with np.errstate(under="ignore", divide="ignore"):
        log_radius = np.log(radius)
        radius_t = np.exp(steps * log_radius)
    turn = np.mod(steps * angle, np.arctan(ld(1)) * 8)
    value = radius_t * (np.cos(turn) + 1j * np.sin(turn))
    # |dF| from the long-double sums (twiddles ~4 u_ld, pairwise summation log2 terms) and from
    # the double FFT of the tiny atoms; then the T-th power: T |F|^(T-1) |dF| + polar round-off.
    d_f = (math.log2(max(big.size, 2)) + 8.0) * u_ld * float(np.sum(x[big])) + 5.0 * math.log2(n) * _U * small_mass
    radius_f = radius.astype(float)
    with np.errstate(under="ignore", divide="ignore"):
        amp = np.exp((steps - 1) * np.log(np.minimum(radius_f + d_f, 1.0)))
        d_power = 8.0 * u_ld * steps * (math.pi + np.abs(log_radius.astype(float))) * radius_t.astype(float)
    return value, steps * amp * d_f + d_power


def _log_sum_exp(z: np.ndarray) -> float:
    m = float(z.max())
    return m + math.log(float(np.sum(np.exp(z - m))))


def _beyond_the_grid(h: float) -> _Composed:
    """A step whose privacy loss lies almost all beyond +-_LOSS_LIMIT (e.g. sample rate 1 and noise
    multiplier 0.01: loss about 1 / (2 sigma^2) = 5000), or a composition whose loss spreads wider than
    _MAX_FFT grid steps of _MAX_H: no grid holds it, so all of its mass is counted in delta, which gives
    epsilon = inf, an upper bound (as a sample rate below 1 already did)."""
    return _Composed(h=h, first=0, g=np.zeros(1), extra=1.0)


def _compose_direction(q: float, sigma: float, steps: int, h: float, add: bool, tail: float) -> _Composed:
    """Discretise one direction and compose it, coarsening h only where the grids would not fit.

    A cheap coarse pass (~4096 bins) sizes the composed window first, so that a huge loss
    range (large epsilons) never builds a fine grid that would then be thrown away.
    """
    lo, hi = _loss_range(q, sigma, add)
    if lo >= _LOSS_LIMIT:
        return _beyond_the_grid(h)  # (lo >= hi below it: a range narrower than the root finder's 1e-9, one bin)
    h = max(h, (hi - lo) / _MAX_SINGLE_BINS)
    coarse = (hi - lo) / 4096
    if coarse > 16 * h:
        w = _window(_discretise(q, sigma, coarse, add, lo, hi), steps, tail)
        h = max(h, 1.1 * w.size * coarse / _MAX_FFT)
    while h <= _MAX_H:
        single = _discretise(q, sigma, h, add, lo, hi)
        window = _window(single, steps, tail)
        if window.size <= _MAX_FFT:
            return _compose(single, steps, window, slack=tail)
        h *= 1.1 * window.size / _MAX_FFT
    return _beyond_the_grid(h)


# ---------------------------------------------------------------------------------------
# Reading delta and epsilon off a composed PLD
# ---------------------------------------------------------------------------------------


def _delta_of(c: _Composed, eps: float) -> float:
    """delta(eps) = extra + sum over atoms above eps of g (1 - e^(eps - loss))."""
    loss = (c.first + np.arange(c.g.size)) * c.h
    above = loss > eps
    return c.extra + float(np.sum(c.g[above] * -np.expm1(eps - loss[above])))


def _epsilon_of(c: _Composed, delta: float) -> float:
    """Smallest eps >= 0 with delta(eps) <= delta for the composed discrete PLD (inf if none)."""
    g, h = c.g, c.h
    n = g.size
    if c.extra >= delta:
        return math.inf
    # delta at every grid point, to locate the crossing: D_k = A_k - S_k with
    # A_k = sum_{j>k} g_j and S_k = sum_{j>k} g_j e^{-(j-k)h} (accumulated in log space).
    a = np.concatenate([np.cumsum(g[::-1])[::-1][1:], [0.0]])
    with np.errstate(divide="ignore"):
        log_terms = np.log(g) - np.arange(n) * h
    log_cum = np.logaddexp.accumulate(log_terms[::-1])[::-1]  # log sum_{j>=k} g_j e^{-jh}
    s = np.concatenate([np.exp(log_cum[1:] + np.arange(n - 1) * h), [0.0]])
    ok = c.extra + (a - s) <= delta
    k = int(np.argmax(ok))  # ok is true at least at the top (D = 0 there)

    def exact(k: int) -> float:  # delta at grid point k, summed directly (no cancellation)
        return c.extra + float(np.sum(g[k + 1 :] * -np.expm1(-np.arange(1, n - k) * h)))

    while k < n - 1 and exact(k) > delta:
        k += 1
    while k > 0 and exact(k - 1) <= delta:
        k -= 1
    loss_k = (c.first + k) * h
    if k == 0 or loss_k <= 0.0:
        return 0.0 if loss_k <= 0.0 else loss_k
    # On (loss_{k-1}, loss_k]: delta(eps) = delta_k + S' (1 - e^{eps - loss_k}), S' = sum_{j>=k} g_j e^{-(j-k)h}.
    s_k = float(np.sum(g[k:] * np.exp(-np.arange(n - k) * h)))
    eps = loss_k + math.log1p(-(delta - exact(k)) / s_k)
    eps = max(eps, loss_k - h)
    return max(0.0, eps + 8.0 * _U * abs(eps) + 1e-15)


# ---------------------------------------------------------------------------------------
# Composition of different subsampled Gaussian mechanisms (a tuning study's runs)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubsampledGaussian:
    """One DP-SGD training as a privacy event: `steps` Poisson-subsampled Gaussian steps."""

    sample_rate: float
    noise_multiplier: float
    steps: int


def pld_epsilon_composed(*, mechanisms, delta: float, discretization: float | None = None) -> Epsilon:
    """Upper bound on epsilon at `delta` of running every one of `mechanisms` (SubsampledGaussian) on
    the same data, each with its own sample rate, noise and steps (PLD).

    The same construction as `pld_epsilon`, on one loss grid for all: every mechanism's one-step
    pair is discretised pessimistically on that grid, the spectra are raised to their steps and
    multiplied (adaptive composition of dominating pairs [ZDW22]; a fixed pair of neighbours is
    on the same side, add or remove, in every run), and the window edges come from one Chernoff
    bound over the sum of all losses. Round-off bounds add up over the factors of the product
    (|prod a - prod b| <= sum |a_i - b_i| when every factor is at most 1 in modulus). Mechanisms
    with the same sample rate and noise are merged (their steps add), so a study that searches
    only settings without privacy cost (learning rate, clipping norm) is one self-composition.
    """
    d = _validate.delta(delta)
    groups: dict[tuple[float, float], int] = {}
    for m in mechanisms:
        q, sigma, t, _ = _check(m.sample_rate, m.noise_multiplier, m.steps, 0.1)
        if q == 0.0 or t == 0:
            continue
        if sigma < _SIGMA_FLOOR:
            return Epsilon(value=math.inf, delta=d, accountant="pld")
        groups[(q, sigma)] = groups.get((q, sigma), 0) + t
    if not groups:
        return Epsilon(value=0.0, delta=d, accountant="pld")
    if len(groups) == 1:
        ((q, sigma), t), = groups.items()
        return pld_epsilon(sample_rate=q, noise_multiplier=sigma, steps=t, delta=d, discretization=discretization)
    parts = [(q, sigma, t) for (q, sigma), t in groups.items()]
    if discretization is None:
        h = min(_auto_discretization(q, sigma, t) for q, sigma, t in parts)
    else:
        h = _validate.positive("discretization", discretization)
        if h > 0.1:
            raise ValueError(f"discretization must be in (0, 0.1] (a step on the loss axis); got {discretization!r}")
    tail = 1e-6 * d
    value = max(_epsilon_of(_compose_mixed(parts, h, add, tail), d) for add in (False, True))
    return Epsilon(value=value, delta=d, accountant="pld")


def _compose_mixed(parts: list[tuple[float, float, int]], h: float, add: bool, tail: float) -> _Composed:
    """Compose several (q, sigma, steps) in one direction on one grid, coarsening h where it must."""
    ranges = [_loss_range(q, sigma, add) for q, sigma, _ in parts]
    if any(lo >= _LOSS_LIMIT for lo, _ in ranges):
        return _beyond_the_grid(h)
    h = max([h] + [(hi - lo) / _MAX_SINGLE_BINS for lo, hi in ranges])
    while True:
        if h > _MAX_H:
            return _beyond_the_grid(h)
        singles = [_discretise(q, sigma, h, add, lo, hi) for (q, sigma, _), (lo, hi) in zip(parts, ranges)]
        steps = [t for _, _, t in parts]
        window = _mixed_window(singles, steps, tail)
        if window.size <= _MAX_FFT:
            break
        h *= 1.1 * window.size / _MAX_FFT
    n = window.size
    total = np.ones(n // 2 + 1, dtype=complex)
    err, infinity_kept = 0.0, 0.0
    for single, t in zip(singles, steps):
        x = np.bincount((single.first + np.arange(single.mass.size)) % n, weights=single.mass, minlength=n)
        f_t, power_err = _power_spectrum(x, t, tail / len(singles))
        total = total * f_t
        err += power_err
        if single.infinity > 0:
            infinity_kept += math.log1p(-single.infinity) * t
    g = sfft.irfft(total, n=n)
    err += 4.0 * len(singles) * _U * math.sqrt(n) + math.sqrt(n) * 5.0 * math.log2(n) * _U * float(np.linalg.norm(g))
    g = np.roll(np.maximum(g, 0.0), -(window.first % n))
    infinity = -math.expm1(infinity_kept)
    return _Composed(h=h, first=window.first, g=g, extra=infinity + math.exp(window.log_above) + err)


def _mixed_window(singles: list[_Discrete], steps: list[int], tail: float) -> _Window:
    """FFT window for the sum of all the mechanisms' losses: Chernoff bounds over the sum (each
    mechanism's cumulant generating function times its steps), searched on lam as _chernoff_edge."""
    h = singles[0].h
    atoms = []
    for single in singles:
        nz = np.flatnonzero(single.mass > 0.0)
        atoms.append((np.log(single.mass[nz]), (single.first + nz) * h))
    log_tau = math.log(tail)

    def edge(sign: float) -> tuple[float, float]:
        def bound(lam: float) -> float:
            total = sum(t * _log_sum_exp(lm + lam * sign * loss) for (lm, loss), t in zip(atoms, steps))
            return (total - log_tau) / lam

        res = optimize.minimize_scalar(lambda s: bound(math.exp(s)), bounds=(math.log(1e-4), math.log(1e4)),
                                       method="bounded", options={"xatol": 0.02})
        lam = math.exp(float(res.x))
        return bound(lam), lam

    upper, lam_up = edge(1.0)
    lower_neg, _ = edge(-1.0)
    i_lo = math.floor(min(-lower_neg, 0.0) / h)
    i_hi = math.ceil(max(upper, 0.0) / h)
    n = sfft.next_fast_len(i_hi - i_lo + 1, real=True)
    log_above = sum(t * _log_sum_exp(lm + lam_up * loss) for (lm, loss), t in zip(atoms, steps)) \
        - lam_up * (i_lo + n) * h
    return _Window(first=i_lo, size=n, log_above=min(0.0, log_above))
