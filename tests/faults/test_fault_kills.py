"""Runs ended by signals at random points: kill -9 of the runner (DP-SGD and PATE, several seeds),
Ctrl-C during PATE querying, SIGTERM to `dpw run`, and a runner killed in its first moments. After
each the store is intact, every run has a final status and states the privacy it spent."""

from __future__ import annotations

import json
import random
import signal

import pytest
from fault_helpers import (DIGITS, PATE, check_ledger, dpw, read_events, snapshot, start, start_runner,
                           store_with_history, write_toml)

from engine.config import RunConfig
from engine.store import Store


def _queued(tmp_path, values) -> tuple:
    db = store_with_history(tmp_path / "runs.sqlite")
    before = snapshot(db, [1, 2])
    return db, before, Store(db).create_run(RunConfig(**values))


@pytest.mark.parametrize("seed", [11, 12])
def test_kill_9_of_a_dpsgd_runner_at_a_random_step_keeps_the_privacy_spent(tmp_path, seed):
    db, before, run_id = _queued(tmp_path, DIGITS)
    proc = start_runner(db, run_id)
    k = random.Random(seed).randint(1, 25)
    seen = read_events(proc, lambda e: e["type"] == "privacy", count=k)[-1]
    proc.kill()
    proc.wait(timeout=60)

    listed = dpw("list", "--db", db)
    assert listed.returncode == 0, listed.stderr
    run = check_ledger(db)[run_id]
    assert run["status"] == "failed" and "ended without reporting" in run["error"]
    assert run["epsilon"] is not None and run["steps_done"] >= seen["step"]
    assert snapshot(db, [1, 2]) == before
    shown = dpw("show", run_id, "--db", db)
    assert "ε = " in shown.stdout and f"steps          {run['steps_done']} of 23" in shown.stdout


@pytest.mark.parametrize("seed", [21, 23])
def test_kill_9_of_a_pate_runner_while_it_answers_queries_keeps_the_privacy_and_answers(tmp_path, seed):
    db, before, run_id = _queued(tmp_path, PATE)
    proc = start_runner(db, run_id)
    k = random.Random(seed).randint(1, 2)  # after the 1st or 2nd of 3 batches of answers was accounted
    read_events(proc, lambda e: e["type"] == "privacy" and e["accountant"] == "pate-di", count=k)
    proc.kill()
    proc.wait(timeout=60)

    assert dpw("list", "--db", db).returncode == 0
    run = check_ledger(db)[run_id]
    assert run["status"] == "failed" and run["epsilon"] is not None and run["accountant"] != "pate-dd"
    assert json.loads(run["summary"])["queries"] >= 100
    assert snapshot(db, [1, 2]) == before


@pytest.mark.parametrize("stop_signal", ["SIGINT", "SIGHUP"])  # Ctrl-C; the terminal closed
def test_ctrl_c_or_hangup_while_pate_answers_queries_stops_with_the_privacy_spent(tmp_path, stop_signal):
    db, before, run_id = _queued(tmp_path, PATE)
    proc = start_runner(db, run_id)
    read_events(proc, lambda e: e["type"] == "vote_batch")
    proc.send_signal(getattr(signal, stop_signal))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    run = check_ledger(db)[run_id]
    summary = json.loads(run["summary"])
    assert run["status"] == "stopped" and run["epsilon"] is not None
    assert summary["queries"] == run["steps_done"] >= 100 and summary["epsilon_released"] is not None
    assert snapshot(db, [1, 2]) == before


@pytest.mark.parametrize("stop_signal", ["SIGINT", "SIGTERM"])  # Ctrl-C; kill PID, CI timeouts
def test_ctrl_c_or_sigterm_to_dpw_run_stops_its_runner(tmp_path, stop_signal):
    db = store_with_history(tmp_path / "runs.sqlite")
    config = write_toml(tmp_path / "digits.toml", dict(DIGITS, epochs=20))
    proc = start(["-m", "engine.cli", "run", config, "--db", db, "--json"])
    read_events(proc, lambda e: e["type"] == "privacy")
    runner_pid = Store(db).get_run(3)["pid"]
    proc.send_signal(getattr(signal, stop_signal))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["status"] == "stopped"
    run = check_ledger(db)[3]
    assert run["status"] == "stopped" and run["epsilon"] is not None and run["pid"] == runner_pid
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(runner_pid, 0)  # no orphan runner goes on training


def test_a_runner_killed_in_its_first_moments_leaves_a_failed_run_not_a_queued_one(tmp_path):
    db = store_with_history(tmp_path / "runs.sqlite")
    config = write_toml(tmp_path / "digits.toml", DIGITS)
    proc = start(["-m", "engine.cli", "run", config, "--db", db])
    store = Store(db, readonly=True)
    import time

    while True:  # the runner's pid is on the row as soon as `dpw run` has started it
        rows = [r for r in store.db.conn.execute("select pid from runs where id = 3")]
        if rows and rows[0][0] != proc.pid:
            break
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.01)
    import os

    os.kill(rows[0][0], signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback" not in err
    run = check_ledger(db)[3]
    assert run["status"] == "failed" and run["error"]
    assert "error" in out  # dpw run says why, in one line of its summary


def standby_runner_of(pid: int) -> int | None:
    """The `python -m engine.runner --standby` child of process `pid`, if it has one yet."""
    from pathlib import Path

    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit():
                continue
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == pid and b"--standby" in (proc / "cmdline").read_bytes():
                return int(proc.name)
        except (OSError, ValueError, IndexError):
            continue
    return None


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("seed", [31, 32])
def test_a_standby_runner_killed_while_dpw_run_checks_the_config_costs_nothing(tmp_path, seed):
    """`dpw run` has its standby runner check the config (engine.prepared_ahead); killed (out of memory,
    kill -9) before it answered, the command checks the config itself and starts a runner of its own:
    the run trains, and no failed run is left for it."""
    import time

    db = store_with_history(tmp_path / "runs.sqlite")
    before = snapshot(db, [1, 2])
    config = write_toml(tmp_path / "digits.toml", DIGITS)
    proc = start(["-m", "engine.cli", "run", config, "--db", db, "--json"])
    while (standby := standby_runner_of(proc.pid)) is None:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.005)
    time.sleep(random.Random(seed).random() * 0.5)  # while it imports torch, before its answer
    import os

    os.kill(standby, signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    runs = check_ledger(db)
    assert sorted(runs) == [1, 2, 3] and runs[3]["status"] == "finished" and runs[3]["epsilon"] is not None
    assert runs[3]["pid"] != standby and snapshot(db, [1, 2]) == before
