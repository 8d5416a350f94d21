"""The randomness a privacy proof relies on is secret: not stored, not derivable from `seed`.

Run-level tests train tiny DP-SGD runs on the built-in digits data and PATE runs on a small
breast-cancer setting, and watch the draws the engine really makes (a recording wrapper around the
engine's own sampling and noise functions: the draws still happen as in any run).
"""

import math
import pickle

import numpy as np
import pytest
import torch
from scipy import stats

from engine.config import RunConfig
from engine.dpsgd import mechanism
from engine.pate import aggregation
from engine.randomness import (
    PrivateRandomness,
    SecureGenerator,
    randomness_summary,
    seeded_int,
    seeded_torch_generator,
)
from engine.runs import prepare

DIGITS = dict(dataset="digits", noise_multiplier=1.0, expected_batch_size=64, epochs=1, learning_rate=0.5, seed=7)


# ---- the source itself ------------------------------------------------------------------------


def draws(randomness: PrivateRandomness, purpose: str = "dpsgd_noise") -> torch.Tensor:
    return torch.randn(1000, generator=randomness.torch_generator(purpose))


def test_secret_streams_differ_between_runs_and_seeded_streams_repeat():
    config = RunConfig(**DIGITS)
    assert not torch.equal(draws(PrivateRandomness.for_run(config)), draws(PrivateRandomness.for_run(config)))
    seeded = config.replace(reproducible_noise=True)
    assert torch.equal(draws(PrivateRandomness.for_run(seeded)), draws(PrivateRandomness.for_run(seeded)))
    other_seed = seeded.replace(seed=8)
    assert not torch.equal(draws(PrivateRandomness.for_run(seeded)), draws(PrivateRandomness.for_run(other_seed)))


def test_each_purpose_and_each_request_gets_its_own_stream():
    source = PrivateRandomness(reproducible_noise=True, seed=1)
    first, second = draws(source, "dpsgd_noise"), draws(source, "dpsgd_noise")
    sampling = draws(source, "poisson_sampling")
    assert not torch.equal(first, second) and not torch.equal(first, sampling)
    # ... in the same order in every reproducible run
    again = PrivateRandomness(reproducible_noise=True, seed=1)
    assert torch.equal(draws(again, "dpsgd_noise"), first) and torch.equal(draws(again, "dpsgd_noise"), second)


def test_a_cpu_generator_state_is_not_one_a_64_bit_seed_reaches():
    generator = PrivateRandomness().torch_generator("dpsgd_noise")
    from_seed = torch.Generator().manual_seed(generator.initial_seed())
    assert not torch.equal(generator.get_state(), from_seed.get_state())
    assert not torch.equal(torch.rand(100, generator=generator), torch.rand(100, generator=from_seed))
    # ... and the filled state still gives uniform and Gaussian draws
    assert stats.kstest(torch.rand(100_000, generator=generator).double().numpy(), "uniform").pvalue > 1e-4
    assert stats.kstest(torch.randn(100_000, generator=generator).double().numpy(), "norm").pvalue > 1e-4


def test_the_secret_is_not_printed_or_pickled():
    source = PrivateRandomness()
    assert str(source._root) not in repr(source) and "root" not in repr(source)
    with pytest.raises(TypeError):
        pickle.dumps(source)
    hardened = PrivateRandomness(noise_sampler="hardened").numpy_generator("pate_aggregation")
    assert isinstance(hardened, SecureGenerator) and "key" in repr(hardened) and hardened._key.hex() not in repr(hardened)
    with pytest.raises(TypeError):
        pickle.dumps(hardened)


def test_randomness_summary_names_the_source_and_the_sampler():
    assert randomness_summary(RunConfig(**DIGITS)) == {"privacy_noise": "secret", "noise_sampler": "standard"}
    assert randomness_summary(RunConfig(**DIGITS, reproducible_noise=True, noise_sampler="hardened")) == {
        "privacy_noise": "seeded", "noise_sampler": "hardened"}


def test_seed_derived_generators_accept_the_largest_seed():
    seed = 2**63 - 1
    assert 0 <= seeded_int(seed, "baseline_order") < 2**64
    assert seeded_int(seed, "a") != seeded_int(seed, "b")
    torch.rand(3, generator=seeded_torch_generator(seed, "baseline_order"))
    draws(PrivateRandomness(reproducible_noise=True, seed=seed))


# ---- the hardened generator ---------------------------------------------------------------------


def test_secure_generator_is_a_function_of_its_key_only():
    a, b = SecureGenerator(b"k" * 32), SecureGenerator(b"k" * 32)
    assert np.array_equal(a.uint64(100), b.uint64(100))
    assert not np.array_equal(a.uint64(100), SecureGenerator(b"j" * 32).uint64(100))
    assert not np.array_equal(a.uint64(100), a.uint64(100))  # the counter moves on
    with pytest.raises(ValueError):
        SecureGenerator(b"short")


def test_secure_uniforms_lie_in_the_open_closed_unit_interval_and_are_uniform():
    u = SecureGenerator(b"u" * 32).random(200_000)
    assert u.min() > 0.0 and u.max() <= 1.0
    assert stats.kstest(u, "uniform").pvalue > 1e-4
    assert np.unique(u).size > 199_990  # 53 bits each, not a coarse grid


def test_secure_gaussian_and_laplace_have_their_scale_and_shape():
    generator = SecureGenerator(b"g" * 32)
    k = 200_000
    x = generator.normal(0.0, 2.5, size=k)
    # sum(x^2)/s^2 ~ chi-square(k): a two-sided test at 1e-6.
    p = stats.chi2.cdf(float((x**2).sum()) / 2.5**2, df=k)
    assert 1e-6 < p < 1 - 1e-6
    assert stats.kstest(x / 2.5, "norm").pvalue > 1e-4
    lap = generator.laplace(0.0, 0.7, size=k)
    assert stats.kstest(lap, "laplace", args=(0.0, 0.7)).pvalue > 1e-4
    assert isinstance(generator.standard_normal(), float)


# ---- whole DP-SGD runs ---------------------------------------------------------------------------


def record_run(monkeypatch, **values):
    """Train a run; return (batches, noise per step, final weights, plan event, summary)."""
    batches, noises = [], []
    sample, add_noise = mechanism.poisson_sample, mechanism.add_gaussian_noise

    def recording_sample(*args, **kwargs):
        idx = sample(*args, **kwargs)
        batches.append(idx.clone())
        return idx

    def recording_noise(summed, **kwargs):
        out = add_noise(summed, **kwargs)
        noises.append([o - s for o, s in zip(out, summed)])
        return out

    monkeypatch.setattr(mechanism, "poisson_sample", recording_sample)
    monkeypatch.setattr(mechanism, "add_gaussian_noise", recording_noise)
    events = []
    prepared = prepare(RunConfig(**values), emit=lambda t, **p: events.append({"type": t, **p}))
    result = prepared.train()
    monkeypatch.undo()
    weights = [p.detach().clone() for p in prepared.model.parameters()]
    plan = next(e for e in events if e["type"] == "plan")
    return batches, noises, weights, plan, prepared, result


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def noise_matches(noises, generator, std) -> bool:
    """Does the recorded noise equal std * randn from `generator`, step after step?"""
    for step in noises:
        for n in step:
            if not torch.allclose(std * torch.randn(n.shape, generator=generator), n, atol=1e-5):
                return False
    return True


def test_two_default_runs_differ_in_batches_noise_and_weights(monkeypatch):
    b1, n1, w1, plan, _, _ = record_run(monkeypatch, **DIGITS)
    b2, n2, w2, _, _, _ = record_run(monkeypatch, **DIGITS)
    assert len(b1) == len(b2) > 10
    assert any(not torch.equal(x, y) for x, y in zip(b1, b2))
    assert not torch.equal(n1[0][0], n2[0][0])
    assert not same_weights(w1, w2)
    assert plan["randomness"] == {"privacy_noise": "secret", "noise_sampler": "standard"}


def test_the_noise_cannot_be_rebuilt_from_the_seed_unless_reproducible(monkeypatch):
    """What /work/shared/findings/scripts/noise_from_seed.py did: regenerate every step's noise from the
    seed alone. It works for a reproducible run (so the check can succeed) and fails for a default one."""
    seed, std = DIGITS["seed"], DIGITS["noise_multiplier"] * 1.0

    def from_seed():  # the generators an attacker who knows the seed can build
        old = torch.Generator().manual_seed(seed * 2 + 2)  # the engine's former noise generator
        new = PrivateRandomness(reproducible_noise=True, seed=seed)
        new.torch_generator("poisson_sampling")
        return old, new.torch_generator("dpsgd_noise")

    _, noises, _, _, _, _ = record_run(monkeypatch, **DIGITS)
    old, new = from_seed()
    assert not noise_matches(noises, old, std) and not noise_matches(noises, new, std)

    _, noises, _, plan, _, _ = record_run(monkeypatch, **DIGITS, reproducible_noise=True)
    assert plan["randomness"]["privacy_noise"] == "seeded"
    _, new = from_seed()
    assert noise_matches(noises, new, std)


@pytest.mark.parametrize("sampler", ["standard", "hardened"])
def test_reproducible_noise_gives_identical_runs(monkeypatch, sampler):
    values = dict(DIGITS, reproducible_noise=True, noise_sampler=sampler)
    b1, n1, w1, _, _, _ = record_run(monkeypatch, **values)
    b2, n2, w2, _, _, _ = record_run(monkeypatch, **values)
    assert all(torch.equal(x, y) for x, y in zip(b1, b2))
    assert same_weights(w1, w2)


def test_hardened_runs_are_secret_and_still_learn(monkeypatch, tmp_path):
    values = dict(DIGITS, noise_sampler="hardened", epochs=4)
    b1, _, w1, plan, prepared, result = record_run(monkeypatch, **values)
    b2, _, w2, _, _, _ = record_run(monkeypatch, **dict(values, epochs=1))
    assert any(not torch.equal(x, y) for x, y in zip(b1, b2))
    assert not same_weights(w1, w2)
    assert result.test_accuracy > 0.6
    assert plan["randomness"] == {"privacy_noise": "secret", "noise_sampler": "hardened"}
    summary = prepared.finish(result, store=None, out_dir=tmp_path, emit=lambda *a, **k: None)
    assert summary["randomness"] == plan["randomness"]


def test_the_largest_seed_trains_privately_and_non_privately():
    for mechanism_name in ("dpsgd", "none"):
        prepared = prepare(RunConfig(**dict(DIGITS, seed=2**63 - 1, mechanism=mechanism_name)))
        assert prepared.train().steps_done > 0


def test_a_default_runs_plan_and_summary_record_its_randomness(tmp_path):
    events = []
    prepared = prepare(RunConfig(**DIGITS), emit=lambda t, **p: events.append({"type": t, **p}))
    summary = prepared.finish(prepared.train(), store=None, out_dir=tmp_path, emit=lambda *a, **k: None)
    assert summary["randomness"] == {"privacy_noise": "secret", "noise_sampler": "standard"}
    baseline = prepare(RunConfig(dataset="digits", mechanism="none", epochs=1),
                       emit=lambda t, **p: events.append({"type": t, **p}))
    assert baseline.finish(baseline.train(), store=None, out_dir=tmp_path, emit=lambda *a, **k: None).get(
        "randomness") is None


# ---- PATE -----------------------------------------------------------------------------------------


def released_on_close_votes(config: RunConfig) -> np.ndarray:
    """What GNMax releases on 400 queries whose top two classes are tied, with a run's own generator."""
    votes = np.tile([[50, 50, 0]], (400, 1))
    rng = PrivateRandomness.for_run(config).numpy_generator("pate_aggregation")
    return aggregation.aggregate(votes, aggregator="gnmax", rng=rng, sigma=5.0).labels


@pytest.mark.parametrize("sampler", ["standard", "hardened"])
def test_pate_aggregation_noise_differs_between_runs_unless_reproducible(sampler):
    config = RunConfig(mechanism="pate", dataset="breast-cancer", noise_sampler=sampler)
    assert not np.array_equal(released_on_close_votes(config), released_on_close_votes(config))
    seeded = config.replace(reproducible_noise=True)
    assert np.array_equal(released_on_close_votes(seeded), released_on_close_votes(seeded))


PATE_TINY = dict(mechanism="pate", dataset="breast-cancer", num_teachers=5, teacher_epochs=2, num_queries=60,
                 aggregator="gnmax", gnmax_sigma=3.0, student_epochs=1, seed=3)


def pate_run(**values):
    events = []
    prepared = prepare(RunConfig(**values), emit=lambda t, **p: events.append({"type": t, **p}))
    result = prepared.train()
    labels = [row["label"] for row in result.vote_rows]
    plan = next(e for e in events if e["type"] == "plan")
    return labels, result, plan, prepared


def test_two_pate_runs_release_different_labels_on_close_votes_unless_reproducible():
    """Five teachers with sigma 3 disagree often enough that fresh noise changes some released labels."""
    a, result, plan, prepared = pate_run(**PATE_TINY)
    b, _, _, _ = pate_run(**PATE_TINY)
    assert len(a) == len(b) == 60 and a != b
    assert plan["randomness"] == {"privacy_noise": "secret", "noise_sampler": "standard"}
    assert prepared.summary(result)["randomness"] == plan["randomness"]
    c, rc, _, _ = pate_run(**PATE_TINY, reproducible_noise=True)
    d, rd, _, _ = pate_run(**PATE_TINY, reproducible_noise=True)
    assert c == d and rc.epsilon_released == rd.epsilon_released


def test_a_hardened_pate_run_releases_and_accounts():
    labels, result, plan, _ = pate_run(**PATE_TINY, noise_sampler="hardened")
    assert plan["randomness"]["noise_sampler"] == "hardened"
    assert len(labels) == 60 and result.epsilon_released is not None and math.isfinite(result.epsilon_released)
