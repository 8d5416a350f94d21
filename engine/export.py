"""Export a run's trained model in forms others can deploy: safetensors + model card,
a torch.export program and ONNX, each taking inputs as the user has them.

Only the released model is exported: the DP-SGD model, or the student of a PATE run. PATE
teachers saw raw private data and carry no guarantee, so exporting them is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.errors import DPWError, ExportFilesExist
from engine.events import to_json_safe
from engine.runner import sha256_of
from engine.store import Store, pid_alive

REFUSED_KINDS = {
    "teacher": "PATE teachers saw raw private data and carry no privacy guarantee; "
    "only the student, trained on privately released labels, can be exported",
    "teachers": "PATE teachers saw raw private data and carry no privacy guarantee; "
    "only the student, trained on privately released labels, can be exported",
}


class RawInputModel(nn.Module):
    """The trained model behind the recorded normalization: takes raw inputs, returns logits.

    Images: float tensors in [0, 1] shaped (B, C, H, W); tables: rows (B, F) as in the data file.
    """

    def __init__(self, model: nn.Module, mean: list[float], std: list[float], input_shape: tuple[int, ...],
                 low: list[float | None] | None = None, high: list[float | None] | None = None):
        super().__init__()
        self.model = model
        shape = (len(mean),) + (1,) * (len(input_shape) - 1) if len(input_shape) > 1 else (len(mean),)
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(shape))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(shape))
        # Tables with declared feature ranges: clip to them first (None: that feature is not clipped).
        self.clips = low is not None and high is not None
        if self.clips:
            lows = [-float("inf") if v is None else v for v in low]
            highs = [float("inf") if v is None else v for v in high]
            self.register_buffer("low", torch.tensor(lows, dtype=torch.float32).view(shape))
            self.register_buffer("high", torch.tensor(highs, dtype=torch.float32).view(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.clips:
            x = torch.maximum(torch.minimum(x, self.high), self.low)
        return self.model((x - self.mean) / self.std)


@dataclass(frozen=True)
class TrainedModel:
    run: dict[str, Any]
    model: nn.Module  # takes normalized inputs
    meta: dict[str, Any]  # what runs.finish saved beside the weights
    artifact: dict[str, Any]

    def raw_input_model(self) -> RawInputModel:
        norm = self.meta["normalization"]
        return RawInputModel(self.model, norm["mean"], norm["std"], tuple(self.meta["input_shape"]),
                             norm.get("low"), norm.get("high")).eval()


def load_trained_model(store: Store, run_ref: str | int, *, kind: str = "model", doing: str = "export") -> TrainedModel:
    """The released model of a finished or stopped run, rebuilt from its saved weights (`doing`: what the
    model is wanted for, as an error says it)."""
    from engine.models import build_model

    from engine.publication import check_releasable

    run = store.find_run(run_ref)
    check_releasable(run)
    if kind in REFUSED_KINDS:
        raise DPWError(f"cannot export the {kind} of run {run['id']}: {REFUSED_KINDS[kind]}")
    artifacts = [a for a in store.artifacts(run["id"]) if a["kind"] == kind]
    if not artifacts:
        raise DPWError(
            f"run {run['id']} ({run['name']}) has no trained model to {doing} (status: {run['status']})",
            hint="only runs that trained (finished, or stopped after some steps) have a model",
        )
    artifact = artifacts[-1]
    path = Path(artifact["path"])
    if not path.is_file():
        raise DPWError(f"the model file of run {run['id']} is missing: {path}")
    if artifact.get("sha256") and sha256_of(path) != artifact["sha256"]:
        raise DPWError(f"the model file of run {run['id']} was changed after training: {path} (sha256 differs)")
    meta = torch.load(path, map_location="cpu", weights_only=True)
    model = build_model(meta["model"], input_shape=tuple(meta["input_shape"]), num_classes=meta["num_classes"])
    model.load_state_dict(meta["state_dict"])
    model.eval()
    return TrainedModel(run=run, model=model, meta=meta, artifact=artifact)


def model_card(trained: TrainedModel, files: dict[str, str], plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a deployer needs to know: inputs, outputs, the guarantee (the publishable epsilon, or that
    there is none) with the report's caveats and attack figures, provenance, files. The training data is
    named by file name and fingerprint only; no teacher statistics, sample counts or training losses."""
    from engine.audit_run import audit_model_line
    from engine.publication import public_dataset_name, randomness
    from engine.report import attacker_section, caveats, privacy_statement, software_versions

    run, meta = trained.run, trained.meta
    image = len(meta["input_shape"]) > 1
    return {
        "format": "dp-workbench model card v1",
        "run": {"id": run["id"], "name": run["name"], "config_hash": run["config_hash"]},
        "model": meta["model"],
        "mechanism": run["mechanism"],
        "input": {
            "shape": ["batch", *meta["input_shape"]],
            "dtype": "float32",
            "values": "pixels scaled to [0, 1]" if image else "feature values as in the data file",
            "normalization": meta["normalization"],
            "normalization_applied_by": {
                "model.safetensors": "you: x = (x_raw - mean) / std before the model, after clipping x_raw to "
                "[low, high] where the normalization gives them",
                "model.pt2": "the program itself",
                "model.onnx": "the program itself",
            },
        },
        "output": {"logits": ["batch", meta["num_classes"]], "class_names": meta["class_names"]},
        "training_data": {"name": public_dataset_name(run.get("dataset")),
                          "fingerprint": (plan or {}).get("dataset_fingerprint")},
        "test_accuracy": run.get("accuracy"),
        "privacy": privacy_statement(run),
        "caveats": caveats(run, plan or {}),
        "attacker": attacker_section(run),  # None for a run with no guarantee, as in the report
        "audit_model": audit_model_line(run),  # None, or: trained with audit canaries (engine.audit_run)
        "randomness": randomness(run),
        "software": software_versions(),
        "files": files,
    }


EXPORT_FILES = ("model.safetensors", "model.pt2", "model.onnx", "model_card.json")


def _without_source_paths(program: "torch.export.ExportedProgram") -> "torch.export.ExportedProgram":
    """Drop the stack traces torch.export records on every node: they hold this machine's file paths
    (install folder, user name), which must not travel with a model handed to someone else."""
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if graph is not None else ():
            node.meta.pop("stack_trace", None)
    return program


def _sort_safetensors_metadata(path: Path) -> None:
    """safetensors writes its metadata map in a random order; sort it in place (the header keeps its
    length), so two exports of one run are the same bytes and a re-export matches the card's hash."""
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[:8], "little")
    header = bytes(data[8:8 + length])
    metadata = json.loads(header).get("__metadata__") or {}
    compact = {"separators": (",", ":"), "ensure_ascii": False}
    written = json.dumps(metadata, **compact).encode()  # json.loads keeps the file's order
    at = header.find(b'"__metadata__":' + written)
    stable = json.dumps(dict(sorted(metadata.items())), **compact).encode()
    if at != -1 and written != stable:
        start = 8 + at + len(b'"__metadata__":')
        data[start:start + len(written)] = stable
        path.write_bytes(bytes(data))


def export_run(store: Store, run_ref: str | int, out_dir: str | Path, *, kind: str = "model",
               force: bool = False) -> dict[str, str]:
    """Write model.safetensors, model.pt2, model.onnx and model_card.json; returns {file: sha256}.
    Files of those names already in `out_dir` are refused (never overwritten silently) unless `force`.
    They are written in a hidden folder inside `out_dir` first and moved into place together, the model
    card last: an export that is killed or fails leaves no model without its card."""
    trained = load_trained_model(store, run_ref, kind=kind)
    out = Path(out_dir)
    existing = [name for name in EXPORT_FILES if (out / name).exists()]
    if existing and not force:
        raise ExportFilesExist(f"{out} already holds {', '.join(existing)}; nothing was written",
                               hint="choose another --out folder, or add --force to replace them")
    out.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_staging(out)
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=out))
    try:
        files = _write_export(store, trained, staging)
        for name in EXPORT_FILES:  # the card last: it names the others' hashes
            if (staging / name).exists():
                os.replace(staging / name, out / name)
            else:
                (out / name).unlink(missing_ok=True)  # (ONNX not exported) an older export's file is not this one's
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return files


STAGING_PREFIX = ".dpw-export-"  # + the exporting process's pid: the hidden folder an export is written in


def _remove_abandoned_staging(out: Path) -> None:
    """Hidden folders that exports killed mid-way left in `out` (their process is gone)."""
    for folder in out.glob(f"{STAGING_PREFIX}*"):
        pid = folder.name.removeprefix(STAGING_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _write_export(store: Store, trained: TrainedModel, out: Path) -> dict[str, str]:
    """export_run's files written into `out` (its staging folder); {file: sha256}."""
    from safetensors.torch import save_file

    wrapped = trained.raw_input_model()
    # A fixed public example (it is saved in model.pt2 as the program's sample input): exports of one run
    # are then byte for byte the same, so a re-export can be checked against a model card's hashes.
    example = torch.rand(2, *trained.meta["input_shape"], generator=torch.Generator().manual_seed(0))
    files: dict[str, str] = {}

    save_file({k: v.contiguous() for k, v in trained.model.state_dict().items()}, str(out / "model.safetensors"),
              metadata={"model": trained.meta["model"], "run_id": str(trained.run["id"])})
    _sort_safetensors_metadata(out / "model.safetensors")
    files["model.safetensors"] = sha256_of(out / "model.safetensors")

    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(wrapped, (example,), dynamic_shapes={"x": {0: batch}})
    torch.export.save(_without_source_paths(program), str(out / "model.pt2"))
    files["model.pt2"] = sha256_of(out / "model.pt2")

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                wrapped, (example,), str(out / "model.onnx"), dynamo=False, input_names=["input"],
                output_names=["logits"], dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            )
        files["model.onnx"] = sha256_of(out / "model.onnx")
    except Exception as exc:  # ONNX where the model allows; say why not otherwise
        (out / "model.onnx").unlink(missing_ok=True)
        files["model.onnx"] = f"not exported: {type(exc).__name__}: {exc}"

    plan = store.plan_event(trained.run["id"])
    card = model_card(trained, files, plan)
    (out / "model_card.json").write_text(json.dumps(to_json_safe(card), indent=2, default=str, allow_nan=False),
                                         encoding="utf-8")
    files["model_card.json"] = sha256_of(out / "model_card.json")
    # safetensors creates its file readable by its owner alone (0600); give it the others' mode (the
    # user's umask), so whoever may read the model card may read the weights it describes.
    (out / "model.safetensors").chmod((out / "model_card.json").stat().st_mode & 0o777)
    return files
