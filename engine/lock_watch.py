"""Says on a terminal when a run waits on another program's hold of the store's write lock.

A write waits up to the store's busy timeout (engine.store.BUSY_TIMEOUT_S) for another program's
write lock (an sqlite3 shell left in a transaction, a backup tool) and only then fails: until then the
progress bar stood still with nothing said. `dpw run` (and resume, study) watch from storing the run to
its end: after `quiet_s` without a line from the runner it asks the store, without waiting, whether
its write lock is free, and says once that the run is waiting on it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable

QUIET_S = 5.0  # silence from the runner before the lock is looked at


def write_locked(path: Path) -> bool:
    """Whether another connection holds the store's write lock now (asked without waiting; the lock is
    taken and given back at once when free)."""
    try:  # mode=rw: a store deleted or moved meanwhile is not created again, empty, by looking
        conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=rw", uri=True, timeout=0, isolation_level=None)
    except sqlite3.Error:
        return False
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        return "locked" in str(exc) or "busy" in str(exc)
    finally:
        conn.close()


def on_terminal(path: Path, *, as_json: bool) -> "LockWatch | None":
    """A started watch that says its line on stderr; None where no person would read it (--json output,
    which a program reads, or stderr not a terminal): no thread, no look at the store."""
    from engine.cli_shell import person_watches, say_on_terminal

    if as_json or not person_watches():
        return None
    return LockWatch(path, lambda text: say_on_terminal("\n" + text)).start()


class LockWatch:
    """`heard()` at each line from the runner; `say(text)` once if the runner is silent for `quiet_s`
    while another program holds the store's write lock. A daemon thread; `stop()` ends it."""

    def __init__(self, path: Path, say: Callable[[str], None], *, quiet_s: float = QUIET_S):
        from engine.store import BUSY_TIMEOUT_S

        self.path, self.say, self.quiet_s = Path(path), say, quiet_s
        self.message = (f"waiting for {self.path.name}: another program holds its write lock (an sqlite3 "
                        f"shell or a backup?); the run goes on once it is released, and fails after "
                        f"{BUSY_TIMEOUT_S} s")
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="store-lock-watch", daemon=True)

    def start(self) -> "LockWatch":
        self._thread.start()
        return self

    def heard(self) -> None:
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(min(1.0, self.quiet_s)):
            if time.monotonic() - self._last >= self.quiet_s and write_locked(self.path):
                if not self._stopped.is_set():
                    self.say(self.message)
                return
