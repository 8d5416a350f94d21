"""Privacy analysis of PATE's noisy aggregators: LNMax, GNMax and Confident GNMax.

Pure functions of vote histograms and numbers (numpy/scipy only, no torch, no I/O, no state).
A vote histogram is a row of non-negative counts, one per class; `votes` is one row or a
(queries, classes) array. The neighbouring relation is the papers': one training example
changes one teacher, which moves at most one vote per query (one count -1, another +1).

Every per-query cost is an RDP curve over `orders`; costs compose by addition [Mir17, Prop. 1],
so the epsilon after every query is cheap (a running sum of RDP vectors), and the guarantee is
converted to (epsilon, delta) with the same conversion as `engine.privacy.rdp.rdp_to_epsilon`
([CKS20, Prop. 12]; tighter than the papers' eps = rdp + log(1/delta)/(alpha-1)).

Data-dependent bounds depend on the private votes, so they are not themselves private; the
smooth-sensitivity release of such a bound is in `engine.privacy.pate_smooth`.

References
----------
[PAEGT17] N. Papernot, M. Abadi, U. Erlingsson, I. Goodfellow, K. Talwar, "Semi-supervised
          Knowledge Transfer for Deep Learning from Private Training Data", ICLR 2017
          (arXiv:1610.05755). Sec. 2.1 (LNMax, Eq. 1), Sec. 3 (moments accountant),
          Theorem 2 (data-independent), Theorem 3 (data-dependent), Lemma 4 (q bound).
[PSMRTE18] N. Papernot, S. Song, I. Mironov, A. Raghunathan, K. Talwar, U. Erlingsson,
          "Scalable Private Learning with PATE", ICLR 2018 (arXiv:1802.08908).
          Sec. 4.1 (GNMax), Sec. 4.2 (Confident GNMax, Algorithm 1), Proposition 7 (q bound),
          Proposition 8 (data-independent RDP of GNMax), Theorem 6 (data-dependent RDP),
          Proposition 10 (choice of mu1, mu2), Appendix B.
[Mir17]   I. Mironov, "Renyi Differential Privacy", CSF 2017 (composition, Prop. 1).
[BS16]    M. Bun, T. Steinke, "Concentrated Differential Privacy", TCC 2016, Prop. 3
          (eps-DP implies (alpha, alpha eps^2 / 2)-RDP).
[CKS20]   C. Canonne, G. Kamath, T. Steinke, arXiv:2004.00010, Prop. 12 (RDP -> (eps, delta)).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from scipy import special

from engine.privacy.rdp import SMALLEST_SQUARABLE_SIGMA, rdp_to_epsilon
from engine.privacy.types import Epsilon

__all__ = [
    "PATE_ORDERS",
    "MECHANISMS",
    "ACCOUNTANT_DATA_DEPENDENT",
    "ACCOUNTANT_DATA_INDEPENDENT",
    "QueryCosts",
    "PateEpsilon",
    "MomentsEpsilon",
    "gnmax_log_q",
    "gnmax_rdp_data_independent",
    "gnmax_rdp_data_dependent",
    "gnmax_log_q0",
    "threshold_log_pr_answered",
    "threshold_rdp_data_independent",
    "threshold_rdp_data_dependent",
    "lnmax_log_q",
    "lnmax_rdp_data_independent",
    "lnmax_rdp_data_dependent",
    "lnmax_moments_epsilon",
    "query_costs",
    "epsilon_after_each",
    "queries_within_budget",
    "pate_epsilon",
    "epsilon_if_all_answered",
]

MECHANISMS = ("gnmax", "confident", "lnmax")
ACCOUNTANT_DATA_DEPENDENT = "pate-dd"
ACCOUNTANT_DATA_INDEPENDENT = "pate-di"


def _default_orders() -> np.ndarray:
    orders = np.concatenate(
        [
            np.array([1.01, 1.02, 1.03, 1.04]),  # large epsilons (many answered queries)
            np.arange(21, 40) / 20.0,  # 1.05 .. 1.95 in steps of 0.05
            np.arange(20, 100) / 10.0,  # 2 .. 9.9 in steps of 0.1
            np.arange(20, 201) / 2.0,  # 10 .. 100 in steps of 0.5, as the authors' analysis
            np.geomspace(100.0, 1000.0, 41)[1:],  # up to 1000: very small data-dependent costs
        ]
    )
    orders.flags.writeable = False
    return orders


PATE_ORDERS: np.ndarray = _default_orders()
"""RDP orders used when none are given (read-only, 324 orders): 1.01 to 1.04, 1.05 to 1.95 in steps
of 0.05, 2 to 9.9 in steps of 0.1, 10 to 100 in steps of 0.5, then 40 log-spaced orders up to 1000.
Data-dependent PATE costs are often smallest at high orders, hence the long tail; the fine start
keeps large data-independent epsilons within ~0.3% of the best order (the old grid, starting at
1.25 with steps of 0.25 and 0.5, was up to a few percent looser)."""


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueryCosts:
    """Per-query RDP costs of one aggregator over `orders` (arrays of shape (queries, orders)).

    `weight` is how much of the GNMax step each query pays: 1/0 for answered/rejected queries
    (realised answers), the probability of answering (expected cost), or 1 for GNMax and LNMax.
    `threshold_*` are zero for aggregators without a threshold check.
    """

    mechanism: str
    orders: np.ndarray
    data_dependent: np.ndarray
    data_independent: np.ndarray
    weight: np.ndarray
    pr_answered: np.ndarray  # Pr[threshold check passes] per query; 1 without a threshold
    log_q: np.ndarray  # bound on log Pr[aggregate != plurality] per query (Prop. 7 / Lemma 4)

    @property
    def num_queries(self) -> int:
        return int(self.data_dependent.shape[0])


@dataclass(frozen=True)
class PateEpsilon:
    """The (epsilon, delta) guarantee of a PATE aggregation, data-dependent and data-independent.

    `epsilon_data_dependent` uses the votes (Theorem 6 / Theorem 3); it is NOT itself private and
    must not be published as it is (see `engine.privacy.pate_smooth.release_epsilon`).
    `epsilon_data_independent` depends only on the noise settings and on how many queries were
    asked/answered. `answered` is the realised count, or the expected count when the answers were
    not given. `rdp` is the composed data-dependent RDP curve over `orders`.
    """

    mechanism: str
    epsilon_data_dependent: float
    epsilon_data_independent: float
    delta: float
    order: float | None
    order_data_independent: float | None
    num_queries: int
    answered: float
    answered_is_expected: bool
    orders: np.ndarray
    rdp: np.ndarray
    rdp_data_independent: np.ndarray

    def as_epsilon(self, *, data_dependent: bool = True) -> Epsilon:
        if data_dependent:
            return Epsilon(self.epsilon_data_dependent, self.delta, ACCOUNTANT_DATA_DEPENDENT, self.order)
        return Epsilon(self.epsilon_data_independent, self.delta, ACCOUNTANT_DATA_INDEPENDENT,
                       self.order_data_independent)


@dataclass(frozen=True)
class MomentsEpsilon:
    """Result of the [PAEGT17] moments accountant: epsilon = min_l (sum alpha(l) + log(1/delta)) / l."""

    value: float
    delta: float
    moment: int  # the l (1..moments) that attains the minimum
    data_dependent: bool
    log_moments: np.ndarray  # the composed alpha(l), l = 1..moments


# ------------------------------------------------------------------------------------------------
# Argument checks: one ValueError naming the argument, the value and the allowed range
# ------------------------------------------------------------------------------------------------


def _number(name: str, value, *, low: float = 0.0, inclusive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number; got {value!r}")
    x = float(value)
    ok = x >= low if inclusive else x > low
    if math.isnan(x) or not ok or math.isinf(x):
        rel = ">=" if inclusive else ">"
        raise ValueError(f"{name} must be finite and {rel} {low:g}; got {value!r}")
    return x


def _delta(value) -> float:
    d = _number("delta", value)
    if d >= 1.0:
        raise ValueError(f"delta must be in (0, 1) (exclusive); got {value!r}")
    return d


def _orders(value) -> np.ndarray:
    a = np.atleast_1d(np.asarray(value, dtype=float))
    if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a) & (a > 1.0)):
        raise ValueError(f"orders must be a non-empty 1-d sequence of finite numbers > 1; got {value!r}")
    return a


def _votes(value) -> np.ndarray:
    """Votes as a float (queries, classes) array; one histogram becomes one row."""
    a = np.asarray(value, dtype=float)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or a.shape[1] < 2:
        raise ValueError(
            f"votes must be a histogram of counts per class (at least 2 classes) or an array of shape "
            f"(queries, classes); got shape {np.shape(value)}"
        )
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError("votes must be finite, non-negative counts")
    return a


def _mask(answered, num_queries: int) -> np.ndarray:
    m = np.asarray(answered)
    if m.shape != (num_queries,):
        raise ValueError(f"answered must hold one entry per query: got shape {m.shape} for {num_queries} queries")
    if m.dtype != bool:
        if not np.all((m == 0) | (m == 1)):
            raise ValueError("answered must be a boolean mask (or 0/1) of which queries were answered")
        m = m.astype(bool)
    return m


# ------------------------------------------------------------------------------------------------
# Numerics
# ------------------------------------------------------------------------------------------------


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """log(1 - exp(x)) for x <= 0, accurate near 0 and for very negative x."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x < -math.log(2.0), np.log1p(-np.exp(x)), np.log(-np.expm1(x)))


def _log_normal_sf(x: np.ndarray, scale: float) -> np.ndarray:
    """log Pr[N(0, scale^2) >= x]."""
    with np.errstate(over="ignore"):  # x / scale past float range: log_ndtr(+-inf) is 0 or -inf
        return special.log_ndtr(-np.asarray(x, dtype=float) / scale)


# The log of a positive probability too small for a float (for noise so small that q underflows) is
# below this: using it in place of -inf keeps log q an upper bound on log q. A q of exactly 0 would
# make the data-dependent bounds cost nothing, which such noise does not earn.
_LOG_FLOOR = -float(np.finfo(float).max)


def _over_sigma_squared(x: np.ndarray, sigma: float) -> np.ndarray:
    """x / sigma^2 (x >= 0), inf where that passes float range, and for sigma < ~1.5e-154, whose
    square is no normal float (it loses precision, then underflows to 0)."""
    x = np.asarray(x, dtype=float)
    if sigma < SMALLEST_SQUARABLE_SIGMA:
        return np.where(x > 0.0, np.inf, 0.0)
    with np.errstate(over="ignore"):
        return x / sigma**2


def _half_square(x: float) -> float:
    """x^2 / 2 for x >= 0, inf where x^2 passes float range (where Python's ** raises)."""
    return 0.5 * x**2 if x < 1e154 else math.inf


# ------------------------------------------------------------------------------------------------
# GNMax [PSMRTE18, Sec. 4.1]
# ------------------------------------------------------------------------------------------------


def gnmax_log_q(*, votes, sigma: float) -> np.ndarray:
    """Upper bound on log Pr[GNMax does not output the plurality class], per query.

    [PSMRTE18, Proposition 7]: with i* the plurality class (first on ties),
    q~ = sum_{i != i*} Pr[N(0, 2 sigma^2) >= n_i* - n_i] = 1/2 sum erfc((n_i* - n_i) / (2 sigma)),
    capped at 1 - 1/m (the plurality is the likeliest output). Returns shape (queries,).
    """
    v = _votes(votes)
    s = _number("sigma", sigma)
    top = np.argmax(v, axis=1)
    gaps = v[np.arange(v.shape[0]), top][:, None] - v
    log_terms = np.maximum(_log_normal_sf(gaps, math.sqrt(2.0) * s), _LOG_FLOOR)  # no false q = 0 (tiny sigma)
    log_terms[np.arange(v.shape[0]), top] = -np.inf
    log_q = special.logsumexp(log_terms, axis=1)
    return np.minimum(log_q, math.log1p(-1.0 / v.shape[1]))


def gnmax_rdp_data_independent(*, sigma: float, orders=PATE_ORDERS) -> np.ndarray:
    """RDP of one GNMax query whatever the votes: alpha / sigma^2 [PSMRTE18, Proposition 8].

    (The histogram moves by at most sqrt(2) in L2 norm, so the Gaussian mechanism on it has RDP
    alpha * 2 / (2 sigma^2); the arg max is post-processing.)
    """
    s = _number("sigma", sigma)
    return _over_sigma_squared(_orders(orders), s)


def _gnmax_dd_unchecked(log_q: np.ndarray, sigma: float, orders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bound, valid): the data-dependent RDP bound of [PSMRTE18, Theorem 6] with mu1, mu2 of
    Proposition 10, and where its conditions hold. Broadcasts log_q against orders.

    mu2 = sigma sqrt(log(1/q)), mu1 = mu2 + 1, eps_i = mu_i / sigma^2 (GNMax is (mu_i, eps_i)-RDP);
    A = (1 - q) / (1 - (q e^eps2)^((mu2 - 1) / mu2)), B = e^eps1 / q^(1 / (mu1 - 1)),
    RDP(alpha) <= log((1 - q) A^(alpha-1) + q B^(alpha-1)) / (alpha - 1),
    valid when q < 1, mu2 > 1, mu1 > alpha, q e^eps2 < 1 and
    q <= e^((mu2 - 1) eps2) / (mu1 / (mu1 - 1) * mu2 / (mu2 - 1))^mu2.
    """
    log_q, alphas = np.broadcast_arrays(np.asarray(log_q, dtype=float), np.asarray(orders, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = -log_q
        mu2 = sigma * np.sqrt(t)
        mu1 = mu2 + 1.0
        eps1 = mu1 / sigma**2
        eps2 = mu2 / sigma**2
        valid = (
            np.isfinite(log_q)
            & (log_q < 0.0)
            & (mu2 > 1.0)
            & (mu1 > alphas)
            & (t > eps2)
            & (log_q <= (mu2 - 1.0) * eps2 - mu2 * (np.log1p(1.0 / (mu1 - 1.0)) + np.log1p(1.0 / (mu2 - 1.0))))
        )
        log_1mq = _log1mexp(np.minimum(log_q, 0.0))
        log_a = (alphas - 1.0) * (log_1mq - _log1mexp(np.minimum((log_q + eps2) * (1.0 - 1.0 / mu2), 0.0)))
        log_b = (alphas - 1.0) * (eps1 - log_q / (mu1 - 1.0))
        bound = np.logaddexp(log_1mq + log_a, log_q + log_b) / (alphas - 1.0)
    bound = np.where(valid, bound, np.inf)
    return bound, valid


def gnmax_log_q0(*, sigma: float, orders=PATE_ORDERS) -> np.ndarray:
    """log q0 per order: below q0 the data-dependent bound (Theorem 6) beats alpha / sigma^2.

    The data-dependent bound is used for q < q0 and the data-independent one above, which makes the
    per-query cost a non-decreasing function of q [PSMRTE18, App. B.4, conditions C5-C6]. q0 is the
    root of bound(q) = alpha / sigma^2, searched below the natural upper bound
    log q <= min(-(1 + 1/sigma)^2, -((alpha - 0.99) / sigma)^2, -1/sigma^2), where the conditions of
    Theorem 6 hold (mu2 > 1, mu1 > alpha); when the bound already wins there, q0 is that upper
    bound. Vectorised bisection over orders, to a relative precision of about 1e-13. Where alpha / sigma^2
    or that upper bound passes float range (tiny sigma, huge orders) q0 is 0 (log q0 = -inf): the
    data-independent bound is used for every q, an upper bound on the cost.
    """
    s = _number("sigma", sigma)
    all_alphas = _orders(orders)
    out = np.full(all_alphas.shape, -np.inf)
    if s < SMALLEST_SQUARABLE_SIGMA:
        return out
    with np.errstate(over="ignore"):
        all_ind = _over_sigma_squared(all_alphas, s)
        all_upper = np.minimum(np.minimum(-((1.0 + 1.0 / s) ** 2), -(((all_alphas - 0.99) / s) ** 2)), -1.0 / s**2)
    searched = np.isfinite(all_ind) & np.isfinite(all_upper)
    if not searched.any():
        return out
    alphas, ind, upper = all_alphas[searched], all_ind[searched], all_upper[searched]

    def gap(log_q):  # > 0: data-independent is better (or the bound is invalid)
        bound, _ = _gnmax_dd_unchecked(log_q, s, alphas)
        return bound - ind

    # For sigma near 1e-154 the search may run past float range: lower -> -inf gives q0 = 0 there.
    with np.errstate(over="ignore", invalid="ignore"):
        done = gap(upper) < 0
        lower = 2.0 * upper
        for _ in range(200):
            g = gap(lower)
            expand = ~done & (g > 0)
            if not expand.any():
                break
            lower = np.where(expand, lower * 1.5, lower)
        lo, hi = lower.copy(), upper.copy()  # gap(lo) <= 0 < gap(hi)
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            below = gap(mid) <= 0
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
            if np.all(hi - lo <= 1e-13 * np.abs(hi)):
                break
    out[searched] = np.where(done, upper, lo)
    return out


def _gnmax_rdp_from_log_q(log_q: np.ndarray, sigma: float, alphas: np.ndarray, log_q0: np.ndarray) -> np.ndarray:
    """Per-query cost (queries, orders): Theorem 6 where q < q0 (and valid), else alpha / sigma^2."""
    lq = np.asarray(log_q, dtype=float)[:, None]
    ind = _over_sigma_squared(alphas, sigma)[None, :]
    bound, valid = _gnmax_dd_unchecked(lq, sigma, alphas[None, :])
    use = valid & (lq < log_q0[None, :])
    out = np.where(use, np.minimum(bound, ind), ind)
    return np.where(np.isneginf(lq), 0.0, out)  # a certain outcome costs nothing


def gnmax_rdp_data_dependent(*, votes=None, log_q=None, sigma: float, orders=PATE_ORDERS) -> np.ndarray:
    """Data-dependent RDP of one GNMax query per histogram: shape (queries, orders).

    [PSMRTE18, Theorem 6 with Proposition 10] at q~ from Proposition 7, where it beats the
    data-independent alpha / sigma^2 (q < q0, see `gnmax_log_q0`), else alpha / sigma^2. Never
    above the data-independent bound. Give `votes`, or `log_q` from `gnmax_log_q`.
    """
    s = _number("sigma", sigma)
    alphas = _orders(orders)
    if (votes is None) == (log_q is None):
        raise ValueError("give either votes or log_q")
    lq = gnmax_log_q(votes=votes, sigma=s) if votes is not None else np.atleast_1d(np.asarray(log_q, dtype=float))
    if np.any(lq > 0) or np.any(np.isnan(lq)):
        raise ValueError("log_q must be <= 0 (the log of a probability)")
    return _gnmax_rdp_from_log_q(lq, s, alphas, gnmax_log_q0(sigma=s, orders=alphas))


# ------------------------------------------------------------------------------------------------
# The threshold check of Confident GNMax [PSMRTE18, Sec. 4.2, Algorithm 1]
# ------------------------------------------------------------------------------------------------


def threshold_log_pr_answered(*, votes, threshold: float, sigma1: float) -> np.ndarray:
    """log Pr[max_i n_i + N(0, sigma1^2) >= T] per query (the check passes; the query is answered).

    As in the authors' analysis the maximum count is rounded to an integer first (it is one for
    teacher votes).
    """
    v = _votes(votes)
    t = _number("threshold", threshold, low=0.0, inclusive=True)
    s1 = _number("sigma1", sigma1)
    return _log_normal_sf(t - np.round(v.max(axis=1)), s1)


def threshold_rdp_data_independent(*, sigma1: float, orders=PATE_ORDERS) -> np.ndarray:
    """RDP of one threshold check: alpha / (2 sigma1^2) (a Gaussian mechanism on the maximum count,
    which moves by at most 1 between neighbours) [PSMRTE18, Sec. 4.2]."""
    s1 = _number("sigma1", sigma1)
    return _over_sigma_squared(_orders(orders) / 2.0, s1)


def _threshold_log_pr_rejected(margin: np.ndarray, sigma1: float) -> np.ndarray:
    """log Pr[check fails] = log Pr[N(0, sigma1^2) < T - max count], given margin = T - max count."""
    with np.errstate(over="ignore"):
        return special.log_ndtr(np.asarray(margin, dtype=float) / sigma1)


def _threshold_rdp_from_log_p(log_p: np.ndarray, log_r: np.ndarray, sigma1: float, alphas: np.ndarray,
                              log_q0: np.ndarray) -> np.ndarray:
    """Per-query cost of the check from log Pr[answered] (log_p) and log Pr[rejected] (log_r)."""
    # The check has two outcomes; q is the probability of the less likely one. It is a Gaussian
    # mechanism of sensitivity 1, i.e. GNMax-like with sigma' = sqrt(2) sigma1 (same RDP curve).
    # 1 - Pr[answered] loses the rejection probability once it is below ~1e-308 (log_p rounds to 0,
    # which would make a near-certain answer cost nothing at every order): there log_r is used.
    log_p = np.asarray(log_p, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_1mp = np.where(log_p < -np.finfo(float).tiny, _log1mexp(np.minimum(log_p, 0.0)), log_r)
        log_q = np.maximum(np.minimum(log_p, log_1mp), _LOG_FLOOR)  # both are > 0 for sigma1 > 0
    return _gnmax_rdp_from_log_q(log_q, math.sqrt(2.0) * sigma1, alphas, log_q0)


def threshold_rdp_data_dependent(*, votes, threshold: float, sigma1: float, orders=PATE_ORDERS) -> np.ndarray:
    """Data-dependent RDP of the threshold check per query: shape (queries, orders).

    [PSMRTE18, Sec. 4.2 and App. B]: Theorem 6 applied to the two-outcome check with
    q = min(Pr[answered], Pr[rejected]) and sigma' = sqrt(2) sigma1, never above alpha / (2 sigma1^2).
    """
    s1 = _number("sigma1", sigma1)
    alphas = _orders(orders)
    log_p = threshold_log_pr_answered(votes=votes, threshold=threshold, sigma1=s1)
    log_r = _threshold_log_pr_rejected(threshold - np.round(_votes(votes).max(axis=1)), s1)
    return _threshold_rdp_from_log_p(log_p, log_r, s1, alphas, gnmax_log_q0(sigma=math.sqrt(2.0) * s1, orders=alphas))


# ------------------------------------------------------------------------------------------------
# LNMax [PAEGT17]
# ------------------------------------------------------------------------------------------------


def lnmax_log_q(*, votes, laplace_scale: float) -> np.ndarray:
    """Upper bound on log Pr[LNMax does not output the plurality class], per query.

    [PAEGT17, Lemma 4] with gamma = 1 / laplace_scale and gaps d_i = gamma (n_i* - n_i):
    q = sum_{i != i*} (2 + d_i) / (4 e^{d_i}), capped at 1 - 1/m.
    """
    v = _votes(votes)
    b = _number("laplace_scale", laplace_scale)
    top = np.argmax(v, axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        d = (v[np.arange(v.shape[0]), top][:, None] - v) / b
        log_terms = np.log(2.0 + d) - math.log(4.0) - d
    log_terms = np.where(np.isinf(d), _LOG_FLOOR, log_terms)  # gap / b past float range: q is below any float
    log_terms[np.arange(v.shape[0]), top] = -np.inf
    return np.minimum(special.logsumexp(log_terms, axis=1), math.log1p(-1.0 / v.shape[1]))


def lnmax_rdp_data_independent(*, laplace_scale: float, orders=PATE_ORDERS) -> np.ndarray:
    """RDP of one LNMax query whatever the votes: min(alpha eps^2 / 2, eps) with eps = 2 / b.

    LNMax adds Laplace(b) noise to each count; one teacher moves two counts, so a query is
    (2 gamma)-DP with gamma = 1/b [PAEGT17, Sec. 2.1, Theorem 2]; eps-DP implies
    (alpha, alpha eps^2 / 2)-RDP [BS16, Prop. 3] and (alpha, eps)-RDP.
    """
    b = _number("laplace_scale", laplace_scale)
    eps = 2.0 / b  # inf for b below ~1e-308
    alphas = _orders(orders)
    with np.errstate(over="ignore"):
        return np.minimum(_half_square(eps) * alphas, eps)


def _lnmax_rdp_from_log_q(log_q: np.ndarray, eps: float, alphas: np.ndarray) -> np.ndarray:
    lq = np.asarray(log_q, dtype=float)[:, None]
    a = alphas[None, :]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ind = np.minimum(_half_square(eps) * a, eps)
        # [PAEGT17, Theorem 3] needs q < (e^eps - 1) / (e^(2 eps) - 1) = 1 / (e^eps + 1).
        applies = lq < -math.log1p(math.exp(eps)) if eps < 700 else lq < -eps
        log_1mq = _log1mexp(np.minimum(lq, 0.0))
        log_den = _log1mexp(np.minimum(lq + eps, 0.0))
        log_t = np.logaddexp(log_1mq + (a - 1.0) * (log_1mq - log_den), lq + eps * (a - 1.0))
        dd = log_t / (a - 1.0)
    out = np.where(applies, np.minimum(dd, ind), ind)
    return np.where(np.isneginf(lq), 0.0, out)


def lnmax_rdp_data_dependent(*, votes, laplace_scale: float, orders=PATE_ORDERS) -> np.ndarray:
    """Data-dependent RDP of one LNMax query per histogram: shape (queries, orders).

    [PAEGT17, Theorem 3] in RDP form (order alpha = l + 1 of the moment l): with eps = 2 / b and
    q from Lemma 4, if q < 1 / (e^eps + 1),
    RDP(alpha) <= log((1 - q) ((1 - q) / (1 - e^eps q))^(alpha-1) + q e^(eps (alpha-1))) / (alpha - 1),
    and never above the data-independent min(alpha eps^2 / 2, eps).
    """
    b = _number("laplace_scale", laplace_scale)
    log_q = lnmax_log_q(votes=votes, laplace_scale=b)
    return _lnmax_rdp_from_log_q(log_q, 2.0 / b, _orders(orders))


def lnmax_moments_epsilon(
    *,
    laplace_scale: float,
    delta: float,
    votes=None,
    num_queries: int | None = None,
    moments: int = 8,
) -> MomentsEpsilon:
    """The [PAEGT17, Sec. 3] moments-accountant epsilon of LNMax, as that paper computes it.

    alpha(l) per query is l times the RDP at order l + 1 (`lnmax_rdp_data_dependent` with votes,
    `lnmax_rdp_data_independent` with `num_queries` only); the moments add up over queries, and
    epsilon = min over l = 1..moments of (sum alpha(l) + log(1/delta)) / l. E.g. 9,000 queries with
    gamma = 0.2 (b = 5), delta = 1e-5 and 8 moments give 1440 + log(1e5) = 1451.51 (at l = 1).
    """
    b = _number("laplace_scale", laplace_scale)
    d = _delta(delta)
    if isinstance(moments, bool) or not isinstance(moments, numbers.Integral) or moments < 1:
        raise ValueError(f"moments must be a whole number >= 1; got {moments!r}")
    ls = np.arange(1, int(moments) + 1, dtype=float)
    if votes is not None:
        with np.errstate(over="ignore"):
            rdp = lnmax_rdp_data_dependent(votes=votes, laplace_scale=b, orders=ls + 1.0).sum(axis=0)
        dependent = True
    else:
        if isinstance(num_queries, bool) or not isinstance(num_queries, numbers.Integral) or num_queries < 0:
            raise ValueError(f"give votes, or num_queries as a whole number >= 0; got {num_queries!r}")
        with np.errstate(over="ignore"):
            rdp = int(num_queries) * lnmax_rdp_data_independent(laplace_scale=b, orders=ls + 1.0)
        dependent = False
    log_moments = rdp * ls
    eps = (log_moments + math.log(1.0 / d)) / ls
    best = int(np.argmin(eps))
    return MomentsEpsilon(float(eps[best]), d, best + 1, dependent, log_moments)


# ------------------------------------------------------------------------------------------------
# Per-query costs of a whole aggregation, composition and conversion
# ------------------------------------------------------------------------------------------------


def query_costs(
    *,
    votes,
    mechanism: str,
    sigma: float | None = None,
    threshold: float | None = None,
    sigma1: float | None = None,
    sigma2: float | None = None,
    laplace_scale: float | None = None,
    answered=None,
    orders=PATE_ORDERS,
) -> QueryCosts:
    """Per-query RDP costs (data-dependent and data-independent) of an aggregator on `votes`.

    mechanism "gnmax" (needs `sigma`), "lnmax" (needs `laplace_scale`) or "confident" (needs
    `threshold`, `sigma1`, `sigma2`). For Confident GNMax the data-dependent cost of a query is the
    threshold check, plus GNMax where it answers [PSMRTE18, Sec. 4.2]: with `answered` (a boolean
    mask, the released outcome of the checks) the realised cost; without it the expected cost,
    check + Pr[answered] * GNMax, as the paper's analysis. Its data-independent cost is the check
    plus GNMax for every query, answered or not: which queries pass the check depends on the votes,
    so a bound that counted only the answered ones (or Pr[answered]) would be a function of the
    private data (the realised path of an adaptive composition), not a bound fixed before it.
    """
    v = _votes(votes)
    alphas = _orders(orders)
    n = v.shape[0]
    ones = np.ones(n)
    always, per_answer = _data_independent_parts(mechanism, sigma=sigma, sigma1=sigma1, sigma2=sigma2,
                                                 laplace_scale=laplace_scale, alphas=alphas)

    realised = answered is not None

    def _di(weight: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return always[None, :] + _charge(weight, per_answer[None, :], realised)

    if mechanism == "gnmax":
        s = _require("sigma", sigma)
        log_q = gnmax_log_q(votes=v, sigma=s)
        dd = _gnmax_rdp_from_log_q(log_q, s, alphas, gnmax_log_q0(sigma=s, orders=alphas))
        weight = ones if answered is None else _mask(answered, n).astype(float)
        return QueryCosts(mechanism, alphas, _charge(weight, dd, realised), _di(weight), weight, ones, log_q)
    if mechanism == "lnmax":
        b = _require("laplace_scale", laplace_scale)
        log_q = lnmax_log_q(votes=v, laplace_scale=b)
        dd = _lnmax_rdp_from_log_q(log_q, 2.0 / b, alphas)
        weight = ones if answered is None else _mask(answered, n).astype(float)
        return QueryCosts(mechanism, alphas, _charge(weight, dd, realised), _di(weight), weight, ones, log_q)
    if mechanism == "confident":
        t = _number("threshold", _require("threshold", threshold), low=0.0, inclusive=True)
        s1, s2 = _require("sigma1", sigma1), _require("sigma2", sigma2)
        log_p = threshold_log_pr_answered(votes=v, threshold=t, sigma1=s1)
        log_r = _threshold_log_pr_rejected(t - np.round(v.max(axis=1)), s1)
        thr_dd = _threshold_rdp_from_log_p(log_p, log_r, s1, alphas,
                                           gnmax_log_q0(sigma=math.sqrt(2.0) * s1, orders=alphas))
        log_q = gnmax_log_q(votes=v, sigma=s2)
        gn_dd = _gnmax_rdp_from_log_q(log_q, s2, alphas, gnmax_log_q0(sigma=s2, orders=alphas))
        pr = np.exp(log_p)
        weight = pr if answered is None else _mask(answered, n).astype(float)
        with np.errstate(over="ignore"):
            dd = thr_dd + _charge(weight, gn_dd, realised)
        return QueryCosts(mechanism, alphas, dd, _di(ones), weight, pr, log_q)
    raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}; got {mechanism!r}")


def _charge(weight: np.ndarray, cost: np.ndarray, realised: bool) -> np.ndarray:
    """weight[:, None] * cost per query. A weight of 0 on an infinite cost (noise too small to bound it):
    0 for a realised answer (the query was not answered), inf for a probability (one that underflowed)."""
    with np.errstate(invalid="ignore"):
        out = weight[:, None] * cost
    return np.where(np.isnan(out), 0.0 if realised else np.inf, out)


def _data_independent_parts(mechanism: str, *, sigma, sigma1, sigma2, laplace_scale,
                            alphas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Data-independent RDP of one query as (the threshold check, the noisy argmax): GNMax and LNMax
    have no check; Confident GNMax's data-independent bound pays both on every query (query_costs)."""
    zero = np.zeros(alphas.size)
    if mechanism == "gnmax":
        return zero, gnmax_rdp_data_independent(sigma=_require("sigma", sigma), orders=alphas)
    if mechanism == "lnmax":
        return zero, lnmax_rdp_data_independent(laplace_scale=_require("laplace_scale", laplace_scale), orders=alphas)
    if mechanism == "confident":
        return (threshold_rdp_data_independent(sigma1=_require("sigma1", sigma1), orders=alphas),
                gnmax_rdp_data_independent(sigma=_require("sigma2", sigma2), orders=alphas))
    raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}; got {mechanism!r}")


def _require(name: str, value) -> float:
    if value is None:
        raise ValueError(f"{name} is needed for this mechanism")
    return _number(name, value)


def _conversion_offset(alphas: np.ndarray, delta: float) -> np.ndarray:
    """The [CKS20, Prop. 12] term added to the RDP at each order (as `rdp_to_epsilon`)."""
    return np.log1p(-1.0 / alphas) - (math.log(delta) + np.log(alphas)) / (alphas - 1.0)


def epsilon_after_each(*, rdp_per_query, orders=PATE_ORDERS, delta: float) -> np.ndarray:
    """Epsilon (at `delta`) after each query: the running sum of per-query RDP, converted.

    Same conversion as `engine.privacy.rdp.rdp_to_epsilon` [CKS20, Prop. 12], including its
    (0, delta) shortcut when delta^2 >= 1 - exp(-rdp), vectorised over the prefixes; shape
    (queries,). Cheap: this is the live epsilon of a run.
    """
    alphas = _orders(orders)
    d = _delta(delta)
    costs = np.asarray(rdp_per_query, dtype=float)
    if costs.ndim != 2 or costs.shape[1] != alphas.size:
        raise ValueError(f"rdp_per_query must have shape (queries, {alphas.size}); got {costs.shape}")
    with np.errstate(over="ignore"):  # inf past float range (tiny noise): an upper bound
        cum = np.cumsum(costs, axis=0)
    return _epsilon_rows(cum, alphas, d)[0]


def queries_within_budget(*, rdp_per_query, rdp_worst_case, orders=PATE_ORDERS, delta: float,
                          budget: float) -> int:
    """How many queries, in order, can be processed without exceeding `budget` (epsilon at `delta`).

    Query i is processed only if the cost so far plus the most query i can cost (`rdp_worst_case`,
    e.g. threshold check and answer for Confident GNMax) stays within the budget; `rdp_per_query`
    is what each processed query actually cost. Both have shape (queries, orders). Returns the index
    of the first query that could exceed the budget (= the number processed), or all of them.
    """
    alphas = _orders(orders)
    d = _delta(delta)
    b = _number("budget", budget)
    real = np.asarray(rdp_per_query, dtype=float)
    worst = np.asarray(rdp_worst_case, dtype=float)
    if real.shape != worst.shape or real.ndim != 2 or real.shape[1] != alphas.size:
        raise ValueError(f"rdp_per_query and rdp_worst_case must both have shape (queries, {alphas.size})")
    with np.errstate(over="ignore", invalid="ignore"):
        before = np.cumsum(real, axis=0) - real
        # inf - inf where a query cost inf (tiny noise): the sum of the queries before it, directly
        shifted = np.concatenate([np.zeros((1, real.shape[1])), np.cumsum(real, axis=0)[:-1]])
        before = np.where(np.isnan(before), shifted, before)
        eps, _ = _epsilon_rows(before + worst, alphas, d)
    over = np.flatnonzero(eps > b)
    return int(over[0]) if over.size else int(real.shape[0])


def epsilon_at_each_order(rdp: np.ndarray, alphas: np.ndarray, delta: float) -> np.ndarray:
    """The epsilon each order's RDP value converts to (an RDP array whose last axis is the orders)."""
    rdp = np.asarray(rdp, dtype=float)
    eps = rdp + _conversion_offset(alphas, delta)
    with np.errstate(over="ignore", invalid="ignore"):
        zero = delta * delta + np.expm1(-rdp) >= 0.0
    eps = np.where(zero, 0.0, eps)
    return np.where(np.isinf(rdp), np.inf, eps)


def _epsilon_rows(rdp: np.ndarray, alphas: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """(epsilon, best order) for each row of an RDP array of shape (rows, orders)."""
    eps = epsilon_at_each_order(rdp, alphas, delta)
    best = np.argmin(eps, axis=1)
    value = np.maximum(eps[np.arange(eps.shape[0]), best], 0.0)
    return value, alphas[best]


def pate_epsilon(
    *,
    votes,
    mechanism: str,
    delta: float,
    sigma: float | None = None,
    threshold: float | None = None,
    sigma1: float | None = None,
    sigma2: float | None = None,
    laplace_scale: float | None = None,
    answered=None,
    orders=PATE_ORDERS,
) -> PateEpsilon:
    """The (epsilon, delta) of answering the student's queries on `votes` with `mechanism`.

    Composes the per-query costs of `query_costs` (RDP adds up [Mir17, Prop. 1]) and converts at
    the best order with `rdp_to_epsilon`. Returns both the data-dependent epsilon (which depends on
    the private votes) and the data-independent one.
    """
    d = _delta(delta)
    costs = query_costs(votes=votes, mechanism=mechanism, sigma=sigma, threshold=threshold, sigma1=sigma1,
                        sigma2=sigma2, laplace_scale=laplace_scale, answered=answered, orders=orders)
    with np.errstate(over="ignore"):  # inf past float range (tiny noise): an upper bound
        rdp = costs.data_dependent.sum(axis=0)
        rdp_ind = costs.data_independent.sum(axis=0)
    dep = _to_epsilon(costs.orders, rdp, d)
    ind = _to_epsilon(costs.orders, rdp_ind, d)
    return PateEpsilon(
        mechanism=mechanism,
        epsilon_data_dependent=dep.value,
        epsilon_data_independent=ind.value,
        delta=d,
        order=dep.order,
        order_data_independent=ind.order,
        num_queries=costs.num_queries,
        answered=float(costs.weight.sum()),
        answered_is_expected=answered is None and mechanism == "confident",
        orders=costs.orders,
        rdp=rdp,
        rdp_data_independent=rdp_ind,
    )


def _to_epsilon(alphas: np.ndarray, rdp: np.ndarray, delta: float) -> Epsilon:
    if rdp.size and np.all(rdp == 0):
        return Epsilon(0.0, delta, "rdp", None)
    return rdp_to_epsilon(orders=alphas, rdp=rdp, delta=delta)


def data_independent_rdp(*, mechanism: str, num_queries: int, sigma: float | None = None,
                         sigma1: float | None = None, sigma2: float | None = None,
                         laplace_scale: float | None = None, orders=PATE_ORDERS) -> np.ndarray:
    """RDP at `orders` of asking `num_queries` queries whatever the votes: each pays its noisy argmax and
    (Confident GNMax) its threshold check, answered or not (query_costs says why)."""
    alphas = _orders(orders)
    always, per_answer = _data_independent_parts(mechanism, sigma=sigma, sigma1=sigma1, sigma2=sigma2,
                                                 laplace_scale=laplace_scale, alphas=alphas)
    with np.errstate(over="ignore"):  # inf past float range (tiny noise): an upper bound
        return int(num_queries) * (always + per_answer)


def epsilon_if_all_answered(*, mechanism: str, num_queries: int, delta: float, sigma: float | None = None,
                            sigma1: float | None = None, sigma2: float | None = None,
                            laplace_scale: float | None = None, orders=PATE_ORDERS) -> float:
    """The data-independent epsilon of `num_queries` queries (data_independent_rdp): a bound known
    before any teacher votes."""
    alphas = _orders(orders)
    rdp = data_independent_rdp(mechanism=mechanism, num_queries=num_queries, sigma=sigma, sigma1=sigma1,
                               sigma2=sigma2, laplace_scale=laplace_scale, orders=alphas)
    return _to_epsilon(alphas, rdp, _delta(delta)).value
