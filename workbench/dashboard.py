"""The live dashboard of one run: progress, messages, and its curves (DP-SGD or PATE)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QCheckBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QSlider,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from engine import rounding
from engine.publication import (
    NO_GUARANTEE,
    NO_GUARANTEE_IN_SHORT,
    PublishableEpsilon,
    budget_on_private_votes,
    no_guarantee_reason,
    pate_publishable,
    pate_released_estimate,
    publishable_epsilon,
)
from engine.run_times import format_duration
from workbench.plots import Plot, accountant_colour, set_curve, set_line_label
from workbench.progress import progress, seconds_left, shown_phase
from workbench.run_data import RunData
from workbench.settings import Settings

# Events are batched between frames, never drawn one by one. Each tick redraws one plot whose run
# changed: 30 Hz over the three DP-SGD plots is 10 Hz each, and a frame never repaints them all.
REDRAW_MS = 33
SMOOTHING_KEY = "dashboard/smoothing"  # {"on": bool, "weight": float}, remembered between sessions
DEFAULT_SMOOTHING = 0.6

PHASES = {
    "loading": "Loading data",
    "calibrating": "Calibrating noise",
    "training": "Training",
    "evaluating": "Evaluating",
    "teachers": "Training teachers (epochs)",
    "querying": "Answering student queries",
    "student": "Training the student (steps)",
}


def study_statement(study: dict[str, Any], stated: PublishableEpsilon) -> str:
    """What a study lets its candidate state, first in the header: the study's publishable epsilon,
    or why there is none (a private study's candidate that was not released, a study still running).
    An exploratory study's candidate states its own epsilon, which does not cover the choice."""
    label = f"study {study.get('id')} ({study.get('mode')})"
    if study.get("mode") == "exploratory":
        return f"{label}: {stated.note}"
    if study.get("status") == "running":
        return f"{label}, running: no ε yet (the study's will cover its search)"
    if stated.withheld:
        return f"{label}: not released, no ε to publish (the study releases its best candidate only)"
    if stated.value is None:
        return f"{label}, {study.get('status')}: no ε to publish"
    return f"ε {rounding.up(stated.value, '.3g')} (publishable: {label}, {stated.accountant}, δ {stated.delta:g})"


def format_seconds(seconds: float | None) -> str:
    """Time left in words ("4 min 05 s left"); empty when unknown."""
    text = format_duration(seconds)
    return f"{text} left" if text else ""


class MessagePanel(QFrame):
    """Errors and warnings of the run, with the engine's hint; hidden when there are none."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setObjectName("messagePanel")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.label)
        self.hide()

    def show_messages(self, data: RunData) -> None:
        import html

        if not data.messages:
            self.hide()
            return
        parts = []
        for m in data.messages[-6:]:
            tag = "<b style='color:#d62728'>Error:</b> " if m.level == "error" else "<b>Warning:</b> "
            text = tag + html.escape(m.text)
            if m.hint:
                text += f"<br><i>{html.escape(m.hint)}</i>"
            parts.append(text)
        self.label.setText("<br>".join(parts))
        self.show()


class Dashboard(QWidget):
    """Shows one run; redraws at most 10 times a second, and only when the run changed."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.data: RunData | None = None
        self._drawn_version = -1
        self._dirty: list = []
        layout = QVBoxLayout(self)
        top = QHBoxLayout()
        self.title = QLabel("No run selected")
        font = self.title.font()
        font.setPointSizeF(font.pointSizeF() * 1.2)
        font.setBold(True)
        self.title.setFont(font)
        self.budget_label = QLabel("")
        # A long guarantee (PATE: publishable and diagnostic epsilons) wraps instead of widening the page.
        self.budget_label.setWordWrap(True)
        self.budget_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.title.setWordWrap(True)
        top.addWidget(self.title, 2)
        top.addWidget(self.budget_label, 3)
        layout.addLayout(top)
        bar = QHBoxLayout()
        self.phase_label = QLabel("")
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.time_left = QLabel("")
        bar.addWidget(self.phase_label)
        bar.addWidget(self.progress, 1)
        bar.addWidget(self.time_left)
        self._build_smoothing(bar)
        layout.addLayout(bar)
        self.messages = MessagePanel()
        layout.addWidget(self.messages)
        self.pages = QStackedWidget()
        layout.addWidget(self.pages, 1)
        self._build_dpsgd_page()
        self._build_pate_page()
        self.loss_plot.set_smoothing(self.smoothing)
        self.timer = QTimer(self)
        self.timer.setInterval(REDRAW_MS)
        self.timer.timeout.connect(self._tick)
        self.timer.start()

    # ---- smoothing -----------------------------------------------------------------------------
    def _build_smoothing(self, bar: QHBoxLayout) -> None:
        """A checkbox and an EMA weight slider for the noisy training curves, remembered in settings."""
        saved = Settings().json(SMOOTHING_KEY, {})
        saved = saved if isinstance(saved, dict) else {}
        weight = saved.get("weight", DEFAULT_SMOOTHING)
        weight = float(weight) if isinstance(weight, (int, float)) and 0 < weight < 1 else DEFAULT_SMOOTHING
        self.smooth_box = QCheckBox("Smooth")
        self.smooth_box.setObjectName("smoothCurves")
        self.smooth_box.setToolTip("Draw the train loss as an exponential moving average (TensorBoard's "
                                   "smoothing), the raw curve faint behind; the run's data is unchanged")
        self.smooth_slider = QSlider(Qt.Orientation.Horizontal)
        self.smooth_slider.setObjectName("smoothWeight")
        self.smooth_slider.setRange(1, 99)  # weight in hundredths
        self.smooth_slider.setFixedWidth(90)
        self.smooth_slider.setValue(round(weight * 100))
        self.smooth_label = QLabel(f"{weight:.2f}")
        self.smooth_label.setMinimumWidth(self.smooth_label.fontMetrics().horizontalAdvance("0.00") + 4)
        self.smooth_box.setChecked(bool(saved.get("on", False)))
        self.smooth_slider.setEnabled(self.smooth_box.isChecked())
        for widget in (self.smooth_box, self.smooth_slider, self.smooth_label):
            bar.addWidget(widget)
        self.smooth_box.toggled.connect(self._smoothing_changed)
        self.smooth_slider.valueChanged.connect(self._smoothing_changed)

    @property
    def smoothing(self) -> float:
        """The EMA weight drawn now (0: off)."""
        return self.smooth_slider.value() / 100 if self.smooth_box.isChecked() else 0.0

    def _smoothing_changed(self, *_: object) -> None:
        self.smooth_slider.setEnabled(self.smooth_box.isChecked())
        self.smooth_label.setText(f"{self.smooth_slider.value() / 100:.2f}")
        self.loss_plot.set_smoothing(self.smoothing)
        settings = Settings()
        settings.set_json(SMOOTHING_KEY, {"on": self.smooth_box.isChecked(),
                                          "weight": self.smooth_slider.value() / 100})
        settings.sync()

    # ---- pages ---------------------------------------------------------------------------------
    def _build_dpsgd_page(self) -> None:
        page = QWidget()
        grid = QGridLayout(page)
        grid.setContentsMargins(0, 0, 0, 0)
        self.acc_plot = Plot("Test accuracy", "step", "accuracy", legend=False, y_bounds=(0.0, 1.0))
        self.loss_plot = Plot("Loss", "step", "loss", log_axis=True, y_bounds=(0.0, None))
        self.eps_plot = Plot("Privacy spent", "step", "ε", log_axis=True, y_bounds=(0.0, None))
        self.train_loss = self.loss_plot.smoothed_curve("train loss", 1)  # noisy: one point per step
        self.curves = {
            "test_accuracy": self.acc_plot.curve("test accuracy", 0, symbol="o"),
            "train_loss": self.train_loss.raw,
            "test_loss": self.loss_plot.curve("test loss", 3, symbol="o"),
        }
        self.eps_curves: dict[str, pg.PlotDataItem] = {}
        self.budget_line = self.eps_plot.hline(None, "budget")
        self.budget_anchor = self.eps_plot.anchor()
        # Said on the plot when the live RDP bound passes the budget while the run's tight accountant
        # (the one it stops on) stays below it: not a breach.
        self.eps_note = pg.TextItem(anchor=(1, 1))
        self.eps_note.setParentItem(self.eps_plot.getPlotItem().getViewBox())
        self.eps_note.hide()
        self.eps_plot.getPlotItem().getViewBox().sigResized.connect(self._place_eps_note)
        grid.addWidget(self.acc_plot, 0, 0)
        grid.addWidget(self.loss_plot, 0, 1)
        grid.addWidget(self.eps_plot, 1, 0, 1, 2)
        self.pages.addWidget(page)
        self.dpsgd_page = page

    def _build_pate_page(self) -> None:
        page = QWidget()
        grid = QGridLayout(page)
        grid.setContentsMargins(0, 0, 0, 0)
        self.teacher_plot = Plot("Teacher training", "epoch (one line per group)",
                                 "mean train loss", legend=False)
        # Accuracies of models trained without privacy on private data: shown here, never exported.
        # A short title: a long one sets the plot's minimum width and pushes it under its neighbour.
        self.teacher_acc_plot = Plot("Teachers (private, not in ε)", "teacher",
                                     "held-out accuracy", legend=False, y_bounds=(0.0, 1.0))
        self.teacher_acc_plot.setToolTip("Accuracies of the teachers, trained without privacy on the private "
                                         "data: not covered by ε, shown here only, never exported.")
        self.pate_eps_plot = Plot("Privacy spent", "queries processed", "ε", log_axis=True, y_bounds=(0.0, None))
        self.counts_plot = Plot("Student queries", "queries processed", "count")
        self.student_plot = Plot("Student", "student step", "test accuracy", legend=False, y_bounds=(0.0, 1.0))
        self.pate_curves = {
            "teacher_train_loss": self.teacher_plot.curve("loss", 1, symbol="o"),
            "teacher_accuracy": self.teacher_acc_plot.curve("teachers", 0, width=0, symbol="o"),
            "answered": self.counts_plot.curve("answered", 2),
            "rejected": self.counts_plot.curve("rejected", 3),
            "student_accuracy": self.student_plot.curve("test accuracy", 0, symbol="o"),
        }
        self.pate_curves["teacher_accuracy"].setPen(None)
        # The plurality vote's accuracy: a dashed line labelled inside the plot (an x-axis label carrying
        # it was clipped in narrow layouts).
        self.ensemble_line = self.teacher_acc_plot.hline(None, label_flips=True)
        self.ensemble_anchor = self.teacher_acc_plot.anchor()
        self.pate_eps_curves: dict[str, pg.PlotDataItem] = {}
        self.pate_budget_line = self.pate_eps_plot.hline(None, "budget")
        self.pate_budget_anchor = self.pate_eps_plot.anchor()
        grid.addWidget(self.teacher_plot, 0, 0)
        grid.addWidget(self.teacher_acc_plot, 0, 1)
        grid.addWidget(self.student_plot, 0, 2)
        grid.addWidget(self.pate_eps_plot, 1, 0, 1, 2)
        grid.addWidget(self.counts_plot, 1, 2)
        self.pages.addWidget(page)
        self.pate_page = page

    # ---- data ----------------------------------------------------------------------------------
    def show_run(self, data: RunData | None) -> None:
        self.data = data
        self._drawn_version = -1
        for plot, table in ((self.eps_plot, self.eps_curves), (self.pate_eps_plot, self.pate_eps_curves)):
            for item in table.values():
                plot.removeItem(item)
                if plot.legend is not None:
                    plot.legend.removeItem(item)
            table.clear()
        for item in list(self.curves.values()) + list(self.pate_curves.values()):
            item.setData([], [])
        self.teacher_acc_plot.set_line(self.ensemble_line, None)
        self.train_loss.clear()
        for anchor in (self.budget_anchor, self.pate_budget_anchor, self.ensemble_anchor):
            anchor.setData([], [])
        self.eps_note.hide()
        self._dirty = []
        self._reset_axes(data)
        self.refresh(complete=True)
        if data is not None and data.version > 0 and (data.metrics or data.privacy):
            for plot in self.plots():
                plot.fit_to_data()
        else:
            for plot in self.plots():
                plot.enableAutoRange()

    def plots(self) -> tuple[Plot, ...]:
        return (self.acc_plot, self.loss_plot, self.eps_plot, self.teacher_plot, self.teacher_acc_plot,
                self.pate_eps_plot, self.counts_plot, self.student_plot)

    def _reset_axes(self, data: RunData | None) -> None:
        """Start every plot from ranges of this run (its planned steps, its budget), so a queued or
        failed run without curves never keeps the previous run's axes."""
        steps = float(max(data.total, 1)) if data is not None and data.phase == "training" else 1.0
        budget = data.budget if data is not None and data.budget else 1.0
        for plot in self.plots():
            plot.hover.hide()
            top = budget if plot in (self.eps_plot, self.pate_eps_plot) else 1.0
            plot.getPlotItem().getViewBox().setRange(xRange=(0.0, steps), yRange=(0.0, top), padding=0.02)

    def update_data(self, data: RunData) -> None:
        """Newer data of the run shown (read again from the store), keeping the user's zoom."""
        self.data = data
        self._drawn_version = -1

    def refresh(self, complete: bool = False) -> None:
        """Update the header; mark the plots for redrawing (all of them now with `complete`)."""
        data = self.data
        if data is None:
            if self._drawn_version != -2:
                self.title.setText("No run selected")
                self.phase_label.setText("")
                self.progress.setValue(0)
                self.budget_label.setText("")
                self.messages.hide()
                self._drawn_version = -2
            return
        # the time left moves even without events
        self.time_left.setText(format_seconds(seconds_left(data)))
        if data.version == self._drawn_version and not complete:
            return
        self._drawn_version = data.version
        continues = f"; continues run {data.continues[0]} from step {data.continues[1]}" if data.continues else ""
        self.title.setText(f"Run {data.run_id}: {data.name}  ({data.mechanism or '?'}, {data.status}{continues})")
        phase = PHASES.get(shown_phase(data), shown_phase(data))
        self.phase_label.setText(phase)
        bar = progress(data)
        self.progress.setMaximum(max(bar.maximum, 1))
        self.progress.setValue(bar.done if bar.maximum else 0)
        self.progress.setFormat(bar.text)
        self.progress.setToolTip(bar.tooltip)
        self.messages.show_messages(data)
        self._budget_text(data)
        self.pages.setCurrentWidget(self.pate_page if data.mechanism == "pate" else self.dpsgd_page)
        # Queued in turn, not from the first again: a run whose events come every frame would have its
        # first plot drawn at every tick and the others never.
        self._dirty += [group for group in self._groups(data) if group not in self._dirty]
        if complete:
            while self._dirty:
                self._dirty.pop(0)(data)

    def _tick(self) -> None:
        """Timer: header when the run changed, then at most one plot, so no frame repaints them all."""
        self.refresh()
        if self.data is not None and self._dirty:
            self._dirty.pop(0)(self.data)

    def _budget_text(self, data: RunData) -> None:
        """The publishable epsilon spent (engine.publication; DP-SGD: the run's accountant, with the live
        bound when it is further along), the budget and what is left of it. PATE's data-dependent
        epsilon only as a diagnostic marked not publishable; a reproducible-noise run: no guarantee.
        A study's candidate leads with what the study lets it state; its own epsilon follows as
        "this run alone"."""
        if data.mechanism == "none":
            self.budget_label.setText("non-private: ε = ∞")
            return
        reason = no_guarantee_reason(data.as_run())
        parts = [] if reason is None else [f"{NO_GUARANTEE.upper()} ({NO_GUARANTEE_IN_SHORT[reason]})"]
        stated = publishable_epsilon(data.as_run())
        study = data.study if stated.note is not None else None
        if study is not None:
            parts.append(study_statement(study, stated))
        alone = "this run alone: " if study is not None else ""
        spent = None
        if data.mechanism == "pate":
            di, dd = data.privacy.get("pate-di"), data.privacy.get("pate-dd")
            value, accountant = pate_publishable(di.last() if di is not None else None)
            if value is not None:
                where = f", query {int(di.x[-1]):,}" if di is not None and len(di) else ""
                delta = data.summary.get("delta", data.config.get("delta"))
                at_delta = f", δ {float(delta):g}" if isinstance(delta, (int, float)) else ""
                kind = accountant if study is not None else f"publishable, {accountant}"
                parts.append(f"{alone}ε {rounding.up(value, '.3g')} ({kind}{at_delta}{where})")
            if (estimate := pate_released_estimate(data.as_run())) is not None:
                parts.append(f"data-dependent ε ≈ {estimate:.3g} (released estimate, not a bound)")
            if dd is not None and len(dd):
                parts.append(f"data-dependent ε {dd.last():.3g} (private diagnostic, not publishable)")
            run = {"mechanism": data.mechanism, "config": data.config}
            # The budget counts the epsilon the engine stops on.
            counted = dd if budget_on_private_votes(run) else di
            spent = counted.last() if counted is not None and len(counted) else None
        else:
            name, series = data.epsilon_series()
            if series is not None and len(series):
                spent = series.last()
                delta = data.plan.get("delta", data.config.get("delta"))
                at_delta = f", δ {float(delta):g}" if isinstance(delta, (int, float)) else ""
                value = "∞: NO FINITE GUARANTEE" if spent == float("inf") else rounding.up(spent, ".3g")
                parts.append(f"{alone}ε {value} ({name}{at_delta}, step {int(series.x[-1]):,})")
                live = data.privacy.get("rdp")
                if name != "rdp" and live is not None and len(live) and live.x[-1] > series.x[-1]:
                    parts.append(f"live bound {rounding.up(live.last(), '.3g')} (rdp, step {int(live.x[-1]):,})")
        budget = data.budget
        if budget is not None:
            left = f", {rounding.down(max(budget - spent, 0.0), '.3g')} left" if spent is not None else ""
            parts.append(f"budget {budget:g}{left}")
        self.budget_label.setText("  ·  ".join(parts))

    # ---- drawing, one plot per group --------------------------------------------------------
    def _groups(self, data: RunData) -> list:
        """Drawing steps of the current page, one plot each, so a frame repaints one plot at a time."""
        if data.mechanism == "pate":
            return [self._draw_teacher_loss, self._draw_teachers, self._draw_student, self._draw_pate_epsilon,
                    self._draw_counts]
        return [self._draw_accuracy, self._draw_loss, self._draw_dpsgd_epsilon]

    def _draw_series(self, data: RunData, names: tuple[str, ...]) -> None:
        for name in names:
            series = data.metrics.get(name)
            if series is None:
                continue
            if name == "train_loss":
                self.train_loss.set_data(series.x, series.y)
            else:
                set_curve(self.curves[name], series.x, series.y)

    def _draw_accuracy(self, data: RunData) -> None:
        self._draw_series(data, ("test_accuracy",))

    def _draw_loss(self, data: RunData) -> None:
        self._draw_series(data, ("train_loss", "test_loss"))

    def _draw_dpsgd_epsilon(self, data: RunData) -> None:
        self._draw_epsilon(data, self.eps_plot, self.eps_curves, self.budget_line, self.budget_anchor)

    def _draw_pate_epsilon(self, data: RunData) -> None:
        self._draw_epsilon(data, self.pate_eps_plot, self.pate_eps_curves, self.pate_budget_line,
                           self.pate_budget_anchor)

    def _draw_epsilon(self, data: RunData, plot: Plot, table: dict, line, anchor) -> None:
        for name, series in sorted(data.privacy.items()):
            item = table.get(name)
            if item is None:
                label = {"pate-dd": "data-dependent (private diagnostic, not publishable)",
                         "pate-di": "data-independent (publishable)",
                         "pate-released": "released estimate of data-dependent (not a bound)",
                         "rdp": "rdp (live upper bound, looser)"}.get(name, name)
                style = Qt.PenStyle.DashLine if name in ("rdp", "pate-dd") else Qt.PenStyle.SolidLine
                item = plot.curve(label, accountant_colour(name), style=style,
                                  symbol="o" if name in ("pld", "pate-released") else None)
                table[name] = item
            set_curve(item, series.x, series.y)
        budget = data.budget
        plot.set_line(line, budget)
        if budget is not None:  # from step 0 to the newest (1 before any): never a zero-width axis
            last = max((float(s.x[-1]) for s in data.privacy.values() if len(s)), default=1.0)
            anchor.setData([0.0, last], [0.0, budget])
        else:
            anchor.setData([], [])
        if plot is self.eps_plot:
            self._explain_live_bound(data)

    def _explain_live_bound(self, data: RunData) -> None:
        """A note on the privacy plot when the live RDP curve passes the budget but the run's own
        (tighter) accountant, which the budget is checked against, does not."""
        name, series = data.epsilon_series()
        live = data.privacy.get("rdp")
        budget = data.budget
        crossed = (budget is not None and live is not None and len(live) and name not in (None, "rdp")
                   and float(np.nanmax(live.y)) > budget and series is not None and len(series)
                   and float(np.nanmax(series.y)) <= budget)
        if not crossed:
            self.eps_note.hide()
            return
        self.eps_note.setText(f"The budget is checked against {name} (tight): {rounding.up(series.last(), '.3g')} ≤ {budget:g}.\n"
                              "rdp (live) is a looser upper bound shown while training; passing the budget "
                              "line is not a breach.")
        self.eps_note.setColor(self.eps_plot.getPlotItem().getAxis("left").textPen().color())
        self._place_eps_note()
        self.eps_note.show()

    def _place_eps_note(self) -> None:
        rect = self.eps_plot.getPlotItem().getViewBox().boundingRect()
        self.eps_note.setPos(rect.right() - 6, rect.bottom() - 4)

    def _draw_teacher_loss(self, data: RunData) -> None:
        series = data.metrics.get("teacher_train_loss")
        if series is None:
            return
        x, y = series.x, series.y
        epochs = int(data.config.get("teacher_epochs") or 0)
        if epochs > 0 and x.size and x.max() > epochs:
            x = (x - 1) % epochs + 1  # teachers train in groups; each group's epochs from 1
        breaks = np.flatnonzero(np.diff(x) <= 0) + 1  # one line per group
        x, y = np.insert(x, breaks, np.nan), np.insert(y, breaks, np.nan)
        self.pate_curves["teacher_train_loss"].setData(x, y, connect="finite")

    def _draw_teachers(self, data: RunData) -> None:
        m = data.metrics
        if "teacher_accuracy" in m:
            set_curve(self.pate_curves["teacher_accuracy"], m["teacher_accuracy"].x, m["teacher_accuracy"].y)
        if "ensemble_accuracy" in m and len(m["ensemble_accuracy"]):
            value = m["ensemble_accuracy"].last()
            set_line_label(self.ensemble_line, f"ensemble {value:.3f}")
            self.teacher_acc_plot.set_line(self.ensemble_line, value)
            self.ensemble_anchor.setData([0.0], [value])  # the line stays in view
        else:
            self.teacher_acc_plot.set_line(self.ensemble_line, None)
            self.ensemble_anchor.setData([], [])

    def _draw_student(self, data: RunData) -> None:
        series = data.metrics.get("test_accuracy")
        if series is not None:
            set_curve(self.pate_curves["student_accuracy"], series.x, series.y)

    def _draw_counts(self, data: RunData) -> None:
        set_curve(self.pate_curves["answered"], data.answered.x, data.answered.y)
        set_curve(self.pate_curves["rejected"], data.rejected.x, data.rejected.y)
