"""`python -m engine.precheck`: the checks before storing (and the data's size), one request per
line, for the window."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine.config import RunConfig
from engine.datasets import load_dataset

REPO = Path(__file__).resolve().parents[2]


def test_the_precheck_service_answers_each_config_in_one_line(tmp_path):
    missing = RunConfig(name="m", dataset="mnist", data_dir=str(tmp_path / "nothing"), noise_multiplier=1.0)
    table = tmp_path / "t.csv"
    table.write_text("x,label\n" + "".join(f"{i},{i % 2}\n" for i in range(40)))
    big_delta = RunConfig(name="d", dataset=str(table), noise_multiplier=1.0, delta=0.1, expected_batch_size=4)
    fine = RunConfig(name="ok", dataset="digits", noise_multiplier=1.0, epochs=1)
    sizes = [{"size_of": c.to_dict()} for c in (big_delta, RunConfig(dataset=str(table), train_subset=10, mechanism="none"), missing)]
    lines = "".join(json.dumps(c.to_dict()) + "\n" for c in (missing, big_delta, fine)) + "not json\n"
    lines += "".join(json.dumps(request) + "\n" for request in sizes)
    out = subprocess.run([sys.executable, "-m", "engine.precheck"], input=lines, capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    ready, *replies = [json.loads(line) for line in out.stdout.splitlines()]
    assert ready == {"ready": True}
    assert replies[0]["ok"] is False and "dataset files not found" in replies[0]["message"]
    assert replies[0]["hint"] and "\n" not in replies[0]["message"]
    assert replies[1]["ok"] is False and replies[1]["field"] == "delta" and "1/N" in replies[1]["message"]
    assert replies[2] == {"ok": True}
    assert replies[3]["ok"] is False and "unreadable request" in replies[3]["message"]
    # The data's size, as a run reads it (the window's cost preview of a file or folder dataset):
    # 40 rows, some held out (test_fraction 0.2); a training subset; data that cannot be read.
    split = load_dataset(str(table))
    assert split.num_train + split.num_test == 40
    assert replies[4] == {"ok": True, "num_train": split.num_train, "num_test": split.num_test}
    assert replies[5] == {"ok": True, "num_train": 10, "num_test": split.num_test}
    assert replies[6]["ok"] is False and "dataset files not found" in replies[6]["message"]
    assert "Traceback" not in out.stderr


def test_requests_carry_the_fingerprints_of_data_checked_before(tmp_path, monkeypatch):
    """The window sends the fingerprints its listed runs trained on: such an image folder is hashed,
    not checked again (engine.image_folder); a changed one is checked."""
    import numpy as np
    from PIL import Image

    from engine.image_folder import ImageFileRows
    from engine.precheck import answer

    for k in range(2):
        (tmp_path / "pics" / f"c{k}").mkdir(parents=True)
        for i in range(10):
            Image.fromarray(np.full((6, 6), 40 * k + i, np.uint8)).save(tmp_path / "pics" / f"c{k}" / f"{i}.png")
    config = RunConfig(name="p", dataset=str(tmp_path / "pics"), model="mlp", noise_multiplier=1.0, epochs=1,
                       expected_batch_size=4, delta=1e-3).to_dict()
    parsed = []
    check_file = ImageFileRows._check_file
    monkeypatch.setattr(ImageFileRows, "_check_file",
                        lambda self, path, head, problems: parsed.append(path) or check_file(self, path, head, problems))
    from engine.runs import load_run_data

    data = load_run_data(RunConfig.from_dict(config))
    fingerprint = data.fingerprint
    assert len(parsed) == 20
    parsed.clear()
    assert answer({**config, "checked_before": [fingerprint]}) == {"ok": True}
    assert answer({"size_of": config, "checked_before": [fingerprint]}) == {"ok": True, "num_train": data.num_train,
                                                                            "num_test": data.num_test}
    assert parsed == []
    assert answer({**config, "checked_before": ["another"]}) == {"ok": True} and len(parsed) == 20
