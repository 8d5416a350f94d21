"""The membership audit kept with a run: its ROC thinned to its own points, one summary key merged."""

from __future__ import annotations

import numpy as np
import pytest

from engine.audit_job import thin_roc
from engine.config import RunConfig
from engine.errors import DPWError
from engine.store import Store


def test_a_thinned_roc_keeps_its_ends_and_only_its_own_points():
    rng = np.random.default_rng(0)
    fpr = np.concatenate([[0.0], np.sort(rng.uniform(size=9998)), [1.0]])
    tpr = np.sqrt(fpr)
    thin_fpr, thin_tpr = thin_roc(fpr, tpr)
    assert 100 < thin_fpr.size < 600
    assert thin_fpr[0] == 0.0 and thin_fpr[-1] == 1.0 and thin_tpr[-1] == 1.0
    assert np.all(np.isin(thin_fpr, fpr)) and np.all(np.diff(thin_fpr) > 0)
    assert np.array_equal(thin_tpr, np.sqrt(thin_fpr))  # the ROC's own (fpr, tpr) pairs
    # at FPR 1% the kept point is the last one at or under 1%: TPR at 1% is not overstated
    at = np.searchsorted(thin_fpr, 0.01, side="right") - 1
    assert thin_fpr[at] == fpr[np.searchsorted(fpr, 0.01, side="right") - 1]


def test_setting_one_summary_key_keeps_the_others(tmp_path):
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(name="t", dataset="digits", noise_multiplier=1.0))
    store.update_run(run_id, summary={"test_accuracy": 0.9, "canaries": {"count": 4}})
    store.set_summary_key(run_id, "membership_audit", {"mia": {"auc": 0.5}})
    assert store.get_run(run_id)["summary"] == {"test_accuracy": 0.9, "canaries": {"count": 4},
                                                 "membership_audit": {"mia": {"auc": 0.5}}}
    with pytest.raises(DPWError, match="no run with id 99"):
        store.set_summary_key(99, "membership_audit", {})


def test_a_report_states_the_membership_audit_kept_with_the_run(tmp_path):
    """`dpw report --include-audit` shows the audit the window kept (same numbers, when it was computed),
    not a new one computed with other settings."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_export_report import train_in_store

    from engine.audit_job import audit_and_store
    from engine.report import build_report

    store = Store(tmp_path / "runs.sqlite")
    run_id, _ = train_in_store(store, name="kept", dataset="digits", noise_multiplier=1.0, epochs=1,
                               expected_batch_size=64, device="cpu")
    kept = audit_and_store(store, run_id)
    audit = build_report(store, run_id, include_audit=True, figures=False)["audit"]
    assert audit["computed"] == kept["computed"] and audit["mia"] == kept["mia"]
    assert audit["mia"]["roc"]["points"] >= len(audit["mia"]["roc"]["fpr"])  # the kept, thinned curve
    assert audit["canaries"] is None  # the run had none

    fresh = Store(tmp_path / "other.sqlite")
    other_id, _ = train_in_store(fresh, name="fresh", dataset="digits", noise_multiplier=1.0, epochs=1,
                                 expected_batch_size=64, device="cpu")
    computed_now = build_report(fresh, other_id, include_audit=True, figures=False)["audit"]
    assert "computed" not in computed_now and 0.0 <= computed_now["mia"]["auc"] <= 1.0


def test_every_finished_run_is_audited_by_its_own_runner_unless_its_config_says_not(tmp_path):
    """`dpw run` ends with the loss attack on the run's model kept in its summary and stated in one line;
    `membership_audit = false` leaves it out, and the setting does not change what the run computes."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    db = tmp_path / "runs.sqlite"
    base = ('dataset = "digits"\nmodel = "mlp"\nepochs = 1\nexpected_batch_size = 64\nnoise_multiplier = 1.0\n'
            'device = "cpu"\n')
    outputs = {}
    for name, extra in (("audited", ""), ("not-audited", "membership_audit = false\n")):
        config = tmp_path / f"{name}.toml"
        config.write_text(f'name = "{name}"\n' + base + extra)
        ran = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(config), "--db", str(db)],
                             capture_output=True, text=True, cwd=repo, timeout=600)
        assert ran.returncode == 0, ran.stderr
        outputs[name] = ran.stdout
    store = Store(db)
    audited, skipped = (store.get_run(run_id) for run_id in (1, 2))
    kept = audited["summary"]["membership_audit"]
    mia = kept["mia"]
    assert 0.0 <= mia["auc"] <= 1.0 and mia["members"] == mia["nonmembers"] > 300
    assert mia["theory"]["above_theory"] is False  # a DP run's attack lies under its guarantee's curve
    assert kept["computed_from_private_data"] is True and kept["epsilon"] == pytest.approx(audited["epsilon"])
    line = next(line for line in outputs["audited"].splitlines() if line.strip().startswith("membership"))
    assert f"AUC {mia['auc']:.3f}" in line and f"dpw audit {audited['id']}" in line
    assert "membership_audit" not in skipped["summary"]
    assert "membership " not in outputs["not-audited"]
    assert audited["config_hash"] == skipped["config_hash"]  # the same training, audited or not
    assert json.dumps(kept)  # plain JSON, as the Audit tab reads it


def test_dpw_audit_shows_the_kept_audit_when_the_runs_data_is_gone(tmp_path):
    """The data files moved away: `dpw audit` says so and shows the audit the runner kept (the numbers the
    Audit tab showed), in text and JSON; a run with no kept audit still gets the one-line data error."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from click.testing import CliRunner

    from engine.cli import cli

    repo = Path(__file__).resolve().parents[2]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 2))
    csv = tmp_path / "cohort.csv"
    csv.write_text("a,b,label\n" + "".join(f"{r[0]:.4f},{r[1]:.4f},{int(r[0] > 0)}\n" for r in x), encoding="utf-8")
    db = tmp_path / "runs.sqlite"
    for name, extra in (("kept", ""), ("not-kept", "membership_audit = false\n")):
        config = tmp_path / f"{name}.toml"
        config.write_text(f'name = "{name}"\ndataset = "{csv}"\nlabel_column = "label"\nmodel = "logistic"\n'
                          f'noise_multiplier = 1.0\nepochs = 2\nexpected_batch_size = 32\ndelta = 1e-4\n{extra}',
                          encoding="utf-8")
        ran = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(config), "--db", str(db)],
                             capture_output=True, text=True, cwd=repo, timeout=600)
        assert ran.returncode == 0, ran.stderr
    kept = Store(db).get_run(1)["summary"]["membership_audit"]
    csv.rename(tmp_path / "moved.csv")
    shown = CliRunner().invoke(cli, ["audit", "1", "--db", str(db)])
    assert shown.exit_code == 0, shown.output
    assert "showing the audit kept with run 1" in shown.output and f"AUC              {kept['mia']['auc']:.4f}" in \
        shown.output
    as_json = CliRunner().invoke(cli, ["audit", "1", "--db", str(db), "--json"])
    body = json.loads(as_json.stdout)
    assert body["kept"] is True and body["mia"]["auc"] == kept["mia"]["auc"] and body["canaries"] is None
    missing = CliRunner().invoke(cli, ["audit", "2", "--db", str(db)])
    assert missing.exit_code == 1 and "cohort.csv" in missing.output and "Traceback" not in missing.output
