"""Exported models reproduce the engine's predictions; reports carry every field and no private data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

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


def test_table_report_says_its_normalization_is_not_covered(runs):
    store, all_runs = runs
    report = build_report(store, all_runs["table"][0], figures=False)
    assert any("normalization" in c and "not covered" in c for c in report["caveats"])


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
