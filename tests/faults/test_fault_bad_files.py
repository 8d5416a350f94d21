"""Bad files through the real `dpw` command: each gets one line naming the file and what to do, exit
status 1 or 2, no traceback, and the file is unchanged (sha256). Reads of a read-only store work."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from fault_helpers import DIGITS, check_ledger, dpw, sha256, start_runner, store_with_history, write_toml

from engine.config import RunConfig
from engine.store import Store


def one_line_error(result: subprocess.CompletedProcess, *words: str) -> str:
    assert result.returncode in (1, 2), (result.returncode, result.stdout, result.stderr)
    line = result.stderr.strip()
    assert "Traceback" not in line and "\n" not in line and line.startswith("error:"), line
    assert "bug in DP Workbench" not in line, line
    for word in words:
        assert word in line, line
    return line


@contextlib.contextmanager
def read_only(path: Path):
    """Make a file or folder read-only for this process: permission bits, or (root ignores them) a
    read-only bind mount."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    mounted = subprocess.run(["mount", "--bind", path, path], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("root without mount rights cannot make a read-only file here")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", path], capture_output=True).returncode != 0:
            pytest.skip("root without mount rights cannot make a read-only file here")
        yield
    finally:
        subprocess.run(["umount", path], capture_output=True)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    return write_toml(tmp_path_factory.mktemp("configs") / "digits.toml", DIGITS)


def _text(path: Path) -> Path:
    path.write_text("my notes, not a store\n")
    return path


def _foreign(path: Path) -> Path:
    raw = sqlite3.connect(path)
    raw.execute("create table contacts(name text, phone text)")
    raw.execute("insert into contacts values ('Ada', '123')")
    raw.commit()
    raw.close()
    return path


def _damaged(path: Path) -> Path:
    store_with_history(path)
    with open(path, "r+b") as f:  # page 2 onwards: the runs table
        f.seek(4096)
        f.write(os.urandom(8192))
    return path


def _truncated(path: Path) -> Path:
    store_with_history(path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    return path


BAD_STORES = {"text": (_text, "not an SQLite database"), "foreign": (_foreign, "another application"),
              "damaged": (_damaged, ".recover"), "truncated": (_truncated, "")}


@pytest.mark.parametrize("kind", sorted(BAD_STORES))
def test_a_bad_store_file_gets_one_line_and_stays_unchanged(tmp_path, kind, config):
    make, words = BAD_STORES[kind]
    path = make(tmp_path / "store.sqlite")
    before = sha256(path)
    for args in (["list"], ["show", "1"], ["delete", "1", "--yes"]):
        one_line_error(dpw(*args, "--db", path))
    if kind in ("text", "foreign", "damaged"):
        line = one_line_error(dpw("run", config, "--db", path))
        assert words in line
    assert sha256(path) == before
    assert not Path(f"{path}-wal").exists() or kind in ("damaged", "truncated")


def test_a_read_only_store_is_read_but_never_written(tmp_path, config):
    path = store_with_history(tmp_path / "runs.sqlite")
    before = sha256(path)
    with read_only(path):
        listed = dpw("list", "--db", path)
        assert listed.returncode == 0 and "before-dpsgd" in listed.stdout, listed.stderr
        assert dpw("show", "1", "--db", path).returncode == 0
        one_line_error(dpw("delete", "1", "--yes", "--db", path), "read-only")
        one_line_error(dpw("run", config, "--db", path), "read-only")
    assert sha256(path) == before


def test_a_store_in_a_read_only_folder_can_still_be_read(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    path = store_with_history(folder / "runs.sqlite")
    before = sha256(path)
    with read_only(folder):
        listed = dpw("list", "--db", path)
        assert listed.returncode == 0 and "before-pate" in listed.stdout, listed.stderr
        assert "0.25" in dpw("show", "1", "--db", path).stdout
        one_line_error(dpw("delete", "1", "--yes", "--db", path), "read-only")
    assert sha256(path) == before and sorted(p.name for p in folder.iterdir()) == ["runs.sqlite"]


def test_a_store_path_under_a_file_gets_one_line(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    one_line_error(dpw("list", "--db", notes / "runs.sqlite"), "notes.txt is a file")
    assert notes.read_text() == "keep me"


def test_bad_configs_get_one_line_and_store_no_run(tmp_path):
    db = store_with_history(tmp_path / "runs.sqlite")
    not_utf8 = tmp_path / "latin1.toml"
    not_utf8.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    one_line_error(dpw("run", not_utf8, "--db", db), "latin1.toml", "UTF-8")
    calibrated = {k: v for k, v in DIGITS.items() if k != "noise_multiplier"}
    unreachable = write_toml(tmp_path / "target.toml", dict(calibrated, target_epsilon=0.0001, epochs=10,
                                                             expected_batch_size=256))
    one_line_error(dpw("run", unreachable, "--db", db), "target_epsilon")
    seed = write_toml(tmp_path / "seed.toml", dict(DIGITS, seed=2**64))
    one_line_error(dpw("run", seed, "--db", db), "seed")
    assert sorted(check_ledger(db)) == [1, 2]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, int]:
    db = tmp_path_factory.mktemp("trained") / "runs.sqlite"
    run_id = Store(db).create_run(RunConfig(**DIGITS))
    proc = start_runner(db, run_id)
    proc.communicate(timeout=300)
    assert proc.returncode == 0
    return db, run_id


def test_export_never_overwrites_a_model_card_without_force(tmp_path, trained):
    db, run_id = trained
    out = tmp_path / "export"
    out.mkdir()
    card = out / "model_card.json"
    card.write_text('{"mine": true}')
    one_line_error(dpw("export", run_id, "--db", db, "--out", out), "model_card.json", "--force")
    assert card.read_text() == '{"mine": true}' and sorted(p.name for p in out.iterdir()) == ["model_card.json"]
    forced = dpw("export", run_id, "--db", db, "--out", out, "--force")
    assert forced.returncode == 0, forced.stderr
    assert '"mine"' not in card.read_text()


def test_export_into_a_path_under_a_file_gets_one_line(tmp_path, trained):
    db, run_id = trained
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    one_line_error(dpw("export", run_id, "--db", db, "--out", notes / "sub"), "notes.txt")
    assert notes.read_text() == "keep me"


def test_a_model_that_cannot_be_saved_keeps_the_results_and_names_the_path(tmp_path):
    db = store_with_history(tmp_path / "runs.sqlite")
    run_id = Store(db).create_run(RunConfig(**DIGITS))
    (tmp_path / "artifacts").mkdir()  # a file where the run's folder would go (the store's folder is claimed at start)
    (tmp_path / "artifacts" / f"run-{run_id}").write_text("a file where the run's folder would go")
    proc = start_runner(db, run_id)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Traceback" not in err
    run = check_ledger(db)[run_id]
    assert run["status"] == "failed" and str(tmp_path / "artifacts" / f"run-{run_id}" / "model.pt") in run["error"]
    assert "bug" not in run["error_hint"] and "kept" in run["error_hint"]
    assert run["steps_done"] == 23 and run["stop_reason"] == "completed" and run["accuracy"] is not None
    assert json.loads(run["summary"])["test_accuracy"] == run["accuracy"]
