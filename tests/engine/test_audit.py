"""The membership-inference audit (engine.audit), the attack risk of stored runs (engine.attack_risk),
`dpw audit` and `dpw show --risk`: pure statistics against brute force and sampling truth, then real
runs on digits and MNIST."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from scipy.stats import norm

from engine.attack_risk import pate_data_independent_rdp, run_attack_risk
from engine.audit import membership
from engine.audit.membership import check_against_theory, membership_audit, roc_curve
from engine.cli import cli
from engine.privacy import risk
from engine.store import Store

sys.path.insert(0, str(Path(__file__).parent))
from test_export_report import train_in_store  # noqa: E402
from test_pate_run import small_pate  # noqa: E402


# ---- pure statistics ------------------------------------------------------------------------------
def _brute_auc(m: np.ndarray, n: np.ndarray) -> float:
    diff = m[:, None] - n[None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


def _brute_tpr_at_fpr(m: np.ndarray, n: np.ndarray, level: float) -> float:
    """Best TPR over every rule "score > t" (t any score or -inf) with FPR <= level."""
    best = 0.0
    for t in np.concatenate([m, n, [-np.inf]]):
        if (n > t).mean() <= level:
            best = max(best, float((m > t).mean()))
    return best


def test_auc_roc_and_tpr_agree_with_brute_force_with_ties():
    rng = np.random.default_rng(3)
    m = np.round(rng.normal(0.7, 1.0, 300), 1)  # rounding makes ties, within and across the groups
    n = np.round(rng.normal(0.0, 1.0, 400), 1)
    assert membership.auc(member_scores=m, nonmember_scores=n) == pytest.approx(_brute_auc(m, n), abs=1e-12)
    for level in (0.01, 0.05, 0.3, 0.001):
        assert membership.tpr_at_fpr(member_scores=m, nonmember_scores=n, fpr=level) == pytest.approx(
            _brute_tpr_at_fpr(m, n, level), abs=1e-12)
    fpr, tpr = roc_curve(member_scores=m, nonmember_scores=n)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
    # The trapezoid area under the step-with-ties ROC is the AUC with ties counted one half.
    trapezoids = np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2)  # np.trapezoid (numpy >= 2 only)
    assert trapezoids == pytest.approx(_brute_auc(m, n), abs=1e-12)


def test_bootstrap_interval_covers_the_true_auc_at_about_its_stated_rate():
    """Members N(mu, 1), non-members N(0, 1): the true AUC is Phi(mu / sqrt 2)."""
    rng = np.random.default_rng(20261124)
    mu, trials, covered = 0.6, 150, 0
    truth = float(norm.cdf(mu / math.sqrt(2.0)))
    for _ in range(trials):
        audit = membership_audit(member_scores=rng.normal(mu, 1.0, 250), nonmember_scores=rng.normal(0.0, 1.0, 250),
                                 rng=rng, bootstrap=300, confidence=0.95)
        lo, hi = audit.auc_interval
        covered += lo <= truth <= hi
    assert 0.88 * trials <= covered <= 0.995 * trials, f"covered {covered} of {trials}"


def test_bootstrap_is_repeatable_from_the_generator_and_intervals_contain_the_estimate():
    m, n = np.linspace(0, 2, 500), np.linspace(-0.5, 1.5, 700)
    one = membership_audit(member_scores=m, nonmember_scores=n, rng=np.random.default_rng(5), bootstrap=200)
    two = membership_audit(member_scores=m, nonmember_scores=n, rng=np.random.default_rng(5), bootstrap=200)
    assert one.to_json() == two.to_json()
    assert one.auc_interval[0] <= one.auc <= one.auc_interval[1]
    assert one.tpr_interval[0.001] is None  # 700 non-members cannot measure FPR 0.1%
    lo, hi = one.tpr_interval[0.01]
    assert 0.0 <= lo <= hi <= 1.0
    assert set(one.to_json()["tpr_at_fpr"]) == {"0.01", "0.001"}


def _gdp_curve(mu: float) -> tuple[np.ndarray, np.ndarray]:
    """The trade-off curve of mu-GDP [DRS19]: TPR = Phi(Phi^-1(FPR) + mu), exact for N(mu,1) vs N(0,1)."""
    fpr = risk.DEFAULT_FPR
    with np.errstate(divide="ignore"):
        return fpr, norm.cdf(norm.ppf(fpr) + mu)


def test_scores_above_the_theory_curve_are_flagged():
    rng = np.random.default_rng(1)
    theory_fpr, theory_tpr = _gdp_curve(0.5)
    check = check_against_theory(member_scores=rng.normal(2.0, 1.0, 1000), nonmember_scores=rng.normal(0, 1, 1000),
                                 theory_fpr=theory_fpr, theory_tpr=theory_tpr)
    assert check.above_theory
    assert "ABOVE THE THEORETICAL BOUND" in check.message
    assert check.worst["tpr_lower"] > check.worst["theory_tpr"]


def test_scores_that_respect_the_theory_curve_are_not_flagged_beyond_the_confidence_level():
    """Scores drawn exactly at the bound (N(1,1) vs N(0,1) is 1-GDP) may be flagged at most about 5% of
    the time; scores well inside it never."""
    rng = np.random.default_rng(2)
    at_bound, inside = 0, 0
    fpr, tpr = _gdp_curve(1.0)
    for _ in range(100):
        at_bound += check_against_theory(member_scores=rng.normal(1.0, 1.0, 500),
                                         nonmember_scores=rng.normal(0, 1, 500),
                                         theory_fpr=fpr, theory_tpr=tpr).above_theory
        inside += check_against_theory(member_scores=rng.normal(0.5, 1.0, 500), nonmember_scores=rng.normal(0, 1, 500),
                                       theory_fpr=fpr, theory_tpr=tpr).above_theory
    assert inside == 0
    assert at_bound <= 8


def test_a_real_dpsgd_theory_curve_flags_a_leak_it_does_not_allow():
    """The curve of a strongly private DP-SGD run (epsilon well below 1) against well-separated scores."""
    figures = risk.dpsgd_attack_risk(sample_rate=0.01, noise_multiplier=3.0, steps=100, delta=1e-5)
    rng = np.random.default_rng(4)
    audit = membership_audit(member_scores=rng.normal(1.5, 1, 800), nonmember_scores=rng.normal(0, 1, 800), rng=rng,
                             bootstrap=50, theory_fpr=figures.tradeoff_fpr, theory_tpr=figures.tradeoff_tpr)
    assert audit.theory is not None and audit.theory.above_theory


def _roc_at_one_percent(hits: int, n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Scores whose ROC has one informative point: FPR exactly 1% (4 of 400 non-members above the
    threshold) with TPR hits / n; every other member scores below every non-member."""
    nonmembers = np.arange(n, dtype=float)
    members = np.r_[np.full(hits, n - 4.5), np.full(n - hits, -1.0)]
    return members, nonmembers


def test_the_theory_check_flags_exactly_the_tprs_above_its_stated_resolution():
    """"Only a TPR above X% at FPR 1% would have been flagged": a measured TPR just above X at FPR 1%
    is flagged, one just below is not, and the words say X and the sample sizes."""
    figures = risk.dpsgd_attack_risk(sample_rate=0.01, noise_multiplier=3.0, steps=100, delta=1e-5)
    curve = dict(theory_fpr=figures.tradeoff_fpr, theory_tpr=figures.tradeoff_tpr)
    members, nonmembers = _roc_at_one_percent(0)
    quiet = check_against_theory(member_scores=members, nonmember_scores=nonmembers, **curve)
    resolution = quiet.resolution["tpr"]
    assert quiet.resolution["fpr"] == 0.01 and 0.1 < resolution < 0.5
    assert resolution > figures.tpr_at_fpr[0.01] + quiet.band_members  # far above what the guarantee allows
    above = math.floor(resolution * 400) + 1
    for hits, flagged in ((above, True), (above - 1, False)):
        members, nonmembers = _roc_at_one_percent(hits)
        check = check_against_theory(member_scores=members, nonmember_scores=nonmembers, **curve)
        assert check.above_theory is flagged, hits
    text = quiet.message
    assert text.startswith("not significantly above the guarantee's curve (95% band: with 400 members and 400 "
                           f"non-members, only a TPR above {100 * resolution:.3g}% at FPR 1% would have been flagged)")
    assert "lower bound on the risk" in text and "cannot confirm the guarantee" in text and "under" not in text


def test_tpr_below_one_over_the_non_members_is_not_measured():
    """With 359 non-members the smallest non-zero FPR is 0.28%: TPR at FPR 0.1% is None, without an interval,
    with the reason; 1,000 non-members measure it."""
    rng = np.random.default_rng(7)
    few = membership_audit(member_scores=rng.normal(0, 1, 359), nonmember_scores=rng.normal(0, 1, 359), rng=rng,
                           bootstrap=20)
    assert few.tpr_at_fpr[0.001] is None and few.tpr_interval[0.001] is None and few.tpr_at_fpr[0.01] is not None
    body = few.to_json()
    assert body["tpr_at_fpr"]["0.001"] is None and body["tpr_interval"]["0.001"] is None
    assert body["tpr_not_measurable"] == {"0.001": "not measurable with 359 non-members (FPR 0.1% needs at least "
                                                    "1,000)"}
    enough = membership_audit(member_scores=rng.normal(0, 1, 500), nonmember_scores=rng.normal(0, 1, 1000),
                              rng=rng, bootstrap=20)
    assert enough.tpr_at_fpr[0.001] is not None and enough.to_json()["tpr_not_measurable"] == {}


def test_an_audit_kept_by_an_earlier_version_is_restated_in_todays_words():
    kept = {"members": 359, "nonmembers": 359, "tpr_at_fpr": {"0.01": 0.0084, "0.001": 0.0056},
            "tpr_interval": {"0.01": [0.0, 0.02], "0.001": [0.0, 0.0167]},
            "theory": {"above_theory": False, "confidence": 0.95, "message": "the empirical ROC lies under the "
                       "theoretical trade-off curve (simultaneous 95% band)"}}
    now = membership.restated(kept)
    assert now["tpr_at_fpr"] == {"0.01": 0.0084, "0.001": None} and now["tpr_interval"]["0.001"] is None
    assert now["tpr_not_measurable"]["0.001"].startswith("not measurable with 359 non-members")
    assert now["theory"]["message"].startswith("not significantly above the guarantee's curve (95% band)")
    assert kept["tpr_at_fpr"]["0.001"] == 0.0056  # the kept object itself is left as it was


def test_bad_scores_are_refused_by_name():
    with pytest.raises(ValueError, match="member_scores"):
        membership.auc(member_scores=[], nonmember_scores=[1.0])
    with pytest.raises(ValueError, match="nonmember_scores"):
        membership.auc(member_scores=[1.0], nonmember_scores=[np.nan])


def test_the_audit_package_is_pure():
    import subprocess

    code = ("import sys, engine.audit, engine.audit.membership; "
            "bad = [m for m in ('torch', 'PySide6') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- real runs ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits_runs(tmp_path_factory):
    """A non-private MLP that memorises 100 digits, a strongly private one (its whole training split), a seeded one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        store = Store(tmp_path_factory.mktemp("audit-store") / "runs.sqlite")
        overfit, _ = train_in_store(store, name="overfit", dataset="digits", mechanism="none", model="mlp",
                                    train_subset=100, expected_batch_size=50, epochs=80, learning_rate=0.5,
                                    seed=1)  # AUC 0.655 [0.587, 0.729] on its 100 members (seed 0: 0.62 [0.54, 0.69])
        private, _ = train_in_store(store, name="private", dataset="digits", model="mlp", noise_multiplier=8.0,
                                    expected_batch_size=50, epochs=4, learning_rate=0.5)
        seeded, _ = train_in_store(store, name="seeded", dataset="digits", model="mlp", train_subset=100,
                                   noise_multiplier=1.0, expected_batch_size=50, epochs=1, learning_rate=0.5,
                                   reproducible_noise=True)
    finally:
        torch.set_num_threads(before)
    return store, {"overfit": overfit, "private": private, "seeded": seeded}


def _invoke(*args: str):
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result


def test_show_risk_json_equals_the_pure_functions_on_the_stored_parameters(digits_runs):
    store, ids = digits_runs
    run = store.get_run(ids["private"])
    out = json.loads(_invoke("show", str(ids["private"]), "--db", str(store.path), "--risk", "--json").output)
    assert set(out) >= {"max_advantage", "tpr_at_fpr", "posterior", "tradeoff", "epsilon", "delta", "basis"}
    expected = risk.dpsgd_attack_risk(sample_rate=run["sample_rate"], noise_multiplier=run["noise_multiplier"],
                                      steps=run["steps_done"], delta=run["delta"]).to_json()
    for key in ("max_advantage", "tpr_at_fpr", "posterior", "tradeoff", "epsilon", "delta"):
        assert out[key] == expected[key], key
    assert out["guarantee"] is True and out["run"] == ids["private"]
    assert out["epsilon"] == pytest.approx(run["epsilon"], rel=0.02)  # the PLD profile agrees with the accountant


def test_show_risk_states_no_bound_for_non_private_and_seeded_runs(digits_runs):
    store, ids = digits_runs
    for which, words in (("overfit", "non-private"), ("seeded", "reproducible noise")):
        out = json.loads(_invoke("show", str(ids[which]), "--db", str(store.path), "--risk", "--json").output)
        assert out["guarantee"] is False and out["tpr_at_fpr"] is None and words in out["reason"]
        text = _invoke("show", str(ids[which]), "--db", str(store.path), "--risk").output
        assert "no bound" in text and "TPR at FPR" not in text


def test_audit_json_shape_and_an_overfit_model_leaks_while_a_private_one_does_not(digits_runs):
    store, ids = digits_runs
    results = {}
    for which in ("overfit", "private"):
        out = json.loads(_invoke("audit", str(ids[which]), "--db", str(store.path), "--json",
                                 "--bootstrap", "300").output)
        assert {"epsilon", "mia", "canaries"} <= set(out) and out["canaries"] is None
        assert set(out["mia"]["tpr_at_fpr"]) == {"0.01", "0.001"}
        held_out = store.get_run(ids[which])["num_test"]  # the whole test split; as many members
        assert out["mia"]["members"] == out["mia"]["nonmembers"] == (100 if which == "overfit" else held_out)
        results[which] = out
    overfit, private = results["overfit"]["mia"], results["private"]["mia"]
    assert results["overfit"]["epsilon"] is None and overfit["theory"] is None
    # Non-private training is seeded: this AUC is the same every time; its 95% interval is well above 0.5.
    assert overfit["auc_interval"][0] > 0.55, overfit["auc"]
    # The private run's noise is secret: its AUC varies by about 0.02 (359 + 359 examples) around ~0.5.
    assert abs(private["auc"] - 0.5) < 0.08, private["auc"]
    assert results["private"]["epsilon"] == pytest.approx(store.get_run(ids["private"])["epsilon"])
    assert private["theory"]["above_theory"] is False


def test_audit_text_says_what_the_check_could_see_and_what_few_non_members_cannot_measure(digits_runs):
    store, ids = digits_runs
    text = _invoke("audit", str(ids["private"]), "--db", str(store.path), "--bootstrap", "50").output
    n = store.get_run(ids["private"])["num_test"]
    tiny = next(line for line in text.splitlines() if line.strip().startswith("TPR at FPR 0.1%"))
    assert tiny.split("0.1%", 1)[1].strip() == f"not measurable with {n} non-members (FPR 0.1% needs at least 1,000)"
    check = next(line for line in text.splitlines() if "theory check" in line)
    assert f"not significantly above the guarantee's curve (95% band: with {n} members and {n} non-members, " \
           "only a TPR above " in check and "% at FPR 1% would have been flagged)" in check
    assert "cannot confirm the guarantee" in check and "lies under" not in text


def test_show_risk_prints_the_epsilon_as_dpw_show_does(digits_runs):
    store, ids = digits_runs
    shown = _invoke("show", str(ids["private"]), "--db", str(store.path)).output
    risk_text = _invoke("show", str(ids["private"]), "--db", str(store.path), "--risk").output
    value = next(line for line in shown.splitlines() if "privacy" in line).split("ε = ")[1].split(",")[0]
    row = next(line for line in risk_text.splitlines() if line.strip().startswith("epsilon"))
    assert row.split()[1] == value and "(pld)" in row and "publishable" not in row


def test_audit_text_output_and_a_run_without_a_model(digits_runs, tmp_path):
    store, ids = digits_runs
    text = _invoke("audit", str(ids["private"]), "--db", str(store.path), "--bootstrap", "50").output
    assert "AUC" in text and "TPR at FPR 1%" in text and "private data" in text
    from engine.config import RunConfig

    queued = store.create_run(RunConfig(name="queued", dataset="digits", noise_multiplier=1.0))
    result = CliRunner().invoke(cli, ["audit", str(queued), "--db", str(store.path)])
    assert result.exit_code == 1 and "no trained model to audit" in result.output and "Traceback" not in result.output


def test_pate_risk_comes_from_the_data_independent_curve_and_says_so(tmp_path, mnist_dir):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        store = Store(tmp_path / "runs.sqlite")
        run_id, _ = train_in_store(store, **small_pate(mnist_dir, num_queries=60, teacher_epochs=2, student_epochs=1))
    finally:
        torch.set_num_threads(before)
    run = store.get_run(run_id)
    summary = run["summary"]
    result = run_attack_risk(run)
    assert "data-independent" in result.basis
    orders, curve = pate_data_independent_rdp(run)
    from engine.privacy.rdp import rdp_to_epsilon

    # The recomputed curve is the one the runner accounted: same epsilon.
    assert rdp_to_epsilon(orders=orders, rdp=curve, delta=run["delta"]).value == pytest.approx(
        summary["epsilon_data_independent"], rel=1e-9)
    expected = risk.attack_risk(profile=risk.rdp_privacy_profile(orders=orders, rdp=curve), delta=summary["delta"])
    assert result.risk.to_json() == expected.to_json()
    assert summary["epsilon_data_independent"] <= result.risk.epsilon <= summary["epsilon_data_independent"] + 0.011


# ---- the report -----------------------------------------------------------------------------------
def test_report_says_what_the_epsilon_means_for_an_attacker_in_json_html_and_pdf(digits_runs, tmp_path):
    import os

    from engine.attack_risk import attacker_statements
    from engine.rounding import percent_up
    from engine.report import build_report, write_report

    store, ids = digits_runs
    report = build_report(store, ids["private"], figures=False)
    attacker = report["attacker"]
    figures = run_attack_risk(store.get_run(ids["private"])).risk
    assert attacker["statements"] == attacker_statements(figures)
    assert attacker["tpr_at_fpr"]["0.01"] == figures.tpr_at_fpr[0.01]
    assert attacker["posterior"]["0.5"] == figures.posterior[0.5]
    bound = percent_up(figures.tpr_at_fpr[0.01])
    assert f"at most {bound} at a false-positive rate (FPR) of 1%" in attacker["statements"][0]
    assert "audit" not in report and report["contains_private_data"] is False
    html = write_report(store, ids["private"], tmp_path / "r.html").read_text(encoding="utf-8")
    assert "What this epsilon means for an attacker" in html and "Membership-inference audit" not in html

    pdf = write_report(store, ids["private"], tmp_path / "r.pdf")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtPdf import QPdfDocument
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])  # noqa: F841
    document = QPdfDocument()
    document.load(str(pdf))
    text = " ".join(document.getAllText(page).text() for page in range(document.pageCount()))
    assert "What this epsilon means for an attacker" in " ".join(text.split())


def test_runs_without_a_guarantee_make_no_attacker_claim_in_the_report(digits_runs, tmp_path):
    from engine.report import build_report, write_report

    store, ids = digits_runs
    for which in ("seeded", "overfit"):
        assert build_report(store, ids[which], figures=False)["attacker"] is None
        html = write_report(store, ids[which], tmp_path / f"{which}.html").read_text(encoding="utf-8")
        assert "What this epsilon means for an attacker" not in html


def test_report_includes_the_audit_only_when_asked_and_flags_it_at_the_top(digits_runs, tmp_path):
    store, ids = digits_runs
    out = tmp_path / "audit.json"
    _invoke("report", str(ids["private"]), "--db", str(store.path), "--out", str(out), "--include-audit")
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["contains_private_data"] is True and "membership-inference audit" in report["private_data_notice"]
    assert set(report["audit"]["mia"]["tpr_at_fpr"]) == {"0.01", "0.001"}
    html_out = tmp_path / "audit.html"
    _invoke("report", str(ids["private"]), "--db", str(store.path), "--out", str(html_out), "--include-audit")
    html = html_out.read_text(encoding="utf-8")
    assert html.index("THIS REPORT CONTAINS PRIVATE DATA") < html.index("<h1>")
    assert "Membership-inference audit (PRIVATE" in html


# ---- one-run canary audit (Steinke, Nasr, Jagielski 2023) ------------------------------------------
def test_canary_bound_without_delta_is_the_clopper_pearson_lower_bound_on_the_guess_accuracy():
    """With delta = 0, P[Bin(r, q) >= v] = I_q(v, r - v + 1) (regularized incomplete beta), so the bound
    is logit of the Beta(v, r - v + 1) quantile at 1 - confidence: derived independently of the p-value."""
    from scipy.special import logit
    from scipy.stats import beta

    from engine.audit.canaries import epsilon_lower_bound

    for m, r, v in ((1000, 100, 90), (1000, 200, 150), (5000, 1000, 600), (100, 10, 10)):
        expected = float(logit(beta.ppf(0.05, v, r - v + 1)))
        got = epsilon_lower_bound(canaries=m, guesses=r, correct=v, confidence=0.95)
        assert got == pytest.approx(expected, abs=2e-6), (m, r, v)
        assert got <= expected + 1e-9  # rounded down, never up


def test_canary_bound_closed_forms():
    from engine.audit.canaries import epsilon_lower_bound

    # All r guesses right, delta 0: q^r <= 0.05 at the boundary, so eps = logit(0.05^(1/r)).
    q = 0.05 ** (1 / 100)
    assert epsilon_lower_bound(canaries=200, guesses=100, correct=100) == pytest.approx(math.log(q / (1 - q)), abs=2e-6)
    # One canary, one right guess, delta 0.05, level 0.6: q + 2 delta (1 - q) <= 0.6 gives q <= 5/9, eps = ln 1.25.
    assert epsilon_lower_bound(canaries=1, guesses=1, correct=1, delta=0.05, confidence=0.4) == pytest.approx(
        math.log(1.25), abs=2e-6)
    # Half right is what guessing gets: nothing can be claimed.
    assert epsilon_lower_bound(canaries=1000, guesses=400, correct=200) == 0.0


def test_canary_bound_with_delta_is_never_above_the_pure_one():
    from engine.audit.canaries import epsilon_lower_bound

    pure = epsilon_lower_bound(canaries=1000, guesses=300, correct=260)
    approx = epsilon_lower_bound(canaries=1000, guesses=300, correct=260, delta=1e-5)
    assert 0.0 < approx <= pure


def test_canary_bound_on_randomized_response_exceeds_the_true_epsilon_at_most_at_its_confidence():
    """eps-randomized response is exactly eps-DP and makes each guess right with probability
    e^eps / (1 + e^eps); over seeded audits the 95% lower bound may exceed eps about 5% of the time."""
    from engine.audit.canaries import canary_guesses, epsilon_lower_bound

    rng = np.random.default_rng(11)
    eps, trials, above, bounds = 2.0, 200, 0, []
    for _ in range(trials):
        included = rng.random(400) < 0.5
        truthful = rng.random(400) < math.exp(eps) / (1 + math.exp(eps))
        scores = np.where(included == truthful, 1.0, -1.0) + 1e-3 * rng.random(400)  # randomized response
        guesses = canary_guesses(scores=scores, included=included, guess_in=100, guess_out=100)
        bound = epsilon_lower_bound(canaries=guesses.canaries, guesses=guesses.guesses, correct=guesses.correct)
        bounds.append(bound)
        above += bound > eps
    assert above <= 0.05 * trials + 6
    assert np.median(bounds) > 0.5 * eps  # and the audit is not vacuous


def test_canary_guesses_count_right_guesses():
    from engine.audit.canaries import canary_guesses

    scores = [0.9, 0.8, 0.1, 0.2, 0.5]
    included = [True, False, False, True, True]
    g = canary_guesses(scores=scores, included=included, guess_in=2, guess_out=2)
    # in: 0.9 (right), 0.8 (wrong); out: 0.1 (right), 0.2 (wrong)
    assert (g.canaries, g.guesses, g.correct) == (5, 4, 2)
    with pytest.raises(ValueError, match="at most the 5 canaries"):
        canary_guesses(scores=scores, included=included, guess_in=3, guess_out=3)
