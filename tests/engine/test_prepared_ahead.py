"""A run checked by the runner that trains it (engine.prepared_ahead): `dpw run`'s standby runner checks
the config by preparing the run and trains that preparation once the run is stored; its events reach
the run's stream after it starts, and a refused config is said as the command's own check said it."""

from __future__ import annotations

import pytest
import torch

from engine.config import RunConfig
from engine.errors import ConfigError
from engine.prepared_ahead import prepare_ahead
from engine.runner import execute
from engine.store import Store

DIGITS = dict(name="ahead", dataset="digits", model="mlp", target_epsilon=2.0, delta=1e-5, expected_batch_size=64,
              epochs=2, learning_rate=1.0, optimizer="sgd", evaluations_per_epoch=1, seed=0)


def check_request(config: RunConfig) -> dict:
    return {"check": config.to_dict(), "checked_before": []}


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_run_checked_ahead_is_trained_without_preparing_it_again(tmp_path, monkeypatch, one_thread):
    """Its plan and warnings, emitted while it was checked, are in the run's events after "started";
    the plan states the threads the run trained with, set after the check (engine.runner.threads_for)."""
    import engine.runs

    # The budget stops it early: a warning at preparation.
    config = RunConfig(**{**DIGITS, "target_epsilon": None, "noise_multiplier": 1.0, "epsilon_budget": 1.0})
    torch.set_num_threads(2)
    reply, ahead = prepare_ahead(check_request(config))
    assert reply == {"ok": True, "num_train": 1441} and ahead is not None
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(config)
    monkeypatch.setattr(engine.runs, "prepare", lambda *a, **k: pytest.fail("the run was prepared again"))
    torch.set_num_threads(1)

    assert execute(store, run_id, ahead=ahead) == "finished"
    events = store.events(run_id)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "started" and kinds.count("plan") == 1
    plan = events[kinds.index("plan")]
    assert plan["threads"] == 1 and plan["num_train"] > 1000
    warnings = [e["message"] for e in events if e["type"] == "warning"]
    assert any("epsilon budget 1 allows" in m for m in warnings)
    training = next(i for i, e in enumerate(events) if e["type"] == "progress" and e["phase"] == "training")
    assert kinds.index("plan") < training
    assert store.get_run(run_id)["stop_reason"] == "budget"


def test_a_run_stored_with_another_config_is_prepared_as_stored(tmp_path):
    reply, ahead = prepare_ahead(check_request(RunConfig(**DIGITS)))
    assert reply["ok"]
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(**{**DIGITS, "expected_batch_size": 32, "epochs": 1}))

    assert execute(store, run_id, ahead=ahead) == "finished"
    plan = store.plan_event(run_id)
    assert plan["sample_rate"] == pytest.approx(32 / plan["num_train"])


def test_a_refused_check_names_the_field_and_keeps_nothing():
    reply, ahead = prepare_ahead(check_request(RunConfig(**{**DIGITS, "delta": 0.01})))
    assert ahead is None and reply["ok"] is False
    assert reply["field"] == "delta" and reply["type"] == "ConfigError" and "not below 1/N" in reply["message"]


def test_the_standby_runner_checks_over_its_pipe_then_trains_that_run(tmp_path, capsys):
    """The real process: a refused config is the command's ConfigError, naming its field; a config that
    passes is trained by that runner, without calibrating its noise again."""
    from engine.cli_follow import StandbyRunner, follow_runner

    store = Store(tmp_path / "runs.sqlite")
    with StandbyRunner() as standby:
        with pytest.raises(ConfigError, match="not below 1/N") as refused:
            standby.check(RunConfig(**{**DIGITS, "delta": 0.01}))
        assert refused.value.field == "delta"
        config = RunConfig(**DIGITS)
        assert standby.check(config) == 1441  # the training examples, which a study accounts with
        run_id = store.create_run(config)
        assert follow_runner(store.path, run_id, store=store, standby=standby, as_json=True) == "finished"
    events = store.events(run_id)
    assert [e["type"] for e in events].count("plan") == 1
    assert not any(e["type"] == "progress" and e["phase"] == "calibrating" for e in events)
    assert store.get_run(run_id)["summary"]["epsilon"] <= 2.0


def test_a_standby_runner_that_died_leaves_the_check_to_the_command(tmp_path):
    from engine.cli_follow import StandbyRunner

    with StandbyRunner() as standby:
        standby.proc.kill()
        standby.proc.wait()
        with pytest.raises(ConfigError, match="not below 1/N"):
            standby.check(RunConfig(**{**DIGITS, "delta": 0.01}))
        assert standby.check(RunConfig(**DIGITS)) == 1441  # passes here, in this process


def test_a_standby_runner_says_what_the_engine_offers_asked_at_once_or_later_and_still_takes_a_run(tmp_path):
    """Asked as it starts (the window's engine probe), it answers once torch is in; asked again after a
    check, it answers in order; the run handed next is trained. Its answers are the engine's own."""
    import json
    import subprocess
    import sys

    from engine.capabilities import engine_capabilities
    from engine.prepared_ahead import CAPABILITIES_REQUEST, capabilities_answer, check_answer

    store = Store(tmp_path / "runs.sqlite")
    config = RunConfig(**{**DIGITS, "epochs": 1})
    process = subprocess.Popen([sys.executable, "-m", "engine.runner", "--standby"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    process.stdin.write(CAPABILITIES_REQUEST)
    process.stdin.flush()
    first = capabilities_answer(process.stdout.readline())
    assert first == engine_capabilities()
    process.stdin.write(json.dumps({"check": config.to_dict(), "checked_before": []}) + "\n" + CAPABILITIES_REQUEST)
    process.stdin.flush()
    assert check_answer(process.stdout.readline()) == {"ok": True, "num_train": 1441}
    assert capabilities_answer(process.stdout.readline()) == first
    run_id = store.create_run(config)
    out, _ = process.communicate(json.dumps({"run_id": run_id, "db": str(store.path)}) + "\n", timeout=300)
    assert process.returncode == 0 and store.get_run(run_id)["status"] == "finished"
    assert capabilities_answer("not json") is None and capabilities_answer('{"checked": {}}') is None
