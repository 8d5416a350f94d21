"""The window's Study action: a study file's plan (space, number of runs, the study's epsilon before it
runs) in a dialog, and the study itself run in the background by `dpw study --json` (a process of its
own, as runs have: the window never trains, never computes privacy and never stalls)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, Signal
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QVBoxLayout, QWidget

from engine.study import plan_lines, plan_summary
from engine.study_config import StudyConfig

STUDY_FILTER = "Study files (*.toml)"
ERROR_KEPT = 4000  # characters of a helper's stderr kept to explain a failure


def _process(parent: QObject, environment: dict[str, str]) -> QProcess:
    """A QProcess running this interpreter with the engine importable and the runners' variables."""
    process = QProcess(parent)
    env = QProcessEnvironment.systemEnvironment()
    env.insert("PYTHONUNBUFFERED", "1")
    repo = str(Path(__file__).resolve().parents[1])
    env.insert("PYTHONPATH", repo + os.pathsep + env.value("PYTHONPATH", "") if env.contains("PYTHONPATH") else repo)
    for key, value in environment.items():
        env.insert(key, value)
    process.setProcessEnvironment(env)
    return process


def last_line(data: bytes) -> str:
    lines = data.decode("utf-8", errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


class StudyPlanDialog(QDialog):
    """The plan of `config` (read from `path`): what needs no data at once, the study's epsilon (which
    needs the training set's size) from `dpw study --plan --json` in the background. Start is enabled
    once the epsilon is shown, so a study is never started before its cost was on screen."""

    def __init__(self, path: str | Path, config: StudyConfig, environment: dict[str, str] | None = None,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("studyPlanDialog")
        self.setWindowTitle(f"Study plan — {Path(path).name}")
        self.path, self.config = Path(path), config
        self.summary: dict[str, Any] = plan_summary(config, with_epsilon=False)
        self.labels: dict[str, QLabel] = {}
        layout = QVBoxLayout(self)
        self.form = QFormLayout()
        layout.addLayout(self.form)
        self.status = QLabel("Computing the study's epsilon (loading the data for its size)…")
        self.status.setObjectName("studyPlanStatus")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.start_button = self.buttons.addButton("Start study", QDialogButtonBox.ButtonRole.AcceptRole)
        self.start_button.setEnabled(False)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self._show(self.summary)
        self.setMinimumWidth(640)
        self.process = _process(self, environment or {})
        self._out = b""
        self._err = b""
        self.process.readyReadStandardOutput.connect(self._read)
        self.process.readyReadStandardError.connect(self._read_err)
        self.process.finished.connect(self._planned)
        self.process.errorOccurred.connect(self._failed)
        self.process.start(sys.executable, ["-m", "engine.cli", "study", str(self.path), "--plan", "--json"])

    def _show(self, summary: dict[str, Any]) -> None:
        for label, text in plan_lines(summary):
            if label not in self.labels:
                value = QLabel(text)
                value.setWordWrap(True)
                value.setObjectName(f"plan {label}")
                self.labels[label] = value
                self.form.addRow(label, value)
            else:
                self.labels[label].setText(text)

    def rows(self) -> dict[str, str]:
        """The plan as shown: label -> text."""
        return {label: widget.text() for label, widget in self.labels.items()}

    def _read(self) -> None:
        self._out += bytes(self.process.readAllStandardOutput())

    def _read_err(self) -> None:
        self._err = (self._err + bytes(self.process.readAllStandardError()))[-ERROR_KEPT:]

    def _planned(self, code: int, _status: Any) -> None:
        self._read()
        self._read_err()
        try:
            summary = json.loads(self._out.decode("utf-8")) if code == 0 else None
        except ValueError:
            summary = None
        if summary is None:
            self.status.setText("Cannot compute the study's epsilon: " + (last_line(self._err) or f"exit {code}"))
            return
        self.summary = summary
        self._show(summary)
        self.status.setText("Start runs the study in the background; its runs appear in the runs list as they "
                            "start, grouped by the Study column.")
        self.start_button.setEnabled(True)

    def _failed(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self.status.setText(f"Cannot compute the study's epsilon: {self.process.errorString()}")

    def done(self, result: int) -> None:  # noqa: D102 - also ends the helper when the dialog closes
        if self.process.state() != QProcess.ProcessState.NotRunning:
            self.process.kill()
            self.process.waitForFinished(2000)
        super().done(result)


class StudyProcess(QObject):
    """`dpw study FILE --db DB --json` in the background. Signals: study_started(study id),
    candidate(run id), ended(study id or -1, status, message)."""

    study_started = Signal(int)
    candidate = Signal(int)
    ended = Signal(int, str, str)

    def __init__(self, path: str | Path, db_path: str | Path, environment: dict[str, str] | None = None,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.path = Path(path)
        self.study_id: int | None = None
        self.status: str | None = None
        self._buffer = b""
        self._err = b""
        self.process = _process(self, environment or {})
        self.process.readyReadStandardOutput.connect(self._read)
        self.process.readyReadStandardError.connect(
            lambda: setattr(self, "_err", (self._err + bytes(self.process.readAllStandardError()))[-ERROR_KEPT:]))
        self.process.finished.connect(self._finished)
        self.process.start(sys.executable, ["-m", "engine.cli", "study", str(self.path), "--db", str(db_path),
                                            "--json"])

    def running(self) -> bool:
        return self.process.state() != QProcess.ProcessState.NotRunning

    def label(self) -> str:
        """How the window names the study to a person: its file, and its id once stored."""
        return self.path.name + (f" (study {self.study_id})" if self.study_id is not None else "")

    def stop(self) -> None:
        """Ask the study to stop (SIGTERM: `dpw study` stops its current candidate after its step; the
        study ends "stopped", releasing nothing chosen and stating the composition of what ran)."""
        if self.running():
            self.process.terminate()

    def shutdown(self, timeout_ms: int = 30000) -> None:
        """The window is closing: stop the study (as `stop`) and wait for it; one that does not end in
        time is killed, and the next reader of the store marks it interrupted with what it had spent."""
        if not self.running():
            return
        self.stop()
        if not self.process.waitForFinished(timeout_ms):
            self.process.kill()
            self.process.waitForFinished(2000)

    def _read(self) -> None:
        data = self._buffer + bytes(self.process.readAllStandardOutput())
        *lines, self._buffer = data.split(b"\n")
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict) or "v" in event:
                continue  # a candidate's runner event: the runs list follows those from the store
            if event.get("type") == "study":
                self.study_id = int(event["study_id"])
                self.study_started.emit(self.study_id)
            elif event.get("type") == "candidate":
                self.candidate.emit(int(event["run_id"]))
            elif event.get("type") == "study_finished":
                self.status = str(event.get("status"))

    def _finished(self, code: int, _status: Any) -> None:
        self._read()
        message = "" if code == 0 else (last_line(self._err) or f"dpw study exited with status {code}")
        self.ended.emit(-1 if self.study_id is None else self.study_id, self.status or "failed", message)
