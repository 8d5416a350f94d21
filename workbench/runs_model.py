"""The runs table: every run in the store, newest first."""

from __future__ import annotations

import datetime as dt
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor

from engine.publication import NO_GUARANTEE_STATEMENT, carries_guarantee, epsilon_label, publishable_epsilon

COLUMNS = (
    ("id", "#"),
    ("name", "Name"),
    ("mechanism", "Mechanism"),
    ("dataset", "Dataset"),
    ("status", "Status"),
    ("epsilon", "ε"),
    ("accuracy", "Accuracy"),
    ("started", "Started"),
)
STATUS_COLOURS = {"failed": "#d62728", "running": "#1f77b4", "queued": "#7f7f7f", "stopped": "#ff7f0e"}


def _started(value: str | None) -> str:
    if not value:
        return ""
    try:
        when = dt.datetime.fromisoformat(value).astimezone()
    except ValueError:
        return value
    return when.strftime("%m-%d %H:%M")


def epsilon_tooltip(row: dict[str, Any]) -> str:
    """What the ε column's number is (engine.publication), or why it carries no guarantee."""
    if not carries_guarantee(row):
        return NO_GUARANTEE_STATEMENT + " (reproducible_noise = true)."
    eps = publishable_epsilon(row)
    if eps.value is None:
        return "No privacy accounted yet."
    if row.get("mechanism") == "pate":
        return (f"Publishable ε ({eps.accountant}): the smaller of PATE's data-independent bound and its "
                f"smooth-sensitivity release, δ = {eps.delta:g}.")
    return f"ε at δ = {eps.delta:g} ({eps.accountant} accountant)."


class RunsModel(QAbstractTableModel):
    """Rows of `Store.list_runs()`; `set_rows` keeps the model's identity so selections survive."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[dict[str, Any]] = []

    def set_rows(self, rows: list[dict[str, Any]]) -> None:
        rows = sorted(rows, key=lambda r: r["id"], reverse=True)
        if [r["id"] for r in rows] == [r["id"] for r in self.rows]:
            self.rows = rows
            if rows:
                self.dataChanged.emit(self.index(0, 0), self.index(len(rows) - 1, len(COLUMNS) - 1))
            return
        self.beginResetModel()
        self.rows = rows
        self.endResetModel()

    def row_of(self, run_id: int) -> int | None:
        for i, row in enumerate(self.rows):
            if row["id"] == run_id:
                return i
        return None

    def run_at(self, row: int) -> dict[str, Any]:
        return self.rows[row]

    # ---- Qt model ------------------------------------------------------------------------------
    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole):  # noqa: N802
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return COLUMNS[section][1]
        return None

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        key = COLUMNS[index.column()][0]
        value = row.get(key)
        if role == Qt.ItemDataRole.DisplayRole:
            if key == "epsilon":
                return epsilon_label(row)
            if key == "accuracy":
                return "" if value is None else f"{value:.3f}"
            if key == "started":
                return _started(value or row.get("created"))
            return "" if value is None else str(value)
        if role == Qt.ItemDataRole.ForegroundRole and key == "status" and value in STATUS_COLOURS:
            return QColor(STATUS_COLOURS[value])
        if role == Qt.ItemDataRole.ToolTipRole:
            if key == "epsilon" and row.get("mechanism") in ("dpsgd", "pate"):
                return epsilon_tooltip(row)
            if row.get("error"):
                return f"{row['error']}" + (f"\n{row['error_hint']}" if row.get("error_hint") else "")
            return None
        if role == Qt.ItemDataRole.TextAlignmentRole and key in ("id", "epsilon", "accuracy"):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.UserRole:
            return row["id"]
        return None
