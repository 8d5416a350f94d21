"""Closing the window while runs are active, and stopping runs the window did not start (a runner that
outlived a crashed window, or one `dpw run` started on this machine)."""

from __future__ import annotations

import os
import signal
import socket
from typing import Any

from PySide6.QtWidgets import QMessageBox, QWidget

STOP, KEEP, CANCEL = "stop", "keep", "cancel"


def active_run_label(row: dict[str, Any]) -> str:
    """A run whose runner is still at work, as the close dialog names it. One the store records as
    finished is in its membership audit (the list says "finished" meanwhile): "Running" alone
    contradicted the list."""
    audit = "; trained, its membership audit still running" if row.get("status") == "finished" else ""
    return f"{row['id']} ({row.get('name')}{audit})"


def ask_before_closing(parent: QWidget, running: list[str], queued: list[str], studies: list[str] = ()) -> str:
    """Ask whether to stop the active runs or let the running ones finish in the background; tuning
    studies the window started stop either way (their output goes to the window). Returns STOP, KEEP
    or CANCEL."""
    lines = []
    if running:
        lines.append("Running: " + ", ".join(running) + ".")
    if queued:
        lines.append("Queued (never started; dropped either way): " + ", ".join(queued) + ".")
    if studies:
        lines.append("Tuning studies (stopped either way; each records what it spent, and a private study "
                     "stopped early releases nothing): " + ", ".join(studies) + ".")
    question = ("Stop the runs, or let them finish in the background?" if running else
                "Stop them and close?")
    title = "Runs are still active" if running or queued else "A tuning study is still running"
    box = QMessageBox(QMessageBox.Icon.Question, title, question, parent=parent)
    box.setStyleSheet("QLabel#qt_msgbox_label, QLabel#qt_msgbox_informativelabel { min-width: 440px; }")
    box.setObjectName("closeWithRunsDialog")
    if running:
        lines.append("\nA run left running keeps writing its curves and privacy spent to the store; open the "
                     "window again to follow or stop it.")
    box.setInformativeText("\n".join(lines))
    stop = box.addButton("Stop runs and close", QMessageBox.ButtonRole.DestructiveRole)
    keep = box.addButton("Keep running in background", QMessageBox.ButtonRole.AcceptRole) if running else None
    cancel = box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(cancel)
    box.exec()
    clicked = box.clickedButton()
    if clicked is stop:
        return STOP
    if keep is not None and clicked is keep:
        return KEEP
    return CANCEL


def runner_pid(row: dict[str, Any] | None) -> int | None:
    """The pid of a run's live runner on this machine, from its store row; None if there is none."""
    if row is None or row.get("status") != "running" or row.get("pid") is None:
        return None
    if row.get("host") not in (None, socket.gethostname()):
        return None  # another machine's process
    pid = int(row["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return None  # someone else's process: not ours to stop
    return pid


def stop_runner(row: dict[str, Any]) -> bool:
    """Ask a runner the window did not start to stop after its current step (SIGTERM, as `dpw run`
    and the window's own Stop do). False when there is no such runner."""
    pid = runner_pid(row)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    return True
