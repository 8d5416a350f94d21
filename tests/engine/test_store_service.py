"""The store helper process (engine.store_service) and a store replaced under a live connection."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.config import RunConfig
from engine.errors import DPWError
from engine.store import Store
from workbench.store_client import StoreClient

REPO = Path(__file__).resolve().parents[2]


def config(name: str) -> RunConfig:
    return RunConfig(name=name, dataset="digits", mechanism="dpsgd", noise_multiplier=1.0)


def make_store(path: Path, *names: str) -> None:
    store = Store(path)
    for name in names:
        store.create_run(config(name))
    store.close()


def create_elsewhere(path: Path, name: str) -> int:
    """Create a run from another process (as `dpw run` would) and close the store there."""
    code = ("import sys; from engine.store import Store; from engine.config import RunConfig; "
            "s = Store(sys.argv[1]); print(s.create_run(RunConfig(name=sys.argv[2], dataset='digits', "
            "mechanism='dpsgd', noise_multiplier=1.0))); s.close()")
    out = subprocess.run([sys.executable, "-c", code, str(path), name], capture_output=True, text=True, cwd=REPO,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited process whose parent is gone may wait to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return False


def integrity(path: Path) -> str:
    return sqlite3.connect(path).execute("pragma integrity_check").fetchone()[0]


def names(rows: list[dict]) -> list[str]:
    return [r["name"] for r in rows]


def test_the_helper_answers_like_the_store(tmp_path):
    db = tmp_path / "runs.sqlite"
    make_store(db, "a")
    with StoreClient(db) as client:
        run_id = client.create_run(config("b"))
        client.update_run(run_id, status="failed", error="x")
        assert names(client.list_runs()) == ["a", "b"]
        assert client.get_run(run_id)["status"] == "failed"
        assert client.find_run("b")["id"] == run_id
        assert client.replay(run_id)["run"]["config"]["noise_multiplier"] == 1.0
        with pytest.raises(DPWError, match="no run with id 99"):
            client.get_run(99)
        assert client.set_tags(run_id, ["pilot, lr 0.5"]) == ["pilot", "lr 0.5"]
        client.set_notes(run_id, "diverged")
        assert client.get_run(run_id)["notes"] == "diverged"
        client.remove_run(run_id)
        assert names(client.list_runs()) == ["a"]
        [record] = client.deleted_runs()
        assert record["id"] == run_id and record["tags"] == ["pilot", "lr 0.5"] and record["notes"] == "diverged"
    assert integrity(db) == "ok"


def test_an_unreadable_store_is_one_clear_error(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("not a database\n" * 100)
    with pytest.raises(DPWError, match="notes.txt"):
        StoreClient(bad).wait_ready()


def test_a_killed_helper_is_started_again_and_nothing_is_written_twice(tmp_path):
    db = tmp_path / "runs.sqlite"
    make_store(db, "a")
    notices: list[str] = []
    with StoreClient(db, on_notice=notices.append) as client:
        assert names(client.list_runs()) == ["a"]
        first = client.helper_pid
        os.kill(first, signal.SIGKILL)
        assert names(client.list_runs()) == ["a"]  # a read is asked again
        assert client.helper_pid != first and client.restarts == 1
        assert any("started it again" in n for n in notices)
        os.kill(client.helper_pid, signal.SIGKILL)
        client._process.wait()
        client.create_run(config("b"))  # never reached the dead helper: asked once, of the new one
        assert names(client.list_runs()) == ["a", "b"]
        assert client.restarts == 2


def test_a_store_replaced_on_disk_is_opened_again(tmp_path):
    db, other = tmp_path / "runs.sqlite", tmp_path / "backup.sqlite"
    make_store(db, "old")
    make_store(other, "restored-1", "restored-2")
    notices: list[str] = []
    with StoreClient(db, on_notice=notices.append) as client:
        assert names(client.list_runs()) == ["old"]
        client.update_run(1, status="failed", error="written to the old file's -wal")
        os.replace(other, db)  # a backup copied over the store while the window is open
        assert names(client.list_runs()) == ["restored-1", "restored-2"]
        assert any("replaced" in n for n in notices)
        created = create_elsewhere(db, "after")
        assert client.get_run(created)["name"] == "after"
        client.update_run(created, status="failed", error="marked by the window")
    # the abandoned connection to the old file deleted nothing of the new one
    assert integrity(db) == "ok"
    rows = sqlite3.connect(db).execute("select name, status from runs order by id").fetchall()
    assert rows == [("restored-1", "queued"), ("restored-2", "queued"), ("after", "failed")]


def test_a_wal_deleted_under_a_connection_is_noticed_and_reopened(tmp_path):
    """The split itself: this process drops its locks (any descriptor of the file closed), another
    process believes it is the last user and deletes -wal/-shm; the connection notices and reopens."""
    db = tmp_path / "runs.sqlite"
    store = Store(db)
    store.create_run(config("mine"))
    assert not store.reopen_if_replaced()
    os.close(os.open(db, os.O_RDONLY))  # what Qt's file dialog does to the store it lists
    created = create_elsewhere(db, "theirs")
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_ino != store._files.wal[1]
    assert store.reopen_if_replaced()
    assert store.get_run(created)["name"] == "theirs"
    store.update_run(created, status="failed", error="seen by the reopened connection")
    store.close()
    assert integrity(db) == "ok"
    assert sqlite3.connect(db).execute("select status from runs where id = ?", [created]).fetchone() == ("failed",)


def test_the_helper_ends_with_its_window_even_a_killed_one(tmp_path):
    """No orphan: a window killed with -9 closes the helper's input, and the helper ends."""
    db = tmp_path / "runs.sqlite"
    code = ("import sys, time; from workbench.store_client import StoreClient; c = StoreClient(sys.argv[1]); "
            "c.wait_ready(); print(c.helper_pid, flush=True); time.sleep(120)")
    window = subprocess.Popen([sys.executable, "-c", code, str(db)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    helper = int(window.stdout.readline())
    window.kill()
    window.wait()
    for _ in range(200):  # up to 20 s
        if not running(helper):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the store helper outlived its window")
    assert integrity(db) == "ok"


def test_a_replay_keeps_where_each_phase_started_and_got_to():
    from engine.store_service import thin_progress

    events = [{"type": "plan"}]
    events += [{"type": "progress", "phase": "train", "done": i, "total": 9} for i in range(10)]
    events += [{"type": "warning", "message": "w"}]
    events += [{"type": "progress", "phase": "eval", "done": i, "total": 3} for i in range(4)]
    kept = thin_progress(events)
    assert [(e["type"], e.get("phase"), e.get("done")) for e in kept] == [
        ("plan", None, None), ("progress", "train", 0), ("progress", "train", 9), ("warning", None, None),
        ("progress", "eval", 0), ("progress", "eval", 3)]


def test_a_helper_that_cannot_start_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")  # an interpreter that exits at once, status 1
    with pytest.raises(DPWError, match=r"cannot open .*runs.sqlite: the store helper exited with status 1"):
        StoreClient(tmp_path / "runs.sqlite").wait_ready()


def test_a_failure_that_is_the_users_situation_comes_back_in_the_words_dpw_uses():
    """Exporting into a path through a file showed "RemoteError: NotADirectoryError: [Errno 20] ..." in
    the window, where `dpw export` says what is wrong and what to do."""
    from engine.store_service import error_reply

    reply = error_reply(NotADirectoryError(20, "Not a directory", "/data/notes.txt/model"))
    assert reply["user_error"] and reply["message"] == "/data/notes.txt/model: Not a directory"
    assert reply["hint"].startswith("check the path")
    assert error_reply(ValueError("a bug"))["user_error"] is False
