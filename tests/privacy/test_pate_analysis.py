"""PATE privacy analysis against independent values: closed forms, exact Renyi divergences of the
aggregators' output distributions, and values of the authors' public code run by hand.

"Authors' code" values come from tensorflow/privacy research/pate_2018/core.py and
smooth_sensitivity.py (Papernot et al. 2018) and research/pate_2017/analysis.py, run on the inputs
shown; the numbers are pasted here, the code is not used.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import integrate, special, stats

from engine.privacy import pate
from engine.privacy.rdp import rdp_to_epsilon

ORDERS = np.array([2.0, 5.0, 10.0, 20.0, 50.0, 100.0])


def synthetic_votes(rng: np.random.Generator, queries: int, teachers: int = 250, classes: int = 10) -> np.ndarray:
    """Teacher votes with a spread of agreement: per query, each teacher is right with prob p ~ Beta(6, 1)."""
    out = np.zeros((queries, classes), dtype=np.int64)
    for i in range(queries):
        label = rng.integers(classes)
        right = rng.binomial(teachers, rng.beta(6, 1))
        wrong = rng.multinomial(teachers - right, np.ones(classes - 1) / (classes - 1))
        out[i, np.arange(classes) != label] = wrong
        out[i, label] = right
    return out


def cks_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """[CKS20, Prop. 12] written out: min over orders of rdp + log((a-1)/a) - (log delta + log a)/(a-1)."""
    return float(np.min(rdp + np.log((orders - 1) / orders) - (math.log(delta) + np.log(orders)) / (orders - 1)))


# ---- 2017: LNMax and the moments accountant -----------------------------------------------------


def test_lnmax_moments_data_independent_reproduces_9000_queries_gamma_0_2():
    # [PAEGT17] data-independent moments: alpha(l) = min(2 gamma^2 l (l+1), 2 gamma l) per query;
    # 9,000 queries, gamma = 0.2, delta = 1e-5, l = 1..8: (9000 * 0.16 + log 1e5) / 1 at l = 1.
    res = pate.lnmax_moments_epsilon(laplace_scale=5.0, delta=1e-5, num_queries=9000, moments=8)
    assert res.value == pytest.approx(1440.0 + math.log(1e5), rel=1e-12)
    assert round(res.value, 2) == 1451.51
    assert res.moment == 1 and not res.data_dependent


def test_lnmax_moments_data_independent_closed_form_for_a_small_gamma():
    gamma, queries, delta = 0.05, 100, 1e-5
    ls = np.arange(1, 9)
    alpha = np.minimum(2 * gamma**2 * ls * (ls + 1), 2 * gamma * ls) * queries
    expected = np.min((alpha + math.log(1 / delta)) / ls)
    res = pate.lnmax_moments_epsilon(laplace_scale=1 / gamma, delta=delta, num_queries=queries)
    assert res.value == pytest.approx(expected, rel=1e-12)


def test_lnmax_data_dependent_matches_authors_code():
    # core.compute_logq_laplace / core.rdp_pure_eps(logq, 2/b, orders) of pate_2018.
    log_q = pate.lnmax_log_q(votes=[240, 5, 5], laplace_scale=20.0)[0]
    assert log_q == pytest.approx(-9.822108356447364, rel=1e-12)
    got = pate.lnmax_rdp_data_dependent(votes=[[240, 5, 5], [100, 60, 40]], laplace_scale=20.0, orders=ORDERS)
    ref = [
        [1.1408721069422328e-05, 1.2373185208384092e-05, 1.4499990134577246e-05, 2.193159760928699e-05,
         0.0001526738850557942, 0.007405015735789219],
        [0.010000000000000002, 0.025000000000000005, 0.045205769758934373, 0.05113145116795897,
         0.06902321515654933, 0.08364712998288398],
    ]
    np.testing.assert_allclose(got, ref, rtol=1e-10)


def test_lnmax_data_dependent_moments_never_above_data_independent():
    votes = synthetic_votes(np.random.default_rng(3), 200)
    dep = pate.lnmax_moments_epsilon(laplace_scale=20.0, delta=1e-5, votes=votes)
    ind = pate.lnmax_moments_epsilon(laplace_scale=20.0, delta=1e-5, num_queries=200)
    assert dep.data_dependent and dep.value < ind.value


# ---- 2018: GNMax ----------------------------------------------------------------------------------


def test_gnmax_log_q_closed_form_for_unanimous_teachers():
    # Proposition 7 with gaps n to m-1 empty classes: q = (m - 1)/2 erfc(n / (2 sigma)).
    n, m, sigma = 250, 10, 40.0
    votes = np.zeros(m)
    votes[3] = n
    expected = math.log((m - 1) / 2 * special.erfc(n / (2 * sigma)))
    assert pate.gnmax_log_q(votes=votes, sigma=sigma)[0] == pytest.approx(expected, rel=1e-12)


def test_gnmax_ties_cost_the_data_independent_bound():
    # A two-way tie: q~ = 1/2 = 1 - 1/m, far above q0, so nothing is gained from the data.
    dd = pate.gnmax_rdp_data_dependent(votes=[[125, 125], [0, 0]], sigma=40.0, orders=ORDERS)
    np.testing.assert_array_equal(dd, np.broadcast_to(ORDERS / 40.0**2, dd.shape))


def test_gnmax_data_independent_is_alpha_over_sigma_squared():
    np.testing.assert_allclose(pate.gnmax_rdp_data_independent(sigma=40.0, orders=ORDERS), ORDERS / 1600.0)


def test_gnmax_data_dependent_matches_authors_code():
    cases = {
        (250, 0, 0, 0, 0, 0, 0, 0, 0, 0): (-10.019228294289038, [
            1.527357262762397e-05, 1.7491529354536665e-05, 2.333177856720708e-05, 5.3213177518040856e-05,
            0.00208327378800989, 0.05771989435228084]),
        (230, 10, 5, 5, 0, 0, 0, 0, 0, 0): (-8.241357632571564, [
            8.134985549703837e-05, 9.186538809196124e-05, 0.00011831866640668945, 0.0002406919317399954,
            0.00550799208632833, 0.06094212637314228]),
        (150, 60, 40, 0, 0, 0, 0, 0, 0, 0): (-2.2094987849542953, list(ORDERS / 1600.0)),
    }
    for votes, (log_q, rdp) in cases.items():
        assert pate.gnmax_log_q(votes=votes, sigma=40.0)[0] == pytest.approx(log_q, rel=1e-12)
        got = pate.gnmax_rdp_data_dependent(votes=votes, sigma=40.0, orders=ORDERS)[0]
        np.testing.assert_allclose(got, rdp, rtol=1e-9)


def test_gnmax_log_q0_matches_authors_code():
    # smooth_sensitivity.compute_logq0_gnmax(sigma, order)
    for sigma, order, ref in [(40.0, 20.0, -3.1568730493512733), (150 * 2**0.5, 10.0, -5.3334961012476745),
                              (15.0, 2.5, -4.046276834159763)]:
        assert pate.gnmax_log_q0(sigma=sigma, orders=[order])[0] == pytest.approx(ref, abs=1e-9)


def _bernoulli_renyi(p: float, q: float, alpha: float) -> float:
    return math.log(p**alpha * q ** (1 - alpha) + (1 - p) ** alpha * (1 - q) ** (1 - alpha)) / (alpha - 1)


@pytest.mark.parametrize("n0, n1, sigma", [(200, 50, 40.0), (230, 20, 40.0), (150, 100, 40.0), (50, 0, 10.0), (9, 1, 2.0)])
def test_gnmax_data_dependent_bound_holds_for_two_classes(n0, n1, sigma):
    # Two classes: GNMax answers class 0 with probability Phi((n0 - n1) / (sqrt(2) sigma)) exactly.
    # The bound at D must cover D_alpha(M(D) || M(D')) for both neighbours (one vote moved).
    orders = np.array([1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 40.0])
    bound = pate.gnmax_rdp_data_dependent(votes=[n0, n1], sigma=sigma, orders=orders)[0]

    def p0(a, b):
        return stats.norm.cdf((a - b) / (math.sqrt(2) * sigma))

    for d in (-1, 1):
        for i, alpha in enumerate(orders):
            exact = _bernoulli_renyi(p0(n0, n1), p0(n0 + d, n1 - d), alpha)
            assert exact <= bound[i] * (1 + 1e-9) + 1e-15


def test_gnmax_data_dependent_bound_holds_for_three_classes_by_quadrature():
    sigma = 10.0
    votes = np.array([40.0, 8.0, 2.0])
    orders = np.array([2.0, 5.0, 10.0])
    bound = pate.gnmax_rdp_data_dependent(votes=votes, sigma=sigma, orders=orders)[0]

    def output_probs(v):
        probs = []
        for i in range(3):
            others = [j for j in range(3) if j != i]

            def f(x, i=i, others=others):
                return stats.norm.pdf(x, v[i], sigma) * np.prod([stats.norm.cdf((x - v[j]) / sigma) for j in others])

            probs.append(integrate.quad(f, v[i] - 12 * sigma, v[i] + 12 * sigma, epsabs=1e-14, limit=200)[0])
        return np.array(probs)

    p = output_probs(votes)
    assert p.sum() == pytest.approx(1.0, abs=1e-9)
    for src in range(3):
        for dst in range(3):
            if src == dst or votes[src] == 0:
                continue
            neighbour = votes.copy()
            neighbour[src] -= 1
            neighbour[dst] += 1
            q = output_probs(neighbour)
            for i, alpha in enumerate(orders):
                exact = math.log(np.sum(p**alpha * q ** (1 - alpha))) / (alpha - 1)
                assert exact <= bound[i] + 1e-12


# ---- Confident GNMax: the threshold check --------------------------------------------------------


def test_threshold_matches_authors_code():
    cases = [
        ((230, 10, 5, 5, 0, 0, 0, 0, 0, 0), 200.0, 150.0, -0.5460043537227742, list(ORDERS / (2 * 150.0**2))),
        ((250, 0, 0), 200.0, 20.0, -0.00622902548586, [
            0.0021449911234190404, 0.0024541139275592416, 0.0032606137733903248, 0.007156460376160062,
            0.05821463700123506, 0.12499999999999999]),
        ((120, 130, 0), 200.0, 20.0, -8.366065308344094, [
            0.00010558409104846465, 0.00012671002612825734, 0.00019114923730369557, 0.0006469998030054663,
            0.038417214201739124, 0.12499999999999999]),
    ]
    for votes, t, s1, log_p, rdp in cases:
        assert pate.threshold_log_pr_answered(votes=votes, threshold=t, sigma1=s1)[0] == pytest.approx(log_p, rel=1e-12)
        got = pate.threshold_rdp_data_dependent(votes=votes, threshold=t, sigma1=s1, orders=ORDERS)[0]
        np.testing.assert_allclose(got, rdp, rtol=1e-9)


@pytest.mark.parametrize("top, threshold, sigma1", [(250, 200.0, 20.0), (130, 200.0, 20.0), (180, 200.0, 30.0)])
def test_threshold_bound_holds_exactly(top, threshold, sigma1):
    # The check answers with probability Phi-bar((T - max) / sigma1); the max moves by one.
    orders = np.array([2.0, 5.0, 10.0, 30.0])
    bound = pate.threshold_rdp_data_dependent(votes=[top, 250 - top], threshold=threshold, sigma1=sigma1,
                                              orders=orders)[0]
    p = stats.norm.sf((threshold - top) / sigma1)
    for d in (-1, 1):
        q = stats.norm.sf((threshold - top - d) / sigma1)
        for i, alpha in enumerate(orders):
            assert _bernoulli_renyi(p, q, alpha) <= bound[i] * (1 + 1e-9)


def test_confident_costs_realised_and_expected():
    votes = synthetic_votes(np.random.default_rng(0), 50)
    kw = dict(votes=votes, mechanism="confident", threshold=200.0, sigma1=150.0, sigma2=40.0, orders=ORDERS)
    thr = pate.threshold_rdp_data_dependent(votes=votes, threshold=200.0, sigma1=150.0, orders=ORDERS)
    gn = pate.gnmax_rdp_data_dependent(votes=votes, sigma=40.0, orders=ORDERS)
    none = pate.query_costs(answered=np.zeros(50, bool), **kw)
    np.testing.assert_allclose(none.data_dependent, thr)  # rejected queries pay the check only
    every = pate.query_costs(answered=np.ones(50, bool), **kw)
    np.testing.assert_allclose(every.data_dependent, thr + gn)
    expected = pate.query_costs(**kw)
    pr = stats.norm.sf((200.0 - votes.max(axis=1)) / 150.0)
    np.testing.assert_allclose(expected.data_dependent, thr + pr[:, None] * gn, rtol=1e-12)
    np.testing.assert_allclose(every.data_independent, np.broadcast_to(ORDERS / (2 * 150.0**2) + ORDERS / 1600.0, (50, 6)))


def test_confident_data_independent_epsilon_depends_neither_on_the_votes_nor_on_which_queries_passed():
    """Which queries pass the threshold check depends on the votes: counting GNMax only for them (or
    with Pr[answered]) made the "data-independent" epsilon a function of the private data (1.73 for
    unanimous votes and 0.787 for split ones, where answering all gives 2.21). Every query pays both."""
    kw = dict(mechanism="confident", threshold=200.0, sigma1=150.0, sigma2=40.0, delta=1e-5)
    unanimous = np.tile([250, 0], (10, 1))
    split = np.tile([125, 125], (10, 1))
    worst = pate.epsilon_if_all_answered(num_queries=10, mechanism="confident", sigma1=150.0, sigma2=40.0,
                                         delta=1e-5)
    for votes in (unanimous, split):
        for answered in (None, np.zeros(10, bool), np.arange(10) % 2 == 0, np.ones(10, bool)):
            res = pate.pate_epsilon(votes=votes, answered=answered, **kw)
            assert res.epsilon_data_independent == pytest.approx(worst, rel=1e-12)


# ---- composition, conversion, budget, properties ---------------------------------------------------


def test_data_independent_gnmax_epsilon_is_the_closed_form():
    votes = synthetic_votes(np.random.default_rng(1), 300)
    res = pate.pate_epsilon(votes=votes, mechanism="gnmax", sigma=40.0, delta=1e-5)
    orders = np.asarray(pate.PATE_ORDERS)
    assert res.epsilon_data_independent == pytest.approx(cks_epsilon(orders, 300 * orders / 1600.0, 1e-5), rel=1e-12)
    assert res.epsilon_data_dependent < res.epsilon_data_independent


def test_epsilon_after_each_query_matches_rdp_to_epsilon():
    votes = synthetic_votes(np.random.default_rng(2), 40)
    costs = pate.query_costs(votes=votes, mechanism="confident", threshold=200.0, sigma1=150.0, sigma2=40.0)
    live = pate.epsilon_after_each(rdp_per_query=costs.data_dependent, delta=1e-5)
    for i in (0, 9, 39):
        ref = rdp_to_epsilon(orders=pate.PATE_ORDERS, rdp=costs.data_dependent[: i + 1].sum(axis=0), delta=1e-5)
        assert live[i] == pytest.approx(ref.value, rel=1e-12)
    assert np.all(np.diff(live) >= -1e-12)  # never decreases with more queries


@pytest.mark.parametrize("mechanism, params", [
    ("gnmax", {"sigma": 40.0}),
    ("confident", {"threshold": 200.0, "sigma1": 150.0, "sigma2": 40.0}),
    ("lnmax", {"laplace_scale": 20.0}),
])
def test_data_dependent_never_above_data_independent(mechanism, params):
    rng = np.random.default_rng(4)
    votes = np.vstack([synthetic_votes(rng, 100), rng.multinomial(250, np.ones(10) / 10, size=50)])
    answered = rng.random(150) < 0.5
    for mask in (None, answered):
        costs = pate.query_costs(votes=votes, mechanism=mechanism, answered=mask, **params)
        assert np.all(costs.data_dependent <= costs.data_independent * (1 + 1e-12))
        res = pate.pate_epsilon(votes=votes, mechanism=mechanism, answered=mask, delta=1e-5, **params)
        assert res.epsilon_data_dependent <= res.epsilon_data_independent


def test_more_noise_costs_less_data_independently():
    # Only the data-independent bound must fall with sigma: the data-dependent one can rise, since
    # more noise makes the plurality less certain (the trade-off of the 2018 paper, Sec. 4).
    votes = synthetic_votes(np.random.default_rng(5), 200)
    eps = [pate.pate_epsilon(votes=votes, mechanism="gnmax", sigma=s, delta=1e-5) for s in (20.0, 40.0, 80.0)]
    assert eps[0].epsilon_data_independent > eps[1].epsilon_data_independent > eps[2].epsilon_data_independent
    tie = [[125, 125]]  # no consensus: the data cannot help, so the cost falls with sigma
    dd = [pate.pate_epsilon(votes=tie, mechanism="gnmax", sigma=s, delta=1e-5).epsilon_data_dependent
          for s in (20.0, 40.0, 80.0)]
    assert dd[0] > dd[1] > dd[2]


def test_more_queries_cost_more():
    votes = synthetic_votes(np.random.default_rng(6), 300)
    e = [pate.pate_epsilon(votes=votes[:n], mechanism="confident", threshold=200.0, sigma1=150.0, sigma2=40.0,
                           delta=1e-5).epsilon_data_dependent for n in (50, 150, 300)]
    assert e[0] < e[1] < e[2]


def test_budget_stops_before_the_query_that_could_exceed_it():
    votes = synthetic_votes(np.random.default_rng(7), 400)
    kw = dict(votes=votes, mechanism="confident", threshold=200.0, sigma1=150.0, sigma2=40.0)
    answered = np.random.default_rng(8).random(400) < 0.6
    real = pate.query_costs(answered=answered, **kw)
    worst = pate.query_costs(answered=np.ones(400, bool), **kw)
    live = pate.epsilon_after_each(rdp_per_query=real.data_dependent, delta=1e-5)
    budget = float(live[250])
    n = pate.queries_within_budget(rdp_per_query=real.data_dependent, rdp_worst_case=worst.data_dependent,
                                   delta=1e-5, budget=budget)
    assert 0 < n <= 251
    assert live[n - 1] <= budget
    could = real.data_dependent[:n].sum(axis=0) + worst.data_dependent[n]
    assert rdp_to_epsilon(orders=pate.PATE_ORDERS, rdp=could, delta=1e-5).value > budget
    assert pate.queries_within_budget(rdp_per_query=real.data_dependent, rdp_worst_case=worst.data_dependent,
                                      delta=1e-5, budget=1e9) == 400


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="sigma"):
        pate.gnmax_log_q(votes=[3, 1], sigma=0.0)
    with pytest.raises(ValueError, match="votes"):
        pate.gnmax_log_q(votes=[[-1, 2]], sigma=1.0)
    with pytest.raises(ValueError, match="answered"):
        pate.query_costs(votes=[[3, 1]], mechanism="gnmax", sigma=1.0, answered=[True, False])
    with pytest.raises(ValueError, match="mechanism"):
        pate.query_costs(votes=[[3, 1]], mechanism="rnm")
    with pytest.raises(ValueError, match="threshold"):
        pate.query_costs(votes=[[3, 1]], mechanism="confident", sigma1=1.0, sigma2=1.0)


@pytest.mark.parametrize("mechanism, params", [
    ("gnmax", {"sigma": 40.0}),
    ("confident", {"threshold": 200.0, "sigma1": 150.0, "sigma2": 40.0}),
    ("lnmax", {"laplace_scale": 20.0}),
])
def test_epsilon_if_all_answered_is_the_data_independent_bound_of_answering_everything(mechanism, params):
    votes = synthetic_votes(np.random.default_rng(3), 500)
    answered = np.ones(500, bool) if mechanism == "confident" else None
    res = pate.pate_epsilon(votes=votes, mechanism=mechanism, delta=1e-5, answered=answered, **params)
    planned = pate.epsilon_if_all_answered(mechanism=mechanism, num_queries=500, delta=1e-5,
                                           **{k: v for k, v in params.items() if k != "threshold"})
    assert planned == pytest.approx(res.epsilon_data_independent, rel=1e-12)
    assert res.epsilon_data_dependent <= planned


def test_epsilon_if_all_answered_gnmax_closed_form():
    orders = pate.PATE_ORDERS
    expected = cks_epsilon(orders, 300 * orders / 1600.0, 1e-5)
    assert pate.epsilon_if_all_answered(mechanism="gnmax", num_queries=300, sigma=40.0, delta=1e-5) == \
        pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="sigma2 is needed"):
        pate.epsilon_if_all_answered(mechanism="confident", num_queries=3, sigma1=1.0, delta=1e-5)


@pytest.mark.parametrize("num_queries,sigma,delta", [(9000, 10.0, 1e-5), (1000, 12.0, 1e-5), (2000, 40.0, 1e-5),
                                                     (50, 100.0, 1e-8)])
def test_default_orders_are_tight_for_the_data_independent_epsilon(num_queries, sigma, delta, closed_forms):
    """GNMax answering every query is the Gaussian mechanism (sensitivity sqrt(2), noise sigma) composed
    num_queries times: dp-accounting's RDP accountant at orders 0.1% apart from 1.001 to 1000 gives the
    best-order epsilon (ours within 0.5% of it, never below), and the exact Gaussian epsilon (Balle &
    Wang 2018) with sigma / sqrt(2 num_queries) is a lower bound. Large epsilons put the best order
    below 1.25, where the grid used to start."""
    accountant_module = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
    dp_accounting = pytest.importorskip("dp_accounting")
    ours = pate.epsilon_if_all_answered(mechanism="gnmax", num_queries=num_queries, sigma=sigma, delta=delta)
    fine = np.concatenate([1.0 + np.geomspace(0.0105, 1.0, 2000)[:-1], np.geomspace(2.0, 1000.0, 6000)])
    reference = accountant_module.RdpAccountant(orders=list(fine))
    reference.compose(dp_accounting.GaussianDpEvent(sigma / math.sqrt(2.0)), num_queries)
    best_order_epsilon = reference.get_epsilon(delta)
    assert ours >= best_order_epsilon * (1 - 1e-9)
    assert ours <= best_order_epsilon * 1.004  # the grid that started at 1.25 gave 1.0254 and 1.013 (first two)
    assert ours >= closed_forms.gaussian_epsilon(delta, sigma / math.sqrt(2.0 * num_queries))


# ---- noise too small for a float ------------------------------------------------------------------

OK_VOTES = np.array([[34, 4, 3, 9], [42, 4, 3, 1], [34, 6, 5, 5], [25, 25, 0, 0], [26, 24, 0, 0]])


@pytest.mark.parametrize("noise", [1e-160, 1e-200, 1e-300, 5e-324])
def test_gnmax_and_confident_with_noise_too_small_for_a_float_give_inf_not_an_overflow(noise):
    """gnmax_sigma = 1e-300 raised OverflowError (34, 'Numerical result out of range') in gnmax_log_q0
    ((1 + 1/sigma)^2 in Python floats). Both epsilons are inf: alpha / sigma^2 is past float range, and
    the data-dependent bound needs the same exponents, so every query is charged alpha / sigma^2."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.all(pate.gnmax_log_q0(sigma=noise, orders=ORDERS) == -np.inf)
        assert np.all(pate.gnmax_rdp_data_independent(sigma=noise, orders=ORDERS) == np.inf)
        for kw in (dict(mechanism="gnmax", sigma=noise),
                   dict(mechanism="confident", threshold=30.0, sigma1=noise, sigma2=5.0),
                   dict(mechanism="confident", threshold=30.0, sigma1=5.0, sigma2=noise)):
            res = pate.pate_epsilon(votes=OK_VOTES, delta=1e-5, **kw)
            assert res.epsilon_data_independent == math.inf and res.epsilon_data_dependent == math.inf, kw
            assert not np.any(np.isnan(res.rdp))
            realised = pate.pate_epsilon(votes=OK_VOTES, delta=1e-5, answered=[True, False, True, False, False], **kw)
            assert realised.epsilon_data_dependent == math.inf
        assert pate.epsilon_if_all_answered(mechanism="confident", num_queries=10, delta=1e-5, sigma1=noise,
                                            sigma2=noise) == math.inf


def test_a_probability_below_every_float_is_not_a_certain_outcome():
    """q~ of a query with a clear plurality underflowed to 0 at noise ~1e-154 (log q = -inf), and a certain
    outcome is charged nothing at every order. But Theorem 6 holds only for orders below mu1 = sigma
    sqrt(log 1/q) + 1 (about 4 for this gap of 6: true log q is about -gap^2 / (4 sigma^2)); above it the
    cost is alpha / sigma^2. log q is now kept at the most negative float (an upper bound on q)."""
    sigma = 1.6e-154
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log_q = pate.gnmax_log_q(votes=[[6, 0, 0]], sigma=sigma)
        cost = pate.gnmax_rdp_data_dependent(votes=[[6, 0, 0]], sigma=sigma, orders=[10.0])[0, 0]
    assert np.all(np.isfinite(log_q))
    true_mu1 = 6.0 / 2.0 + 1.0  # sigma sqrt(gap^2 / (4 sigma^2)) + 1 (beyond float range to compute as written)
    assert 10.0 > true_mu1 and cost >= 1.79e308  # alpha / sigma^2 = 3.9e308: inf


def test_the_check_of_a_near_certain_answer_is_charged_above_theorem_6s_orders():
    """Confident GNMax, sigma1 = 1, threshold 10: a maximum count of 48 made Pr[answered] round to 1,
    log(1 - Pr) = -inf, and the check cost nothing at every order, while a count of 47 cost alpha / 2 at
    order 50. Pr[rejected] = Phi(-38) (log -726.6) gives mu1 = sqrt(2) sqrt(726.6) + 1 = 39.1 < 50, where
    Theorem 6 does not apply: the cost there is the data-independent alpha / (2 sigma1^2) = 25."""
    orders = np.array([10.0, 50.0])
    costs = pate.threshold_rdp_data_dependent(votes=[[47, 3, 0], [48, 2, 0], [60, 0, 0]], threshold=10.0,
                                              sigma1=1.0, orders=orders)
    log_rejected = stats.norm.logsf(48.0 - 10.0)  # scipy's own tail, independently of engine.privacy
    mu1 = math.sqrt(2.0) * math.sqrt(-log_rejected) + 1.0
    assert 38.0 < mu1 < 50.0
    np.testing.assert_allclose(costs[:2, 1], [25.0, 25.0], rtol=1e-15)  # was 25 and 0
    assert 0 < costs[2, 1] <= 25.0  # count 60: mu1 = sqrt(2) * 35.4 + 1 = 51 > 50, Theorem 6 applies
    assert np.all(costs[:2, 0] > 0) and np.all(costs[:, 0] < 1e-100)  # Theorem 6 at order 10: tiny
    res = pate.pate_epsilon(votes=[[48, 2, 0]] * 50, mechanism="confident", threshold=10.0, sigma1=1.0, sigma2=40.0,
                            delta=1e-5)
    assert res.rdp[np.searchsorted(res.orders, 50.0)] >= 50 * 25.0 * (1 - 1e-12)


@pytest.mark.parametrize("scale", [1e-300, 1e-308, 5e-324])
def test_lnmax_with_noise_too_small_for_a_float_gives_its_bound_not_an_overflow(scale):
    """laplace_scale = 1e-300 raised OverflowError in lnmax_rdp_data_independent ((2/b)^2 in Python floats).
    The data-independent RDP is then min(alpha eps^2 / 2, eps) = eps = 2 / b per query (inf once 2 / b
    passes float range), and q~ is never NaN (inf - inf when gap / b overflowed)."""
    eps = 2.0 / scale  # inf for 5e-324
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        di = pate.lnmax_rdp_data_independent(laplace_scale=scale, orders=ORDERS)
        log_q = pate.lnmax_log_q(votes=OK_VOTES, laplace_scale=scale)
        res = pate.pate_epsilon(votes=OK_VOTES, mechanism="lnmax", laplace_scale=scale, delta=1e-5)
    np.testing.assert_array_equal(di, np.full(ORDERS.size, eps))
    assert not np.any(np.isnan(log_q)) and np.all(log_q <= 0)
    np.testing.assert_array_equal(res.rdp_data_independent, np.full(res.orders.size, 5 * eps))
    assert res.epsilon_data_independent >= 5 * eps * (1 - 1e-12)
    assert not np.any(np.isnan(res.rdp))


def test_dpw_privacy_pate_with_tiny_noise_answers_inf(tmp_path):
    """The fuzz cases: `dpw privacy pate --mechanism gnmax --sigma 1e-300` (with and without --release) and
    `--mechanism lnmax --laplace-scale 1e-300` printed an OverflowError traceback."""
    from click.testing import CliRunner

    from engine.cli import cli

    path = tmp_path / "votes.npy"
    np.save(path, OK_VOTES)
    base = ["privacy", "pate", "--votes", str(path), "--delta", "1e-5", "--json"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for extra in (["--mechanism", "gnmax", "--sigma", "1e-300"],
                      ["--mechanism", "gnmax", "--sigma", "1e-300", "--release"],
                      ["--mechanism", "lnmax", "--laplace-scale", "1e-300"]):
            result = CliRunner().invoke(cli, base + extra)
            assert result.exit_code == 0 and "Traceback" not in result.output, (extra, result.output)
