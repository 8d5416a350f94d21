"""A CSV dataset with its held-out examples in a file of their own (`test_data`): every row of the
dataset trains and is protected, the test file is the test split (and PATE's public pool)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from engine.config import RunConfig
from engine.datasets import load_dataset
from engine.errors import ConfigError
from engine.settings_in_effect import settings_in_effect


def write_table(path: Path, rows: range, *, columns: str = "a,b,label", label=lambda i: "yes" if i % 2 else "no"):
    path.write_text(columns + "\n" + "\n".join(f"{i},{i * 0.5},{label(i)}" for i in rows) + "\n", encoding="utf-8")
    return path


def test_every_row_of_the_dataset_trains_and_the_test_file_is_the_test_split(tmp_path):
    train = write_table(tmp_path / "train.csv", range(40))
    held_out = write_table(tmp_path / "held_out.csv", range(100, 112), label=lambda i: "maybe" if i % 3 == 0 else "no")
    data = load_dataset(str(train), test_data=str(held_out), normalization="exact")
    assert data.num_train == 40 and data.num_test == 12
    # Undo the scaling: the training rows are the file's rows, in order; the test rows the test file's.
    raw = data.x_train[:, 0].double() * data.normalization["std"][0] + data.normalization["mean"][0]
    assert torch.allclose(raw, torch.arange(40, dtype=torch.float64), atol=1e-6)
    raw_test = data.x_test[:, 0].double() * data.normalization["std"][0] + data.normalization["mean"][0]
    assert torch.allclose(raw_test, torch.arange(100, 112, dtype=torch.float64), atol=1e-6)
    # A class only the (public) test file holds gets its own output; labels keep their names.
    assert data.class_names == ("maybe", "no", "yes")
    assert [data.class_names[i] for i in data.y_test.tolist()] == ["maybe" if i % 3 == 0 else "no"
                                                                    for i in range(100, 112)]
    # The fingerprint is the private data's alone; the split says where the test examples came from.
    assert data.fingerprint == hashlib.sha256(train.read_bytes()).hexdigest()
    assert data.split.startswith("test file given: ") and str(held_out) in data.split and "12 examples" in data.split
    drawn = load_dataset(str(train), normalization="exact")
    assert drawn.num_train < 40 and drawn.fingerprint == data.fingerprint


def test_a_test_file_with_other_columns_is_one_line_naming_the_setting(tmp_path):
    train = write_table(tmp_path / "train.csv", range(40))
    for columns, words in (("a,c,label", "it lacks 'b'"), ("b,a,label", "has them in another order"),
                           ("a,b,c,label", "it has 'c', which train.csv lacks")):
        other = write_table(tmp_path / "other.csv", range(5), columns=columns,
                            label=lambda i: f"{i},{'yes' if i % 2 else 'no'}" if columns.count(",") == 3 else "no")
        with pytest.raises(ConfigError) as refused:
            load_dataset(str(train), test_data=str(other))
        assert refused.value.field == "test_data" and words in str(refused.value), str(refused.value)
    with pytest.raises(ConfigError, match="test_data: .*missing.csv: file not found"):
        load_dataset(str(train), test_data=str(tmp_path / "missing.csv"))


def test_only_a_csv_dataset_takes_a_test_file_and_only_a_csv_file(tmp_path):
    with pytest.raises(ConfigError, match="only a CSV dataset reads a separate test file"):
        RunConfig(dataset="digits", noise_multiplier=1.0, test_data="held_out.csv")
    with pytest.raises(ConfigError, match="'held_out.npz' is not a .csv file"):
        RunConfig(dataset="train.csv", noise_multiplier=1.0, test_data="held_out.npz")


def test_the_test_file_replaces_test_fraction_in_the_settings_a_run_reads():
    with_file = settings_in_effect({"dataset": "train.csv", "test_data": "held_out.csv", "mechanism": "dpsgd"})
    assert "test_data" in with_file and "test_fraction" not in with_file
    without = settings_in_effect({"dataset": "train.csv", "mechanism": "dpsgd"})
    assert "test_data" in without and "test_fraction" in without
    assert "test_data" not in settings_in_effect({"dataset": "digits", "mechanism": "dpsgd"})


def test_a_config_file_finds_its_test_file_beside_it_and_a_run_reads_it(tmp_path):
    from engine.runs import load_run_data

    folder = tmp_path / "study"
    folder.mkdir()
    write_table(folder / "train.csv", range(60))
    write_table(folder / "held_out.csv", range(200, 220))
    (folder / "run.toml").write_text('dataset = "train.csv"\ntest_data = "held_out.csv"\nnoise_multiplier = 1.0\n'
                                     'delta = 1e-3\n', encoding="utf-8")
    config = RunConfig.load_toml(folder / "run.toml")
    assert config.test_data == str((folder / "held_out.csv").resolve())
    data = load_run_data(config)
    assert data.num_train == 60 and data.num_test == 20
