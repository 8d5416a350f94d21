"""A real PATE run through the window: its dashboard, its votes, and the run actions
(export refused for teachers, student exported, report previewed and saved)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.store import Store

RUN_TIMEOUT_MS = 120_000

PATE_DIGITS = dict(name="pate-digits", dataset="digits", mechanism="pate", num_teachers=6, teacher_model="mlp",
                   model="mlp", teacher_epochs=3, teacher_batch_size=16, optimizer="adam", learning_rate=0.01,
                   aggregator="confident", threshold=4.0, sigma1=1.5, sigma2=1.0, num_queries=120,
                   public_pool_size=250, delta=1e-4, student_epochs=3, student_batch_size=16, epsilon_budget="")


@pytest.fixture(scope="module")
def pate_window_and_run(qapp, tmp_path_factory, mnist_dir):
    """One window with one finished PATE run on digits, shared by the tests of this module."""
    import os

    from pytestqt.qtbot import QtBot

    from workbench.main_window import MainWindow
    from workbench.settings import use_folder

    os.environ.setdefault("DPW_DATA_DIR", str(mnist_dir.parent))
    folder = tmp_path_factory.mktemp("pate")
    use_folder(folder / "settings")
    window = MainWindow(folder / "runs.sqlite", probe=False)
    window.show()
    for name, value in PATE_DIGITS.items():
        window.form.set_value(name, str(value))
    assert window.form.valid, window.form.summary.text()
    run_id = window.start_run(window.form.config())
    bot = QtBot(None)
    bot.waitUntil(lambda: window.run_data[run_id].finished, timeout=RUN_TIMEOUT_MS)
    yield window, run_id
    window.client.shutdown()
    window.close()


def test_pate_dashboard_shows_teachers_queries_and_privacy(pate_window_and_run, qtbot):
    window, run_id = pate_window_and_run
    data = window.run_data[run_id]
    assert data.status == "finished", [m.text for m in data.messages]
    assert len(data.metrics["teacher_accuracy"]) == 6
    assert data.answered_total + data.rejected_total == 120
    assert {"pate-dd", "pate-di", "pate-released"} <= set(data.privacy)
    window.select_run(run_id)
    assert window.dashboard.pages.currentWidget() is window.dashboard.pate_page
    curve = window.dashboard.pate_curves["answered"]
    qtbot.waitUntil(lambda: curve.xData is not None and len(curve.xData) == len(data.answered), timeout=5000)
    text = window.dashboard.budget_label.text()
    row = Store(window.store.path).get_run(run_id)
    assert text.startswith(f"ε {row['epsilon']:.3g} (publishable, {row['accountant']}")
    assert "data-dependent ε" in text and "not publishable" in text
    assert "private" in " ".join(window.dashboard.teacher_acc_plot.title_lines)
    # the plurality vote's accuracy: a line labelled with it inside the plot, kept in the view's range
    ensemble = data.metrics["ensemble_accuracy"].last()
    line = window.dashboard.ensemble_line
    assert line.isVisible() and line.value() == pytest.approx(ensemble)
    assert line.label.toPlainText() == f"ensemble {ensemble:.3f}"  # the text drawn, not only its format
    (_, _), (low, high) = window.dashboard.teacher_acc_plot.getPlotItem().getViewBox().viewRange()
    assert low <= ensemble <= high


def test_votes_view_reads_histograms_from_the_store(pate_window_and_run, qtbot):
    window, run_id = pate_window_and_run
    window.select_run(run_id)
    window.act_votes.trigger()
    view = window.votes
    assert len(view.rows) == 120
    # the first query drawn has its threshold labelled (the label was drawn only from the second query on)
    assert view.threshold_line.isVisible()
    assert view.threshold_line.label.toPlainText() == "threshold T = 4 (checked with noise)"
    from PySide6.QtCore import Qt

    assert view.threshold_line.label.fill.style() != Qt.BrushStyle.NoBrush  # readable where it crosses a bar
    view.query.setValue(5)
    row = Store(window.store.path).votes(run_id, start=5, limit=1)[0]
    assert list(view.bars.opts["height"]) == row["histogram"]
    assert "Query 5" in view.query_info.text()
    assert view.query.maximum() == 119
    # the per-query epsilon is the data-dependent one: a private diagnostic, never shown as publishable
    assert "not publishable" in " ".join(view.eps_plot.title_lines)
    shown = view.eps_plot.getPlotItem().titleLabel.item.toPlainText()  # the words on screen, not markup
    assert shown.startswith("ε after each query") and "not publishable" in shown and "<" not in shown
    if row["epsilon_cost"] is not None:
        assert "data-dependent ε" in view.query_info.text() and "not publishable" in view.query_info.text()


def test_teacher_export_is_refused_with_the_engines_reason(pate_window_and_run, qtbot, tmp_path):
    window, run_id = pate_window_and_run
    window.select_run(run_id)
    dialog = window.export_run()
    dialog.kind.setCurrentIndex(dialog.kind.findData("teacher"))
    dialog.folder.setText(str(tmp_path / "teachers"))
    dialog.export()
    qtbot.waitUntil(lambda: dialog.outcome is not None, timeout=30000)
    assert dialog.outcome == "error"
    assert "teachers saw raw private data" in dialog.result_label.text()
    dialog.close()


def test_the_export_dialog_states_the_models_guarantee_before_exporting():
    from workbench.dialogs import export_statement

    run = {"id": 2, "name": "audit", "mechanism": "dpsgd", "epsilon": 7.995, "delta": 1e-5, "accountant": "pld",
           "config": {"reproducible_noise": False}, "study": None,
           "summary": {"canaries": {"count": 2000, "kind": "gradient", "epsilon_lower_bound": 2.7}}}
    text = export_statement(run)
    assert text.startswith("ε = 7.995, δ = 1e-05 (pld)")
    assert "Audit model: trained with 2000 gradient canaries" in text
    seeded = export_statement({**run, "config": {"reproducible_noise": True}, "summary": {}})
    assert "No differential privacy guarantee" in seeded and "Audit model" not in seeded
    assert export_statement({**run, "mechanism": "none", "summary": {}}).startswith("none: a non-private baseline")


def test_student_export_writes_the_model_files(pate_window_and_run, qtbot, tmp_path):
    window, run_id = pate_window_and_run
    window.select_run(run_id)
    dialog = window.export_run()
    assert dialog.kind.currentData() == "model"
    assert "(pate-" in dialog.guarantee.text() and dialog.guarantee.text().startswith("ε = ")
    out = tmp_path / "student"
    dialog.folder.setText(str(out))
    dialog.export()
    qtbot.waitUntil(lambda: dialog.outcome is not None, timeout=90000)
    assert dialog.outcome == "ok", dialog.result_label.text()
    assert (out / "model.safetensors").is_file()
    card = json.loads((out / "model_card.json").read_text())
    assert card["mechanism"] == "pate"
    assert f"href='file://{out}'" in dialog.result_label.text()  # "Open the folder"
    dialog.close()
    # The next export proposes a folder named after the run, beside the last one.
    again = window.export_run()
    assert Path(again.folder.text()).parent == tmp_path
    assert Path(again.folder.text()).name.startswith(f"run-{run_id}-")
    again.close()


def test_exporting_into_a_folder_that_holds_an_export_asks_before_replacing_it(pate_window_and_run, qtbot, tmp_path):
    """The window's `dpw export --force`: the files already there are replaced only when the person says so."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    window, run_id = pate_window_and_run
    window.select_run(run_id)
    out = tmp_path / "again"
    out.mkdir()
    (out / "model_card.json").write_text("{}", encoding="utf-8")
    asked = []

    def answer(button: str) -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(50, lambda: answer(button))
            return
        asked.append(box.text())
        next(b for b in box.buttons() if b.text() == button).click()

    for button, outcome in (("Choose another folder", "error"), ("Replace", "ok")):
        dialog = window.export_run()
        dialog.folder.setText(str(out))
        QTimer.singleShot(50, lambda b=button: answer(b))
        dialog.export()
        qtbot.waitUntil(lambda: dialog.outcome is not None, timeout=90000)
        assert dialog.outcome == outcome, dialog.result_label.text()
        if outcome == "error":
            assert "already holds model_card.json" in dialog.result_label.text()
            assert (out / "model_card.json").read_text(encoding="utf-8") == "{}"  # untouched
        dialog.close()
    assert len(asked) == 2 and all("already holds model_card.json" in text for text in asked)
    assert json.loads((out / "model_card.json").read_text())["mechanism"] == "pate"
    assert (out / "model.safetensors").is_file()


def test_report_preview_and_save(pate_window_and_run, qtbot, tmp_path):
    window, run_id = pate_window_and_run
    window.select_run(run_id)
    dialog = window.report_run()
    qtbot.waitUntil(lambda: dialog.report is not None, timeout=60000)
    assert "Privacy report" in dialog.browser.toPlainText()
    saved = dialog.save(tmp_path / "report.json")
    assert json.loads(saved.read_text())["run"]["id"] == run_id
    assert "<html" in dialog.save(tmp_path / "report.html").read_text().lower()
    assert dialog.save(tmp_path / "pdf" / "report.pdf").read_bytes().startswith(b"%PDF")
    assert "Open the folder" in dialog.status.text()
    dialog.close()
    # The next report's save dialog starts in the folder saved to last, named after the run.
    from workbench.dialogs import REPORT_FOLDER_KEY

    assert window.settings.text(REPORT_FOLDER_KEY) == str(tmp_path / "pdf")


def _click_scene(plot, scene_pos, qtbot) -> None:
    """A real left click (press and release) on the plot's viewport at a scene position."""
    from PySide6.QtCore import Qt

    point = plot.mapFromScene(scene_pos)
    qtbot.mouseClick(plot.viewport(), Qt.MouseButton.LeftButton, pos=point)


def test_clicking_a_consensus_point_shows_that_querys_histogram(pate_window_and_run, qtbot):
    window, run_id = pate_window_and_run
    window.select_run(run_id)
    window.act_votes.trigger()
    view = window.votes
    view.resize(1200, 800)
    qtbot.waitUntil(lambda: len(view.rows) == 120, timeout=5000)
    view.query.setValue(0)
    qtbot.wait(100)  # laid out and auto-ranged
    stored = Store(window.store.path).votes(run_id)
    for wanted in (37, 90):
        _click_scene(view.consensus_plot, view.scene_position_of(wanted), qtbot)
        qtbot.waitUntil(lambda: view.query.value() == wanted, timeout=3000)
        assert view.selected == wanted
        assert list(view.bars.opts["height"]) == stored[wanted]["histogram"]
        assert f"Query {wanted}:" in view.query_info.text()
        # the selected point is ringed on the consensus plot
        assert list(view.selected_curve.xData) == [wanted]
    # a click outside the plotting area selects nothing
    from PySide6.QtCore import QPointF

    corner = view.consensus_plot.getPlotItem().getViewBox().sceneBoundingRect().topLeft()
    assert view.query_at(corner - QPointF(5, 5)) is None


def test_the_histogram_marks_the_threshold_and_the_released_label(pate_window_and_run):
    window, run_id = pate_window_and_run
    window.select_run(run_id)
    window.act_votes.trigger()
    view = window.votes
    stored = Store(window.store.path).votes(run_id)
    answered = next(r for r in stored if r["answered"])
    view.select_query(answered["query_index"])
    assert view.threshold_line.isVisible() and view.threshold_line.value() == PATE_DIGITS["threshold"]
    assert "threshold T = 4" in view.threshold_line.label.format
    assert view.released_text.toPlainText() == f"▼ released label {answered['label']}"
    brushes = view.bars.opts["brushes"]
    released_colour = brushes[answered["label"]].color().name()
    assert all(b.color().name() != released_colour for i, b in enumerate(brushes) if i != answered["label"])
    rejected = next((r for r in stored if not r["answered"]), None)
    if rejected is not None:
        view.select_query(rejected["query_index"])
        assert view.released_text.toPlainText() == "" and "rejected" in view.query_info.text()


def test_answered_and_rejected_differ_in_shape_and_are_named_in_the_legend(pate_window_and_run):
    window, _ = pate_window_and_run
    view = window.votes
    assert view.answered_curve.opts["symbol"] != view.rejected_curve.opts["symbol"]
    assert view.answered_curve.opts["symbolSize"] >= 6 and view.rejected_curve.opts["symbolSize"] >= 6
    names = [label.text for _, label in view.consensus_plot.legend.items]
    assert any(n.startswith("answered") for n in names) and any(n.startswith("rejected") for n in names)


def test_votes_view_fills_while_the_run_goes_on(pate_window_and_run, qtbot):
    # The student trains long enough that the votes must be shown before the run ends.
    from engine.config import RunConfig

    window, _ = pate_window_and_run
    values = {k: v for k, v in PATE_DIGITS.items() if k != "epsilon_budget"}
    config = RunConfig(**{**values, "name": "pate-live", "num_queries": 240, "student_epochs": 400})
    run_id = window.start_run(config)
    window.act_votes.trigger()
    qtbot.waitUntil(lambda: len(window.votes.rows) == 240, timeout=RUN_TIMEOUT_MS)
    assert not window.run_data[run_id].finished
    assert "240 queries" in window.votes.info.text()
    window.stop_run()
    qtbot.waitUntil(lambda: window.run_data[run_id].finished, timeout=RUN_TIMEOUT_MS)
