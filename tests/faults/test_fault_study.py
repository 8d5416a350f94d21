"""A killed `dpw study` (kill -9 of its process, real runner processes, a real store): the study is
marked interrupted by the next reader, with the privacy of every candidate it had started recorded
on its row, and the candidate that was running at the time is reconciled like any killed run."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time

import pytest

from engine.privacy.pld import SubsampledGaussian, pld_epsilon_composed
from engine.publication import publishable_epsilon
from engine.store import Store
from engine.study import composition_epsilon, plan_candidates, training_size
from engine.study_config import StudyConfig
from fault_helpers import DIGITS, check_ledger, start, store_with_history

NOISE = [1.0, 1.2, 1.5]


def study_file(path, mode: str):
    base = "\n".join(f"{k} = {json.dumps(v)}" for k, v in dict(DIGITS, epochs=10).items())
    head = f'name = "killed"\nmode = "{mode}"\n' + ("mean_runs = 3\nshape = 1.0\n" if mode == "private" else "")
    space = f"noise_multiplier = {json.dumps(NOISE)}" if mode != "private" else "learning_rate = [0.25, 0.5]"
    path.write_text(f"{head}[base]\n{base}\n[space]\n{space}\n", encoding="utf-8")
    return path


def wait_for_second_candidate_training(db, proc) -> int:
    """Lines of `dpw study --json` until candidate 2's runner reports privacy; returns its run id."""
    run_id = None
    for line in proc.stdout:
        event = json.loads(line) if line.startswith("{") else {}
        if event.get("type") == "candidate" and event.get("index") == 2:
            run_id = event["run_id"]
        if run_id is not None and event.get("type") == "privacy" and event.get("run_id") == run_id:
            return run_id
    raise AssertionError("dpw study ended before its second candidate trained: " + proc.stderr.read()[-500:])


def gone(pid: int, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_kill_9_of_dpw_study_marks_it_interrupted_with_the_privacy_of_the_candidates_it_started(tmp_path):
    db = store_with_history(tmp_path / "runs.sqlite")
    proc = start(["-m", "engine.cli", "study", study_file(tmp_path / "study.toml", "composition"), "--db", db,
                  "--json"])
    run_id = wait_for_second_candidate_training(db, proc)
    runner_pid = Store(db).get_run(run_id)["pid"]
    study_id = Store(db).get_run(run_id)["study_id"]
    assert Store(db).get_study(study_id)["status"] == "running"
    os.kill(proc.pid, signal.SIGKILL)  # the study process only; its runner goes on in its own group
    proc.wait(timeout=60)  # (not communicate: the runner still holds the study's stderr)
    os.kill(runner_pid, signal.SIGKILL)  # and then the candidate's runner (a power cut, in two steps)
    assert gone(runner_pid)
    proc.stdout.close()
    proc.stderr.close()

    store = Store(db)
    runs = {r["id"]: r for r in store.list_runs()}  # any reader reconciles the study and its runs
    study = store.get_study(study_id)
    assert study["status"] == "interrupted" and "killed or crashed" in study["error"]
    assert study["num_candidates"] == 2 and study["released_run_id"] is None
    mine = [r for r in runs.values() if r.get("study_id") == study_id]
    assert [r["status"] for r in mine] == ["finished", "failed"]  # the third candidate never started
    q = DIGITS["expected_batch_size"] / mine[0]["num_train"]
    planned = [SubsampledGaussian(q, s, mine[0]["steps_planned"]) for s in NOISE[:2]]
    expected = pld_epsilon_composed(mechanisms=planned, delta=DIGITS["delta"]).value
    assert study["epsilon"] == pytest.approx(expected, rel=1e-9) and study["accountant"] == "pld-composition"
    assert mine[1]["steps_done"] < mine[1]["steps_planned"]  # the spend recorded covers its whole plan
    for run in mine:
        stated = publishable_epsilon(run)
        assert stated.value == pytest.approx(expected) and "interrupted early" in stated.note
    check_ledger(db)
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_kill_9_of_a_private_study_releases_nothing_and_states_the_composition_of_what_ran(tmp_path):
    db = tmp_path / "runs.sqlite"
    config = study_file(tmp_path / "study.toml", "private")
    proc = start(["-m", "engine.cli", "study", config, "--db", db, "--json"])
    first = None
    for line in proc.stdout:
        event = json.loads(line) if line.startswith("{") else {}
        if event.get("type") == "privacy":
            first = event["run_id"]
            break
    assert first is not None, proc.stderr.read()[-500:]
    store = Store(db)
    runner_pid = store.get_run(first)["pid"]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert gone(runner_pid, timeout=300)  # the orphaned candidate finishes on its own
    proc.stdout.close()
    proc.stderr.close()
    runs = [r for r in store.list_runs() if r.get("study_id") is not None]
    study = store.get_study(runs[0]["study_id"])
    assert study["status"] == "interrupted" and study["released_run_id"] is None
    assert study["num_candidates"] == len(runs) == 1 and runs[0]["status"] == "finished"
    q = DIGITS["expected_batch_size"] / runs[0]["num_train"]
    expected = pld_epsilon_composed(mechanisms=[SubsampledGaussian(q, 1.0, runs[0]["steps_planned"])],
                                    delta=DIGITS["delta"]).value
    assert study["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert publishable_epsilon(runs[0]).withheld  # nothing chosen, nothing released
    check_ledger(db)


@pytest.mark.parametrize("moment", ["candidate", "finished"])
def test_sigterm_to_dpw_study_at_any_moment_stops_it_with_no_further_candidate(tmp_path, moment):
    """SIGTERM (the window's Stop or its closing, a terminal's Ctrl-C) to `dpw study` the instant a candidate
    is announced (its runner still starting up, before it can stop cleanly) or the instant one finished
    (its runner auditing, the next not yet created): the study ends "stopped" at once, starts no other
    candidate, leaves no run queued or running, and its row states the composition of the steps that ran."""
    db = store_with_history(tmp_path / "runs.sqlite")
    proc = start(["-m", "engine.cli", "study", study_file(tmp_path / "study.toml", "composition"), "--db", db,
                  "--json"])
    for line in proc.stdout:
        event = json.loads(line) if line.startswith("{") else {}
        if event.get("type") == moment:
            proc.send_signal(signal.SIGTERM)
            break
    proc.stdout.read()
    assert proc.wait(timeout=120) == 0
    proc.stdout.close()
    proc.stderr.close()
    store = Store(db)
    study = store.list_studies()[-1]
    mine = [r for r in store.list_runs() if r.get("study_id") == study["id"]]
    assert study["status"] == "stopped" and study["released_run_id"] is None
    assert len(mine) == study["num_candidates"] == 1
    assert mine[0]["status"] in ("finished", "stopped", "failed")  # failed: killed while still starting up
    config = StudyConfig.load_toml(tmp_path / "study.toml")
    first = plan_candidates(config).configs[:1]
    expected = composition_epsilon(first, training_size(first[0]), config.base.delta,
                                   steps_done=[mine[0]["steps_done"] or 0])  # what it spent (0 if killed starting)
    assert study["epsilon"] == pytest.approx(expected.value, rel=1e-9)
    check_ledger(db)
