"""What the engine offers on this machine: device, datasets, models.

Importing torch takes seconds, so the window never does it itself: it runs
`python -m workbench.probe`, which prints one JSON object, and fills in the answers when
they come (the status bar's device, the dataset and model lists).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from PySide6.QtCore import QObject, QProcess, Signal


def probe() -> dict[str, Any]:
    import torch

    from engine.datasets import find_missing_files, list_datasets
    from engine.models import list_models, models_for

    cuda = bool(torch.cuda.is_available())
    datasets = []
    for info in list_datasets():
        try:
            missing = list(find_missing_files(info.name)) if info.needs_files else []
        except Exception:  # a data folder we cannot read is the runner's to report
            missing = []
        datasets.append({"name": info.name, "kind": info.kind, "description": info.description,
                         "needs_files": info.needs_files, "missing": missing,
                         "input_shape": list(info.input_shape) if info.input_shape else None,
                         "models": models_for(tuple(info.input_shape)) if info.input_shape else None})
    return {
        "device": "cuda" if cuda else "cpu",
        "device_name": torch.cuda.get_device_name(0) if cuda else "",
        "torch": torch.__version__,
        "datasets": datasets,
        "models": [{"name": m.name, "kinds": list(m.kinds), "description": m.description} for m in list_models()],
    }


class EngineProbe(QObject):
    """Runs the probe in a child process; `ready(dict)` or `failed(str)`."""

    ready = Signal(dict)
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.result: dict[str, Any] | None = None
        self.process = QProcess(self)
        self.process.finished.connect(self._finished)
        self.process.errorOccurred.connect(self._error)

    def start(self) -> None:
        self.process.start(sys.executable, ["-m", "workbench.probe"])

    def _error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self.failed.emit(f"cannot start {sys.executable}: {self.process.errorString()}")

    def _finished(self, code: int, status: QProcess.ExitStatus) -> None:
        out = bytes(self.process.readAllStandardOutput()).decode("utf-8", errors="replace")
        try:
            self.result = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            err = bytes(self.process.readAllStandardError()).decode("utf-8", errors="replace").strip()
            self.failed.emit(err.splitlines()[-1] if err else f"the engine probe exited with status {code}")
            return
        self.ready.emit(self.result)


if __name__ == "__main__":
    print(json.dumps(probe()))
    sys.exit(0)
