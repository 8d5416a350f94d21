"""Compare's scatter of finished runs keeps to the selected runs' dataset and mechanism."""

from __future__ import annotations

from workbench.compare import CompareView
from workbench.run_data import RunData

SECRET = {"reproducible_noise": False}


def row(run_id: int, dataset: str, mechanism: str, epsilon: float, accuracy: float) -> dict:
    return {"id": run_id, "name": f"r{run_id}", "dataset": dataset, "mechanism": mechanism, "status": "finished",
            "epsilon": epsilon, "delta": 1e-5, "accountant": "pld" if mechanism == "dpsgd" else "pate-di",
            "accuracy": accuracy, "config": dict(SECRET, dataset=dataset),
            "summary": {"epsilon_data_independent": epsilon, "delta": 1e-5} if mechanism == "pate" else {}}


def test_the_scatter_leaves_out_other_datasets_and_mechanisms(qtbot):
    rows = [row(1, "mnist", "dpsgd", 0.8, 0.86), row(2, "mnist", "dpsgd", 2.1, 0.87),
            row(3, "digits", "dpsgd", 2.3, 0.70), row(4, "digits", "pate", 159.0, 0.73),
            row(5, "mnist", "dpsgd", 4.4, 0.88)]
    view = CompareView()
    qtbot.addWidget(view)
    selected = [(r, RunData(run_id=r["id"], mechanism="dpsgd")) for r in rows if r["id"] in (1, 2)]
    view.show_runs(selected, rows)
    placed = sorted(spot.data() for spot in view.scatter.points())
    assert placed == [1, 2, 5]  # not the digits runs, not PATE at ε 159
    assert " ".join(view.scatter_plot.title_lines) == "Finished runs (mnist, dpsgd)"
    assert view.scatter_plot.getPlotItem().getAxis("bottom").labelText == "final publishable ε"


def test_runs_of_other_datasets_or_mechanisms_are_never_on_one_axis(qtbot):
    rows = [row(1, "mnist", "dpsgd", 0.8, 0.86), row(2, "digits", "dpsgd", 2.3, 0.70),
            row(3, "mnist", "dpsgd", 2.1, 0.87), row(4, "mnist", "pate", 5.0, 0.80)]
    view = CompareView()
    qtbot.addWidget(view)
    view.show_runs([(r, RunData(run_id=r["id"], mechanism=r["mechanism"])) for r in rows], rows)
    tabs = [view.group_tabs.tabText(i) for i in range(view.group_tabs.count())]
    assert tabs == ["mnist · DP-SGD (2 runs)", "digits · DP-SGD (1 run)", "mnist · PATE (1 run)"]
    assert not view.group_tabs.isHidden()

    def plotted() -> list[str]:
        return [c.name() for c in view.tradeoff.getPlotItem().listDataItems() if c.name()]

    assert plotted() == ["1: r1", "3: r3"]
    assert sorted(spot.data() for spot in view.scatter.points()) == [1, 3]
    view.show_group(("mnist", "pate"))
    assert plotted() == ["4: r4"] and [spot.data() for spot in view.scatter.points()] == [4]
    assert view.eps_steps.getPlotItem().getAxis("bottom").labelText == "queries"
    assert view.table.columnCount() == 4  # the table keeps every selected run


def test_the_config_table_starts_with_results_and_uses_the_forms_labels_and_units(qtbot):
    from engine.config import RunConfig

    rows = []
    for run_id, noise in ((1, 1.1), (2, 0.8)):
        config = RunConfig(name=f"r{run_id}", dataset="digits", noise_multiplier=noise, delta=1e-5,
                           reproducible_noise=False).to_dict()
        rows.append({**row(run_id, "digits", "dpsgd", 1.5 * run_id, 0.9), "config": config, "steps_done": 85,
                     "steps_planned": 169, "started": "2026-11-24T04:30:00+00:00",
                     "finished": "2026-11-24T04:31:05+00:00"})
    view = CompareView()
    qtbot.addWidget(view)
    view.show_runs([(r, RunData(run_id=r["id"], mechanism="dpsgd")) for r in rows], rows)
    labels = view.row_labels()
    assert labels[:7] == ["Test accuracy", "ε (publishable)", "δ", "Accountant", "Steps done / planned", "Wall time",
                          "Status"]
    # the differences, first among settings; the name heads the run's column, not a row
    assert labels[7] == "Noise multiplier (× clipping norm)" and "Name" not in labels
    assert "noise_multiplier" not in labels and "Delta (δ)" in labels and "Clipping norm (L2 norm)" in labels
    cells = [[view.table.item(i, j).text() for j in range(2)] for i in range(8)]
    assert cells[0] == ["0.9000", "0.9000"] and cells[1] == ["1.5", "3"] and cells[2] == ["1e-05", "1e-05"]
    assert cells[4] == ["85 / 169", "85 / 169"] and cells[5] == ["1 min 05 s", "1 min 05 s"]
    assert cells[7] == ["1.1", "0.8"]
    assert view.group_tabs.isHidden()  # one group: no tabs


def test_a_setting_another_mechanism_does_not_use_is_not_a_difference(qtbot):
    from engine.config import RunConfig

    dpsgd = {**row(1, "mnist", "dpsgd", 1.0, 0.9),
             "config": RunConfig(name="a", noise_multiplier=1.0, reproducible_noise=False).to_dict()}
    pate = {**row(2, "mnist", "pate", 3.0, 0.8),
            "config": RunConfig(name="b", mechanism="pate", noise_multiplier=1.0, reproducible_noise=False).to_dict()}
    view = CompareView()
    qtbot.addWidget(view)
    view.show_runs([(r, RunData(run_id=r["id"], mechanism=r["mechanism"])) for r in (dpsgd, pate)], [dpsgd, pate])
    assert "num_teachers" not in view.differing and "clipping_norm" not in view.differing
    labels = view.row_labels()
    teachers = next(i for i, label in enumerate(labels) if label.startswith("Teachers") or "teachers" in label.lower())
    assert view.table.item(teachers, 0).text() == "—"
