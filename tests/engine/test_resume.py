"""Continuing a stopped or killed DP-SGD run from its last checkpoint (engine.checkpoint, `dpw resume`):
the model goes on from the checkpoint's step, its epsilon covers every step of both runs, and the
ledger counts each step once for the run that took it."""

from __future__ import annotations

import signal
import sys

import pytest
import torch
from click.testing import CliRunner

from engine import privacy
from engine.checkpoint import CHECKPOINT_FILE, CannotResume, apply_checkpoint, load_checkpoint, save_checkpoint
from engine.cli import cli
from engine.config import RunConfig
from engine.data_split import SPLIT_STRATIFIED
from engine.ledger import dataset_ledgers
from engine.runner import StopFlag, artifacts_dir, execute
from engine.store import Store

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from test_runner import read_events_until, start_runner  # noqa: E402

# digits: 1,441 training examples (seed 0), q = 64/1441, 6 epochs = 136 steps, evaluated every 11 steps
DIGITS = dict(name="digits-long", dataset="digits", noise_multiplier=1.0, expected_batch_size=64, epochs=6,
              learning_rate=0.5, evaluations_per_epoch=2, membership_audit=False)


class StopAfter(StopFlag):
    """Asks the run to stop before its step `steps + 1`."""

    def __init__(self, steps: int):
        super().__init__()
        self.asked = 0
        self.steps = steps

    def __call__(self) -> bool:
        self.asked += 1
        return self.asked > self.steps + 1  # execute asks once before training starts


def test_a_run_stopped_before_its_first_step_is_stopped_by_a_stop(tmp_path):
    """It was stored stopped with no stop reason: the runs list's "Stopped by" column stayed empty."""
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(**DIGITS))
    asked = StopFlag()
    asked.requested = True  # SIGTERM while the runner was loading (on standby, or reading the data)
    assert execute(store, run_id, stream=None, stop=asked) == "stopped"
    run = store.get_run(run_id)
    assert (run["status"], run["stop_reason"], run["steps_done"], run["error"]) == ("stopped", "stopped", 0, None)


def test_a_checkpoint_restores_weights_and_optimizer_state_and_a_failed_write_keeps_the_last(tmp_path, monkeypatch):
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    path = tmp_path / CHECKPOINT_FILE
    save_checkpoint(path, model=model, optimizer=optimizer, step=7)
    fresh = torch.nn.Linear(4, 3)
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    state = load_checkpoint(path)
    apply_checkpoint(state, fresh, fresh_optimizer)
    assert state["step"] == 7
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))
    momenta = [fresh_optimizer.state[p]["momentum_buffer"] for p in fresh.parameters()]
    assert all(torch.equal(m, optimizer.state[p]["momentum_buffer"]) for m, p in zip(momenta, model.parameters()))

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError):
        save_checkpoint(path, model=model, optimizer=optimizer, step=8)
    assert load_checkpoint(path)["step"] == 7 and [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_FILE]


class PowerCut(StopFlag):
    """The machine goes down before step `steps + 1`: training ends by an exception, not a stop."""

    def __init__(self, steps: int):
        super().__init__()
        self.asked, self.steps = 0, steps

    def __call__(self) -> bool:
        self.asked += 1
        if self.asked > self.steps + 1:
            raise RuntimeError("the machine went down")
        return False


def test_a_checkpoint_is_written_between_evaluations_that_are_far_apart(tmp_path, monkeypatch):
    """Evaluations an hour apart (one per epoch of a large dataset) would let a kill lose an hour of
    training: a checkpoint is also written every CHECKPOINT_EVERY_S (here: after every step)."""
    from engine import checkpoint

    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(**{**DIGITS, "evaluations_per_epoch": 1}))  # evaluated at step 22
    monkeypatch.setattr(checkpoint, "CHECKPOINT_EVERY_S", 0.0)
    execute(store, run_id, stream=None, stop=PowerCut(7))
    assert store.get_run(run_id)["status"] == "failed"
    assert load_checkpoint(artifacts_dir(store, run_id) / CHECKPOINT_FILE)["step"] == 7
    monkeypatch.setattr(checkpoint, "CHECKPOINT_EVERY_S", 3600.0)  # the default's effect: only evaluations
    again = store.create_run(RunConfig(**{**DIGITS, "evaluations_per_epoch": 1}))
    execute(store, again, stream=None, stop=PowerCut(7))
    assert not (artifacts_dir(store, again) / CHECKPOINT_FILE).exists()


def test_a_damaged_or_missing_checkpoint_is_refused_in_one_line(tmp_path):
    bad = tmp_path / CHECKPOINT_FILE
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CannotResume, match=r"cannot be read as a checkpoint"):
        load_checkpoint(bad)
    with pytest.raises(CannotResume, match=r"no checkpoint there"):
        load_checkpoint(tmp_path / "missing.pt")


def test_a_stopped_run_continues_to_its_end_with_the_epsilon_of_all_its_steps(tmp_path):
    store = Store(tmp_path / "runs.sqlite")
    first = store.create_run(RunConfig(**DIGITS))
    assert execute(store, first, stream=None, stop=StopAfter(40)) == "stopped"
    stopped = store.get_run(first)
    assert stopped["steps_done"] == 40
    assert load_checkpoint(artifacts_dir(store, first) / CHECKPOINT_FILE)["step"] == 40  # written at the stop

    second = store.create_run(RunConfig(**DIGITS), resumed_from=first)
    assert execute(store, second, stream=None) == "finished"
    run = store.get_run(second)
    total = run["steps_planned"]
    assert (run["steps_done"], run["steps_resumed"], run["resumed_from"]) == (total, 40, first)
    whole = privacy.dpsgd_epsilon(sample_rate=run["sample_rate"], noise_multiplier=1.0, steps=total, delta=1e-5)
    assert run["epsilon"] == pytest.approx(whole.value, rel=1e-9)  # the model's: every step of both runs
    assert [p["step"] for p in store.privacy(second, "rdp")] == list(range(41, total + 1))
    assert [m["step"] for m in store.metrics(second, "train_loss")] == list(range(41, total + 1))
    started = next(e for e in store.events(second) if e["type"] == "started")
    assert (started["resumed_from"], started["from_step"]) == (first, 40)
    # the ledger: 40 steps for the first run, the rest for the second: one run's worth in all
    (ledger,) = dataset_ledgers(store.list_runs(), [])
    assert ledger.epsilon == pytest.approx(whole.value, rel=1e-6)
    assert run["accuracy"] > 0.5
    assert not (artifacts_dir(store, second) / CHECKPOINT_FILE).exists()  # finished: nothing left to continue


def test_a_run_recorded_before_the_per_example_split_continues_on_its_own_training_examples(tmp_path, monkeypatch):
    """Runs from before engine.data_split's per-example rule drew a stratified split and recorded no
    rule: their continuation rebuilds that split (another would be other examples and another sample rate)."""
    import engine.runner

    store = Store(tmp_path / "runs.sqlite")
    first = store.create_run(RunConfig(**DIGITS))
    monkeypatch.setattr(engine.runner, "SPLIT_BY_EXAMPLE", SPLIT_STRATIFIED)  # as those versions split
    assert execute(store, first, stream=None, stop=StopAfter(10)) == "stopped"
    monkeypatch.undo()
    with store.db.conn:  # they recorded no split_rule
        store.db.conn.execute("update events set payload = json_remove(payload, '$.split_rule') "
                              "where run_id = ? and type = 'plan'", [first])
    assert "split_rule" not in store.plan_event(first) and store.get_run(first)["num_train"] == 1438
    second = store.create_run(RunConfig(**DIGITS), resumed_from=first)
    assert execute(store, second, stream=None) == "finished", store.get_run(second)["error"]
    assert store.plan_event(second)["split_rule"] == SPLIT_STRATIFIED
    assert store.get_run(second)["sample_rate"] == store.get_run(first)["sample_rate"] == 64 / 1438


def test_dpw_resume_continues_a_killed_runner_from_its_last_checkpoint_once(tmp_path):
    db = tmp_path / "runs.sqlite"
    store = Store(db)
    first = store.create_run(RunConfig(**{**DIGITS, "epochs": 12}))
    proc = start_runner(db, first)
    # the second evaluation's metrics come after the first evaluation's checkpoint was written
    read_events_until(proc, lambda e: e["type"] == "metric" and e["name"] == "test_accuracy" and e["step"] >= 22)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    checkpoint = load_checkpoint(artifacts_dir(store, first) / CHECKPOINT_FILE)["step"]
    assert checkpoint in (11, 22)  # the one at 22 may or may not be written when the kill comes

    shown = CliRunner().invoke(cli, ["show", str(first), "--db", str(db)])
    assert "failed" in shown.output and f"dpw resume {first}" in shown.output
    resumed = CliRunner().invoke(cli, ["resume", str(first), "--db", str(db)])
    assert resumed.exit_code == 0, resumed.output
    assert f"continues run {first} (digits-long) from step {checkpoint}" in resumed.output
    runs = {r["id"]: r for r in Store(db).list_runs()}
    second = max(runs)
    run = runs[second]
    assert run["status"] == "finished" and run["steps_done"] == run["steps_planned"]
    assert run["steps_resumed"] == checkpoint
    whole = privacy.dpsgd_epsilon(sample_rate=run["sample_rate"], noise_multiplier=1.0, steps=run["steps_done"],
                                  delta=1e-5)
    assert run["epsilon"] == pytest.approx(whole.value, rel=1e-9)
    # the killed run's steps after its checkpoint were taken: the ledger counts them too
    taken = runs[first]["steps_done"] + run["steps_done"] - checkpoint
    assert taken >= run["steps_done"]
    spent = privacy.dpsgd_epsilon(sample_rate=run["sample_rate"], noise_multiplier=1.0, steps=taken, delta=1e-5,
                                  accountant="pld")
    (ledger,) = dataset_ledgers(Store(db).list_runs(), [])
    assert ledger.epsilon == pytest.approx(spent.value, rel=1e-6)

    again = CliRunner().invoke(cli, ["resume", str(first), "--db", str(db)])
    assert again.exit_code != 0 and f"already continued by run {second}" in again.output
    assert len(Store(db).list_runs()) == 2  # nothing stored


def test_a_continuation_that_ended_before_its_first_checkpoint_leaves_its_run_continuable(tmp_path):
    """A `dpw resume` killed before its first checkpoint (or one of two started at once) blocked its run
    for good, saying continuing again "would spend privacy on the same steps twice"."""
    from engine.runner import resumable

    store = Store(tmp_path / "runs.sqlite")
    first = store.create_run(RunConfig(**DIGITS))
    assert execute(store, first, stream=None, stop=StopAfter(5)) == "stopped"
    dead = store.create_run(RunConfig(**DIGITS), resumed_from=first)
    store.update_run(dead, status="failed", steps_done=2)  # killed at step 2: its steps count, nothing to continue
    assert resumable(store, first)["id"] == first
    assert f"dpw resume {first}" in CliRunner().invoke(cli, ["show", str(first), "--db", str(store.path)]).output
    waiting = store.create_run(RunConfig(**DIGITS), resumed_from=first)
    with pytest.raises(CannotResume, match=rf"run {first} is being continued by run {waiting} \(queued\)"):
        resumable(store, first)
    assert resumable(store, first, for_run=waiting)["id"] == first  # the runner of that continuation itself


@pytest.mark.parametrize("change, says", [
    (dict(status="finished"), "is finished: only a stopped or failed run is continued"),
    (dict(mechanism="pate"), "only DP-SGD and non-private runs are continued"),
    (dict(stop_reason="budget"), "stopped at its epsilon budget"),
    (dict(config={"audit_canaries": 8}), "audit canaries"),
    (dict(config={"normalization": "dp"}), "release them again"),
])
def test_runs_that_cannot_be_continued_say_why_and_store_nothing(tmp_path, change, says):
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(**DIGITS))
    fields = {"status": "stopped", **change}
    if "config" in fields:
        fields["config"] = {**store.get_run(run_id)["config"], **fields["config"]}
    store.update_run(run_id, **fields)
    result = CliRunner().invoke(cli, ["resume", str(run_id), "--db", str(store.path)])
    assert result.exit_code != 0 and says in result.output and "Traceback" not in result.output
    assert len(store.list_runs()) == 1


def test_a_run_on_data_that_changed_since_is_not_continued(tmp_path):
    csv = tmp_path / "table.csv"
    rows = ["a,b,label"] + [f"{i % 7},{(i * 3) % 5},{i % 2}" for i in range(400)]
    csv.write_text("\n".join(rows) + "\n")
    config = dict(name="table", dataset=str(csv), noise_multiplier=1.0, expected_batch_size=32, epochs=3,
                  learning_rate=0.1, membership_audit=False)
    store = Store(tmp_path / "runs.sqlite")
    first = store.create_run(RunConfig(**config))
    assert execute(store, first, stream=None, stop=StopAfter(5)) == "stopped"
    csv.write_text("\n".join(rows[:-1] + ["6,4,1"]) + "\n")
    result = CliRunner().invoke(cli, ["resume", str(first), "--db", str(store.path)])
    assert result.exit_code != 0 and "the dataset's contents changed since run" in result.output
    assert len(store.list_runs()) == 1
    assert result.output.count("\n") == 1  # one line


def test_a_checkpoint_that_cannot_be_written_is_said_once_and_the_run_trains_on(tmp_path):
    store = Store(tmp_path / "runs.sqlite")
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "run-1").write_text("a file where the run's folder would go")
    run_id = store.create_run(RunConfig(**DIGITS))
    assert execute(store, run_id, stream=None) == "failed"  # its model cannot be saved either
    run = store.get_run(run_id)
    assert run["steps_done"] == run["steps_planned"] and "model.pt" in run["error"]
    warnings = [e["message"] for e in store.events(run_id) if e["type"] == "warning"]
    assert len([w for w in warnings if w.startswith("no checkpoint kept")]) == 1
    assert "cannot be continued with dpw resume" in warnings[0]


def test_a_store_whose_artifacts_folder_cannot_be_made_fails_its_run_before_any_step(tmp_path):
    store = Store(tmp_path / "runs.sqlite")
    (tmp_path / "artifacts").write_text("a file where the runs' folders would go")
    run_id = store.create_run(RunConfig(**DIGITS))
    assert execute(store, run_id, stream=None) == "failed"
    run = store.get_run(run_id)
    assert not run["steps_done"] and run["epsilon"] is None
    assert f"cannot create the folder for the run's saved model and checkpoint, {tmp_path / 'artifacts'}" in run["error"]


def test_a_run_that_kept_no_checkpoint_is_not_continued(tmp_path):
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(**DIGITS))
    store.update_run(run_id, status="failed", steps_done=3)
    result = CliRunner().invoke(cli, ["resume", str(run_id), "--db", str(store.path)])
    assert result.exit_code != 0 and f"run {run_id} kept no checkpoint" in result.output
    assert len(store.list_runs()) == 1
    shown = CliRunner().invoke(cli, ["show", str(run_id), "--db", str(store.path)])
    assert "dpw resume" not in shown.output
