"""The window's Study action: the plan dialog with the study's epsilon before it runs, the study run in
the background by `dpw study` (real processes, real store), its runs grouped in the runs list with the
study's epsilon, and Compare's banner when the best of several runs outside a study could be kept."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMenu

from engine import rounding
from engine.publication import exploratory_note, publishable_epsilon
from engine.study import plan_summary
from engine.study_config import StudyConfig
from workbench.compare import CompareView
from workbench.run_data import RunData
from workbench.runs_model import COLUMNS
from engine.study_rows import exploratory_banner, study_label

BASE = {"name": "base", "dataset": "digits", "model": "mlp", "mechanism": "dpsgd", "noise_multiplier": 1.0,
        "clipping_norm": 1.0, "delta": 1e-5, "expected_batch_size": 60, "epochs": 1, "learning_rate": 1.0,
        "evaluations_per_epoch": 1, "train_subset": 300, "seed": 0}


def column(key: str) -> int:
    return [k for k, _ in COLUMNS].index(key)


def study_file(tmp_path, mode="composition"):
    base = "\n".join(f"{k} = {json.dumps(v)}" for k, v in BASE.items())
    path = tmp_path / "study.toml"
    path.write_text(f'name = "tiny"\nmode = "{mode}"\n[base]\n{base}\n[space]\nnoise_multiplier = [0.8, 1.5]\n',
                    encoding="utf-8")
    return path


def test_the_study_action_is_in_the_run_menu_and_toolbar_with_a_shortcut(window):
    assert window.act_study.shortcut().toString() == "Ctrl+T"
    assert window.act_study in window.toolbar.actions()
    run_menu = next(m for m in window.menuBar().findChildren(QMenu) if m.title() == "&Run")
    assert window.act_study in run_menu.actions()


def test_a_bad_study_file_is_one_line_in_a_message_not_a_dialog(window, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    shown = []
    monkeypatch.setattr(QMessageBox, "warning", lambda *args: shown.append(args[2]))
    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\nmode = "tuning"\n', encoding="utf-8")
    assert window.open_study(str(path)) is None
    assert len(shown) == 1 and "mode" in shown[0] and "\n" not in shown[0].strip()


def test_a_study_shows_its_plan_then_runs_in_the_background_grouped_in_the_runs_list(window, qtbot, tmp_path):
    path = study_file(tmp_path)
    dialog = window.open_study(str(path))
    assert dialog is not None and not dialog.start_button.isEnabled()  # not before its epsilon is shown
    assert "2 combinations" in dialog.rows()["Space"]
    qtbot.waitUntil(dialog.start_button.isEnabled, timeout=120_000)
    expected = plan_summary(StudyConfig.load_toml(path))
    assert dialog.rows()["Study epsilon"].startswith(f"{rounding.up(expected['epsilon'], '.4g')} at delta 1e-05 (pld-composition)")
    dialog.start_button.click()
    qtbot.waitUntil(lambda: bool(getattr(window, "studies", [])), timeout=5000)
    study = window.studies[-1]
    with qtbot.waitSignal(study.ended, timeout=300_000) as ended:
        pass
    study_id, status, message = ended.args
    assert status == "finished" and message == ""
    window.refresh_runs()
    rows = window.runs_model.rows
    assert len(rows) == 2 and all(r["study_id"] == study_id for r in rows)
    labels = {window.runs_model.index(r, column("study")).data() for r in range(window.runs_model.rowCount())}
    assert labels == {f"{study_id} tiny (composition)"}
    shown = {window.runs_model.index(r, column("epsilon")).data() for r in range(window.runs_model.rowCount())}
    assert shown == {rounding.up(expected['epsilon'], '.3g')}  # the study's epsilon, never a lone run's
    tip = window.runs_model.index(0, column("epsilon")).data(Qt.ItemDataRole.ToolTipRole)
    assert "composes all of them" in tip
    window.runs_model.set_filter_text("composition")  # the filter box matches the Study column too
    assert window.runs_model.rowCount() == 2
    window.runs_model.set_filter_text("")
    # Both runs compared: one composition study, every run releasable: choosing is covered, no banner.
    window.select_runs([r["id"] for r in rows])
    window.compare_selected()
    assert window.compare.banner.isHidden()
    # The dashboard of a candidate leads with the study's epsilon, as the list does.
    window.select_runs([rows[0]["id"]])
    header = window.dashboard.budget_label.text()
    assert header.startswith(f"ε {rounding.up(expected['epsilon'], '.3g')} (publishable: study {study_id} (composition)"), header
    assert "this run alone: ε" in header


def run_row(run_id, study=None, dataset="digits"):
    return {"id": run_id, "name": f"r{run_id}", "mechanism": "dpsgd", "dataset": dataset, "status": "finished",
            "epsilon": 2.0, "delta": 1e-5, "accountant": "pld", "accuracy": 0.5 + run_id / 100,
            "config": {"reproducible_noise": False}, "summary": {}, "study": study,
            "study_id": None if study is None else study["id"]}


def test_compare_warns_that_keeping_the_best_of_runs_outside_a_study_is_not_covered(qtbot):
    view = CompareView()
    qtbot.addWidget(view)
    rows = [run_row(1), run_row(2), run_row(3)]
    view.show_runs([(r, RunData(run_id=r["id"], mechanism="dpsgd")) for r in rows], rows)
    assert not view.banner.isHidden()
    assert "selected among 3 runs on the same data; the selection is not covered by this epsilon" in view.banner.text()
    one_each = [run_row(1), run_row(2, dataset="mnist")]  # one run per dataset: nothing to choose among
    view.show_runs([(r, RunData(run_id=r["id"], mechanism="dpsgd")) for r in one_each], one_each)
    assert view.banner.isHidden()
    # A PATE run on the same data is among the choices too, on its own tab as on the DP-SGD one (it
    # counted only the runs of the shown tab, and was gone on the PATE tab).
    mixed = rows + [dict(run_row(4), mechanism="pate", accountant="pate-di")]
    view.show_runs([(r, RunData(run_id=r["id"], mechanism=r["mechanism"])) for r in mixed], mixed)
    for key in view.groups:
        view.show_group(key)
        assert not view.banner.isHidden() and "selected among 4 runs on the same data" in view.banner.text(), key


def test_the_exploratory_sentence_is_singular_for_one_run():
    assert exploratory_note(1) == "selected among 1 run on the same data; the selection is not covered by this epsilon"
    assert exploratory_note(4).startswith("selected among 4 runs on the same data")
    assert exploratory_note(None).startswith("selected among several runs")
    study = {"id": 7, "name": "s", "mode": "exploratory", "status": "finished", "num_candidates": 1,
             "released_run_id": 1}
    assert publishable_epsilon(run_row(1, study)).note == exploratory_note(1)
    assert study_label(run_row(1, study)) == "7 s (exploratory, selected)"


@pytest.mark.parametrize("status, released, label", [
    ("finished", 5, "3 p (private, released)"), ("finished", 6, "3 p (private, not released)"),
    ("running", None, "3 p (private, running)"), ("interrupted", None, "3 p (private, interrupted)")])
def test_the_study_column_says_what_became_of_a_private_candidate(status, released, label):
    study = {"id": 3, "name": "p", "mode": "private", "status": status, "released_run_id": released}
    assert study_label(run_row(5, study)) == label
    assert exploratory_banner([run_row(5, study)]) is None  # one run: nothing to choose among


def test_closing_the_window_stops_a_running_study_with_the_privacy_it_spent(window, qtbot, tmp_path, db_path):
    from engine.store import Store

    path = study_file(tmp_path)
    path.write_text(path.read_text().replace("epochs = 1", "epochs = 200"), encoding="utf-8")
    study = window.start_study(path)
    with qtbot.waitSignal(study.candidate, timeout=120_000) as first:
        pass
    run_id = first.args[0]
    store = Store(db_path)
    qtbot.waitUntil(lambda: (store.get_run(run_id)["steps_done"] or 0) > 0, timeout=120_000)
    window.close()
    assert not study.running()
    row = store.get_study(store.get_run(run_id)["study_id"])
    assert row["status"] == "stopped" and row["num_candidates"] == 1
    assert row["epsilon"] is not None and row["accountant"] == "pld-composition"
    assert store.get_run(run_id)["status"] == "stopped"


def test_quitting_with_a_running_study_asks_first_and_cancel_keeps_it_going(window, qtbot, tmp_path, db_path):
    """A person quitting is told that the study stops (a private one stopped early releases nothing) and
    may cancel; stopping it records what it spent, as above."""
    from engine.store import Store
    from test_runs import answer_close_dialog

    path = study_file(tmp_path, mode="private")
    path.write_text(path.read_text().replace('mode = "private"', 'mode = "private"\nmean_runs = 3')
                    .replace("epochs = 1", "epochs = 200"), encoding="utf-8")
    study = window.start_study(path)
    with qtbot.waitSignal(study.candidate, timeout=120_000) as first:
        pass
    seen = answer_close_dialog(qtbot, "Cancel")
    window.act_quit.trigger()
    assert seen and "study.toml" in seen[0] and "releases nothing" in seen[0]
    assert window.isVisible() and study.running()
    seen = answer_close_dialog(qtbot, "Stop runs and close")
    window.act_quit.trigger()
    assert not window.isVisible() and not study.running()
    store = Store(db_path)
    row = store.get_study(store.get_run(first.args[0])["study_id"])
    assert row["status"] == "stopped" and row["released_run_id"] is None


def test_the_first_open_dialogs_start_in_the_bundled_examples_then_in_the_last_folder(window, tmp_path, monkeypatch):
    """A newcomer's first File > Open config (or Study) starts where the example configs are; later ones
    where the last file was opened from."""
    from PySide6.QtWidgets import QFileDialog

    from workbench.main_window import EXAMPLES_DIR

    started = []
    chosen = iter(["", str(EXAMPLES_DIR / "quickstart.toml"), ""])
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        lambda parent, title, start, filter: (started.append(start), (next(chosen), ""))[1])
    assert window.open_config() is False  # cancelled
    assert window.open_config() is True
    copy = tmp_path / "mine.toml"
    copy.write_text((EXAMPLES_DIR / "quickstart.toml").read_text(encoding="utf-8"), encoding="utf-8")
    window.open_config(str(copy))  # opened by path (e.g. from a recent file): remembered too
    window.open_config()
    assert started == [str(EXAMPLES_DIR), str(EXAMPLES_DIR), str(tmp_path)]
    assert (EXAMPLES_DIR / "study-digits.toml").is_file()  # the study dialog's first folder holds studies too


def test_open_config_loads_a_file_with_wrong_settings_and_marks_every_one(window, tmp_path, monkeypatch):
    """A file with six problems: the window said only the first ('frobnicate: is not a known setting')
    and loaded nothing; with that key removed, only the next one."""
    from PySide6.QtWidgets import QMessageBox

    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad-config"\ndataset = "digits"\nmodel = "mnist_cnn"\nmechanism = "dpsgd"\n'
                   'noise_multiplier = -1\nclipping_norm = "one"\ndelta = 0.5\nexpected_batch_size = 64\n'
                   'epochs = 2\noptimizer = "adamw"\nfrobnicate = 3\ndata_dir = "data"\n', encoding="utf-8")
    said = []
    monkeypatch.setattr(QMessageBox, "warning", lambda *args: said.append(args[2]))
    assert window.open_config(str(bad)) is True
    form = window.form
    assert form.state.texts["name"] == "bad-config" and form.state.texts["epochs"] == "2"
    assert form.state.texts["data_dir"] == str(tmp_path / "data")  # relative to the file, as for a valid one
    assert {"noise_multiplier", "clipping_norm", "optimizer"} <= set(form.errors)  # delta: against N, once read
    assert not form.start_button.isEnabled()
    (message,) = said
    assert f"the {len(form.errors)} that need fixing are marked there" in message
    assert "Not known, left out: frobnicate." in message
    optimizer = form.fields["optimizer"].editor
    assert optimizer.currentIndex() == -1  # 'adamw' is no choice: shown as none, not as 'sgd'
    optimizer.setCurrentIndex(optimizer.findText("sgd"))  # the user's choice is taken as a change
    assert "optimizer" not in form.errors and form.state.texts["optimizer"] == "sgd"
    assert window.tabs.currentWidget() is form
