"""The training loop in-process on built-in data: reproducible, non-private baseline, chunking."""

import torch

from engine.config import RunConfig
from engine.runs import prepare


def run_losses(**values):
    events = []
    prepared = prepare(RunConfig(**values), emit=lambda t, **p: events.append({"type": t, **p}))
    result = prepared.train()
    losses = [e["value"] for e in events if e["type"] == "metric" and e["name"] == "train_loss"]
    return result, losses, events, prepared


BASE = dict(dataset="digits", noise_multiplier=1.0, expected_batch_size=64, epochs=2, learning_rate=0.5, seed=5)


def test_same_seed_gives_the_same_run_and_another_seed_does_not():
    _, a, _, _ = run_losses(**BASE)
    _, b, _, _ = run_losses(**BASE)
    _, c, _, _ = run_losses(**{**BASE, "seed": 6})
    assert a == b
    assert a != c


def test_physical_chunks_do_not_change_the_update():
    _, whole, _, p1 = run_losses(**BASE, max_physical_batch_size=512)
    _, chunked, _, p2 = run_losses(**BASE, max_physical_batch_size=7)
    assert torch.allclose(torch.tensor(whole), torch.tensor(chunked), rtol=1e-4, atol=1e-5)
    for a, b in zip(p1.model.parameters(), p2.model.parameters()):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5)


def test_non_private_baseline_trains_without_privacy_events():
    result, losses, events, _ = run_losses(dataset="digits", mechanism="none", expected_batch_size=64, epochs=3,
                                          learning_rate=0.5)
    assert result.epsilon is None
    assert not [e for e in events if e["type"] == "privacy"]
    assert result.test_accuracy > 0.8
    assert losses[-1] < losses[0]


def test_dpsgd_on_digits_learns():
    result, losses, _, _ = run_losses(**{**BASE, "epochs": 8})
    assert result.test_accuracy > 0.7
    assert result.epsilon.accountant == "pld"
