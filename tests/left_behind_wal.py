"""Store files as a crash and a careless restore leave them: a writer killed with its -wal left behind,
and an older backup copied over the store beside that log (shared by the store and window tests)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from engine.config import RunConfig
from engine.store import Store

REPO = Path(__file__).resolve().parents[1]
KILLED_WRITER = """
import os, sys
from engine.config import RunConfig
from engine.events import EventWriter
from engine.store import Store
store = Store(sys.argv[1])
for n in range(int(sys.argv[2])):
    run_id = store.create_run(RunConfig(name=f"after the backup {n}", noise_multiplier=1.0))
    writer = EventWriter(run_id, stream=None, sink=store.record_event)
    for step in range(1, 41):
        writer.emit("metric", name="train_loss", step=step, value=1.0 / step)
os._exit(0)  # killed: the connection never closes, its -wal stays
"""


def write_and_die(path: Path, runs: int) -> None:
    """Another process adds `runs` runs with their events, then dies with its -wal left beside the store."""
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path), str(runs)], check=True, cwd=REPO)
    assert Path(f"{path}-wal").stat().st_size > 0


def backup_restored_beside_a_stale_log(path: Path) -> Path:
    """A store of three runs backed up; then 20 runs by a process killed with its log left; then the
    backup copied back over the store, that log still beside it. Returns `path`."""
    store = Store(path)
    for n in range(3):
        store.create_run(RunConfig(name=f"before {n}", noise_multiplier=1.0))
    store.close()
    backup = path.with_name(f"backup-of-{path.name}")
    shutil.copy(path, backup)
    write_and_die(path, 20)
    shutil.copy(backup, path)
    backup.unlink()
    return path
