"""The window shows each run's publishable epsilon (engine.publication) and says 'no guarantee' for
reproducible-noise runs: runs list, dashboard header, compare axes."""

from __future__ import annotations

from PySide6.QtCore import Qt

from workbench.compare import CompareView, accuracy_vs_epsilon
from workbench.run_data import RunData
from workbench.runs_model import COLUMNS, RunsModel

EPS_COLUMN = [key for key, _ in COLUMNS].index("epsilon")
PATE_SUMMARY = {"epsilon_data_dependent": 1.2, "epsilon_data_independent": 4.0, "epsilon_released": 2.5}


def rows():
    secret = {"reproducible_noise": False, "noise_sampler": "standard"}
    return [
        {"id": 1, "name": "dp", "mechanism": "dpsgd", "status": "finished", "epsilon": 3.0, "delta": 1e-5,
         "accountant": "pld", "accuracy": 0.9, "config": secret, "summary": {}},
        {"id": 2, "name": "seeded", "mechanism": "dpsgd", "status": "finished", "epsilon": 3.0, "delta": 1e-5,
         "accountant": "pld", "accuracy": 0.9, "config": dict(secret, reproducible_noise=True), "summary": {}},
        # A PATE row stored before the publishable epsilon led: the column held the data-dependent value.
        {"id": 3, "name": "pate", "mechanism": "pate", "status": "finished", "epsilon": 1.2, "delta": 1e-5,
         "accountant": "pate-dd", "accuracy": 0.8, "config": secret, "summary": PATE_SUMMARY},
        {"id": 4, "name": "base", "mechanism": "none", "status": "finished", "accuracy": 0.95, "config": secret},
    ]


def test_runs_list_shows_the_publishable_epsilon_and_no_guarantee(qtbot):
    model = RunsModel()
    model.set_rows(rows())
    shown = {model.run_at(r)["id"]: model.data(model.index(r, EPS_COLUMN)) for r in range(model.rowCount())}
    assert shown == {1: "3", 2: "3 (no guarantee)", 3: "4", 4: "∞"}
    tips = {model.run_at(r)["id"]: model.data(model.index(r, EPS_COLUMN), Qt.ItemDataRole.ToolTipRole)
            for r in range(model.rowCount())}
    assert tips[2].startswith("No differential privacy guarantee: the noise is reproducible from the published seed")
    assert "pate-di" in tips[3] and "data-independent bound, which holds whatever the teachers' votes" in tips[3]


def test_an_infinite_epsilon_is_shown_as_no_guarantee_in_the_list_and_the_run_details(qtbot):
    """Noise multiplier 1e-9 gives epsilon inf: the list showed "inf" and the details "inf" as if it were
    a guarantee like any other."""
    from engine.publication import NO_FINITE_BOUND_STATEMENT
    from workbench.runs_panel import result_values

    row = dict(rows()[0], id=5, epsilon=float("inf"))
    model = RunsModel()
    model.set_rows([row])
    assert model.data(model.index(0, EPS_COLUMN)) == "∞ (no guarantee)"
    assert model.data(model.index(0, EPS_COLUMN), Qt.ItemDataRole.ToolTipRole).startswith(NO_FINITE_BOUND_STATEMENT)
    assert dict(result_values(row))["ε (publishable)"] == "∞ (no finite guarantee: the noise bounds nothing)"
    assert dict(result_values(rows()[0]))["ε (publishable)"] == "3"


def test_compare_places_pate_at_its_publishable_epsilon_and_labels_seeded_runs(qtbot):
    pate = RunData(run_id=3, mechanism="pate")
    pate.apply({"type": "metric", "step": 10, "name": "test_accuracy", "value": 0.8})
    eps, acc = accuracy_vs_epsilon(pate, rows()[2])
    assert list(eps) == [4.0] and list(acc) == [0.8]

    view = CompareView()
    qtbot.addWidget(view)
    runs = []
    for row in rows()[:3]:
        data = RunData(run_id=row["id"], mechanism=row["mechanism"], config=row["config"])
        data.apply({"type": "metric", "step": 10, "name": "test_accuracy", "value": row["accuracy"]})
        runs.append((row, data))
    view.show_runs(runs, rows())
    positions = {spot.data(): spot.pos().x() for spot in view.scatter.points()}
    assert positions == {1: 3.0, 2: 3.0}  # one mechanism per axis: PATE is in a group of its own
    assert view.tradeoff.getPlotItem().getAxis("bottom").labelText == "publishable ε"
    assert " ".join(view.tradeoff.title_lines) == "Accuracy against privacy (? · DP-SGD)"  # rows name no dataset
    view.show_group(next(k for k in view.groups if k[1] == "pate"))
    assert {spot.data(): spot.pos().x() for spot in view.scatter.points()} == {3: 4.0}
    view.show_group(next(k for k in view.groups if k[1] == "dpsgd"))
    labels = [item.text for _, item in view.tradeoff.legend.items]
    assert "2: seeded (no guarantee)" in labels and "1: dp" in labels


def test_pate_epsilon_curve_is_the_data_independent_bound_never_the_released_estimate():
    data = RunData(run_id=1, mechanism="pate")
    for step, dd, di in ((100, 0.5, 2.0), (200, 0.9, 3.5), (300, 1.2, 4.0)):
        data.apply({"type": "privacy", "step": step, "epsilon": dd, "accountant": "pate-dd"})
        data.apply({"type": "privacy", "step": step, "epsilon": di, "accountant": "pate-di"})
    name, series = data.epsilon_series()
    assert name == "publishable" and list(series.y) == [2.0, 3.5, 4.0]
    data.apply({"type": "privacy", "step": 300, "epsilon": 2.5, "accountant": "pate-released"})
    name, series = data.epsilon_series()  # it dropped to the release, which bounds nothing
    assert list(series.x) == [100, 200, 300] and list(series.y) == [2.0, 3.5, 4.0]


def test_dashboard_header_leads_with_the_publishable_epsilon(qtbot):
    from workbench.dashboard import Dashboard

    dashboard = Dashboard()
    qtbot.addWidget(dashboard)
    pate = RunData(run_id=3, mechanism="pate", config={"reproducible_noise": False, "aggregator": "confident"})
    for accountant, value in (("pate-dd", 1.2), ("pate-di", 4.0), ("pate-released", 2.5)):
        pate.apply({"type": "privacy", "step": 300, "epsilon": value, "accountant": accountant})
    pate.summary = dict(PATE_SUMMARY)
    dashboard._budget_text(pate)
    text = dashboard.budget_label.text()
    assert text.startswith("ε 4 (publishable, pate-di")
    assert "data-dependent ε ≈ 2.5 (released estimate, not a bound)" in text
    assert "data-dependent ε 1.2 (private diagnostic, not publishable)" in text

    seeded = RunData(run_id=2, mechanism="dpsgd", config={"reproducible_noise": True, "accountant": "pld"})
    seeded.apply({"type": "privacy", "step": 5, "epsilon": 3.0, "accountant": "pld"})
    dashboard._budget_text(seeded)
    assert dashboard.budget_label.text().startswith("NO GUARANTEE (reproducible noise)  ·  ε 3 (pld")

    unbounded = RunData(run_id=5, mechanism="dpsgd", config={"reproducible_noise": False, "accountant": "pld"})
    unbounded.apply({"type": "privacy", "step": 23, "epsilon": float("inf"), "accountant": "pld"})
    dashboard._budget_text(unbounded)
    assert dashboard.budget_label.text().startswith("ε ∞: NO FINITE GUARANTEE (pld")


def test_dashboard_header_of_a_study_candidate_states_what_the_study_lets_it_state(qtbot):
    """A run of a study: the released candidate leads with the study's epsilon (which covers the
    search), a candidate not released with 'no ε to publish', a running study's with none yet; the
    run's own epsilon follows as 'this run alone', never as the publishable one."""
    from workbench.dashboard import Dashboard

    dashboard = Dashboard()
    qtbot.addWidget(dashboard)
    study = {"id": 4, "name": "s", "mode": "private", "status": "finished", "released_run_id": 9,
             "epsilon": 4.302, "delta": 1e-5, "accountant": "rdp-repeat-and-select", "num_candidates": 5}

    def header(run_id: int, study: dict) -> str:
        data = RunData(run_id=run_id, mechanism="dpsgd", config={"reproducible_noise": False, "accountant": "pld"},
                       study=study)
        data.apply({"type": "privacy", "step": 45, "epsilon": 2.31, "accountant": "pld"})
        dashboard._budget_text(data)
        return dashboard.budget_label.text()

    released = header(9, study)
    assert released.startswith("ε 4.31 (publishable: study 4 (private), rdp-repeat-and-select, δ 1e-05)")  # 4.302, rounded up
    assert "this run alone: ε 2.31 (pld" in released
    withheld = header(7, study)
    assert withheld.startswith("study 4 (private): not released, no ε to publish")
    assert "publishable" not in withheld.replace("no ε to publish", "") and "this run alone: ε 2.31" in withheld
    running = header(9, {**study, "status": "running", "epsilon": None, "released_run_id": None})
    assert running.startswith("study 4 (private), running: no ε yet")


def test_a_run_without_a_guarantee_has_no_number_under_the_publishable_label(qtbot):
    """The results panel read "ε (publishable)  2.311 (no guarantee)"; the Compare table likewise."""
    from engine.run_comparison import result_texts
    from workbench.runs_panel import result_values

    seeded = dict(rows()[1], epsilon=2.3114)
    expected = "none: no guarantee (reproducible noise); accounted 2.312"
    assert dict(result_values(seeded))["ε (publishable)"] == expected
    assert result_texts(seeded)["epsilon"] == expected
    assert result_texts(dict(rows()[0], epsilon=2.3114))["epsilon"] == "2.312"  # rounded up, never "2.311"


def test_the_results_panel_names_which_time_it_shows():
    """'Duration 17 s' in the window beside 'time 8.6 s' in dpw show, for one run: the window's is start
    to end (loading, training, audit), dpw show's the training alone."""
    from workbench.runs_panel import result_values

    row = dict(rows()[0], started="2026-11-29T10:00:00+00:00", finished="2026-11-29T10:00:17+00:00",
               summary={"seconds": 8.6, "samples_per_second": 1673})
    shown = dict(result_values(row))
    assert (shown["Training time"], shown["Wall time"]) == ("9 s", "17 s")
    assert "Duration" not in shown
