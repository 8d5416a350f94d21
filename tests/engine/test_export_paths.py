"""What leaves with an exported model names no file on the machine that trained it."""

from __future__ import annotations

import zipfile
from pathlib import Path

import engine
from engine.config import RunConfig
from engine.events import EventWriter
from engine.export import export_run
from engine.runner import artifacts_dir
from engine.runs import prepare
from engine.store import Store


def train_in_store(store: Store, **values) -> int:
    """Queue and train a run in-process, as the runner does."""
    config = RunConfig(**values)
    run_id = store.create_run(config)
    emit = EventWriter(run_id, stream=None, sink=store.record_event).emit
    store.mark_running(run_id)
    prepared = prepare(config, emit=emit)
    result = prepared.train()
    summary = prepared.finish(result, store=store, out_dir=artifacts_dir(store, run_id), emit=emit)
    store.update_run(run_id, status="finished", summary=summary, **prepared.run_fields(result))
    return run_id


def test_exported_files_hold_no_path_of_this_machine(tmp_path):
    """torch.export records a stack trace per node with the install folder (and so the user's name);
    the saved program carries none, and neither do the other files."""
    store = Store(tmp_path / "runs.sqlite")
    run_id = train_in_store(store, name="digits-dp", dataset="digits", noise_multiplier=1.0,
                               expected_batch_size=64, epochs=1, learning_rate=0.5)
    out = tmp_path / "export"
    export_run(store, run_id, out)
    install = str(Path(engine.__file__).resolve().parent.parent).encode()
    site = str(Path(zipfile.__file__).resolve().parent).encode()
    with zipfile.ZipFile(out / "model.pt2") as archive:
        blobs = {f"model.pt2:{name}": archive.read(name) for name in archive.namelist()}
    for name in ("model.safetensors", "model.onnx", "model_card.json"):
        blobs[name] = (out / name).read_bytes()
    leaking = [name for name, blob in blobs.items() if install in blob or site in blob or b"site-packages" in blob]
    assert leaking == []
