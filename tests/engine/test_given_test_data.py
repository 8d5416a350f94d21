"""Test examples given apart (`test_data`): a CSV file beside a CSV dataset, a folder of class
sub-folders beside an image folder. Every example of the dataset then trains and is protected, and
the given examples are the test split (and PATE's public pool)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.config import RunConfig
from engine.datasets import load_dataset
from engine.errors import ConfigError, DataError
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


def test_test_data_is_refused_where_the_data_has_its_own_test_split_or_is_of_another_kind(tmp_path):
    for dataset in ("digits", "mnist", "arrays.npz"):
        with pytest.raises(ConfigError, match="only a CSV dataset or an image folder reads test examples given apart"):
            RunConfig(dataset=dataset, noise_multiplier=1.0, test_data="held_out.csv")
    with pytest.raises(ConfigError, match="'held_out.npz' is not a .csv file"):
        RunConfig(dataset="train.csv", noise_multiplier=1.0, test_data="held_out.npz")
    with pytest.raises(ConfigError, match="is a CSV file, but the dataset '/data/pictures' is a folder"):
        RunConfig(dataset="/data/pictures", noise_multiplier=1.0, test_data="held_out.csv")
    arrays = tmp_path / "arrays"
    arrays.mkdir()
    np.save(arrays / "x.npy", np.zeros((10, 3), np.float32))
    np.save(arrays / "y.npy", np.arange(10) % 2)
    with pytest.raises(ConfigError, match="holds arrays: its test examples go beside them as x_test.npy"):
        load_dataset(str(arrays), test_data=str(tmp_path))


def test_the_test_file_replaces_test_fraction_in_the_settings_a_run_reads():
    with_file = settings_in_effect({"dataset": "train.csv", "test_data": "held_out.csv", "mechanism": "dpsgd"})
    assert "test_data" in with_file and "test_fraction" not in with_file
    without = settings_in_effect({"dataset": "train.csv", "mechanism": "dpsgd"})
    assert "test_data" in without and "test_fraction" in without
    folder = settings_in_effect({"dataset": "/data/pictures", "test_data": "/data/test", "mechanism": "dpsgd"})
    assert "test_data" in folder and "test_fraction" not in folder
    for dataset in ("digits", "mnist", "arrays.npz"):
        assert "test_data" not in settings_in_effect({"dataset": dataset, "mechanism": "dpsgd"})


def write_images(folder: Path, counts: dict[str, int], *, size: tuple[int, int] = (8, 8), mode: str = "L",
                 start: int = 0) -> None:
    """`counts[name]` images in sub-folder `name`; image i's first pixel is (start + i) % 256."""
    from PIL import Image

    i = start
    for name, count in counts.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        for _ in range(count):
            pixels = np.zeros((size[1], size[0]) + (() if mode == "L" else (3,)), np.uint8)
            pixels.flat[0] = i % 256
            Image.fromarray(pixels, mode).save(folder / name / f"{i:04d}.png")
            i += 1


def test_an_image_folder_with_a_test_folder_trains_on_every_image(tmp_path):
    write_images(tmp_path / "train", {"cat": 20, "dog": 25})
    write_images(tmp_path / "test", {"cat": 4, "dog": 3, "fox": 2}, start=100)  # fox: only in the test images
    data = load_dataset(str(tmp_path / "train"), test_data=str(tmp_path / "test"))
    assert data.num_train == 45 and data.num_test == 9
    assert data.class_names == ("cat", "dog", "fox") and data.num_classes == 3
    assert data.y_train.tolist() == [0] * 20 + [1] * 25 and data.y_test.tolist() == [0] * 4 + [1] * 3 + [2] * 2
    test_images = data.x_test[np.arange(data.num_test)]  # read on demand: rows, then pixels
    first_pixels = test_images[:, 0, 0, 0] * data.normalization["std"][0] + data.normalization["mean"][0]
    assert torch.allclose(first_pixels * 255, torch.arange(100, 109, dtype=torch.float32), atol=1e-3)
    assert data.split.startswith("test folder given: ") and "(9 images)" in data.split
    assert data.fingerprint == load_dataset(str(tmp_path / "train")).fingerprint  # the private images' alone


def test_a_test_folder_is_read_as_the_training_images_are_and_refused_in_one_line(tmp_path):
    write_images(tmp_path / "train", {"cat": 10, "dog": 10})
    write_images(tmp_path / "colour", {"cat": 2, "dog": 2}, mode="RGB")
    data = load_dataset(str(tmp_path / "train"), test_data=str(tmp_path / "colour"))
    assert data.num_test == 4 and data.x_test[np.arange(4)].shape == (4, 1, 8, 8)  # converted to grey, as in training
    write_images(tmp_path / "big", {"cat": 2, "dog": 2}, size=(16, 16))
    with pytest.raises(DataError, match="big/cat/0000.png: is 16x16 pixels but the dataset's images are 8x8"):
        load_dataset(str(tmp_path / "train"), test_data=str(tmp_path / "big"))
    (tmp_path / "empty").mkdir()
    for folder, words in (("empty", "holds no image files in class sub-folders"), ("missing", "folder not found")):
        with pytest.raises(ConfigError) as refused:
            load_dataset(str(tmp_path / "train"), test_data=str(tmp_path / folder))
        assert refused.value.field == "test_data" and words in str(refused.value), str(refused.value)
