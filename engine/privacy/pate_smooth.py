"""Smooth sensitivity of PATE's data-dependent privacy cost, and releasing that cost privately.

The data-dependent epsilon of `engine.privacy.pate` is computed from the private votes, so
publishing it as it is leaks. [PSMRTE18, Sec. 4.3 and App. B.4-C] bound how much the cost at
one RDP order can change when teachers change their votes (its local sensitivity at distance d),
smooth that bound (beta-smooth sensitivity [NRS07]), and publish the cost with Gaussian noise
scaled to it (the GNSS mechanism, Theorem 23), whose own RDP cost is added. The result is the
*released* epsilon: safe to publish, unlike the exact data-dependent one.

Distance is counted in teachers: one training example changes one teacher, who can move one vote
in every query at once, so the cost of the whole run moves by at most the sum of the queries'
local sensitivities.

References
----------
[PSMRTE18] Papernot et al., "Scalable Private Learning with PATE", ICLR 2018, arXiv:1802.08908.
           App. B.4: Algorithm 3 (local sensitivity of the GNMax cost), Algorithms 4-5 (at
           distance d), Proposition 13 (bounds BL, BU on q at a neighbour), conditions C5-C6;
           Theorem 23 (RDP of Gaussian noise scaled by smooth sensitivity, GNSS).
[NRS07]    K. Nissim, S. Raskhodnikova, A. Smith, "Smooth Sensitivity and Sampling in Private Data
           Analysis", STOC 2007 (beta-smooth sensitivity as max_d e^(-beta d) A(d)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from engine.privacy import pate
from engine.privacy.pate import PATE_ORDERS
from engine.privacy.rdp import rdp_to_epsilon

__all__ = [
    "ReleasedEpsilon",
    "gnmax_log_q_bounds",
    "gnmax_local_sensitivity",
    "gnmax_local_sensitivity_by_distance",
    "threshold_local_sensitivity_by_distance",
    "smooth_sensitivity",
    "gnss_rdp",
    "check_conditions",
    "release_epsilon",
    "ReleaseParameters",
    "data_independent_parameters",
]


@dataclass(frozen=True)
class ReleasedEpsilon:
    """A data-dependent PATE epsilon released with the GNSS mechanism, and how it was made.

    Publishable: `epsilon_released` (the noisy data-dependent RDP at `order`, clamped at 0, plus the
    cost of releasing it, converted at `delta`), `rdp_released`, `order`, `beta`, `sigma_ss`,
    `release_rdp`. NOT publishable (exact functions of the private votes): `rdp_data_dependent`,
    `epsilon_data_dependent_at_order`, `smooth_sensitivity`. `parameters_from_data` says whether
    order, beta or sigma_ss were chosen by looking at the votes (as the paper does, App. C); fix them
    in advance (`data_independent_parameters`) for a guarantee that covers the choice as well.
    `conditions_hold` is the numerical check of C5-C6, on which the GNMax local-sensitivity
    algorithm relies.
    """

    epsilon_released: float
    delta: float
    order: float
    beta: float
    sigma_ss: float
    release_rdp: float
    rdp_released: float
    rdp_data_dependent: float
    epsilon_data_dependent_at_order: float
    smooth_sensitivity: float
    noise: float
    parameters_from_data: bool
    conditions_hold: bool


# ------------------------------------------------------------------------------------------------
# The per-query cost as a function of q at one order, and its local sensitivity
# ------------------------------------------------------------------------------------------------


def _cost(log_q: np.ndarray, sigma: float, order: float, log_q0: float) -> np.ndarray:
    """beta(q): the GNMax cost at `order` used by the accountant (data-dependent below q0)."""
    flat = np.asarray(log_q, dtype=float).reshape(-1)
    out = pate._gnmax_rdp_from_log_q(flat, sigma, np.array([order]), np.array([log_q0]))[:, 0]
    return out.reshape(np.shape(log_q))


def gnmax_log_q_bounds(*, log_q, sigma: float, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(log BL(q), log BU(q)): the range of q~ over neighbouring histograms [PSMRTE18, Prop. 13].

    BL(q) = (m-1)/2 erfc(1/sigma + erfcinv(2q/(m-1))), BU(q) = min(1, (m-1)/2 erfc(-1/sigma +
    erfcinv(2q/(m-1)))), with log erfc(z) = log 2 + log Phi(-sqrt(2) z) for stability. Where 2q/(m-1)
    is below the normal floats (small sigma), erfcinv is taken in log space: erfc(z) = y <=>
    z = -Phi^-1(y/2)/sqrt(2), Phi^-1(e^x) by ndtri_exp (a q that underflowed to 0 would give BL = BU
    = 0, a neighbourhood where the cost cannot move, and a smooth sensitivity of 0).
    """
    lq = np.asarray(log_q, dtype=float)
    m1 = num_classes - 1
    with np.errstate(divide="ignore", invalid="ignore", under="ignore"):
        y = 2.0 * np.exp(lq) / m1
        z = np.where(y >= np.finfo(float).tiny, special.erfcinv(np.clip(y, 0.0, 2.0)),
                     -special.ndtri_exp(np.minimum(lq - math.log(m1), 0.0)) / math.sqrt(2.0))
        log_scale = math.log(m1 / 2.0) + math.log(2.0)
        log_bl = log_scale + special.log_ndtr(-math.sqrt(2.0) * (1.0 / sigma + z))
        log_bu = np.minimum(log_scale + special.log_ndtr(-math.sqrt(2.0) * (-1.0 / sigma + z)), 0.0)
    log_bl = np.where(np.isneginf(lq), -np.inf, log_bl)
    log_bu = np.where(np.isneginf(lq), -np.inf, log_bu)
    return log_bl, log_bu


def _plateau_bounds(sigma: float, num_classes: int, order: float) -> tuple[float, float]:
    log_q0 = float(pate.gnmax_log_q0(sigma=sigma, orders=[order])[0])
    log_q1 = float(gnmax_log_q_bounds(log_q=log_q0, sigma=sigma, num_classes=num_classes)[0])
    return log_q0, min(log_q1, log_q0)


def gnmax_local_sensitivity(*, log_q, sigma: float, num_classes: int, order: float) -> np.ndarray:
    """Upper bound on the local sensitivity of the GNMax cost at `order`, as a function of q~.

    [PSMRTE18, Algorithm 3, Proposition 13]: with q1 = BL(q0), q is moved to q1 inside the plateau
    [q1, q0] (the maximum there), then LS = max(beta(BU(q)) - beta(q), beta(q) - beta(BL(q))).
    """
    s = pate._number("sigma", sigma)
    alpha = pate._orders(order)[0]
    log_q0, log_q1 = _plateau_bounds(s, num_classes, alpha)
    return _ls_of_log_q(np.asarray(log_q, dtype=float), s, num_classes, alpha, log_q0, log_q1)


def _ls_of_log_q(lq, sigma, num_classes, order, log_q0, log_q1):
    lq = np.where((lq >= log_q1) & (lq <= log_q0), log_q1, lq)
    log_bl, log_bu = gnmax_log_q_bounds(log_q=lq, sigma=sigma, num_classes=num_classes)
    # The cost jumps up to alpha / sigma^2 at q0, and BU(q1) = q0 up to round-off: a neighbour range
    # reaching q0 (within 1e-9 relative) reaches the data-independent value.
    log_bu = np.where(log_bu >= log_q0 - 1e-9 * abs(log_q0), 0.0, log_bu)  # log q = 0: cost alpha / sigma^2
    b = _cost(lq, sigma, order, log_q0)
    with np.errstate(invalid="ignore"):
        ls = np.maximum(_cost(log_bu, sigma, order, log_q0) - b, b - _cost(log_bl, sigma, order, log_q0))
    return np.where(np.isnan(ls), np.inf, ls)  # inf - inf (costs past float range, tiny sigma): unbounded


def gnmax_local_sensitivity_by_distance(*, votes, num_teachers: int, sigma: float, order: float) -> np.ndarray:
    """Local sensitivity of each query's GNMax cost at distance d = 0 .. num_teachers - 1.

    [PSMRTE18, Algorithms 4-5]: under C5-C6 the local sensitivity grows as q~ approaches the plateau
    [q1, q0], so the largest one within distance d is found by walking there one vote at a time:
    left (q > q0: one vote from the largest runner-up to the plurality) or right (q < q1: one vote
    from the plurality to the runner-up); after the walk the plateau value remains. Vectorised over
    queries; shape (queries, num_teachers).
    """
    v = pate._votes(votes)
    s = pate._number("sigma", sigma)
    alpha = pate._orders(order)[0]
    n = _num_teachers(num_teachers, v)
    m = v.shape[1]
    log_q0, log_q1 = _plateau_bounds(s, m, alpha)
    plateau = float(_ls_of_log_q(np.array([log_q1]), s, m, alpha, log_q0, log_q1)[0])
    out = np.full((v.shape[0], n), plateau)
    work = -np.sort(-v, axis=1)
    lq = pate.gnmax_log_q(votes=work, sigma=s)
    in_plateau = (lq >= log_q1) & (lq <= log_q0)
    out[:, 0] = np.where(in_plateau, plateau, _ls_of_log_q(lq, s, m, alpha, log_q0, log_q1))
    go_left = lq > log_q0
    for d in range(1, n):
        active = np.flatnonzero(
            ~in_plateau & ((go_left & (lq > log_q0) & (work[:, 1] > 0)) | (~go_left & (lq < log_q1)))
        )
        if active.size == 0:
            break
        rows = work[active]
        left = go_left[active]
        rows[:, 0] += np.where(left, 1.0, -1.0)
        rows[:, 1] += np.where(left, -1.0, 1.0)
        rows = -np.sort(-rows, axis=1)
        work[active] = rows
        lq_a = pate.gnmax_log_q(votes=rows, sigma=s)
        lq[active] = lq_a
        out[active, d] = _ls_of_log_q(lq_a, s, m, alpha, log_q0, log_q1)
    return out


def threshold_local_sensitivity_by_distance(
    *, votes, num_teachers: int, threshold: float, sigma1: float, order: float
) -> np.ndarray:
    """Local sensitivity of each query's threshold-check cost at distance d = 0 .. num_teachers - 1.

    The check's cost depends only on the maximum count v (0..n), which moves by at most 1 per
    teacher: with c(v) the cost at `order`, LS(v) = max |c(v +- 1) - c(v)|, and at distance d the
    entry is max(LS(v + d), LS(v - d)) (0 where neither exists). Shape (queries, num_teachers).
    """
    v = pate._votes(votes)
    t = pate._number("threshold", threshold, low=0.0, inclusive=True)
    s1 = pate._number("sigma1", sigma1)
    alpha = pate._orders(order)[0]
    n = _num_teachers(num_teachers, v)
    ls_v = _threshold_ls_per_max(n, t, s1, alpha)
    cur = np.round(v.max(axis=1)).astype(int)[:, None]
    d = np.arange(n)[None, :]
    up, down = cur + d, cur - d
    ls_up = np.where(up <= n, ls_v[np.clip(up, 0, n)], -np.inf)
    ls_down = np.where(down >= 0, ls_v[np.clip(down, 0, n)], -np.inf)
    out = np.maximum(ls_up, ls_down)
    return np.where(np.isneginf(out), 0.0, out)


def _threshold_costs(n: int, threshold: float, sigma1: float, order: float) -> np.ndarray:
    """c(v) for v = 0..n: the threshold check's cost at `order` when the maximum count is v."""
    margin = threshold - np.arange(n + 1, dtype=float)
    log_p = pate._log_normal_sf(margin, sigma1)
    log_r = pate._threshold_log_pr_rejected(margin, sigma1)
    s = math.sqrt(2.0) * sigma1
    log_q0 = pate.gnmax_log_q0(sigma=s, orders=[order])
    return pate._threshold_rdp_from_log_p(log_p, log_r, sigma1, np.array([order]), log_q0)[:, 0]


def _threshold_ls_per_max(n: int, threshold: float, sigma1: float, order: float) -> np.ndarray:
    c = _threshold_costs(n, threshold, sigma1, order)
    with np.errstate(invalid="ignore"):
        step = np.abs(np.diff(c))  # step[v] = |c(v+1) - c(v)|
    step = np.where(np.isnan(step), np.inf, step)  # inf - inf (costs past float range, tiny sigma1): unbounded
    ls = np.zeros(n + 1)
    ls[:-1] = step
    ls[1:] = np.maximum(ls[1:], step)
    return ls


def _num_teachers(value, votes: np.ndarray) -> int:
    n = int(value)
    if n != value or n < 1:
        raise ValueError(f"num_teachers must be a whole number >= 1; got {value!r}")
    if np.any(votes.sum(axis=1) > n + 1e-9):
        raise ValueError(f"votes hold more than num_teachers = {n} votes in some query")
    return n


# ------------------------------------------------------------------------------------------------
# Smooth sensitivity and the GNSS mechanism
# ------------------------------------------------------------------------------------------------


def smooth_sensitivity(*, local_sensitivity, beta: float) -> float:
    """beta-smooth sensitivity max_d e^(-beta d) A(d), A(d) the largest local sensitivity within
    distance d (last axis) [NRS07, Def. 2.1 and Prop. 3.1]. An unbounded (inf) local sensitivity
    gives inf, also where e^(-beta d) underflows."""
    b = pate._number("beta", beta, low=0.0, inclusive=True)
    a = np.asarray(local_sensitivity, dtype=float)
    if not np.all(np.isfinite(a)):  # inf, or NaN from inf - inf / 0 * inf: the cost moves without bound
        return math.inf
    return float(np.max(a * np.exp(-b * np.arange(a.shape[-1]))))


def gnss_rdp(*, beta: float, sigma: float, order: float) -> float:
    """RDP at `order` of releasing F(D) + SS_beta(D) * N(0, sigma^2) [PSMRTE18, Theorem 23]:

    order e^(2 beta) / sigma^2 + (beta order - log(1 - 2 order beta) / 2) / (order - 1),
    for 1 < order < 1 / (2 beta). An infinite sigma (nothing released that depends on the data
    beyond what is public) costs only the second term.
    """
    b = pate._number("beta", beta, low=0.0, inclusive=True)
    alpha = pate._orders(order)[0]
    if b > 0 and not alpha < 1.0 / (2.0 * b):
        raise ValueError(f"order must be below 1 / (2 beta) = {1 / (2 * b):g}; got {alpha:g}")
    s = float(sigma)
    if not s > 0:
        raise ValueError(f"sigma must be > 0; got {sigma!r}")
    first = 0.0 if math.isinf(s) else alpha * math.exp(2.0 * b) / s**2
    return first + (b * alpha - 0.5 * math.log1p(-2.0 * alpha * b)) / (alpha - 1.0)


def check_conditions(*, sigma: float, num_classes: int, order: float, points: int = 4000) -> tuple[bool, bool]:
    """Numerical check of [PSMRTE18, App. B.4] conditions C5 and C6 at one order.

    C5: beta(q) is non-decreasing on (0, q0); C6: beta(BU(q)) - beta(q) is non-decreasing on
    (0, BL(q0)). Checked on a log-spaced grid of q (down to q0 * 1e-30) with a small relative
    tolerance, rather than symbolically as the authors do.
    """
    s = pate._number("sigma", sigma)
    alpha = pate._orders(order)[0]
    log_q0, log_q1 = _plateau_bounds(s, num_classes, alpha)
    if log_q0 == -math.inf:  # q0 = 0 (sigma below ~1e-154, or alpha / sigma^2 past float range): the cost
        return True, True    # is alpha / sigma^2 for every q, so C5 and C6 hold trivially
    tol = 1e-9

    def non_decreasing(values: np.ndarray) -> bool:
        return bool(np.all(np.diff(values) >= -tol * np.maximum(np.abs(values[1:]), 1e-300)))

    grid5 = np.linspace(log_q0 - 69.0, log_q0, points, endpoint=False)
    c5 = non_decreasing(_cost(grid5, s, alpha, log_q0))
    if log_q1 == -math.inf:  # BL(q0) below e^-1.8e308 (tiny sigma): C6's interval (0, BL(q0)) holds no
        return c5, c5        # float, so there is nothing to check (a NaN grid before)
    grid6 = np.linspace(log_q1 - 69.0, log_q1, points, endpoint=False)
    _, log_bu = gnmax_log_q_bounds(log_q=grid6, sigma=s, num_classes=num_classes)
    c6 = c5 and non_decreasing(_cost(log_bu, s, alpha, log_q0) - _cost(grid6, s, alpha, log_q0))
    return c5, c6


# ------------------------------------------------------------------------------------------------
# Releasing the data-dependent cost
# ------------------------------------------------------------------------------------------------


def _total_local_sensitivity(costs: pate.QueryCosts, votes: np.ndarray, *, num_teachers: int, order: float,
                             sigma: float | None, threshold, sigma1, sigma2) -> np.ndarray:
    """A(d), d = 0..n: the largest local sensitivity of the run's cost within distance d.

    Sum over queries of each query's largest local sensitivity within distance d (a running maximum
    of the per-distance arrays), weighted like the cost (answered / Pr[answered]). At d = n every
    histogram is reachable, so the last entry is the largest value any query can reach.
    """
    # Costs past float range (tiny noise) give inf - inf and 0 * inf here: NaN, which smooth_sensitivity
    # takes as unbounded.
    with np.errstate(over="ignore", invalid="ignore"):
        n = num_teachers
        total = np.zeros(n + 1)
        if costs.mechanism == "confident":
            ls1 = threshold_local_sensitivity_by_distance(votes=votes, num_teachers=n, threshold=threshold,
                                                          sigma1=sigma1, order=order)
            total[:n] += np.maximum.accumulate(ls1, axis=1).sum(axis=0)
            total[n] += votes.shape[0] * float(_threshold_ls_per_max(n, threshold, sigma1, order).max())
            gn_sigma = sigma2
        else:
            gn_sigma = sigma
        ls2 = gnmax_local_sensitivity_by_distance(votes=votes, num_teachers=n, sigma=gn_sigma, order=order)
        w = costs.weight
        total[:n] += (w[:, None] * np.maximum.accumulate(ls2, axis=1)).sum(axis=0)
        m = votes.shape[1]
        log_q0, log_q1 = _plateau_bounds(gn_sigma, m, order)
        plateau = float(_ls_of_log_q(np.array([log_q1]), gn_sigma, m, order, log_q0, log_q1)[0])
        total[n] += float(w.sum()) * max(plateau, float(ls2.max(initial=0.0)))
        return np.maximum.accumulate(total)


def release_epsilon(
    *,
    votes,
    mechanism: str,
    delta: float,
    noise: float,
    sigma: float | None = None,
    threshold: float | None = None,
    sigma1: float | None = None,
    sigma2: float | None = None,
    answered=None,
    num_teachers: int | None = None,
    order: float | None = None,
    beta: float | None = None,
    sigma_ss: float | None = None,
    orders=PATE_ORDERS,
) -> ReleasedEpsilon:
    """Release the data-dependent cost of a GNMax or Confident GNMax run with the GNSS mechanism.

    rdp_released = rdp_dd(order) + SS_beta * sigma_ss * noise, with `noise` a standard normal draw
    (the caller's seeded generator: this function holds no randomness) and SS_beta the smooth
    sensitivity of the run's cost at `order`; the released epsilon is max(rdp_released, 0) plus the
    GNSS cost (Theorem 23), converted at `order` [PSMRTE18, Sec. 4.3, App. C]. Unset parameters are
    chosen as the authors do: `order` minimising the data-dependent epsilon, beta on the grid
    0.30/order .. 0.49/order and sigma_ss = (order e^(2 beta) / SS)^(1/3), minimising
    cost + release cost + 2 noise standard deviations (`parameters_from_data` is then True: that
    choice looks at the votes and is not covered by the released epsilon; pass the parameters of
    `data_independent_parameters` for a release whose parameters are fixed before the votes).
    """
    if mechanism not in ("gnmax", "confident"):
        raise ValueError(f"the smooth-sensitivity release covers 'gnmax' and 'confident'; got {mechanism!r}")
    v = pate._votes(votes)
    d = pate._delta(delta)
    z = float(noise)
    if not math.isfinite(z):
        raise ValueError(f"noise must be a finite standard normal draw; got {noise!r}")
    n = _num_teachers(int(round(v.sum(axis=1).max())) if num_teachers is None else num_teachers, v)
    costs = pate.query_costs(votes=v, mechanism=mechanism, sigma=sigma, threshold=threshold, sigma1=sigma1,
                             sigma2=sigma2, answered=answered, orders=orders)
    from_data = order is None or beta is None or sigma_ss is None
    gn_sigma = sigma2 if mechanism == "confident" else sigma
    if order is None:
        with np.errstate(over="ignore"):  # a sum past float range is inf (tiny noise): an upper bound
            run_cost = costs.data_dependent.sum(axis=0)
        alpha = best_order_meeting_conditions(run_cost, costs.orders, d, sigma=gn_sigma, num_classes=v.shape[1])
    else:
        alpha = float(pate._orders(order)[0])
    at = pate.query_costs(votes=v, mechanism=mechanism, sigma=sigma, threshold=threshold, sigma1=sigma1,
                          sigma2=sigma2, answered=answered, orders=[alpha])
    with np.errstate(over="ignore"):
        rdp_dd = float(at.data_dependent.sum())
    total_ls = _total_local_sensitivity(at, v, num_teachers=n, order=alpha, sigma=sigma, threshold=threshold,
                                        sigma1=sigma1, sigma2=sigma2)
    conditions = check_conditions(sigma=gn_sigma, num_classes=v.shape[1], order=alpha)
    b, s_ss, ss = _choose_beta_sigma(total_ls, alpha, rdp_dd, beta, sigma_ss)
    release_rdp = 0.0 if ss == 0.0 else float(gnss_rdp(beta=b, sigma=s_ss, order=alpha))
    spread = 0.0 if ss == 0.0 else ss * s_ss
    if math.isfinite(spread):
        rdp_released = rdp_dd + spread * z
        eps = rdp_to_epsilon(orders=[alpha], rdp=[max(rdp_released, 0.0) + release_rdp], delta=d).value
    else:
        # Infinite noise (sigma_ss = inf, fixed where the reference outcome has SS = 0) on a cost that does
        # vary: the released number says nothing about the cost, so it bounds nothing. Taking it as
        # -inf would state the release's own cost alone, below the run's data-dependent epsilon.
        rdp_released, eps = math.inf, math.inf
    eps_exact = rdp_to_epsilon(orders=[alpha], rdp=[rdp_dd], delta=d).value
    return ReleasedEpsilon(
        epsilon_released=float(eps),
        delta=d,
        order=alpha,
        beta=b,
        sigma_ss=s_ss,
        release_rdp=release_rdp,
        rdp_released=rdp_released,
        rdp_data_dependent=rdp_dd,
        epsilon_data_dependent_at_order=float(eps_exact),
        smooth_sensitivity=ss,
        noise=z,
        parameters_from_data=from_data,
        conditions_hold=bool(conditions[0] and conditions[1]),
    )


def best_order_meeting_conditions(rdp, orders, delta: float, *, sigma: float, num_classes: int) -> float:
    """The order giving the smallest epsilon for the RDP curve `rdp` (one value per order) among the
    orders at which conditions C5-C6 hold (check_conditions), on which the GNMax local sensitivity
    relies: a release at an order where they fail would not be covered by its own analysis. Above
    some order they fail (e.g. sigma 40, 10 classes: from about 39), so a small RDP cost can push the
    best order there. With no order meeting them, the best order (the release is then flagged)."""
    eps = pate.epsilon_at_each_order(rdp, np.asarray(orders, dtype=float), delta)
    ranked = np.argsort(eps, kind="stable")
    for index in ranked:
        alpha = float(orders[index])
        if all(check_conditions(sigma=sigma, num_classes=num_classes, order=alpha)):
            return alpha
    return float(orders[ranked[0]])


def _choose_beta_sigma(total_ls: np.ndarray, order: float, rdp: float, beta, sigma_ss) -> tuple[float, float, float]:
    """(beta, sigma_ss, SS_beta): given values, or the authors' cost-minimising choice."""
    if beta is not None:
        b = pate._number("beta", beta)
        if not b < 1.0 / (2.0 * order):
            raise ValueError(f"beta must be below 1 / (2 order) = {1 / (2 * order):g}; got {beta!r}")
        betas = np.array([b])
    else:
        betas = np.arange(0.30, 0.4951, 0.01) / order
    best = None
    for b in betas:
        ss = smooth_sensitivity(local_sensitivity=total_ls, beta=float(b))
        if ss == 0.0:
            return float(b), math.inf, 0.0
        if math.isinf(ss):  # the cost can move without bound (tiny noise): no noise hides it, nothing is bounded
            return float(b), math.inf if sigma_ss is None else float(sigma_ss), math.inf
        s = float(sigma_ss) if sigma_ss is not None else (order * math.exp(2.0 * b) / ss) ** (1.0 / 3.0)
        cost = rdp + gnss_rdp(beta=float(b), sigma=s, order=order) + 2.0 * ss * s
        if best is None or cost < best[0]:
            best = (cost, float(b), s, ss)
    assert best is not None
    return best[1], best[2], best[3]


# ------------------------------------------------------------------------------------------------
# Parameters fixed before the votes are seen
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReleaseParameters:
    """Order, beta and sigma_ss of a smooth-sensitivity release, fixed before any vote is seen."""

    order: float
    beta: float
    sigma_ss: float


def data_independent_parameters(
    *,
    mechanism: str,
    num_teachers: int,
    num_queries: int,
    num_classes: int,
    delta: float,
    sigma: float | None = None,
    threshold: float | None = None,
    sigma1: float | None = None,
    sigma2: float | None = None,
    order: float | None = None,
    beta: float | None = None,
    sigma_ss: float | None = None,
    orders=PATE_ORDERS,
) -> ReleaseParameters:
    """Release parameters from public quantities only, so the release covers their choice.

    The rule: the authors' own search (`release_epsilon` with unset parameters: the order minimising
    the data-dependent epsilon, then beta in 0.30/order .. 0.49/order and sigma_ss = (order
    e^(2 beta) / SS)^(1/3) minimising cost + release cost + 2 noise standard deviations
    [PSMRTE18, App. C]) run on a reference outcome built from the public settings instead of the
    votes: `num_queries` queries of `num_classes` classes on which all `num_teachers` teachers
    agree (the consensus PATE is designed for), each answered with its probability under the
    aggregator, at `delta`. Nothing here depends on the private data. On synthetic votes with
    Beta(6, 1) teacher agreement at the pate-mnist settings (250 teachers, T 200, sigma1 150,
    sigma2 40, 1,100 queries) the released epsilon with zero noise is 2.40 against 2.13 with the
    parameters chosen from those votes (4.12 data-independent). Any of `order`, `beta`, `sigma_ss`
    given is kept and the others are chosen for it.
    """
    if mechanism not in ("gnmax", "confident"):
        raise ValueError(f"the smooth-sensitivity release covers 'gnmax' and 'confident'; got {mechanism!r}")
    n = int(num_teachers)
    q = int(num_queries)
    m = int(num_classes)
    if n != num_teachers or n < 1:
        raise ValueError(f"num_teachers must be a whole number >= 1; got {num_teachers!r}")
    if q != num_queries or q < 1:
        raise ValueError(f"num_queries must be a whole number >= 1; got {num_queries!r}")
    if m != num_classes or m < 2:
        raise ValueError(f"num_classes must be a whole number >= 2; got {num_classes!r}")
    d = pate._delta(delta)
    unanimous = np.zeros((1, m))
    unanimous[0, 0] = n
    params = dict(mechanism=mechanism, sigma=sigma, threshold=threshold, sigma1=sigma1, sigma2=sigma2)
    # Every reference query is the same, so the run's cost and local sensitivity are q times one query's
    # (inf past float range, for tiny noise: an upper bound).
    if order is None:
        costs = pate.query_costs(votes=unanimous, orders=orders, **params)
        with np.errstate(over="ignore"):
            run_cost = q * costs.data_dependent.sum(axis=0)
        alpha = best_order_meeting_conditions(run_cost, costs.orders, d,
                                              sigma=sigma2 if mechanism == "confident" else sigma, num_classes=m)
    else:
        alpha = float(pate._orders(order)[0])
    at = pate.query_costs(votes=unanimous, orders=[alpha], **params)
    with np.errstate(over="ignore"):
        total_ls = q * _total_local_sensitivity(at, unanimous, num_teachers=n, order=alpha, sigma=sigma,
                                                threshold=threshold, sigma1=sigma1, sigma2=sigma2)
    b, s_ss, _ = _choose_beta_sigma(total_ls, alpha, q * float(at.data_dependent.sum()), beta, sigma_ss)
    return ReleaseParameters(order=alpha, beta=b, sigma_ss=s_ss)
