"""The left side of the window: a search box over the runs list, the list, and a read-only panel with
the selected run's guarantee, outcome and config."""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSplitter,
    QTableView,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.publication import publishable_epsilon, publishable_text
from engine.run_filter import tags_text
from engine.run_times import duration_seconds, format_duration
from workbench.runs_model import DeletedRunsModel, RunsTable, parse_tags, stop_reason_label

# Result rows first, then the config as the engine stored it.
RESULT_ROWS = (
    ("status", "Status"),
    ("epsilon", "ε (publishable)"),
    ("delta", "δ"),
    ("accountant", "Accountant"),
    ("epsilon_budget", "ε budget"),
    ("accuracy", "Test accuracy"),
    ("steps", "Steps done / planned"),
    ("continued", "Continues"),
    ("continued_by", "Continued by"),
    ("training_time", "Training time"),
    ("duration", "Wall time"),
    ("stop_reason", "Stopped by"),
    ("error", "Error"),
)


def result_values(row: dict[str, Any], continued_by: Sequence[dict[str, Any]] = ()) -> list[tuple[str, str]]:
    """(label, text) of a run's outcome, with the epsilon engine.publication says it may state;
    `continued_by`: the runs that continue it (why Continue run is greyed out for it)."""
    eps = publishable_epsilon(row)
    values = {
        "status": row.get("status"),
        "epsilon": publishable_text(row) + (eps.at_step(row.get("steps_done")) if eps.holds else ""),
        "delta": None if eps.delta is None else f"{eps.delta:g}",
        "accountant": eps.accountant,
        "epsilon_budget": None if row.get("epsilon_budget") is None else f"{row['epsilon_budget']:g}",
        "accuracy": None if row.get("accuracy") is None else f"{row['accuracy']:.4f}",
        "steps": None if row.get("steps_done") is None
        else f"{row['steps_done']:,} / {row.get('steps_planned') or '?'}",
        "continued": None if row.get("resumed_from") is None else
        f"run {row['resumed_from']} from step {row.get('steps_resumed') or '?'} (ε covers both)",
        "continued_by": ", ".join(f"run {r['id']} ({r.get('status')})" for r in continued_by) or None,
        "training_time": format_duration((row.get("summary") or {}).get("seconds")) or None,  # as dpw show's
        "duration": format_duration(duration_seconds(row)) or None,  # the runner's start to the run's end
        "stop_reason": stop_reason_label(row) or None,
        "error": row.get("error"),
    }
    return [(label, str(values[key])) for key, label in RESULT_ROWS if values[key] not in (None, "")]


def settings_in_use(config: dict[str, Any]) -> dict[str, Any]:
    """The settings the run reads, as `dpw show` lists them (engine.settings_in_effect: no PATE
    aggregator for a DP-SGD run, no attack FPR without a target TPR); keys this version does not know
    stay visible."""
    from engine.config import config_fields
    from engine.settings_in_effect import settings_in_effect

    used = set(settings_in_effect(config))
    known = {name for name, _, _ in config_fields()}
    return {k: v for k, v in config.items() if k != "schema_version" and (k in used or k not in known)}


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
        self.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)  # sized to its rows: show_run
        self.setRootIsDecorated(True)
        self.setUniformRowHeights(True)
        self.run_id: int | None = None
        self._shown: tuple[dict[str, Any], list[dict[str, Any]]] | None = None

    def show_run(self, row: dict[str, Any] | None, continued_by: Sequence[dict[str, Any]] = ()) -> None:
        """Show `row` (and the runs that continue it); what is shown already is left alone (the list
        refreshes every 1.5 s)."""
        shown = None if row is None else (row, list(continued_by))
        if shown == self._shown and self.topLevelItemCount() + (row is None) > 0:
            return
        self._shown = shown
        self.clear()
        self.run_id = None if row is None else row["id"]
        if row is None:
            self.setHeaderLabels(["No run selected", ""])
            return
        title = f"Run {row['id']}: {row.get('name', '')}"
        self.setHeaderLabels([title, ""])
        self.headerItem().setToolTip(0, title)
        results = QTreeWidgetItem(self, ["Results"])
        for label, text in result_values(row, continued_by):
            item = QTreeWidgetItem(results, [label, text])
            item.setToolTip(1, text)
        config = QTreeWidgetItem(self, ["Config"])
        self._add(config, settings_in_use(row.get("config") or {}))
        results.setExpanded(True)
        config.setExpanded(True)
        # The labels' column fits its rows, not the title above it: a long name (a study candidate's)
        # would push the values out of a narrow panel; the title is elided instead (full in its tooltip).
        self.setColumnWidth(0, self.sizeHintForColumn(0))

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


class NotesEdit(QPlainTextEdit):
    """The notes box: says when editing ends (focus leaves it), like QLineEdit.editingFinished."""

    editing_finished = Signal()

    def focusOutEvent(self, event) -> None:  # noqa: N802
        super().focusOutEvent(event)
        self.editing_finished.emit()


class RunNotes(QWidget):
    """Tags (comma-separated) and notes of the selected run, editable; each is saved when its editing
    ends (`tags_edited(run_id, tags)`, `notes_edited(run_id, text)`). A box being edited is never
    overwritten by the list's refresh."""

    tags_edited = Signal(int, list)
    notes_edited = Signal(int, str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QFormLayout(self)
        layout.setContentsMargins(0, 4, 0, 0)
        self.tags = QLineEdit()
        self.tags.setObjectName("runTags")
        self.tags.setPlaceholderText("comma-separated, e.g. baseline, lr 0.5")
        self.tags.setToolTip("The run's tags, saved in the store when you leave the box or press Enter; "
                             "the filter box above matches them (dpw tag, dpw untag)")
        self.notes = NotesEdit()
        self.notes.setObjectName("runNotes")
        self.notes.setPlaceholderText("Notes on this run (saved in the store when you leave the box)")
        self.notes.setTabChangesFocus(True)
        self.notes.setFixedHeight(self.fontMetrics().lineSpacing() * 3 + 12)
        layout.addRow("Tags", self.tags)
        layout.addRow("Notes", self.notes)
        self.run_id: int | None = None
        self._saved_tags: list[str] = []
        self._saved_notes = ""
        self.tags.editingFinished.connect(self._tags_done)
        self.notes.editing_finished.connect(self._notes_done)
        self.show_run(None)

    def show_run(self, row: dict[str, Any] | None) -> None:
        """Show `row`'s tags and notes; the same run again updates only a box not being edited."""
        same = row is not None and row["id"] == self.run_id
        if not same:
            self._tags_done()  # an edit under way belongs to the run it was typed for
            self._notes_done()
        self.run_id = None if row is None else row["id"]
        self.tags.setEnabled(row is not None)
        self.notes.setEnabled(row is not None)
        tags, notes = (list(row.get("tags") or []), row.get("notes") or "") if row is not None else ([], "")
        if not (same and self.tags.hasFocus()) and (not same or tags != self._saved_tags):
            self.tags.setText(tags_text({"tags": tags}))
        if not (same and self.notes.hasFocus()) and (not same or notes != self._saved_notes):
            self.notes.setPlainText(notes)
        self._saved_tags, self._saved_notes = tags, notes

    def _tags_done(self) -> None:
        if self.run_id is None:
            return
        tags = parse_tags(self.tags.text())
        if tags != self._saved_tags:
            self._saved_tags = tags
            self.tags_edited.emit(self.run_id, tags)

    def _notes_done(self) -> None:
        if self.run_id is None:
            return
        text = self.notes.toPlainText().strip()
        if text != self._saved_notes:
            self._saved_notes = text
            self.notes_edited.emit(self.run_id, text)


class RunsPanel(QWidget):
    """Search box, runs list (sortable by clicking a header), the selected run's tags, notes and config
    panel, and, on request, the greyed records of deleted runs (`load_deleted()` reads them)."""

    def __init__(self, view: QTableView, model: RunsTable, parent: QWidget | None = None, *,
                 load_deleted: Callable[[], list[dict[str, Any]]] | None = None):
        super().__init__(parent)
        self.view, self.model = view, model
        self.load_deleted = load_deleted
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setObjectName("runsSearch")
        self.search.setPlaceholderText("Filter runs: name, tags, dataset, mechanism, status…")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(model.set_filter_text)
        top.addWidget(self.search, 1)
        self.show_deleted = QCheckBox("Show deleted")
        self.show_deleted.setObjectName("showDeleted")
        self.show_deleted.setToolTip("Show what the store keeps of deleted runs: the privacy they spent on their "
                                     "data was spent all the same (dpw list --deleted)")
        self.show_deleted.toggled.connect(self._deleted_toggled)
        top.addWidget(self.show_deleted)
        layout.addLayout(top)
        view.setSortingEnabled(True)
        view.horizontalHeader().setSortIndicator(0, Qt.SortOrder.DescendingOrder)
        view.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        view.horizontalHeader().setStretchLastSection(False)
        self.deleted_model = DeletedRunsModel(self)
        self.deleted_view = QTableView()
        self.deleted_view.setObjectName("deletedRunsView")
        self.deleted_view.setModel(self.deleted_model)
        self.deleted_view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.deleted_view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.deleted_view.verticalHeader().hide()
        self.deleted_view.setWordWrap(False)
        self.deleted_box = QWidget()
        box = QVBoxLayout(self.deleted_box)
        box.setContentsMargins(0, 0, 0, 0)
        self.deleted_label = QLabel()
        self.deleted_label.setWordWrap(True)
        box.addWidget(self.deleted_label)
        box.addWidget(self.deleted_view, 1)
        self.deleted_box.hide()
        self.run_notes = RunNotes()
        self.config = ConfigPanel()
        details = QWidget()
        details_layout = QVBoxLayout(details)
        details_layout.setContentsMargins(0, 0, 0, 0)
        details_layout.addWidget(self.run_notes)
        details_layout.addWidget(self.config, 1)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(view)
        self.splitter.addWidget(self.deleted_box)
        self.splitter.addWidget(details)
        self.splitter.setStretchFactor(0, 3)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setStretchFactor(2, 2)
        layout.addWidget(self.splitter, 1)
        model.modelReset.connect(self.fit_columns)

    def show_run(self, row: dict[str, Any] | None) -> None:
        """The selected run's tags, notes, results and config (None: no run selected)."""
        self.run_notes.show_run(row)
        continued_by = [] if row is None else [r for r in self.model.rows if r.get("resumed_from") == row["id"]]
        self.config.show_run(row, continued_by)

    def fit_columns(self) -> None:
        """Columns as wide as their contents (on a reset only, not on every refresh: cheap and stable)."""
        self.view.resizeColumnsToContents()

    def _deleted_toggled(self, on: bool) -> None:
        self.deleted_box.setVisible(on)
        if on:
            self.refresh_deleted()
            self.deleted_view.resizeColumnsToContents()

    def refresh_deleted(self) -> None:
        """Read the deleted runs' records again (only while they are shown)."""
        if not self.show_deleted.isChecked() or self.load_deleted is None:
            return
        rows = self.load_deleted()
        self.deleted_model.set_rows(rows)
        count = len(rows)
        self.deleted_label.setText(
            f"{count} deleted run{'s' if count != 1 else ''}: records kept, read-only. The privacy they spent on "
            "their data was spent all the same." if count else "No deleted runs in this store.")
