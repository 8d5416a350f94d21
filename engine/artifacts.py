"""A store's artifacts folder: where each run's saved model, checkpoint and (when the store could not
take it) the note of how it failed are kept, beside the store file and claimed by it. Only paths and
files: the store reads a run's failure note when it marks a lost run failed (Store.reconcile_orphans)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import DPWError

if TYPE_CHECKING:
    from engine.store import Store

ARTIFACTS_OWNER = ".store"  # in a store's artifacts folder: the name of the store file it belongs to


def artifacts_dir(store: Store, run_id: int) -> Path:
    """Where a run's saved model and checkpoint go: in its store's artifacts folder (`artifacts_root`)."""
    return artifacts_root(store) / f"run-{run_id}"


def artifacts_root(store: Store) -> Path:
    """A store's artifacts folder: beside it and named after it (the default runs.sqlite keeps its
    plain `artifacts` folder). Stores whose names share a stem (runs.sqlite, runs.db) would share that
    folder, and so each other's run-N: one that another store has claimed (`claim_artifacts`) is left
    to it, and this store uses a folder named after its whole file name."""
    shared = store.path.parent / ("artifacts" if store.path.stem == "runs" else f"{store.path.stem}-artifacts")
    owner = _artifacts_owner(shared)
    if owner is None or owner == store.path.name:
        return shared
    return store.path.parent / f"{store.path.name}-artifacts"


def claim_artifacts(store: Store) -> Path:
    """Mark the store's artifacts folder as its own before a run writes there (ARTIFACTS_OWNER, created
    exclusively: of two stores claiming one folder at once, one gets it and the other its own)."""
    for _ in range(2):
        root = artifacts_root(store)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DPWError(f"cannot create the folder for the run's saved model and checkpoint, {root}: "
                           f"{exc.strerror.lower() if exc.strerror else exc}",
                           hint="move what is at that path away, or use a --db path in another folder") from None
        try:
            fd = os.open(root / ARTIFACTS_OWNER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if _artifacts_owner(root) == store.path.name:
                return root
            continue  # claimed by another store a moment ago: artifacts_root now gives this store's own
        with os.fdopen(fd, "w") as f:
            f.write(store.path.name + "\n")
        return root
    raise DPWError(f"cannot claim an artifacts folder for {store.path} beside it",
                   hint=f"check the folders named {store.path.stem}-artifacts and {store.path.name}-artifacts")


def _artifacts_owner(folder: Path) -> str | None:
    """The store file name an artifacts folder was claimed for; None when unclaimed (or written before
    folders were claimed)."""
    try:
        return (folder / ARTIFACTS_OWNER).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


FAILURE_NOTE = "failure.json"  # in a run's folder: the error its runner could not record in the store


def note_unrecorded_failure(store: Store, run_id: int, message: str, hint: str | None) -> bool:
    """Keep the reason a run failed beside its files when the store cannot take it (locked past the
    busy timeout, full disk): whoever next marks the lost run failed states this reason instead of
    "killed or crashed". Written whole or not at all; False when it could not be written."""
    folder = artifacts_dir(store, run_id)
    temporary = folder / f".{FAILURE_NOTE}.{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps({"error": message, "hint": hint}))
        os.replace(temporary, folder / FAILURE_NOTE)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        return False
    return True


def unrecorded_failure(store: Store, run_id: int) -> tuple[str, str | None] | None:
    """The (error, hint) a run's runner noted when the store could not take it; None when there is
    none (or it cannot be read: the caller falls back to its own reason)."""
    try:
        note = json.loads((artifacts_dir(store, run_id) / FAILURE_NOTE).read_text())
        return str(note["error"]), (str(note["hint"]) if note.get("hint") else None)
    except (OSError, ValueError, KeyError, TypeError):
        return None
