"""The setup panel: a form generated from `engine.config.config_fields()`.

One widget per field, grouped by `FieldSpec.group`, showing only the fields the run will read
(engine.settings_in_effect). Every invalid field is marked at once (red frame, a mark beside it)
and every problem is listed in a fixed-height panel under the form, so nothing moves while the
user types; Start stays disabled until the whole config is valid. A live preview, also of fixed
height, states the privacy cost of the settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QBoxLayout,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import isValid

from engine.config import RunConfig
from engine.errors import ConfigError, DPWError
from workbench import form_state
from workbench.form_state import GROUP_TITLES, DataSize, FormState
from workbench.preview import CostPreview

ERROR_COLOUR = "#d62728"
INVALID_MARK = "\u26a0"  # a warning sign beside an invalid field: marked without colour alone
PREVIEW_LINES = 6  # the preview's fixed height, in lines (longer text scrolls inside it)
PROBLEM_ROWS = 4  # the problems panel's fixed height, in rows (more scroll inside it)
NO_PROBLEMS = "Every setting is valid."
DATA_FILE_FILTER = "Data files (*.csv *.npz);;CSV tables (*.csv);;NumPy arrays (*.npz)"
TEST_FILE_FILTER = "CSV tables (*.csv)"
# The settings a file or folder dataset's training and test sizes depend on (besides the data itself).
SIZE_SETTINGS = ("data_dir", "label_column", "test_data", "test_fraction", "seed", "train_subset")
SIZE_READ_DELAY_MS = 400  # a typed path is read once it has not changed for this long


def _frame_style(name: str, *, invalid: bool) -> str:
    """The holder's border: the same width either way, red only when the field is invalid."""
    return (f"QFrame#frame_{name} {{ border: 2px solid {ERROR_COLOUR if invalid else 'transparent'}; "
            "border-radius: 3px; }")


class _Field:
    """One row: the input widget, its invalid mark (a label of fixed width, blank while valid), its
    unit, label and the row's container; `message` is what is wrong with it ('' while valid)."""

    def __init__(self, name: str, spec: Any, widget: QWidget, editor: QWidget, mark: QLabel, label: QLabel,
                 unit: QLabel | None):
        self.name, self.spec, self.widget, self.editor, self.mark, self.label = name, spec, widget, editor, mark, label
        self.unit = unit
        self.frame: QFrame | None = None  # draws the red border of an invalid field
        self.message = ""

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
                # A value that is none of the choices (a config file's 'adamw') shows as no choice, marked,
                # not as the first one: any choice the user then makes is a change.
                w.setCurrentIndex(index if index >= 0 or text.strip() else 0)
        else:
            w.setText(text)
        w.blockSignals(False)


class ElidedLabel(QLabel):
    """One line that never grows: a text wider than the label ends in '…' (the whole text is its
    tooltip), so a long message cannot move or widen anything."""

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.full_text = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt naming)
        self.full_text = text
        self.setToolTip(text)
        self._elide()

    def text(self) -> str:
        return self.full_text

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        shown = self.fontMetrics().elidedText(self.full_text, Qt.TextElideMode.ElideRight, max(self.width(), 40))
        super().setText(shown)


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
        self._showing_estimate = False  # the preview shows an estimate (not a reason why there is none)
        self._shown: set[str] = set()  # the fields shown now
        self.preview = CostPreview(self)
        self.preview.ready.connect(self._show_preview)
        # How a file or folder dataset's size is read (the window's pre-run check helper); None: not read.
        self.size_lookup: Callable[[RunConfig], tuple[int, int] | DPWError] | None = None
        self._read_sizes: dict[tuple, DataSize | DPWError] = {}  # by _own_data_key
        self._reading: Any = None  # the task reading a size, kept until it reports
        self._size_wanted: tuple[tuple, RunConfig] | None = None  # read once the path stops changing
        self._size_timer = QTimer(self)
        self._size_timer.setSingleShot(True)
        self._size_timer.setInterval(SIZE_READ_DELAY_MS)
        self._size_timer.timeout.connect(self._start_size_read)

        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        body = QWidget()
        self.body_layout = QVBoxLayout(body)
        scroll.setWidget(body)
        outer.addWidget(scroll, 1)

        # Two columns side by side, one under the other where the form is narrower than both need (an
        # 800x600 window pushed the whole Privacy column behind a horizontal scroll bar).
        self.columns = QBoxLayout(QBoxLayout.Direction.LeftToRight)
        left, right = QVBoxLayout(), QVBoxLayout()
        self.columns.addLayout(left, 1)
        self.columns.addLayout(right, 1)
        self.body_layout.addLayout(self.columns)
        self._column_layouts = (left, right)
        placement = {"run": left, "data": left, "model": left, "privacy": right, "training": right, "pate": right}
        for name, _, spec in form_state.config_fields():
            if spec.group not in self.groups:
                box = QGroupBox(GROUP_TITLES.get(spec.group, spec.group.title()))
                layout = QFormLayout(box)
                layout.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
                self.groups[spec.group] = (box, layout)
                placement.get(spec.group, left).addWidget(box)
            self._add_field(name, spec)
        self.groups["privacy"][1].addRow(self._build_preview())
        left.addStretch(1)
        right.addStretch(1)

        # Messages live under the form at a fixed height: a new or longer one never moves a field.
        self.problems = QListWidget()
        self.problems.setObjectName("problems")
        self.problems.setWordWrap(True)
        self.problems.setFixedHeight(self._rows_height(self.problems, PROBLEM_ROWS))
        self.problems.itemClicked.connect(self._focus_problem)
        self.problems.setToolTip("Every setting that stops the run from starting; click one to go to its field.")
        outer.addWidget(self.problems)
        footer = QHBoxLayout()
        self.summary = ElidedLabel("")
        self.summary.setObjectName("summary")
        self.summary.setStyleSheet(f"color: {ERROR_COLOUR};")
        self.start_button = QPushButton("Start run")
        self.start_button.setDefault(True)
        self.start_button.clicked.connect(self.request_start)
        footer.addWidget(self.summary, 1)
        footer.addWidget(self.start_button)
        outer.addLayout(footer)
        self._load_state_into_widgets()
        self.revalidate()

    def _build_preview(self) -> QWidget:
        """The cost preview: a label in a frame of fixed height (PREVIEW_LINES lines; a longer text
        scrolls inside), so its changing text never moves the fields below it."""
        self.preview_label = QLabel("")
        self.preview_label.setWordWrap(True)
        self.preview_label.setObjectName("costPreview")
        self.preview_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.preview_label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self.preview_label.setMargin(6)
        frame = QScrollArea()
        frame.setObjectName("costPreviewFrame")
        frame.setWidgetResizable(True)
        frame.setFrameShape(QFrame.Shape.StyledPanel)
        frame.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        frame.setWidget(self.preview_label)
        frame.setFixedHeight(PREVIEW_LINES * self.fontMetrics().lineSpacing() + 2 * 6 + 4)
        return frame

    @staticmethod
    def _rows_height(view: QListWidget, rows: int) -> int:
        return rows * (view.fontMetrics().lineSpacing() + 4) + 2 * view.frameWidth() + 4

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
        # The red frame of an invalid field is drawn by a holder whose border is always 2 px (clear
        # while valid): marking a field never changes its size, so nothing below it moves.
        holder = QFrame()
        holder.setObjectName(f"frame_{name}")
        holder.setStyleSheet(_frame_style(name, invalid=False))
        holder_layout = QHBoxLayout(holder)
        holder_layout.setContentsMargins(0, 0, 0, 0)
        holder_layout.addWidget(editor)
        line.addWidget(holder, 1)
        for text, object_name, tip, slot in self._choosers(name):
            chooser = QPushButton(text)
            chooser.setObjectName(object_name)
            chooser.setToolTip(tip)
            chooser.clicked.connect(slot)
            line.addWidget(chooser)
        unit = None
        if spec.unit and spec.kind is not bool:
            unit = QLabel(spec.unit)
            unit.setObjectName(f"unit_{name}")
            # Wide enough for the glyphs' ink (an italic ε overhangs its advance) and never squeezed.
            metrics = unit.fontMetrics()
            ink = max(metrics.horizontalAdvance(spec.unit), metrics.boundingRect(spec.unit).width())
            unit.setMinimumWidth(max(unit.sizeHint().width(), ink + 4))
            unit.setSizePolicy(QSizePolicy.Policy.Minimum, QSizePolicy.Policy.Preferred)
            line.addWidget(unit)
        mark = QLabel("")
        mark.setObjectName(f"mark_{name}")
        mark.setStyleSheet(f"color: {ERROR_COLOUR}; font-weight: bold;")
        mark.setFixedWidth(mark.fontMetrics().horizontalAdvance(INVALID_MARK) + 6)
        line.addWidget(mark)
        row_layout.addLayout(line)
        label = QLabel(spec.label)
        label.setToolTip(spec.help)
        label.setBuddy(editor)
        layout.addRow(label, row)
        self.fields[name] = _Field(name, spec, row, editor, mark, label, unit)
        self.fields[name].frame = holder

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

    def load_values(self, values: dict[str, Any]) -> None:
        """A config file's values that do not make a valid config, as far as they go: the form's
        defaults, then each known setting's value as its text (wrong ones are then marked)."""
        self.state.load_values(values)
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

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt naming)
        super().resizeEvent(event)
        self._fit_columns()

    def _fit_columns(self) -> None:
        """The two columns side by side where both fit, else one under the other."""
        needed = sum(column.minimumSize().width() for column in self._column_layouts) + 48  # margins, scroll bar
        direction = (QBoxLayout.Direction.TopToBottom if self.width() < needed
                     else QBoxLayout.Direction.LeftToRight)
        if self.columns.direction() != direction:
            self.columns.setDirection(direction)

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
        if name == "dataset":
            self._read_sizes.clear()  # choosing (or typing) the dataset again reads it again
        if set(self.state.visible()) != self._shown:
            self._apply_mechanism()
        self.revalidate()

    def _apply_mechanism(self) -> None:
        """Show the fields the run will read (mechanism, aggregator, optimizer and dataset decide)."""
        visible = set(self.state.visible())
        self._shown = visible
        # Next to "Teacher model", the released model is named for what it is.
        model = self.fields["model"]
        model.label.setText("Student model" if self.state.mechanism == "pate" else model.spec.label)
        for name, f in self.fields.items():
            _, layout = self.groups[f.spec.group]
            layout.setRowVisible(f.widget, name in visible)
        for group, (box, _) in self.groups.items():
            box.setVisible(any(n in visible for n, f in self.fields.items() if f.spec.group == group))

    def revalidate(self) -> None:
        size = self.state.data_size()
        own_data = self._own_data_key() if size is None else None
        read = self._read_sizes.get(own_data) if own_data else None
        if isinstance(read, DataSize):
            size = read
        self.errors = self.state.errors(size)
        for name, f in self.fields.items():
            error = self.errors.get(name)
            invalid = error is not None
            f.message = self._message(error) if invalid else ""
            if f.editor.property("invalid") != invalid:
                f.editor.setProperty("invalid", invalid)
                f.frame.setStyleSheet(_frame_style(name, invalid=invalid))
            f.mark.setText(INVALID_MARK if invalid else "")
            f.mark.setToolTip(f.message)
            f.editor.setToolTip((f.message + "\n\n" if invalid else "") + self._tooltip(f.spec))
        self._list_problems()
        valid = not self.errors
        if valid:
            self.summary.setText("")
        else:
            lines = self._problem_lines()
            count = f" ({len(lines)} settings to fix, listed above)" if len(lines) > 1 else ""
            self.summary.setText(f"Cannot start{count}: {lines[0]}")
        self.start_button.setEnabled(valid)
        self.start_button.setToolTip("" if valid else "\n".join(self._problem_lines()))
        self.valid = valid
        self.validity_changed.emit(valid)
        if valid:
            config = self.state.config()
            if isinstance(read, DPWError):
                self.preview.request(None, None, f"Cannot read the dataset: {self._message(read)}")
            elif size is None and own_data and self.size_lookup is not None:
                self.preview.request(None, None, "Reading the dataset to state the privacy cost…")
                self._read_size(own_data, config)
            elif size is None:
                self.preview.request(config, None, "The privacy cost is shown for registered datasets; for a file "
                                     "it is known once the runner has loaded it (see the run's plan).")
            else:
                if not self._showing_estimate:
                    # Replace a message about invalid settings at once; an older estimate stays until
                    # the new one arrives (no flicker while typing), greyed out: it is of the old settings.
                    self._set_preview("Estimating the privacy cost…", estimate=False)
                else:
                    self.preview_label.setEnabled(False)
                    self.preview_label.setToolTip("Updating for the settings just changed…")
                self.preview.request(config, size)
        else:
            self.preview.request(None, None, "Fix the settings marked " + INVALID_MARK
                                 + " (listed under the form) to see the privacy cost.")

    @staticmethod
    def _message(error: DPWError) -> str:
        return error.message + (f" — {error.hint}" if error.hint else "")

    # ---- the size of a file or folder dataset --------------------------------------------------
    def _own_data_key(self) -> tuple | None:
        """What a file or folder dataset's size depends on: the path as it is now (its modification
        time) and the settings that split or subset it. None when the dataset is not such a path."""
        values = self.state.values()
        text = str(values.get("dataset") or "").strip()
        path = Path(text).expanduser()
        if not text or not path.is_absolute() or not path.exists():
            return None
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            return None
        return (str(path), stamp, *(values.get(name) for name in SIZE_SETTINGS))

    def _read_size(self, key: tuple, config: RunConfig) -> None:
        """Have the engine read the dataset for this key once the path has stopped changing for a
        moment (not every folder on the way while a path is typed), off the GUI thread."""
        if self._reading is not None and self._reading.key == key:
            return
        self._size_wanted = (key, config)
        self._size_timer.start()

    def _start_size_read(self) -> None:
        from workbench.dialogs import start_task

        if self._size_wanted is None or self._size_wanted[0] != self._own_data_key():
            return  # changed since: its own revalidation asked again
        (key, config), self._size_wanted = self._size_wanted, None
        lookup = self.size_lookup

        def read() -> DataSize | DPWError:
            found = lookup(config)
            return found if isinstance(found, DPWError) else DataSize(found[0], found[1], exact=True)

        def done(result: DataSize | DPWError) -> None:
            if not isValid(self):  # the window closed while the data was read
                return
            self._read_sizes[key] = result
            if self._reading is task:
                self._reading = None
            if self._own_data_key() == key:
                self.revalidate()

        def failed(exc: BaseException) -> None:
            done(exc if isinstance(exc, DPWError) else DPWError(f"{type(exc).__name__}: {exc}"))

        task = start_task(read, done, failed)
        task.key = key
        self._reading = task

    def _problem_lines(self) -> list[str]:
        """One line per problem, in form order, each naming its field by the form's label."""
        order = {name: i for i, name in enumerate(self.fields)}
        lines = []
        for name in sorted(self.errors, key=lambda n: order.get(n, len(order))):
            label = self.fields[name].spec.label if name in self.fields else name
            text = self._message(self.errors[name]).removeprefix(f"{name}: ")
            lines.append(f"{label} ({name}): {text}")
        return lines

    def _list_problems(self) -> None:
        order = {name: i for i, name in enumerate(self.fields)}
        self.problems.clear()
        for name, line in zip(sorted(self.errors, key=lambda n: order.get(n, len(order))), self._problem_lines()):
            item = QListWidgetItem(f"{INVALID_MARK} {line}")
            item.setData(Qt.ItemDataRole.UserRole, name)
            item.setToolTip(line)
            self.problems.addItem(item)
        if not self.errors:
            item = QListWidgetItem(NO_PROBLEMS)
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            self.problems.addItem(item)

    def _focus_problem(self, item: QListWidgetItem) -> None:
        field = self.fields.get(item.data(Qt.ItemDataRole.UserRole) or "")
        if field is not None and field.widget.isVisibleTo(self):
            field.editor.setFocus(Qt.FocusReason.OtherFocusReason)

    def show_start_problem(self, error: Exception) -> None:
        """What the pre-run check (which loads the data) found: at the top of the problems list and
        in the summary, and marked at its field when it names a shown one, until the next edit."""
        from workbench.dialogs import describe_error

        name = getattr(error, "field", None)
        text = describe_error(error).replace("\n", " — ")
        field = self.fields.get(name or "")
        if field is not None and field.widget.isVisibleTo(self):
            field.message = text
            field.mark.setText(INVALID_MARK)
            field.mark.setToolTip(text)
            field.editor.setProperty("invalid", True)
            field.frame.setStyleSheet(_frame_style(name, invalid=True))
            text = f"{field.spec.label} ({name}): " + text.removeprefix(f"{name}: ")
        if not self.errors:
            self.problems.clear()
        item = QListWidgetItem(f"{INVALID_MARK} {text}")
        item.setData(Qt.ItemDataRole.UserRole, name)
        item.setToolTip(text)
        self.problems.insertItem(0, item)
        self.summary.setText(f"Not started: {text}")

    def _set_preview(self, text: str, *, estimate: bool) -> None:
        self._showing_estimate = estimate
        self.preview_label.setText(text)
        self.preview_label.setEnabled(True)  # current again
        self.preview_label.setToolTip("")

    def _show_preview(self, text: str, estimate: bool = False) -> None:
        self._set_preview(text, estimate=estimate)

    def config(self) -> RunConfig:
        return self.state.config()

    def request_start(self) -> None:
        if not self.valid:
            return
        try:
            config = self.state.config()
        except ConfigError:  # a rule the live check missed: shown on the form, never an exception in a slot
            self.revalidate()
            self.valid = False
            self.start_button.setEnabled(False)
            return
        self.start_requested.emit(config)

    # ---- file choosers -------------------------------------------------------------------------
    def _choosers(self, name: str) -> list[tuple[str, str, str, Callable[[], None]]]:
        """The buttons beside a path field: (text, object name, tooltip, slot)."""
        if name == "dataset":
            return [("File…", "chooseDataFile", "Choose a .csv table or an .npz archive (x, y) as the dataset",
                     self._choose_data_file),
                    ("Folder…", "chooseDataFolder", "Choose a folder as the dataset: images in one sub-folder per "
                     "class, or x.npy and y.npy (read from disk as training goes, so it may be larger than memory)",
                     self._choose_data_folder)]
        if name == "test_data":
            return [("File…", "chooseTestDataFile", "For a CSV dataset: choose a .csv table of held-out examples "
                     "with the dataset's columns", self._choose_test_data_file),
                    ("Folder…", "chooseTestDataFolder", "For an image folder: choose the folder of test images, "
                     "one sub-folder per class as in the dataset", self._choose_test_data_folder)]
        if name == "data_dir":
            return [("Folder…", "chooseDataDir", "Choose the folder that holds the registered datasets' files "
                     "(mnist/, cifar10/ …)", self._choose_data_dir)]
        return []

    def _choose_data_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a data file", self._start_folder("dataset"),
                                              DATA_FILE_FILTER)
        if path:
            self.set_value("dataset", path)

    def _choose_test_data_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose the held-out examples (CSV)", self._test_data_start(),
                                              TEST_FILE_FILTER)
        if path:
            self.set_value("test_data", path)

    def _choose_test_data_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose the folder of test images (a sub-folder per class)",
                                                self._test_data_start())
        if path:
            self.set_value("test_data", path)

    def _test_data_start(self) -> str:
        """Where the test data chooser opens: beside the test data chosen, else beside the dataset (held-out
        examples are usually kept next to it)."""
        return self._start_folder("test_data" if self.state.texts.get("test_data", "").strip() else "dataset")

    def _choose_data_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose a dataset folder (a sub-folder per class, or x.npy "
                                                "and y.npy)", self._start_folder("dataset"))
        if path:
            self.set_value("dataset", path)

    def _choose_data_dir(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose the data folder", self._start_folder("data_dir"))
        if path:
            self.set_value("data_dir", path)

    def _start_folder(self, name: str) -> str:
        """Where a chooser opens: beside the path the field holds now (a file's or folder's parent),
        else the home folder."""
        value = Path(self.state.texts.get(name, "").strip()).expanduser()
        if str(value) not in ("", ".") and value.parent.is_dir() and value.is_absolute():
            return str(value.parent)
        return str(Path.home())
