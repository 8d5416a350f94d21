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
    assert view.scatter_plot.getPlotItem().getAxis("bottom").labelText == "final publishable ε (mnist, dpsgd)"
