"""`dpw tag`, `dpw untag`, `dpw note` and `dpw list --deleted` on a real store file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine.config import RunConfig
from engine.store import Store

REPO = Path(__file__).resolve().parents[2]


def dpw(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300)


def finished_run(db: Path, name: str, epsilon: float) -> int:
    store = Store(db)
    run_id = store.create_run(RunConfig(name=name, noise_multiplier=1.0, reproducible_noise=False))
    store.update_run(run_id, status="finished", epsilon=epsilon, delta=1e-5, accountant="pld", accuracy=0.9)
    store.close()
    return run_id


def test_tags_and_notes_from_the_command_line_show_in_list_and_show(tmp_path):
    db = tmp_path / "runs.sqlite"
    run_id = finished_run(db, "baseline", 1.5)
    tagged = dpw("tag", "baseline", "pilot", "lr 0.5,final", "--db", str(db))
    assert tagged.returncode == 0, tagged.stderr
    assert tagged.stdout.strip() == f"run {run_id} (baseline) tags: pilot, lr 0.5, final"
    assert dpw("untag", str(run_id), "final", "--db", str(db)).stdout.strip().endswith("tags: pilot, lr 0.5")
    assert dpw("note", str(run_id), "clipping too tight", "--db", str(db)).returncode == 0
    [row] = json.loads(dpw("list", "--db", str(db), "--json").stdout)
    assert row["tags"] == ["pilot", "lr 0.5"] and row["notes"] == "clipping too tight"
    table = dpw("list", "--db", str(db)).stdout
    assert "pilot, lr 0.5" in table.splitlines()[2]
    shown = dpw("show", str(run_id), "--db", str(db)).stdout
    assert "tags           pilot, lr 0.5" in shown and "notes          clipping too tight" in shown
    assert Store(db).get_run(run_id)["tags"] == ["pilot", "lr 0.5"]


def test_a_tag_for_a_missing_run_is_one_line(tmp_path):
    db = tmp_path / "runs.sqlite"
    finished_run(db, "a", 1.0)
    failed = dpw("tag", "nope", "x", "--db", str(db))
    assert failed.returncode == 1 and failed.stderr.startswith("error: no run named 'nope'")
    assert "Traceback" not in failed.stderr


def test_list_deleted_shows_what_a_deleted_run_spent(tmp_path):
    db = tmp_path / "runs.sqlite"
    run_id = finished_run(db, "dropped", 2.25)
    assert dpw("list", "--deleted", "--db", str(db)).stdout.startswith("no deleted runs in ")
    dpw("tag", str(run_id), "pilot", "--db", str(db))
    assert dpw("delete", str(run_id), "--yes", "--db", str(db)).returncode == 0
    [record] = json.loads(dpw("list", "--deleted", "--json", "--db", str(db)).stdout)
    assert (record["id"], record["name"], record["epsilon"], record["delta"], record["accountant"]) == (
        run_id, "dropped", 2.25, 1e-5, "pld")
    assert record["tags"] == ["pilot"] and record["deleted"]
    table = dpw("list", "--deleted", "--db", str(db)).stdout
    assert "dropped" in table and "2.25" in table and "pilot" in table
