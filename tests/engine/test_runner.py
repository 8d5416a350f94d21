"""The runner process end to end on real data: tables filled, SIGTERM, SIGKILL, bad input, budget."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import privacy
from engine.config import RunConfig
from engine.events import decode
from engine.runner import artifacts_dir, sha256_of
from engine.store import Store

REPO = Path(__file__).resolve().parents[2]


def start_runner(db: Path, run_id: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "engine.runner", str(run_id), "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def queue(tmp_path: Path, **values) -> tuple[Store, int]:
    store = Store(tmp_path / "runs.sqlite")
    return store, store.create_run(RunConfig(**values))


def mnist_config(mnist_dir: Path, **changes) -> dict:
    values = dict(
        name="mnist-short",
        dataset="mnist",
        data_dir=str(mnist_dir.parent),
        model="mnist_cnn",
        noise_multiplier=1.0,
        clipping_norm=1.0,
        train_subset=2000,
        expected_batch_size=100,
        epochs=2,
        learning_rate=0.5,
        optimizer="momentum",
        evaluations_per_epoch=2,
        seed=3,
    )
    values.update(changes)
    return values


def read_events_until(proc: subprocess.Popen, predicate, timeout: float = 120.0) -> list[dict]:
    events = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        event = decode(line)
        if event is None:
            continue
        events.append(event)
        if predicate(event):
            return events
    raise AssertionError(f"condition not reached; last events: {events[-3:]}")


def test_short_real_mnist_run_fills_every_table(tmp_path, mnist_dir):
    store, run_id = queue(tmp_path, **mnist_config(mnist_dir))
    proc = start_runner(store.path, run_id)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    events = [e for e in map(decode, out.splitlines()) if e]
    types = {e["type"] for e in events}
    assert {"started", "plan", "progress", "metric", "privacy", "artifact", "finished"} <= types
    assert events[0]["type"] == "started" and events[-1]["type"] == "finished"

    run = store.get_run(run_id)
    assert run["status"] == "finished" and run["stop_reason"] == "completed"
    assert run["num_train"] == 2000 and run["steps_done"] == run["steps_planned"] == 40
    counts = store.table_counts(run_id)
    assert counts["metrics"] >= 40 and counts["privacy"] >= 40 and counts["artifacts"] == 1
    assert counts["events"] == len(events)
    assert run["accuracy"] > 0.5  # 40 noisy steps on 2,000 images already learn a lot

    # The stored epsilon is the reported accountant's value for the steps taken.
    expected = privacy.dpsgd_epsilon(sample_rate=100 / 2000, noise_multiplier=1.0, steps=40, delta=1e-5)
    assert run["accountant"] == "pld"
    assert run["epsilon"] == pytest.approx(expected.value, rel=1e-9)
    live = [p["epsilon"] for p in store.privacy(run_id, "rdp")]
    assert len(live) == 40 and live == sorted(live)
    assert store.privacy(run_id, "pld")[-1]["epsilon"] == pytest.approx(run["epsilon"])

    artifact = store.artifacts(run_id)[0]
    assert sha256_of(Path(artifact["path"])) == artifact["sha256"]


def test_sigterm_mid_run_leaves_a_consistent_stopped_run(tmp_path, mnist_dir):
    store, run_id = queue(tmp_path, **mnist_config(mnist_dir, train_subset=10000, expected_batch_size=50, epochs=5))
    proc = start_runner(store.path, run_id)
    read_events_until(proc, lambda e: e["type"] == "privacy" and e["step"] >= 5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    tail = [e for e in map(decode, out.splitlines()) if e]
    assert tail[-1]["type"] == "finished" and tail[-1]["status"] == "stopped"

    run = store.get_run(run_id)
    assert run["status"] == "stopped" and run["stop_reason"] == "stopped"
    done = run["steps_done"]
    assert 5 <= done < run["steps_planned"]
    # Every completed step is in the store, and nothing beyond it.
    assert [m["step"] for m in store.metrics(run_id, "train_loss")] == list(range(1, done + 1))
    assert [p["step"] for p in store.privacy(run_id, "rdp")] == list(range(1, done + 1))
    expected = privacy.dpsgd_epsilon(sample_rate=50 / 10000, noise_multiplier=1.0, steps=done, delta=1e-5)
    assert run["epsilon"] == pytest.approx(expected.value, rel=1e-9)
    assert run["accuracy"] is not None and len(store.artifacts(run_id)) == 1


def test_killed_runner_is_reported_as_failed_with_its_steps_kept(tmp_path, mnist_dir):
    store, run_id = queue(tmp_path, **mnist_config(mnist_dir, train_subset=10000, expected_batch_size=50, epochs=5))
    proc = start_runner(store.path, run_id)
    read_events_until(proc, lambda e: e["type"] == "metric" and e["name"] == "train_loss" and e["step"] >= 3)
    proc.kill()
    proc.wait(timeout=30)
    runs = {r["id"]: r for r in Store(store.path).list_runs()}
    assert runs[run_id]["status"] == "failed"
    assert "ended without reporting" in runs[run_id]["error"]
    assert len(store.metrics(run_id, "train_loss")) >= 3


def test_bad_data_file_fails_the_run_with_a_message_naming_it(tmp_path):
    csv = tmp_path / "patients.csv"
    csv.write_text("age,weight,outcome\n50,70,1\n60,80,0\n" * 20)
    store, run_id = queue(tmp_path, name="bad", dataset=str(csv), label_column="diagnosis", noise_multiplier=1.0,
                          expected_batch_size=8)
    proc = start_runner(store.path, run_id)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    run = store.get_run(run_id)
    assert run["status"] == "failed"
    assert "diagnosis" in run["error"] and "Traceback" not in run["error"]
    error = next(e for e in map(decode, out.splitlines()) if e and e["type"] == "error")
    assert error["where"] == "loading the data" and error["message"] == run["error"]


def test_delta_too_large_for_the_dataset_fails_naming_delta(tmp_path):
    store, run_id = queue(tmp_path, name="d", dataset="digits", delta=1e-2, noise_multiplier=1.0,
                          expected_batch_size=32)
    assert start_runner(store.path, run_id).wait(timeout=120) == 1
    assert store.get_run(run_id)["error"].startswith("delta:")


def test_budget_stops_before_the_first_step_that_would_exceed_it(tmp_path):
    q, sigma = 64 / 1441, 1.0  # digits: 1797 - 356 test = 1441 training examples (seed 0)
    eps_at = lambda t: privacy.dpsgd_epsilon(sample_rate=q, noise_multiplier=sigma, steps=t, delta=1e-5).value
    budget = (eps_at(12) + eps_at(13)) / 2
    store, run_id = queue(tmp_path, name="b", dataset="digits", noise_multiplier=sigma, expected_batch_size=64,
                          epochs=5, epsilon_budget=budget, learning_rate=0.5)
    proc = start_runner(store.path, run_id)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    run = store.get_run(run_id)
    assert run["num_train"] == 1441
    assert run["steps_done"] == 12 and run["stop_reason"] == "budget" and run["status"] == "finished"
    assert run["epsilon"] <= budget
    assert all(p["epsilon"] <= budget for p in store.privacy(run_id, "pld"))
    warnings = [e for e in map(decode, out.splitlines()) if e and e["type"] == "warning"]
    assert any("budget" in w["message"] for w in warnings)


def test_target_epsilon_is_met_by_the_calibrated_noise(tmp_path):
    store, run_id = queue(tmp_path, name="t", dataset="digits", target_epsilon=2.0, expected_batch_size=64,
                          epochs=2, learning_rate=0.5)
    assert start_runner(store.path, run_id).wait(timeout=120) == 0
    run = store.get_run(run_id)
    assert run["epsilon"] <= 2.0
    assert run["epsilon"] > 1.9  # calibrated to the target, not far below it
    plan = next(e for e in store.events(run_id) if e["type"] == "plan")
    assert plan["noise_calibrated"] is True and plan["noise_multiplier"] == run["noise_multiplier"]


def test_target_attack_tpr_is_met_by_the_calibrated_noise(tmp_path):
    """target_attack_tpr instead of target_epsilon: the run's noise keeps the best membership attack at
    TPR <= 5% at FPR 1% (f-DP bound of its PLD), and 0.001 less noise would not."""
    from engine.privacy.risk import dpsgd_privacy_profile, highest_tpr

    store, run_id = queue(tmp_path, name="t", dataset="digits", target_attack_tpr=0.05, expected_batch_size=64,
                          epochs=2, learning_rate=0.5)
    assert start_runner(store.path, run_id).wait(timeout=120) == 0
    run = store.get_run(run_id)
    plan = next(e for e in store.events(run_id) if e["type"] == "plan")
    assert plan["noise_calibrated"] is True and plan["noise_multiplier"] == run["noise_multiplier"]

    def tpr(sigma: float) -> float:
        profile = dpsgd_privacy_profile(sample_rate=plan["sample_rate"], noise_multiplier=sigma, steps=plan["steps"])
        return float(highest_tpr(profile=profile, fpr=[0.01])[0])

    assert tpr(run["noise_multiplier"]) <= 0.05 < tpr(run["noise_multiplier"] - 0.001)


def test_concurrent_runners_share_the_cores(tmp_path, monkeypatch):
    from engine.runner import threads_for

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("DPW_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    store, first = queue(tmp_path, name="a", dataset="digits", noise_multiplier=1.0)
    second = store.create_run(RunConfig(name="b", dataset="digits", noise_multiplier=1.0))
    assert threads_for(store, first) == 8  # alone: every core
    store.mark_running(second)  # a live runner (this process's pid) on the same store
    assert threads_for(store, first) == 4
    monkeypatch.setenv("DPW_THREADS", "3")
    assert threads_for(store, first) == 3
    monkeypatch.setenv("DPW_THREADS", "many")
    with pytest.raises(Exception, match="DPW_THREADS='many' is not a whole number"):
        threads_for(store, first)
    monkeypatch.delenv("DPW_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads_for(store, first) is None  # the user's OpenMP setting stands


def test_the_runner_records_its_thread_count(tmp_path, monkeypatch):
    monkeypatch.setenv("DPW_THREADS", "1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    store, run_id = queue(tmp_path, name="t", dataset="digits", noise_multiplier=1.0, epochs=1,
                          expected_batch_size=64)
    proc = subprocess.run([sys.executable, "-m", "engine.runner", str(run_id), "--db", str(store.path)],
                          capture_output=True, text=True, cwd=REPO, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    plan = next(e for e in store.events(run_id) if e["type"] == "plan")
    assert plan["threads"] == 1


def test_pate_stopped_while_the_teachers_vote_accounts_for_the_answered_queries(tmp_path, monkeypatch):
    """A stop that lands inside the teachers' voting (InterruptedError) still analyses the queries
    answered before it, so the run states the privacy they spent."""
    import io

    import engine.pate.run as pate_run
    from engine.events import EventWriter
    from engine.runs import prepare, store_votes

    monkeypatch.setattr(pate_run, "QUERY_CHUNK", 100)  # one batch per chunk: the stop lands in the next vote
    config = RunConfig(name="pate-stop", dataset="digits", mechanism="pate", num_teachers=5, teacher_epochs=2,
                       teacher_batch_size=16, optimizer="adam", learning_rate=0.01, aggregator="confident",
                       threshold=4.0, sigma1=1.5, sigma2=1.0, num_queries=300, delta=1e-4, student_epochs=1)
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(config)
    prepared = prepare(config, emit=EventWriter(run_id, stream=io.StringIO(), sink=store.record_event).emit)
    store_votes(prepared, store, run_id)
    stop, store_rows = [False], prepared.vote_sink

    def store_then_stop(rows):
        store_rows(rows)
        stop[0] = True

    prepared.vote_sink = store_then_stop
    result = prepared.train(should_stop=lambda: stop[0])
    assert result.stop_reason == "stopped" and result.queries_processed == 100
    assert result.answered == sum(v["answered"] for v in store.votes(run_id)) and result.analysis is not None
    assert prepared.run_fields(result)["epsilon"] is not None


def test_an_infinite_epsilon_never_cuts_the_event_stream(tmp_path):
    """noise_multiplier = 0.0001 gives epsilon = inf: every event still reaches the reader, the run
    finishes (exit 0) and states epsilon inf."""
    store, run_id = queue(tmp_path, name="tiny-sigma", dataset="digits", noise_multiplier=0.0001, delta=1e-4,
                          expected_batch_size=128, epochs=1, learning_rate=0.5)
    proc = start_runner(store.path, run_id)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    events = [e for e in map(decode, out.splitlines()) if e]
    assert len(events) == store.table_counts(run_id)["events"]
    assert events[-1]["type"] == "finished" and events[-1]["status"] == "finished"
    assert any(e["type"] == "privacy" and e["epsilon"] == float("inf") for e in events)
    assert store.get_run(run_id)["epsilon"] == float("inf")


def test_pate_teachers_with_a_non_finite_loss_stop_the_run_before_any_query(tmp_path):
    # Features used unscaled (no bounds declared), linear teachers and a huge step: the loss overflows.
    rows = ["f1,f2,label"] + [f"{1e30 * (-1) ** i},{1e30 * (1 - i % 3)},{i % 2}" for i in range(200)]
    csv = tmp_path / "huge.csv"
    csv.write_text("\n".join(rows) + "\n")
    store, run_id = queue(tmp_path, name="pate-nan", dataset=str(csv), mechanism="pate", num_teachers=2,
                          teacher_epochs=2, teacher_batch_size=16, aggregator="gnmax", gnmax_sigma=1.0,
                          num_queries=20, delta=1e-4, student_epochs=1, teacher_model="logistic",
                          learning_rate=1000.0)
    proc = start_runner(store.path, run_id)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "Warning" not in err  # no numpy or torch overflow warnings on the way
    events = [e for e in map(decode, out.splitlines()) if e]
    assert events[-1]["type"] == "finished" and events[-1]["status"] == "failed"
    run = store.get_run(run_id)
    assert "teachers' training diverged" in run["error"] and run["epsilon"] is None
    counts = store.table_counts(run_id)
    assert counts["votes"] == 0 and counts["privacy"] == 0


def test_two_stores_in_one_folder_keep_their_models_apart(tmp_path):
    default, other = Store(tmp_path / "runs.sqlite"), Store(tmp_path / "trial.sqlite")
    assert artifacts_dir(default, 1) == tmp_path / "artifacts" / "run-1"
    assert artifacts_dir(other, 1) == tmp_path / "trial-artifacts" / "run-1"


def test_stores_whose_names_share_a_stem_keep_their_models_apart(tmp_path):
    """runs.sqlite and runs.db both wrote to artifacts/run-1: each overwrote the other's model, and
    `dpw delete 1` in one deleted the other's files (and a resume could read its checkpoint)."""
    from click.testing import CliRunner

    from engine.cli import cli

    first, second = Store(tmp_path / "runs.sqlite"), Store(tmp_path / "runs.db")
    settings = dict(name="tiny", dataset="digits", noise_multiplier=1.0, expected_batch_size=64, epochs=1,
                    learning_rate=0.5)
    models = {}
    for store in (first, second):
        run_id = store.create_run(RunConfig(**settings))
        proc = start_runner(store.path, run_id)
        assert proc.communicate(timeout=300)[0] and proc.returncode == 0
        (artifact,) = store.artifacts(run_id)
        models[store.path.name] = (Path(artifact["path"]), artifact["sha256"])
    assert models["runs.sqlite"][0] == tmp_path / "artifacts" / "run-1" / "model.pt"
    assert models["runs.db"][0] == tmp_path / "runs.db-artifacts" / "run-1" / "model.pt"
    assert (tmp_path / "artifacts" / ".store").read_text() == "runs.sqlite\n"
    deleted = CliRunner().invoke(cli, ["delete", "1", "--db", str(second.path), "--yes"])
    assert deleted.exit_code == 0 and not (tmp_path / "runs.db-artifacts" / "run-1").exists()
    path, digest = models["runs.sqlite"]
    assert sha256_of(path) == digest  # the other store's model is untouched


def test_a_stop_during_the_audit_after_training_ends_it_at_once_and_keeps_the_run_finished(tmp_path):
    """The runner's membership audit runs after the run is finished: SIGTERM (the window closing,
    Ctrl-C) abandons it at once instead of waiting for it, and leaves the run finished, its privacy
    recorded, and no half-written audit. First the flag itself: a stop inside `interruptible` ends
    a 60 s wait at once; outside, it is only recorded (training checks it between steps)."""
    code = (
        "import os, signal, time\n"
        "from engine.runner import StopFlag\n"
        "stop = StopFlag(); stop.install()\n"
        "with stop.interruptible():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(60)\n"
        "    print('not interrupted')\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('after', stop())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["after", "True"]

    store, run_id = queue(tmp_path, name="audit-cut", dataset="digits", model="mlp", noise_multiplier=1.0,
                          expected_batch_size=64, epochs=1)
    proc = start_runner(store.path, run_id)
    read_events_until(proc, lambda e: e["type"] == "finished")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    run = store.get_run(run_id)
    assert run["status"] == "finished" and run["epsilon"] is not None
    kept = run["summary"].get("membership_audit")
    assert kept is None or kept["mia"]["members"] > 0  # abandoned, or (if it beat the signal) whole


@pytest.mark.parametrize("sigma, accountant, warned", [(1e-9, "pld", True), (1e-9, "rdp", False), (0.3, "pld", False)])
def test_noise_that_bounds_nothing_is_said_before_training(sigma, accountant, warned):
    """A hand-set noise so small that the run will state epsilon = inf is a warning at the start, not
    only the caveat at the end (the RDP bound stays finite, about 1e19, so an rdp run is not warned)."""
    from engine.runs import prepare

    events = []
    config = RunConfig(name="w", dataset="digits", noise_multiplier=sigma, accountant=accountant,
                       expected_batch_size=64, epochs=1)
    plan = prepare(config, emit=lambda kind, **fields: events.append(dict(fields, type=kind))).plan
    stated = privacy.dpsgd_epsilon(sample_rate=plan.sample_rate, noise_multiplier=sigma, steps=plan.steps_planned,
                                   delta=config.delta, accountant=accountant).value
    assert (stated == float("inf")) == warned  # the warning foretells exactly what the run will state
    warnings = [e["message"] for e in events if e["type"] == "warning"]
    assert any("bounds nothing" in w for w in warnings) == warned, warnings
    if warned:  # said after the plan line, as the budget's warning is
        kinds = [e["type"] for e in events]
        assert kinds.index("plan") < kinds.index("warning")
