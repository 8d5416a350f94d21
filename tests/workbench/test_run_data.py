"""The window's Qt-free model of a run: events in, curves out."""

from __future__ import annotations

import numpy as np

from workbench.run_data import RunData, Series
from workbench.votes_view import consensus, running_mean


def test_series_grows_past_its_capacity():
    s = Series()
    for i in range(1000):
        s.append(i, 2 * i)
    s.extend(np.arange(1000, 1500), np.arange(1000, 1500) * 2)
    assert len(s) == 1500 and s.x[-1] == 1499 and s.y[-1] == 2998


def test_a_continued_run_knows_which_run_and_step_it_continues():
    data = RunData(run_id=3)
    data.apply({"type": "started", "name": "a", "mechanism": "dpsgd", "config": {}})
    assert data.continues is None
    data.apply({"type": "started", "name": "a", "mechanism": "dpsgd", "config": {}, "resumed_from": 2,
                "from_step": 297})
    assert data.continues == (2, 297)


def test_a_continued_run_read_from_the_store_knows_which_run_and_step_it_continues(tmp_path):
    """A window opened on a store (not following the run) replays it without its `started` event:
    the dashboard's "continues run 2 from step 297" comes from the run's row."""
    from engine.config import RunConfig
    from engine.store import Store

    store = Store(tmp_path / "runs.sqlite")
    config = RunConfig(name="a", dataset="digits", noise_multiplier=1.0)
    first = store.create_run(config)
    store.update_run(first, status="stopped")
    second = store.create_run(config, resumed_from=first)
    store.update_run(second, steps_resumed=297)
    assert RunData.from_store(store, first).continues is None
    assert RunData.from_store(store, second).continues == (first, 297)


def test_events_become_curves_progress_and_messages():
    data = RunData(run_id=1)
    data.apply({"type": "started", "name": "a", "mechanism": "dpsgd", "config": {"accountant": "pld"}})
    data.apply({"type": "plan", "epsilon_budget": 3.0, "accountant": "pld"})
    data.apply({"type": "progress", "phase": "training", "done": 0, "total": 10})
    for step in range(1, 6):
        data.apply({"type": "metric", "step": step, "name": "train_loss", "value": 1.0 / step})
        data.apply({"type": "privacy", "step": step, "epsilon": 0.1 * step, "accountant": "rdp"})
    data.apply({"type": "privacy", "step": 5, "epsilon": 0.3, "accountant": "pld"})
    data.apply({"type": "progress", "phase": "training", "done": 5, "total": 10})
    data.apply({"type": "warning", "message": "careful"})
    assert list(data.metrics["train_loss"].x) == [1, 2, 3, 4, 5]
    assert data.epsilon_series()[0] == "pld"
    assert data.budget == 3.0
    assert (data.done, data.total, data.status) == (5, 10, "running")
    assert data.seconds_left() is not None
    data.apply({"type": "error", "message": "boom", "where": "training", "hint": "do this"})
    data.apply({"type": "finished", "status": "failed", "summary": {}})
    assert data.finished and data.status == "failed"
    assert data.messages[-1].text == "boom (while training)" and data.messages[-1].hint == "do this"


def test_vote_batches_count_answered_and_rejected():
    data = RunData(run_id=1)
    data.apply({"type": "vote_batch", "first_query": 0, "count": 100, "answered": 60, "rejected": 40})
    data.apply({"type": "vote_batch", "first_query": 100, "count": 50, "answered": 20, "rejected": 30})
    assert list(data.answered.x) == [100, 150] and list(data.answered.y) == [60, 80]
    assert list(data.rejected.y) == [40, 70]


def test_consensus_is_the_top_vote_share():
    votes = np.array([[8, 1, 1], [4, 3, 3]])
    assert list(consensus(votes)) == [0.8, 0.4]
    assert list(running_mean(np.array([1.0, 3.0, 5.0]), 2)) == [1.0, 2.0, 4.0]


def test_pate_budget_left_counts_the_epsilon_the_engine_stops_on(qtbot):
    from workbench.dashboard import Dashboard

    def pate_run(budget_on):
        data = RunData(run_id=1)
        data.apply({"type": "started", "name": "p", "mechanism": "pate",
                    "config": {"epsilon_budget": 8.0, "pate_budget_on": budget_on}})
        data.apply({"type": "plan", "epsilon_budget": 8.0, "accountant": "pate-dd"})
        data.apply({"type": "privacy", "step": 100, "epsilon": 1.5, "accountant": "pate-dd"})
        data.apply({"type": "privacy", "step": 100, "epsilon": 6.0, "accountant": "pate-di"})
        return data

    dashboard = Dashboard()
    qtbot.addWidget(dashboard)
    dashboard._budget_text(pate_run("data-independent"))
    assert "budget 8, 2 left" in dashboard.budget_label.text()
    dashboard._budget_text(pate_run("data-dependent"))
    assert "budget 8, 6.5 left" in dashboard.budget_label.text()


def test_dp_sgd_budget_text_rounds_the_epsilon_spent_up_and_what_is_left_down(qtbot):
    """ε spent is a bound (never shown below it); what is left of the budget is never shown above it."""
    from workbench.dashboard import Dashboard

    data = RunData(run_id=1)
    data.apply({"type": "started", "name": "d", "mechanism": "dpsgd", "config": {"epsilon_budget": 8.0}})
    data.apply({"type": "plan", "epsilon_budget": 8.0, "accountant": "pld", "delta": 1e-5})
    data.apply({"type": "privacy", "step": 40, "epsilon": 2.3114, "accountant": "pld"})
    data.apply({"type": "privacy", "step": 41, "epsilon": 2.3231, "accountant": "rdp"})
    dashboard = Dashboard()
    qtbot.addWidget(dashboard)
    dashboard._budget_text(data)
    text = dashboard.budget_label.text()
    assert "ε 2.32 (pld, δ 1e-05, step 40)" in text and "live bound 2.33 (rdp, step 41)" in text
    assert "budget 8, 5.68 left" in text  # 5.6886 rounded down
