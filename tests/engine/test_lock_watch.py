"""A run waiting on another program's hold of the store's write lock is said to wait (engine.lock_watch),
once, and only while that lock is held and the runner is silent."""

from __future__ import annotations

import sqlite3
import time

from engine.config import RunConfig
from engine.lock_watch import LockWatch, write_locked
from engine.store import BUSY_TIMEOUT_S, Store


def held_store(tmp_path):
    path = tmp_path / "runs.sqlite"
    Store(path).create_run(RunConfig(name="there", noise_multiplier=1.0))
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    return path, holder


def wait_for(condition, limit_s: float = 10.0) -> bool:
    end = time.monotonic() + limit_s
    while not condition() and time.monotonic() < end:
        time.sleep(0.05)
    return condition()


def test_the_lock_is_seen_without_waiting_and_without_keeping_it(tmp_path):
    path, holder = held_store(tmp_path)
    assert not write_locked(path)
    holder.execute("BEGIN IMMEDIATE")  # an sqlite3 shell inside a transaction
    started = time.monotonic()
    assert write_locked(path) and time.monotonic() - started < 1.0
    holder.execute("ROLLBACK")
    assert not write_locked(path)
    Store(path).create_run(RunConfig(name="after", noise_multiplier=1.0))  # the look left no lock behind
    gone = tmp_path / "moved-away.sqlite"
    assert not write_locked(gone) and not gone.exists()  # a store gone meanwhile is not made again


def test_a_silent_run_behind_a_held_lock_is_said_to_wait_once(tmp_path):
    path, holder = held_store(tmp_path)
    said: list[str] = []
    holder.execute("BEGIN EXCLUSIVE")
    watch = LockWatch(path, said.append, quiet_s=0.3).start()
    assert wait_for(lambda: said)
    time.sleep(1.0)
    watch.stop()
    holder.execute("ROLLBACK")
    assert said == [f"waiting for runs.sqlite: another program holds its write lock (an sqlite3 shell or a "
                    f"backup?); the run goes on once it is released, and fails after {BUSY_TIMEOUT_S} s"]


def test_nothing_is_said_while_the_runner_talks_or_the_lock_is_free(tmp_path):
    path, holder = held_store(tmp_path)
    said: list[str] = []
    free = LockWatch(path, said.append, quiet_s=0.2).start()  # silent, but nothing holds the lock
    time.sleep(1.5)
    free.stop()
    holder.execute("BEGIN IMMEDIATE")
    talking = LockWatch(path, said.append, quiet_s=0.6).start()  # the lock is held, the runner talks
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        talking.heard()
        time.sleep(0.05)
    talking.stop()
    time.sleep(1.2)  # stopped: it says nothing afterwards either
    holder.execute("ROLLBACK")
    assert said == []


def test_no_watch_where_no_person_reads_stderr(tmp_path, monkeypatch):
    """A pipe or --json output gets no line, so nothing is started to look at the store for one."""
    import engine.cli_shell
    from engine.lock_watch import on_terminal

    path, _ = held_store(tmp_path)
    monkeypatch.setattr(engine.cli_shell, "person_watches", lambda: True)
    assert on_terminal(path, as_json=True) is None
    watch = on_terminal(path, as_json=False)
    assert isinstance(watch, LockWatch) and watch._thread.is_alive()
    watch.stop()
    monkeypatch.setattr(engine.cli_shell, "person_watches", lambda: False)  # a pipe
    assert on_terminal(path, as_json=False) is None
