"""The Audit tab and Compare's overlay: the bound of the guarantee, the attack run on a real tiny run in
its own process (kept with the run), the red banner when an attack beats the bound, one curve per run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from engine.store import Store
from workbench.audit_view import CURVES, AuditView, TheorySource, audit_figure, canary_result
from workbench.compare import CompareView
from workbench.run_data import RunData

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished DP-SGD run (`dpw run`, a real process) on a user's CSV, with 40 input canaries and
    without the runner's own membership audit, so the tab's audit is tested; (store path, run id, csv path)."""
    folder = tmp_path_factory.mktemp("audit")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int)
    csv = folder / "cohort.csv"
    csv.write_text("\n".join(["a,b,c,d,label"] + [",".join(f"{v:.5f}" for v in r) + f",{label}"
                                                  for r, label in zip(x, y)]) + "\n", encoding="utf-8")
    config = folder / "tiny.toml"
    config.write_text(textwrap.dedent(f"""\
        name = "tiny-csv"
        dataset = "{csv}"
        label_column = "label"
        model = "logistic"
        mechanism = "dpsgd"
        noise_multiplier = 1.0
        clipping_norm = 1.0
        delta = 1e-4
        expected_batch_size = 32
        epochs = 2
        learning_rate = 0.5
        evaluations_per_epoch = 1
        seed = 0
        audit_canaries = 40
        membership_audit = false
        """), encoding="utf-8")
    db = folder / "runs.sqlite"
    out = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(config), "--db", str(db)],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return db, 1, csv


def listed(db: Path, run_id: int) -> dict:
    store = Store(db)
    try:
        return store.get_run(run_id)
    finally:
        store.close()


def curve_named(view: AuditView, name: str):
    return next((c for c in view.plot.named_curves() if c.name() == name), None)


def test_the_theoretical_curve_is_drawn_and_stays_under_one(qtbot, tiny_run):
    db, run_id, _ = tiny_run
    view = AuditView(db)
    qtbot.addWidget(view)
    view.show_run(listed(db, run_id))
    qtbot.waitUntil(lambda: curve_named(view, "theory: best possible test") is not None, timeout=60000)
    theory = curve_named(view, "theory: best possible test")
    fpr, tpr = np.asarray(theory.xData), np.asarray(theory.yData)
    assert np.all(tpr <= 1.0) and np.all(tpr >= fpr - 1e-12)
    assert tpr[np.searchsorted(fpr, 0.01)] < 1.0  # a real bound at FPR 1%, not the trivial one
    cells = [view.table.item(0, j).text() for j in range(4)]
    assert cells[0] == "TPR at FPR 1%" and cells[1].startswith("≤ ") and cells[2] == "—"
    bound = listed(db, run_id)["summary"]["canaries"]["epsilon_lower_bound"]  # the training run's own result
    assert f"Canary audit (40 input canaries, one run): ε ≥ {bound:.3g} at 95% confidence" in view.notes["canary"].text()
    assert "private training data" in view.private_note.text()


def test_an_audit_of_a_tiny_real_run_plots_its_roc_and_is_kept_with_the_run(qtbot, tiny_run):
    db, run_id, _ = tiny_run
    view = AuditView(db)
    qtbot.addWidget(view)
    view.show_run(listed(db, run_id))
    assert curve_named(view, "attack (empirical ROC)") is None
    with qtbot.waitSignal(view.stored, timeout=180000) as stored:
        view.run_button.click()
        assert view.progress.isVisibleTo(view) and not view.run_button.isEnabled()
    assert stored.args == [run_id]
    qtbot.waitUntil(lambda: curve_named(view, "attack (empirical ROC)") is not None, timeout=5000)
    roc = curve_named(view, "attack (empirical ROC)")
    assert roc is not None and len(roc.xData) > 10
    assert not view.banner.isVisibleTo(view)  # a DP run's attack stays under its bound
    assert view.table.item(0, 2).text() == "not measurable"  # 80 held-out rows: FPR 1% needs 100
    assert view.table.item(3, 0).text() == "AUC" and view.table.item(3, 3).text().startswith("[")
    kept = listed(db, run_id)["summary"]["membership_audit"]
    assert kept["computed_from_private_data"] is True and kept["mia"]["roc"]["fpr"][0] == 0.0
    fresh = AuditView(db)  # a new window reads the kept audit: nothing is run again
    qtbot.addWidget(fresh)
    fresh.show_run(listed(db, run_id))
    assert curve_named(fresh, "attack (empirical ROC)") is not None and not fresh.jobs
    assert fresh.run_button.text() == "Run audit again"


def test_an_audit_whose_data_files_are_gone_says_so_in_one_line(qtbot, tiny_run):
    db, run_id, csv = tiny_run
    moved = csv.with_suffix(".moved")
    csv.rename(moved)
    try:
        view = AuditView(db)
        qtbot.addWidget(view)
        view.show_run(listed(db, run_id))
        view.run_button.click()
        qtbot.waitUntil(lambda: not view.jobs, timeout=180000)
    finally:
        moved.rename(csv)
    text = view.status.text()
    assert "data files are gone" in text and "cohort.csv" in text and "Traceback" not in text


def above_the_curve():
    """A fabricated attack that separates members perfectly, checked against the curve of a run at small
    epsilon by the engine's own audit module: its ROC lies far above that curve."""
    from engine.audit import membership_audit
    from engine.privacy.risk import dpsgd_attack_risk

    risk = dpsgd_attack_risk(sample_rate=0.01, noise_multiplier=2.0, steps=100, delta=1e-5)
    theory = {"tradeoff": {"fpr": risk.tradeoff_fpr.tolist(), "tpr": risk.tradeoff_tpr.tolist()},
              "tpr_at_fpr": {f"{k:g}": v for k, v in risk.tpr_at_fpr.items()}, "max_advantage": risk.max_advantage,
              "publishable_epsilon": risk.epsilon, "delta": 1e-5, "basis": "test"}
    rng = np.random.default_rng(1)
    audit = membership_audit(member_scores=rng.normal(10, 1, 2000), nonmember_scores=rng.normal(0, 1, 2000),
                             rng=rng, bootstrap=50, theory_fpr=risk.tradeoff_fpr, theory_tpr=risk.tradeoff_tpr)
    return theory, {"mia": audit.to_json(), "nonmembers": "test split"}


def test_an_attack_above_the_theoretical_curve_raises_the_red_banner(qtbot):
    theory, audit = above_the_curve()
    figure = audit_figure(theory=theory, audit=audit, canaries=None)
    assert figure.banner is not None and figure.banner.startswith("BUG OR BROKEN ASSUMPTION")
    roc_fpr, roc_tpr = figure.roc
    bound = np.interp(roc_fpr, *figure.theory)
    assert np.any(roc_tpr > bound + 0.5)  # the fabricated ROC really is above the curve
    view = AuditView(Path("unused.sqlite"))
    qtbot.addWidget(view)
    view.figure = figure
    view._draw()
    assert view.banner.isVisibleTo(view) and "Do not publish" in view.banner.text()


def test_the_banner_rounds_each_bound_toward_the_safe_side():
    """The red banner's numbers: the attack's TPR is a lower bound (rounded down), its FPR and the
    guarantee's TPR are upper bounds (rounded up); rounded to nearest, 0.12345 would read 12.3% either way."""
    theory, audit = above_the_curve()
    audit["mia"]["theory"] = dict(audit["mia"]["theory"], worst={"fpr_upper": 0.012345, "tpr_lower": 0.45678,
                                                                  "theory_tpr": 0.12345})
    banner = audit_figure(theory=theory, audit=audit, canaries=None).banner
    assert "at FPR up to 1.24% its TPR is at least 45.6%, the bound is 12.4%" in banner


def chance_attack(theory: dict, examples: int, seed: int) -> dict:
    """The audit of an attack no better than chance (members and non-members score alike), checked
    against `theory`'s curve, as a run's kept audit holds it."""
    from engine.audit import membership_audit

    rng = np.random.default_rng(seed)
    audit = membership_audit(member_scores=rng.normal(0, 1, examples), nonmember_scores=rng.normal(0, 1, examples),
                             rng=rng, bootstrap=50, theory_fpr=np.asarray(theory["tradeoff"]["fpr"]),
                             theory_tpr=np.asarray(theory["tradeoff"]["tpr"]))
    return {"mia": audit.to_json()}


def test_an_attack_under_the_curve_raises_no_banner():
    theory, _ = above_the_curve()
    assert audit_figure(theory=theory, audit=chance_attack(theory, 2000, seed=2), canaries=None).banner is None


def test_few_non_members_show_tpr_at_small_fpr_as_not_measurable_and_the_check_states_its_resolution():
    theory, _ = above_the_curve()
    few = chance_attack(theory, 359, seed=3)
    figure = audit_figure(theory=theory, audit=few, canaries=None)
    rows = {row[0]: row for row in figure.table}
    assert rows["TPR at FPR 0.1%"][2:] == ("not measurable", "—")
    assert rows["TPR at FPR 1%"][2].endswith("%") and rows["TPR at FPR 1%"][3].startswith("[")
    assert "TPR at FPR 0.1%: not measurable with 359 non-members (FPR 0.1% needs at least 1,000)." in figure.roc_note
    resolution = 100 * few["mia"]["theory"]["resolution"]["tpr"]
    assert (f"Check: not significantly above the guarantee's curve (95% band: with 359 members and 359 non-members, "
            f"only a TPR above {resolution:.3g}% at FPR 1% would have been flagged); one attack gives a lower bound "
            "on the risk: its failing cannot confirm the guarantee.") in figure.roc_note
    assert "lies under" not in figure.roc_note


def test_the_canary_bound_is_stated_as_a_number_beside_the_guarantee_when_the_run_had_canaries():
    """A number, never a curve beside the guarantee's (an (ε, δ) region for the lower bound lies above the
    mechanism's exact curve at some FPRs without contradicting it, and read as an attack above it)."""
    summary = {"canaries": {"count": 1000, "kind": "gradient", "epsilon_lower_bound": 1.7,
                            "confidence": 0.95, "delta": 1e-5}, "audit_model": True}
    figure = audit_figure(theory=None, audit=None, canaries=canary_result(summary))
    assert "(1000 gradient canaries, one run): ε ≥ 1.7 at 95% confidence" in figure.canary_note
    assert not hasattr(figure, "canary") and "canary" not in {key for key, *_ in CURVES}
    assert figure.banner is None
    consistent = audit_figure(theory={"publishable_epsilon": 8.0}, audit=None, canaries=canary_result(summary))
    assert "ε ≥ 1.7 at 95% confidence, 21% of the publishable ε = 8: consistent with the guarantee" \
        in consistent.canary_note and consistent.banner is None
    theory, _ = above_the_curve()  # a guarantee at epsilon 0.19 < 1.7: the canaries contradict it
    banner = audit_figure(theory=theory, audit=None, canaries=canary_result(summary)).banner
    assert banner is not None and "proves ε ≥ 1.7 at 95% confidence, above the publishable ε = 0.19" in banner
    assert canary_result({"seconds": 3.0}) is None
    assert "No canaries in this run" in audit_figure(theory=None, audit=None, canaries=None).canary_note


def dpsgd_row(run_id: int, noise_multiplier: float, summary: dict | None = None) -> dict:
    """A finished DP-SGD run as listed (public parameters from which the engine derives its curve)."""
    from engine.privacy.pld import pld_epsilon

    eps = pld_epsilon(sample_rate=0.01, noise_multiplier=noise_multiplier, steps=200, delta=1e-5).value
    return {"id": run_id, "name": f"r{run_id}", "dataset": "digits", "mechanism": "dpsgd", "status": "finished",
            "epsilon": eps, "delta": 1e-5, "accountant": "pld", "accuracy": 0.8, "sample_rate": 0.01,
            "noise_multiplier": noise_multiplier, "steps_done": 200, "num_train": 1000,
            "config": {"reproducible_noise": False, "dataset": "digits", "delta": 1e-5},
            "summary": summary or {}}


def test_compare_overlays_one_curve_per_run_in_its_colour_and_the_attack_where_computed(qtbot):
    _, audit = above_the_curve()
    rows = [dpsgd_row(1, 1.0), dpsgd_row(2, 2.0, {"membership_audit": audit}), dpsgd_row(3, 4.0),
            {**dpsgd_row(4, 1.0), "mechanism": "none", "epsilon": None}]
    view = CompareView(theory=TheorySource())
    qtbot.addWidget(view)
    view.show_runs([(r, RunData(run_id=r["id"], mechanism=r["mechanism"])) for r in rows], rows)
    qtbot.waitUntil(lambda: view.membership.curve_count()["theory"] == 3, timeout=60000)
    view.membership.theory.wait()
    assert view.membership.curve_count() == {"theory": 3, "attack": 1}  # the non-private run has no bound
    pens = {c.name(): c.opts["pen"].color().name() for c in view.membership.named_curves()}
    elsewhere = {c.name(): c.opts["pen"].color().name() for c in view.tradeoff.getPlotItem().listDataItems()}
    assert pens["2: r2"] == pens["2: r2 (attack)"] == elsewhere["2: r2"]  # the run's colour in Compare
    assert len({pens["1: r1"], pens["2: r2"], pens["3: r3"]}) == 3
    view.show_group(("digits", "none"))  # the overlay shows the group the plots show, not every run
    assert view.membership.curve_count() == {"theory": 0, "attack": 0}
    assert [r["id"] for r in view.membership.rows] == [4]


def test_the_main_window_shows_the_selected_run_in_its_audit_tab(qtbot, tiny_run):
    from workbench.app import create_app
    from workbench.main_window import MainWindow

    db, run_id, _ = tiny_run
    create_app()
    window = MainWindow(db, probe=False)
    qtbot.addWidget(window)
    window.show()
    window.select_run(run_id)
    window.tabs.setCurrentWidget(window.audit)
    assert window.tabs.tabText(window.tabs.indexOf(window.audit)) == "Audit"
    assert window.audit.row["id"] == run_id and window.audit.run_button.isEnabled()
    qtbot.waitUntil(lambda: window.audit.figure.theory is not None, timeout=60000)
    window.close()


def test_a_run_audited_by_its_runner_shows_its_attack_and_the_tab_waits_while_the_runner_audits(qtbot, tiny_run):
    """While a finished run's runner still audits it, the tab says so and starts no second audit; once the
    runner has kept its audit (engine.audit_job.audit_and_store, as audit_after_training calls it), the
    attack is drawn with nothing clicked."""
    from engine.audit_job import audit_and_store

    db, run_id, _ = tiny_run
    view = AuditView(db)
    qtbot.addWidget(view)
    alive = {run_id}
    view.runner_alive = lambda rid: rid in alive
    row = listed(db, run_id)
    row["summary"].pop("membership_audit", None)  # as listed before the runner's audit is kept
    view.show_run(row)
    assert not view.run_button.isEnabled() and view.progress.isVisibleTo(view)
    assert "own process is auditing it" in view.status.text()
    view.run_button.click()
    assert not view.jobs

    store = Store(db)
    try:
        audit_and_store(store, run_id)
    finally:
        store.close()
    alive.clear()  # the runner ended
    view.show_run(listed(db, run_id))
    assert curve_named(view, "attack (empirical ROC)") is not None and not view.jobs
    assert view.run_button.isEnabled() and view.run_button.text() == "Run audit again"
    assert view.status.text() == "Attack computed (kept with the run)."


def test_every_column_of_the_audit_table_is_readable_in_a_usual_window(qtbot):
    """Bound, attack and interval side by side without scrolling at 1400 px: the side panel takes the
    width its table needs from the plot, and the plot keeps a legible size."""
    from workbench.audit_view import MIN_PLOT_WIDTH

    theory, audit = above_the_curve()
    view = AuditView(Path("unused.sqlite"))
    qtbot.addWidget(view)
    view.resize(900, 800)  # the Audit tab's share of a 1400 px window
    view.show()
    qtbot.waitExposed(view)
    view.figure = audit_figure(theory=theory, audit=audit, canaries=None)
    view._draw()
    qtbot.waitUntil(lambda: view.table.horizontalHeader().length() <= view.table.viewport().width(), timeout=5000)
    assert view.plot.width() >= MIN_PLOT_WIDTH
    assert view.table.item(0, 3).text().startswith("[")  # the interval column has content that now shows
