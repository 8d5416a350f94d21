"""Exported models reproduce the engine's predictions; reports carry every field and no private data."""

from __future__ import annotations

import html
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import rounding
from engine.config import RunConfig
from engine.dpsgd.trainer import predict
from engine.errors import DPWError
from engine.export import export_run, load_trained_model
from engine.report import build_report, write_report
from engine.runner import artifacts_dir
from engine.runs import prepare, store_votes
from engine.store import Store


def train_in_store(store: Store, **values):
    """Queue and train a run in-process (as the runner does), keeping the engine's model in memory."""
    config = RunConfig(**values)
    run_id = store.create_run(config)
    from engine.events import EventWriter

    emit = EventWriter(run_id, stream=None, sink=store.record_event).emit
    store.mark_running(run_id)
    prepared = prepare(config, emit=emit)
    store_votes(prepared, store, run_id)
    result = prepared.train()
    summary = prepared.finish(result, store=store, out_dir=artifacts_dir(store, run_id), emit=emit)
    store.update_run(run_id, status="finished", summary=summary, **prepared.run_fields(result))
    return run_id, prepared


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("store") / "runs.sqlite")
    image = train_in_store(store, name="digits-dp", dataset="digits", noise_multiplier=1.0, expected_batch_size=64,
                           epochs=3, learning_rate=0.5, epsilon_budget=50.0)
    table = train_in_store(store, name="cancer-dp", dataset="breast-cancer", model="logistic", noise_multiplier=1.0,
                           expected_batch_size=32, epochs=3, learning_rate=0.5, delta=1e-4)
    baseline = train_in_store(store, name="digits-base", dataset="digits", mechanism="none", expected_batch_size=64,
                              epochs=3, learning_rate=0.5)
    return store, {"image": image, "table": table, "baseline": baseline}


def raw_inputs(prepared) -> torch.Tensor:
    """The test inputs as the user has them (undo the recorded normalization)."""
    norm = prepared.data.normalization
    shape = (1, -1) + (1,) * (prepared.data.x_test.dim() - 2)
    mean = torch.tensor(norm["mean"]).view(shape)
    std = torch.tensor(norm["std"]).view(shape)
    return prepared.data.x_test * std + mean


@pytest.mark.parametrize("which", ["image", "table"])
def test_every_export_reproduces_the_engine_predictions(runs, tmp_path, which):
    store, all_runs = runs
    run_id, prepared = all_runs[which]
    engine_pred = predict(prepared.model, prepared.data.x_test)
    files = export_run(store, run_id, tmp_path)
    assert set(files) == {"model.safetensors", "model.pt2", "model.onnx", "model_card.json"}
    modes = {name: (tmp_path / name).stat().st_mode & 0o777 for name in files}
    assert len(set(modes.values())) == 1, modes  # the weights as readable as their card (was 0600)
    raw = raw_inputs(prepared)

    from safetensors.torch import load_file

    from engine.models import build_model

    model = build_model(prepared.model_name, input_shape=prepared.data.input_shape,
                        num_classes=prepared.data.num_classes)
    model.load_state_dict(load_file(str(tmp_path / "model.safetensors")))
    assert torch.equal(predict(model.eval(), prepared.data.x_test), engine_pred)

    program = torch.export.load(str(tmp_path / "model.pt2")).module()
    with torch.no_grad():
        assert torch.equal(program(raw).argmax(1), engine_pred)

    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    onnx_pred = session.run(None, {"input": raw.numpy().astype(np.float32)})[0].argmax(1)
    assert np.array_equal(onnx_pred, engine_pred.numpy())

    accuracy = float((engine_pred == prepared.data.y_test).float().mean())
    assert accuracy == pytest.approx(store.get_run(run_id)["accuracy"])
    card = json.loads((tmp_path / "model_card.json").read_text())
    assert card["privacy"]["epsilon"] == store.get_run(run_id)["epsilon"]
    assert card["input"]["normalization"]["mean"] == prepared.data.normalization["mean"]
    assert card["files"]["model.onnx"] == files["model.onnx"]


def test_exporting_teachers_is_refused_with_the_reason(runs, tmp_path):
    store, all_runs = runs
    with pytest.raises(DPWError, match="teachers saw raw private data"):
        export_run(store, all_runs["image"][0], tmp_path, kind="teacher")


def test_a_run_without_a_model_cannot_be_exported(runs, tmp_path):
    store, _ = runs
    run_id = store.create_run(RunConfig(name="never", dataset="digits", noise_multiplier=1.0))
    store.update_run(run_id, status="failed", error="x")
    with pytest.raises(DPWError, match="no trained model"):
        load_trained_model(store, run_id)


def test_the_guarantee_of_a_failed_run_speaks_of_what_it_released_not_of_a_model(runs):
    """A run killed mid-training keeps the privacy of the steps it took; its report must not call it a model."""
    from engine.report import privacy_statement

    store, _ = runs
    run_id = store.create_run(RunConfig(name="killed", dataset="digits", noise_multiplier=1.0))
    store.update_run(run_id, status="failed", error="the runner process was killed", epsilon=2.936, delta=1e-4,
                     accountant="pld", summary={"randomness": {"privacy_noise": "secret", "noise_sampler": "standard"}})
    statement = privacy_statement(store.get_run(run_id))["statement"]
    assert statement.startswith("This run failed before its end") and "This model" not in statement
    assert "(2.936, 0.0001)-differential privacy" in statement and "e^2.936 (about 18.9x)" in statement  # e^2.936 = 18.84, rounded up
    # An epsilon beyond a float's e^x (the RDP figure of noise 1e-9) states no "about infx".
    store.update_run(run_id, epsilon=1.21e19, accountant="rdp")
    statement = privacy_statement(store.get_run(run_id))["statement"]
    assert "e^1.21e+19 times its probability" in statement and "inf" not in statement


def test_the_guarantee_in_words_adds_delta_to_the_probability(runs):
    """(epsilon, delta)-DP: P[M(D) in S] <= e^epsilon P[M(D') in S] + delta; delta is not the probability
    that the ratio bound fails."""
    from engine.report import privacy_statement

    store, all_runs = runs
    run = store.get_run(all_runs["image"][0])
    statement = privacy_statement(run)["statement"]
    eps = run["epsilon"]
    assert (f"the probability of any outcome of training on one is at most e^{rounding.up(eps, '.4g')} (about "
            f"{rounding.up(math.exp(eps), '.3g')}x) times its probability on the other, plus 1e-05.") in statement
    assert "except with probability" not in statement and "factor of" not in statement


def _dpsgd_row(epsilon: float, delta: float) -> dict:
    return {"id": 1, "mechanism": "dpsgd", "status": "finished", "epsilon": epsilon, "delta": delta,
            "accountant": "pld", "config": {}, "summary": {}}


def test_the_caveats_state_the_group_bound_for_several_rows_and_when_it_bounds_nothing():
    from engine.report import caveats, group_privacy_caveat

    text = group_privacy_caveat(_dpsgd_row(2.6809, 1e-5))
    # By hand: 2 rows (5.3618, 2 e^2.6809 1e-5 = 2.92e-4), 3 rows (8.0427, 6.39e-3), 5 rows (13.40, 2.27).
    assert text.startswith("The unit of privacy is one training example: one row of the data. A person with k rows "
                           "is covered only by the group bound (kε, k·e^((k−1)ε)·δ): ")
    assert ("2 rows, ε = 5.362 and δ = 0.0003; 3 rows, ε = 8.043 and δ = 0.0064; 5 rows, no guarantee (δ would "
            "be 2.3 ≥ 1).") in text
    assert text in caveats(_dpsgd_row(2.6809, 1e-5), {})
    assert "roughly k times" not in " ".join(caveats(_dpsgd_row(2.6809, 1e-5), {}))
    small = group_privacy_caveat(_dpsgd_row(0.5, 1e-6))
    assert "5 rows, ε = 2.5 and δ = 3.7e-05" in small and "no guarantee" not in small  # 5 e^2 1e-6 = 3.69e-5


def test_the_model_card_carries_the_reports_caveats_attack_figures_and_where_the_total_spend_is(runs, tmp_path):
    store, all_runs = runs
    run_id, _ = all_runs["image"]
    export_run(store, run_id, tmp_path)
    card = json.loads((tmp_path / "model_card.json").read_text())
    report = json.loads(write_report(store, run_id, tmp_path / "report.json").read_text())
    assert card["caveats"] == report["caveats"]
    assert card["attacker"] == report["attacker"] and card["attacker"]["statements"]
    assert any("This epsilon covers this one run" in c and "`dpw ledger`" in c for c in card["caveats"])
    baseline = all_runs["baseline"][0]
    export_run(store, baseline, tmp_path / "baseline")
    assert json.loads((tmp_path / "baseline" / "model_card.json").read_text())["attacker"] is None


def test_the_reports_audit_table_restates_an_audit_kept_by_an_earlier_version():
    """A kept audit from 359 non-members had a TPR at FPR 0.1% and said its ROC "lies under" the curve."""
    from engine.report import audit_rows

    audit = {"attack": "loss threshold", "computed": "2026-01-01T00:00:00", "canaries": None, "mia": {
        "members": 359, "nonmembers": 359, "auc": 0.49, "auc_interval": [0.45, 0.53], "confidence": 0.95,
        "tpr_at_fpr": {"0.01": 0.0084, "0.001": 0.0056}, "tpr_interval": {"0.01": [0.0, 0.033], "0.001": [0, 0.0167]},
        "theory": {"above_theory": False, "confidence": 0.95, "resolution": {"fpr": 0.01, "tpr": 0.2751},
                   "message": "the empirical ROC lies under the theoretical trade-off curve"}}}
    rows = audit_rows(audit)
    assert rows["TPR at FPR 1%"] == "0.84% [0%, 3.3%]"
    assert rows["TPR at FPR 0.1%"] == "not measurable with 359 non-members (FPR 0.1% needs at least 1,000)"
    assert rows["theory check"].startswith("not significantly above the guarantee's curve (95% band: with 359 "
                                           "members and 359 non-members, only a TPR above 27.5% at FPR 1% would "
                                           "have been flagged); one attack gives a lower bound on the risk")


def test_a_changed_model_file_is_detected(runs, tmp_path):
    store, _ = runs
    run_id, _ = train_in_store(store, name="tamper", dataset="digits", noise_multiplier=1.0,
                               expected_batch_size=64, epochs=1, learning_rate=0.5)
    path = Path(store.artifacts(run_id)[0]["path"])
    path.write_bytes(path.read_bytes() + b"x")
    with pytest.raises(DPWError, match="sha256 differs"):
        export_run(store, run_id, tmp_path)


REQUIRED = {
    "guarantee": ["epsilon", "delta", "statement", "unit_of_privacy", "neighbouring_relation", "accountant",
                  "accountant_version"],
    "dpsgd": ["sampling", "sample_rate", "clipping_norm", "noise_multiplier", "steps", "epochs"],
    "training": ["dataset_size", "dataset_fingerprint", "model"],
    "utility": ["test_accuracy", "per_class_accuracy", "non_private_baseline"],
}


def test_report_json_has_every_field_and_agrees_with_the_store(runs, tmp_path):
    store, all_runs = runs
    run_id, prepared = all_runs["image"]
    path = write_report(store, run_id, tmp_path / "report.json")
    report = json.loads(path.read_text())
    for section, keys in REQUIRED.items():
        for key in keys:
            assert report[section].get(key) is not None, f"{section}.{key} missing"
    run = store.get_run(run_id)
    assert report["guarantee"]["epsilon"] == run["epsilon"] and report["guarantee"]["delta"] == run["delta"]
    assert report["guarantee"]["unit_of_privacy"] == "one training example"
    assert "add/remove" in report["guarantee"]["neighbouring_relation"]
    assert report["dpsgd"]["sampling"] == "Poisson"
    assert report["dpsgd"]["sample_rate"] == pytest.approx(64 / prepared.data.num_train)
    assert report["dpsgd"]["steps"] == run["steps_done"]
    assert report["training"]["dataset_fingerprint"] == prepared.data.fingerprint
    assert report["training"]["dataset_size"] == prepared.data.num_train
    assert report["utility"]["test_accuracy"] == run["accuracy"]
    per_class = report["utility"]["per_class_accuracy"]
    assert set(per_class) == set(prepared.data.class_names)
    counts = torch.bincount(prepared.data.y_test, minlength=10).numpy()
    weighted = sum(per_class[str(c)] * counts[c] for c in range(10)) / counts.sum()
    assert weighted == pytest.approx(run["accuracy"])
    assert report["utility"]["non_private_baseline"]["run_id"] == all_runs["baseline"][0]
    assert report["config_hash"] == run["config_hash"] and report["seed"] == 0
    assert {"torch", "numpy", "python", "dp-workbench"} <= set(report["software"])
    assert report["figures"]["epsilon"].startswith("data:image/png;base64,")
    assert report["figures"]["accuracy"].startswith("data:image/png;base64,")
    assert any("does not protect" in c for c in report["caveats"])
    assert report["contains_private_data"] is False and report["private_data_notice"] is None


def test_a_run_scaled_by_its_training_data_statistics_carries_no_guarantee_anywhere(runs, tmp_path):
    """normalization = "exact" ships the training split's own mean and std with the model: the report,
    the model card, dpw list/show and the ledger said the run satisfied its (epsilon, delta)."""
    from click.testing import CliRunner

    from engine.cli import cli
    from engine.ledger import live_entry
    from engine.publication import EXACT_STATISTICS, NO_GUARANTEE_HEADLINE

    store, all_runs = runs
    declared = build_report(store, all_runs["table"][0], figures=False)  # declared bounds by default
    assert declared["guarantee"]["holds"] is True and declared["contains_private_data"] is False
    assert not any("normalization" in c for c in declared["caveats"])
    run_id, prepared = train_in_store(store, name="cancer-exact", dataset="breast-cancer", model="logistic",
                                      noise_multiplier=1.0, expected_batch_size=32, epochs=1, learning_rate=0.5,
                                      delta=1e-4, normalization="exact")
    mean = prepared.data.normalization["mean"]
    texts = _texts(store, run_id, tmp_path)
    report = json.loads(texts["report.json"])
    statement = f"{NO_GUARANTEE_HEADLINE}: {EXACT_STATISTICS}"
    assert report["guarantee"]["holds"] is False and report["guarantee"]["statement"].startswith(statement)
    assert report["training"]["normalization"]["mean"] == pytest.approx(mean)  # what the model ships with
    assert report["contains_private_data"] is True and "normalization" in report["private_data_notice"]
    assert report["caveats"][0].startswith(f"{NO_GUARANTEE_HEADLINE}: the table's feature normalization")
    assert f"<b>{html.escape(statement)}</b>" in texts["report.html"]
    card = json.loads(texts["model_card.json"])
    assert card["privacy"]["holds"] is False and card["privacy"]["statement"].startswith(statement)

    runner = CliRunner()
    listed = json.loads(runner.invoke(cli, ["list", "--json", "--db", str(store.path)]).output)
    assert next(r for r in listed if r["id"] == run_id)["guarantee"] is False
    assert next(r for r in listed if r["id"] == all_runs["table"][0])["guarantee"] is True
    line = next(ln for ln in runner.invoke(cli, ["list", "--db", str(store.path)]).output.splitlines()
                if "cancer-exact" in ln)
    assert "no guarantee" in line
    shown = runner.invoke(cli, ["show", str(run_id), "--db", str(store.path)]).output
    assert "NO GUARANTEE" in shown and statement in shown
    entry = live_entry(store.get_run(run_id))
    assert entry.counted == "unbounded" and entry.why == EXACT_STATISTICS
    warnings = [e["message"] for e in store.events(run_id) if e["type"] == "warning"]
    assert any("states no differential privacy guarantee" in w for w in warnings)


def test_non_private_baseline_report_states_no_guarantee(runs):
    store, all_runs = runs
    report = build_report(store, all_runs["baseline"][0], figures=False)
    assert report["guarantee"]["epsilon"] is None
    assert "without differential privacy" in report["guarantee"]["statement"]


def test_html_and_pdf_render_the_guarantee(runs, tmp_path):
    store, all_runs = runs
    run_id, _ = all_runs["image"]
    eps = store.get_run(run_id)["epsilon"]
    html = write_report(store, run_id, tmp_path / "r.html").read_text()
    assert f"ε = {eps:.4g}" in html and "<img" in html
    pdf = write_report(store, run_id, tmp_path / "r.pdf")
    assert pdf.read_bytes().startswith(b"%PDF")

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtPdf import QPdfDocument
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])  # noqa: F841
    document = QPdfDocument()
    document.load(str(pdf))
    text = " ".join(document.getAllText(page).text() for page in range(document.pageCount()))
    assert "Privacy report: digits-dp" in text
    assert f"{eps:.4g}" in text and "one training example" in text


def test_unknown_report_extension_is_refused(runs, tmp_path):
    store, all_runs = runs
    with pytest.raises(DPWError, match="use .html, .pdf or .json"):
        write_report(store, all_runs["image"][0], tmp_path / "r.docx")


# ---- what leaves the machine ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def private_runs(tmp_path_factory):
    """A run on a CSV deep in a user's folders (with a data_dir there too), and a reproducible-noise run."""
    root = tmp_path_factory.mktemp("home-alice")
    folder = root / "patients" / "cohort 2024 (private)"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 4))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int)
    lines = ["a,b,c,d,label"] + [",".join(f"{v:.5f}" for v in row) + f",{label}" for row, label in zip(x, y)]
    (folder / "cohort-2024.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    store = Store(tmp_path_factory.mktemp("private-store") / "runs.sqlite")
    csv = train_in_store(store, name="cohort", dataset=str(folder / "cohort-2024.csv"), data_dir=str(folder),
                         label_column="label", model="logistic", noise_multiplier=1.0, expected_batch_size=32,
                         epochs=2, learning_rate=0.5, delta=1e-4)
    seeded = train_in_store(store, name="debug-seeded", dataset="digits", noise_multiplier=1.0,
                            expected_batch_size=64, epochs=1, learning_rate=0.5, reproducible_noise=True)
    return store, folder, {"csv": csv, "seeded": seeded}


def _texts(store, run_id, tmp_path) -> dict[str, str]:
    out = {
        "report.json": write_report(store, run_id, tmp_path / "report.json").read_text(encoding="utf-8"),
        "report.html": write_report(store, run_id, tmp_path / "report.html").read_text(encoding="utf-8"),
    }
    export_run(store, run_id, tmp_path / "export")
    out["model_card.json"] = (tmp_path / "export" / "model_card.json").read_text(encoding="utf-8")
    return out


def test_report_and_model_card_of_a_nested_csv_name_the_file_only(private_runs, tmp_path):
    import hashlib

    store, folder, all_runs = private_runs
    run_id, _ = all_runs["csv"]
    texts = _texts(store, run_id, tmp_path)
    # The folders the user made (short system parts such as "tmp" could occur by chance in base64 images).
    parts = [str(folder), *folder.parent.parent.relative_to(folder.parents[2]).parts, "patients",
             "cohort 2024 (private)"]
    assert parts[1].startswith("home-alice")
    for name, text in texts.items():
        for part in parts:
            assert part not in text and json.dumps(part)[1:-1] not in text, f"{part!r} in {name}"
        assert "cohort-2024.csv" in text, name
    fingerprint = hashlib.sha256((folder / "cohort-2024.csv").read_bytes()).hexdigest()
    report = json.loads(texts["report.json"])
    card = json.loads(texts["model_card.json"])
    assert report["training"]["dataset"] == report["config"]["dataset"] == "cohort-2024.csv"
    assert "data_dir" not in report["config"]
    assert report["training"]["dataset_fingerprint"] == fingerprint
    assert card["training_data"] == {"name": "cohort-2024.csv", "fingerprint": fingerprint}


def test_report_states_what_the_guarantee_treats_as_public(runs):
    store, all_runs = runs
    report = build_report(store, all_runs["image"][0], figures=False)
    public = [c for c in report["caveats"] if c.startswith("Treated as public")]
    assert any("size of the training set" in c and "add/remove" in c for c in public)
    assert any("test metrics" in c and "held-out" in c and "without privacy" in c for c in public)


def test_reports_and_cards_carry_no_sample_counts_or_training_losses(runs, tmp_path):
    store, all_runs = runs
    run_id, _ = all_runs["image"]
    losses = [m["value"] for m in store.metrics(run_id, "train_loss")]
    assert losses
    for name, text in _texts(store, run_id, tmp_path).items():
        assert "samples_per_second" not in text and "samples_processed" not in text and "train_loss" not in text
        for value in losses:
            assert repr(value) not in text, name


def test_a_secret_noise_run_says_so(runs, tmp_path):
    store, all_runs = runs
    run_id, _ = all_runs["image"]
    report = build_report(store, run_id, figures=False)
    assert report["randomness"] == {"privacy_noise": "secret", "noise_sampler": "standard"}
    assert report["guarantee"]["holds"] is True
    assert any("secret operating-system randomness" in c for c in report["caveats"])
    export_run(store, run_id, tmp_path)
    card = json.loads((tmp_path / "model_card.json").read_text())
    assert card["randomness"]["privacy_noise"] == "secret" and card["privacy"]["holds"] is True


def test_a_reproducible_noise_run_carries_no_guarantee_anywhere(private_runs, tmp_path):
    from click.testing import CliRunner

    from engine.cli import cli
    from engine.publication import NO_GUARANTEE_STATEMENT

    store, _, all_runs = private_runs
    run_id, _ = all_runs["seeded"]
    texts = _texts(store, run_id, tmp_path)
    report = json.loads(texts["report.json"])
    assert NO_GUARANTEE_STATEMENT == ("No differential privacy guarantee: the noise is reproducible from the "
                                      "published seed (reproducible_noise = true)")
    assert report["guarantee"]["statement"].startswith(NO_GUARANTEE_STATEMENT)
    assert report["guarantee"]["holds"] is False
    assert report["randomness"] == {"privacy_noise": "seeded", "noise_sampler": "standard"}
    assert texts["report.html"].split("<h2>Guarantee</h2>", 1)[1].startswith(f"<p class='private'><b>{NO_GUARANTEE_STATEMENT}</b>")
    card = json.loads(texts["model_card.json"])
    assert card["privacy"]["statement"].startswith(NO_GUARANTEE_STATEMENT) and card["privacy"]["holds"] is False
    assert card["randomness"]["privacy_noise"] == "seeded"

    runner = CliRunner()
    listed = json.loads(runner.invoke(cli, ["list", "--json", "--db", str(store.path)]).output)
    row = next(r for r in listed if r["id"] == run_id)
    assert row["guarantee"] is False and row["epsilon"] == store.get_run(run_id)["epsilon"]
    table = runner.invoke(cli, ["list", "--db", str(store.path)]).output
    line = next(ln for ln in table.splitlines() if "debug-seeded" in ln)
    assert "no guarantee" in line
    cohort = next(ln for ln in table.splitlines() if " cohort " in ln)
    assert "no guarantee" not in cohort
    shown = runner.invoke(cli, ["show", str(run_id), "--db", str(store.path)]).output
    assert "NO GUARANTEE" in shown and NO_GUARANTEE_STATEMENT in shown


def _pdf_pages(pdf: Path) -> list[list[str]]:
    """The text lines of each page of a PDF (Qt's PDF reader)."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtPdf import QPdfDocument
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])  # noqa: F841
    document = QPdfDocument()
    document.load(str(pdf))
    return [[line.strip() for line in document.getAllText(page).text().splitlines() if line.strip()]
            for page in range(document.pageCount())]


def test_a_dpsgd_report_lists_only_the_settings_the_run_read(runs, tmp_path):
    from engine.config import config_fields, fields_used

    store, all_runs = runs
    run_id, _ = all_runs["image"]
    report = build_report(store, run_id, figures=False)
    pate_only = {name for name, _, spec in config_fields() if spec.mechanisms == ("pate",)}
    assert pate_only and not pate_only & set(report["config"])
    assert set(report["config"]) <= set(fields_used("dpsgd"))
    assert "momentum" not in report["config"]  # the run used plain sgd
    assert "normalization_noise_multiplier" not in report["config"]  # normalization = 'bounds'
    assert {"noise_multiplier", "clipping_norm", "expected_batch_size", "delta"} <= set(report["config"])
    html = write_report(store, run_id, tmp_path / "r.html").read_text()
    config_html = html[html.index("<h3>Config</h3>"):]
    for label in ("num teachers", "sigma1", "threshold", "teacher model", "num queries"):
        assert f"<th>{label}</th>" not in config_html


def test_nested_report_values_are_labelled_rows_not_json(runs, tmp_path):
    store, all_runs = runs
    run_id, _ = all_runs["table"]
    html = write_report(store, run_id, tmp_path / "r.html").read_text()
    assert "{&quot;" not in html and '{"' not in html and "[&quot;" not in html
    software = html[html.index("<th>software</th>"):]
    assert software.startswith("<th>software</th><td><table class='nested'><tr><th>python</th>")
    assert "<th>privacy noise</th><td>secret</td>" in html


def test_no_heading_is_left_at_the_foot_of_a_pdf_page(runs, tmp_path):
    from workbench.report_pdf import html_to_pdf, orphaned_headings, paged_document

    store, all_runs = runs
    run_id, _ = all_runs["image"]
    report_html = write_report(store, run_id, tmp_path / "r.html").read_text()
    # Headings followed by text (a figure's heading ends a page's text when its figure is below it).
    text_headings = {"Guarantee", "How: DP-SGD", "Training data and model", "Utility", "Per-class test accuracy",
                     "What the guarantee does and does not cover", "Reproducibility", "Config"}
    # Padding before the report moves every heading through every position on a page.
    for padding in range(0, 60, 3):
        html = report_html.replace("<h2>Guarantee</h2>", "<p>padding</p>" * padding + "<h2>Guarantee</h2>", 1)
        assert orphaned_headings(paged_document(html)) == [], padding
        pages = _pdf_pages(html_to_pdf(html, tmp_path / f"r{padding}.pdf"))
        assert len(pages) >= 2
        for number, lines in enumerate(pages[:-1], start=1):
            assert lines[-1] not in text_headings, (padding, number, lines[-3:])


def test_headings_at_a_page_foot_are_moved_to_the_next_page():
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QSizeF
    from PySide6.QtGui import QTextDocument
    from PySide6.QtWidgets import QApplication

    from workbench.report_pdf import keep_headings_with_next, orphaned_headings

    app = QApplication.instance() or QApplication([])  # noqa: F841
    orphaned_somewhere = False
    for lines in range(10, 80):
        document = QTextDocument()
        document.setHtml("<h1>Report</h1>" + "<p>text</p>" * lines + "<h2>Settings</h2><table>"
                         + "".join(f"<tr><th>k{i}</th><td>v</td></tr>" for i in range(12)) + "</table>")
        document.setPageSize(QSizeF(600, 800))
        orphaned_somewhere |= bool(orphaned_headings(document))
        keep_headings_with_next(document)
        assert orphaned_headings(document) == [], lines
    assert orphaned_somewhere  # the layout without the fix does leave a heading at a page foot


def _strict_json(text: str):
    """json.loads that refuses the bare Infinity and NaN other parsers (JavaScript's, Go's) reject."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} in the JSON"))


def test_a_run_whose_noise_bounds_nothing_states_no_finite_guarantee_in_strict_json(tmp_path):
    """Noise multiplier 1e-9: epsilon is inf. The report said "satisfies (inf, 1e-05)-differential privacy
    ... about infx" in a green box with holds = true, and wrote bare Infinity into report.json and the
    model card. The attacker figures stay: the example is never sampled with probability (1 - q)^T."""
    from engine.publication import NO_FINITE_BOUND_STATEMENT

    store = Store(tmp_path / "runs.sqlite")
    run_id, _ = train_in_store(store, name="no-noise", dataset="digits", noise_multiplier=1e-9,
                               expected_batch_size=64, epochs=1, learning_rate=0.5)
    assert store.get_run(run_id)["epsilon"] == float("inf")
    texts = _texts(store, run_id, tmp_path)
    report = _strict_json(texts["report.json"])
    guarantee = report["guarantee"]
    assert guarantee["epsilon"] == "Infinity" and guarantee["holds"] is False
    assert guarantee["statement"].startswith(NO_FINITE_BOUND_STATEMENT) and "infx" not in guarantee["statement"]
    assert texts["report.html"].split("<h2>Guarantee</h2>", 1)[1].startswith(
        f"<p class='private'><b>{NO_FINITE_BOUND_STATEMENT}</b>")
    card = _strict_json(texts["model_card.json"])
    assert card["privacy"]["holds"] is False and card["privacy"]["statement"].startswith(NO_FINITE_BOUND_STATEMENT)
    from click.testing import CliRunner

    from engine.cli import cli

    shown = CliRunner().invoke(cli, ["show", str(run_id), "--db", str(store.path)]).output
    assert f"caveat         {NO_FINITE_BOUND_STATEMENT}" in shown
    listed = _strict_json(CliRunner().invoke(cli, ["list", "--json", "--db", str(store.path)]).output)
    assert listed[0]["epsilon"] == "Infinity" and listed[0]["guarantee"] is False
    detail = _strict_json(CliRunner().invoke(cli, ["show", str(run_id), "--json", "--db", str(store.path)]).output)
    assert detail["run"]["guarantee"] is False
    assert "∞ (no guarantee)" in CliRunner().invoke(cli, ["list", "--db", str(store.path)]).output
    run = store.get_run(run_id)
    never_sampled = (1 - run["sample_rate"]) ** run["steps_done"]
    assert report["attacker"]["max_advantage"] == pytest.approx(1 - never_sampled, rel=1e-3)
