"""What leaves with an exported model: it names no file on the machine that trained it, and exporting
a run again gives the same bytes (a re-export can be checked against the model card's hashes)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

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


def test_two_exports_of_one_run_are_the_same_bytes(tmp_path):
    """The program's sample input is a fixed public example and safetensors' metadata is sorted: both
    were different at each export before (torch.rand; a map written in random order)."""
    import json

    import torch
    from safetensors import safe_open

    store = Store(tmp_path / "runs.sqlite")
    run_id = train_in_store(store, name="digits-dp", dataset="digits", noise_multiplier=1.0,
                            expected_batch_size=64, epochs=1, learning_rate=0.5)
    hashes = [export_run(store, run_id, tmp_path / f"export-{i}") for i in range(4)]
    assert all(h == hashes[0] for h in hashes)
    for name in ("model.safetensors", "model.pt2", "model.onnx", "model_card.json"):
        assert len({(tmp_path / f"export-{i}" / name).read_bytes() for i in range(4)}) == 1, name
    card = json.loads((tmp_path / "export-0" / "model_card.json").read_text())
    assert card["files"]["model.safetensors"] == hashes[0]["model.safetensors"]
    with safe_open(str(tmp_path / "export-0" / "model.safetensors"), framework="pt") as f:
        assert f.metadata() == {"model": "digits_cnn", "run_id": str(run_id)}
        weights = {key: f.get_tensor(key) for key in f.keys()}
    program = torch.export.load(str(tmp_path / "export-0" / "model.pt2")).module()
    x = torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(1)) * 16  # raw digits pixels, 0-16
    assert program(x.unsqueeze(1)).shape == (3, 10) and len(weights) > 0


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


def test_an_export_that_fails_part_way_leaves_no_model_without_its_card(tmp_path, monkeypatch):
    """A killed `dpw export` left model.safetensors and model.pt2 with no model card, and the next export
    refused the folder as already holding them."""
    import engine.export

    store = Store(tmp_path / "runs.sqlite")
    run_id = train_in_store(store, name="digits-dp", dataset="digits", noise_multiplier=1.0,
                            expected_batch_size=64, epochs=1, learning_rate=0.5)
    out = tmp_path / "export"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # as a Ctrl-C or a kill between the weights and the card

    monkeypatch.setattr(engine.export, "model_card", killed)
    with pytest.raises(KeyboardInterrupt):
        export_run(store, run_id, out)
    assert list(out.iterdir()) == []  # nothing of the unfinished export, not even its hidden folder
    monkeypatch.undo()
    abandoned = out / f"{engine.export.STAGING_PREFIX}999999999-x"  # left by a process that no longer runs
    abandoned.mkdir()
    (abandoned / "model.pt2").write_bytes(b"partial")
    files = export_run(store, run_id, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(files) == sorted(engine.export.EXPORT_FILES)


def test_a_run_deleted_during_its_export_is_exported_whole_and_exits_zero(tmp_path, monkeypatch):
    """`dpw delete` from another terminal while `dpw export` wrote the files: every file was written,
    then the export ended with "no run with id 1" and exit status 1."""
    from click.testing import CliRunner

    import engine.export
    from engine.cli import cli
    from engine.runner import remove_run

    store = Store(tmp_path / "runs.sqlite")
    run_id = train_in_store(store, name="digits-dp", dataset="digits", noise_multiplier=1.0,
                            expected_batch_size=64, epochs=1, learning_rate=0.5)
    write_export = engine.export._write_export

    def deleted_meanwhile(*args, **kwargs):
        files = write_export(*args, **kwargs)
        remove_run(Store(store.path), run_id)  # another process deletes the run as the files land
        return files

    monkeypatch.setattr(engine.export, "_write_export", deleted_meanwhile)
    out = tmp_path / "export"
    result = CliRunner().invoke(cli, ["export", str(run_id), "--db", str(store.path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(engine.export.EXPORT_FILES)
    assert [r["id"] for r in store.deleted_runs()] == [run_id]
