"""The dashboard's plots and progress bar on runs built from real event streams (no runner needed)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from PySide6.QtCore import QPointF

from workbench.dashboard import Dashboard
from workbench.plots import accountant_colour, colour
from workbench.progress import progress, seconds_left
from workbench.run_data import RunData


def dpsgd_run(run_id: int = 1, *, steps: int = 85, planned: int = 169, allowed: int = 85, budget: float = 10.0,
              accountants=("rdp", "pld"), status: str | None = "finished") -> RunData:
    data = RunData(run_id=run_id, name=f"run-{run_id}", mechanism="dpsgd",
                   config={"epsilon_budget": budget, "accountant": "pld", "reproducible_noise": False,
                           "delta": 1e-5})
    data.apply({"type": "plan", "steps": planned, "steps_allowed": allowed, "epsilon_budget": budget,
                "accountant": "pld", "delta": 1e-5})
    data.apply({"type": "progress", "phase": "training", "done": 0, "total": planned})
    for step in range(1, steps + 1):
        data.apply({"type": "metric", "step": step, "name": "train_loss", "value": 2.0 / step})
        for name in accountants:  # rdp (live) is looser than pld
            data.apply({"type": "privacy", "step": step, "accountant": name,
                        "epsilon": (0.14 if name == "rdp" else 0.1) * step ** 0.8})
        if step % 40 == 0:
            data.apply({"type": "progress", "phase": "training", "done": step - 1, "total": planned})
    data.apply({"type": "metric", "step": steps, "name": "test_accuracy", "value": 0.93})
    if status is not None:
        data.apply({"type": "finished", "status": status, "summary": {}})
    return data


@pytest.fixture
def dashboard(qtbot):
    view = Dashboard()
    qtbot.addWidget(view)
    view.resize(1000, 700)
    view.show()
    qtbot.waitExposed(view)
    return view


def y_range(plot) -> list[float]:
    return plot.getPlotItem().getViewBox().viewRange()[1]


def test_accuracy_axis_stays_within_0_and_1_with_a_single_evaluation(dashboard, qtbot):
    dashboard.show_run(dpsgd_run())
    qtbot.wait(100)
    low, high = y_range(dashboard.acc_plot)
    assert 0.0 <= low < 0.93 < high <= 1.0
    dashboard.acc_plot.getPlotItem().getViewBox().scaleBy(s=(1.0, 4.0))  # zoom out by hand
    low, high = y_range(dashboard.acc_plot)
    assert 0.0 <= low and high <= 1.0


def test_a_queued_run_does_not_keep_the_previous_runs_axes(dashboard, qtbot):
    dashboard.show_run(dpsgd_run(steps=150, planned=200, allowed=200, budget=50.0))
    qtbot.wait(100)
    queued = RunData(run_id=2, name="waiting", mechanism="dpsgd", config={"epsilon_budget": 3.0})
    dashboard.show_run(queued)
    qtbot.wait(100)
    for plot in (dashboard.acc_plot, dashboard.loss_plot, dashboard.eps_plot):
        (x0, x1), (y0, y1) = plot.getPlotItem().getViewBox().viewRange()
        assert x0 >= -0.1 and x1 <= 2 and y0 >= -0.1, (plot._title, x0, x1, y0, y1)
    assert dashboard.curves["test_accuracy"].xData is None or len(dashboard.curves["test_accuracy"].xData) == 0
    assert 3.0 <= y_range(dashboard.eps_plot)[1] <= 3.6  # its own budget


def test_hover_reads_out_the_exact_value_of_the_nearest_point(dashboard, qtbot):
    dashboard.show_run(dpsgd_run())
    qtbot.wait(100)
    plot = dashboard.eps_plot
    view = plot.getPlotItem().getViewBox()
    exact = 0.1 * 40 ** 0.8
    scene = view.mapViewToScene(QPointF(40, exact))
    text = plot.readout(scene + QPointF(2, 1))
    assert text.splitlines()[0] == "pld"
    assert text.splitlines()[1] == f"step 40, ε {exact:.4g}"
    plot._mouse_moved(scene)
    assert plot.hover.isVisible() and "pld" in plot.hover.textItem.toPlainText()
    far = view.mapViewToScene(QPointF(5, 100.0))  # far from every point
    assert plot.readout(far) == ""


def test_each_accountant_keeps_its_colour_whatever_order_curves_arrive_in(dashboard, qtbot):
    live = dpsgd_run(accountants=("rdp", "pld"))
    dashboard.show_run(live)
    first = {n: c.opts["pen"].color().name() for n, c in dashboard.eps_curves.items()}
    dashboard.show_run(dpsgd_run(run_id=2, accountants=("pld", "rdp")))
    second = {n: c.opts["pen"].color().name() for n, c in dashboard.eps_curves.items()}
    assert first == second
    assert first["pld"] == colour(accountant_colour("pld")).name() != first["rdp"]


def test_every_plot_keeps_up_with_a_run_whose_events_come_every_frame(dashboard, qtbot):
    """A fast run's events change its data before every redraw tick; each tick draws one plot, and
    each plot is drawn in turn (the privacy plot, last of three, stood still for seconds while the
    accuracy plot was drawn again and again)."""
    data = dpsgd_run(steps=20, status=None)
    dashboard.show_run(data)
    for step in range(21, 41):  # one step's events between two ticks
        data.apply({"type": "metric", "step": step, "name": "train_loss", "value": 2.0 / step})
        data.apply({"type": "privacy", "step": step, "accountant": "pld", "epsilon": 0.1 * step ** 0.8})
        dashboard._tick()
    drawn = {name: curve.getData()[0] for name, curve in dashboard.eps_curves.items()}
    assert drawn["pld"][-1] >= 40 - len(dashboard._groups(data))  # at most one round of plots behind


def test_a_live_rdp_curve_over_the_budget_is_explained_when_pld_stays_under(dashboard, qtbot):
    data = dpsgd_run(budget=3.0)  # rdp ends at 4.7, pld at 3.5 at step 85; pld below 3 up to step 68
    data.privacy["pld"].y[:] = np.minimum(data.privacy["pld"].y, 2.9)
    data.privacy["pld"].y[-1] = 2.8912  # shown rounded up, as every epsilon: never below the bound
    dashboard.show_run(data)
    assert dashboard.eps_note.isVisible()
    note = dashboard.eps_note.textItem.toPlainText()
    assert "pld" in note and "not a breach" in note and "2.9 ≤ 3" in note
    dashboard.show_run(dpsgd_run(run_id=3, budget=50.0))
    assert not dashboard.eps_note.isVisible()


def test_the_legend_sits_under_the_plot_not_over_the_budget_line(dashboard, qtbot):
    dashboard.show_run(dpsgd_run())
    qtbot.wait(100)
    item = dashboard.eps_plot.getPlotItem()
    legend = dashboard.eps_plot.legend
    view_rect = item.getViewBox().sceneBoundingRect()
    assert legend.sceneBoundingRect().top() >= view_rect.bottom()
    assert len(legend.items) == 2


def test_log_axis_moves_the_budget_line_with_it(dashboard, qtbot):
    dashboard.show_run(dpsgd_run(budget=10.0))
    dashboard.eps_plot.set_log_y(True)
    assert dashboard.budget_line.value() == pytest.approx(1.0)  # log10(10)
    dashboard.eps_plot.set_log_y(False)
    assert dashboard.budget_line.value() == pytest.approx(10.0)


def test_a_plot_exports_png_svg_and_its_exact_data_as_csv(dashboard, qtbot, tmp_path):
    data = dpsgd_run()
    dashboard.show_run(data)
    qtbot.wait(100)
    plot = dashboard.eps_plot
    png, svg = plot.export_image(tmp_path / "eps.png"), plot.export_image(tmp_path / "eps.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in svg.read_bytes()[:2000]
    rows = list(csv.reader(plot.export_csv(tmp_path / "eps.csv").open()))
    assert rows[0] == ["curve", "step", "ε"]
    pld = [(float(x), float(y)) for name, x, y in rows[1:] if name == "pld"]
    assert len(pld) == 85 and pld[-1] == (85.0, data.privacy["pld"].y[-1])


def test_progress_counts_the_budget_stop(qtbot):
    running = dpsgd_run(steps=67, status=None)
    bar = progress(running)
    assert (bar.done, bar.maximum) == (67, 85)  # not 169: the budget stops training at 85
    running.phase_started, running.phase_done_at_start = 0.0, 0
    assert seconds_left(running, now=67.0) == pytest.approx(18.0)  # 1 s a step, 18 steps to 85


def test_time_left_of_a_continued_run_counts_only_its_own_steps(qtbot):
    """A run continued from step 587 counted those steps as done in its own time: it showed about half
    the time left."""
    from workbench.run_data import RunData

    data = RunData(run_id=2, mechanism="dpsgd")
    data.apply({"type": "started", "resumed_from": 1, "from_step": 587}, live=True)
    data.apply({"type": "progress", "phase": "training", "done": 0, "total": 1798}, live=True)
    data.apply({"type": "progress", "phase": "training", "done": 687, "total": 1798}, live=True)
    data.phase_started = 0.0
    assert seconds_left(data, now=10.0) == pytest.approx(10.0 / 100 * (1798 - 687))


def test_a_run_that_ended_during_its_canary_audit_shows_its_training_not_a_full_audit_bar(dashboard, qtbot):
    """The canary audit comes a moment after the last step: a run stopped at step 42 of 169 said
    'auditing 1 / 1 (stopped)' with a full bar."""
    data = dpsgd_run(steps=42, allowed=None, status=None)
    data.apply({"type": "progress", "phase": "auditing", "done": 0, "total": 1})
    assert progress(data).text == "0 / 1"  # while it audits, the audit's own progress
    data.apply({"type": "progress", "phase": "auditing", "done": 1, "total": 1})
    data.apply({"type": "finished", "status": "stopped", "summary": {}})
    dashboard.show_run(data)
    assert dashboard.progress.text() == "42 / 169 (stopped)" and dashboard.progress.value() == 42
    assert dashboard.phase_label.text() == "Training"


def test_header_step_and_bar_agree_and_a_failed_run_without_steps_shows_an_empty_bar(dashboard, qtbot):
    data = dpsgd_run(steps=85)  # the last progress event said 79; the curves reached 85
    dashboard.show_run(data)
    assert "ε 3.5 (pld, δ 1e-05, step 85)" in dashboard.budget_label.text()  # with its δ and accountant
    assert dashboard.progress.value() == 85 and dashboard.progress.text().startswith("85 / 85")
    failed = RunData(run_id=4, name="broken", mechanism="dpsgd")
    failed.fail("the dataset file is missing")
    dashboard.show_run(failed)
    assert dashboard.progress.value() == 0 and "100" not in dashboard.progress.text()


def test_fit_to_data_shows_all_of_a_new_curve_not_the_old_view(qtbot):
    from workbench.plots import Plot, set_curve

    plot = Plot("Accuracy against privacy", "publishable ε", "test accuracy")
    qtbot.addWidget(plot)
    plot.resize(400, 300)
    plot.show()
    curve = plot.curve("run 1", 0, symbol="o")
    set_curve(curve, np.linspace(0.3, 2.3, 50), np.linspace(0.2, 0.7, 50))
    plot.fit_to_data()
    qtbot.wait(50)
    plot.clear()
    set_curve(plot.curve("run 2", 1, symbol="o"), np.linspace(1.5, 3.0, 50), np.linspace(0.2, 0.8, 50))
    plot.fit_to_data()
    qtbot.wait(50)
    (x0, x1), _ = plot.getPlotItem().getViewBox().viewRange()
    assert x0 <= 1.5 and x1 >= 3.0
    assert plot.hover.scene() is plot.scene()  # the read-out survives clear()


def test_closing_a_plot_with_a_legend_and_read_out_does_not_crash(qtbot):
    """pyqtgraph's close() deletes the scene's items and then resizes the view; the legend fit must
    not touch the deleted items (it crashed the process before)."""
    from workbench.plots import Plot, set_curve

    plot = Plot("Loss", "step", "loss")
    plot.resize(600, 300)
    plot.show()
    set_curve(plot.curve("train loss", 1), np.arange(10.0), np.arange(10.0))
    qtbot.wait(20)
    plot.close()
    qtbot.wait(20)
    assert plot.closed
