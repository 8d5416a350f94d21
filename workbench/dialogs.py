"""Run actions that open a dialog: Export… and Report…. Slow engine work runs off the GUI thread."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QObject, QRunnable, QThreadPool, QUrl, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine import rounding
from engine.errors import DPWError, ExportFilesExist
from workbench.screen import fit_to_screen
from workbench.settings import Settings
from workbench.store_client import StoreClient

WARNING_COLOUR = "#d62728"
EXPORT_FOLDER_KEY = "export/folder"  # where the last export's folder was made
REPORT_FOLDER_KEY = "report/folder"  # where the last report was saved


def describe_error(exc: BaseException) -> str:
    """One paragraph for a person: the engine's message and hint, or the exception's type and text."""
    if isinstance(exc, DPWError):
        return exc.message + (f"\n{exc.hint}" if exc.hint else "")
    return f"{type(exc).__name__}: {exc}"


class _Signals(QObject):
    done = Signal(object)
    failed = Signal(object)


class Task(QRunnable):
    """`fn()` in the global thread pool; `done(result)` or `failed(exception)` on the GUI thread."""

    def __init__(self, fn: Callable[[], Any]):
        super().__init__()
        self.fn = fn
        self.signals = _Signals()

    def run(self) -> None:
        try:
            result = self.fn()
        except BaseException as exc:  # shown to the user, never lost
            self._tell(self.signals.failed, exc)
            return
        self._tell(self.signals.done, result)

    def _tell(self, signal, value) -> None:
        try:
            signal.emit(value)
        except RuntimeError:  # "Signal source has been deleted": the window that asked closed (or the app
            pass  # quit) while this ran; there is nobody left to tell, and a traceback would only alarm


def start_task(fn: Callable[[], Any], done: Callable[[Any], None], failed: Callable[[BaseException], None]) -> Task:
    task = Task(fn)
    task.setAutoDelete(False)
    task.signals.done.connect(done)
    task.signals.failed.connect(failed)
    QThreadPool.globalInstance().start(task)
    return task


def run_file_stem(run: dict[str, Any]) -> str:
    """A file or folder name for what is saved of a run: "run-3-mnist-eps3" from run 3 "mnist eps3"."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(run.get("name") or "")).strip("-.")[:40]
    return f"run-{run['id']}" + (f"-{name}" if name else "")


def export_statement(run: dict[str, Any]) -> str:
    """What the exported model carries, shown before exporting: its publishable epsilon (with its
    study's note), or why there is none, and the audit-model warning (engine.audit_run)."""
    from engine.audit_run import audit_model_line
    from engine.publication import no_guarantee_statement, publishable_epsilon

    eps = publishable_epsilon(run)
    if run.get("mechanism") == "none":
        text = "none: a non-private baseline, which may reveal its training examples"
    elif not eps.guarantee:
        text = f"<b>{html.escape(no_guarantee_statement(run))}</b>"
    elif eps.value is not None:
        text = (f"ε = {rounding.up(eps.value, '.4g')}, δ = {eps.delta:g} ({eps.accountant})"
                + (f"; {eps.note}" if eps.note else ""))
    else:
        text = eps.note or "no epsilon was accounted"
    line = audit_model_line(run)
    if line:
        text += f"<br><b style='color:{WARNING_COLOUR}'>{line[0].upper() + line[1:]}.</b>"
    return text


def folder_link(path: Path) -> str:
    """A link that opens `path` in the desktop's file manager (QLabel with open external links)."""
    return f"<a href='{QUrl.fromLocalFile(str(path)).toString()}'>Open the folder</a>"


class ExportDialog(QDialog):
    """Export a run's released model (DP-SGD model, PATE student) with `engine.export.export_run`.
    The folder it proposes is inside the one used last time (remembered as export/folder)."""

    def __init__(self, store_path: Path, run: dict[str, Any], parent: QWidget | None = None,
                 settings: Settings | None = None):
        super().__init__(parent)
        self.store_path, self.run, self.settings = store_path, run, settings
        self.setWindowTitle(f"Export run {run['id']} ({run['name']})")
        self.setMinimumWidth(560)
        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.kind = QComboBox()
        if run["mechanism"] == "pate":
            self.kind.addItem("the student (released model)", "model")
            self.kind.addItem("the teachers", "teacher")
        else:
            self.kind.addItem("the trained model", "model")
        form.addRow("Export", self.kind)
        folder_row = QHBoxLayout()
        parent_folder = settings.text(EXPORT_FOLDER_KEY, str(Path.home())) if settings else str(Path.home())
        self.folder = QLineEdit(str(Path(parent_folder) / f"{run_file_stem(run)}-model"))
        browse = QPushButton("Folder…")
        browse.clicked.connect(self._browse)
        folder_row.addWidget(self.folder, 1)
        folder_row.addWidget(browse)
        form.addRow("Into folder", folder_row)
        self.guarantee = QLabel(export_statement(run))
        self.guarantee.setWordWrap(True)
        form.addRow("Guarantee", self.guarantee)
        layout.addLayout(form)
        self.result_label = QLabel("Writes model.safetensors, model.pt2 (torch.export), model.onnx and "
                                   "model_card.json.")
        self.result_label.setWordWrap(True)
        self.result_label.setOpenExternalLinks(True)
        layout.addWidget(self.result_label)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.export_button = self.buttons.addButton("Export", QDialogButtonBox.ButtonRole.ActionRole)
        self.export_button.clicked.connect(self.export)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.task: Task | None = None
        self.outcome: str | None = None  # "ok" or "error", for tests

    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Export into folder", self.folder.text())
        if path:
            self.folder.setText(path)

    def export(self, *, replace: bool = False) -> None:
        kind, out = self.kind.currentData(), self.folder.text().strip()
        run_id, db = self.run["id"], self.store_path

        def work() -> dict[str, str]:
            # A store helper of this export's own (this process never opens the store file).
            with StoreClient(db) as store:
                return store.export_run(run_id, out, kind=kind, force=replace)

        self.export_button.setEnabled(False)
        self.result_label.setText("Exporting…")
        self.task = start_task(work, self._done, self._failed)

    def _done(self, files: dict[str, str]) -> None:
        self.outcome = "ok"
        self.export_button.setEnabled(True)
        lines = "".join(f"<li>{name}: {'<i>' + value + '</i>' if value.startswith('not') else 'sha256 ' + value[:16] + '…'}</li>"
                        for name, value in files.items())
        folder = Path(self.folder.text().strip()).expanduser().absolute()
        if self.settings is not None:
            self.settings.set_text(EXPORT_FOLDER_KEY, str(folder.parent))
        self.result_label.setText(f"Exported to {folder} ({folder_link(folder)}):<ul>{lines}</ul>")

    def _failed(self, exc: BaseException) -> None:
        self.export_button.setEnabled(True)
        if isinstance(exc, ExportFilesExist) and self.ask_to_replace(exc.message):
            self.export(replace=True)
            return
        self.outcome = "error"
        text = (f"{exc.message}; choose another folder, or export again and replace them"
                if isinstance(exc, ExportFilesExist) else describe_error(exc).replace("\n", "<br>"))
        self.result_label.setText("<b style='color:#d62728'>Not exported:</b> " + text)

    def ask_to_replace(self, message: str) -> bool:
        """The folder already holds an export: replace its files (the window's `dpw export --force`)?"""
        box = QMessageBox(QMessageBox.Icon.Question, "Replace the exported files?", message[0].upper() + message[1:] + ".",
                          parent=self)
        box.setObjectName("replaceExportDialog")
        box.setInformativeText("Replace them with this run's export, or choose another folder.")
        replace = box.addButton("Replace", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton("Choose another folder", QMessageBox.ButtonRole.RejectRole)
        box.exec()
        return box.clickedButton() is replace


class ReportDialog(QDialog):
    """Preview a run's privacy report (engine.report) and save it as HTML, PDF or JSON."""

    def __init__(self, store_path: Path, run: dict[str, Any], parent: QWidget | None = None,
                 settings: Settings | None = None):
        super().__init__(parent)
        self.store_path, self.run, self.settings = store_path, run, settings
        self.report: dict[str, Any] | None = None
        self.html = ""
        self.setWindowTitle(f"Privacy report — run {run['id']} ({run['name']})")
        fit_to_screen(self, 820, 900)
        layout = QVBoxLayout(self)
        self.browser = QTextBrowser()
        self.browser.setOpenExternalLinks(True)
        # The report is a document with its own (light) colours: show it as a page.
        self.browser.setStyleSheet("QTextBrowser { background: white; color: #222; }")
        self.browser.setPlainText("Building the report…")
        layout.addWidget(self.browser, 1)
        self.status = QLabel("")
        self.status.setOpenExternalLinks(True)
        layout.addWidget(self.status)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.save_buttons = []
        for label, suffix in (("Save as HTML…", ".html"), ("Save as PDF…", ".pdf"), ("Save as JSON…", ".json")):
            button = buttons.addButton(label, QDialogButtonBox.ButtonRole.ActionRole)
            button.clicked.connect(lambda _=False, s=suffix: self.save_dialog(s))
            button.setEnabled(False)
            self.save_buttons.append(button)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.task = start_task(self._build, self._built, self._failed)

    def _build(self) -> tuple[dict[str, Any], str]:
        # Built by a store helper of this dialog's own (this process never opens the store file).
        with StoreClient(self.store_path) as store:
            built = store.build_report(self.run["id"])
        return built["report"], built["html"]

    def _built(self, result: tuple[dict[str, Any], str]) -> None:
        self.report, self.html = result
        self.browser.setHtml(self.html)
        for button in self.save_buttons:
            button.setEnabled(True)

    def _failed(self, exc: BaseException) -> None:
        self.browser.setPlainText("No report: " + describe_error(exc))
        self.status.setText("")

    def save_dialog(self, suffix: str) -> None:
        folder = self.settings.text(REPORT_FOLDER_KEY, str(Path.home())) if self.settings else str(Path.home())
        default = str(Path(folder) / f"{run_file_stem(self.run)}-privacy-report{suffix}")
        path, _ = QFileDialog.getSaveFileName(self, "Save report", default, f"*{suffix}")
        if path:
            self.save(Path(path))

    def save(self, path: Path) -> Path:
        """Write the previewed report; the format follows the file's extension."""
        assert self.report is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        suffix = path.suffix.lower()
        if suffix in (".html", ".htm"):
            path.write_text(self.html, encoding="utf-8")
        elif suffix == ".pdf":
            from workbench.report_pdf import html_to_pdf

            html_to_pdf(self.html, path)
        else:
            path.write_text(json.dumps(self.report, indent=2, default=str), encoding="utf-8")
        if self.settings is not None:
            self.settings.set_text(REPORT_FOLDER_KEY, str(path.absolute().parent))
        self.status.setText(f"Saved {path} ({folder_link(path.absolute().parent)})")
        return path
