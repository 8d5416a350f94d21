"""Smooth sensitivity of PATE's data-dependent cost and its release (Papernot et al. 2018, App. B-C).

Reference arrays come from the authors' public tests (tensorflow/privacy
research/pate_2018/smooth_sensitivity_test.py) and from their smooth_sensitivity_table.py run by
hand on the votes built here; the rest are closed forms and properties of smooth sensitivity.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from engine.privacy import pate, pate_smooth

from test_pate_analysis import synthetic_votes  # tests/privacy is on sys.path (pytest's prepend import mode)


def test_gnmax_local_sensitivity_going_right_matches_authors():
    out = pate_smooth.gnmax_local_sensitivity_by_distance(votes=[10, 0, 0], num_teachers=10, sigma=0.5, order=1.5)[0]
    ref = [3.13503646e-17, 1.60178280e-08, 5.90681786e-03] + [5.99981308e00] * 7
    np.testing.assert_allclose(out, ref, rtol=1e-8)


def test_gnmax_local_sensitivity_going_left_matches_authors():
    out = pate_smooth.gnmax_local_sensitivity_by_distance(votes=[1000, 500, 300, 200, 0], num_teachers=2000,
                                                          sigma=250.0, order=10.0)[0]
    ref = np.array([0.0] * 298 + [2.77693450548e-7, 2.10853979548e-6] + [2.73113623988e-6] * 1700)
    np.testing.assert_allclose(out, ref, rtol=1e-8, atol=1e-300)


THRESHOLD_CASES = [
    # (threshold, authors' array for counts [20, 10, 0], 30 teachers, sigma 2, order 10)
    (16, [0] * 3 + [1.48454129e-04, 1.47826870e-02, 3.94153241e-02, 6.45775697e-02, 9.01543247e-02, 1.16054002e-01,
                    1.42180452e-01, 1.42180452e-01, 1.48454129e-04, 1.47826870e-02, 3.94153241e-02, 6.45775697e-02,
                    9.01543266e-02, 1.16054000e-01, 1.42180452e-01, 1.68302106e-01, 1.93127860e-01] + [0] * 10),
    (2, [1.60212079e-01, 2.07021132e-01, 2.07021132e-01, 1.93127860e-01, 1.68302106e-01, 1.42180452e-01,
         1.16054002e-01, 9.01543247e-02, 6.45775697e-02, 3.94153241e-02, 1.47826870e-02, 1.48454129e-04] + [0] * 18),
    (50, [1.35750725752e-19, 1.88990500499e-17, 2.05403154065e-15, 1.74298153642e-13, 1.15489723995e-11,
          5.97584949325e-10, 2.41486826748e-08, 7.62150641922e-07, 1.87846248741e-05, 0.000360973025976,
          0.000360973025976, 2.76377015215e-50, 1.00904975276e-53, 2.87254164748e-57, 6.37583360761e-61,
          1.10331620211e-64, 1.48844393335e-68, 1.56535552444e-72, 1.28328011060e-76, 8.20047697109e-81] + [0] * 10),
]


@pytest.mark.parametrize("threshold, ref", THRESHOLD_CASES)
def test_threshold_local_sensitivity_matches_authors(threshold, ref):
    out = pate_smooth.threshold_local_sensitivity_by_distance(votes=[20, 10, 0], num_teachers=30,
                                                              threshold=threshold, sigma1=2.0, order=10.0)[0]
    # The authors stop one distance short (d < max(v, n - v)); at d = 20 the maximum count 0 is
    # still reachable, so we keep that entry (more conservative) and compare the first 20.
    np.testing.assert_allclose(out[:20], ref[:20], rtol=1e-6, atol=1e-300)


def test_conditions_c5_c6_as_the_authors_find_them():
    assert pate_smooth.check_conditions(sigma=20.0, num_classes=10, order=25.0) == (True, False)
    assert pate_smooth.check_conditions(sigma=30.0, num_classes=10, order=25.0) == (True, True)


def test_gnss_rdp_closed_form():
    beta, sigma, order = 0.02, 9.8, 24.0
    expected = order * math.exp(2 * beta) / sigma**2 + (beta * order - 0.5 * math.log(1 - 2 * order * beta)) / (order - 1)
    assert pate_smooth.gnss_rdp(beta=beta, sigma=sigma, order=order) == pytest.approx(expected, rel=1e-14)
    assert expected == pytest.approx(0.3509394475419522, rel=1e-12)  # the authors' function
    with pytest.raises(ValueError, match="1 / \\(2 beta\\)"):
        pate_smooth.gnss_rdp(beta=0.05, sigma=1.0, order=10.0)


def test_local_sensitivity_bounds_every_one_vote_change():
    # |cost(v) - cost(v')| <= LS(v) at distance 0, for every neighbour v' (one vote moved).
    rng = np.random.default_rng(0)
    sigma, order = 40.0, 20.0
    votes = np.vstack([synthetic_votes(rng, 40), [[250, 0, 0, 0, 0, 0, 0, 0, 0, 0], [125, 125, 0, 0, 0, 0, 0, 0, 0, 0]]])
    ls0 = pate_smooth.gnmax_local_sensitivity_by_distance(votes=votes, num_teachers=250, sigma=sigma, order=order)[:, 0]
    cost = pate.gnmax_rdp_data_dependent(votes=votes, sigma=sigma, orders=[order])[:, 0]
    owner, neighbours = [], []
    for i, v in enumerate(votes):
        for src in np.flatnonzero(v):
            for dst in range(len(v)):
                if dst != src:
                    w = v.copy()
                    w[src] -= 1
                    w[dst] += 1
                    owner.append(i)
                    neighbours.append(w)
    other = pate.gnmax_rdp_data_dependent(votes=np.array(neighbours), sigma=sigma, orders=[order])[:, 0]
    owner = np.array(owner)
    assert np.all(np.abs(other - cost[owner]) <= ls0[owner] * (1 + 1e-9) + 1e-18)


def test_smooth_sensitivity_is_beta_smooth_across_neighbouring_vote_sets():
    # One teacher changes its vote in every query: SS(x) <= e^beta SS(x') [NRS07, Def. 2.1].
    rng = np.random.default_rng(1)
    votes = synthetic_votes(rng, 30)
    order, beta = 20.0, 0.4 / 20.0
    neighbour = votes.copy()
    for row in neighbour:
        src = rng.choice(np.flatnonzero(row))
        dst = (src + 1 + rng.integers(len(row) - 1)) % len(row)
        row[src] -= 1
        row[dst] += 1
    kw = dict(mechanism="gnmax", sigma=40.0, delta=1e-5, noise=0.0, order=order, beta=beta, sigma_ss=5.0)
    a = pate_smooth.release_epsilon(votes=votes, **kw).smooth_sensitivity
    b = pate_smooth.release_epsilon(votes=neighbour, **kw).smooth_sensitivity
    assert a <= math.exp(beta) * b * (1 + 1e-9) and b <= math.exp(beta) * a * (1 + 1e-9)


def test_release_matches_the_authors_parameter_search():
    # smooth_sensitivity_table._find_optimal_smooth_sensitivity_parameters on these 120 queries,
    # T = 200, sigma1 = 150, sigma2 = 40, 250 teachers, order 24 (expected costs, as the paper).
    votes = synthetic_votes(np.random.default_rng(11), 120)
    rel = pate_smooth.release_epsilon(votes=votes, mechanism="confident", threshold=200.0, sigma1=150.0,
                                      sigma2=40.0, delta=1e-5, noise=0.0, order=24.0)
    assert rel.beta == pytest.approx(0.01958333333333332, rel=1e-9)
    assert rel.smooth_sensitivity == pytest.approx(0.016350309388600014, rel=1e-9)
    assert rel.sigma_ss == pytest.approx(11.514145450454864, rel=1e-9)
    assert rel.conditions_hold and rel.parameters_from_data
    # With zero noise the released value is the exact cost plus the cost of releasing it.
    exact = pate.pate_epsilon(votes=votes, mechanism="confident", threshold=200.0, sigma1=150.0, sigma2=40.0,
                              delta=1e-5, orders=[24.0])
    assert rel.rdp_data_dependent == pytest.approx(exact.rdp[0], rel=1e-12)
    assert rel.epsilon_released > rel.epsilon_data_dependent_at_order


def test_smooth_sensitivity_is_the_discounted_maximum():
    # max_d e^(-beta d) A(d) with e^-beta = 1/2: max(0.5, 1.0 / 2, 4.0 / 4) = 1.
    assert pate_smooth.smooth_sensitivity(local_sensitivity=[0.5, 1.0, 4.0], beta=math.log(2)) == pytest.approx(1.0)
    assert pate_smooth.smooth_sensitivity(local_sensitivity=[0.5, 1.0, 4.0], beta=0.0) == 4.0


def test_no_consensus_costs_the_data_independent_bound():
    # 10 teachers under sigma = 40: no histogram beats alpha / sigma^2.
    votes = np.array([[10, 0, 0], [6, 4, 0], [3, 3, 4]])
    rel = pate_smooth.release_epsilon(votes=votes, mechanism="gnmax", sigma=40.0, delta=1e-5, noise=0.0, order=8.0)
    assert rel.rdp_data_dependent == pytest.approx(3 * 8.0 / 1600.0, rel=1e-12)


def test_released_value_moves_with_the_noise_draw():
    votes = synthetic_votes(np.random.default_rng(2), 60)
    kw = dict(votes=votes, mechanism="gnmax", sigma=40.0, delta=1e-5)
    low = pate_smooth.release_epsilon(noise=-1.0, **kw)
    high = pate_smooth.release_epsilon(noise=1.0, **kw)
    assert low.rdp_released < low.rdp_data_dependent < high.rdp_released
    assert high.rdp_released - low.rdp_released == pytest.approx(2 * high.smooth_sensitivity * high.sigma_ss)
    with pytest.raises(ValueError, match="gnmax"):
        pate_smooth.release_epsilon(noise=0.0, votes=votes, mechanism="lnmax", delta=1e-5)


# ---- parameters fixed before the votes -------------------------------------------------------------
PUBLIC = dict(mechanism="confident", num_teachers=250, num_queries=120, num_classes=10, threshold=200.0,
              sigma1=150.0, sigma2=40.0, delta=1e-5)


def test_data_independent_parameters_are_the_authors_search_on_unanimous_votes():
    params = pate_smooth.data_independent_parameters(**PUBLIC)
    unanimous = np.zeros((120, 10))
    unanimous[:, 3] = 250  # which class does not matter
    searched = pate_smooth.release_epsilon(votes=unanimous, mechanism="confident", threshold=200.0, sigma1=150.0,
                                           sigma2=40.0, delta=1e-5, noise=0.0, num_teachers=250)
    assert params.order == searched.order
    assert params.beta == pytest.approx(searched.beta, rel=1e-12)
    assert params.sigma_ss == pytest.approx(searched.sigma_ss, rel=1e-9)
    assert 1.0 < params.order and 0.0 < params.beta < 1.0 / (2.0 * params.order) and params.sigma_ss > 0


def test_fixed_parameters_do_not_move_with_the_votes():
    params = pate_smooth.data_independent_parameters(**PUBLIC)
    kw = dict(mechanism="confident", threshold=200.0, sigma1=150.0, sigma2=40.0, delta=1e-5, noise=0.0,
              num_teachers=250, order=params.order, beta=params.beta, sigma_ss=params.sigma_ss)
    releases = [pate_smooth.release_epsilon(votes=synthetic_votes(np.random.default_rng(seed), 120), **kw)
                for seed in (3, 4)]
    searched = [pate_smooth.release_epsilon(votes=synthetic_votes(np.random.default_rng(seed), 120),
                                            **{k: v for k, v in kw.items() if k not in ("order", "beta", "sigma_ss")})
                for seed in (3, 4)]
    for rel in releases:
        assert (rel.order, rel.beta, rel.sigma_ss) == (params.order, params.beta, params.sigma_ss)
        assert not rel.parameters_from_data
    assert releases[0].rdp_data_dependent != releases[1].rdp_data_dependent
    assert all(s.parameters_from_data for s in searched)
    # The public rule is a little looser than looking at the votes, and still far below the worst case.
    for rel, best in zip(releases, searched):
        assert best.epsilon_released <= rel.epsilon_released
    worst = pate.pate_epsilon(votes=synthetic_votes(np.random.default_rng(3), 120), mechanism="confident",
                              threshold=200.0, sigma1=150.0, sigma2=40.0, delta=1e-5).epsilon_data_independent
    assert releases[0].epsilon_released < worst


def test_data_independent_parameters_depend_on_the_public_settings():
    base = pate_smooth.data_independent_parameters(**PUBLIC)
    more = pate_smooth.data_independent_parameters(**dict(PUBLIC, num_queries=1200))
    assert (more.order, more.beta, more.sigma_ss) != (base.order, base.beta, base.sigma_ss)
    gnmax = pate_smooth.data_independent_parameters(mechanism="gnmax", sigma=40.0, num_teachers=250, num_queries=120,
                                                    num_classes=10, delta=1e-5)
    assert gnmax.order > 1.0
    with pytest.raises(ValueError, match="lnmax"):
        pate_smooth.data_independent_parameters(**dict(PUBLIC, mechanism="lnmax"))


def test_release_orders_are_chosen_where_conditions_c5_c6_hold():
    """With few queries the smallest epsilon sits at a high order, where C6 fails for sigma 40 (the GNMax
    local-sensitivity bound relies on it): the parameters fixed from public settings, and the authors'
    search over the votes, take the best order at which C5-C6 hold instead."""
    m, n, q, delta = 10, 250, 80, 1e-5
    settings = dict(mechanism="confident", threshold=200.0, sigma1=150.0, sigma2=40.0)
    unanimous = np.zeros((1, m))
    unanimous[0, 0] = n
    costs = pate.query_costs(votes=unanimous, **settings)
    _, unconstrained = pate._epsilon_rows(q * costs.data_dependent.sum(axis=0)[None, :], costs.orders, delta)
    assert not all(pate_smooth.check_conditions(sigma=40.0, num_classes=m, order=float(unconstrained[0])))
    chosen = pate_smooth.data_independent_parameters(num_teachers=n, num_queries=q, num_classes=m, delta=delta,
                                                     **settings)
    assert all(pate_smooth.check_conditions(sigma=40.0, num_classes=m, order=chosen.order))
    assert chosen.order < float(unconstrained[0])
    votes = np.tile(unanimous, (q, 1)).astype(int)
    searched = pate_smooth.release_epsilon(votes=votes, delta=delta, noise=0.0, **settings)
    assert searched.parameters_from_data and searched.conditions_hold
    forced = pate_smooth.release_epsilon(votes=votes, delta=delta, noise=0.0, order=float(unconstrained[0]),
                                         beta=0.01, sigma_ss=10.0, **settings)
    assert not forced.conditions_hold  # a caller's own order is kept, and flagged


@pytest.mark.parametrize("noise", [-1.0, 0.0, 1.0])
def test_infinite_release_noise_on_a_varying_cost_bounds_nothing(noise):
    """A fixed sigma_ss = inf on votes whose cost varies (SS > 0): a negative draw released -inf and the
    epsilon stated was the release's own cost alone, 1221, below the run's data-dependent epsilon (about
    2e6 at that order); a zero draw raised (inf * 0). An infinitely noisy number says nothing, so the
    release is inf and the publishable epsilon falls back to the data-independent bound.

    (GNMax sigma 0.001 used to give sigma_ss = inf by itself: BL(q0) underflowed, and the unanimous
    reference got smooth sensitivity 0 although a tie, where the cost is alpha / sigma^2 = 1e6, is five
    teachers away. It now gets SS > 0 and a finite sigma_ss.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # C6 on an empty interval gave NaN grids ("invalid value in subtract")
        assert pate_smooth.check_conditions(sigma=1e-3, num_classes=3, order=1.01) == (True, True)
        params = pate_smooth.data_independent_parameters(mechanism="gnmax", num_teachers=10, num_queries=3,
                                                         num_classes=3, delta=1e-5, sigma=1e-3)
    assert 0 < params.sigma_ss < math.inf
    votes = np.array([[6, 4, 0], [10, 0, 0], [5, 5, 0]])
    released = pate_smooth.release_epsilon(votes=votes, mechanism="gnmax", delta=1e-5, noise=noise, sigma=1e-3,
                                           order=params.order, beta=params.beta, sigma_ss=math.inf)
    assert released.smooth_sensitivity > 0 and released.epsilon_released == math.inf
    assert released.epsilon_data_dependent_at_order > 1e6


# ---- small and tiny noise -------------------------------------------------------------------------


@pytest.mark.parametrize("log_q", [-700.0, -800.0, -5000.0, -1e6])
def test_neighbour_bounds_of_a_q_below_the_normal_floats_match_high_precision(log_q):
    """BL(q) and BU(q) [Prop. 13] took erfcinv(2q/(m-1)) of e^log_q, which is 0 below ~1e-308: both
    became 0, as if no neighbour could move the cost. Against the same formulas in 60-digit arithmetic."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 60
    sigma, m = 1.0, 5
    log_bl, log_bu = pate_smooth.gnmax_log_q_bounds(log_q=np.array([log_q]), sigma=sigma, num_classes=m)
    y = 2 * mpmath.exp(log_q) / (m - 1)
    z = mpmath.findroot(lambda t: mpmath.log(mpmath.erfc(t)) - mpmath.log(y), mpmath.sqrt(-mpmath.log(y)))
    scale = mpmath.log((m - 1) / mpmath.mpf(2))
    ref_bl = scale + mpmath.log(mpmath.erfc(1 / mpmath.mpf(sigma) + z))
    ref_bu = min(mpmath.mpf(0), scale + mpmath.log(mpmath.erfc(-1 / mpmath.mpf(sigma) + z)))
    assert float(log_bl[0]) == pytest.approx(float(ref_bl), rel=1e-9)
    assert float(log_bu[0]) == pytest.approx(float(ref_bu), rel=1e-9)
    assert log_bl[0] < log_q < log_bu[0]


def test_the_plateau_of_the_local_sensitivity_is_found_at_every_order():
    """GNMax sigma 1, 5 classes: from order ~28 on q0 is below e^-745, BL(q0) underflowed to 0, the plateau's
    local sensitivity came out 0 and C6 was skipped as holding, so a release could pick such an order with a
    smooth sensitivity far too small (released epsilon 2.08 instead of 9.08 on synthetic votes)."""
    for order in (10.0, 28.5, 50.0, 100.0, 1000.0):
        log_q0, log_q1 = pate_smooth._plateau_bounds(1.0, 5, order)
        plateau = pate_smooth._ls_of_log_q(np.array([log_q1]), 1.0, 5, order, log_q0, log_q1)[0]
        assert np.isfinite(log_q1) and log_q1 < log_q0 and plateau > 0, order
        assert pate_smooth.check_conditions(sigma=1.0, num_classes=5, order=order) == (True, False), order


@pytest.mark.parametrize("sigma", [0.05, 0.01, 1e-3])
def test_small_noise_has_a_positive_smooth_sensitivity_and_a_released_epsilon_that_grows(sigma):
    """The votes of the fuzz report (50 teachers): at sigma 0.05 and below the smooth sensitivity was 0 and
    the released epsilon 0, while at sigma 0.1 it was 1274. A tie is reachable, where the cost is
    alpha / sigma^2; the released epsilon now grows as the noise shrinks."""
    rng = np.random.default_rng(3)
    votes = np.array([rng.multinomial(50, [0.8, 0.1, 0.05, 0.05]) for _ in range(30)])
    at = {s: pate_smooth.release_epsilon(votes=votes, mechanism="gnmax", delta=1e-5, noise=0.0, sigma=s,
                                         num_teachers=50) for s in (0.1, sigma)}
    assert at[sigma].smooth_sensitivity > 0
    assert at[sigma].epsilon_released >= at[0.1].epsilon_released > 0


@pytest.mark.parametrize("noise", [1e-160, 1e-300, 5e-324])
def test_a_release_with_noise_too_small_for_a_float_is_inf_not_an_error(noise):
    """`dpw privacy pate --sigma 1e-300 --release`: the costs are alpha / sigma^2 = inf, their local
    sensitivity inf - inf; sigma_ss came out 0 or NaN and gnss_rdp raised. No noise can hide such a cost:
    the release is inf, and so are the parameters fixed before the votes (sigma_ss = inf)."""
    votes = np.array([[6, 4, 0], [10, 0, 0], [5, 5, 0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kw in (dict(mechanism="gnmax", sigma=noise),
                   dict(mechanism="confident", threshold=6.0, sigma1=noise, sigma2=2.0),
                   dict(mechanism="confident", threshold=6.0, sigma1=2.0, sigma2=noise)):
            released = pate_smooth.release_epsilon(votes=votes, delta=1e-5, noise=-1.0, num_teachers=10, **kw)
            assert released.epsilon_released == math.inf and released.smooth_sensitivity == math.inf, kw
            params = pate_smooth.data_independent_parameters(num_teachers=10, num_queries=3, num_classes=3,
                                                             delta=1e-5, **kw)
            assert params.sigma_ss == math.inf, kw
            fixed = pate_smooth.release_epsilon(votes=votes, delta=1e-5, noise=0.5, num_teachers=10,
                                                order=params.order, beta=params.beta, sigma_ss=params.sigma_ss, **kw)
            assert fixed.epsilon_released == math.inf, kw


def test_smooth_sensitivity_of_an_unbounded_local_sensitivity_is_inf():
    """inf * e^(-beta d) is NaN where the exponential underflows (thousands of teachers)."""
    ls = np.concatenate([np.zeros(3000), [math.inf]])
    assert pate_smooth.smooth_sensitivity(local_sensitivity=ls, beta=0.49) == math.inf
    assert pate_smooth.smooth_sensitivity(local_sensitivity=[0.0, math.nan], beta=0.1) == math.inf
