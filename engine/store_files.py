"""Which files a store connection holds, to notice a store replaced (or its -wal deleted) under it.

A connection keeps the inode it opened. If the file at the path is replaced (a backup copied over
it, `mv`), or its `-wal` is deleted because another process believed it was the last user (the
process had lost its POSIX locks: sqlite.org, "How To Corrupt An SQLite Database File", 2.2), the
connection goes on reading and writing files nobody else sees.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from pathlib import Path
from typing import Any, NamedTuple

FileId = tuple[int, int]  # (device, inode)


class StoreFiles(NamedTuple):
    db: FileId | None
    wal: FileId | None


def _file_id(path: Path) -> FileId | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def store_files(path: Path) -> StoreFiles:
    """The store file and its write-ahead log as they are on disk now."""
    return StoreFiles(_file_id(path), _file_id(Path(f"{path}-wal")))


def replaced(opened: StoreFiles, path: Path) -> bool:
    """True when the files at `path` are no longer those a connection opened as `opened`: another
    file at the path, or the -wal it had (if it had one) gone or replaced."""
    now = store_files(path)
    return now.db != opened.db or (opened.wal is not None and now.wal != opened.wal)


def empty_old_wal(opened: StoreFiles, connection: Any, path: Path) -> bool:
    """After another file was put at `path`, the `DB-wal` beside it may still be the old file's: a
    connection opening the new file would read the old file's pages from it as the new one's. Move
    those changes into the old file and empty the log (checkpoint TRUNCATE through the old
    connection). False if the old log is still at `path` and could not be emptied (another process
    still uses the old file)."""
    if store_files(path).db == opened.db:
        return True  # the same file: only its -wal was deleted, nothing of the old log at the path
    busy = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    now = store_files(path)
    if now.wal is None or now.wal != opened.wal:
        return True
    return not busy and Path(f"{path}-wal").stat().st_size == 0


_ABANDONED: list[Any] = []


def abandon(connection: Any) -> None:
    """Keep a stale connection open for the rest of the process, never closing it.

    Closing the last connection to a WAL database checkpoints and then deletes `DB-wal` and
    `DB-shm` *by name*: for a stale connection those names now belong to the new store, whose
    log would be deleted under its users. The extra reference keeps interpreter shutdown from
    closing it too (CPython)."""
    _ABANDONED.append(connection)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(connection))


_SHM_DMS_BYTE = 128  # SQLite's unix VFS: every connection to a WAL store holds a read lock on this byte of DB-shm
_HOLDERS: dict[str, weakref.WeakSet] = {}  # store file (real path) -> this process's open stores on it


def hold(path: Path, holder: Any) -> None:
    """Record that `holder` (a Store) has `path` open in this process, until `release` or its end."""
    _HOLDERS.setdefault(os.path.realpath(path), weakref.WeakSet()).add(holder)


def release(path: Path, holder: Any) -> None:
    _HOLDERS.get(os.path.realpath(path), weakref.WeakSet()).discard(holder)


def held_here(path: Path) -> bool:
    """Whether a store of this process has `path` open (its -wal is then that connection's, and current)."""
    return bool(_HOLDERS.get(os.path.realpath(path)))


def wal_left_behind(path: Path) -> bool:
    """True when `DB-wal` holds changes and no connection has the store open: the log of a process
    that was killed (replayed on the next open, as it must be), or of another file that stood at
    `path` before a backup was copied over it (replayed, it damages the copy). False while some
    connection holds it (the log is that connection's, and current). Unknown (no open-file-description
    locks: not Linux) counts as left behind, which only costs a check."""
    wal = Path(f"{path}-wal")
    try:
        if not wal.is_file() or wal.stat().st_size == 0:
            return False  # a folder or a broken link there is named when the store opens
    except OSError:
        return False
    if held_here(path):
        # Never open the -shm then: closing any descriptor of a file drops every POSIX lock this process
        # holds on it, among them the read lock by which its connection tells others it uses the log.
        return False
    try:
        import fcntl
        import struct

        query = struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, _SHM_DMS_BYTE, 1, 0)
        fd = os.open(f"{path}-shm", os.O_RDONLY)
    except (ImportError, OSError):
        return True  # no -shm (no connection ever opened it in this state), or it cannot be opened
    try:
        answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, query)
    except (AttributeError, OSError):
        return True
    finally:
        os.close(fd)
    return struct.unpack("@hhqqi4x", answer)[0] == fcntl.F_UNLCK
