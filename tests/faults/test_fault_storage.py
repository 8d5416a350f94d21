"""Storage faults: a full disk under a training run (SQLite's `PRAGMA max_page_count` on the runner's
own connection), schema creation and the 1->2 upgrade killed half way, four `dpw run` at once on
one store. After each the store is intact, every run final, the privacy spent recorded, and the
store usable again once the cause is gone."""

from __future__ import annotations

import sqlite3
import subprocess
import textwrap

import pytest

from fault_helpers import DIGITS, check_ledger, dpw, read_events, snapshot, start, store_with_history, write_toml

from engine.config import RunConfig
from engine.events import decode
from engine.store import SCHEMA_VERSION, Store

FULL_DISK_RUNNER = textwrap.dedent("""
    import sys
    from engine.runner import execute
    from engine.store import Store
    store = Store(sys.argv[1])
    pages = store.db.conn.execute("PRAGMA page_count").fetchone()[0]
    store.db.conn.execute(f"PRAGMA max_page_count = {pages + int(sys.argv[3])}")  # the disk is full beyond this
    sys.exit(0 if execute(store, int(sys.argv[2]), stream=sys.stdout) != "failed" else 1)
""")


def test_a_full_disk_mid_run_fails_the_run_clearly_and_keeps_the_privacy_spent(tmp_path):
    db = store_with_history(tmp_path / "runs.sqlite")
    before = snapshot(db, [1, 2])
    run_id = Store(db).create_run(RunConfig(**dict(DIGITS, epochs=2)))
    proc = start(["-c", FULL_DISK_RUNNER, db, run_id, 2])
    Store(db).assign_runner(run_id, proc.pid)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Traceback" not in err
    error = next(e for e in map(decode, out.splitlines()) if e and e["type"] == "error")
    assert "full" in error["message"] and "bug" not in (error["hint"] or "")

    assert dpw("list", "--db", db).returncode == 0  # reconciles the run if not even its failure fitted
    run = check_ledger(db)[run_id]
    assert run["status"] == "failed" and run["epsilon"] is not None and 0 < run["steps_done"] < 46
    assert snapshot(db, [1, 2]) == before
    store = Store(db)  # the disk has room again: the same file takes new runs
    assert store.create_run(RunConfig(**DIGITS)) == run_id + 1


MIGRATION_KILLED = textwrap.dedent("""
    import sys, time
    import engine.store as store_module
    number = int(sys.argv[2])
    real = store_module.MIGRATIONS[number - 1]
    def slow(db):
        real(db)
        print("tables created", flush=True)
        time.sleep(600)  # killed here, before its version is set
    store_module.MIGRATIONS[number - 1] = slow
    store_module.Store(sys.argv[1])
""")


def _kill_in_migration(db, number: int) -> None:
    proc = start(["-c", MIGRATION_KILLED, db, number])
    assert proc.stdout.readline().strip() == "tables created", proc.stderr.read()
    proc.kill()
    proc.wait(timeout=60)


def test_schema_creation_killed_half_way_leaves_a_store_that_opens(tmp_path):
    db = tmp_path / "runs.sqlite"
    _kill_in_migration(db, 1)
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 0
    assert raw.execute("select count(*) from sqlite_master").fetchone()[0] == 0
    raw.close()
    listed = dpw("list", "--db", db)
    assert listed.returncode == 0 and "no runs yet" in listed.stdout, listed.stderr
    assert Store(db).schema_version == SCHEMA_VERSION


def test_an_upgrade_killed_half_way_keeps_every_run_and_upgrades_next_time(tmp_path):
    db = store_with_history(tmp_path / "runs.sqlite")
    raw = sqlite3.connect(db)
    raw.execute("drop table deleted_runs")
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    before = snapshot(db, [1, 2])
    _kill_in_migration(db, 2)
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 1
    raw.close()
    listed = dpw("list", "--db", db)
    assert listed.returncode == 0 and "before-pate" in listed.stdout, listed.stderr
    check_ledger(db)
    assert snapshot(db, [1, 2]) == before and Store(db).schema_version == SCHEMA_VERSION


def test_four_dpw_run_at_once_on_one_store_all_train(tmp_path):
    db = store_with_history(tmp_path / "runs.sqlite")
    before = snapshot(db, [1, 2])
    config = write_toml(tmp_path / "tiny.toml", dict(DIGITS, expected_batch_size=256, evaluations_per_epoch=1))
    procs = [start(["-m", "engine.cli", "run", config, "--db", db, "--json"]) for _ in range(4)]
    finished = []
    for proc in procs:
        finished.append(read_events(proc, lambda e: e["type"] == "finished")[-1])
        proc.communicate(timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert sorted(e["run_id"] for e in finished) == [3, 4, 5, 6]
    runs = check_ledger(db)
    assert [runs[i]["status"] for i in (3, 4, 5, 6)] == ["finished"] * 4
    assert all(runs[i]["epsilon"] is not None for i in (3, 4, 5, 6))
    assert snapshot(db, [1, 2]) == before


@pytest.fixture
def small_disk(tmp_path):
    """A real 200 KB file system (a tmpfs): mounting needs root with mount rights, else the test is skipped."""
    disk = tmp_path / "small-disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", disk], capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root with mount rights")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", disk], capture_output=True)


def test_a_store_first_opened_on_a_full_disk_is_refused_in_one_line_and_opens_once_there_is_room(small_disk,
                                                                                                tmp_path):
    """A real full file system (small_disk): the schema creation fails as a whole, and the same path works
    once space is freed."""
    filler = small_disk / "filler"
    with open(filler, "wb") as f:  # leave about 60 KB: too little for a new store's first transaction
        f.write(b"\0" * (140 * 1024))
    db = small_disk / "runs.sqlite"
    # dpw run checks the config against the data, then creates the store: this one passes the check.
    config = write_toml(tmp_path / "digits.toml", DIGITS)
    refused = dpw("run", config, "--db", db)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "full" in refused.stderr and "bug" not in refused.stderr
    filler.unlink()
    Store(db).close()  # as the next dpw run would create it, without training a run here
    listed = dpw("list", "--db", db)
    assert listed.returncode == 0 and "no runs yet" in listed.stdout, listed.stderr
    assert Store(db).schema_version == SCHEMA_VERSION


def test_a_full_disk_under_an_existing_store_is_named_as_such_and_leaves_it_intact(small_disk, tmp_path):
    """An existing store whose disk then fills up (small_disk): opening it needs its -wal and -shm files, so
    even `dpw list` fails; both it and `dpw run` say the disk is full (was "disk I/O error ... check that the
    file exists"), and once there is room the store is as it was."""
    db = small_disk / "runs.sqlite"
    Store(db).close()  # created while there was room
    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass  # the disk is full
    config = write_toml(tmp_path / "digits.toml", DIGITS)
    for args in (("list", "--db", db), ("run", config, "--db", db)):
        refused = dpw(*args)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert "disk holding" in refused.stderr and "is full" in refused.stderr, refused.stderr
    filler.unlink()
    listed = dpw("list", "--db", db)
    assert listed.returncode == 0 and "no runs yet" in listed.stdout, listed.stderr
