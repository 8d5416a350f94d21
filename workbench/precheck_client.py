"""The checks `dpw run` does before storing a run, for the window: in a helper process, off the GUI.

`engine.precheck` loads the data, applies the rules that need it, builds the model and plans the
privacy, as the runner will; a config that fails there (data not found, delta >= 1/N of the real
data, a model that does not fit) costs the user one line instead of a failed run in the list. The
helper (`python -m engine.precheck`) imports torch once and stays for the next check; the window
waits for its answer in a local event loop, so it keeps painting meanwhile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Collection, Mapping

from engine.errors import DPWError, error_from_reply
from workbench.store_client import end_helper

REPO = Path(__file__).resolve().parents[1]
CHECK_TIMEOUT_S = 600.0  # a first check imports torch and may load (or download) a large dataset


class PrecheckClient:
    """One helper process, started on the first check; `check(config)` is None or the DPWError."""

    def __init__(self, environment: Mapping[str, str] | None = None):
        self.environment = environment if environment is not None else {}
        self._process: subprocess.Popen | None = None
        self._starting: subprocess.Popen | None = None  # started, still importing (close() ends it too)
        self._lock = threading.Lock()
        self._closed = False

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8", **self.environment)
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        process = subprocess.Popen([sys.executable, "-m", "engine.precheck"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, env=env, cwd=str(REPO))  # stderr: the terminal
        self._starting = process
        try:
            first = process.stdout.readline()
        finally:
            self._starting = None
        if not first.strip():
            process.wait()
            raise DPWError("the pre-run check could not start (its error is in the terminal)",
                           hint="the run was not stored; try again, or start it with `dpw run`")
        return process

    def check(self, config: Any, *, checked_before: Collection[str] = ()) -> DPWError | None:
        """Check a RunConfig (blocking; safe from a worker thread): None when it would train.
        `checked_before`: fingerprints of data that passed the check before (engine.runs.prepare)."""
        reply = self._ask({**config.to_dict(), "checked_before": sorted(checked_before)})
        return None if reply.get("ok") else error_from_reply(reply)

    def data_size(self, config: Any, *, checked_before: Collection[str] = ()) -> tuple[int, int] | DPWError:
        """(training, test) examples of the config's data as a run reads it, or why it cannot be read
        (blocking; from a worker thread: a large dataset takes as long to read as a run's loading)."""
        reply = self._ask({"size_of": config.to_dict(), "checked_before": sorted(checked_before)})
        return (int(reply["num_train"]), int(reply["num_test"])) if reply.get("ok") else error_from_reply(reply)

    def capabilities(self) -> dict[str, Any] | DPWError:
        """What the engine offers here (engine.capabilities: device, datasets, models), or why the
        helper could not say (blocking; from a worker thread: the helper imports torch first)."""
        reply = self._ask({"capabilities": True})
        return {k: v for k, v in reply.items() if k != "ok"} if reply.get("ok") else error_from_reply(reply)

    def _ask(self, request: dict) -> dict:
        with self._lock:
            for _ in range(2):  # a helper that died since the last request is started again once
                if self._closed:
                    break
                if self._process is None or self._process.poll() is not None:
                    self._process = self._start()
                try:
                    self._process.stdin.write((json.dumps(request) + "\n").encode("utf-8"))
                    self._process.stdin.flush()
                    line = self._process.stdout.readline()
                except (OSError, ValueError):
                    line = b""
                if line.strip():
                    return json.loads(line)
                self._stop()
        return {"ok": False, "message": "the pre-run check ended without an answer (its error is in the terminal)",
                "hint": "the run was not stored; try again, or start it with `dpw run`"}

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            end_helper(process, timeout=5)

    def close(self) -> None:
        """End the helper (end of input); a check in progress is cut short (it answers that it ended)."""
        self._closed = True
        for process in (self._process, self._starting):  # a request, or the helper's start, in progress
            if process is not None and self._lock.locked():
                process.kill()
        with self._lock:
            self._stop()


def check_while_painting(client: PrecheckClient, config: Any, *,
                         checked_before: Collection[str] = ()) -> DPWError | None:
    """Run `client.check(config)` in a worker thread and return its answer; the window's event loop
    runs meanwhile (a local loop), so the window repaints and stays responsive."""
    from PySide6.QtCore import QEventLoop, QObject, Signal

    class _Done(QObject):
        done = Signal()

    result: dict[str, Any] = {}
    signal = _Done()
    loop = QEventLoop()
    signal.done.connect(loop.quit)

    def work() -> None:
        try:
            result["problem"] = client.check(config, checked_before=checked_before)
        except DPWError as exc:
            result["problem"] = exc
        except Exception as exc:  # the window never goes down over a check
            result["problem"] = DPWError(f"the pre-run check failed: {type(exc).__name__}: {exc}",
                                         hint="the run was not stored; try again, or start it with `dpw run`")
        signal.done.emit()

    worker = threading.Thread(target=work, name="precheck", daemon=True)
    worker.start()
    if worker.is_alive():
        loop.exec()
    worker.join()
    return result.get("problem")
