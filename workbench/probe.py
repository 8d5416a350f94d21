"""What the engine offers on this machine (device, datasets, models), for the window.

Importing torch takes seconds, so the window never does it itself. It asks a process that imports
torch anyway: the runner it keeps loaded on standby for the next run (`EngineClient.ask_capabilities`),
or, when that one cannot answer (none could start, it ended, or a run took it first), the helper
that checks configs before they are stored, from a worker thread. The answers fill in the status
bar's device and the dataset and model lists when they come.
"""

from __future__ import annotations

import threading
from typing import Any

from PySide6.QtCore import QObject, Signal

from engine.errors import DPWError


class EngineProbe(QObject):
    """Asks the runner on standby, else the pre-run check's helper; `ready(dict)` or `failed(str)`."""

    ready = Signal(dict)
    failed = Signal(str)
    _answered = Signal(object)  # from the helper's worker thread; delivered in the GUI thread (queued)

    def __init__(self, client: Any, precheck: Any, parent: QObject | None = None):
        super().__init__(parent)
        self.client = client  # workbench.engine_client.EngineClient
        self.precheck = precheck  # workbench.precheck_client.PrecheckClient
        self.result: dict[str, Any] | None = None
        self._thread: threading.Thread | None = None
        self._answered.connect(self._deliver)
        client.capabilities.connect(self._deliver)
        client.capabilities_unanswered.connect(self._ask_helper)

    def start(self) -> None:
        """Ask the runner on standby (keep one first: EngineClient.keep_standby), else the helper."""
        if not self.client.ask_capabilities():
            self._ask_helper()

    def _ask_helper(self) -> None:
        if self.result is not None or (self._thread is not None and self._thread.is_alive()):
            return
        self._thread = threading.Thread(target=self._ask, name="engine-probe", daemon=True)
        self._thread.start()

    def _ask(self) -> None:
        try:
            answer = self.precheck.capabilities()
        except DPWError as exc:
            answer = exc
        except Exception as exc:  # the window never goes down over the probe
            answer = DPWError(f"{type(exc).__name__}: {exc}")
        try:
            self._answered.emit(answer)
        except RuntimeError:  # the window closed meanwhile (this object is gone)
            pass

    def _deliver(self, answer: dict[str, Any] | DPWError) -> None:
        if isinstance(answer, DPWError):
            self.failed.emit(answer.message)
            return
        if self.result is None:
            self.result = answer
            self.ready.emit(answer)
