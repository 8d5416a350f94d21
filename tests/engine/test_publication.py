"""Which epsilon of a run is publishable, whether it holds, and how user data is named outside."""

from __future__ import annotations

import pytest

from engine.publication import (
    carries_guarantee,
    epsilon_label,
    pate_publishable,
    pate_released_estimate,
    public_dataset_name,
    publishable_epsilon,
    randomness,
)


def test_pate_states_its_data_independent_bound_and_shows_the_release_as_an_estimate():
    """The smooth-sensitivity release is safe to show but bounds nothing: it was stated as the
    guarantee whenever it was below the data-independent bound."""
    assert pate_publishable(4.0) == (4.0, "pate-di")
    assert pate_publishable(None) == (None, None)
    run = {"mechanism": "pate", "epsilon": 1.0, "accountant": "pate-dd", "delta": 1e-5,
           "config": {"reproducible_noise": False, "aggregator": "confident"},
           "summary": {"epsilon_data_dependent": 1.0, "epsilon_data_independent": 4.0, "epsilon_released": 2.5,
                       "delta": 1e-5}}
    eps = publishable_epsilon(run)
    assert (eps.value, eps.accountant, eps.delta, eps.guarantee) == (4.0, "pate-di", 1e-5, True)
    assert pate_released_estimate(run) == 2.5
    from_votes = dict(run, summary=dict(run["summary"], release={"parameters_from_data": True}))
    assert pate_released_estimate(from_votes) is None and publishable_epsilon(from_votes).value == 4.0
    assert pate_released_estimate(dict(run, config=dict(run["config"], aggregator="lnmax"))) is None
    stored_older = dict(run, epsilon=2.5, accountant="pate-released", summary={})  # as older versions stored it
    assert publishable_epsilon(stored_older).value is None


def test_the_released_estimate_falls_below_the_data_dependent_cost_on_a_low_noise_draw():
    """Why the release is never the guarantee: its noise is centred on the data-dependent cost."""
    import numpy as np

    from engine.privacy import pate_smooth

    rng = np.random.default_rng(0)
    votes = np.zeros((300, 10))
    for row, top in zip(votes, rng.integers(0, 10, 300)):
        row[top] = rng.integers(150, 250)
        row[(top + 1) % 10] = 250 - row[top]
    settings = dict(mechanism="confident", threshold=200.0, sigma1=150.0, sigma2=40.0)
    fixed = pate_smooth.data_independent_parameters(num_teachers=250, num_queries=300, num_classes=10, delta=1e-5,
                                                    **settings)
    released = {z: pate_smooth.release_epsilon(votes=votes, delta=1e-5, noise=z, order=fixed.order, beta=fixed.beta,
                                                sigma_ss=fixed.sigma_ss, num_teachers=250, **settings)
                for z in (-2.0, 0.0)}
    below = released[-2.0]
    assert below.epsilon_released < below.epsilon_data_dependent_at_order < released[0.0].epsilon_released


def test_reproducible_noise_means_no_guarantee_whatever_the_number():
    base = {"mechanism": "dpsgd", "epsilon": 3.0, "delta": 1e-5, "accountant": "pld"}
    secret = dict(base, config={"reproducible_noise": False, "noise_sampler": "hardened"})
    seeded = dict(base, config={"reproducible_noise": True, "noise_sampler": "standard"})
    assert carries_guarantee(secret) and not carries_guarantee(seeded)
    assert randomness(secret) == {"privacy_noise": "secret", "noise_sampler": "hardened"}
    assert epsilon_label(secret) == "3" and epsilon_label(seeded) == "3 (no guarantee)"
    # What the engine recorded wins over the config; a config older than the setting was seeded.
    recorded = dict(seeded, summary={"randomness": {"privacy_noise": "secret", "noise_sampler": "standard"}})
    assert carries_guarantee(recorded)
    assert randomness(dict(base, config={"seed": 0}))["privacy_noise"] == "seeded"
    assert epsilon_label({"mechanism": "none"}) == "∞" and not carries_guarantee({"mechanism": "none"})


@pytest.mark.parametrize("dataset, name", [
    ("mnist", "mnist"),
    ("/home/alice/patients/cohort-2024.csv", "cohort-2024.csv"),
    ("patients/cohort 2024/data.npz", "data.npz"),
    ("C:\\Users\\alice\\patients\\cohort.csv", "cohort.csv"),
    ("../../x.csv", "x.csv"),
])
def test_user_data_is_named_by_its_file_name_only(dataset, name):
    assert public_dataset_name(dataset) == name
