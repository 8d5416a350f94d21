"""engine.privacy.rdp against Opacus, dp-accounting, quadrature and closed forms."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest

from engine.privacy import DEFAULT_ORDERS, Epsilon, compute_rdp, rdp_to_epsilon

# Opacus warns when the best order is at the end of the grid (huge epsilons); not our concern here.
pytestmark = pytest.mark.filterwarnings("ignore:Optimal order:UserWarning")

SAMPLE_RATES = (0.001, 0.01, 0.1, 1.0)
NOISE_MULTIPLIERS = (0.5, 0.8, 1.1, 2.0, 5.0)
STEPS = (1, 100, 10_000)
DELTAS = (1e-5, 1e-6)
INTEGER_ORDERS = DEFAULT_ORDERS[DEFAULT_ORDERS == np.round(DEFAULT_ORDERS)]


@pytest.fixture(scope="module")
def reference_rdp(opacus_rdp):
    """Opacus RDP per step at DEFAULT_ORDERS for every (q, sigma) of the grid."""
    return {
        (q, s): np.asarray(opacus_rdp.compute_rdp(q=q, noise_multiplier=s, steps=1, orders=list(DEFAULT_ORDERS)))
        for q, s in itertools.product(SAMPLE_RATES, NOISE_MULTIPLIERS)
    }


@pytest.mark.parametrize("q,sigma", list(itertools.product(SAMPLE_RATES, NOISE_MULTIPLIERS)))
def test_rdp_matches_opacus_at_every_order(q, sigma, reference_rdp):
    """Opacus overflows to NaN at high orders for small sigma; those orders are checked against a
    60-digit binomial sum instead (the highest and lowest of them)."""
    ours = compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=1)
    ref = reference_rdp[(q, sigma)]
    finite = np.isfinite(ref)
    assert np.all(np.isfinite(ours))
    np.testing.assert_allclose(ours[finite], ref[finite], rtol=1e-6, atol=1e-15)
    for alpha in {DEFAULT_ORDERS[~finite].min(), DEFAULT_ORDERS[~finite].max()} if (~finite).any() else ():
        exact = _binomial_rdp_at_high_precision(q, sigma, int(alpha))
        value = ours[DEFAULT_ORDERS == alpha][0]
        assert exact <= value <= exact * (1 + 1e-9), alpha


@pytest.mark.parametrize("q,sigma", list(itertools.product(SAMPLE_RATES, NOISE_MULTIPLIERS)))
def test_rdp_matches_dp_accounting_at_integer_orders(q, sigma, dpacct_rdp):
    ours = compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=1, orders=INTEGER_ORDERS)
    ref = dpacct_rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, INTEGER_ORDERS)
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-15)


@pytest.mark.parametrize("q,sigma", [(0.01, 0.8), (0.1, 2.0), (0.001, 5.0), (0.5, 1.1)])
def test_fractional_orders_never_below_dp_accountings_absolute_series(q, sigma, dpacct_rdp):
    """dp-accounting sums the fractional series in absolute value (an upper bound); ours keeps
    the signs, so it must be at most that (up to round-off allowances) and at least the exact value (next test)."""
    fractional = DEFAULT_ORDERS[DEFAULT_ORDERS != np.round(DEFAULT_ORDERS)]
    ours = compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=1, orders=fractional)
    ref = dpacct_rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, fractional)
    finite = np.isfinite(ref)
    assert np.all(ours[finite] <= ref[finite] * (1 + 1e-6) + 1e-15)


@pytest.mark.parametrize(
    "q,sigma,alpha",
    [(0.01, 1.1, 1.25), (0.1, 0.8, 2.5), (0.5, 2.0, 7.75), (0.001, 5.0, 1.5), (0.9, 0.5, 3.5), (0.01, 0.5, 40.0)],
)
def test_rdp_is_an_upper_bound_on_the_exact_renyi_divergence(q, sigma, alpha, quadrature_log_a):
    """The exact A_alpha by 50-digit quadrature of its defining integral (no series)."""
    exact = quadrature_log_a(q, sigma, alpha) / (alpha - 1)
    ours = float(compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=1, orders=[alpha])[0])
    assert ours >= exact
    assert ours <= exact * (1 + 1e-6) + 1e-15


@pytest.mark.parametrize("sigma", NOISE_MULTIPLIERS)
def test_full_batch_rdp_is_alpha_over_two_sigma_squared(sigma):
    orders = np.array([1.5, 2.0, 3.25, 10.0, 64.0, 1024.0])
    np.testing.assert_array_equal(
        compute_rdp(sample_rate=1.0, noise_multiplier=sigma, steps=7, orders=orders), 7 * orders / (2 * sigma**2)
    )


def test_rdp_composes_linearly_over_steps():
    one = compute_rdp(sample_rate=0.02, noise_multiplier=1.3, steps=1)
    np.testing.assert_allclose(compute_rdp(sample_rate=0.02, noise_multiplier=1.3, steps=250), 250 * one, rtol=1e-15)


def test_rdp_special_cases():
    assert np.all(compute_rdp(sample_rate=0.0, noise_multiplier=1.0, steps=10) == 0)
    assert np.all(compute_rdp(sample_rate=0.3, noise_multiplier=1.0, steps=0) == 0)
    assert np.all(np.isinf(compute_rdp(sample_rate=0.3, noise_multiplier=0.0, steps=1)))
    assert np.all(compute_rdp(sample_rate=0.0, noise_multiplier=0.0, steps=5) == 0)


@pytest.mark.parametrize("q,sigma,steps,delta", list(itertools.product(SAMPLE_RATES, NOISE_MULTIPLIERS, STEPS, DELTAS)))
def test_rdp_epsilon_matches_opacus_conversion(q, sigma, steps, delta, reference_rdp, opacus_rdp):
    """Epsilon never below Opacus' (same improved conversion, Balle et al. 2020 Thm. 21)."""
    ours = rdp_to_epsilon(orders=DEFAULT_ORDERS, rdp=compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=steps),
                          delta=delta)
    ref_eps, ref_order = opacus_rdp.get_privacy_spent(orders=list(DEFAULT_ORDERS), rdp=steps * reference_rdp[(q, sigma)],
                                                      delta=delta)
    assert ours.value >= ref_eps * (1 - 1e-9)
    assert ours.value <= ref_eps * (1 + 1e-5) + 1e-12
    assert ours.accountant == "rdp" and ours.delta == delta


@pytest.mark.parametrize("q,sigma,steps,delta", list(itertools.product(SAMPLE_RATES, (0.8, 2.0), STEPS, DELTAS)))
def test_rdp_epsilon_matches_dp_accounting_at_integer_orders(q, sigma, steps, delta, dpacct_rdp):
    ref_rdp = steps * dpacct_rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, INTEGER_ORDERS)
    ref_eps, ref_order = dpacct_rdp.compute_epsilon(INTEGER_ORDERS, ref_rdp, delta)
    ours = rdp_to_epsilon(
        orders=INTEGER_ORDERS,
        rdp=compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=steps, orders=INTEGER_ORDERS),
        delta=delta,
    )
    assert ours.value >= ref_eps * (1 - 1e-9)
    assert ours.value <= ref_eps * (1 + 1e-5) + 1e-12
    assert ours.order == ref_order


def test_conversion_formula_by_hand():
    """One order, numbers worked out by hand: eps = r + log(1 - 1/a) - (log d + log a)/(a - 1)."""
    r, a, d = 0.5, 8.0, 1e-5
    expected = r + math.log(7 / 8) - (math.log(1e-5) + math.log(8)) / 7
    result = rdp_to_epsilon(orders=[a], rdp=[r], delta=d)
    assert result == Epsilon(value=pytest.approx(expected, rel=1e-15), delta=d, accountant="rdp", order=8.0)


def test_conversion_gives_zero_when_total_variation_is_below_delta():
    """Bretagnolle-Huber: TV <= sqrt(1 - exp(-KL)) <= delta when rdp <= -log(1 - delta^2)."""
    d = 1e-3
    tiny = -math.log1p(-(d * d)) * 0.99
    assert rdp_to_epsilon(orders=[2.0, 3.0], rdp=[tiny, tiny], delta=d).value == 0.0


def test_conversion_picks_the_best_order():
    orders = np.array([2.0, 4.0, 32.0])
    rdp = np.array([0.1, 0.2, 5.0])
    result = rdp_to_epsilon(orders=orders, rdp=rdp, delta=1e-5)
    per_order = rdp + np.log1p(-1 / orders) - (math.log(1e-5) + np.log(orders)) / (orders - 1)
    assert result.order == orders[np.argmin(per_order)]
    assert result.value == pytest.approx(per_order.min(), rel=1e-15)


def test_infinite_rdp_gives_infinite_epsilon():
    result = rdp_to_epsilon(orders=[2.0, 3.0], rdp=[np.inf, np.inf], delta=1e-5)
    assert math.isinf(result.value) and result.order is None


def test_default_orders_are_a_read_only_grid_of_fractional_and_integer_orders():
    assert DEFAULT_ORDERS[0] == 1.1 and DEFAULT_ORDERS[-1] == 4096
    assert np.all(np.diff(DEFAULT_ORDERS) > 0)
    assert np.any(DEFAULT_ORDERS != np.round(DEFAULT_ORDERS))
    assert set(range(2, 65)) <= set(DEFAULT_ORDERS.tolist())
    with pytest.raises(ValueError):
        DEFAULT_ORDERS[0] = 2.0


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(sample_rate=1.5, noise_multiplier=1.0, steps=1), "sample_rate"),
        (dict(sample_rate=-0.1, noise_multiplier=1.0, steps=1), "sample_rate"),
        (dict(sample_rate=0.1, noise_multiplier=-1.0, steps=1), "noise_multiplier"),
        (dict(sample_rate=0.1, noise_multiplier=float("nan"), steps=1), "noise_multiplier"),
        (dict(sample_rate=0.1, noise_multiplier=1.0, steps=-1), "steps"),
        (dict(sample_rate=0.1, noise_multiplier=1.0, steps=2.5), "steps"),
        (dict(sample_rate=0.1, noise_multiplier=1.0, steps=1, orders=[0.5, 2.0]), "orders"),
        (dict(sample_rate=0.1, noise_multiplier=1.0, steps=1, orders=[1.0]), "orders"),
    ],
)
def test_compute_rdp_rejects_bad_input_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        compute_rdp(**kwargs)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(orders=[2.0], rdp=[0.1], delta=0.0), "delta"),
        (dict(orders=[2.0], rdp=[0.1], delta=1.0), "delta"),
        (dict(orders=[2.0, 3.0], rdp=[0.1], delta=1e-5), "rdp"),
        (dict(orders=[2.0], rdp=[-0.1], delta=1e-5), "rdp"),
    ],
)
def test_rdp_to_epsilon_rejects_bad_input_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        rdp_to_epsilon(**kwargs)


def test_compute_rdp_requires_keyword_arguments():
    with pytest.raises(TypeError):
        compute_rdp(0.1, 1.0, 10)  # type: ignore[misc]


def _binomial_rdp_at_high_precision(q: float, sigma: float, alpha: int) -> float:
    """RDP of one step at an integer order from the closed form [Mironov, Talwar, Zhang 2019, Sec. 3.3],
    A = sum_k C(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 sigma^2)), summed at 60 digits."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(60):
        q_, s2 = mpmath.mpf(q), mpmath.mpf(sigma) ** 2
        a = mpmath.fsum(
            mpmath.binomial(alpha, k) * (1 - q_) ** (alpha - k) * q_**k * mpmath.exp((k * k - k) / (2 * s2))
            for k in range(alpha + 1)
        )
        return float(mpmath.log(a) / (alpha - 1))


@pytest.mark.parametrize(
    "orders",
    [
        [80, 2],
        [2, 80],
        [1024, 3.5, 80, 80, 2, 1.5, 200, 65],
        [65],
        [300, 100, 1.25, 64, 64, 700],
        [7.75, 129, 2, 129, 1.01],
    ],
)
def test_any_list_of_orders_gives_each_orders_own_rdp(orders, quadrature_log_a):
    """Orders in any position, integer orders above 64 first, duplicates and fractional orders: each
    value is that order's RDP (integer orders: 60-digit binomial sum; fractional: 50-digit quadrature)."""
    q, sigma = 0.01, 1.1
    ours = compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=3, orders=orders)
    assert ours.shape == (len(orders),)
    for alpha, value in zip(orders, ours):
        if float(alpha).is_integer():
            exact = 3 * _binomial_rdp_at_high_precision(q, sigma, int(alpha))
        else:
            exact = 3 * quadrature_log_a(q, sigma, alpha) / (alpha - 1)
        assert value >= exact * (1 - 1e-12), alpha
        assert value <= exact * (1 + 1e-6) + 1e-15, alpha


def test_issue_example_order_80_before_order_2():
    """The reported case: orders=[80, 2] gave RDP(80) = 2.96e-07 (uninitialised memory)."""
    both = compute_rdp(sample_rate=0.01, noise_multiplier=1.1, steps=1, orders=[80, 2])
    alone = [compute_rdp(sample_rate=0.01, noise_multiplier=1.1, steps=1, orders=[a])[0] for a in (80, 2)]
    np.testing.assert_array_equal(both, alone)
    assert both[0] == pytest.approx(_binomial_rdp_at_high_precision(0.01, 1.1, 80), rel=1e-9)


# Regimes where the best RDP order lies above 64 (epsilon well below 0.1): the grid used to end
# 64, 80, 96, 128, 256, 512, 1024 and gave up to 1.9x the best order's epsilon there.
SMALL_EPSILON_REGIMES = [
    (1e-4, 10.0, 1, 1e-8),  # best order ~1840, epsilon ~0.0054
    (1e-4, 5.0, 100, 1e-5),  # best order ~460, epsilon ~0.0096
    (256 / 60000, 5.0, 1, 1e-5),  # best order ~270, epsilon ~0.018
    (1e-3, 10.0, 100, 1e-8),
]


@pytest.mark.parametrize("q,sigma,steps,delta", SMALL_EPSILON_REGIMES)
def test_default_orders_are_tight_where_the_best_order_is_large(q, sigma, steps, delta, dpacct_pld_epsilon):
    """Against dp-accounting's RDP accountant at integer orders 0.2% apart around our best order (the
    best-order epsilon): within 2.5%; and never below dp-accounting's PLD lower bound (never under-reports)."""
    accountant_module = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
    dp_accounting = pytest.importorskip("dp_accounting")
    ours = rdp_to_epsilon(orders=DEFAULT_ORDERS, rdp=compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=steps),
                          delta=delta)
    assert 64 < ours.order < 4096
    fine = np.unique(np.round(np.geomspace(0.6 * ours.order, 1.6 * ours.order, 250)))
    reference = accountant_module.RdpAccountant(orders=list(fine))
    reference.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    best_order_epsilon, best_order = reference.get_epsilon_and_optimal_order(delta)
    assert fine[0] < best_order < fine[-1]  # the window holds the best integer order
    assert ours.value >= best_order_epsilon * (1 - 1e-9)
    assert ours.value <= best_order_epsilon * 1.025
    assert ours.value >= dpacct_pld_epsilon(q, sigma, steps, delta, False)


# ---- noise too small for a float ------------------------------------------------------------------

TINY_NOISE = (1e-155, 1e-160, 1e-200, 1e-300, 5e-324)  # below sqrt(smallest normal float) ~ 1.5e-154


@pytest.mark.parametrize("sigma", TINY_NOISE)
@pytest.mark.parametrize("q", [0.01, 0.5, 1.0])
def test_noise_too_small_for_a_float_gives_infinite_rdp_and_epsilon_not_nan(q, sigma):
    """Noise multiplier 1e-200 or 1e-300 (`dpw privacy dpsgd --accountant rdp`, `dpw run`, `dpw study
    --plan`): 1/sigma^2 overflowed in the fractional series, inf - inf gave NaN at every fractional order,
    and rdp_to_epsilon raised 'rdp values must be >= 0 ... NaN' after RuntimeWarnings. The RDP is beyond
    float range there: inf at every order (an upper bound), epsilon inf, no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rdp = compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=100)
        result = rdp_to_epsilon(orders=DEFAULT_ORDERS, rdp=rdp, delta=1e-5)
    assert np.all(rdp == np.inf)
    assert result.value == math.inf and result.order is None


@pytest.mark.parametrize("sigma", [1.6e-154, 1e-153, 1e-152, 2e-152, 1e-151, 1e-150])
def test_noise_near_the_float_limit_gives_an_upper_bound_at_every_order_never_nan(sigma):
    """Just above the limit some orders' series overflow (inf there, an upper bound) and the others stay
    finite. A finite value lies between log(q^alpha e^(alpha(alpha-1)/(2 sigma^2)))/(alpha-1) (the k = alpha
    term of A_alpha alone: a lower bound on the exact RDP) and alpha/(2 sigma^2) (the full batch, which
    dominates any sample rate)."""
    orders = np.array([1.01, 1.5, 2.0, 3.0, 10.5, 64.0, 1000.5, 4096.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rdp = compute_rdp(sample_rate=0.01, noise_multiplier=sigma, steps=1, orders=orders)
        result = rdp_to_epsilon(orders=orders, rdp=rdp, delta=1e-5)
    assert not np.any(np.isnan(rdp)) and result.value > 1e290
    integer = (orders == np.round(orders)) & np.isfinite(rdp)
    a = orders[integer]
    lower = a * math.log(0.01) / (a - 1) + a / (2 * sigma**2)
    assert np.all(rdp[integer] >= lower * (1 - 1e-12))
    finite = np.isfinite(rdp)
    assert np.all(rdp[finite] <= orders[finite] / (2 * sigma**2) * (1 + 1e-12))


@pytest.mark.parametrize("sigma", [1e-3, 1e-50, 1e-100, 1e-150, 1e-152])
def test_small_noise_rdp_is_never_below_dp_accounting(sigma, dpacct_rdp):
    """dp-accounting's subsampled Gaussian at small noise (it gives NaN at 1e-160 and divides by zero at
    1e-300): ours is at least its value at every order (inf included), within 1e-9 at integer orders."""
    orders = np.array([1.5, 2.0, 3.0, 10.0, 64.0])
    ours = compute_rdp(sample_rate=0.01, noise_multiplier=sigma, steps=1, orders=orders)
    ref = np.asarray(dpacct_rdp._compute_rdp_poisson_subsampled_gaussian(0.01, sigma, orders))
    assert np.all(ours >= ref * (1 - 1e-12))
    finite = np.isfinite(ours) & (orders == np.round(orders))
    np.testing.assert_allclose(ours[finite], ref[finite], rtol=1e-9)


def test_rdp_at_ordinary_noise_is_unchanged_by_the_tiny_noise_guards():
    """Values computed before the guards for tiny noise were added (bit for bit)."""
    orders = [1.5, 2.0, 10.5, 32.0, 256.0]
    pinned = {
        (0.01, 1.1): [9.554528573365792e-05, 0.0001285100816051647, 0.0009672713052503869, 8.469416433675969,
                      101.16189429002881],
        (256 / 60000, 0.8): [5.066010152482425e-05, 6.864174682734652e-05, 2.1718821033294127, 19.36704784854233,
                             194.52167790760222],
        (0.5, 3.0): [0.021413356321709154, 0.02895645308460924, 0.19854115047307655, 1.0967401104738406,
                     13.526356817425327],
    }
    for (q, sigma), values in pinned.items():
        np.testing.assert_array_equal(compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=1, orders=orders),
                                      values)


def test_steps_times_an_rdp_past_float_range_is_inf_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rdp = compute_rdp(sample_rate=1.0, noise_multiplier=1e-150, steps=10**12, orders=[2.0, 3.0])
        sub = compute_rdp(sample_rate=0.01, noise_multiplier=1e-150, steps=10**12, orders=[2.0, 3.0])
    assert np.all(rdp == np.inf) and np.all(sub == np.inf)
