"""The main window: runs list on the left; setup, live dashboard, compare and PATE votes on the right."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QItemSelectionModel, QModelIndex, QObject, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QFileDialog,
    QHeaderView,
    QInputDialog,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QSplitter,
    QTableView,
    QTabWidget,
    QToolBar,
    QWidget,
)

from engine.config import RunConfig, paths_from_file, read_toml
from engine.checkpoint import continue_refusal
from engine.errors import ConfigError, DPWError
from workbench.audit_view import AuditView, TheorySource
from workbench.compare import CompareView
from workbench.dashboard import Dashboard
from workbench.closing import CANCEL, KEEP, active_run_label, ask_before_closing, runner_pid, stop_runner
from workbench.dialogs import ExportDialog, ReportDialog, describe_error
from workbench.engine_client import EngineClient
from workbench.precheck_client import PrecheckClient, check_while_painting
from workbench.first_start import first_config
from workbench.form_state import field_names
from workbench.probe import EngineProbe
from workbench.run_data import RunData
from workbench.runs_model import COLUMNS, RunsTable, release_refusal
from workbench.runs_panel import RunsPanel
from workbench.screen import fit_to_screen
from workbench.settings import Settings
from workbench.study_dialog import STUDY_FILTER, StudyPlanDialog, StudyProcess
from workbench.store_client import StoreClient
from workbench.setup_form import SetupForm

ICON_PATH = Path(__file__).resolve().parents[1] / "resources" / "icons" / "dp-workbench.svg"
EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "resources" / "examples"


def first_config_folder() -> Path:
    """Where the first Open config / Study dialog starts, before a folder is remembered: the bundled
    examples (runs and studies to start from), else the working folder."""
    return EXAMPLES_DIR if EXAMPLES_DIR.is_dir() else Path.cwd()


VOTES_REFRESH_MS = 500
LIST_REFRESH_MS = 1500
TOML_FILTER = "Run configs (*.toml)"
COLUMN_MAX_PX = 200
RUNS_VIEW_KEY = "runs/view"  # {"sort", "descending", "show_deleted", "selected"}, remembered between sessions
AUDIT_LOG_KEY = "audit/log_fpr"
EXPORT_TIP = "Export the selected run's model"
REPORT_TIP = "Privacy report of the selected run"
CONTINUE_TIP = ("Continue the selected stopped or failed run from its last checkpoint, as a new run (its ε "
                "covers the steps of both)")


class MainWindow(QMainWindow):
    def __init__(self, db_path: str | Path, *, probe: bool = True):
        super().__init__()
        # The store's path; Qt adds the application display name ("— DP Workbench") itself.
        self.setWindowTitle(str(db_path))
        if ICON_PATH.is_file():
            self.setWindowIcon(QIcon(str(ICON_PATH)))
        # The store is opened by a helper process, never by this one (workbench.store_client says
        # why); it starts while the widgets are built.
        self.store = StoreClient(db_path, on_notice=self._store_notice)
        self.settings = Settings()
        self.client = EngineClient(self.store, parent=self)
        self.client.events.connect(self._on_events)
        self.client.run_started.connect(self._runner_started)
        self.client.run_ended.connect(self._on_run_ended)
        self.client.run_lost.connect(self._on_run_lost)
        self.client.queue_changed.connect(self._update_queue_label)
        self.precheck = PrecheckClient(self.client.environment)  # `dpw run`'s checks before storing
        self._checking = False
        self.run_data: dict[int, RunData] = {}
        self.current_run_id: int | None = None
        self.studies: list[StudyProcess] = []  # tuning studies started from this window

        self._build_widgets()
        self._build_actions()
        self._own_shortcuts = OwnShortcuts(self, [self.act_export])
        QApplication.instance().installEventFilter(self._own_shortcuts)
        self._build_menus()
        self._build_status_bar()
        self.restore_settings()
        self.store.wait_ready()
        self.refresh_runs()
        self._restore_selection()
        self._update_run_actions()

        self.list_timer = QTimer(self)
        self.list_timer.setInterval(LIST_REFRESH_MS)
        self.list_timer.timeout.connect(self._periodic_refresh)
        self.list_timer.start()
        # Votes are stored batch by batch while a PATE run answers queries; re-read them at most
        # twice a second while the votes tab shows that run.
        self.votes_timer = QTimer(self)
        self.votes_timer.setSingleShot(True)
        self.votes_timer.setInterval(VOTES_REFRESH_MS)
        self.votes_timer.timeout.connect(self._refresh_live_votes)

        self.probe = EngineProbe(self.client, self.precheck, self)
        self.probe.ready.connect(self._on_probe)
        self.probe.failed.connect(lambda msg: self.device_label.setText(f"Engine: not available ({msg})"))
        if probe:  # the runner kept loaded for the next run says what the engine offers, once loaded
            self.client.keep_standby()
            self.probe.start()

    # ---- construction --------------------------------------------------------------------------
    def _build_widgets(self) -> None:
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("mainSplitter")
        self.runs_model = RunsTable(self)  # sorted and filtered; rows in view order
        self.runs_view = QTableView()
        self.runs_view.setObjectName("runsView")
        self.runs_view.setModel(self.runs_model)
        self.runs_view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.runs_view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.runs_view.verticalHeader().hide()
        self.runs_view.setWordWrap(False)
        self.runs_view.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.runs_view.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 8)
        self.runs_view.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        # A study's long candidate names are elided (whole in their tooltip): never pushing ε out of view.
        self.runs_view.horizontalHeader().setMaximumSectionSize(COLUMN_MAX_PX)
        # Sized to what the newest rows hold: values that arrive in place (a running run's ε) widen their
        # column too (the header sizes to contents only when rows come or go), from at most 200 rows.
        header = self.runs_view.horizontalHeader()
        header.setResizeContentsPrecision(200)
        self.runs_model.dataChanged.connect(lambda *_: header.resizeSections(QHeaderView.ResizeMode.ResizeToContents))
        self.runs_view.horizontalHeader().setStretchLastSection(True)
        self.runs_view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.runs_view.customContextMenuRequested.connect(self._context_menu)
        self.runs_view.selectionModel().currentRowChanged.connect(self._current_changed)
        self.runs_view.selectionModel().selectionChanged.connect(lambda *_: self._selection_changed())
        self.runs_view.doubleClicked.connect(lambda _: self.tabs.setCurrentWidget(self.dashboard))
        self.runs_panel = RunsPanel(self.runs_view, self.runs_model, load_deleted=self._deleted_runs)
        self.runs_panel.run_notes.tags_edited.connect(self._save_tags)
        self.runs_panel.run_notes.notes_edited.connect(self._save_notes)
        self.splitter.addWidget(self.runs_panel)

        self.tabs = QTabWidget()
        self.tabs.setObjectName("tabs")
        self.form = SetupForm()
        self.form.size_lookup = lambda config: self.precheck.data_size(  # a file or folder's N, for the preview
            config, checked_before=self._checked_fingerprints(config.dataset))
        self.form.start_requested.connect(self.start_run)
        self.dashboard = Dashboard()
        self.theory = TheorySource(self)  # attack figures of the guarantee, computed off this thread
        self.audit = AuditView(self.store.path, self.theory)
        self.audit.environment = self.client.environment  # the runners' variables (data folder)
        self.audit.stored.connect(self._on_audit_stored)
        self.audit.runner_alive = lambda run_id: run_id in self.client.jobs
        self.compare = CompareView(theory=self.theory)
        from workbench.votes_view import VotesView

        self.votes = VotesView()
        self.tabs.addTab(self.form, "Setup")
        self.tabs.addTab(self.dashboard, "Dashboard")
        self.tabs.addTab(self.audit, "Audit")
        self.tabs.addTab(self.compare, "Compare")
        self.tabs.addTab(self.votes, "PATE votes")
        self.tabs.currentChanged.connect(self._tab_changed)
        self.splitter.addWidget(self.tabs)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 3)
        self.setCentralWidget(self.splitter)

    def _action(self, text: str, slot, shortcut: str | QKeySequence.StandardKey | None = None,
                tip: str = "") -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        if tip:
            action.setStatusTip(tip)
            action.setToolTip(tip)
        action.triggered.connect(lambda _=False: slot())
        self.addAction(action)
        return action

    def _build_actions(self) -> None:
        self.act_new = self._action("&New run", self.new_run, "Ctrl+N", "Set up a new run")
        self.act_start = self._action("&Start run", self.form.request_start, "Ctrl+Return",
                                      "Start the run set up in the form (queued if another is running)")
        self.act_stop = self._action("S&top run", self.stop_run, "Ctrl+.",
                                     "Stop the selected run after its current step")
        self.act_continue = self._action("&Continue run", self.continue_run, None, CONTINUE_TIP)
        self.act_study = self._action("St&udy…", self.open_study, "Ctrl+T",
                                      "Open a tuning study (TOML): see its plan and epsilon, then run it")
        self.act_compare = self._action("&Compare selected runs", self.compare_selected, "Ctrl+K",
                                        "Compare the runs selected in the list")
        self.act_export = self._action("&Export…", self.export_run, "Ctrl+E", EXPORT_TIP)
        self.act_report = self._action("&Report…", self.report_run, "Ctrl+R", REPORT_TIP)
        self.act_open = self._action("&Open config…", self.open_config, QKeySequence.StandardKey.Open,
                                     "Load a run config (TOML) into the form")
        self.act_save = self._action("&Save config as…", self.save_config, QKeySequence.StandardKey.Save,
                                     "Save the form as a run config (TOML) for `dpw run`")
        self.act_reuse = self._action("Set up &again from this run", self.reuse_config, None,
                                      "Load the selected run's config into the form")
        self.act_delete = self._action("&Delete run…", self.delete_selected, QKeySequence.StandardKey.Delete,
                                       "Delete the selected runs with their curves, votes and saved models")
        # The Delete key deletes runs only where the runs list has the focus (not while editing a field).
        self.removeAction(self.act_delete)
        self.act_delete.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        self.runs_view.addAction(self.act_delete)
        self.act_rename = self._action("Re&name run…", self.rename_selected, "F2",
                                       "Give the selected run another name (its guarantee is unchanged)")
        self.removeAction(self.act_rename)  # F2 renames where the runs list has the focus, as Delete deletes
        self.act_rename.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        self.runs_view.addAction(self.act_rename)
        self.act_refresh = self._action("Re&fresh", self.refresh_runs, QKeySequence.StandardKey.Refresh)
        self.act_quit = self._action("&Quit", self.quit_by_user, QKeySequence.StandardKey.Quit)
        self.act_setup = self._action("Set&up", lambda: self.tabs.setCurrentWidget(self.form), "Ctrl+1")
        self.act_dash = self._action("&Dashboard", lambda: self.tabs.setCurrentWidget(self.dashboard), "Ctrl+2")
        self.act_votes = self._action("PATE &votes", lambda: self.tabs.setCurrentWidget(self.votes), "Ctrl+3")
        self.act_audit = self._action("&Audit", lambda: self.tabs.setCurrentWidget(self.audit), "Ctrl+4",
                                      "What the selected run's guarantee means for an attacker, and its audit")
        self.act_ledger = self._action("Privacy &ledger…", self.show_ledger, "Ctrl+L",
                                       "The privacy spent on each dataset by all its runs, deleted ones included")
        self.form.validity_changed.connect(self.act_start.setEnabled)
        self.act_start.setEnabled(self.form.valid)

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        for action in (self.act_open, self.act_save, None, self.act_quit):
            file_menu.addSeparator() if action is None else file_menu.addAction(action)
        run_menu = bar.addMenu("&Run")
        run_menu.setToolTipsVisible(True)  # a disabled action's tooltip says why (Continue run, Export, Report)
        for action in (self.act_new, self.act_start, self.act_stop, self.act_continue, None, self.act_study, None,
                       self.act_export,
                       self.act_report, self.act_reuse, None, self.act_rename, self.act_delete):
            run_menu.addSeparator() if action is None else run_menu.addAction(action)
        self.toolbar = QToolBar("Main toolbar", self)
        self.toolbar.setObjectName("mainToolbar")  # saveState keeps where the user put it
        for action in (self.act_new, self.act_start, self.act_stop, self.act_study, self.act_compare):
            self.toolbar.addAction(action)
        self.addToolBar(self.toolbar)
        view_menu = bar.addMenu("&View")
        for action in (self.act_setup, self.act_dash, self.act_votes, self.act_audit, self.act_compare, None,
                       self.act_ledger, None, self.act_refresh):
            view_menu.addSeparator() if action is None else view_menu.addAction(action)

    def _build_status_bar(self) -> None:
        self.device_label = QLabel("Engine device: checking…")
        self.queue_label = QLabel("")
        self.statusBar().addPermanentWidget(self.queue_label)
        self.statusBar().addPermanentWidget(self.device_label)

    # ---- settings ------------------------------------------------------------------------------
    def restore_settings(self) -> None:
        s = self.settings
        geometry = s.bytes("window/geometry")
        if geometry is None or not self.restoreGeometry(geometry):
            fit_to_screen(self, 1400, 900)
        state = s.bytes("window/state")
        if state is not None:
            self.restoreState(state)
        split = s.bytes("window/splitter")
        if split is not None:
            self.splitter.restoreState(split)
        else:
            self.splitter.setSizes([520, 980])
        compare_split = s.bytes("compare/splitter")
        if compare_split is not None:
            self.compare.splitter.restoreState(compare_split)
        texts = s.json("setup/texts")
        if isinstance(texts, dict):
            self.form.set_texts(texts)
        elif (first := first_config()).is_file():  # a first start: a quick real run that works here
            try:
                self.form.load_config(RunConfig.load_toml(first))
            except DPWError:
                pass
        tab = s.json("window/tab", 0)
        if isinstance(tab, int) and 0 <= tab < self.tabs.count():
            self.tabs.setCurrentIndex(tab)
        view = s.json(RUNS_VIEW_KEY, {})
        view = view if isinstance(view, dict) else {}
        keys = [key for key, _ in COLUMNS]
        if view.get("sort") in keys:
            order = Qt.SortOrder.DescendingOrder if view.get("descending") else Qt.SortOrder.AscendingOrder
            self.runs_view.sortByColumn(keys.index(view["sort"]), order)
        self.runs_panel.show_deleted.setChecked(bool(view.get("show_deleted")))
        self.audit.log_fpr.setChecked(bool(s.json(AUDIT_LOG_KEY, self.audit.log_fpr.isChecked())))

    def _restore_selection(self) -> None:
        """The run selected when the window last closed, if the store still has it; else the newest run
        listed (a run trained with `dpw run`, then `dpw gui`, opens on that run)."""
        selected = (self.settings.json(RUNS_VIEW_KEY, {}) or {}).get("selected")
        if isinstance(selected, int) and self.runs_model.row_of(selected) is not None:
            self.select_run(selected)
        elif listed := [self.runs_model.run_at(row)["id"] for row in range(self.runs_model.rowCount())]:
            self.select_run(max(listed))

    def save_settings(self) -> None:
        s = self.settings
        s.set_bytes("window/geometry", self.saveGeometry())
        s.set_bytes("window/state", self.saveState())
        s.set_bytes("window/splitter", self.splitter.saveState())
        s.set_bytes("compare/splitter", self.compare.splitter.saveState())
        s.set_json("setup/texts", self.form.texts())
        s.set_json("window/tab", self.tabs.currentIndex())
        s.set_json(RUNS_VIEW_KEY, {"sort": COLUMNS[self.runs_model.sortColumn()][0]
                                   if 0 <= self.runs_model.sortColumn() < len(COLUMNS) else "id",
                                   "descending": self.runs_model.sortOrder() == Qt.SortOrder.DescendingOrder,
                                   "show_deleted": self.runs_panel.show_deleted.isChecked(),
                                   "selected": self.current_run_id})
        s.set_json(AUDIT_LOG_KEY, self.audit.log_fpr.isChecked())
        s.sync()

    def quit_by_user(self) -> None:
        """File > Quit: like the window's close button, it asks about runs still going."""
        self._closed_by_user = True
        try:
            self.close()
        finally:
            self._closed_by_user = False

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        # Only a person closing the window is asked (close button, Quit); a close from code stops the runs.
        by_user = event.spontaneous() or getattr(self, "_closed_by_user", False)
        running = [i for i, job in self.client.jobs.items() if job.finished_status is None]  # not yet ended
        studies = [study for study in self.studies if study.running()]
        if by_user and (running or self.client.queue or studies):
            names = {r["id"]: active_run_label(r) for r in self.runs_model.rows}
            choice = ask_before_closing(self, [names.get(i, str(i)) for i in running],
                                        [names.get(i, str(i)) for i in self.client.queue],
                                        [study.label() for study in studies])
            if choice == CANCEL:
                event.ignore()
                return
            if choice == KEEP:
                self.client.detach()
        self.save_settings()
        if self.client.active_ids():
            self.statusBar().showMessage("Stopping runs…")
        self.client.shutdown()
        for study in self.studies:
            study.shutdown()  # stopped, not killed: it records what it spent (engine.study)
        self.audit.shutdown()
        self.list_timer.stop()
        self.dashboard.timer.stop()
        self.precheck.close()  # a probe or a check still waiting on its helper is cut short
        self.store.close()
        super().closeEvent(event)

    def _store_notice(self, text: str) -> None:
        """The store helper was restarted, or the store file was replaced and opened again."""
        self.statusBar().showMessage(text, 15000)

    # ---- engine probe --------------------------------------------------------------------------
    def _on_probe(self, result: dict[str, Any]) -> None:
        name = result.get("device_name")
        self.device_label.setText(f"Engine device: {result['device']}" + (f" ({name})" if name else ""))
        self.device_label.setToolTip(f"torch {result.get('torch')}; runs with device 'auto' use this")
        datasets = [d["name"] for d in result.get("datasets", [])]
        if datasets:
            self.form.set_choices("dataset", datasets)
        models = ["auto"] + [m["name"] for m in result.get("models", [])]
        self.form.set_choices("model", models)
        self.form.set_choices("teacher_model", models)
        self.form.set_model_fits({d["name"]: (tuple(d["input_shape"]), d["models"])
                                  for d in result.get("datasets", []) if d.get("models") is not None})

    # ---- runs list -----------------------------------------------------------------------------
    def refresh_runs(self) -> None:
        try:
            rows = self.store.list_runs()
        except Exception as exc:  # a locked or damaged file is reported, the window keeps going
            self.statusBar().showMessage(f"Cannot read {self.store.path}: {describe_error(exc)}", 10000)
            return
        self.runs_model.set_rows(rows)
        for row in rows:
            if (data := self.run_data.get(row["id"])) is None:
                continue
            if row.get("study"):  # a study's status and epsilon change what its runs may state
                data.set_study(row["study"])
            if row.get("name") and data.name != row["name"]:  # renamed (here, or `dpw rename`)
                data.name = row["name"]
                data.version += 1
        self.runs_panel.show_run(self._listed_row(self.current_run_id))
        self.runs_panel.refresh_deleted()
        if self.tabs.currentWidget() is self.audit:
            self.audit.show_run(self._listed_row(self.current_run_id))  # redraws only when the row changed
        if self.current_run_id is not None:
            row = self.runs_model.row_of(self.current_run_id)
            if row is None and not self.client.is_active(self.current_run_id):
                self._forget_run(self.current_run_id)  # deleted elsewhere (`dpw delete`)
            elif row is not None and not self.runs_view.selectionModel().isRowSelected(row, QModelIndex()):
                self._select_row(row)
        self._update_run_actions()  # statuses may have changed (no store read)

    def _periodic_refresh(self) -> None:
        """Keep the list current, and follow a run another process (`dpw run`) is executing."""
        if not self.isVisible():
            return
        self.refresh_runs()
        run_id = self.current_run_id
        if run_id is None or self.client.is_active(run_id):
            return
        row = self.runs_model.row_of(run_id)
        data = self.run_data.get(run_id)
        if row is not None and data is not None and not data.finished:
            fresh = RunData.from_store(self.store, run_id)
            self.run_data[run_id] = fresh
            if self.dashboard.data is data:
                self.dashboard.update_data(fresh)

    def _select_row(self, row: int) -> None:
        index = self.runs_model.index(row, 0)
        self.runs_view.selectionModel().setCurrentIndex(
            index, QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows)

    def select_run(self, run_id: int) -> None:
        row = self.runs_model.row_of(run_id)
        if row is not None:
            self._select_row(row)

    def select_runs(self, run_ids: list[int]) -> None:
        sel = self.runs_view.selectionModel()
        sel.clearSelection()
        for run_id in run_ids:
            row = self.runs_model.row_of(run_id)
            if row is not None:
                sel.select(self.runs_model.index(row, 0),
                           QItemSelectionModel.SelectionFlag.Select | QItemSelectionModel.SelectionFlag.Rows)
        if run_ids:
            row = self.runs_model.row_of(run_ids[0])
            if row is not None:
                sel.setCurrentIndex(self.runs_model.index(row, 0), QItemSelectionModel.SelectionFlag.NoUpdate)
                self._show_run(run_ids[0])

    def selected_ids(self) -> list[int]:
        rows = sorted({i.row() for i in self.runs_view.selectionModel().selectedRows()})
        return [self.runs_model.run_at(r)["id"] for r in rows]

    def _current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if current.isValid():
            self._show_run(self.runs_model.run_at(current.row())["id"])

    def _selection_changed(self) -> None:
        self._update_run_actions()
        if self.tabs.currentWidget() is self.compare:
            self.compare_selected(switch=False)

    def _tab_changed(self, _index: int) -> None:
        if self.tabs.currentWidget() is self.compare:
            self.compare_selected(switch=False)
        elif self.tabs.currentWidget() is self.votes and self.current_run_id is not None:
            self._show_votes(self.current_run_id)
        elif self.tabs.currentWidget() is self.audit:
            self.audit.show_run(self._listed_row(self.current_run_id))

    def data_for(self, run_id: int) -> RunData:
        """The run's curves: live ones while the window follows it, else replayed from the store."""
        data = self.run_data.get(run_id)
        if data is None or (not self.client.is_active(run_id) and not data.finished):
            data = RunData.from_store(self.store, run_id)
            self.run_data[run_id] = data
        return data

    def _show_run(self, run_id: int) -> None:
        self.current_run_id = run_id
        try:
            data = self.data_for(run_id)
        except DPWError as exc:
            self.statusBar().showMessage(describe_error(exc), 10000)
            return
        if self.dashboard.data is not data:
            self.dashboard.show_run(data)
        self.runs_panel.show_run(self._listed_row(run_id))
        if self.tabs.currentWidget() is self.votes:
            self._show_votes(run_id)
        elif self.tabs.currentWidget() is self.audit:
            self.audit.show_run(self._listed_row(run_id))
        self._update_run_actions()

    def _show_votes(self, run_id: int) -> None:
        try:
            run = self.store.get_run(run_id)
        except DPWError:
            run = None
        self.votes.show_run(self.store, run)

    def _update_run_actions(self) -> None:
        run_id = self.current_run_id
        active = run_id is not None and self.client.is_active(run_id)
        row = self._listed_row(run_id)
        elsewhere = not active and runner_pid(row) is not None  # a runner this window did not start
        self.act_stop.setEnabled(active or elsewhere or bool(self.client.active_ids()))
        # Run actions need a run selected (a Ctrl+click that unselects it, or a filter hiding it, leaves none).
        chosen = row is not None and bool(self.runs_view.selectionModel().selectedRows())
        if not chosen:
            unreleasable = "select a finished run"
        else:  # a model and a guarantee to state
            unreleasable = f"run {run_id} is running" if active else release_refusal(row)
        self._explain(self.act_export, unreleasable, EXPORT_TIP, "export")
        self._explain(self.act_report, unreleasable, REPORT_TIP, "report")
        self.act_reuse.setEnabled(chosen)
        self._explain(self.act_continue, self._continue_refusal(row if chosen else None, active=active,
                                                                elsewhere=elsewhere), CONTINUE_TIP, "continue")
        self.act_delete.setEnabled(run_id is not None and run_id not in self.client.jobs and not elsewhere)
        self.act_rename.setEnabled(chosen)

    def show_ledger(self) -> None:
        """View ▸ Privacy ledger: every dataset's total spend (workbench.ledger_dialog)."""
        from workbench.ledger_dialog import LedgerDialog

        try:
            runs = self.store.list_runs()
        except Exception as exc:  # a locked or damaged file is reported, the window keeps going
            self.statusBar().showMessage(f"Cannot read the runs: {describe_error(exc)}", 10000)
            return
        self.ledger_dialog = LedgerDialog(runs, self._deleted_runs(), self)
        self.ledger_dialog.show()

    def _deleted_runs(self) -> list[dict[str, Any]]:
        """What the store keeps of deleted runs, for the runs panel's "Show deleted" view."""
        try:
            return self.store.deleted_runs()
        except Exception as exc:  # a locked or damaged file is reported, the window keeps going
            self.statusBar().showMessage(f"Cannot read deleted runs: {describe_error(exc)}", 10000)
            return []

    def _save_tags(self, run_id: int, tags: list) -> None:
        """The tags box of the runs panel lost focus with new tags: into the store, then the list."""
        try:
            self.store.set_tags(run_id, tags)
        except Exception as exc:
            self.statusBar().showMessage(f"Tags of run {run_id} not saved: {describe_error(exc)}", 15000)
        QTimer.singleShot(0, self.refresh_runs)  # not from inside a selection change

    def _save_notes(self, run_id: int, text: str) -> None:
        try:
            self.store.set_notes(run_id, text)
        except Exception as exc:
            self.statusBar().showMessage(f"Notes of run {run_id} not saved: {describe_error(exc)}", 15000)
        QTimer.singleShot(0, self.refresh_runs)

    def _checked_fingerprints(self, dataset: str) -> frozenset[str]:
        """Fingerprints of the data the listed runs on `dataset` trained on (as Store.checked_fingerprints,
        from the last listing: no store read). Safe from a worker thread: the list is replaced, never changed."""
        rows = self.runs_model.rows
        return frozenset(r["dataset_fingerprint"] for r in rows
                         if r.get("dataset") == dataset and r.get("dataset_fingerprint"))

    def _listed_row(self, run_id: int | None) -> dict[str, Any] | None:
        """The run's row as last listed (no store read)."""
        return next((r for r in self.runs_model.rows if r["id"] == run_id), None) if run_id is not None else None

    def _context_menu(self, pos) -> None:
        index = self.runs_view.indexAt(pos)
        if index.isValid() and not self.runs_view.selectionModel().isRowSelected(index.row(), QModelIndex()):
            self._select_row(index.row())
        menu = QMenu(self)
        menu.setToolTipsVisible(True)
        for action in (self.act_stop, self.act_continue, self.act_export, self.act_report, self.act_reuse,
                       self.act_compare, None, self.act_rename, self.act_delete):
            menu.addSeparator() if action is None else menu.addAction(action)
        menu.popup(self.runs_view.viewport().mapToGlobal(pos))

    # ---- running -------------------------------------------------------------------------------
    def new_run(self) -> None:
        self.tabs.setCurrentWidget(self.form)
        self.form.fields["name"].editor.setFocus()
        self.form.fields["name"].editor.selectAll()

    def _continue_refusal(self, row: dict[str, Any] | None, *, active: bool = False, elsewhere: bool = False
                          ) -> str | None:
        """Why Continue run cannot take `row` (None when it can), in the words `dpw resume` uses."""
        if row is None:
            return "select a stopped or failed run"
        if active or elsewhere:
            return f"run {row['id']} is {'running' if active else 'running in another process'}"
        continuations = [r for r in self.runs_model.rows if r.get("resumed_from") == row["id"]]
        try:
            refusal = continue_refusal(row, store=self.store, continuations=continuations)
        except OSError as exc:
            return f"its checkpoint cannot be read: {exc}"
        return None if refusal is None else refusal.message

    @staticmethod
    def _explain(action: QAction, refusal: str | None, tip: str, verb: str) -> None:
        """`action` enabled with its usual tip, or disabled with the reason as its tooltip and status
        tip (shown in the menus and the status bar), so a greyed-out action says why."""
        action.setEnabled(refusal is None)
        text = tip if refusal is None else f"Cannot {verb}: {refusal}"
        action.setToolTip(text)
        action.setStatusTip(text)

    def _continuable(self, row: dict[str, Any] | None) -> bool:
        return self._continue_refusal(row) is None

    def continue_run(self) -> int | None:
        """Run ▸ Continue run: the selected stopped or failed run goes on from its last checkpoint as a new
        run (engine.checkpoint), checked against its data first as a new run is."""
        row = self._listed_row(self.current_run_id)
        if not self._continuable(row):
            return None
        return self.start_run(RunConfig.from_dict(row["config"]), continues=row["id"])

    def start_run(self, config: RunConfig, *, continues: int | None = None) -> int | None:
        """Check `config` against its data, then store and start it (queued behind others). With
        `continues`, the new run continues that run from its last checkpoint instead of starting afresh."""
        if self._checking:
            return None
        # The checks `dpw run` does before storing (data found, rules on the real data, model, plan),
        # in another process while the window paints: a config that fails leaves no failed run. The
        # runner on standby does them when it will train the run (it keeps what it read), else the helper.
        self._checking = True
        self.act_start.setEnabled(False)
        self.form.start_button.setEnabled(False)
        self.statusBar().showMessage(f"Checking {config.name}: loading its data and planning its privacy…")
        try:
            checked_before = self._checked_fingerprints(config.dataset)
            asked, problem = (False, None) if continues is not None else self.client.check_on_standby(
                config, checked_before=checked_before)
            if not asked:
                problem = check_while_painting(self.precheck, config, checked_before=checked_before)
        finally:
            self._checking = False
            self.act_start.setEnabled(self.form.valid)
            self.form.start_button.setEnabled(self.form.valid)
            self.statusBar().clearMessage()
        if problem is not None and continues is not None:  # not the form's config: said on its own
            QMessageBox.warning(self, "Cannot continue the run", problem.message
                                + (f"\n\n{problem.hint}" if problem.hint else ""))
            return None
        if problem is not None:
            self.form.show_start_problem(problem)
            self.tabs.setCurrentWidget(self.form)
            self.statusBar().showMessage(f"Not started: {problem.message}", 15000)
            return None
        try:
            run_id = self.client.submit(config, continues=continues)
        except Exception as exc:
            QMessageBox.warning(self, "Cannot continue the run" if continues is not None else "Cannot start the run",
                                describe_error(exc))
            return None
        status = "starting" if run_id in self.client.jobs else "queued"  # its runner exists, or it waits
        data = RunData(run_id=run_id, name=config.name, mechanism=config.mechanism, status=status,
                       config=config.to_dict())
        self.run_data[run_id] = data
        if continues is None:
            self.settings.set_json("setup/texts", self.form.texts())
        self.refresh_runs()
        self.select_run(run_id)
        self.tabs.setCurrentWidget(self.dashboard)
        waiting = len(self.client.queue)
        self.statusBar().showMessage(
            f"Run {run_id} ({config.name}) " + (f"continues run {continues}, " if continues is not None else "")
            + (f"queued ({waiting} waiting)" if run_id in self.client.queue else "started"), 5000)
        return run_id

    def stop_run(self) -> None:
        run_id = self.current_run_id
        if run_id is not None and not self.client.is_active(run_id) and stop_runner(self._listed_row(run_id)):
            self.statusBar().showMessage(f"Stopping run {run_id} (started outside this window) after its "
                                         "current step…", 5000)
            return
        if run_id is None or not self.client.is_active(run_id):
            active = self.client.active_ids()
            if not active:
                return
            run_id = active[0]
        queued = run_id in self.client.queue
        self.client.stop(run_id)
        self.statusBar().showMessage(f"Run {run_id} taken off the queue before it started: no step taken, no "
                                     "privacy spent" if queued else f"Stopping run {run_id} after its current step…",
                                     5000)

    def rename_selected(self, name: str | None = None) -> str | None:
        """Run ▸ Rename run (F2 in the list): the selected run gets another name, asked for when `name`
        is None. Returns the name stored, or None (cancelled, or refused: said in the status bar)."""
        run_id = self.current_run_id
        row = self._listed_row(run_id)
        if row is None:
            return None
        if name is None:
            dialog = QInputDialog(self)
            dialog.setWindowTitle("Rename run")
            dialog.setLabelText(f"New name of run {run_id} (its guarantee and config hash stay):")
            dialog.setTextValue(row["name"])
            dialog.resize(max(dialog.sizeHint().width(), 460), dialog.sizeHint().height())
            if dialog.exec() != QInputDialog.DialogCode.Accepted:
                return None
            name = dialog.textValue()
        try:
            stored = self.store.rename_run(run_id, name)
        except Exception as exc:  # a name the config refuses, a locked store: said, the window goes on
            self.statusBar().showMessage(f"Run {run_id} not renamed: {describe_error(exc)}", 15000)
            return None
        self.refresh_runs()  # the run's data takes the new name from its row (the dashboard's header)
        self.statusBar().showMessage(f"Run {run_id} renamed: {row['name']} → {stored}", 8000)
        return stored

    def delete_selected(self, *, confirm: bool = True) -> list[int]:
        """Delete the selected runs (after asking); a running one is refused, a queued one is dropped
        from the queue first. Returns the ids deleted."""
        ids = self.selected_ids() or ([self.current_run_id] if self.current_run_id is not None else [])
        busy = [i for i in ids if i in self.client.jobs]  # launched, maybe not yet marked running
        if busy:
            QMessageBox.information(self, "Run is running", f"Run {busy[0]} is running; stop it before deleting it.")
            return []
        if not ids:
            return []
        rows = {r["id"]: r for r in self.runs_model.rows}
        names = ", ".join(f"{i} ({rows[i]['name']})" if i in rows else str(i) for i in ids)
        if confirm:
            answer = QMessageBox.question(
                self, "Delete runs" if len(ids) > 1 else "Delete run",
                f"Delete run{'s' if len(ids) > 1 else ''} {names}?\n\n{'Their' if len(ids) > 1 else 'Its'} curves, "
                "votes and saved models are removed. The store keeps one line per deleted run (name, status, "
                "epsilon, dates, tags, notes; 'Show deleted' above the list shows them): the privacy it spent "
                "on its data was spent all the same.")
            if answer != QMessageBox.StandardButton.Yes:
                return []
        deleted = []
        for run_id in ids:
            if run_id in self.client.queue:
                self.client.stop(run_id)
            try:
                self.store.remove_run(run_id)
            except Exception as exc:
                QMessageBox.warning(self, "Cannot delete the run", describe_error(exc))
                break
            deleted.append(run_id)
            self._forget_run(run_id)
        self.refresh_runs()
        if self.current_run_id is None and self.runs_model.rowCount():
            self._select_row(0)  # the newest run shown, not the oldest at the bottom
        if self.tabs.currentWidget() is self.compare:
            self.compare_selected(switch=False)
        self._update_run_actions()
        if deleted:
            self.statusBar().showMessage(f"Deleted run{'s' if len(deleted) > 1 else ''} "
                                         f"{', '.join(map(str, deleted))}", 8000)
        return deleted

    def _runner_started(self, run_id: int) -> None:
        """Its process exists but has not reported yet (loading torch, the data): 'starting', not 'queued',
        as the status bar already counts it running."""
        data = self.run_data.get(run_id)
        if data is not None and data.status == "queued":
            data.status = "starting"
            data.version += 1
        self.refresh_runs()

    def _forget_run(self, run_id: int) -> None:
        """Drop a deleted run's curves; clear the views if they show it."""
        self.run_data.pop(run_id, None)
        if self.current_run_id == run_id:
            self.current_run_id = None
            self.dashboard.show_run(None)
            self.votes.show_run(self.store, None)

    def _on_events(self, run_id: int, events: list) -> None:
        data = self.run_data.get(run_id)
        if data is None:
            data = self.run_data[run_id] = RunData(run_id=run_id)
        refresh = False
        for event in events:
            data.apply(event)
            kind = event["type"]
            if kind in ("started", "finished"):
                refresh = True
            elif kind == "error":
                self.statusBar().showMessage(f"Run {run_id}: {event.get('message', 'error')}", 15000)
            elif kind == "vote_batch" and run_id == self.current_run_id and not self.votes_timer.isActive():
                self.votes_timer.start()
        if refresh:
            self.refresh_runs()

    def _on_audit_stored(self, run_id: int) -> None:
        """An audit was kept in the run's summary: re-read the list so every view sees it."""
        self.refresh_runs()
        if run_id == self.current_run_id and self.tabs.currentWidget() is self.audit:
            self.audit.show_run(self._listed_row(run_id))
        if self.tabs.currentWidget() is self.compare:
            self.compare_selected(switch=False)

    def _refresh_live_votes(self) -> None:
        if self.current_run_id is not None and self.tabs.currentWidget() is self.votes:
            self._show_votes(self.current_run_id)

    def _on_run_ended(self, run_id: int, status: str) -> None:
        self.refresh_runs()
        data = self.run_data.get(run_id)
        if data is not None and not data.finished:
            data.status = status
            data.finished = True
            data.version += 1
        if status != "failed":
            self.statusBar().showMessage(f"Run {run_id} {status}", 8000)
        self._update_run_actions()
        if run_id == self.current_run_id and self.tabs.currentWidget() is self.votes:
            self._show_votes(run_id)

    def _on_run_lost(self, run_id: int, message: str, hint: str) -> None:
        data = self.run_data.get(run_id)
        if data is not None:
            data.fail(message, hint)
        self.statusBar().showMessage(f"Run {run_id} failed: {message}", 20000)

    def _update_queue_label(self) -> None:
        running, waiting = len(self.client.jobs), len(self.client.queue)
        if running or waiting:
            self.queue_label.setText(f"{running} running, {waiting} queued")
        else:
            self.queue_label.setText("")
        self._update_run_actions()

    # ---- compare, export, report ---------------------------------------------------------------
    def compare_selected(self, switch: bool = True) -> None:
        ids = self.selected_ids()
        rows = self.runs_model.rows
        chosen = []
        for run_id in ids:
            row = next((r for r in rows if r["id"] == run_id), None)
            if row is not None:
                chosen.append((row, self.data_for(run_id)))
        self.compare.show_runs(chosen, rows)
        if switch:
            self.tabs.setCurrentWidget(self.compare)

    def _current_row(self) -> dict[str, Any] | None:
        if self.current_run_id is None:
            return None
        try:
            return self.store.get_run(self.current_run_id)
        except DPWError:
            return None

    def export_run(self) -> ExportDialog | None:
        run = self._current_row()
        if run is None:
            return None
        dialog = ExportDialog(self.store.path, run, self, self.settings)
        dialog.open()
        return dialog

    def report_run(self) -> ReportDialog | None:
        run = self._current_row()
        if run is None:
            return None
        dialog = ReportDialog(self.store.path, run, self, self.settings)
        dialog.open()
        return dialog

    def reuse_config(self) -> None:
        run = self._current_row()
        if run is None:
            return
        try:
            self.form.load_config(RunConfig.from_dict(run["config"]))
        except DPWError as exc:
            QMessageBox.warning(self, "Cannot load this run's config", describe_error(exc))
            return
        self.tabs.setCurrentWidget(self.form)

    # ---- tuning studies ------------------------------------------------------------------------
    def open_study(self, path: str | None = None) -> StudyPlanDialog | None:
        """Choose a study file, show its plan and epsilon (StudyPlanDialog); Start runs it in the background."""
        from engine.study_config import StudyConfig

        path, config = self._open_toml(path, StudyConfig.load_toml, folder_key="study/folder",
                                       title="Open tuning study", file_filter=STUDY_FILTER, what="the study")
        if config is None:
            return None
        dialog = StudyPlanDialog(path, config, self.client.environment, self)
        dialog.accepted.connect(lambda: self.start_study(path))
        dialog.open()
        return dialog

    def start_study(self, path: str | Path) -> StudyProcess:
        """Run `dpw study` on `path` in its own process; its runs appear in the list as they start."""
        study = StudyProcess(path, self.store.path, self.client.environment, self)
        self.studies = [s for s in self.studies if s.running()] + [study]
        study.candidate.connect(lambda _run_id: self.refresh_runs())
        study.ended.connect(self._on_study_ended)
        self.statusBar().showMessage(f"Study {Path(path).name} started", 5000)
        return study

    def _on_study_ended(self, study_id: int, status: str, message: str) -> None:
        self.refresh_runs()
        what = f"Study {study_id}" if study_id >= 0 else "The study"
        self.statusBar().showMessage(f"{what} {status}" + (f": {message}" if message else ""), 15000)

    # ---- config files --------------------------------------------------------------------------
    def _open_toml(self, path: str | None, load, *, folder_key: str, title: str, file_filter: str,
                   what: str) -> tuple[str | None, Any]:
        """(path, what `load` read from it): the file chosen in a dialog opened in the folder remembered
        under `folder_key` when no `path` is given; (path, None) when cancelled or unreadable (said why)."""
        if path is None:
            start = self.settings.text(folder_key, str(first_config_folder()))
            path, _ = QFileDialog.getOpenFileName(self, title, start, file_filter)
            if not path:
                return None, None
        try:
            loaded = load(path)
        except DPWError as exc:
            QMessageBox.warning(self, f"Cannot load {what}", describe_error(exc))
            return path, None
        self.settings.set_text(folder_key, str(Path(path).parent))
        return path, loaded

    def open_config(self, path: str | None = None) -> bool:
        """File ▸ Open config: a valid file fills the form; one with wrong settings fills it as far as
        it goes, every wrong setting marked at once and unknown keys named (the first refusal alone,
        with nothing loaded, made fixing six problems six round trips)."""
        path, loaded = self._open_toml(path, load_config_file, folder_key="setup/folder",
                                       title="Open run config", file_filter=TOML_FILTER, what="the config")
        if loaded is None:
            return False
        if isinstance(loaded, RunConfig):
            self.form.load_config(loaded)
            self.statusBar().showMessage(f"Loaded {path}", 5000)
        else:
            values, unknown = loaded
            self.form.load_values(values)
            marked = len(self.form.errors)
            lines = [f"{path} is not a valid config as it is. Its settings are loaded into the form"
                     + (f", and the {marked} that need fixing are marked there." if marked else ".")]
            if unknown:
                lines.append(f"Not known, left out: {', '.join(unknown)}.")
            QMessageBox.warning(self, "The config needs fixing", "\n\n".join(lines))
        self.tabs.setCurrentWidget(self.form)
        return True

    def save_config(self, path: str | None = None) -> bool:
        try:
            config = self.form.config()
        except DPWError as exc:
            QMessageBox.warning(self, "The config is not valid yet", describe_error(exc))
            return False
        if path is None:
            start = Path(self.settings.text("setup/folder", str(Path.cwd()))) / f"{config.name}.toml"
            path, _ = QFileDialog.getSaveFileName(self, "Save run config", str(start), TOML_FILTER)
            if not path:
                return False
        config.save_toml(path)
        self.settings.set_text("setup/folder", str(Path(path).parent))
        self.statusBar().showMessage(f"Saved {path}", 5000)
        return True


__all__ = ["MainWindow"]


def load_config_file(path: str) -> RunConfig | tuple[dict[str, Any], list[str]]:
    """A config file as a RunConfig; if its settings do not make one, (its known settings, relative
    paths taken from its folder as for a valid file; its unknown keys). A file that is not TOML
    raises ConfigError as RunConfig.load_toml does."""
    try:
        return RunConfig.load_toml(path)
    except ConfigError:
        values = read_toml(path, "config")
    known = set(field_names())
    unknown = sorted(k for k in values if k not in known and k != "schema_version")
    kept = {k: v for k, v in values.items() if k in known}
    kept.update(paths_from_file(kept, Path(path).parent))
    return kept, unknown


class OwnShortcuts(QObject):
    """Shortcuts of the window's actions that a text field would take for itself (Ctrl+E is "end of
    line" in a Qt text field on X11, so Export did nothing while the filter box had the focus): they
    reach the window's action wherever the focus is in the window."""

    def __init__(self, window: QWidget, actions: list[QAction]):
        super().__init__(window)
        self.window = window
        self.keys = {action.shortcut().toString() for action in actions}

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if (event.type() == QEvent.Type.ShortcutOverride and isinstance(watched, QWidget)
                and watched.window() is self.window
                and QKeySequence(event.keyCombination()).toString() in self.keys):
            event.ignore()  # not taken by the field: the window's shortcut runs
            return True
        return False
