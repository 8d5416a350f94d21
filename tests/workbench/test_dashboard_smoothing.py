"""Smoothing of the noisy train-loss curve: what is drawn changes, the run's data does not, and the choice
is remembered."""

from __future__ import annotations

import numpy as np

from workbench.dashboard import Dashboard
from workbench.plots import ema
from workbench.run_data import RunData


def noisy_run() -> RunData:
    data = RunData(run_id=1, name="noisy", mechanism="dpsgd", config={"reproducible_noise": False, "delta": 1e-5})
    data.apply({"type": "plan", "steps": 200, "accountant": "pld", "delta": 1e-5})
    rng = np.random.default_rng(3)
    for step in range(1, 201):
        data.apply({"type": "metric", "step": step, "name": "train_loss",
                    "value": float(2.0 / step ** 0.3 + rng.normal(0, 0.2))})
    data.apply({"type": "finished", "status": "finished", "summary": {}})
    return data


def make_dashboard(qtbot) -> Dashboard:
    view = Dashboard()
    qtbot.addWidget(view)
    view.resize(1000, 700)
    view.show()
    qtbot.waitExposed(view)
    return view


def drawn_points(view: Dashboard) -> int:
    y = view.train_loss.smooth.yData
    return 0 if y is None else len(y)


def test_the_ema_is_debiased_and_zero_weight_is_the_raw_curve():
    y = np.array([4.0, 4.0, 4.0, 0.0])
    assert np.allclose(ema(y, 0.0), y)
    smoothed = ema(y, 0.5)
    assert np.allclose(smoothed[:3], 4.0)  # debiased: no pull towards 0 at the start
    assert np.isclose(smoothed[3], (0.5 * 3.5 + 0.5 * 0.0) / (1 - 0.5 ** 4))  # s_2 = 3.5 before debiasing


def test_smoothing_changes_the_drawn_curve_not_the_runs_data(qtbot):
    view = make_dashboard(qtbot)
    data = noisy_run()
    stored = data.metrics["train_loss"].y.copy()
    view.show_run(data)
    raw = view.train_loss.raw
    assert np.array_equal(raw.yData, stored) and not drawn_points(view)
    view.smooth_box.setChecked(True)
    view.smooth_slider.setValue(90)
    drawn = np.asarray(view.train_loss.smooth.yData)
    assert drawn.shape == stored.shape and not np.allclose(drawn, stored)
    assert np.std(np.diff(drawn)) < np.std(np.diff(stored)) / 3  # visibly smoother
    assert np.array_equal(raw.yData, stored)  # the raw curve stays, exact, faint behind
    assert raw.opts["pen"].color().alpha() < 255
    assert np.array_equal(data.metrics["train_loss"].y, stored)  # the run's data is untouched
    names = [label.text for _, label in view.loss_plot.legend.items]
    assert "train loss (smoothed)" in names
    view.smooth_box.setChecked(False)
    assert raw.opts["pen"].color().alpha() == 255 and not drawn_points(view)
    assert "train loss (smoothed)" not in [label.text for _, label in view.loss_plot.legend.items]


def test_the_smoothing_choice_is_remembered(qtbot):
    first = make_dashboard(qtbot)
    first.smooth_box.setChecked(True)
    first.smooth_slider.setValue(75)
    again = make_dashboard(qtbot)
    assert again.smooth_box.isChecked() and again.smoothing == 0.75
    assert again.loss_plot.smoothing == 0.75
