"""What the fault-injection tests share: real processes on real stores, and the ledger checks run
after every fault (integrity, final statuses, the privacy spent on the run row equal to the last
privacy row, nothing else changed)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from engine.events import EventWriter, decode
from engine.store import NOT_STATED_ACCOUNTANTS, Store

REPO = Path(__file__).resolve().parents[2]
FINAL_STATUSES = {"finished", "stopped", "failed"}

# Tiny real runs: digits DP-SGD (23 steps, a privacy row per step and the tight one at 4 evaluations),
# and a PATE run of 5 teachers answering 300 queries in batches of 100.
DIGITS = dict(name="digits-fault", dataset="digits", noise_multiplier=1.0, delta=1e-4, expected_batch_size=64,
              epochs=1, learning_rate=0.5, evaluations_per_epoch=4)
PATE = dict(name="pate-fault", dataset="digits", mechanism="pate", num_teachers=5, teacher_epochs=2,
            teacher_batch_size=16, optimizer="adam", learning_rate=0.01, aggregator="confident", threshold=4.0,
            sigma1=1.5, sigma2=1.0, num_queries=300, delta=1e-4, student_epochs=1)


def environment() -> dict[str, str]:
    """One torch thread per process: several tiny runs share the CI machine's cores."""
    return dict(os.environ, DPW_THREADS="1", PYTHONPATH=str(REPO))


def dpw(*args: Any, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real `dpw` command line (as `python -m engine.cli`), run to its end."""
    return subprocess.run([sys.executable, "-m", "engine.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or REPO, env=environment(), timeout=timeout)


def start(args: list[Any], **kwargs: Any) -> subprocess.Popen:
    """A process in its own session (signals meant for it never reach pytest), events on stdout."""
    return subprocess.Popen([sys.executable, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env=environment(), start_new_session=True, **kwargs)


def start_runner(db: Path, run_id: int) -> subprocess.Popen:
    """`python -m engine.runner RUN --db DB`, recorded as the run's owner as `dpw run` does."""
    proc = start(["-m", "engine.runner", run_id, "--db", db])
    Store(db).assign_runner(run_id, proc.pid)
    return proc


def read_events(proc: subprocess.Popen, until: Callable[[dict], bool], count: int = 1) -> list[dict]:
    """Events from a process's stdout until `until` held `count` times (fails at the end of the stream)."""
    events, seen = [], 0
    for line in proc.stdout:
        event = decode(line)
        if event is None:
            continue
        events.append(event)
        if until(event):
            seen += 1
            if seen >= count:
                return events
    raise AssertionError(f"the stream ended before the condition held {count} times; last: {events[-3:]}")


def write_toml(path: Path, values: dict[str, Any]) -> Path:
    lines = [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def store_with_history(path: Path) -> Path:
    """A store already holding a finished DP-SGD run and a finished PATE run (real rows, written
    through the store's own event path), so each fault can be checked to change nothing of theirs."""
    store = Store(path)
    for name, accountant, extra in (("before-dpsgd", "pld", "rdp"), ("before-pate", "pate-released", "pate-di")):
        run_id = store.create_run(_config(name))
        writer = EventWriter(run_id, stream=None, sink=store.record_event)
        writer.stream = None
        writer.emit("plan", steps=3, delta=1e-5, accountant=accountant, num_train=100, num_test=10)
        for step in (1, 2, 3):
            writer.emit("metric", step=step, epoch=step / 3, name="train_loss", value=1.0 / step)
            writer.emit("privacy", step=step, epsilon=0.1 * step, delta=1e-5, accountant=extra)
        writer.emit("privacy", step=3, epsilon=0.25, delta=1e-5, accountant=accountant)
        store.insert_many("votes", [{"run_id": run_id, "query_index": 0, "histogram": "[3, 1]", "answered": 1,
                                     "label": 0, "true_label": 0, "epsilon_cost": 0.1, "epsilon_after": 0.1}])
        writer.emit("finished", status="finished", summary={})
        store.update_run(run_id, status="finished", finished="2026-01-01T00:00:00+00:00")
    store.close()
    return path


def _config(name: str):
    from engine.config import RunConfig

    return RunConfig(name=name, noise_multiplier=1.0)


def snapshot(db: Path, run_ids: list[int]) -> dict[str, list]:
    """Every row the given runs own, in every table, to compare before and after a fault."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    marks = ",".join("?" * len(run_ids))
    rows = {"runs": conn.execute(f"select * from runs where id in ({marks}) order by id", run_ids).fetchall()}
    for table in ("metrics", "privacy", "events", "artifacts", "votes"):
        rows[table] = conn.execute(f"select * from {table} where run_id in ({marks}) order by rowid", run_ids).fetchall()
    conn.close()
    return rows


def check_ledger(db: Path) -> dict[int, dict[str, Any]]:
    """After any fault: the file is intact, every run has a final status, and each run row states the
    privacy spent: the epsilon of the last privacy row of its accountant, at the last step any stated
    accountant reached (PATE: with the queries answered so far). Returns the runs by id."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    runs = {row["id"]: dict(row) for row in conn.execute("select * from runs")}
    for run_id, run in runs.items():
        assert run["status"] in FINAL_STATUSES, f"run {run_id} is still {run['status']}"
        marks = ",".join("?" * len(NOT_STATED_ACCOUNTANTS))
        stated = conn.execute(f"select step, epsilon, accountant from privacy where run_id = ? and accountant not in "
                              f"({marks}) order by step, rowid", [run_id, *NOT_STATED_ACCOUNTANTS]).fetchall()
        if not stated:
            assert run["epsilon"] is None, f"run {run_id} states an epsilon without a privacy row"
            continue
        last_step = stated[-1]["step"]
        assert run["steps_done"] == last_step, f"run {run_id}: steps_done {run['steps_done']}, privacy to {last_step}"
        mine = [r["epsilon"] for r in stated if r["step"] == last_step and r["accountant"] == run["accountant"]]
        assert mine, f"run {run_id}: no {run['accountant']} privacy row at step {last_step}"
        assert run["epsilon"] == pytest.approx(mine[-1], rel=1e-12)
        summary = json.loads(run["summary"]) if run["summary"] else {}
        if run["mechanism"] == "pate" and "queries" in summary and "answered" in summary:
            answered = conn.execute("select coalesce(sum(answered), 0) from votes where run_id = ? and query_index < ?",
                                    [run_id, summary["queries"]]).fetchone()[0]
            assert summary["answered"] == answered
            assert summary["queries"] >= run["steps_done"]
    conn.close()
    return runs
