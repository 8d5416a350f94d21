"""The SQLite store: schema version, event rows, orphaned runs, WAL mode."""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import RunConfig
from engine.errors import DPWError
from engine.events import EventWriter
from engine.store import SCHEMA_VERSION, Store
from left_behind_wal import backup_restored_beside_a_stale_log, write_and_die


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


def test_a_run_named_with_digits_is_found_by_name_when_no_id_matches(store):
    named = store.create_run(RunConfig(name="42", noise_multiplier=1.0))
    assert store.find_run("42")["id"] == named == 1
    assert store.find_run("1")["id"] == 1
    with pytest.raises(DPWError, match="no run with id 7"):
        store.find_run("7")


def test_a_run_counted_back_from_the_newest(store):
    first = store.create_run(RunConfig(name="first", noise_multiplier=1.0))
    second = store.create_run(RunConfig(name="second", noise_multiplier=1.0))
    assert store.find_run("-1")["id"] == second
    assert store.find_run("-2")["id"] == first
    for ref in ("-3", "-" + "9" * 30):
        with pytest.raises(DPWError, match=rf"no run {ref} in .*it holds 2 runs \(-1 is the newest\)"):
            store.find_run(ref)
    named = store.create_run(RunConfig(name="-5", noise_multiplier=1.0))  # no fifth newest: the name
    assert store.find_run("-5")["id"] == named


def test_runs_named_several_times_are_found_once_in_the_order_first_named(store):
    first = store.create_run(RunConfig(name="a", noise_multiplier=1.0))
    second = store.create_run(RunConfig(name="b", noise_multiplier=1.0))
    assert [r["id"] for r in store.find_runs(["-1", str(first), "b", "a"])] == [second, first]
    with pytest.raises(DPWError, match="no run named 'c'"):
        store.find_runs(["a", "c"])


def test_a_renamed_run_is_found_by_its_new_name_with_its_config_hash_unchanged(store):
    run_id = store.create_run(RunConfig(name="first try", noise_multiplier=1.0))
    before = store.get_run(run_id)
    assert store.rename_run(run_id, "  lr 0.5  ") == "lr 0.5"
    after = store.find_run("lr 0.5")
    assert after["id"] == run_id and after["config"]["name"] == "lr 0.5"
    assert after["config_hash"] == before["config_hash"] == RunConfig.from_dict(after["config"]).config_hash()
    assert {k: v for k, v in after["config"].items() if k != "name"} == \
        {k: v for k, v in before["config"].items() if k != "name"}
    for bad, words in (("", "must not be empty"), ("two\nlines", "line break")):
        with pytest.raises(DPWError, match=words):
            store.rename_run(run_id, bad)
    with pytest.raises(DPWError, match="no run with id 9"):
        store.rename_run(9, "x")
    assert store.get_run(run_id)["name"] == "lr 0.5"


def test_an_id_beyond_sqlites_integers_is_no_run(store):
    """It was an OverflowError traceback from show, tag, delete, export, report, audit and resume."""
    store.create_run(RunConfig(name="r", noise_multiplier=1.0))
    for ref in ("9" * 23, 2**63, -(2**63) - 1):
        with pytest.raises(DPWError, match=f"no run with id {ref}"):
            store.find_run(ref)


def test_run_whose_process_died_is_marked_failed(store):
    run_id = store.create_run(RunConfig(name="lost", noise_multiplier=1.0))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.update_run(run_id, status="running", pid=dead.pid, host=os.uname().nodename)
    store.update_run(run_id, host=__import__("socket").gethostname())
    assert store.reconcile_orphans() == [run_id]
    row = store.get_run(run_id)
    assert row["status"] == "failed" and "ended without reporting" in row["error"]


def test_a_lost_run_states_the_lock_its_runner_could_not_record(tmp_path):
    """Another program held the write lock past the busy timeout: the runner could record neither
    its step nor its failure, and whoever marked the lost run failed said "killed or crashed"."""
    import io

    from engine.runner import record_failure

    path = tmp_path / "runs.sqlite"
    store = Store(path)
    run_id = store.create_run(RunConfig(name="locked out", noise_multiplier=1.0))
    store.mark_running(run_id)
    store.db.conn.execute("PRAGMA busy_timeout = 100")  # the runner's 120 s, shortened
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError, match="locked") as gave_up:
        store.update_run(run_id, steps_done=30)
    stream = io.StringIO()
    record_failure(store, run_id, EventWriter(run_id, stream=stream, sink=store.record_event), gave_up.value,
                   where="training")
    holder.execute("ROLLBACK")
    assert "could not record this failure" in stream.getvalue()
    assert store.get_run(run_id)["status"] == "running"

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.update_run(run_id, pid=dead.pid)  # the runner has exited
    assert Store(path).reconcile_orphans() == [run_id]
    row = store.get_run(run_id)
    assert row["status"] == "failed" and "stayed locked by another program" in row["error"]
    assert "killed" not in row["error"] and "privacy it spent" in row["error_hint"]


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
    with pytest.raises(DPWError, match="is running; stop it") as refused:
        store.delete_run(run_id)
    assert f"kill {os.getpid()}" in refused.value.hint  # its runner, even when its `dpw run` is gone
    assert store.get_run(run_id)["status"] == "running" and store.deleted_runs() == []


def older_store(path, version: int, **rows) -> None:
    """A store file as an older version left it: its first `version` migrations and these rows per table."""
    import sqlite_utils

    from engine.store import MIGRATIONS

    db = sqlite_utils.Database(path)
    for migration in MIGRATIONS[:version]:
        migration(db)
    db.conn.execute(f"PRAGMA user_version = {version}")
    for table, table_rows in rows.items():
        db[table].insert_all(table_rows)
    db.conn.commit()
    db.close()


def test_a_version_1_store_is_migrated_with_its_runs(tmp_path):
    path = tmp_path / "old.sqlite"
    older_store(path, 1, runs=[{"id": 7, "name": "old", "status": "finished", "config": "{}"}])
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION == 7
    assert store.get_run(7)["name"] == "old"
    store.delete_run(7)
    assert store.create_run(RunConfig(name="new", noise_multiplier=1.0)) == 8


# ---- the ledger: the run row carries the privacy spent as it is spent ------------------------------
def _writer(store: Store, name: str = "ledger", **plan) -> tuple[int, EventWriter]:
    run_id = store.create_run(RunConfig(name=name, noise_multiplier=1.0))
    writer = EventWriter(run_id, stream=None, sink=store.record_event)
    writer.emit("plan", steps=100, sample_rate=0.01, noise_multiplier=1.0, delta=1e-5, num_train=1000,
                num_test=100, accountant=plan.get("accountant", "pld"))
    return run_id, writer


def test_the_run_row_carries_the_live_bound_then_the_reported_one_at_each_step(store):
    run_id, writer = _writer(store)
    assert store.get_run(run_id)["steps_planned"] == 100 and store.get_run(run_id)["sample_rate"] == 0.01
    writer.emit("privacy", step=1, epsilon=0.30, delta=1e-5, accountant="rdp")
    writer.emit("privacy", step=2, epsilon=0.40, delta=1e-5, accountant="rdp")
    row = store.get_run(run_id)
    assert (row["epsilon"], row["accountant"], row["steps_done"]) == (0.40, "rdp", 2)
    writer.emit("privacy", step=2, epsilon=0.35, delta=1e-5, accountant="pld")  # the tight one, computed late
    row = store.get_run(run_id)
    assert (row["epsilon"], row["accountant"], row["steps_done"]) == (0.35, "pld", 2)
    writer.emit("privacy", step=3, epsilon=0.45, delta=1e-5, accountant="rdp")
    row = store.get_run(run_id)
    assert (row["epsilon"], row["accountant"], row["steps_done"], row["status"]) == (0.45, "rdp", 3, "queued")


def test_an_older_step_or_a_looser_bound_never_replaces_the_recorded_spend(store):
    run_id, writer = _writer(store)
    writer.emit("privacy", step=5, epsilon=1.0, delta=1e-5, accountant="pld")
    writer.emit("privacy", step=5, epsilon=1.2, delta=1e-5, accountant="rdp")
    writer.emit("privacy", step=4, epsilon=0.9, delta=1e-5, accountant="pld")
    row = store.get_run(run_id)
    assert (row["epsilon"], row["accountant"], row["steps_done"]) == (1.0, "pld", 5)


def test_pate_data_dependent_epsilon_is_never_the_stated_spend_and_queries_are_counted(store):
    run_id, writer = _writer(store, accountant="pate-dd")
    writer.emit("vote_batch", first_query=0, count=100, answered=60, rejected=40)
    writer.emit("privacy", step=100, epsilon=0.8, delta=1e-5, accountant="pate-dd")
    writer.emit("privacy", step=100, epsilon=2.5, delta=1e-5, accountant="pate-di")
    writer.emit("vote_batch", first_query=100, count=50, answered=20, rejected=30)
    writer.emit("privacy", step=150, epsilon=0.9, delta=1e-5, accountant="pate-dd")
    row = store.get_run(run_id)
    assert (row["epsilon"], row["accountant"], row["steps_done"]) == (2.5, "pate-di", 100)
    assert row["summary"] == {"queries": 150, "answered": 80}


def test_an_infinite_epsilon_is_recorded_and_replayed(store):
    run_id, writer = _writer(store)
    writer.emit("privacy", step=1, epsilon=float("inf"), delta=1e-5, accountant="rdp")
    assert store.get_run(run_id)["epsilon"] == float("inf")
    assert store.events(run_id)[-1]["epsilon"] == float("inf")


# ---- ids, orphans, take-over ---------------------------------------------------------------------
def _create_one(path: str, barrier, queue) -> None:
    store = Store(path)
    barrier.wait()
    try:
        queue.put(store.create_run(RunConfig(name="race", noise_multiplier=1.0)))
    except Exception as exc:  # reported to the test, which fails on it
        queue.put(f"{type(exc).__name__}: {exc}")


def test_concurrent_creators_all_get_distinct_ids(tmp_path):
    import multiprocessing

    path = str(tmp_path / "runs.sqlite")
    Store(path).close()
    context = multiprocessing.get_context("spawn")
    barrier, queue = context.Barrier(6), context.Queue()
    workers = [context.Process(target=_create_one, args=(path, barrier, queue)) for _ in range(6)]
    for w in workers:
        w.start()
    results = sorted(str(queue.get(timeout=120)) for _ in workers)
    for w in workers:
        w.join()
    assert results == [str(i) for i in range(1, 7)]


def test_a_queued_run_whose_creator_died_is_failed_with_the_reason(store):
    run_id = store.create_run(RunConfig(name="never", noise_multiplier=1.0))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.assign_runner(run_id, dead.pid)
    assert [r["status"] for r in store.list_runs()] == ["failed"]
    assert "never started" in store.get_run(run_id)["error"]
    with pytest.raises(DPWError, match="is failed, not queued"):
        store.mark_running(run_id)


def test_a_queued_run_with_a_live_creator_is_left_alone(store):
    run_id = store.create_run(RunConfig(name="waiting", noise_multiplier=1.0))
    assert store.reconcile_orphans() == [] and store.get_run(run_id)["status"] == "queued"


# ---- atomic schema changes -----------------------------------------------------------------------
def _interrupt(monkeypatch, number: int) -> None:
    import engine.store as store_module

    real = store_module.MIGRATIONS[number - 1]

    def fails_after_its_ddl(db):
        real(db)
        raise sqlite3.OperationalError("database or disk is full")

    patched = list(store_module.MIGRATIONS)
    patched[number - 1] = fails_after_its_ddl
    monkeypatch.setattr(store_module, "MIGRATIONS", patched)


def test_an_interrupted_schema_creation_leaves_nothing_and_opens_later(tmp_path, monkeypatch):
    path = tmp_path / "runs.sqlite"
    _interrupt(monkeypatch, 1)
    with pytest.raises(DPWError, match="full"):
        Store(path)
    monkeypatch.undo()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 0
    assert raw.execute("select count(*) from sqlite_master").fetchone()[0] == 0
    raw.close()
    assert Store(path).schema_version == SCHEMA_VERSION


def test_an_interrupted_upgrade_keeps_the_old_schema_and_upgrades_later(tmp_path, monkeypatch):
    path = tmp_path / "runs.sqlite"
    kept = Store(path).create_run(RunConfig(name="kept", noise_multiplier=1.0))
    raw = sqlite3.connect(path)
    raw.execute("drop table deleted_runs")
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    _interrupt(monkeypatch, 2)
    with pytest.raises(DPWError):
        Store(path)
    monkeypatch.undo()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 1
    assert raw.execute("select name from sqlite_master where name = 'deleted_runs'").fetchone() is None
    raw.close()
    again = Store(path)
    assert again.schema_version == SCHEMA_VERSION and again.get_run(kept)["name"] == "kept"


def test_a_store_an_older_version_left_half_created_is_completed(tmp_path):
    path = tmp_path / "runs.sqlite"
    raw = sqlite3.connect(path)
    raw.execute("create table [runs] ([id] INTEGER PRIMARY KEY, [name] TEXT, [status] TEXT, [config] TEXT)")
    raw.commit()
    raw.close()
    assert Store(path).schema_version == SCHEMA_VERSION


# ---- files that are not (usable) stores are refused and left unchanged -----------------------------
def _sha(path) -> str:
    import hashlib

    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_a_text_file_is_refused_unchanged(tmp_path):
    path = tmp_path / "notes.sqlite"
    path.write_text("my notes\n")
    with pytest.raises(DPWError, match="not an SQLite database"):
        Store(path)
    assert path.read_text() == "my notes\n"


def test_another_applications_database_is_refused_unchanged(tmp_path):
    path = tmp_path / "contacts.db"
    raw = sqlite3.connect(path)
    raw.execute("create table contacts(name text, phone text)")
    raw.commit()
    raw.close()
    before = _sha(path)
    with pytest.raises(DPWError, match="another application's SQLite database .*contacts"):
        Store(path)
    assert _sha(path) == before and not Path(f"{path}-wal").exists()


def test_a_path_under_a_file_or_a_folder_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DPWError, match="notes.txt is a file, not a folder"):
        Store(tmp_path / "notes.txt" / "runs.sqlite")
    with pytest.raises(DPWError, match="is a folder"):
        Store(tmp_path)


def test_a_fifo_at_the_store_path_is_refused_at_once(tmp_path):
    """Reading its header waited for a writer for ever: `dpw list` hung."""
    fifo = tmp_path / "runs.sqlite"
    os.mkfifo(fifo)
    listed = subprocess.run([sys.executable, "-m", "engine.cli", "list", "--db", str(fifo)], capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 1 and f"{fifo} is not a regular file, so it cannot be a store" in listed.stderr


def test_a_folder_or_a_broken_link_in_place_of_the_wal_file_is_named(tmp_path):
    """SQLite says only "unable to open database file": the line named neither the -wal nor what to do."""
    db = tmp_path / "runs.sqlite"
    Store(db).close()
    wal = tmp_path / "runs.sqlite-wal"
    wal.mkdir()
    listed = subprocess.run([sys.executable, "-m", "engine.cli", "list", "--db", str(db)], capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 1 and f"{wal} is a folder, where SQLite keeps the store's wal file" in listed.stderr
    assert f"move {wal} away; the store itself was left unchanged" in listed.stderr
    wal.rmdir()
    wal.symlink_to(tmp_path / "gone")
    listed = subprocess.run([sys.executable, "-m", "engine.cli", "list", "--db", str(db)], capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 1 and f"{wal} is a link to {tmp_path / 'gone'}, which does not exist" in listed.stderr


def test_a_damaged_store_is_never_written(tmp_path):
    path = tmp_path / "runs.sqlite"
    store = Store(path)
    for i in range(40):
        _run_with_rows(store, f"r{i}")
    store.close()
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\x5a" * 4096)
    before = _sha(path)
    with pytest.raises(DPWError, match="is damaged") as refused:
        Store(path).create_run(RunConfig(name="into the damage", noise_multiplier=1.0))
    assert '.recover' in refused.value.hint
    assert _sha(path) == before


def test_a_read_only_store_reads_and_refuses_writes(tmp_path):
    path = tmp_path / "runs.sqlite"
    run_id = Store(path).create_run(RunConfig(name="kept", noise_multiplier=1.0))
    before = _sha(path)
    reader = Store(path, readonly=True)
    assert reader.get_run(run_id)["name"] == "kept" and reader.list_runs()
    with pytest.raises(DPWError, match="read-only"):
        reader.create_run(RunConfig(name="new", noise_multiplier=1.0))
    assert _sha(path) == before


def test_a_writer_waits_for_a_held_write_lock(tmp_path):
    import threading
    import time

    path = tmp_path / "runs.sqlite"
    store = Store(path)
    assert store.db.conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 60_000
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(1.5, lambda: holder.execute("COMMIT"))
    release.start()
    started = time.monotonic()
    run_id = store.create_run(RunConfig(name="waited", noise_multiplier=1.0))
    release.join()
    assert store.get_run(run_id)["name"] == "waited" and time.monotonic() - started > 0.5


def test_a_read_only_store_of_an_older_schema_is_read_as_it_is(tmp_path):
    path = tmp_path / "runs.sqlite"
    run_id = Store(path).create_run(RunConfig(name="older", noise_multiplier=1.0))
    raw = sqlite3.connect(path)
    raw.execute("alter table runs drop column study_id")
    raw.execute("drop table studies")
    raw.execute("PRAGMA user_version = 2")
    raw.commit()
    raw.close()
    before = _sha(path)
    reader = Store(path, readonly=True)
    assert [r["name"] for r in reader.list_runs()] == ["older"] and reader.get_run(run_id)["name"] == "older"
    assert reader.schema_version == 2 and _sha(path) == before


def test_running_run_whose_pid_now_belongs_to_a_newer_process_is_marked_failed(store):
    """A runner that died long ago leaves its pid to be reused; the live process holding it began after
    the run started, so the run is not left `running` for ever."""
    run_id = store.create_run(RunConfig(name="reused", noise_multiplier=1.0))
    newer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        store.update_run(run_id, status="running", pid=newer.pid, host=__import__("socket").gethostname(),
                         started="2020-01-01T00:00:00.000+00:00")
        assert store.reconcile_orphans() == [run_id]
        assert store.get_run(run_id)["status"] == "failed"
    finally:
        newer.kill()
        newer.wait()


# ---- tags and notes (schema 4) ---------------------------------------------------------------------
def test_tags_and_notes_are_kept_in_the_file_across_a_reopen(tmp_path):
    path = tmp_path / "runs.sqlite"
    store = Store(path)
    run_id = store.create_run(RunConfig(name="tagged", noise_multiplier=1.0))
    other = store.create_run(RunConfig(name="other", noise_multiplier=1.0))
    assert store.add_tags(run_id, ["baseline", " sweep,  lr  0.5 ", "baseline"]) == ["baseline", "sweep", "lr 0.5"]
    store.set_notes(run_id, "  clipping too tight?  ")
    store.close()
    again = Store(path)
    run = again.get_run(run_id)
    assert run["tags"] == ["baseline", "sweep", "lr 0.5"] and run["notes"] == "clipping too tight?"
    assert {r["id"]: r["tags"] for r in again.list_runs()} == {run_id: ["baseline", "sweep", "lr 0.5"], other: []}
    assert again.remove_tags(run_id, ["sweep", "never-there"]) == ["baseline", "lr 0.5"]
    assert again.set_tags(run_id, "final, baseline") == ["final", "baseline"]
    again.set_notes(run_id, "")
    raw = sqlite3.connect(path)
    assert raw.execute("select tag from run_tags where run_id = ? order by tag", [run_id]).fetchall() == [
        ("baseline",), ("final",)]
    assert raw.execute("select notes from runs where id = ?", [run_id]).fetchone() == (None,)


def test_a_tag_for_a_missing_run_or_too_long_is_one_clear_error(store):
    with pytest.raises(DPWError, match="no run with id 99"):
        store.add_tags(99, ["x"])
    run_id = store.create_run(RunConfig(name="a", noise_multiplier=1.0))
    with pytest.raises(DPWError, match="at most 64"):
        store.add_tags(run_id, ["x" * 65])
    assert store.tags(run_id) == []


def test_a_deleted_run_keeps_its_privacy_spent_tags_and_notes(store):
    run_id = _run_with_rows(store, "dropped")
    store.add_tags(run_id, ["pilot", "mnist"])
    store.set_notes(run_id, "wrong clipping norm")
    store.delete_run(run_id)
    [record] = store.deleted_runs()
    assert record["epsilon"] == 0.5 and record["delta"] == 1e-5 and record["accountant"] == "pld"
    assert record["tags"] == ["pilot", "mnist"] and record["notes"] == "wrong clipping norm"
    assert store.db.conn.execute("select count(*) from run_tags where run_id = ?", [run_id]).fetchone()[0] == 0


def test_a_deleted_pate_run_keeps_its_guarantee_not_the_data_dependent_epsilon_nor_its_estimate(store):
    run_id = store.create_run(RunConfig(name="pate", mechanism="pate", noise_multiplier=1.0))
    store.update_run(run_id, status="finished", epsilon=3.0, delta=1e-5, accountant="pate-di",
                     summary={"epsilon_data_independent": 3.0, "epsilon_released": 2.2,
                              "epsilon_data_dependent": 0.4, "delta": 1e-5})
    store.delete_run(run_id)
    [record] = store.deleted_runs()
    assert (record["epsilon"], record["accountant"]) == (3.0, "pate-di")


def test_a_schema_3_store_gains_tags_and_notes_and_keeps_its_runs_and_records(tmp_path):
    path = tmp_path / "old.sqlite"
    older_store(path, 3, runs=[{"id": 5, "name": "old", "status": "finished", "config": "{}", "epsilon": 1.5}],
                deleted_runs=[{"id": 4, "name": "gone", "epsilon": 0.9, "deleted": "2026-01-01T00:00:00"}])
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION == 7
    (run,) = store.list_runs()
    assert run["name"] == "old" and run["tags"] == [] and run["notes"] is None
    assert [(r["id"], r["epsilon"], r["tags"], r["no_guarantee"]) for r in store.deleted_runs()] == [(4, 0.9, [], None)]
    assert store.add_tags(5, ["kept"]) == ["kept"]


def test_a_read_only_schema_3_store_lists_runs_without_tags(tmp_path):
    path = tmp_path / "runs.sqlite"
    run_id = Store(path).create_run(RunConfig(name="older", noise_multiplier=1.0))
    raw = sqlite3.connect(path)
    raw.execute("drop table run_tags")
    raw.execute("alter table runs drop column notes")
    raw.execute("PRAGMA user_version = 3")
    raw.commit()
    raw.close()
    reader = Store(path, readonly=True)
    (run,) = reader.list_runs()
    assert run["id"] == run_id and run["tags"] == [] and run["notes"] is None
    assert reader.get_run(run_id)["tags"] == []


def test_a_read_only_store_older_than_continuing_shows_its_runs(tmp_path, capsys):
    """`dpw show` on a read-only schema-5 store (it cannot be upgraded) was a traceback: "no such
    column: resumed_from"."""
    from engine.cli import print_summary

    path = tmp_path / "runs.sqlite"
    run_id = Store(path).create_run(RunConfig(name="older", noise_multiplier=1.0))
    raw = sqlite3.connect(path)
    for column in ("resumed_from", "steps_resumed"):
        raw.execute(f"alter table runs drop column {column}")
    raw.execute("PRAGMA user_version = 5")
    raw.commit()
    raw.close()
    reader = Store(path, readonly=True)
    assert reader.schema_version == 5 and reader.continued_by(run_id) == []
    reader.update_run = None  # nothing may be written to it
    print_summary({**reader.get_run(run_id), "status": "failed", "steps_done": 3}, store=reader)
    assert f"run {run_id} (older): failed" in capsys.readouterr().out


def test_a_running_run_states_its_accountants_latest_value_not_the_live_bound(store, capsys):
    """While training, the row holds the latest step's live RDP bound (the ledger's safe value); views
    show the configured accountant's latest value instead of flipping between the two, so a live bound
    above the budget never reads as a breach. Once the run ends, the row's value is stated again."""
    from engine.publication import epsilon_label, publishable_epsilon

    run_id, writer = _writer(store)
    store.mark_running(run_id)
    writer.emit("privacy", step=10, epsilon=0.25, delta=1e-5, accountant="pld")
    writer.emit("privacy", step=12, epsilon=0.71, delta=1e-5, accountant="rdp")
    listed = next(r for r in store.list_runs() if r["id"] == run_id)
    for row in (listed, store.get_run(run_id)):
        assert (row["epsilon"], row["accountant"]) == (0.71, "rdp")  # the ledger keeps the safe value
        eps = publishable_epsilon(row)
        assert (eps.value, eps.accountant) == (0.25, "pld") and epsilon_label(row) == "0.25"
        # ... and say which step it covers: it sat next to a later step count, as if it covered those steps
        assert eps.step == 10 and eps.at_step(12) == " at step 10" and eps.at_step(10) == ""
    from engine.cli import print_summary
    from workbench.runs_panel import result_values

    running = {**store.get_run(run_id), "steps_done": 12}
    assert dict(result_values(running))["ε (publishable)"] == "0.25 at step 10"
    print_summary(running)
    assert "ε = 0.2500, δ = 1e-05 (pld at step 10)" in capsys.readouterr().out
    store.update_run(run_id, status="failed")
    assert publishable_epsilon(store.get_run(run_id)).value == 0.71


def test_a_version_4_store_gets_each_runs_dataset_fingerprint_from_its_plan_event(tmp_path):
    import json

    path = tmp_path / "v4.sqlite"
    older_store(path, 4, runs=[{"id": 1, "name": "planned", "status": "finished", "config": "{}"},
                               {"id": 2, "name": "queued", "status": "queued", "config": "{}"}],
                events=[{"run_id": 1, "seq": 0, "type": "plan", "t": 0.0,
                         "payload": json.dumps({"dataset_fingerprint": "f00d", "steps": 3})}],
                deleted_runs=[{"id": 3, "name": "old", "dataset": "digits"}])
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION
    assert [(r["id"], r["dataset_fingerprint"]) for r in store.list_runs()] == [(1, "f00d"), (2, None)]
    assert store.deleted_runs()[0]["dataset_fingerprint"] is None


def test_a_killed_writers_log_is_replayed_on_the_next_open(tmp_path):
    """Its runs are in the log only (a crash between checkpoints): the next open must replay it, and
    only a log that no connection holds is checked first (store_files.wal_left_behind)."""
    from engine.store_files import wal_left_behind

    path = tmp_path / "runs.sqlite"
    first = Store(path)
    first.create_run(RunConfig(name="first", noise_multiplier=1.0))
    first.close()
    write_and_die(path, 2)
    assert wal_left_behind(path)
    reopened = Store(path)
    assert [r["name"] for r in reopened.list_runs()][-1] == "after the backup 1"
    reopened.create_run(RunConfig(name="held", noise_multiplier=1.0))
    assert Path(f"{path}-wal").stat().st_size > 0 and not wal_left_behind(path)  # this process holds it


def test_a_backup_copied_back_beside_the_log_of_the_file_it_replaced_is_refused_unchanged(tmp_path):
    """A killed run's -wal, then the older backup copied over the store: `dpw list` replayed that log into
    the backup, damaging it, and every read went on as if nothing was wrong."""
    path = backup_restored_beside_a_stale_log(tmp_path / "runs.sqlite")
    before = _sha(path)
    for readonly in (False, True):
        with pytest.raises(DPWError, match="reads as damaged through the runs.sqlite-wal left beside it") as refused:
            Store(path, readonly=readonly)
        assert "move runs.sqlite-wal and runs.sqlite-shm out of the folder" in refused.value.hint
        assert _sha(path) == before
    for log in ("runs.sqlite-wal", "runs.sqlite-shm"):
        (tmp_path / log).rename(tmp_path / f"moved-{log}")
    assert [r["name"] for r in Store(path).list_runs()] == ["before 0", "before 1", "before 2"]


DMS_LOCKED = """
import fcntl, os, struct, sys
fd = os.open(sys.argv[1] + "-shm", os.O_RDONLY)
query = struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 128, 1, 0)
print(struct.unpack("@hhqqi4x", fcntl.fcntl(fd, fcntl.F_OFD_GETLK, query))[0] != fcntl.F_UNLCK)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="open-file-description locks are Linux's")
def test_opening_a_second_store_keeps_the_first_connections_locks(tmp_path):
    """Closing any descriptor of a file drops every POSIX lock the process holds on it: a look at the
    -shm's locks through a descriptor of its own, closed after, would take away the read lock by which
    the process's open connection tells other processes it uses the log (sqlite.org, "How To Corrupt
    An SQLite Database File", 2.2)."""
    path = tmp_path / "runs.sqlite"
    first = Store(path)
    first.create_run(RunConfig(name="held", noise_multiplier=1.0))

    def dms_locked() -> bool:
        out = subprocess.run([sys.executable, "-c", DMS_LOCKED, str(path)], capture_output=True, text=True)
        return out.stdout.strip() == "True"

    assert dms_locked()
    Store(path)  # a second store on the same file in this process, as the window's helper and tests do
    assert dms_locked() and first.list_runs()[0]["name"] == "held"
