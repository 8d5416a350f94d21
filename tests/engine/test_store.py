"""The SQLite store: schema version, event rows, orphaned runs, WAL mode."""

import os
import subprocess
import sys

import pytest

from engine.config import RunConfig
from engine.errors import DPWError
from engine.events import EventWriter
from engine.store import SCHEMA_VERSION, Store


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "runs.sqlite")


def test_new_store_has_schema_version_and_wal(store):
    assert store.schema_version == SCHEMA_VERSION
    assert store.db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert {"runs", "metrics", "privacy", "events", "artifacts", "votes"} <= set(store.db.table_names())


def test_reopening_keeps_runs_and_does_not_migrate_again(tmp_path):
    path = tmp_path / "runs.sqlite"
    run_id = Store(path).create_run(RunConfig(name="keep", noise_multiplier=1.0))
    again = Store(path)
    assert again.get_run(run_id)["name"] == "keep"
    assert again.schema_version == SCHEMA_VERSION


def test_a_newer_schema_is_refused_not_dropped(tmp_path):
    path = tmp_path / "runs.sqlite"
    Store(path).db.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(DPWError, match="newer than this version"):
        Store(path)


def test_events_fill_their_tables_and_replay_in_order(store):
    run_id = store.create_run(RunConfig(name="e", noise_multiplier=1.0))
    writer = EventWriter(run_id, stream=None, sink=store.record_event)
    writer.emit("started", name="e")
    writer.emit("metric", step=1, epoch=0.1, name="train_loss", value=2.3)
    writer.emit("privacy", step=1, epsilon=0.5, delta=1e-5, accountant="rdp")
    writer.emit("artifact", kind="model", path="/x/model.pt", sha256="ab")
    writer.emit("finished", status="finished", summary={})
    assert store.table_counts(run_id) == {"metrics": 1, "privacy": 1, "events": 5, "artifacts": 1, "votes": 0}
    assert [e["type"] for e in store.events(run_id)] == ["started", "metric", "privacy", "artifact", "finished"]
    assert [e["type"] for e in store.events(run_id, exclude=("metric", "privacy"))] == [
        "started", "artifact", "finished"]
    assert store.metrics(run_id, "train_loss")[0]["value"] == 2.3
    assert store.privacy(run_id)[0]["accountant"] == "rdp"


def test_find_run_by_name_takes_the_newest(store):
    store.create_run(RunConfig(name="same", noise_multiplier=1.0))
    newest = store.create_run(RunConfig(name="same", noise_multiplier=2.0))
    assert store.find_run("same")["id"] == newest
    with pytest.raises(DPWError, match="no run named"):
        store.find_run("other")


def test_run_whose_process_died_is_marked_failed(store):
    run_id = store.create_run(RunConfig(name="lost", noise_multiplier=1.0))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.update_run(run_id, status="running", pid=dead.pid, host=os.uname().nodename)
    store.update_run(run_id, host=__import__("socket").gethostname())
    assert store.reconcile_orphans() == [run_id]
    row = store.get_run(run_id)
    assert row["status"] == "failed" and "ended without reporting" in row["error"]


def test_running_run_with_live_process_is_left_alone(store):
    run_id = store.create_run(RunConfig(name="alive", noise_multiplier=1.0))
    store.mark_running(run_id)  # this test process is alive
    assert store.reconcile_orphans() == []
    assert store.get_run(run_id)["status"] == "running"


def test_unknown_status_is_refused(store):
    run_id = store.create_run(RunConfig(name="s", noise_multiplier=1.0))
    with pytest.raises(ValueError):
        store.update_run(run_id, status="done")


def _run_with_rows(store: Store, name: str) -> int:
    run_id = store.create_run(RunConfig(name=name, noise_multiplier=1.0))
    writer = EventWriter(run_id, stream=None, sink=store.record_event)
    writer.emit("metric", step=1, epoch=0.1, name="train_loss", value=2.3)
    writer.emit("privacy", step=1, epsilon=0.5, delta=1e-5, accountant="pld")
    writer.emit("artifact", kind="model", path="/x/model.pt", sha256="ab")
    store.insert_many("votes", [{"run_id": run_id, "query_index": 0, "histogram": "[3, 1]", "answered": 1,
                                 "label": 0, "true_label": 0, "epsilon_cost": 0.1, "epsilon_after": 0.1}])
    store.update_run(run_id, status="finished", epsilon=0.5, delta=1e-5, accountant="pld")
    return run_id


def test_deleting_a_run_removes_every_row_it_owns_and_keeps_a_record(store):
    gone, kept = _run_with_rows(store, "gone"), _run_with_rows(store, "kept")
    before = store.table_counts(kept)
    removed = store.delete_run(gone)
    assert removed["name"] == "gone"
    assert [r["id"] for r in store.list_runs()] == [kept]
    assert store.table_counts(gone) == {"metrics": 0, "privacy": 0, "events": 0, "artifacts": 0, "votes": 0}
    assert store.table_counts(kept) == before
    [record] = store.deleted_runs()
    assert record["id"] == gone and record["name"] == "gone" and record["epsilon"] == 0.5
    assert record["status"] == "finished" and record["deleted"]
    with pytest.raises(DPWError, match="no run with id"):
        store.get_run(gone)


def test_ids_of_deleted_runs_are_never_given_again(store):
    first = store.create_run(RunConfig(name="a", noise_multiplier=1.0))
    newest = store.create_run(RunConfig(name="b", noise_multiplier=1.0))
    store.delete_run(newest)
    store.delete_run(first)
    assert store.create_run(RunConfig(name="c", noise_multiplier=1.0)) == newest + 1


def test_a_running_run_cannot_be_deleted(store):
    run_id = store.create_run(RunConfig(name="busy", noise_multiplier=1.0))
    store.mark_running(run_id)  # this test process is its live runner
    with pytest.raises(DPWError, match="is running; stop it"):
        store.delete_run(run_id)
    assert store.get_run(run_id)["status"] == "running" and store.deleted_runs() == []


def test_a_version_1_store_is_migrated_with_its_runs(tmp_path):
    import sqlite_utils

    from engine.store import MIGRATIONS

    path = tmp_path / "old.sqlite"
    db = sqlite_utils.Database(path)
    MIGRATIONS[0](db)
    db.conn.execute("PRAGMA user_version = 1")
    db["runs"].insert({"id": 7, "name": "old", "status": "finished", "config": "{}"})
    db.conn.commit()
    db.close()
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION == 2
    assert store.get_run(7)["name"] == "old"
    store.delete_run(7)
    assert store.create_run(RunConfig(name="new", noise_multiplier=1.0)) == 8
