"""Compare runs: accuracy against epsilon, overlaid curves, results and configs side by side, and where
every finished run landed (final accuracy vs final epsilon).

Accuracy is comparable on one dataset and epsilon within one mechanism, so the plots show one group
of the selected runs at a time (dataset and mechanism, a tab each when there are several); the table
shows every selected run, results first, settings by the setup form's labels and units."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGridLayout,
    QLabel,
    QSplitter,
    QTabBar,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.publication import NO_GUARANTEE, carries_guarantee, publishable_epsilon
from engine.run_comparison import RESULT_ROWS, compare_runs, group_key, group_label, groups_of, setting_label
from engine.study_rows import exploratory_banner
from workbench.audit_view import TheorySource, TradeoffOverlay
from workbench.plots import Plot, colour, palette_colours, set_curve
from workbench.run_data import RunData


def accuracy_vs_epsilon(data: RunData, row: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(epsilon, test accuracy) at each evaluation: epsilon of the run's reported accountant at the
    evaluation's step. PATE (accuracy of the student, epsilon of the queries): the final point, at the
    publishable epsilon (engine.publication)."""
    acc = data.metrics.get("test_accuracy")
    if acc is None or not len(acc):
        return np.empty(0), np.empty(0)
    if data.mechanism == "pate":
        eps = publishable_epsilon(row).value
        return (np.array([eps]), np.array([acc.last()])) if eps is not None else (np.empty(0), np.empty(0))
    for name in (row.get("accountant"), (row.get("config") or {}).get("accountant"), "pld", "rdp"):
        series = data.privacy.get(name) if name else None
        if series is not None and len(series):
            order = np.argsort(series.x, kind="stable")
            eps = np.interp(acc.x, series.x[order], series.y[order])
            return eps, acc.y
    return np.empty(0), np.empty(0)


class CompareView(QWidget):
    def __init__(self, parent: QWidget | None = None, theory: TheorySource | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        self.hint = QLabel("Select two or more runs in the runs list (Ctrl+click), then Compare (Ctrl+K).")
        layout.addWidget(self.hint)
        # Keeping the best of runs compared here is a selection on the same data that no epsilon covers.
        self.banner = QLabel()
        self.banner.setObjectName("exploratoryBanner")
        self.banner.setWordWrap(True)
        self.banner.setStyleSheet("QLabel { background: #fff3cd; color: #664d03; border: 1px solid #ffe69c; "
                                  "padding: 4px; }")
        self.banner.hide()
        layout.addWidget(self.banner)
        # One tab per (dataset, mechanism) of the selected runs: the plots never mix them on one axis.
        self.group_tabs = QTabBar()
        self.group_tabs.setObjectName("compareGroups")
        self.group_tabs.setToolTip("Accuracy is comparable on one dataset and ε within one mechanism: the plots "
                                   "show one group of the selected runs at a time; the table shows them all")
        self.group_tabs.currentChanged.connect(lambda _: self._draw_group())
        self.group_tabs.hide()
        layout.addWidget(self.group_tabs)
        splitter = QSplitter(Qt.Orientation.Vertical)
        layout.addWidget(splitter, 1)
        plots = QWidget()
        grid = QGridLayout(plots)
        grid.setContentsMargins(0, 0, 0, 0)
        self.tradeoff = Plot("Accuracy against privacy", "publishable ε", "test accuracy", corner="bottom-right")
        self.acc_steps = Plot("Test accuracy", "step", "accuracy", legend=False)
        self.eps_steps = Plot("Privacy spent", "step (PATE: queries)", "publishable ε", legend=False)
        self.scatter_plot = Plot("All finished runs", "final publishable ε", "final test accuracy", legend=False)
        grid.addWidget(self.tradeoff, 0, 0, 2, 1)
        grid.addWidget(self.acc_steps, 0, 1)
        grid.addWidget(self.eps_steps, 1, 1)
        self.membership = TradeoffOverlay(theory)  # the Audit tab's curves, one colour per run as here
        grid.addWidget(self.scatter_plot, 0, 2)
        grid.addWidget(self.membership, 1, 2)
        grid.setColumnStretch(0, 3)
        grid.setColumnStretch(1, 2)
        grid.setColumnStretch(2, 2)
        splitter.addWidget(plots)
        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(False)
        splitter.addWidget(self.table)
        splitter.setSizes([500, 300])
        self.splitter = splitter
        self.run_ids: list[int] = []
        self.runs: list[tuple[dict[str, Any], RunData]] = []
        self.all_rows: list[dict[str, Any]] = []
        self.groups: dict[tuple[str, str], list[int]] = {}

    def show_runs(self, runs: list[tuple[dict[str, Any], RunData]], all_rows: list[dict[str, Any]]) -> None:
        """`runs`: the selected runs (store row, curves); `all_rows`: every run, for the scatter."""
        self.runs, self.all_rows = list(runs), all_rows
        self.run_ids = [row["id"] for row, _ in runs]
        shown = self.shown_group()
        self.groups = groups_of([row for row, _ in runs])
        self.group_tabs.blockSignals(True)
        while self.group_tabs.count():
            self.group_tabs.removeTab(0)
        for key, ids in self.groups.items():
            self.group_tabs.addTab(f"{group_label(key)} ({len(ids)} run{'s' if len(ids) != 1 else ''})")
        keys = list(self.groups)
        self.group_tabs.setCurrentIndex(keys.index(shown) if shown in keys else 0)
        self.group_tabs.blockSignals(False)
        self.group_tabs.setVisible(len(self.groups) > 1)
        self._draw_group()
        self._config_table([row for row, _ in runs])
        self.hint.setVisible(len(runs) < 2)

    def shown_group(self) -> tuple[str, str] | None:
        """The (dataset, mechanism) whose runs the plots show."""
        keys = list(self.groups)
        index = self.group_tabs.currentIndex()
        return keys[index] if 0 <= index < len(keys) else None

    def show_group(self, key: tuple[str, str]) -> None:
        self.group_tabs.setCurrentIndex(list(self.groups).index(key))

    def _draw_group(self) -> None:
        """Draw the runs of the group shown; each run keeps its colour (its place in the selection)."""
        for plot in (self.tradeoff, self.acc_steps, self.eps_steps, self.scatter_plot):
            plot.clear()
            if plot.legend is not None:
                plot.legend.clear()
        key = self.shown_group()
        colours = {run_id: index for index, run_id in enumerate(self.run_ids)}
        self.membership.show_runs([row for row, _ in self.runs if group_key(row) == key], colours)
        for row, data in self.runs:
            if group_key(row) != key:
                continue
            index = colours[row["id"]]
            label = f"{row['id']}: {row['name']}" + ("" if carries_guarantee(row) else f" ({NO_GUARANTEE})")
            eps, acc = accuracy_vs_epsilon(data, row)
            set_curve(self.tradeoff.curve(label, index, symbol="o"), eps, acc)
            series = data.metrics.get("test_accuracy")
            if series is not None:
                set_curve(self.acc_steps.curve(label, index, symbol="o"), series.x, series.y)
            _, eps_series = data.epsilon_series()
            if eps_series is not None:
                set_curve(self.eps_steps.curve(label, index), eps_series.x, eps_series.y)
        in_group = {run_id: colours[run_id] for run_id in self.groups.get(key, [])} if key else {}
        # Choosing among runs of the same data is a choice whatever their mechanisms: every tab of that data says so.
        banner = exploratory_banner([row for row, _ in self.runs if key and group_key(row)[0] == key[0]])
        self.banner.setText(banner or "")
        self.banner.setVisible(banner is not None)
        self._scatter(self.all_rows, in_group)
        # The group in the title, which wraps (on the axis it was cut at a window 950 px wide)
        self.tradeoff.set_title("Accuracy against privacy" + (f" ({group_label(key)})" if key else ""))
        self.eps_steps.setLabel("bottom", ("queries" if key and key[1] == "pate" else "step"))
        self.acc_steps.setLabel("bottom", "student step" if key and key[1] == "pate" else "step")
        for plot in (self.tradeoff, self.acc_steps, self.eps_steps, self.scatter_plot):
            plot.fit_to_data()

    def _scatter(self, rows: list[dict[str, Any]], selected: dict[int, int]) -> None:
        """`selected`: run id -> its colour index in the other plots (the runs of the group shown)."""
        groups = {group_key(r) for r in rows if r["id"] in selected}
        points = [r for r in rows if r["status"] == "finished" and r.get("accuracy") is not None
                  and publishable_epsilon(r).value is not None
                  and (not groups or group_key(r) in groups)]
        # Accuracy is comparable on one dataset, and epsilon within one mechanism: only the shown
        # group's (dataset, mechanism) runs are placed here.
        named = "; ".join(f"{d}, {m}" for d, m in sorted(groups, key=str))
        # The group goes in the title, which wraps: on the axis it was cut in this small plot.
        self.scatter_plot.set_title(f"Finished runs ({named})" if groups else "All finished runs")
        self.scatter_plot.setLabel("bottom", "final publishable ε")
        _, foreground = palette_colours()
        spots = []
        for r in points:
            chosen = r["id"] in selected
            spots.append({
                "pos": (publishable_epsilon(r).value, r["accuracy"]),
                "size": 12 if chosen else 8,
                "brush": pg.mkBrush(colour(selected[r["id"]]) if chosen else colour(7)),
                "pen": pg.mkPen(foreground) if chosen else None,
                "data": r["id"],
            })
        scatter = pg.ScatterPlotItem(spots=spots, hoverable=True)
        scatter.setToolTip("Finished private runs at their publishable ε; the selected ones are larger; "
                           f"'{NO_GUARANTEE}': a run that states none (its ε column's tooltip says why)")
        self.scatter_plot.addItem(scatter)
        self.scatter = scatter
        for r in points:
            text = pg.TextItem(str(r["id"]) + ("" if carries_guarantee(r) else f" ({NO_GUARANTEE})"),
                               color=foreground, anchor=(0, 1))
            text.setPos(publishable_epsilon(r).value, r["accuracy"])
            self.scatter_plot.addItem(text)

    def _config_table(self, rows: list[dict[str, Any]]) -> None:
        """Results rows first (accuracy, ε, δ, steps, duration), then the settings the runs read, by the
        setup form's labels and units (engine.run_comparison); settings that differ come first and are
        highlighted, a setting a run does not read reads NOT_USED."""
        comparison = compare_runs(rows)
        keys = comparison.settings
        self.table.clear()
        self.table.setColumnCount(len(rows))
        self.table.setRowCount(len(RESULT_ROWS) + len(keys))
        self.table.setHorizontalHeaderLabels([f"{r['id']}: {r['name']}" for r in rows])
        self.table.setVerticalHeaderLabels([label for _, label in RESULT_ROWS] + [setting_label(k) for k in keys])
        for i, (key, _) in enumerate(RESULT_ROWS):
            for j, text in enumerate(comparison.results[key]):
                item = QTableWidgetItem(text)
                font = item.font()
                font.setBold(True)
                item.setFont(font)
                self.table.setItem(i, j, item)
            self.table.verticalHeaderItem(i).setToolTip("result")
        highlight = QColor(self.palette().color(QPalette.ColorRole.Highlight))
        highlight.setAlpha(90)
        for i, key in enumerate(keys, start=len(RESULT_ROWS)):
            self.table.verticalHeaderItem(i).setToolTip(key)  # the name in TOML files and `dpw show`
            for j, values in enumerate(comparison.values):
                item = QTableWidgetItem(comparison.setting_text(key, j))
                if key in comparison.differ and key in values:
                    item.setBackground(QBrush(highlight))
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                self.table.setItem(i, j, item)
        self.table.resizeColumnsToContents()
        self.differing = comparison.differ

    def row_labels(self) -> list[str]:
        """The table's row labels, top to bottom (for tests)."""
        return [self.table.verticalHeaderItem(i).text() for i in range(self.table.rowCount())]
