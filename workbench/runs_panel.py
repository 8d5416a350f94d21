"""The left side of the window: a search box over the runs list, the list, and a read-only panel with
the selected run's guarantee, outcome and config."""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHeaderView,
    QLineEdit,
    QSplitter,
    QTableView,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.publication import publishable_epsilon
from workbench.runs_model import RunsTable, format_duration, duration_seconds, stop_reason_label

# Result rows first, then the config as the engine stored it.
RESULT_ROWS = (
    ("status", "Status"),
    ("epsilon", "ε (publishable)"),
    ("delta", "δ"),
    ("accountant", "Accountant"),
    ("epsilon_budget", "ε budget"),
    ("accuracy", "Test accuracy"),
    ("steps", "Steps done / planned"),
    ("duration", "Duration"),
    ("stop_reason", "Stopped by"),
    ("error", "Error"),
)


def result_values(row: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) of a run's outcome, with the epsilon engine.publication says it may state."""
    eps = publishable_epsilon(row)
    values = {
        "status": row.get("status"),
        "epsilon": "∞ (non-private)" if row.get("mechanism") == "none" else
        (None if eps.value is None else f"{eps.value:.4g}" + ("" if eps.guarantee else " (no guarantee)")),
        "delta": None if eps.delta is None else f"{eps.delta:g}",
        "accountant": eps.accountant,
        "epsilon_budget": None if row.get("epsilon_budget") is None else f"{row['epsilon_budget']:g}",
        "accuracy": None if row.get("accuracy") is None else f"{row['accuracy']:.4f}",
        "steps": None if row.get("steps_done") is None
        else f"{row['steps_done']:,} / {row.get('steps_planned') or '?'}",
        "duration": format_duration(duration_seconds(row)) or None,
        "stop_reason": stop_reason_label(row) or None,
        "error": row.get("error"),
    }
    return [(label, str(values[key])) for key, label in RESULT_ROWS if values[key] not in (None, "")]


def _text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return "unset" if value is None else str(value)


class ConfigPanel(QTreeWidget):
    """Read-only: the selected run's results, then every config setting (nested values as child rows)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("configPanel")
        self.setColumnCount(2)
        self.setHeaderLabels(["No run selected", ""])
        self.header().setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        self.setRootIsDecorated(True)
        self.setUniformRowHeights(True)
        self.run_id: int | None = None
        self._shown: dict[str, Any] | None = None

    def show_run(self, row: dict[str, Any] | None) -> None:
        """Show `row`; a row equal to the one shown is left alone (the list refreshes every 1.5 s)."""
        if row == self._shown and self.topLevelItemCount() + (row is None) > 0:
            return
        self._shown = row
        self.clear()
        self.run_id = None if row is None else row["id"]
        if row is None:
            self.setHeaderLabels(["No run selected", ""])
            return
        self.setHeaderLabels([f"Run {row['id']}: {row.get('name', '')}", ""])
        results = QTreeWidgetItem(self, ["Results"])
        for label, text in result_values(row):
            item = QTreeWidgetItem(results, [label, text])
            item.setToolTip(1, text)
        config = QTreeWidgetItem(self, ["Config"])
        self._add(config, row.get("config") or {})
        results.setExpanded(True)
        config.setExpanded(True)

    def _add(self, parent: QTreeWidgetItem, values: dict[str, Any]) -> None:
        for key, value in values.items():
            item = QTreeWidgetItem(parent, [key, "" if isinstance(value, dict) else _text(value)])
            item.setToolTip(1, _text(value))
            if isinstance(value, dict):
                self._add(item, value)
                item.setExpanded(True)

    def rows_text(self) -> list[tuple[str, str]]:
        """Every (label, value) shown, depth first (for tests and copying)."""
        out = []

        def walk(item: QTreeWidgetItem) -> None:
            out.append((item.text(0), item.text(1)))
            for i in range(item.childCount()):
                walk(item.child(i))

        for i in range(self.topLevelItemCount()):
            walk(self.topLevelItem(i))
        return out


class RunsPanel(QWidget):
    """Search box, runs list (sortable by clicking a header) and the selected run's config panel."""

    def __init__(self, view: QTableView, model: RunsTable, parent: QWidget | None = None):
        super().__init__(parent)
        self.view, self.model = view, model
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.search = QLineEdit()
        self.search.setObjectName("runsSearch")
        self.search.setPlaceholderText("Filter runs: name, dataset, mechanism, status…")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(model.set_filter_text)
        layout.addWidget(self.search)
        view.setSortingEnabled(True)
        view.horizontalHeader().setSortIndicator(0, Qt.SortOrder.DescendingOrder)
        view.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        view.horizontalHeader().setStretchLastSection(False)
        self.config = ConfigPanel()
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(view)
        self.splitter.addWidget(self.config)
        self.splitter.setStretchFactor(0, 3)
        self.splitter.setStretchFactor(1, 2)
        layout.addWidget(self.splitter, 1)
        model.modelReset.connect(self.fit_columns)

    def fit_columns(self) -> None:
        """Columns as wide as their contents (on a reset only, not on every refresh: cheap and stable)."""
        self.view.resizeColumnsToContents()
