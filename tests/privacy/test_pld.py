"""engine.privacy.pld against dp-accounting's PLD, Opacus' PRV accountant and closed forms."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from engine.privacy import DEFAULT_ORDERS, compute_rdp, pld_delta, pld_epsilon, rdp_to_epsilon

# (q, sigma) pairs chosen so that dp-accounting builds each PLD quickly; every pair is composed
# for one and for 1000 steps, at two deltas. Full batches (q = 1) are checked against the exact
# Gaussian formulas below instead.
SANDWICH_MECHANISMS = [(0.001, 2.0), (0.01, 0.8), (0.1, 2.0), (256 / 60000, 1.1)]
SANDWICH = list(itertools.product(SANDWICH_MECHANISMS, (1, 1000), (1e-5, 1e-6)))


def _ours(q, sigma, steps, delta, **kwargs) -> float:
    return pld_epsilon(sample_rate=q, noise_multiplier=sigma, steps=steps, delta=delta, **kwargs).value


def _rdp(q, sigma, steps, delta) -> float:
    rdp = compute_rdp(sample_rate=q, noise_multiplier=sigma, steps=steps)
    return rdp_to_epsilon(orders=DEFAULT_ORDERS, rdp=rdp, delta=delta).value


@pytest.mark.parametrize("mechanism,steps,delta", SANDWICH)
def test_pld_between_dp_accounting_lower_bound_and_upper_bound_and_below_rdp(mechanism, steps, delta,
                                                                            dpacct_pld_epsilon):
    """optimistic (privacy buckets rounded down) <= ours <= connect-the-dots (1 + 1e-4), and
    ours <= our RDP bound."""
    q, sigma = mechanism
    ours = _ours(q, sigma, steps, delta)
    lower = dpacct_pld_epsilon(q, sigma, steps, delta, False)
    upper = dpacct_pld_epsilon(q, sigma, steps, delta, True)
    assert lower <= ours <= upper * (1 + 1e-4) + 1e-9
    assert ours <= _rdp(q, sigma, steps, delta)


def test_pld_matches_dp_accounting_on_the_mnist_setting(dpacct_pld_epsilon):
    """q = 256/60000, sigma = 1.1, 60 epochs: the setting of the TF Privacy MNIST tutorial."""
    q, sigma, steps, delta = 256 / 60000, 1.1, 14063, 1e-5
    ours = _ours(q, sigma, steps, delta)
    upper = dpacct_pld_epsilon(q, sigma, steps, delta, True)
    assert ours == pytest.approx(upper, rel=1e-4)
    assert ours <= _rdp(q, sigma, steps, delta)


@pytest.mark.parametrize(
    "q,sigma,steps,delta",
    [(256 / 60000, 1.1, 14063, 1e-5), (0.01, 1.0, 1000, 1e-5), (0.5, 1.0, 10, 1e-5)],
)
def test_pld_inside_opacus_prv_error_bounds(q, sigma, steps, delta, opacus_prv_bounds):
    """Gopi et al. 2021's PRV accountant brackets the true epsilon with +-0.01 error bounds."""
    lower, estimate, upper = opacus_prv_bounds(q, sigma, steps, delta)
    ours = _ours(q, sigma, steps, delta)
    assert lower <= ours <= upper
    assert ours == pytest.approx(estimate, abs=2e-3)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-8])
def test_full_batch_single_step_matches_analytic_gaussian_from_above(sigma, delta, closed_forms):
    """q = 1, one step: the Gaussian mechanism, exact by Balle & Wang 2018 (Thm. 8)."""
    exact = closed_forms.gaussian_epsilon(delta, sigma)
    ours = _ours(1.0, sigma, 1, delta)
    assert exact <= ours <= exact * (1 + 1e-5)


@pytest.mark.parametrize("steps", [10, 400])
def test_full_batch_composition_matches_gaussian_with_scaled_noise(steps, closed_forms):
    """T Gaussian steps with noise sigma compose exactly to one with noise sigma / sqrt(T)."""
    sigma, delta = 3.0, 1e-6
    exact = closed_forms.gaussian_epsilon(delta, sigma / math.sqrt(steps))
    ours = _ours(1.0, sigma, steps, delta)
    assert exact <= ours <= exact * (1 + 1e-4)


@pytest.mark.parametrize("q,sigma", [(0.01, 1.0), (0.1, 0.8), (0.5, 2.0), (0.003, 0.6)])
def test_single_subsampled_step_delta_is_an_upper_bound_on_the_exact_curve(q, sigma, closed_forms):
    """One step has a closed-form delta(eps) (half-line tests, both directions): ours must be
    above it everywhere on the curve and close to it."""
    for eps in [0.0, 0.1, 1.0, 4.0]:
        exact = closed_forms.subsampled_gaussian_delta(eps, q, sigma)
        ours = pld_delta(sample_rate=q, noise_multiplier=sigma, steps=1, epsilon=eps)
        assert ours >= exact
        assert ours <= exact * (1 + 1e-3) + 1e-12, eps


@pytest.mark.parametrize("q,sigma", [(0.1, 1.0), (0.02, 0.7)])
def test_single_step_is_exact_on_the_grid_and_above_it_between(q, sigma, closed_forms):
    """Connect-the-dots keeps each bin's P- and Q-mass, so on the grid (eps = k h) the discrete
    delta equals the exact one, and in between it is the chord above the convex curve."""
    h = 1e-3
    for k in (0, 50, 200, 500, 1000):
        exact = closed_forms.subsampled_gaussian_delta(k * h, q, sigma)
        ours = pld_delta(sample_rate=q, noise_multiplier=sigma, steps=1, epsilon=k * h, discretization=h)
        assert ours == pytest.approx(exact, rel=1e-8, abs=1e-14)
        assert ours >= exact
    for eps in (0.0505, 0.2005, 0.7777):
        exact = closed_forms.subsampled_gaussian_delta(eps, q, sigma)
        ours = pld_delta(sample_rate=q, noise_multiplier=sigma, steps=1, epsilon=eps, discretization=h)
        assert exact < ours <= exact * (1 + 1e-3)


@pytest.mark.parametrize("direction", ["remove", "add"])
def test_each_direction_of_one_step_matches_its_closed_form(direction, closed_forms):
    """Both neighbouring directions are discretised and composed; in the DP-SGD range the
    remove direction is the worse one, so the public results cannot show an error in the add
    direction. Check each one on its own (internal helper) at grid points and in between."""
    from engine.privacy import pld as pld_module

    q, sigma, h = 0.3, 1.0, 1e-3
    composed = pld_module._compose_direction(q, sigma, 1, h, direction == "add", 1e-15)
    for eps in (0.0, 0.05, 0.1, 0.2, 0.3, 0.0505, 0.1234):
        exact = closed_forms.subsampled_gaussian_delta(eps, q, sigma, direction)
        ours = pld_module._delta_of(composed, eps)
        assert ours >= exact
        on_grid = abs(eps / h - round(eps / h)) < 1e-9
        assert ours <= exact * (1 + (1e-8 if on_grid else 1e-3)) + 1e-14


def test_pld_delta_and_pld_epsilon_are_consistent():
    q, sigma, steps, delta = 0.02, 1.0, 500, 1e-5
    eps = _ours(q, sigma, steps, delta)
    assert pld_delta(sample_rate=q, noise_multiplier=sigma, steps=steps, epsilon=eps) <= delta * (1 + 1e-6)
    assert pld_delta(sample_rate=q, noise_multiplier=sigma, steps=steps, epsilon=eps * 0.99) > delta


def test_finer_grid_changes_epsilon_only_slightly():
    q, sigma, steps, delta = 256 / 60000, 1.1, 14063, 1e-5
    coarse = _ours(q, sigma, steps, delta, discretization=1e-3)
    fine = _ours(q, sigma, steps, delta, discretization=2e-5)
    default = _ours(q, sigma, steps, delta)
    assert fine <= default <= coarse
    assert default == pytest.approx(fine, rel=1e-4)


def test_pld_special_cases():
    assert _ours(0.0, 1.0, 100, 1e-5) == 0.0
    assert _ours(0.3, 1.0, 0, 1e-5) == 0.0
    assert math.isinf(_ours(0.3, 0.0, 1, 1e-5))
    assert pld_delta(sample_rate=0.3, noise_multiplier=0.0, steps=1, epsilon=1.0) == 1.0
    assert pld_delta(sample_rate=0.0, noise_multiplier=1.0, steps=10, epsilon=0.0) == 0.0
    result = pld_epsilon(sample_rate=0.1, noise_multiplier=1.0, steps=10, delta=1e-5)
    assert result.accountant == "pld" and result.order is None and result.delta == 1e-5


def test_large_epsilon_regime_stays_an_upper_bound_and_finishes():
    """sigma = 0.3 makes epsilon huge (~70); the grid is coarsened automatically, still below RDP."""
    ours = _ours(0.05, 0.3, 50, 1e-5)
    assert 10 < ours <= _rdp(0.05, 0.3, 50, 1e-5)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(sample_rate=2.0, noise_multiplier=1.0, steps=1, delta=1e-5), "sample_rate"),
        (dict(sample_rate=0.1, noise_multiplier=-1.0, steps=1, delta=1e-5), "noise_multiplier"),
        (dict(sample_rate=0.1, noise_multiplier=1.0, steps=-3, delta=1e-5), "steps"),
        (dict(sample_rate=0.1, noise_multiplier=1.0, steps=3, delta=0.0), "delta"),
        (dict(sample_rate=0.1, noise_multiplier=1.0, steps=3, delta=1.5), "delta"),
        (dict(sample_rate=0.1, noise_multiplier=1.0, steps=3, delta=1e-5, discretization=0.0), "discretization"),
    ],
)
def test_pld_epsilon_rejects_bad_input_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        pld_epsilon(**kwargs)


def test_pld_delta_rejects_negative_epsilon():
    with pytest.raises(ValueError, match="epsilon"):
        pld_delta(sample_rate=0.1, noise_multiplier=1.0, steps=3, epsilon=-0.5)


def test_composed_delta_curve_is_decreasing_in_epsilon():
    eps = np.linspace(0.0, 3.0, 4)
    deltas = [pld_delta(sample_rate=0.05, noise_multiplier=1.0, steps=50, epsilon=e) for e in eps]
    assert all(a > b for a, b in zip(deltas, deltas[1:]))


def test_a_loss_beyond_the_grid_gives_an_infinite_epsilon_not_an_error():
    """Sample rate 1 and noise multiplier 0.01: one step's loss is about 1 / (2 sigma^2) = 5000, beyond
    the loss grid; the bound is inf (as for a sample rate just below 1), alone or composed with others
    (the ledger), where it raised 'zero-size array' and broke every ledger and report of the store."""
    from engine.privacy.pld import SubsampledGaussian, pld_epsilon_composed

    for q in (1.0, 0.999):
        assert pld_epsilon(sample_rate=q, noise_multiplier=0.01, steps=1, delta=1e-5).value == math.inf
    mixed = [SubsampledGaussian(sample_rate=1.0, noise_multiplier=0.01, steps=1),
             SubsampledGaussian(sample_rate=0.01, noise_multiplier=1.0, steps=100)]
    assert pld_epsilon_composed(mechanisms=mixed, delta=1e-5).value == math.inf
    assert math.isfinite(pld_epsilon(sample_rate=1.0, noise_multiplier=0.04, steps=1, delta=1e-5).value)


@pytest.mark.parametrize("sigma", [1e-9, 1e-300])
def test_a_vanishing_noise_multiplier_gives_the_sampled_mass_as_delta_not_an_error(sigma):
    """Noise multiplier 1e-9 in a config made its run fail at the end (OverflowError in e^eps on a grid
    step of 1e5) and then broke `dpw ledger` for the whole store. With (almost) no noise, every step
    that samples the example reveals it: delta at any epsilon is the chance it is sampled at all,
    1 - (1 - q)^T, and no finite epsilon holds at a delta below that."""
    from engine.privacy.pld import SubsampledGaussian, pld_epsilon_composed

    q, steps = 0.01, 10
    sampled = -math.expm1(steps * math.log1p(-q))
    assert pld_epsilon(sample_rate=q, noise_multiplier=sigma, steps=steps, delta=1e-5).value == math.inf
    delta = pld_delta(sample_rate=q, noise_multiplier=sigma, steps=steps, epsilon=5.0)
    assert sampled <= delta
    if sigma > 1e-100:  # below, sigma^2 underflows and delta is bounded by 1
        assert delta <= sampled * (1 + 1e-9)
    mixed = [SubsampledGaussian(q, sigma, steps), SubsampledGaussian(0.01, 1.0, 100)]
    assert pld_epsilon_composed(mechanisms=mixed, delta=1e-5).value == math.inf


def test_a_composition_too_wide_for_any_grid_gives_an_infinite_epsilon_not_an_error():
    """A billion full-batch steps at noise 0.5 (epsilon about 1e9): the grid step grew without end
    until ceil(inf) raised. Beyond 2^21 points of step 10 the bound is inf; below that it stays finite."""
    from engine.privacy.pld import SubsampledGaussian, pld_epsilon_composed

    for q, sigma in [(1.0, 0.5), (0.3, 0.2)]:
        assert pld_epsilon(sample_rate=q, noise_multiplier=sigma, steps=10**9, delta=1e-5).value == math.inf
        assert pld_delta(sample_rate=q, noise_multiplier=sigma, steps=10**9, epsilon=10.0) == 1.0
        mixed = [SubsampledGaussian(q, sigma, 10**9), SubsampledGaussian(0.01, 1.0, 100)]
        assert pld_epsilon_composed(mechanisms=mixed, delta=1e-5).value == math.inf
    wide = pld_epsilon(sample_rate=1.0, noise_multiplier=0.5, steps=10**6, delta=1e-5).value
    assert 2e6 <= wide < 2.2e6  # T / (2 sigma^2) = 2e6, plus the spread


@pytest.mark.parametrize("q,sigma,steps", [(1e-9, 1000.0, 1), (1e-20, 1.0, 1000), (1e-9, 1000.0, 10**6)])
def test_a_vanishing_sample_rate_spends_almost_nothing_not_infinity(q, sigma, steps):
    """One step's loss range was narrower than the root finder's tolerance (1e-9), came back empty and
    was taken for a loss beyond the grid: epsilon inf, and `dpw privacy calibrate` claimed no noise
    could reach any target. delta at any epsilon is at most the chance the example is sampled at all,
    q T, below 1e-5 here, so epsilon is 0 at delta 1e-5."""
    from engine.privacy.pld import SubsampledGaussian, pld_epsilon_composed

    assert pld_epsilon(sample_rate=q, noise_multiplier=sigma, steps=steps, delta=1e-5).value == 0.0
    assert pld_delta(sample_rate=q, noise_multiplier=sigma, steps=steps, epsilon=1e-3) <= max(q * steps, 1e-11)
    mixed = [SubsampledGaussian(q, sigma, steps), SubsampledGaussian(1e-3, 1000.0, 1)]
    assert pld_epsilon_composed(mechanisms=mixed, delta=1e-5).value == 0.0
