"""The training loop in-process on built-in data: reproducible (with reproducible_noise), non-private
baseline, chunking. Secret-noise runs differing from each other: tests/engine/test_randomness.py."""

import math

import pytest
import torch

from engine.config import RunConfig
from engine.dpsgd.trainer import TrainingDiverged
from engine.runs import prepare


def run_losses(**values):
    events = []
    prepared = prepare(RunConfig(**values), emit=lambda t, **p: events.append({"type": t, **p}))
    result = prepared.train()
    losses = [e["value"] for e in events if e["type"] == "metric" and e["name"] == "train_loss"]
    return result, losses, events, prepared


# reproducible_noise: these tests compare runs step by step, so the noise and batches must repeat.
BASE = dict(dataset="digits", noise_multiplier=1.0, expected_batch_size=64, epochs=2, learning_rate=0.5, seed=5,
            reproducible_noise=True)


def test_reproducible_noise_repeats_a_run_exactly_and_another_seed_does_not():
    _, a, _, p1 = run_losses(**BASE)
    _, b, _, p2 = run_losses(**BASE)
    _, c, _, _ = run_losses(**{**BASE, "seed": 6})
    assert a == b
    assert all(torch.equal(x, y) for x, y in zip(p1.model.parameters(), p2.model.parameters()))
    assert a != c


def test_default_runs_of_one_config_differ():
    """Secret noise and sampling: the same config and seed give different losses and weights."""
    values = {**BASE, "reproducible_noise": False, "epochs": 1}
    _, a, _, p1 = run_losses(**values)
    _, b, _, p2 = run_losses(**values)
    assert a != b
    assert not all(torch.equal(x, y) for x, y in zip(p1.model.parameters(), p2.model.parameters()))


def test_non_private_baseline_order_follows_the_seed():
    values = dict(dataset="digits", mechanism="none", expected_batch_size=64, epochs=1, learning_rate=0.5)
    _, a, _, _ = run_losses(**values, seed=2**63 - 1)
    _, b, _, _ = run_losses(**values, seed=2**63 - 1)
    _, c, _, _ = run_losses(**values, seed=1)
    assert a == b and a != c


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


def test_cosine_schedule_decays_from_the_learning_rate_to_zero():
    from engine.dpsgd.trainer import learning_rate_at

    config = RunConfig(**BASE, lr_schedule="cosine")
    rates = [learning_rate_at(config, step, 100) for step in range(101)]
    assert rates[0] == 0.5 and abs(rates[50] - 0.25) < 1e-12 and abs(rates[100]) < 1e-12
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    assert learning_rate_at(RunConfig(**BASE), 70, 100) == 0.5


def test_cosine_schedule_reaches_the_optimizer():
    # With the rate decayed to nearly zero, the last step barely moves the weights; a constant
    # rate moves them by a full step.
    def last_step_change(schedule):
        config = RunConfig(**{**BASE, "epochs": 1}, lr_schedule=schedule)
        prepared = prepare(config)
        before = {}

        def remember(t, **p):
            if t == "metric" and p["name"] == "train_loss" and p["step"] == prepared.plan.steps_planned - 1:
                before.update({n: w.detach().clone() for n, w in prepared.model.named_parameters()})

        from engine.dpsgd.trainer import train

        train(prepared.model, prepared.data, config, prepared.plan, device=torch.device("cpu"), emit=remember)
        return sum(float((w.detach() - before[n]).norm()) for n, w in prepared.model.named_parameters())

    assert last_step_change("cosine") < 0.05 * last_step_change("constant")


def test_every_step_reports_its_training_loss_once_in_step_order():
    """Losses are read one step late (no GPU wait per step): still one per step, the last one included,
    each before that step's test metrics; a stop after step 5 still reports step 5."""
    result, losses, events, _ = run_losses(**BASE)
    loss_steps = [e["step"] for e in events if e["type"] == "metric" and e["name"] == "train_loss"]
    assert loss_steps == list(range(1, result.steps_done + 1)) and all(math.isfinite(v) for v in losses)
    metrics = [(e["step"], e["name"]) for e in events if e["type"] == "metric"]
    for i, (step, name) in enumerate(metrics):
        if name == "test_accuracy":
            assert (step, "train_loss") in metrics[:i]

    calls = iter(range(1000))
    events = []
    prepared = prepare(RunConfig(**BASE), emit=lambda t, **p: events.append({"type": t, **p}))
    stopped = prepared.train(should_stop=lambda: next(calls) >= 5)
    assert stopped.stop_reason == "stopped" and stopped.steps_done == 5
    assert [e["step"] for e in events if e["type"] == "metric" and e["name"] == "train_loss"] == [1, 2, 3, 4, 5]


def test_examples_whose_gradient_is_not_finite_are_left_out_and_the_run_goes_on():
    """A NaN example made the whole noisy sum NaN (its clip factor was NaN), and the run then failed on the
    loss of the private batch, which has no noise: whether and when a run failed told of one example."""
    events = []
    prepared = prepare(RunConfig(**{**BASE, "epochs": 1}), emit=lambda t, **p: events.append({"type": t, **p}))
    prepared.data.x_train[3:] = float("nan")  # only the first three examples are finite
    result = prepared.train()
    assert result.stop_reason == "completed" and result.test_accuracy is not None
    assert all(torch.isfinite(w).all() for w in prepared.model.parameters())
    losses = [e["value"] for e in events if e["type"] == "metric" and e["name"] == "train_loss"]
    assert losses and all(math.isfinite(v) for v in losses)
    warnings = [e["message"] for e in events if e["type"] == "warning"]
    assert len([w for w in warnings if "left out of the step" in w]) == 1  # said once, at the first such step
    assert [e["step"] for e in events if e["type"] == "privacy" and e["accountant"] == "rdp"] == \
        list(range(1, result.steps_done + 1))


def test_weights_that_become_nan_fail_the_run_naming_its_step_with_every_step_taken_accounted():
    events = []
    prepared = prepare(RunConfig(**BASE), emit=lambda t, **p: events.append({"type": t, **p}))
    with torch.no_grad():
        next(prepared.model.parameters())[0] = float("inf")  # every output NaN from the first step on
    with pytest.raises(TrainingDiverged, match=r"the model's weights became NaN or infinite at step 1\b"):
        prepared.train()
    assert not [e for e in events if e["type"] == "metric" and e["name"] == "train_loss"]
    # step 2 ran before step 1's weights were read: it is accounted (its privacy event was emitted)
    assert [e["step"] for e in events if e["type"] == "privacy"] == [1, 2]
