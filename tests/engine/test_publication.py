"""Which epsilon of a run is publishable, whether it holds, and how user data is named outside."""

from __future__ import annotations

import pytest

from engine.publication import (
    carries_guarantee,
    epsilon_label,
    pate_publishable,
    public_dataset_name,
    publishable_epsilon,
    publishable_pate_curve,
    randomness,
)


def test_pate_publishes_the_smaller_of_data_independent_and_released():
    assert pate_publishable(4.0, 2.5) == (2.5, "pate-released")
    assert pate_publishable(2.0, 2.5) == (2.0, "pate-di")
    assert pate_publishable(3.0, None) == (3.0, "pate-di")
    assert pate_publishable(None, None) == (None, None)
    run = {"mechanism": "pate", "epsilon": 1.0, "accountant": "pate-dd", "delta": 1e-5, "config": {"reproducible_noise": False},
           "summary": {"epsilon_data_dependent": 1.0, "epsilon_data_independent": 4.0, "epsilon_released": 2.5,
                       "delta": 1e-5}}
    eps = publishable_epsilon(run)
    assert (eps.value, eps.accountant, eps.delta, eps.guarantee) == (2.5, "pate-released", 1e-5, True)


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


def test_the_publishable_pate_curve_drops_to_the_release_only_when_lower():
    x, y = publishable_pate_curve([100, 200], [2.0, 4.0], (200, 2.5))
    assert list(x) == [100, 200, 200] and list(y) == [2.0, 4.0, 2.5]
    x, y = publishable_pate_curve([100, 200], [2.0, 4.0], (200, 5.0))
    assert list(y) == [2.0, 4.0]


@pytest.mark.parametrize("dataset, name", [
    ("mnist", "mnist"),
    ("/home/alice/patients/cohort-2024.csv", "cohort-2024.csv"),
    ("patients/cohort 2024/data.npz", "data.npz"),
    ("C:\\Users\\alice\\patients\\cohort.csv", "cohort.csv"),
    ("../../x.csv", "x.csv"),
])
def test_user_data_is_named_by_its_file_name_only(dataset, name):
    assert public_dataset_name(dataset) == name
