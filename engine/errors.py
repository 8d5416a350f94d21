"""User-facing errors: each names what is wrong, the value, what is allowed and what to do."""

from __future__ import annotations


class DPWError(Exception):
    """Base class for errors that are shown to a person as one line, never as a traceback."""

    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    @property
    def message(self) -> str:
        return str(self.args[0])


class ConfigError(DPWError):
    """A run setting is invalid. `field` is the setting's name as it appears in the config file."""

    def __init__(self, field: str, message: str, *, hint: str | None = None):
        super().__init__(f"{field}: {message}", hint=hint)
        self.field = field


class DataError(DPWError):
    """A dataset cannot be found, read or used (missing files, corrupt file, wrong shapes)."""


class ExportFilesExist(DPWError):
    """An export folder already holds files of the names an export writes (never overwritten unasked)."""


class ModelError(DPWError):
    """A model cannot be built or cannot be trained with differential privacy."""


class BudgetError(DPWError):
    """The requested training cannot fit in the privacy budget."""


class StoreError(DPWError):
    """The run store file cannot be opened, read or written as it is (not a store, damaged,
    read-only, full disk, locked); the file is left as it was."""


class ModelSaveError(DPWError):
    """A trained model could not be written. `summary` carries the run's results, which are kept."""

    summary: dict | None = None


def error_from_reply(reply: dict) -> DPWError:
    """A user error another process sent ("message", "hint", and "type" and "field" where known: the
    store helper's, the pre-run check's and a standby runner's replies) as the class it was raised as,
    so a caller may act on its kind (offer to replace an export's files, mark a ConfigError's field)."""
    found = globals().get(reply.get("type") or "")
    if isinstance(found, type) and issubclass(found, DPWError):
        kind = found
    else:
        kind = ConfigError if reply.get("field") else DPWError
    if issubclass(kind, ConfigError):
        field = str(reply.get("field") or "")
        return kind(field, reply["message"].removeprefix(f"{field}: "), hint=reply.get("hint"))
    return kind(reply["message"], hint=reply.get("hint"))


BUG_HINT = "this is a bug in DP Workbench; the traceback is in the run's error event"


def recover_hint(path: object) -> str:
    return (f'copy what can be read into a new store: sqlite3 {path} ".recover" | sqlite3 recovered.sqlite, '
            f"then use --db recovered.sqlite")


def _disk_full(store_path: object) -> bool:
    """Whether the file system that holds `store_path` has (almost) no space left."""
    import shutil
    from pathlib import Path

    if store_path is None:
        return False
    try:
        return shutil.disk_usage(Path(str(store_path)).absolute().parent).free < 64 * 1024
    except OSError:
        return False


def _odd_companion(store_path: object) -> tuple[str, str] | None:
    """(what is wrong, what to do) where SQLite says only "unable to open": a folder, or a link that
    leads nowhere, in place of the store's -wal or -shm file, or a store path that is such a link."""
    import os

    if store_path is None:
        return None
    for suffix in ("-wal", "-shm"):
        path = f"{store_path}{suffix}"
        if os.path.isdir(path) or (os.path.islink(path) and not os.path.exists(path)):
            what = (f"{path} is a folder" if os.path.isdir(path) else
                    f"{path} is a link to {os.readlink(path)}, which does not exist")
            return (f"{what}, where SQLite keeps the store's {suffix[1:]} file",
                    f"move {path} away; the store itself was left unchanged")
    if os.path.islink(str(store_path)) and not os.path.exists(str(store_path)):
        return (f"it is a link to {os.readlink(str(store_path))}, which does not exist",
                "give a --db path to a store file, or make the link lead to one")
    return None


def explain(exc: BaseException, *, store_path: object = None) -> tuple[str, str | None, bool]:
    """(message, hint, is_bug) of an exception for a person. What is the user's situation (full
    disk, a locked, read-only or damaged store, a path that is a file) is never called a bug."""
    import errno
    import sqlite3

    if isinstance(exc, DPWError):
        return exc.message, exc.hint, False
    store = store_path if store_path is not None else "the store"
    text = str(exc)
    if isinstance(exc, sqlite3.Error):
        lowered = text.lower()
        if "disk is full" in lowered:
            return (f"the disk holding {store} is full (SQLite: {text})",
                    "free some space and start the run again; everything recorded so far is kept", False)
        if "locked" in lowered or "busy" in lowered:
            return (f"{store} stayed locked by another program (SQLite: {text})",
                    "end the other program's write transaction (an sqlite3 shell, a backup tool) and try again",
                    False)
        if "readonly" in lowered or "read-only" in lowered:
            return (f"{store} is read-only (SQLite: {text})",
                    "reading works; to add or change runs make the file and its folder writable", False)
        if "malformed" in lowered or "not a database" in lowered or "corrupt" in lowered:
            return f"{store} is damaged (SQLite: {text})", recover_hint(store), False
        if ("unable to open" in lowered or "disk i/o" in lowered) and _disk_full(store_path):
            # Opening a WAL store writes its -wal and -shm files: on a full disk even a read fails so.
            return (f"the disk holding {store} is full (SQLite: {text})",
                    "free some space and try again; the store itself is intact", False)
        if ("unable to open" in lowered or "disk i/o" in lowered) and (odd := _odd_companion(store_path)):
            return f"cannot use {store}: {odd[0]} (SQLite: {text})", odd[1], False
        if "unable to open" in lowered or "disk i/o" in lowered:
            return (f"cannot use {store} (SQLite: {text})",
                    "check that the file and its folder exist and are readable (and writable to add runs)", False)
        return f"{type(exc).__name__}: {text}", BUG_HINT, True
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        where = exc.filename or store
        return f"no space left on the disk holding {where}", "free some space and try again", False
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR,
                                                  errno.EEXIST, errno.EISDIR, errno.ENOENT):
        where = exc.filename if exc.filename is not None else store
        return f"{where}: {exc.strerror}", "check the path: every folder in it must be a folder you may write to", False
    return f"{type(exc).__name__}: {text}", BUG_HINT, True
