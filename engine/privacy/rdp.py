"""Renyi DP of the Poisson-subsampled Gaussian mechanism, and the conversion to (epsilon, delta).

The mechanism (DP-SGD, add/remove-one neighbours): each example is used with probability
`sample_rate` q, the clipped gradients (norm <= C) are summed and N(0, (sigma*C)^2) noise is
added, `noise_multiplier` = sigma. Up to scaling its output distributions on neighbouring
datasets are mu_0 = N(0, sigma^2) and mu = (1-q) N(0, sigma^2) + q N(1, sigma^2).

References
----------
[MTZ19] I. Mironov, K. Talwar, L. Zhang, "Renyi Differential Privacy of the Sampled Gaussian
        Mechanism", arXiv:1908.10530 (2019). Sec. 3: of the two directions, D_alpha(mu||mu_0)
        is the larger for alpha >= 1, so one step is (alpha, log(A_alpha)/(alpha-1))-RDP;
        Sec. 3.3: A_alpha as a finite sum for integer alpha and two series for fractional alpha.
[Mir17] I. Mironov, "Renyi Differential Privacy", CSF 2017. Prop. 1 (composition adds RDP).
[CKS20] C. Canonne, G. Kamath, T. Steinke, "The Discrete Gaussian for Differential Privacy",
        arXiv:2004.00010, Prop. 12 (v4): the improved RDP -> (eps, delta) conversion.
[BBGHS20] B. Balle, G. Barthe, M. Gaboardi, J. Hsu, T. Sato, "Hypothesis Testing Interpretations
        and Renyi Differential Privacy", AISTATS 2020, Theorem 21 (the same conversion).
[BH79]  J. Bretagnolle, C. Huber (1979): TV(P, Q) <= sqrt(1 - exp(-KL(P||Q))).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from engine.privacy import _validate
from engine.privacy.types import Epsilon

__all__ = ["DEFAULT_ORDERS", "compute_rdp", "rdp_to_epsilon"]


def _default_orders() -> np.ndarray:
    orders = np.concatenate(
        [
            np.arange(11, 110) / 10.0,  # 1.1, 1.2, ..., 10.9: fractional orders matter for eps >~ 2
            np.arange(11, 65, dtype=float),  # 11 .. 64: small epsilons / many steps
            # 65 .. 4096, integers about 2% apart: very small epsilons. The RDP epsilon of the subsampled
            # Gaussian has a sharp minimum over the order there, so the loss is about the spacing.
            np.unique(np.round(np.geomspace(64.0, 4096.0, 211)[1:])),
        ]
    )
    orders.flags.writeable = False
    return orders


DEFAULT_ORDERS: np.ndarray = _default_orders()
"""RDP orders used when none are given (read-only): 1.1 to 10.9 in steps of 0.1, every integer
11..64, then integers about 2% apart up to 4096 (363 orders); the conversion takes the best of them.
The grid's own loss in epsilon against the best order is below ~2% for epsilons down to ~0.003
(the old grid, ending 512, 1024, was up to 1.9x looser below epsilon 0.07)."""

# Fractional series: stop once the first omitted term is below this fraction of the partial
# sum, or below 1e-10 of (partial sum - 1) (the omitted tail is then *added* as a bound, so
# this only affects tightness, by less than ~1e-10 relative in the RDP).
_FRAC_REL_TAIL = 1e-14
_FRAC_MAX_TERMS = 1 << 16
# Relative accuracy assumed for each elementary step (gammaln, log_ndtr, exp, products): the
# round-off allowances below add this much per unit of magnitude, so that RDP values are
# upper bounds also after floating-point rounding.
_ROUNDOFF = 8.0 * float(np.finfo(float).eps)
# Below this noise multiplier (~1.5e-154) sigma^2 is no longer a normal float (it loses precision,
# then underflows to 0) and 1/(2 sigma^2) > 2e307: the RDP of every order is at or beyond float range
# (log A_alpha grows like alpha (alpha - 1) / (2 sigma^2)), so compute_rdp gives inf outright.
SMALLEST_SQUARABLE_SIGMA = math.sqrt(float(np.finfo(float).tiny))


def compute_rdp(
    *,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    orders=DEFAULT_ORDERS,
) -> np.ndarray:
    """RDP epsilon(alpha) of `steps` compositions of the Poisson-subsampled Gaussian, per order.

    One step: log(A_alpha) / (alpha - 1) with A_alpha = E_{z~mu_0}[(mu(z)/mu_0(z))^alpha]
    [MTZ19, Sec. 3.3]; composition over steps is linear [Mir17, Prop. 1]. Integer orders use the
    exact finite binomial sum; fractional orders the two convergent series of [MTZ19, Sec. 3.3],
    truncated with the alternating-series remainder bound added, so the value is an upper bound.
    Special cases: q == 0 or steps == 0 gives 0; sigma < sqrt(smallest normal float) ~ 1.5e-154
    (q > 0, sigma == 0 included) gives inf, as 1/(2 sigma^2) > 2e307 puts the RDP at or beyond
    float range; q == 1 gives steps * alpha / (2 sigma^2) exactly (the plain Gaussian mechanism).
    An order whose terms overflow (tiny sigma, huge order), or whose total exceeds float range,
    gives inf, its upper bound.
    """
    q = _validate.sample_rate(sample_rate)
    sigma = _validate.noise_multiplier(noise_multiplier)
    t = _validate.steps(steps)
    alphas = _validate.orders(orders)

    if q == 0.0 or t == 0:
        return np.zeros_like(alphas)
    if sigma < SMALLEST_SQUARABLE_SIGMA:
        return np.full_like(alphas, np.inf)
    if q == 1.0:
        with np.errstate(over="ignore"):
            return t * alphas / (2.0 * sigma**2)

    per_step = np.empty_like(alphas)
    is_int = alphas == np.round(alphas)
    # Exponents (k^2 - k) / (2 sigma^2) may overflow for tiny sigma or huge orders; the orders
    # concerned come out as inf (an upper bound), without a warning.
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for group in _integer_groups(alphas, is_int):
            per_step[group] = _log_a_integer(q, sigma, alphas[group])
        fractional = np.flatnonzero(~is_int)
        if fractional.size:
            per_step[fractional] = _log_a_fractional(q, sigma, alphas[fractional])
    # A NaN here can only come from such an overflow (inf - inf): A_alpha is then beyond float
    # range, and inf is its upper bound.
    per_step = np.where(np.isnan(per_step), np.inf, per_step)
    # A_alpha >= 1 (a Renyi divergence is >= 0); clamping up is the safe side of round-off.
    per_step = np.maximum(per_step, 0.0) / (alphas - 1.0)
    with np.errstate(over="ignore"):
        return t * per_step


def _integer_groups(alphas: np.ndarray, is_int: np.ndarray) -> list[np.ndarray]:
    """Positions of the integer orders, grouped by size (all orders <= 64 together, then one group
    per octave), so each group's (orders x k) table of binomial terms stays small. Every integer
    order is in exactly one group, whatever its position in `alphas` (duplicates included)."""
    positions = np.flatnonzero(is_int)
    octave = np.where(alphas[positions] <= 64, 0, np.ceil(np.log2(alphas[positions])).astype(int))
    return [positions[octave == o] for o in np.unique(octave)]


def rdp_to_epsilon(*, orders, rdp, delta: float) -> Epsilon:
    """Best (epsilon, delta) implied by RDP values at several orders.

    For each order: eps = rdp + log((alpha-1)/alpha) - (log(delta) + log(alpha)) / (alpha-1)
    [CKS20, Prop. 12; BBGHS20, Thm. 21], and eps = 0 when delta >= sqrt(1 - exp(-rdp)), since then
    TV <= sqrt(1 - exp(-KL)) <= delta [BH79] (KL <= D_alpha for alpha > 1). Returns the minimum
    over orders, clamped at 0, with the order that attains it.
    """
    alphas, values = _validate.rdp_curve(orders, rdp)
    d = _validate.delta(delta)
    eps = _epsilon_per_order(alphas, values, d)
    best = int(np.argmin(eps))
    value = float(eps[best])
    if math.isinf(value):
        return Epsilon(value=math.inf, delta=d, accountant="rdp", order=None)
    return Epsilon(value=max(value, 0.0), delta=d, accountant="rdp", order=float(alphas[best]))


def _conversion_offset(alphas: np.ndarray, delta: float) -> np.ndarray:
    """log((alpha-1)/alpha) - (log(delta) + log(alpha)) / (alpha-1), per order [CKS20, Prop. 12]."""
    return np.log1p(-1.0 / alphas) - (math.log(delta) + np.log(alphas)) / (alphas - 1.0)


def _epsilon_per_order(
    alphas: np.ndarray, rdp: np.ndarray, delta: float, offset: np.ndarray | None = None
) -> np.ndarray:
    """Conversion [CKS20, Prop. 12] for arrays of shape (..., n_orders); inf stays inf.

    `offset` may be passed precomputed (_conversion_offset) by callers that convert often.
    """
    if offset is None:
        offset = _conversion_offset(alphas, delta)
    with np.errstate(invalid="ignore"):
        eps = rdp + offset
        # [BH79]: delta^2 >= 1 - exp(-rdp) means (0, delta)-DP already.
        zero = delta * delta + np.expm1(-rdp) >= 0.0
    eps = np.where(zero, 0.0, eps)
    return np.where(np.isinf(rdp), np.inf, eps)


def _log_a_integer(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """log A_alpha for integer orders alpha >= 2, exact binomial expansion [MTZ19, Sec. 3.3].

    A_alpha = sum_k C(alpha,k) (1-q)^(alpha-k) q^k exp((k^2-k)/(2 sigma^2)). Since the binomial
    weights sum to 1, A_alpha - 1 = sum_{k>=2} (same weights) * expm1((k^2-k)/(2 sigma^2)), a sum
    of positive terms, so log A_alpha = log1p(A_alpha - 1) keeps full relative precision even
    when the RDP is tiny (small q, large sigma). Vectorised over orders (rows) and k (columns).
    """
    top = int(alphas.max())
    log_factorial = special.gammaln(np.arange(top + 1, dtype=float) + 1.0)  # log(m!) for m = 0..top
    a = alphas[:, None]
    k = np.arange(2, top + 1, dtype=float)[None, :]
    valid = k <= a
    # Integer orders: C(alpha, k) from a table of log-factorials (a gather instead of gammaln calls).
    log_fact_a = log_factorial[alphas.astype(np.int64)][:, None]
    log_fact_k = log_factorial[2:][None, :]
    log_fact_rest = log_factorial[np.where(valid, a - k, 0.0).astype(np.int64)]
    rest_part = (a - k) * math.log1p(-q)
    k_part = k * math.log(q)
    log_growth = _log_expm1((k * k - k) / (2.0 * sigma**2))
    log_terms = np.where(valid, log_fact_a - log_fact_k - log_fact_rest + rest_part + k_part + log_growth, -np.inf)
    # Round-off allowance: each log-term is a sum of parts computed to a few ulps each, so its
    # absolute error is at most _ROUNDOFF * (sum of |parts|); grow A - 1 by the largest one.
    parts = np.abs(log_fact_a) + log_fact_k + log_fact_rest + np.abs(rest_part) + np.abs(k_part) + np.abs(log_growth)
    slack = _ROUNDOFF * (1.0 + np.max(np.where(valid, parts, 0.0), axis=1))
    log_a_minus_1 = special.logsumexp(log_terms, axis=1) + slack
    return np.logaddexp(0.0, log_a_minus_1)


def _log_a_fractional(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """log A_alpha for fractional orders alpha > 1 by the two series of [MTZ19, Sec. 3.3].

    With z0 = sigma^2 log(1/q - 1) + 1/2 and j = alpha - i, term i is C(alpha, i) times
      q^i (1-q)^j exp((i^2-i)/(2 sigma^2)) Phi((z0 - i)/sigma)
    + q^j (1-q)^i exp((j^2-j)/(2 sigma^2)) Phi((j - z0)/sigma).
    Both bracketed factors are non-increasing in i (from Phi-bar(x+c) <= e^(-cx-c^2/2) Phi-bar(x)),
    |C(alpha, i)| decreases for i > alpha and its sign alternates from i = ceil(alpha) on, so
    after N >= ceil(alpha) + 1 the remainder is at most |term N| in absolute value. We add that
    bound, and an allowance for round-off in the terms, so the result is an upper bound on A_alpha.
    Vectorised over orders (rows) and terms (columns); rows that need more terms get more.
    """
    out = np.empty(alphas.size)
    pending = np.arange(alphas.size)
    n = 256
    while pending.size:
        done, values = _fractional_block(q, sigma, alphas[pending], n, final=n >= _FRAC_MAX_TERMS)
        out[pending[done]] = values
        pending = pending[~done]
        n *= 4
    return out


def _fractional_block(q: float, sigma: float, alphas: np.ndarray, n: int, final: bool):
    """Terms 0..n-1 of the series for each order; returns (converged mask, log A of those)."""
    z0 = sigma**2 * (math.log1p(-q) - math.log(q)) + 0.5
    log_q, log_1mq = math.log(q), math.log1p(-q)
    a = alphas[:, None]
    i = np.arange(n, dtype=float)[None, :]
    j = a - i
    ceil_a = np.ceil(a)
    log_binom = special.gammaln(a + 1.0) - special.gammaln(i + 1.0) - special.gammaln(j + 1.0)
    sign = np.where(i <= ceil_a, 1.0, np.where((i - ceil_a) % 2 == 0, 1.0, -1.0))
    parts0 = (i * log_q, j * log_1mq, (i * i - i) / (2 * sigma**2), special.log_ndtr((z0 - i) / sigma))
    parts1 = (j * log_q, i * log_1mq, (j * j - j) / (2 * sigma**2), special.log_ndtr((j - z0) / sigma))
    log_t0, log_t1 = sum(parts0), sum(parts1)
    log_terms = log_binom + np.logaddexp(log_t0, log_t1)
    # A term past float range (+inf, or NaN from inf - inf in its exponent; only for tiny sigma or
    # huge orders): A_alpha is past it too, so that order is done, with log A = inf.
    overflowed = np.any(np.isnan(log_terms) | (log_terms == np.inf), axis=1)
    shift = np.max(log_terms, axis=1, keepdims=True)
    terms = sign * np.exp(log_terms - shift)
    partial = np.cumsum(terms, axis=1)  # partial[:, k] = sum_{i <= k} terms[:, i] (scaled by e^-shift)
    # Stop at the first N >= ceil(alpha) + 1 whose term is tiny against the sum before it, or
    # against (sum - 1): RDP = log(A)/(alpha-1) needs relative accuracy in A - 1, and where
    # A - 1 is large enough to estimate, fewer terms give it.
    before = np.concatenate([np.zeros((alphas.size, 1)), partial[:, :-1]], axis=1)
    scale = np.maximum(_FRAC_REL_TAIL * before, 1e-10 * (before - np.exp(-shift)))
    ok = (i >= ceil_a + 1) & (np.abs(terms) <= scale)
    done = ok.any(axis=1) | overflowed | final
    stop = np.where(ok.any(axis=1), np.argmax(ok, axis=1), n - 1)[done]
    rows = np.flatnonzero(done)
    # Round-off allowance: a term's log is a sum of parts, each accurate to a few ulps.
    size_binom = np.abs(special.gammaln(a + 1.0)) + np.abs(special.gammaln(i + 1.0)) + np.abs(special.gammaln(j + 1.0))
    weighted = sum(
        np.exp(log_binom + log_t - shift) * (1.0 + size_binom + sum(np.abs(x) for x in parts))
        for log_t, parts in ((log_t0, parts0), (log_t1, parts1))
    )
    values = np.empty(rows.size)
    for r, (row, k) in enumerate(zip(rows, stop)):
        if overflowed[row]:
            values[r] = math.inf
            continue
        slack = _ROUNDOFF * float(np.sum(weighted[row, : k + 1]))
        total = math.fsum(terms[row, :k]) + abs(terms[row, k]) + slack
        values[r] = float(shift[row, 0]) + math.log(total)
    return done, values


def _log_expm1(x: np.ndarray) -> np.ndarray:
    """log(exp(x) - 1) for x > 0, stable for small and large x."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(x > 30.0, x + np.log1p(-np.exp(-np.minimum(x, 700.0))), np.log(np.expm1(np.minimum(x, 30.0))))
