"""The setup panel: a form generated from `engine.config.config_fields()`.

One widget per field, grouped by `FieldSpec.group`, showing only the chosen mechanism's
fields; each field says what is wrong with it where it is, and Start stays disabled until
the whole config is valid. A live preview states the privacy cost of the settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from engine.config import RunConfig
from engine.errors import ConfigError
from workbench import form_state
from workbench.form_state import GROUP_TITLES, FormState
from workbench.preview import CostPreview

ERROR_COLOUR = "#d62728"
INVALID_STYLE = f"border: 2px solid {ERROR_COLOUR}; border-radius: 3px;"
DATA_FILE_FILTER = "Data files (*.csv *.npz);;CSV tables (*.csv);;NumPy arrays (*.npz)"


class _Field:
    """One row: the input widget, its error label and the row's container."""

    def __init__(self, name: str, spec: Any, widget: QWidget, editor: QWidget, error: QLabel, label: QLabel):
        self.name, self.spec, self.widget, self.editor, self.error, self.label = name, spec, widget, editor, error, label

    def text(self) -> str:
        w = self.editor
        if isinstance(w, QCheckBox):
            return "true" if w.isChecked() else "false"
        if isinstance(w, QComboBox):
            return w.currentText()
        return w.text()

    def set_text(self, text: str) -> None:
        w = self.editor
        w.blockSignals(True)
        if isinstance(w, QCheckBox):
            w.setChecked(text.strip().lower() == "true")
        elif isinstance(w, QComboBox):
            if w.isEditable():
                w.setEditText(text)
            else:
                index = w.findText(text)
                w.setCurrentIndex(max(index, 0))
        else:
            w.setText(text)
        w.blockSignals(False)


class SetupForm(QWidget):
    """Edits a RunConfig. `start_requested(config)` when the user starts a valid one."""

    start_requested = Signal(object)
    validity_changed = Signal(bool)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = FormState()
        self.fields: dict[str, _Field] = {}
        self.groups: dict[str, tuple[QGroupBox, QFormLayout]] = {}
        self.errors: dict[str, ConfigError] = {}
        self.valid = False
        self.preview = CostPreview(self)
        self.preview.ready.connect(self._show_preview)

        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        body = QWidget()
        self.body_layout = QVBoxLayout(body)
        scroll.setWidget(body)
        outer.addWidget(scroll, 1)

        columns = QHBoxLayout()
        left, right = QVBoxLayout(), QVBoxLayout()
        columns.addLayout(left, 1)
        columns.addLayout(right, 1)
        self.body_layout.addLayout(columns)
        placement = {"run": left, "data": left, "model": left, "privacy": right, "training": right, "pate": right}
        for name, _, spec in form_state.config_fields():
            if spec.group not in self.groups:
                box = QGroupBox(GROUP_TITLES.get(spec.group, spec.group.title()))
                layout = QFormLayout(box)
                layout.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
                self.groups[spec.group] = (box, layout)
                placement.get(spec.group, left).addWidget(box)
                if spec.group == "privacy":
                    self.preview_label = QLabel("")
                    self.preview_label.setWordWrap(True)
                    self.preview_label.setObjectName("costPreview")
                    self.preview_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
                    self.preview_label.setFrameShape(QFrame.Shape.StyledPanel)
                    self.preview_label.setMargin(6)
            self._add_field(name, spec)
        self.groups["privacy"][1].addRow(self.preview_label)
        left.addStretch(1)
        right.addStretch(1)

        footer = QHBoxLayout()
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.summary.setStyleSheet(f"color: {ERROR_COLOUR};")
        self.summary.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.start_button = QPushButton("Start run")
        self.start_button.setDefault(True)
        self.start_button.clicked.connect(self.request_start)
        footer.addWidget(self.summary, 1)
        footer.addWidget(self.start_button)
        outer.addLayout(footer)
        self._load_state_into_widgets()
        self.revalidate()

    # ---- building ------------------------------------------------------------------------------
    def _add_field(self, name: str, spec: Any) -> None:
        box, layout = self.groups[spec.group]
        editor: QWidget
        row = QWidget()
        row_layout = QVBoxLayout(row)
        row_layout.setContentsMargins(0, 0, 0, 0)
        row_layout.setSpacing(2)
        line = QHBoxLayout()
        if spec.kind is bool:
            editor = QCheckBox()
            editor.toggled.connect(lambda _=None, n=name: self._edited(n))
        elif spec.choices:
            editor = QComboBox()
            editor.addItems(list(spec.choices))
            editor.currentTextChanged.connect(lambda _=None, n=name: self._edited(n))
        elif name in ("dataset", "model", "teacher_model"):
            editor = QComboBox()
            editor.setEditable(True)
            editor.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
            if name == "dataset":
                editor.addItems(list(form_state.KNOWN_SIZES))
            else:
                editor.addItem("auto")
            editor.currentTextChanged.connect(lambda _=None, n=name: self._edited(n))
        else:
            editor = QLineEdit()
            if spec.optional:
                editor.setPlaceholderText("unset")
            editor.textChanged.connect(lambda _=None, n=name: self._edited(n))
        editor.setObjectName(f"field_{name}")
        editor.setToolTip(self._tooltip(spec))
        line.addWidget(editor, 1)
        if name == "dataset":
            browse = QPushButton("File…")
            browse.setToolTip("Choose a .csv or .npz file")
            browse.clicked.connect(self._choose_data_file)
            line.addWidget(browse)
        elif name == "data_dir":
            browse = QPushButton("Folder…")
            browse.clicked.connect(self._choose_data_dir)
            line.addWidget(browse)
        if spec.unit and spec.kind is not bool:
            unit = QLabel(spec.unit)
            unit.setEnabled(False)
            unit.setMinimumWidth(unit.sizeHint().width())
            line.addWidget(unit)
        row_layout.addLayout(line)
        error = QLabel("")
        error.setObjectName(f"error_{name}")
        error.setWordWrap(True)
        error.setStyleSheet(f"color: {ERROR_COLOUR};")
        error.hide()
        row_layout.addWidget(error)
        label = QLabel(spec.label)
        label.setToolTip(spec.help)
        label.setBuddy(editor)
        layout.addRow(label, row)
        self.fields[name] = _Field(name, spec, row, editor, error, label)

    @staticmethod
    def _tooltip(spec: Any) -> str:
        return f"{spec.help}\nAllowed: {spec.allowed()}" + (f" ({spec.unit})" if spec.unit else "")

    # ---- values --------------------------------------------------------------------------------
    def texts(self) -> dict[str, str]:
        return dict(self.state.texts)

    def set_texts(self, texts: dict[str, str]) -> None:
        for name, text in texts.items():
            if name in self.state.texts and isinstance(text, str):
                self.state.set_text(name, text)
        self._load_state_into_widgets()
        self.revalidate()

    def load_config(self, config: RunConfig) -> None:
        self.state.load_config(config)
        self._load_state_into_widgets()
        self.revalidate()

    def set_value(self, name: str, value: Any) -> None:
        """Set one field as a user would (text in its widget), then revalidate."""
        self.fields[name].set_text(form_state.to_text(name, value) if not isinstance(value, str) else value)
        self._edited(name)

    def _load_state_into_widgets(self) -> None:
        for name, f in self.fields.items():
            f.set_text(self.state.texts[name])
        self._apply_mechanism()

    def set_model_fits(self, fits: dict[str, tuple[tuple[int, ...], list[str]]]) -> None:
        """Which models fit each registered dataset (from the engine probe); revalidates."""
        self.state.model_fits = dict(fits)
        self.revalidate()

    def set_choices(self, name: str, items: list[str]) -> None:
        """Fill an editable combo (datasets, models) with the engine's registry."""
        editor = self.fields[name].editor
        assert isinstance(editor, QComboBox)
        text = editor.currentText()
        editor.blockSignals(True)
        editor.clear()
        editor.addItems(items)
        editor.setEditText(text)
        editor.blockSignals(False)

    # ---- validation ----------------------------------------------------------------------------
    def _edited(self, name: str) -> None:
        self.state.set_text(name, self.fields[name].text())
        if name in ("mechanism", "aggregator"):
            self._apply_mechanism()
        self.revalidate()

    def _apply_mechanism(self) -> None:
        visible = set(self.state.visible())
        for name, f in self.fields.items():
            _, layout = self.groups[f.spec.group]
            layout.setRowVisible(f.widget, name in visible)
        for group, (box, _) in self.groups.items():
            box.setVisible(any(n in visible for n, f in self.fields.items() if f.spec.group == group))

    def revalidate(self) -> None:
        size = self.state.data_size()
        self.errors = self.state.errors(size)
        for name, f in self.fields.items():
            error = self.errors.get(name)
            invalid = error is not None
            f.editor.setProperty("invalid", invalid)
            f.editor.setStyleSheet(INVALID_STYLE if invalid else "")
            if invalid:
                text = error.message + (f" — {error.hint}" if error.hint else "")
                f.error.setText(text)
                f.editor.setToolTip(text + "\n\n" + self._tooltip(f.spec))
            else:
                f.editor.setToolTip(self._tooltip(f.spec))
            f.error.setVisible(invalid)
        hidden = [n for n in self.errors if n not in self.fields]
        valid = not self.errors
        if valid:
            self.summary.setText("")
        else:
            first = next(iter(self.errors.values()))
            more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
            self.summary.setText(f"Cannot start: {first.message}{more}" + (f" [{', '.join(hidden)}]" if hidden else ""))
        self.start_button.setEnabled(valid)
        self.start_button.setToolTip("" if valid else self.summary.text())
        if valid != self.valid:
            self.valid = valid
        self.validity_changed.emit(valid)
        if valid:
            config = self.state.config()
            reason = "" if size else "The privacy cost is shown for registered datasets; for a file it is " \
                                     "known once the runner has loaded it (see the run's plan)."
            self.preview.request(config, size, reason)
            if size is not None:
                self.preview_label.setText(self.preview_label.text() or "Estimating…")
        else:
            self.preview.request(None, None, "Fix the settings marked in red to see the privacy cost.")

    def _show_preview(self, text: str) -> None:
        self.preview_label.setText(text)

    def config(self) -> RunConfig:
        return self.state.config()

    def request_start(self) -> None:
        if not self.valid:
            return
        self.start_requested.emit(self.state.config())

    # ---- file choosers -------------------------------------------------------------------------
    def _choose_data_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a data file", str(Path.home()), DATA_FILE_FILTER)
        if path:
            self.set_value("dataset", path)

    def _choose_data_dir(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose the data folder", str(Path.home()))
        if path:
            self.set_value("data_dir", path)
