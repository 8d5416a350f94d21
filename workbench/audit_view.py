"""The Audit tab: what a run's guarantee allows the best membership attacker, how a real attack did,
and what the run's canaries proved; and the same curves overlaid for the runs Compare shows.

- Theory (public): the trade-off curve of the best possible membership test, from the publishable
  guarantee (engine.attack_risk). Computed in a worker thread (a PLD takes up to a second), kept per run.
- Empirical (private data): the loss attack's ROC with bootstrap intervals (engine.audit_run), run by
  `python -m engine.audit_job` in a process of its own, which keeps the result in the run's summary
  (`membership_audit`): the window only starts it and reads the result.
- Canaries (private data): the one-run canary audit's epsilon lower bound, if the run had canaries
  (the training run's summary, "audit"/"canaries").

`audit_figure` is Qt-free: everything drawn and the red banner come from it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, Qt, QTimer, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine import rounding
from engine.audit.membership import not_measurable, theory_check_text
from engine.audit_job import MEMBERSHIP_AUDIT_KEY
from engine.rounding import percent_down, percent_up
from workbench.plots import Plot, set_curve

REPO = Path(__file__).resolve().parents[1]
FPR_LEVELS = ("0.01", "0.001")  # the keys of tpr_at_fpr in the engine's JSON
LOG_FPR_MIN = 1e-4  # the log axis starts here: below, 5,000 non-members cannot say anything
BANNER_COLOUR = "#d62728"
LEGEND_GREY = "#808080"  # Compare's membership legend: line styles, not runs
CURVES = (  # key, legend name, colour index (workbench.plots), pen style, width
    ("chance", "chance (guessing)", 7, Qt.PenStyle.DashLine, 1.0),
    ("theory", "theory: best possible test", 0, Qt.PenStyle.SolidLine, 2.0),
    ("roc", "attack (empirical ROC)", 1, Qt.PenStyle.SolidLine, 2.0),
)
PRIVATE_NOTE = ("Theory comes from the publishable guarantee (public parameters only). The attack and the canary "
                "bound are computed from the run's private training data on this machine: they stay in the local "
                "store and appear in a report only with dpw report --include-audit.")


# ---- Qt-free: what one run's audit shows ------------------------------------------------------------
def canary_result(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """The one-run canary audit the training run recorded (count, kind, epsilon_lower_bound,
    confidence), or None when the run had no canaries."""
    summary = summary or {}
    audit = summary.get("audit")
    for candidate in ((audit or {}).get("canaries") if isinstance(audit, dict) else None, audit,
                      summary.get("canaries")):
        if isinstance(candidate, dict) and candidate.get("epsilon_lower_bound") is not None:
            return candidate
    return None


def membership_result(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """The membership audit kept with the run (engine.audit_job), or None before one was run."""
    found = (summary or {}).get(MEMBERSHIP_AUDIT_KEY)
    return found if isinstance(found, dict) and isinstance(found.get("mia"), dict) else None


@dataclass(frozen=True)
class AuditFigure:
    """Everything the Audit tab draws for one run: curves as (fpr, tpr), table rows
    (what, theory, attack, interval), notes, and the banner (None unless the attack beat the bound)."""

    theory: tuple[np.ndarray, np.ndarray] | None
    theory_note: str
    roc: tuple[np.ndarray, np.ndarray] | None
    roc_note: str
    canary_note: str
    table: list[tuple[str, str, str, str]] = field(default_factory=list)
    banner: str | None = None


def _percent(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.3g}%"


def _bound_percent(x: float | None, rounded: Callable[[float, int], str]) -> str:
    """A bound in the banner, rounded toward the safe side (an upper bound up, a lower bound down)."""
    return "—" if x is None else rounded(x, 3)


def audit_figure(*, theory: dict[str, Any] | None, audit: dict[str, Any] | None,
                 canaries: dict[str, Any] | None) -> AuditFigure:
    """The figure of one run from the engine's JSON: `theory` (engine.attack_risk's RunAttackRisk.to_json,
    None while it is being computed), `audit` (engine.audit_job's stored audit, None before one),
    `canaries` (canary_result). The banner: the engine's simultaneous check (engine.audit.membership) found
    some point of the ROC above the theoretical curve beyond its confidence band, or the canaries' lower
    bound exceeds the publishable epsilon."""
    curve, theory_note = None, "Computing the theoretical curve…"
    tradeoff = (theory or {}).get("tradeoff")
    if theory is not None and tradeoff:
        curve = (np.asarray(tradeoff["fpr"], dtype=float), np.asarray(tradeoff["tpr"], dtype=float))
        theory_note = (f"Theory: the best possible membership test at publishable ε = "
                       f"{rounding.up(theory['publishable_epsilon'], '.3g')}, δ = {theory['delta']:g} "
                       f"({theory.get('basis') or 'the run’s guarantee'}). Every TPR shown is an upper bound.")
    elif theory is not None:
        theory_note = f"No theoretical curve: {theory.get('reason') or theory.get('error') or 'no guarantee'}."

    roc, roc_note, banner = None, "No attack yet: Run audit computes it (needs the run's model and data).", None
    mia = (audit or {}).get("mia")
    if mia:
        roc = (np.asarray(mia["roc"]["fpr"], dtype=float), np.asarray(mia["roc"]["tpr"], dtype=float))
        lo, hi = mia["auc_interval"]
        roc_note = (f"Attack: loss threshold on {mia['members']:,} training members against {mia['nonmembers']:,} "
                    f"held-out examples ({audit.get('nonmembers', 'held-out')}); AUC {mia['auc']:.3f} "
                    f"[{lo:.3f}, {hi:.3f}] at {100 * mia['confidence']:g}%.")
        if audit.get("computed"):
            roc_note += f" Computed {audit['computed'].replace('T', ' ')[:16]} UTC."
        for level in FPR_LEVELS:
            if (why := not_measurable(float(level), mia["nonmembers"])) is not None:
                roc_note += f" TPR at FPR {100 * float(level):g}%: {why}."
        check = mia.get("theory") or {}
        if check and not check.get("above_theory"):
            roc_note += (" Check: " + theory_check_text(check, members=mia["members"], nonmembers=mia["nonmembers"])
                         + ". A point of the curve may cross the bound by chance.")
        if check.get("above_theory"):
            worst = check.get("worst") or {}
            banner = ("BUG OR BROKEN ASSUMPTION: the attack's ROC lies above the best test this guarantee allows, "
                      f"beyond its {100 * check.get('confidence', mia['confidence']):g}% band (at FPR up to "
                      f"{_bound_percent(worst.get('fpr_upper'), percent_up)} its TPR is at least "
                      f"{_bound_percent(worst.get('tpr_lower'), percent_down)}, the bound is "
                      f"{_bound_percent(worst.get('theory_tpr'), percent_up)}). Do not publish this ε until this is "
                      "explained: the model may have seen data the accounting left out, or the accounting is wrong.")

    canary_note = "No canaries in this run (set audit_canaries to audit it in one run)."
    if canaries is not None:
        # A number, not a curve: the bound says the run is not (ε, δ)-DP for a smaller ε, i.e. some test
        # beats that ε's curve somewhere, not that any test reaches it everywhere; drawn beside the
        # guarantee's exact curve it would read as an attack above the guarantee.
        bound = float(canaries["epsilon_lower_bound"])
        level = f"{100 * float(canaries.get('confidence', 0.95)):g}%"
        canary_note = (f"Canary audit ({canaries.get('count', '?')} {canaries.get('kind', '')} canaries, one run): "
                       f"ε ≥ {rounding.down(bound, '.3g')} at {level} confidence")
        stated = (theory or {}).get("publishable_epsilon")
        if bound <= 0:
            canary_note += ": no evidence beyond what any run shows."
        elif stated is not None and bound <= float(stated):
            canary_note += (f", {100 * bound / float(stated):.0f}% of the publishable "
                            f"ε = {rounding.up(float(stated), '.3g')}: "
                            "consistent with the guarantee (the audit finds no leak beyond it).")
        else:
            canary_note += ": the run is not (ε, δ)-DP for any smaller ε."
        stated = (theory or {}).get("publishable_epsilon")
        if stated is not None and bound > float(stated):
            banner = ((banner + " ") if banner else "BUG OR BROKEN ASSUMPTION: ") + (
                f"The canary audit proves ε ≥ {rounding.down(bound, '.3g')} at {level} confidence, above the "
                f"publishable ε = {rounding.up(float(stated), '.3g')}. Do not publish this ε until this is explained.")

    table = []
    theory_tpr = (theory or {}).get("tpr_at_fpr") or {}
    for level in FPR_LEVELS:
        bound = theory_tpr.get(level)
        shown = f"≤ {percent_up(bound)}" if bound is not None else "—"
        attack, interval = "—", "—"
        why = not_measurable(float(level), mia["nonmembers"]) if mia else None
        if why:  # the attack's note gives the reason (how many non-members, how many it needs)
            attack = "not measurable"
        elif mia:
            attack = _percent(mia["tpr_at_fpr"].get(level))
            lo, hi = mia["tpr_interval"].get(level) or (None, None)
            interval = f"[{_percent(lo)}, {_percent(hi)}]"
        table.append((f"TPR at FPR {100 * float(level):g}%", shown, attack, interval))
    advantage = (theory or {}).get("max_advantage")
    table.append(("Advantage (TPR − FPR)", f"≤ {percent_up(advantage)}" if advantage is not None else "—", "", ""))
    if mia:
        lo, hi = mia["auc_interval"]
        table.append(("AUC", "", f"{mia['auc']:.3f}", f"[{lo:.3f}, {hi:.3f}]"))
    return AuditFigure(curve, theory_note, roc, roc_note, canary_note, table, banner)


def theory_key(row: dict[str, Any]) -> tuple:
    """What the theoretical curve of a run depends on (it changes while a run trains)."""
    return (row.get("id"), row.get("status"), row.get("steps_done"), row.get("epsilon"), row.get("delta"),
            json.dumps((row.get("study") or {}).get("id")))


# ---- the theoretical curves, computed off the window's thread -------------------------------------
class TheorySource(QObject):
    """engine.attack_risk.run_attack_risk per run in a worker thread; `ready(run_id)` when one is known.
    One per window, shared by the Audit tab and Compare (a curve is computed once)."""

    ready = Signal(int)
    _done = Signal(object, object)  # key, json: from the worker thread to this one (queued)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._known: dict[tuple, dict[str, Any]] = {}
        self._latest: dict[Any, dict[str, Any]] = {}  # run id -> its last computed figures
        self._pending: set[tuple] = set()
        self._done.connect(self._store)

    def get(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The run's figures if known, else computed (`ready` follows) and meanwhile the run's latest
        known ones (a running run's curve for fewer steps) or None. One computation per run at a time,
        so a training run's list refreshes never pile them up."""
        key = theory_key(row)
        if key in self._known:
            return self._known[key]
        run_id = row.get("id")
        if not any(pending[0] == run_id for pending in self._pending):
            self._pending.add(key)
            threading.Thread(target=self._compute, args=(key, dict(row)), daemon=True,
                             name=f"attack-risk-{run_id}").start()
        return self._latest.get(run_id)

    def wait(self, timeout_s: float = 60.0) -> None:
        """For scripts and tests: until nothing is being computed."""
        from PySide6.QtCore import QCoreApplication

        end = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < end:
            QCoreApplication.processEvents()
            time.sleep(0.01)

    def _compute(self, key: tuple, row: dict[str, Any]) -> None:
        try:
            from engine.attack_risk import run_attack_risk

            body = run_attack_risk(row).to_json()
        except Exception as exc:  # shown in the tab as the reason there is no curve
            body = {"error": f"{type(exc).__name__}: {exc}", "tradeoff": None}
        try:
            self._done.emit(key, body)
        except RuntimeError:  # the window (this object) was closed meanwhile: nobody is waiting
            pass

    def _store(self, key: tuple, body: dict[str, Any]) -> None:
        self._pending.discard(key)
        self._known[key] = self._latest[key[0]] = body
        self.ready.emit(int(key[0]))


# ---- the empirical audit, in a process of its own --------------------------------------------------
@dataclass
class _AuditJob:
    run_id: int
    process: QProcess
    started: float
    output: bytes = b""
    stderr: bytes = b""


def audit_arguments(db_path: Path, run_id: int) -> list[str]:
    """Arguments after the interpreter for the audit process."""
    return ["-m", "engine.audit_job", str(run_id), "--db", str(db_path), "--background"]


MIN_PLOT_WIDTH = 420  # px: the trade-off curves stay legible


class AuditView(QWidget):
    """One run's audit. `stored(run_id)`: an audit was kept in the run's summary (refresh the list)."""

    stored = Signal(int)

    def __init__(self, db_path: str | Path, theory: TheorySource | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.db_path = Path(db_path)
        self.theory = theory or TheorySource(self)
        self.theory.ready.connect(self._theory_ready)
        self.environment: dict[str, str] = {}  # extra variables for the audit process (the runners' own)
        self.row: dict[str, Any] | None = None
        self.figure: AuditFigure | None = None
        self.jobs: dict[int, _AuditJob] = {}
        self.results: dict[int, dict[str, Any]] = {}  # audits finished while the list had not been re-read
        self.errors: dict[int, str] = {}
        # Whether a run's own runner is still alive: after training it audits the run itself
        # (engine.audit_job.audit_after_training), so the tab waits for it instead of starting another.
        self.runner_alive: Callable[[int], bool] = lambda run_id: False
        self._build()
        self.clock = QTimer(self)
        self.clock.setInterval(500)
        self.clock.timeout.connect(self._show_status)
        # Redraws asked for by a curve or an audit arriving run once, in an event-loop turn of their own.
        self._soon = QTimer(self)
        self._soon.setSingleShot(True)
        self._soon.setInterval(0)
        self._soon.timeout.connect(self._redraw)
        self.show_run(None)

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        self.title = QLabel("No run selected")
        font = self.title.font()
        font.setPointSizeF(font.pointSizeF() * 1.2)
        font.setBold(True)
        self.title.setFont(font)
        self.title.setWordWrap(True)
        layout.addWidget(self.title)
        self.banner = QLabel()
        self.banner.setObjectName("auditBanner")
        self.banner.setWordWrap(True)
        self.banner.setStyleSheet(f"background: {BANNER_COLOUR}; color: white; font-weight: bold; padding: 8px;")
        self.banner.hide()
        layout.addWidget(self.banner)
        self.private_note = QLabel(PRIVATE_NOTE)
        self.private_note.setWordWrap(True)
        layout.addWidget(self.private_note)
        bar = QHBoxLayout()
        self.run_button = QPushButton("Run audit")
        self.run_button.setToolTip("Score the run's training examples and as many held-out ones with its model "
                                   "(loss attack), in a background process; the result is kept with the run")
        self.run_button.clicked.connect(self.run_audit)
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)  # busy: the audit reports no steps
        self.progress.setMaximumWidth(160)
        keep = self.progress.sizePolicy()
        keep.setRetainSizeWhenHidden(True)
        self.progress.setSizePolicy(keep)
        self.progress.hide()
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # Two lines always: a status appearing or changing never moves the plot (a re-layout repaints it).
        self.status.setFixedHeight(2 * self.status.fontMetrics().lineSpacing() + 4)
        self.status.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        self.log_fpr = QCheckBox("Log scale (small FPR)")
        self.log_fpr.setToolTip("Log-log axes: small false-positive rates (1%, 0.1%), where attacks matter")
        self.log_fpr.toggled.connect(lambda _on: self._draw())
        bar.addWidget(self.run_button)
        bar.addWidget(self.progress)
        bar.addWidget(self.status, 1)
        bar.addWidget(self.log_fpr)
        layout.addLayout(bar)
        self.splitter = splitter = QSplitter(Qt.Orientation.Horizontal)
        self.plot = Plot("Membership tests: the bound and the attack", "false-positive rate (FPR)",
                         "true-positive rate (TPR)", y_bounds=(0.0, 1.0))
        splitter.addWidget(self.plot)
        # The curves are made once and updated with setData (a redraw makes no items: no stall).
        self.curves = {key: self.plot.curve(name, index, style=style, width=width)
                       for key, name, index, style, width in CURVES}
        self._in_legend = set(self.curves)
        self._log_shown = False
        side = QWidget()
        side.setMinimumWidth(360)  # the table scrolls when narrower; the window stays usable at 700 px
        side_layout = QVBoxLayout(side)
        side_layout.setContentsMargins(0, 0, 0, 0)
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["", "Theory (bound)", "Attack", "Interval"])
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(False)  # one line per row: the table's height is fixed from its rows
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        side_layout.addWidget(self.table)
        self.notes: dict[str, QLabel] = {}
        for name in ("canary", "theory", "roc"):
            label = QLabel("")
            label.setWordWrap(True)
            label.setObjectName(f"{name}Note")
            side_layout.addWidget(label)
            self.notes[name] = label
        side_layout.addStretch(1)
        splitter.addWidget(side)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 2)
        splitter.setSizes([820, 600])
        layout.addWidget(splitter, 1)

    # ---- showing a run ---------------------------------------------------------------------------
    def show_run(self, row: dict[str, Any] | None) -> None:
        """Show `row` (a listed run with config and summary), or nothing; the same row again draws nothing."""
        if row is not None and row == self.row and self.figure is not None:
            self._show_status()  # the same run, but its runner may have ended
            return
        self.row = row
        if row is None:
            self.title.setText("No run selected")
        else:
            self.title.setText(f"Run {row['id']}: {row.get('name', '')} — what an attacker can learn")
        self._redraw()

    def _redraw(self) -> None:
        self._soon.stop()
        row = self.row
        if row is None:
            self.figure = None
        else:
            theory = self.theory.get(row)
            audit = self.results.get(row["id"]) or membership_result(row.get("summary"))
            self.figure = audit_figure(theory=theory, audit=audit, canaries=canary_result(row.get("summary")))
        self._draw()
        self._show_status()

    def _theory_ready(self, run_id: int) -> None:
        if self.row is not None and self.row["id"] == run_id:
            self._soon.start()

    def _draw(self) -> None:
        figure = self.figure
        log = self.log_fpr.isChecked()
        if log != self._log_shown:  # log-log, as membership attacks are read at small FPR
            self.plot.set_log_y(log)
            self.plot.getPlotItem().setLogMode(x=log, y=log)
            self._log_shown = log
        low = LOG_FPR_MIN if log else 0.0
        chance = np.logspace(np.log10(LOG_FPR_MIN), 0.0, 5) if log else np.array([0.0, 1.0])
        shown = {"chance": (chance, chance)}
        if figure is not None:
            shown.update(theory=figure.theory, roc=figure.roc)
        present = set()
        for key, _name, *_ in CURVES:
            item, curve = self.curves[key], shown.get(key)
            if curve is None:
                item.setData([], [])
                continue
            fpr, tpr = curve
            keep = (fpr >= low) & (tpr >= low)
            set_curve(item, fpr[keep], tpr[keep])
            present.add(key)
        if present != self._in_legend and self.plot.legend is not None:  # the legend in CURVES order
            self.plot.legend.clear()
            for key, name, *_ in CURVES:
                if key in present:
                    self.plot.legend.addItem(self.curves[key], name)
            self._in_legend = present
        if figure is not None:
            self._fill_table(figure)
            self.notes["canary"].setText(figure.canary_note)
            self.notes["theory"].setText(figure.theory_note)
            self.notes["roc"].setText(figure.roc_note)
            self.banner.setText(figure.banner or "")
            self.banner.setVisible(figure.banner is not None)
        else:
            self.table.setRowCount(0)
            for label in self.notes.values():
                label.setText("")
            self.banner.hide()
        view = self.plot.getPlotItem().getViewBox()
        limits = (np.log10(LOG_FPR_MIN), 0.0) if log else (0.0, 1.0)
        view.setRange(xRange=limits, yRange=limits, padding=0.02)

    def _fill_table(self, figure: AuditFigure) -> None:
        self.table.setRowCount(len(figure.table))
        for i, cells in enumerate(figure.table):
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if j == 2 and figure.banner is not None and text:
                    item.setForeground(QColor(BANNER_COLOUR))
                self.table.setItem(i, j, item)
        self.table.resizeRowsToContents()
        rows = sum(self.table.rowHeight(i) for i in range(len(figure.table)))
        # room for the horizontal scroll bar too, so a narrow window scrolls sideways but never hides a row
        scroll = self.table.horizontalScrollBar().sizeHint().height()
        self.table.setFixedHeight(self.table.horizontalHeader().height() + rows + 2 * self.table.frameWidth()
                                  + scroll + 2)
        self._widen_side_for_table()

    def _widen_side_for_table(self) -> None:
        """Give the side panel the width its table needs, taking it from the plot while the plot
        keeps at least MIN_PLOT_WIDTH: every column readable without scrolling in a usual window."""
        plot_width, side_width = self.splitter.sizes()
        header = self.table.horizontalHeader()
        needed = sum(header.sectionSizeHint(j) for j in range(self.table.columnCount()))
        needed = max(needed, header.length()) + 2 * self.table.frameWidth() + 4
        if side_width >= needed or plot_width + side_width == 0:
            return
        give = min(needed - side_width, max(0, plot_width - MIN_PLOT_WIDTH))
        if give > 0:
            self.splitter.setSizes([plot_width - give, side_width + give])

    # ---- the audit process -----------------------------------------------------------------------
    def run_audit(self) -> None:
        """Start the audit of the shown run in the background (one per run at a time)."""
        row = self.row
        if row is None or row["id"] in self.jobs or row.get("status") not in ("finished", "stopped"):
            return
        run_id = int(row["id"])
        self.errors.pop(run_id, None)
        process = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONUNBUFFERED", "1")
        path = env.value("PYTHONPATH", "")
        env.insert("PYTHONPATH", str(REPO) + (os.pathsep + path if path else ""))
        for key, value in self.environment.items():
            env.insert(key, value)
        process.setProcessEnvironment(env)
        process.setWorkingDirectory(str(REPO))
        job = _AuditJob(run_id, process, time.monotonic())
        self.jobs[run_id] = job
        process.readyReadStandardOutput.connect(lambda: self._read(job))
        process.readyReadStandardError.connect(
            lambda: setattr(job, "stderr", (job.stderr + bytes(process.readAllStandardError()))[-4000:]))
        process.finished.connect(lambda code, status: self._ended(job, code))
        process.errorOccurred.connect(lambda error: self._failed_to_start(job, error))
        process.start(sys.executable, audit_arguments(self.db_path, run_id))
        self.clock.start()
        self._show_status()

    def _read(self, job: _AuditJob) -> None:
        job.output += bytes(job.process.readAllStandardOutput())

    def _failed_to_start(self, job: _AuditJob, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self._ended(job, -1)

    def _ended(self, job: _AuditJob, code: int) -> None:
        if self.jobs.get(job.run_id) is not job:
            return
        del self.jobs[job.run_id]
        self._read(job)
        result, error = None, None
        for line in job.output.decode("utf-8", errors="replace").splitlines():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("type") == "result":
                result = message.get("audit")
            elif message.get("type") == "error":
                error = message.get("message", "") + (f" ({message['hint']})" if message.get("hint") else "")
                if message.get("kind") == "DataError":
                    error = f"the run's data files are gone or changed, and the attack needs them: {error}"
        if result is None and error is None:
            tail = job.stderr.decode("utf-8", errors="replace").strip().splitlines()
            error = f"the audit process ended with status {code}" + (f": {tail[-1]}" if tail else "")
        job.process.deleteLater()
        if not self.jobs:
            self.clock.stop()
        if result is not None:
            self.results[job.run_id] = result
            self.stored.emit(job.run_id)
        else:
            self.errors[job.run_id] = error
        if self.row is not None and self.row["id"] == job.run_id:
            self._show_status()
            self._soon.start()  # the window re-reads the list on `stored` and shows the row: drawn once

    def _show_status(self) -> None:
        row = self.row
        job = self.jobs.get(row["id"]) if row is not None else None
        auditable = row is not None and row.get("status") in ("finished", "stopped")
        has_audit = row is not None and (row["id"] in self.results or membership_result(row.get("summary")))
        runner_auditing = (auditable and not has_audit and row.get("status") == "finished"
                           and self.runner_alive(int(row["id"])))
        self.progress.setVisible(job is not None or runner_auditing)
        self.run_button.setEnabled(auditable and job is None and not runner_auditing)
        self.run_button.setText("Run audit again" if has_audit else "Run audit")
        if row is None:
            self.status.setText("")
        elif runner_auditing:
            self.status.setText(f"Run {row['id']}'s own process is auditing it after training: scoring training "
                                "and held-out examples with the model…")
        elif job is not None:
            self.status.setText(f"Auditing run {row['id']} in the background ({time.monotonic() - job.started:.0f} s): "
                                "scoring training and held-out examples with the model, then bootstrap intervals…")
        elif row["id"] in self.errors:
            self.status.setText(f"<span style='color:{BANNER_COLOUR}'>Cannot audit: "
                                f"{_escape(self.errors[row['id']])}</span>")
        elif not auditable:
            self.status.setText("The attack needs a finished run's model.")
        elif has_audit:
            self.status.setText("Attack computed (kept with the run).")
        else:
            self.status.setText("")

    def shutdown(self) -> None:
        """End running audits (the window is closing); nothing is stored for them."""
        for job in list(self.jobs.values()):
            job.process.kill()
            job.process.waitForFinished(3000)


def _escape(text: str) -> str:
    import html

    return html.escape(text)


# ---- Compare: the curves of several runs on one plot ------------------------------------------------
class TradeoffOverlay(Plot):
    """The theoretical curve of each run Compare shows (solid) and its attack ROC where one was computed
    (dashed), in the run's colour in Compare's other plots (its position in the selection). Its legend
    says only what solid and dashed mean: Compare's accuracy plot names the colours, and two lines a
    run left the plot no room in its corner of the grid."""

    def __init__(self, theory: TheorySource | None = None, parent: QWidget | None = None):
        super().__init__("Membership tests", "FPR", "TPR", y_bounds=(0.0, 1.0))
        self.setToolTip("Solid: the best test each run's guarantee allows (an upper bound); dashed: the loss "
                        "attack's ROC, where the Audit tab computed one (from private data)")
        self.theory = theory or TheorySource(self)
        self.theory.ready.connect(self._theory_ready)
        self.rows: list[dict[str, Any]] = []
        self.colours: dict[int, int] = {}
        self._later = QTimer(self)  # curves arriving together are drawn once
        self._later.setSingleShot(True)
        self._later.setInterval(50)
        self._later.timeout.connect(self._draw)

    def show_runs(self, rows: list[dict[str, Any]], colours: dict[int, int] | None = None) -> None:
        """`rows`: the runs of the group Compare shows; `colours`: each run's colour index there."""
        self.rows = list(rows)
        self.colours = dict(colours or {})
        self._draw()

    def _theory_ready(self, run_id: int) -> None:
        if any(r["id"] == run_id for r in self.rows) and not self._later.isActive():
            self._later.start()

    def _unlisted(self, name: str, index: int, **style: Any) -> pg.PlotDataItem:
        """A curve named for the hover read-out, but not in the legend (named once added)."""
        item = self.curve(None, index, **style)
        item.opts["name"] = name
        return item

    def curve_count(self) -> dict[str, int]:
        """How many theory and attack curves are drawn (for tests and the legend)."""
        names = [c.name() for c in self.named_curves()]
        return {"theory": sum(not n.endswith("(attack)") for n in names),
                "attack": sum(n.endswith("(attack)") for n in names)}

    def _draw(self) -> None:
        self.clear()
        if self.legend is not None:
            self.legend.clear()
            for name, style in (("bound (guarantee)", Qt.PenStyle.SolidLine), ("attack (ROC)", Qt.PenStyle.DashLine)):
                self.legend.addItem(pg.PlotDataItem(pen=pg.mkPen(LEGEND_GREY, width=2.0, style=style)), name)
        for position, row in enumerate(self.rows):
            index = self.colours.get(row["id"], position)
            label = f"{row['id']}: {row.get('name', '')}"
            theory = self.theory.get(row)
            tradeoff = (theory or {}).get("tradeoff")
            if tradeoff:
                set_curve(self._unlisted(label, index, width=2.0), np.asarray(tradeoff["fpr"], dtype=float),
                          np.asarray(tradeoff["tpr"], dtype=float))
            audit = membership_result(row.get("summary"))
            if audit is not None:
                roc = audit["mia"]["roc"]
                set_curve(self._unlisted(f"{label} (attack)", index, style=Qt.PenStyle.DashLine),
                          np.asarray(roc["fpr"], dtype=float), np.asarray(roc["tpr"], dtype=float))
        self.getPlotItem().getViewBox().setRange(xRange=(0.0, 1.0), yRange=(0.0, 1.0), padding=0.02)
