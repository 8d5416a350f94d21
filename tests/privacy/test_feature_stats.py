"""DP feature statistics (engine.privacy.feature_stats) and their composition with DP-SGD training,
against dp-accounting (RDP and PLD) and closed forms."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from engine.privacy import DEFAULT_ORDERS, LiveAccountant, compute_rdp, dpsgd_epsilon, rdp_to_epsilon
from engine.privacy.accountants import calibrate_noise_multiplier, max_steps_within_budget
from engine.privacy.feature_stats import MIN_STD, gaussian_rdp, noisy_moments


def test_gaussian_rdp_is_alpha_over_two_sigma_squared():
    orders = np.array([1.5, 2.0, 10.0, 100.0])
    np.testing.assert_array_equal(gaussian_rdp(noise_multiplier=4.0, orders=orders), orders / 32.0)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="noise_multiplier"):
            gaussian_rdp(noise_multiplier=bad, orders=orders)


def test_noisy_moments_are_the_exact_moments_plus_noise_of_the_stated_scale():
    rng = np.random.default_rng(1)
    z = rng.uniform(-1, 1, size=(2000, 5)) * np.array([1.0, 0.5, 0.2, 0.9, 0.01])
    exact_mean, exact_std = z.mean(axis=0), z.std(axis=0)
    mean, std = noisy_moments(z_sum=z.sum(0), z_sq_sum=(z**2).sum(0), count=len(z), noise_multiplier=1e-9,
                              rng=np.random.default_rng(0))
    np.testing.assert_allclose(mean, exact_mean, atol=1e-9)
    np.testing.assert_allclose(std, np.maximum(exact_std, MIN_STD), rtol=1e-6)
    # Noise on each sum has std noise_multiplier * sqrt(2F): the mean's error is that over n.
    draws = np.array([noisy_moments(z_sum=z.sum(0), z_sq_sum=(z**2).sum(0), count=len(z), noise_multiplier=3.0,
                                    rng=np.random.default_rng(s))[0] for s in range(400)])
    expected = 3.0 * math.sqrt(2 * 5) / len(z)
    assert 0.85 * expected < (draws - exact_mean).std() < 1.15 * expected


def test_noisy_moments_stay_in_range_whatever_the_noise():
    mean, std = noisy_moments(z_sum=np.zeros(3), z_sq_sum=np.zeros(3), count=1, noise_multiplier=100.0,
                              rng=np.random.default_rng(0))
    assert np.all(np.abs(mean) <= 1) and np.all((std >= MIN_STD) & (std <= 1))


@pytest.mark.parametrize("q,sigma,steps,stats_sigma,delta", [(0.01, 1.1, 1000, 10.0, 1e-5),
                                                             (64 / 455, 1.0, 100, 5.0, 1e-4),
                                                             (0.001, 2.0, 10, 20.0, 1e-6)])
def test_statistics_compose_with_training_as_dp_accounting_composes_them(q, sigma, steps, stats_sigma, delta,
                                                                         dpacct_rdp):
    """One Gaussian release composed with `steps` subsampled Gaussian steps: at most dp-accounting's RDP
    accountant at our integer orders (ours adds fractional ones), never below dp-accounting's PLD lower
    bound (optimistic discretisation) of the same composition, and the sum of the two RDP curves."""
    dp_accounting = pytest.importorskip("dp_accounting")
    pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    ours = dpsgd_epsilon(sample_rate=q, noise_multiplier=sigma, steps=steps, delta=delta,
                         statistics_noise_multiplier=stats_sigma)
    assert ours.accountant == "rdp"
    event = dp_accounting.ComposedDpEvent([
        dp_accounting.GaussianDpEvent(stats_sigma),
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                                          steps),
    ])
    integer = DEFAULT_ORDERS[DEFAULT_ORDERS == np.round(DEFAULT_ORDERS)]
    reference = dp_accounting.rdp.RdpAccountant(orders=list(integer)).compose(event)
    assert ours.value <= reference.get_epsilon(delta) * (1 + 1e-9)  # ours also has fractional orders
    lower = pld.from_gaussian_mechanism(stats_sigma, pessimistic_estimate=False, value_discretization_interval=1e-3)
    training = pld.from_gaussian_mechanism(sigma, sampling_prob=q, pessimistic_estimate=False,
                                           value_discretization_interval=1e-3).self_compose(steps)
    assert ours.value >= lower.compose(training).get_epsilon_for_delta(delta)
    # And by hand: the two RDP curves add up.
    by_hand = rdp_to_epsilon(orders=DEFAULT_ORDERS, delta=delta, rdp=compute_rdp(
        sample_rate=q, noise_multiplier=sigma, steps=steps) + DEFAULT_ORDERS / (2 * stats_sigma**2))
    assert ours == by_hand


def test_live_accountant_counts_the_statistics_from_step_zero():
    q, sigma, stats_sigma, delta = 64 / 455, 1.0, 10.0, 1e-4
    acc = LiveAccountant(sample_rate=q, noise_multiplier=sigma, delta=delta, statistics_noise_multiplier=stats_sigma)
    alone = rdp_to_epsilon(orders=DEFAULT_ORDERS, rdp=DEFAULT_ORDERS / (2 * stats_sigma**2), delta=delta)
    assert acc.epsilon() == alone and acc.epsilon().value > 0
    acc.step(120)
    expected = dpsgd_epsilon(sample_rate=q, noise_multiplier=sigma, steps=120, delta=delta,
                             statistics_noise_multiplier=stats_sigma)
    assert acc.epsilon() == expected == acc.epsilon_reported()  # "pld" asked, "rdp" given: it covers both
    assert acc.epsilon_reported().accountant == "rdp"
    assert expected.value > dpsgd_epsilon(sample_rate=q, noise_multiplier=sigma, steps=120, delta=delta,
                                          accountant="rdp").value


def test_budget_and_calibration_cover_the_statistics():
    q, delta, stats_sigma = 64 / 455, 1e-4, 5.0
    steps = max_steps_within_budget(sample_rate=q, noise_multiplier=1.0, delta=delta, budget=3.0,
                                    statistics_noise_multiplier=stats_sigma)
    def eps(t, s=1.0):
        return dpsgd_epsilon(sample_rate=q, noise_multiplier=s, steps=t, delta=delta,
                             statistics_noise_multiplier=stats_sigma).value
    assert eps(steps) <= 3.0 < eps(steps + 1)
    assert max_steps_within_budget(sample_rate=q, noise_multiplier=1.0, delta=delta, budget=0.01,
                                   statistics_noise_multiplier=0.5) == 0  # the statistics alone exceed it
    sigma = calibrate_noise_multiplier(sample_rate=q, steps=143, target_epsilon=2.0, delta=delta,
                                       statistics_noise_multiplier=stats_sigma)
    assert eps(143, sigma) <= 2.0 < eps(143, round(sigma - 1e-3, 6))


@pytest.mark.parametrize("sigma", [1e-155, 1e-200, 5e-324])
def test_gaussian_rdp_of_noise_too_small_for_a_float_is_inf_without_a_warning(sigma):
    """sigma^2 is no normal float below ~1.5e-154 (it loses precision, then is 0): inf, not a division
    warning; at 1e-150 the closed form still holds."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.all(gaussian_rdp(noise_multiplier=sigma, orders=[1.5, 2.0, 100.0]) == math.inf)
        assert dpsgd_epsilon(sample_rate=0.01, noise_multiplier=1.0, steps=10, delta=1e-5,
                             statistics_noise_multiplier=sigma).value == math.inf
    np.testing.assert_array_equal(gaussian_rdp(noise_multiplier=1e-150, orders=[2.0]), [2.0 / (2.0 * 1e-300)])
