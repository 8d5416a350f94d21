"""A PATE run's student exports like any model; its report states the three epsilons and, by
default, carries no vote histogram (they are computed from the private data)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.dpsgd.trainer import predict
from engine.errors import DPWError
from engine.export import export_run
from engine.report import build_report, render_html, write_report

from test_export_report import raw_inputs, train_in_store
from test_pate_run import small_pate


@pytest.fixture(scope="module")
def pate_run(tmp_path_factory, mnist_dir):
    from engine.store import Store

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        store = Store(tmp_path_factory.mktemp("pate-store") / "runs.sqlite")
        run_id, prepared = train_in_store(store, **small_pate(mnist_dir, num_queries=200, student_epochs=3))
    finally:
        torch.set_num_threads(before)
    return store, run_id, prepared


def test_the_student_exports_and_reproduces_the_engine_predictions(pate_run, tmp_path):
    store, run_id, prepared = pate_run
    engine_pred = predict(prepared.model, prepared.x_holdout)
    files = export_run(store, run_id, tmp_path)
    assert {"model.safetensors", "model.pt2", "model_card.json"} <= set(files)
    holdout = type("Holdout", (), {})()
    holdout.data = type("Data", (), {"normalization": prepared.data.normalization, "x_test": prepared.x_holdout})()
    program = torch.export.load(str(tmp_path / "model.pt2")).module()
    with torch.no_grad():
        assert torch.equal(program(raw_inputs(holdout)).argmax(1), engine_pred)
    card = json.loads((tmp_path / "model_card.json").read_text())
    assert card["privacy"]["epsilon"] == store.get_run(run_id)["epsilon"]
    accuracy = float((engine_pred == prepared.y_holdout).float().mean())
    assert accuracy == pytest.approx(store.get_run(run_id)["accuracy"])


def test_exporting_the_teachers_of_a_pate_run_is_refused(pate_run, tmp_path):
    store, run_id, _ = pate_run
    with pytest.raises(DPWError, match="teachers saw raw private data"):
        export_run(store, run_id, tmp_path, kind="teachers")


def test_pate_report_states_every_epsilon_and_agrees_with_the_store(pate_run, tmp_path):
    store, run_id, prepared = pate_run
    run = store.get_run(run_id)
    summary = run["summary"]
    report = json.loads(write_report(store, run_id, tmp_path / "r.json").read_text())
    pate = report["pate"]
    assert pate["teachers"] == 20 and pate["aggregator"] == "confident"
    assert pate["aggregator_parameters"] == {"threshold": 13.0, "sigma1": 4.0, "sigma2": 2.0}
    assert pate["queries_asked"] == 200 and pate["queries_answered"] == summary["answered"] > 0
    assert pate["epsilon_data_dependent"] == run["epsilon"] == report["guarantee"]["epsilon"]
    assert pate["epsilon_data_dependent"] <= pate["epsilon_data_independent"]
    assert pate["epsilon_released"] == summary["epsilon_released"] > 0
    assert report["guarantee"]["epsilon_released"] == pate["epsilon_released"]
    assert "not safe to publish" in report["guarantee"]["statement"]
    assert {"torch", "numpy", "python", "dp-workbench"} <= set(report["software"])
    assert f"{pate['epsilon_released']:.4g}" in report["guarantee"]["statement"]
    assert 0.5 < pate["teacher_accuracy_mean"] <= 1
    per_class = report["utility"]["per_class_accuracy"]
    assert set(per_class) == {str(c) for c in range(10)}
    counts = torch.bincount(prepared.y_holdout, minlength=10).numpy()
    weighted = sum(per_class[str(c)] * counts[c] for c in range(10) if counts[c]) / counts.sum()
    assert weighted == pytest.approx(run["accuracy"])


def test_default_pate_report_has_no_vote_histograms(pate_run):
    store, run_id, _ = pate_run
    report = build_report(store, run_id, figures=False)
    assert "votes" not in report["pate"] and report["contains_private_data"] is False
    text = json.dumps(report) + render_html(report)
    # No histogram of any query appears anywhere in the report.
    for vote in store.votes(run_id)[:50]:
        assert json.dumps(vote["histogram"]) not in text
        assert str(vote["histogram"]) not in text
    assert "PRIVATE" not in render_html(report)


def test_votes_only_on_request_and_then_flagged_at_the_top(pate_run):
    store, run_id, _ = pate_run
    report = build_report(store, run_id, include_votes=True, figures=False)
    assert report["contains_private_data"] is True
    assert len(report["pate"]["votes"]) == 200
    page = render_html(report)
    body = page.split("<body>", 1)[1]
    assert body.startswith("<p class='private'>THIS REPORT CONTAINS PRIVATE DATA")
    stored = np.array([v["histogram"] for v in store.votes(run_id)])
    assert np.array_equal(np.array([v["histogram"] for v in report["pate"]["votes"]]), stored)


def test_a_budget_on_the_data_dependent_epsilon_is_named_as_a_leak_in_the_caveats(pate_run):
    from engine.report import caveats

    store, run_id, _ = pate_run
    run = store.get_run(run_id)
    assert run["config"].get("epsilon_budget") is None
    assert not any("whether and where the teachers stopped" in c for c in caveats(run, {}))
    on_votes = dict(run, config=dict(run["config"], epsilon_budget=2.0, pate_budget_on="data-dependent"))
    assert any("whether and where the teachers stopped" in c and "without a budget" in c for c in caveats(on_votes, {}))
    safe = dict(run, config=dict(run["config"], epsilon_budget=2.0, pate_budget_on="data-independent"))
    assert not any("whether and where the teachers stopped" in c for c in caveats(safe, {}))
