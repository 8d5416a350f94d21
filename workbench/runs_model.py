"""The runs table: every run in the store, newest first, sortable by any column and filtered by a search
text (RunsTable, a QSortFilterProxyModel over RunsModel)."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from engine.publication import (
    NO_FINITE_BOUND_STATEMENT,
    carries_guarantee,
    epsilon_label,
    no_guarantee_statement,
    publishable_epsilon,
)
from engine.run_filter import matches, tags_text
from engine.run_times import duration_seconds, format_duration
from engine.study_rows import study_label, study_sort_key

COLUMNS = (  # what a run gave (status, ε, accuracy) first: in view at the list's default width
    ("id", "#"),
    ("name", "Name"),
    ("status", "Status"),
    ("epsilon", "ε"),
    ("accuracy", "Accuracy"),
    ("delta", "δ"),
    ("mechanism", "Mechanism"),
    ("dataset", "Dataset"),
    ("study", "Study"),  # engine.study_rows: sorting by it groups each study's runs
    ("tags", "Tags"),
    ("epsilon_budget", "Budget"),
    ("steps", "Steps"),
    ("duration", "Wall time"),  # start to end; the results panel also shows the training time
    ("stop_reason", "Stopped by"),
    ("started", "Started"),
)
NUMERIC = {"id", "epsilon", "delta", "epsilon_budget", "accuracy", "steps", "duration"}
# The raw value a column sorts by (numbers as numbers, empty cells last in ascending order).
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
# "stopped": Stop in the window, Ctrl-C or SIGTERM to `dpw run`, or the window closed.
STOP_REASONS = {"completed": "completed", "budget": "ε budget", "stopped": "stop request"}
STATUS_COLOURS = {"failed": "#d62728", "running": "#1f77b4", "queued": "#7f7f7f", "stopped": "#ff7f0e"}


def _started(value: str | None) -> str:
    if not value:
        return ""
    try:
        when = dt.datetime.fromisoformat(value).astimezone()
    except ValueError:
        return value
    return when.strftime("%Y-%m-%d %H:%M")


def stop_reason_label(row: dict[str, Any]) -> str:
    """Why the run ended, in words: its recorded stop reason, or "error" for a failed run."""
    if row.get("status") == "failed":
        return "error"
    reason = row.get("stop_reason")
    return STOP_REASONS.get(reason, reason or "")


def release_refusal(row: dict[str, Any]) -> str | None:
    """Why Export and Report do not apply to `row` (None when they do): they need a run that ended with
    a trained model (finished, or stopped after a private step) that may leave the store (not a
    withheld candidate of a private study)."""
    ref, status = f"run {row.get('id')}", row.get("status")
    if status == "failed":
        return f"{ref} failed: it has no model to release"
    if status not in ("finished", "stopped"):
        return f"{ref} is {status}: its model is released once it has ended"
    if row.get("mechanism") in ("dpsgd", "pate") and not row.get("steps_done"):
        return f"{ref} stopped before its first private step: nothing was trained"
    eps = publishable_epsilon(row)
    return f"{ref} is {eps.note}: its model and scores never leave the store" if eps.withheld else None


def cell_value(row: dict[str, Any], key: str) -> Any:
    """The value a column sorts by: numbers for numeric columns, text otherwise."""
    if key == "epsilon":
        return publishable_epsilon(row).value if row.get("mechanism") != "none" else math.inf
    if key == "delta":
        return publishable_epsilon(row).delta if row.get("mechanism") != "none" else None
    if key == "steps":
        return row.get("steps_done")
    if key == "duration":
        return duration_seconds(row)
    if key == "stop_reason":
        return stop_reason_label(row)
    if key == "started":
        return row.get("started") or ""
    if key == "tags":
        return tags_text(row)
    if key == "study":
        return study_sort_key(row)
    return row.get(key)


def parse_tags(text: str) -> list[str]:
    """The tags box's text as tags (comma-separated, each once; the store cleans them the same way)."""
    out: list[str] = []
    for part in text.split(","):
        tag = " ".join(part.split())
        if tag and tag not in out:
            out.append(tag)
    return out


def epsilon_tooltip(row: dict[str, Any]) -> str:
    """What the ε column's number is (engine.publication), or why it carries no guarantee."""
    if not carries_guarantee(row):
        return no_guarantee_statement(row) + "."
    eps = publishable_epsilon(row)
    study = f"{eps.note[0].upper()}{eps.note[1:]}." if eps.note else ""
    if eps.value is None:
        return study or "No privacy accounted yet."
    if eps.value == float("inf"):
        return f"{NO_FINITE_BOUND_STATEMENT} at δ = {eps.delta:g} ({eps.accountant} accountant)."
    if study:  # a study's run states the study's epsilon (engine.publication)
        return f"ε at δ = {eps.delta:g} ({eps.accountant}).\n{study}"
    if row.get("mechanism") == "pate":
        return (f"ε at δ = {eps.delta:g} ({eps.accountant}): PATE's data-independent bound, which holds whatever "
                "the teachers' votes.")
    return f"ε at δ = {eps.delta:g} ({eps.accountant} accountant)."


class RunsModel(QAbstractTableModel):
    """Rows of `Store.list_runs()`; `set_rows` keeps the model's identity so selections survive."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[dict[str, Any]] = []

    def set_rows(self, rows: list[dict[str, Any]]) -> None:
        rows = sorted(rows, key=lambda r: r["id"], reverse=True)
        if [r["id"] for r in rows] == [r["id"] for r in self.rows]:
            if rows != self.rows:  # the list is read again every 1.5 s: redraw (and resize) only on a change
                self.rows = rows
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
        if role == SORT_ROLE:
            return cell_value(row, key)
        if role == Qt.ItemDataRole.DisplayRole:
            if key == "epsilon":
                return epsilon_label(row)
            if key == "delta":
                delta = cell_value(row, "delta")
                return "" if delta is None else f"{delta:.0e}" if delta < 1e-3 else f"{delta:g}"
            if key == "epsilon_budget":
                return "" if value is None else f"{value:g}"
            if key == "accuracy":
                return "" if value is None else f"{value:.3f}"
            if key == "steps":
                done, planned = row.get("steps_done"), row.get("steps_planned")
                if done is None:
                    return ""
                return f"{done:,} / {planned:,}" if planned else f"{done:,}"
            if key == "duration":
                return format_duration(duration_seconds(row))
            if key == "stop_reason":
                return stop_reason_label(row)
            if key == "started":
                return _started(value)  # a run that never started has no start time
            if key == "tags":
                return tags_text(row)
            if key == "study":
                return study_label(row)
            return "" if value is None else str(value)
        if role == Qt.ItemDataRole.ForegroundRole and key == "status" and value in STATUS_COLOURS:
            return QColor(STATUS_COLOURS[value])
        if role == Qt.ItemDataRole.ToolTipRole:
            if key in ("epsilon", "delta") and row.get("mechanism") in ("dpsgd", "pate"):
                return epsilon_tooltip(row)
            if key == "epsilon_budget":
                return ("The ε budget the run stops at (its accountant's ε)." if value is not None
                        else "No budget set.")
            if row.get("error"):
                return f"{row['error']}" + (f"\n{row['error_hint']}" if row.get("error_hint") else "")
            if row.get("notes"):
                return f"Notes: {row['notes']}"
            if key in ("name", "study"):  # the column may be too narrow for it (elided)
                return self.data(index, Qt.ItemDataRole.DisplayRole) or None
            return None
        if role == Qt.ItemDataRole.TextAlignmentRole and key in NUMERIC:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.UserRole:
            return row["id"]
        return None


class RunsTable(QSortFilterProxyModel):
    """The list as the view shows it: sorted (numbers as numbers) and filtered by a search text over
    name, dataset, mechanism, status and tags. Rows are in view order: `row_of`, `run_at` and `index` all
    speak of the rows shown; `rows` is every run."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.source = RunsModel(self)
        self.setSourceModel(self.source)
        self.setSortRole(SORT_ROLE)
        self.setDynamicSortFilter(True)
        self._words: list[str] = []
        self.sort(0, Qt.SortOrder.DescendingOrder)

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.source.rows

    def set_rows(self, rows: list[dict[str, Any]]) -> None:
        self.source.set_rows(rows)

    def set_filter_text(self, text: str) -> None:
        """Show only runs whose name, dataset, mechanism, status, tags or study contain every word of
        `text` (engine.run_filter)."""
        self.beginFilterChange()
        self._words = text.lower().split()
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def filterAcceptsRow(self, source_row: int, source_parent) -> bool:  # noqa: N802
        if not self._words:
            return True
        return matches(self.source.rows[source_row], self._words)

    def lessThan(self, left, right) -> bool:  # noqa: N802
        a, b = left.data(SORT_ROLE), right.data(SORT_ROLE)
        empty_a, empty_b = a is None or a == "", b is None or b == ""
        if empty_a or empty_b:  # empty cells go last in either order
            descending = self.sortOrder() == Qt.SortOrder.DescendingOrder
            return False if empty_a and empty_b else (empty_a == descending)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return a < b
        return str(a).lower() < str(b).lower()

    def row_of(self, run_id: int) -> int | None:
        source_row = self.source.row_of(run_id)
        if source_row is None:
            return None
        index = self.mapFromSource(self.source.index(source_row, 0))
        return index.row() if index.isValid() else None

    def run_at(self, row: int) -> dict[str, Any]:
        return self.source.rows[self.mapToSource(self.index(row, 0)).row()]


DELETED_COLUMNS = (
    ("id", "#"),
    ("name", "Name"),
    ("mechanism", "Mechanism"),
    ("dataset", "Dataset"),
    ("status", "Status"),
    ("epsilon", "ε"),
    ("delta", "δ"),
    ("accountant", "Accountant"),
    ("deleted", "Deleted"),
    ("tags", "Tags"),
    ("notes", "Notes"),
)


class DeletedRunsModel(QAbstractTableModel):
    """Read-only, greyed: what the store keeps of each deleted run (`Store.deleted_runs`), newest first.
    Its epsilon is the privacy the run spent on its data, spent all the same."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[dict[str, Any]] = []

    def set_rows(self, rows: list[dict[str, Any]]) -> None:
        rows = sorted(rows, key=lambda r: r["id"], reverse=True)
        if rows == self.rows:
            return
        self.beginResetModel()
        self.rows = rows
        self.endResetModel()

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(DELETED_COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole):  # noqa: N802
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return DELETED_COLUMNS[section][1]
        return None

    def flags(self, index: QModelIndex | QPersistentModelIndex) -> Qt.ItemFlag:
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable  # never editable

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        key = DELETED_COLUMNS[index.column()][0]
        value = row.get(key)
        if role == Qt.ItemDataRole.DisplayRole:
            if value is None:
                return ""
            if key == "epsilon":
                return f"{value:.3g}"
            if key == "delta":
                return f"{value:.0e}" if value < 1e-3 else f"{value:g}"
            if key == "deleted":
                return _started(value)
            if key == "tags":
                return tags_text(row)
            return str(value)
        if role == Qt.ItemDataRole.ForegroundRole:
            return QApplication.palette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text)
        if role == Qt.ItemDataRole.ToolTipRole:
            return (f"Run {row['id']} was deleted on {_started(row.get('deleted'))}; the store keeps this record: "
                    "the privacy it spent on its data was spent all the same."
                    + (f"\nNotes: {row['notes']}" if row.get("notes") else ""))
        if role == Qt.ItemDataRole.TextAlignmentRole and key in ("id", "epsilon", "delta"):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None
