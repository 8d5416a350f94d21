"""The window's store: the same methods as engine.store.Store, answered by a helper process.

The window's process may open any file a dialog lists, which drops every SQLite lock the process
holds (engine.store_service explains); so the store is opened only in `python -m
engine.store_service DB`, and this class speaks to it over a pipe. If the helper dies it is
started again: a read is simply asked again, a write is asked again only when it never reached
the helper. `on_notice(text)` hears about restarts and about a store file replaced under us.
Qt-free: the dialogs' worker threads each use a client of their own.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from engine.errors import DPWError, error_from_reply

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 180.0  # longer than the store's busy timeout (a write waits for another's lock); beyond: stuck
READS = frozenset({"list_runs", "get_run", "find_run", "events", "metrics", "privacy", "votes", "artifacts",
                   "deleted_runs", "table_counts", "replay", "ping", "build_report", "reconcile_orphans", "tags"})
_ENDED = object()  # the helper's output ended


class StoreHelperError(DPWError):
    """The helper process could not be started or stopped answering."""


class RemoteError(Exception):
    """An unexpected error inside the helper (a damaged or locked file): its type and text."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class StoreClient:
    def __init__(self, path: str | Path, *, on_notice: Callable[[str], None] | None = None):
        # Absolute here, in the window's working folder: the helper runs in the install folder, and
        # the runners, audits and studies the window starts are all given this path.
        self.path = Path(path).absolute()
        self.on_notice = on_notice
        self.restarts = 0
        self._next_id = 0
        self._process: subprocess.Popen | None = None
        self._replies: queue.Queue = queue.Queue()
        self._ready = False
        self._start()

    # ---- the helper process ----------------------------------------------------------------------
    def _start(self) -> None:
        """Start the helper; its first line (ready, or why not) is awaited by wait_ready."""
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8")
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "engine.store_service", str(self.path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=str(REPO))  # stderr: the terminal
        self._replies = queue.Queue()
        threading.Thread(target=self._read, args=(self._process, self._replies), daemon=True,
                         name="store-helper-reader").start()
        self._ready = False

    def wait_ready(self) -> None:
        """Wait until the helper has opened the store; DPWError if it could not (the helper starts
        in the background, so a window can build its widgets meanwhile)."""
        if self._process is None:
            self._start()
        if self._ready:
            return
        first = self._next_reply(START_TIMEOUT_S)
        if not isinstance(first, dict) or not first.get("ready"):
            error = first.get("error") if isinstance(first, dict) else None
            detail = error["message"] if error else self._stderr_tail()
            self._stop()
            if error and error.get("user_error"):
                raise error_from_reply(error)
            raise StoreHelperError(f"cannot open {self.path}: {detail}",
                                   hint="check that the file is a DP Workbench store and can be read")
        self._ready = True

    @staticmethod
    def _read(process: subprocess.Popen, replies: queue.Queue) -> None:
        for line in process.stdout:
            try:
                replies.put(json.loads(line))
            except ValueError:
                continue
        replies.put(_ENDED)

    def _next_reply(self, timeout: float | None) -> Any:
        try:
            return self._replies.get(timeout=timeout)
        except queue.Empty:
            return None

    def _stderr_tail(self) -> str:
        process = self._process
        if process is None:
            return "the store helper is not running"
        try:
            code = process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return f"the store helper did not answer in {START_TIMEOUT_S:.0f} s"
        return f"the store helper exited with status {code} (its error is in the terminal)"

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            end_helper(process, timeout=10)  # the helper closes the store and exits

    def _restart(self, why: str) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
        self._stop()
        self.restarts += 1
        self._start()
        self.wait_ready()
        self._notice(f"The store helper {why}; started it again")

    def _notice(self, text: str) -> None:
        if self.on_notice is not None:
            self.on_notice(text)

    def close(self) -> None:
        self._stop()

    @property
    def helper_pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    # ---- calls -----------------------------------------------------------------------------------
    def call(self, method: str, *args: Any, timeout: float | None = CALL_TIMEOUT_S, **kwargs: Any) -> Any:
        """Ask the helper; its reply's result, or its error raised here."""
        self.wait_ready()
        for attempt in (1, 2):
            self._next_id += 1
            request_id = self._next_id
            line = json.dumps({"id": request_id, "method": method, "args": args, "kwargs": kwargs}) + "\n"
            try:
                self._process.stdin.write(line.encode("utf-8"))
                self._process.stdin.flush()
            except (OSError, ValueError):  # the helper was gone before the request: safe to ask again
                self._restart("had ended")
                continue
            reply = self._wait_for(request_id, timeout)
            if isinstance(reply, dict):
                return self._result(reply)
            stuck = reply is None
            self._restart("stopped answering" if stuck else "ended")
            if method not in READS or attempt == 2:
                raise StoreHelperError(
                    f"the store helper {'stopped answering' if stuck else 'ended'} during {method} on {self.path}",
                    hint="it was started again; check the runs list before trying again")
        raise StoreHelperError(f"the store helper for {self.path} keeps ending", hint="see the terminal for its error")

    def _wait_for(self, request_id: int, timeout: float | None) -> Any:
        while True:
            reply = self._next_reply(timeout)
            if reply is None or reply is _ENDED:
                return reply
            if reply.get("id") == request_id:
                return reply

    def _result(self, reply: dict[str, Any]) -> Any:
        if reply.get("reopened"):
            self._notice(f"{self.path} was replaced on disk (or its -wal deleted); opened it again")
        error = reply.get("error")
        if error is None:
            return reply.get("result")
        if error.get("user_error"):
            raise error_from_reply(error)
        raise RemoteError(error["type"], error["message"])

    # ---- the Store methods the workbench uses -------------------------------------------------
    def list_runs(self) -> list[dict[str, Any]]:
        return self.call("list_runs")

    def get_run(self, run_id: int) -> dict[str, Any]:
        return self.call("get_run", run_id)

    def find_run(self, ref: str | int) -> dict[str, Any]:
        return self.call("find_run", ref)

    def events(self, run_id: int, *, exclude=()) -> list[dict[str, Any]]:
        return self.call("events", run_id, exclude=list(exclude))

    def metrics(self, run_id: int, name: str | None = None) -> list[dict[str, Any]]:
        return self.call("metrics", run_id, name)

    def privacy(self, run_id: int, accountant: str | None = None) -> list[dict[str, Any]]:
        return self.call("privacy", run_id, accountant)

    def votes(self, run_id: int, *, start: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        return self.call("votes", run_id, start=start, limit=limit)

    def artifacts(self, run_id: int) -> list[dict[str, Any]]:
        return self.call("artifacts", run_id)

    def replay(self, run_id: int) -> dict[str, Any]:
        return self.call("replay", run_id)

    def reconcile_orphans(self) -> list[int]:
        return self.call("reconcile_orphans")

    def create_run(self, config: Any) -> int:
        return self.call("create_run", config.to_dict())

    def continue_run(self, run_id: int) -> int:
        """A queued run continuing `run_id` from its last checkpoint (engine.checkpoint)."""
        return self.call("continue_run", run_id)

    def update_run(self, run_id: int, **fields: Any) -> None:
        self.call("update_run", run_id, **fields)

    def deleted_runs(self) -> list[dict[str, Any]]:
        """What the store keeps of deleted runs (engine.store.Store.deleted_runs)."""
        return self.call("deleted_runs")

    def set_tags(self, run_id: int, tags: list[str]) -> list[str]:
        """Replace the run's tags; returns them as stored (cleaned, each once)."""
        return self.call("set_tags", run_id, list(tags))

    def set_notes(self, run_id: int, notes: str) -> None:
        self.call("set_notes", run_id, notes)

    def rename_run(self, run_id: int, name: str) -> str:
        return self.call("rename_run", run_id, name)

    def remove_run(self, run_id: int) -> dict[str, Any]:
        """Delete a run and its saved files (engine.runner.remove_run)."""
        return self.call("remove_run", run_id)

    def export_run(self, run_ref: str | int, out_dir: str | Path, *, kind: str = "model",
                   force: bool = False) -> dict[str, str]:
        return self.call("export_run", run_ref, str(out_dir), kind=kind, force=force, timeout=None)

    def build_report(self, run_ref: str | int) -> dict[str, Any]:
        """{"report": the report, "html": it rendered}."""
        return self.call("build_report", run_ref, timeout=None)

    def __enter__(self) -> "StoreClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def end_helper(process: subprocess.Popen, *, timeout: float) -> None:
    """End a line-protocol helper process (the store helper, the pre-run check): close its input, which
    asks it to finish and exit, wait up to `timeout` seconds, then kill it."""
    try:
        process.stdin.close()
    except OSError:
        pass
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    process.stdout.close()
