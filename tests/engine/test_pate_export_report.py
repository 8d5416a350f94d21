"""A PATE run's student exports like any model; everything that leaves leads with the publishable
epsilon, min(data-independent, released), and by default carries no vote histogram, no
data-dependent epsilon and no teacher statistic (they are computed from the private data)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.cli_shell import epsilon_text
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
    run = store.get_run(run_id)
    assert card["privacy"]["epsilon"] == run["epsilon"] == run["summary"]["epsilon_data_independent"]
    assert card["privacy"]["accountant"] == run["accountant"] == "pate-di"
    text = json.dumps(card)
    assert "epsilon_data_dependent" not in text and f"{run['summary']['epsilon_data_dependent']!r}" not in text
    assert "teacher_accuracy" not in text and "ensemble" not in text
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
    assert report["guarantee"]["epsilon"] == run["epsilon"] == summary["epsilon_data_independent"]
    assert summary["epsilon_data_dependent"] <= pate["epsilon_data_independent"]
    assert pate["epsilon_released"] == summary["epsilon_released"] > 0
    assert report["guarantee"]["epsilon_released"] == pate["epsilon_released"]
    statement = report["guarantee"]["statement"]
    assert "This epsilon is PATE's data-independent bound: it holds whatever the teachers' votes." in statement
    assert f"estimated at {pate['epsilon_released']:.4g}, released privately" in statement
    assert "an estimate, not a bound" in statement and "an estimate, not a bound" in report["guarantee"][
        "epsilon_released_kind"]
    assert {"torch", "numpy", "python", "dp-workbench"} <= set(report["software"])
    # The data-dependent epsilon is a function of the votes: neither stated nor plotted.
    assert "epsilon_data_dependent" not in json.dumps(report)
    assert set(report["curves"]) == {"test_accuracy", "epsilon_publishable"}
    assert report["curves"]["epsilon_publishable"]["value"][-1] == summary["epsilon_data_independent"]
    assert report["randomness"]["privacy_noise"] == "secret"
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


def test_a_budget_on_the_data_dependent_epsilon_leaves_no_guarantee(pate_run):
    """Where the teachers stop depends on the private votes: the caveat said so, but the report's
    statement, `holds` and the lists still stated the run's epsilon as a guarantee."""
    from engine.publication import NO_GUARANTEE_HEADLINE, STOPPED_ON_VOTES, epsilon_label, publishable_epsilon
    from engine.report import caveats, privacy_statement

    store, run_id, _ = pate_run
    run = store.get_run(run_id)
    assert run["config"].get("epsilon_budget") is None
    assert not any("whether and where the teachers stopped" in c for c in caveats(run, {}))
    assert privacy_statement(run)["holds"] is True
    on_votes = dict(run, config=dict(run["config"], epsilon_budget=2.0, pate_budget_on="data-dependent"))
    assert any("whether and where the teachers stopped" in c and "without a budget" in c for c in caveats(on_votes, {}))
    statement = privacy_statement(on_votes)
    assert statement["holds"] is False
    assert statement["statement"].startswith(f"{NO_GUARANTEE_HEADLINE}: {STOPPED_ON_VOTES}")
    assert publishable_epsilon(on_votes).guarantee is False and epsilon_label(on_votes).endswith("(no guarantee)")
    safe = dict(run, config=dict(run["config"], epsilon_budget=2.0, pate_budget_on="data-independent"))
    assert not any("whether and where the teachers stopped" in c for c in caveats(safe, {}))
    assert privacy_statement(safe)["holds"] is True


def test_a_release_whose_parameters_came_from_the_votes_is_not_shown(pate_run):
    """release_parameters = "data-dependent": the released estimate does not cover the choice of its own
    parameters; the guarantee is the data-independent bound either way."""
    from engine.publication import pate_released_estimate, publishable_epsilon

    store, run_id, _ = pate_run
    run = store.get_run(run_id)
    summary = run["summary"]
    assert summary["epsilon_released"] < summary["epsilon_data_independent"]
    assert publishable_epsilon(run).value == summary["epsilon_data_independent"]
    assert pate_released_estimate(run) == summary["epsilon_released"]
    tuned = dict(run, summary=dict(summary, release=dict(summary["release"], parameters_from_data=True)))
    eps = publishable_epsilon(tuned)
    assert (eps.value, eps.accountant) == (summary["epsilon_data_independent"], "pate-di") and eps.guarantee
    assert pate_released_estimate(tuned) is None


def test_pate_list_and_show_lead_with_the_publishable_epsilon(pate_run):
    from click.testing import CliRunner

    from engine.cli import cli

    store, run_id, _ = pate_run
    summary = store.get_run(run_id)["summary"]
    publishable = summary["epsilon_data_independent"]
    runner = CliRunner()
    listed = json.loads(runner.invoke(cli, ["list", "--json", "--db", str(store.path)]).output)
    row = next(r for r in listed if r["id"] == run_id)
    assert row["epsilon"] == publishable and row["guarantee"] is True
    shown = json.loads(runner.invoke(cli, ["show", str(run_id), "--json", "--db", str(store.path)]).output)
    assert shown["run"]["epsilon"] == shown["run"]["summary"]["epsilon"] == publishable
    assert "teacher_accuracy" not in shown["run"]["summary"] and "ensemble_accuracy" not in shown["run"]["summary"]
    text = runner.invoke(cli, ["show", str(run_id), "--db", str(store.path)]).output
    assert f"ε = {epsilon_text(publishable)}" in text and "not publishable" in text and "mean accuracy" not in text
    assert f"data-dependent ε ≈ {summary['epsilon_released']:.4g}, released privately" in text
    asked = json.loads(runner.invoke(cli, ["show", str(run_id), "--json", "--include-teacher-stats",
                                           "--db", str(store.path)]).output)
    assert 0.5 < asked["run"]["summary"]["teacher_accuracy"]["mean"] <= 1


def test_an_old_pate_row_with_the_data_dependent_epsilon_is_shown_with_the_publishable_one(pate_run):
    from engine.publication import publishable_epsilon

    store, run_id, _ = pate_run
    run = store.get_run(run_id)
    old = dict(run, epsilon=run["summary"]["epsilon_data_dependent"], accountant="pate-dd",
               summary=dict(run["summary"], epsilon=run["summary"]["epsilon_data_dependent"], accountant="pate-dd"))
    eps = publishable_epsilon(old)
    assert eps.value == run["epsilon"] and eps.accountant == "pate-di"


def test_pate_report_has_no_teacher_statistics_unless_asked_and_then_says_so_at_the_top(pate_run):
    store, run_id, _ = pate_run
    summary = store.get_run(run_id)["summary"]
    report = build_report(store, run_id, figures=False)
    text = json.dumps(report) + render_html(report)
    assert "teacher_accuracy" not in text and "ensemble" not in text
    for value in (summary["teacher_accuracy"]["mean"], summary["teacher_accuracy"]["min"], summary["ensemble_accuracy"]):
        assert repr(value) not in text and f"{value:.6g}" not in text
    asked = build_report(store, run_id, include_teacher_stats=True, figures=False)
    assert asked["contains_private_data"] is True
    assert asked["pate"]["teacher_accuracy_private"] == summary["teacher_accuracy"]
    body = render_html(asked).split("<body>", 1)[1]
    assert body.startswith("<p class='private'>THIS REPORT CONTAINS PRIVATE DATA") and "teachers" in body[:400]


def test_pate_release_parameters_were_fixed_from_public_settings(pate_run):
    from engine.privacy import pate_smooth

    store, run_id, prepared = pate_run
    release = store.get_run(run_id)["summary"]["release"]
    config = prepared.config
    expected = pate_smooth.data_independent_parameters(
        mechanism="confident", num_teachers=config.num_teachers, num_queries=config.num_queries, num_classes=10,
        delta=config.delta, threshold=config.threshold, sigma1=config.sigma1, sigma2=config.sigma2)
    assert (release["order"], release["beta"], release["sigma_ss"]) == (expected.order, expected.beta,
                                                                        expected.sigma_ss)
    assert release["parameters_from_data"] is False
    plan = next(e for e in store.events(run_id) if e["type"] == "plan")
    assert plan["release_parameters"] == {"order": expected.order, "beta": expected.beta, "sigma_ss": expected.sigma_ss}
    report = build_report(store, run_id, figures=False)
    assert not any("chosen by looking at the private votes" in c for c in report["caveats"])
    from_votes = dict(store.get_run(run_id), summary=dict(store.get_run(run_id)["summary"],
                                                          release=dict(release, parameters_from_data=True)))
    from engine.report import caveats

    assert any("chosen by looking at the private votes" in c for c in caveats(from_votes, {}))


def test_pate_report_shows_the_release_parameters_as_labelled_rows_and_only_pate_settings(pate_run):
    from engine.config import config_fields

    store, run_id, _ = pate_run
    report = build_report(store, run_id, figures=False)
    dpsgd_only = {name for name, _, spec in config_fields() if "pate" not in (spec.mechanisms or ("pate",))}
    assert {"noise_multiplier", "clipping_norm", "expected_batch_size"} <= dpsgd_only
    assert not dpsgd_only & set(report["config"])
    html = render_html(report)
    release = report["pate"]["smooth_sensitivity_release"]
    assert isinstance(release, dict) and {"order", "beta", "sigma_ss"} <= set(release)
    section = html[html.index("<th>smooth sensitivity release</th>"):]
    assert section.startswith("<th>smooth sensitivity release</th><td><table class='nested'>")
    assert f"<th>noise sigma of the release</th><td>{release['sigma_ss']:.6g}</td>" in section
    assert "<th>parameters chosen from the votes</th><td>no</td>" in section
    assert "<th>rdp released</th>" not in section and "counted as at least 0" in section
    assert "{&quot;" not in html and '{"' not in html


def test_the_report_says_the_students_pool_is_treated_as_public_and_when_it_came_from_the_data_given():
    """PATE's student trains on the test split's examples without noise: they are public data, or unprotected."""
    from engine.report import caveats, pate_pool_caveat

    published = pate_pool_caveat({"data_split": "standard train/test files (60000/10000)"})
    assert published.startswith("Treated as public: the student's pool") and "not protected" not in published
    drawn = pate_pool_caveat({"data_split": "per-example split: test_fraction=0.2, seed=0"})
    assert drawn.startswith(published) and "drew its test split from the data given" in drawn
    run = {"id": 1, "mechanism": "pate", "status": "finished", "epsilon": 2.0, "delta": 1e-5,
           "accountant": "pate-di", "dataset": "mnist", "config": {}, "summary": {}}
    assert published in caveats(run, {"data_split": "standard train/test files (60000/10000)"})
