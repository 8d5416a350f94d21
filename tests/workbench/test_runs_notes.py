"""The runs list as a tracking tool: tags and notes kept in the store, the filter over tags, the records of
deleted runs, and run actions that follow the selection."""

from __future__ import annotations

from PySide6.QtCore import QItemSelectionModel, Qt, QTimer
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication, QInputDialog

from engine.config import RunConfig
from engine.store import Store
from workbench.main_window import MainWindow
from workbench.runs_model import COLUMNS, DELETED_COLUMNS


def make_runs(window: MainWindow) -> dict[str, int]:
    """Two finished runs and a failed one, written through the window's store helper."""
    made = {}
    for name, dataset, status, epsilon in (("alpha", "digits", "finished", 2.5), ("beta", "mnist", "finished", 1.2),
                                           ("gamma", "digits", "failed", None)):
        run_id = window.store.create_run(RunConfig(name=name, dataset=dataset, noise_multiplier=1.0, delta=1e-5,
                                                   reproducible_noise=False))
        window.store.update_run(run_id, status=status, epsilon=epsilon, delta=1e-5, accountant="pld",
                                accuracy=None if epsilon is None else 0.9, steps_done=0 if epsilon is None else 40,
                                steps_planned=40)
        made[name] = run_id
    window.refresh_runs()
    return made


def shown_names(window: MainWindow) -> list[str]:
    return [window.runs_model.run_at(r)["name"] for r in range(window.runs_model.rowCount())]


def edit_tags(window: MainWindow, qtbot, text: str) -> None:
    box = window.runs_panel.run_notes.tags
    box.setFocus()
    box.selectAll()
    qtbot.keyClicks(box, text)
    qtbot.keyClick(box, Qt.Key.Key_Return)  # editing finished: saved


def test_tags_and_notes_are_saved_on_edit_finish_and_survive_a_reopen(window, qtbot, db_path):
    made = make_runs(window)
    window.select_run(made["alpha"])
    edit_tags(window, qtbot, "baseline,  lr 0.5")
    notes = window.runs_panel.run_notes.notes
    notes.setFocus()
    qtbot.keyClicks(notes, "clipping looks too tight")
    window.runs_view.setFocus()  # leaving the box ends the edit
    qtbot.waitUntil(lambda: Store(db_path, readonly=True).get_run(made["alpha"])["notes"]
                    == "clipping looks too tight", timeout=10000)
    assert Store(db_path, readonly=True).get_run(made["alpha"])["tags"] == ["baseline", "lr 0.5"]
    qtbot.waitUntil(lambda: window.runs_model.index(window.runs_model.row_of(made["alpha"]),
                                                    [k for k, _ in COLUMNS].index("tags")).data()
                    == "baseline, lr 0.5", timeout=5000)
    window.select_run(made["beta"])
    assert window.runs_panel.run_notes.tags.text() == "" and notes.toPlainText() == ""

    window.close()
    again = MainWindow(db_path, probe=False)
    qtbot.addWidget(again)
    try:
        again.select_run(made["alpha"])
        assert again.runs_panel.run_notes.tags.text() == "baseline, lr 0.5"
        assert again.runs_panel.run_notes.notes.toPlainText() == "clipping looks too tight"
    finally:
        again.client.shutdown(timeout_ms=10000)
        again.close()


def test_the_filter_box_matches_tags(window, qtbot):
    made = make_runs(window)
    window.store.set_tags(made["beta"], ["sweep-7", "final"])
    window.store.set_tags(made["gamma"], ["sweep-7"])
    window.refresh_runs()
    window.runs_panel.search.setText("sweep-7")
    assert sorted(shown_names(window)) == ["beta", "gamma"]
    window.runs_panel.search.setText("sweep-7 final")
    assert shown_names(window) == ["beta"]
    window.runs_panel.search.setText("final digits")
    assert shown_names(window) == []


def test_the_deleted_view_lists_a_deleted_run_with_its_epsilon_greyed_and_read_only(window, qtbot, db_path):
    made = make_runs(window)
    window.store.set_tags(made["alpha"], ["pilot"])
    window.select_runs([made["alpha"]])
    assert window.delete_selected(confirm=False) == [made["alpha"]]
    panel = window.runs_panel
    assert not panel.deleted_box.isVisible()
    panel.show_deleted.setChecked(True)
    assert panel.deleted_box.isVisible()
    model = panel.deleted_model
    assert model.rowCount() == 1
    cells = {key: model.index(0, i).data() for i, (key, _) in enumerate(DELETED_COLUMNS)}
    assert cells["id"] == str(made["alpha"]) and cells["name"] == "alpha"
    assert cells["epsilon"] == "2.5" and cells["delta"] == "1e-05" and cells["accountant"] == "pld"
    assert cells["tags"] == "pilot" and cells["deleted"].startswith("20")
    grey = QApplication.palette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text)
    assert model.index(0, 1).data(Qt.ItemDataRole.ForegroundRole) == grey
    assert not model.flags(model.index(0, 1)) & Qt.ItemFlag.ItemIsEditable
    assert "1 deleted run" in panel.deleted_label.text()
    assert window.runs_model.row_of(made["alpha"]) is None  # not among the runs


def test_run_actions_need_a_selected_run_with_a_model(window, qtbot):
    made = make_runs(window)
    assert not window.act_reuse.isEnabled() and not window.act_export.isEnabled()
    window.select_run(made["beta"])
    assert window.act_reuse.isEnabled() and window.act_export.isEnabled() and window.act_report.isEnabled()
    row = window.runs_model.row_of(made["beta"])
    window.runs_view.selectionModel().select(window.runs_model.index(row, 0),
                                             QItemSelectionModel.SelectionFlag.Deselect
                                             | QItemSelectionModel.SelectionFlag.Rows)  # Ctrl+click
    assert not window.act_reuse.isEnabled() and not window.act_export.isEnabled()
    assert window.act_export.toolTip() == "Cannot export: select a finished run"
    window.select_run(made["gamma"])  # failed: nothing to export or report
    assert window.act_reuse.isEnabled() and not window.act_export.isEnabled() and not window.act_report.isEnabled()
    # a greyed-out action says why, in its tooltip (the menus show it) and in the status bar on hover
    gamma = f"run {made['gamma']} failed: it has no model to release"
    assert window.act_export.toolTip() == f"Cannot export: {gamma}" == window.act_export.statusTip()
    assert window.act_report.toolTip() == f"Cannot report: {gamma}"
    window.select_run(made["beta"])
    assert window.act_export.toolTip() == "Export the selected run's model"


def test_why_a_run_has_no_model_to_release():
    from workbench.runs_model import release_refusal

    finished = {"id": 3, "status": "finished", "mechanism": "dpsgd", "steps_done": 40, "epsilon": 1.0,
                "config": {"delta": 1e-5}}
    assert release_refusal(finished) is None
    assert release_refusal({**finished, "status": "running"}) == "run 3 is running: its model is released once it has ended"
    assert release_refusal({**finished, "status": "stopped", "steps_done": 0}) == (
        "run 3 stopped before its first private step: nothing was trained")
    candidate = {**finished, "study_id": 1, "study": {"id": 1, "name": "grid", "mode": "private",
                                                       "status": "finished", "released_run_id": 4}}
    assert release_refusal(candidate) == ("run 3 is a candidate of private study 1 (grid) that was not released: "
                                          "its model and scores never leave the store")


def test_the_config_panel_lists_only_the_settings_the_runs_mechanism_uses(qtbot):
    from workbench.runs_panel import ConfigPanel

    panel = ConfigPanel()
    qtbot.addWidget(panel)
    config = RunConfig(name="a", noise_multiplier=1.1, reproducible_noise=False).to_dict()
    panel.show_run({"id": 1, "name": "a", "mechanism": "dpsgd", "status": "finished", "config": config})
    shown = dict(panel.rows_text())
    assert shown["noise_multiplier"] == "1.1" and "clipping_norm" in shown
    assert "aggregator" not in shown and "num_teachers" not in shown and "schema_version" not in shown


def test_a_long_run_name_does_not_push_the_panels_values_out_of_view(qtbot):
    """The labels' column fits its rows; the title above it (a study candidate's long name) is elided,
    whole in its tooltip, instead of widening the column past a narrow panel."""
    from workbench.runs_panel import ConfigPanel

    panel = ConfigPanel()
    qtbot.addWidget(panel)
    panel.resize(300, 400)
    widths = {}
    for name in ("a", "study-digits (learning_rate=0.5, clipping_norm=1.0, expected_batch_size=64) " * 2):
        config = RunConfig(name=name, noise_multiplier=1.1).to_dict()
        panel.show_run({"id": 7, "name": name, "mechanism": "dpsgd", "status": "finished", "config": config})
        widths[name] = panel.columnWidth(0)
        assert panel.headerItem().toolTip(0) == f"Run 7: {name}"
    short, long = widths.values()
    assert short == long < 250  # the values start in view in a 300-pixel panel


def test_f2_in_the_runs_list_renames_the_selected_run_in_the_store_list_and_dashboard(window, qtbot, db_path):
    made = make_runs(window)
    window.select_run(made["alpha"])
    window.runs_view.setFocus()
    asked = []

    def answer() -> None:
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, QInputDialog)
        asked.append(dialog.textValue())
        dialog.setTextValue("  alpha, lr 0.5  ")
        dialog.accept()

    QTimer.singleShot(300, answer)
    qtbot.keyClick(window.runs_view, Qt.Key.Key_F2)
    assert asked == ["alpha"]  # the dialog starts from the current name
    stored = Store(db_path, readonly=True).get_run(made["alpha"])
    assert stored["name"] == stored["config"]["name"] == "alpha, lr 0.5"
    assert "alpha, lr 0.5" in shown_names(window) and "alpha" not in shown_names(window)
    qtbot.waitUntil(lambda: window.dashboard.title.text().startswith(f"Run {made['alpha']}: alpha, lr 0.5"),
                    timeout=5000)
    assert "renamed: alpha → alpha, lr 0.5" in window.statusBar().currentMessage()
    # a name the config refuses is said, and nothing changes
    assert window.rename_selected("   ") is None
    assert "not renamed: name: must not be empty" in window.statusBar().currentMessage()
    assert Store(db_path, readonly=True).get_run(made["alpha"])["name"] == "alpha, lr 0.5"
    Store(db_path).rename_run(made["alpha"], "renamed elsewhere")  # dpw rename, with the window open
    window.refresh_runs()
    qtbot.waitUntil(lambda: window.dashboard.title.text().startswith(f"Run {made['alpha']}: renamed elsewhere"),
                    timeout=5000)
    window.close()
