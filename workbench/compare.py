"""Compare runs: accuracy against epsilon, overlaid curves, configs side by side, and where
every finished run landed (final accuracy vs final epsilon)."""

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
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.publication import NO_GUARANTEE, carries_guarantee, publishable_epsilon
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


def relevant_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings that matter for the run's mechanism (a DP-SGD run has no PATE threshold, a
    GNMax run no Laplace scale); settings of another config version stay visible."""
    from workbench.form_state import field_names, visible_fields

    used = set(visible_fields(config.get("mechanism", ""), config.get("aggregator")))
    known = set(field_names())
    return {k: v for k, v in config.items() if k != "schema_version" and (k in used or k not in known)}


def differing_keys(configs: list[dict[str, Any]]) -> set[str]:
    keys = set().union(*configs) if configs else set()
    return {k for k in keys if len({repr(c.get(k)) for c in configs}) > 1}


class CompareView(QWidget):
    def __init__(self, parent: QWidget | None = None, theory: TheorySource | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        self.hint = QLabel("Select two or more runs in the runs list (Ctrl+click), then Compare (Ctrl+K).")
        layout.addWidget(self.hint)
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

    def show_runs(self, runs: list[tuple[dict[str, Any], RunData]], all_rows: list[dict[str, Any]]) -> None:
        """`runs`: the selected runs (store row, curves); `all_rows`: every run, for the scatter."""
        self.run_ids = [row["id"] for row, _ in runs]
        for plot in (self.tradeoff, self.acc_steps, self.eps_steps, self.scatter_plot):
            plot.clear()
            if plot.legend is not None:
                plot.legend.clear()
        for index, (row, data) in enumerate(runs):
            label = f"{row['id']}: {row['name']}" + ("" if carries_guarantee(row) else f" ({NO_GUARANTEE})")
            eps, acc = accuracy_vs_epsilon(data, row)
            set_curve(self.tradeoff.curve(label, index, symbol="o"), eps, acc)
            series = data.metrics.get("test_accuracy")
            if series is not None:
                set_curve(self.acc_steps.curve(label, index, symbol="o"), series.x, series.y)
            _, eps_series = data.epsilon_series()
            if eps_series is not None:
                set_curve(self.eps_steps.curve(label, index), eps_series.x, eps_series.y)
        self._scatter(all_rows, {run_id: index for index, run_id in enumerate(self.run_ids)})
        self.membership.show_runs([row for row, _ in runs])
        self._config_table([row for row, _ in runs])
        for plot in (self.tradeoff, self.acc_steps, self.eps_steps, self.scatter_plot):
            plot.fit_to_data()
        self.hint.setVisible(len(runs) < 2)

    def _scatter(self, rows: list[dict[str, Any]], selected: dict[int, int]) -> None:
        """`selected`: run id -> its colour index in the other plots."""
        groups = {(r.get("dataset"), r.get("mechanism")) for r in rows if r["id"] in selected}
        points = [r for r in rows if r["status"] == "finished" and r.get("accuracy") is not None
                  and publishable_epsilon(r).value is not None
                  and (not groups or (r.get("dataset"), r.get("mechanism")) in groups)]
        # Accuracy is comparable on one dataset, and epsilon within one mechanism: only the selected
        # runs' (dataset, mechanism) groups are placed here.
        named = "; ".join(f"{d}, {m}" for d, m in sorted(groups, key=str))
        self.scatter_plot.set_title("Finished runs" if groups else "All finished runs")
        self.scatter_plot.setLabel("bottom", "final publishable ε" + (f" ({named})" if groups else ""))
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
                           f"'{NO_GUARANTEE}': reproducible noise")
        self.scatter_plot.addItem(scatter)
        self.scatter = scatter
        for r in points:
            text = pg.TextItem(str(r["id"]) + ("" if carries_guarantee(r) else f" ({NO_GUARANTEE})"),
                               color=foreground, anchor=(0, 1))
            text.setPos(publishable_epsilon(r).value, r["accuracy"])
            self.scatter_plot.addItem(text)

    def _config_table(self, rows: list[dict[str, Any]]) -> None:
        configs = [relevant_settings(r.get("config") or {}) for r in rows]
        keys = sorted(set().union(*configs)) if configs else []
        differ = differing_keys(configs)
        keys = sorted(differ) + [k for k in keys if k not in differ]  # differences first
        self.table.clear()
        self.table.setColumnCount(len(rows))
        self.table.setRowCount(len(keys))
        self.table.setHorizontalHeaderLabels([f"{r['id']}: {r['name']}" for r in rows])
        self.table.setVerticalHeaderLabels(keys)
        highlight = QColor(self.palette().color(QPalette.ColorRole.Highlight))
        highlight.setAlpha(90)
        for i, key in enumerate(keys):
            for j, config in enumerate(configs):
                value = config.get(key)
                item = QTableWidgetItem("" if value is None else str(value))
                if key in differ:
                    item.setBackground(QBrush(highlight))
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                self.table.setItem(i, j, item)
        self.table.resizeColumnsToContents()
        self.differing = differ
