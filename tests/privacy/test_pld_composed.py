"""PLD composition of different subsampled Gaussian runs (a composition study's epsilon), against
Google's dp-accounting: its connect-the-dots PLDs composed (an upper bound, like ours) and its
optimistic privacy buckets composed (a lower bound on the true epsilon)."""

from __future__ import annotations

import logging

import pytest

from engine.privacy.pld import SubsampledGaussian, pld_epsilon, pld_epsilon_composed

GRID = [
    [SubsampledGaussian(0.01, 1.0, 300), SubsampledGaussian(0.02, 1.5, 200)],
    [SubsampledGaussian(0.05, 0.8, 100), SubsampledGaussian(0.01, 2.0, 1000), SubsampledGaussian(0.1, 1.2, 50)],
    [SubsampledGaussian(0.2, 3.0, 40), SubsampledGaussian(0.2, 0.9, 10)],
]


def reference(mechanisms, delta: float, pessimistic: bool) -> float:
    pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    logging.getLogger().setLevel(logging.ERROR)
    total = None
    for m in mechanisms:
        one = pld.from_gaussian_mechanism(m.noise_multiplier, sampling_prob=m.sample_rate,
                                          pessimistic_estimate=pessimistic, use_connect_dots=pessimistic,
                                          value_discretization_interval=1e-4).self_compose(m.steps)
        total = one if total is None else total.compose(one)
    return float(total.get_epsilon_for_delta(delta))


@pytest.mark.parametrize("mechanisms", GRID)
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_composed_runs_match_dp_accounting_and_bound_the_true_epsilon(mechanisms, delta):
    ours = pld_epsilon_composed(mechanisms=mechanisms, delta=delta)
    upper = reference(mechanisms, delta, pessimistic=True)
    lower = reference(mechanisms, delta, pessimistic=False)
    assert ours.accountant == "pld" and ours.delta == delta
    assert ours.value >= lower
    assert ours.value == pytest.approx(upper, rel=1e-4)


def test_runs_differing_only_in_free_settings_are_one_self_composition():
    """Learning rate and clipping norm cost nothing: 3 runs of 200 steps are 600 steps of one run."""
    runs = [SubsampledGaussian(0.01, 1.1, 200)] * 3
    alone = pld_epsilon(sample_rate=0.01, noise_multiplier=1.1, steps=600, delta=1e-5)
    assert pld_epsilon_composed(mechanisms=runs, delta=1e-5).value == alone.value


def test_composition_is_never_below_its_most_expensive_run():
    runs = GRID[1]
    worst = max(pld_epsilon(sample_rate=m.sample_rate, noise_multiplier=m.noise_multiplier, steps=m.steps,
                            delta=1e-5).value for m in runs)
    assert pld_epsilon_composed(mechanisms=runs, delta=1e-5).value > worst
    assert pld_epsilon_composed(mechanisms=[], delta=1e-5).value == 0.0
