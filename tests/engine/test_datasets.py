"""Dataset registry: real MNIST, IDX parsing and its failures, built-ins, CSV/NPZ files, data folder."""

from __future__ import annotations

import gzip
import hashlib
import struct
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import datasets as ds
from engine.datasets import (
    DATASETS,
    Dataset,
    DatasetInfo,
    find_missing_files,
    list_datasets,
    load_dataset,
    resolve_data_dir,
)
from engine.data_split import stratified_split
from engine.errors import ConfigError, DataError

MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
# Published class counts of the MNIST train and test sets (digits 0..9).
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


# ------------------------------------------------------------------------------------------
# helpers


def within_chance(count: int, total: int, fraction: float) -> bool:
    """A binomial(total, fraction) count (the per-example split's test size) within 5 standard deviations."""
    return abs(count - total * fraction) <= 5 * (total * fraction * (1 - fraction)) ** 0.5
# ------------------------------------------------------------------------------------------


def idx_bytes(arr: np.ndarray) -> bytes:
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    return struct.pack(">I", 0x0800 + arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.tobytes()


def write_idx_set(folder: Path, *, n_train: int = 20, n_test: int = 10, gz: bool = True, seed: int = 0) -> dict:
    """Write a small but valid set of the four MNIST-style IDX files; returns the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = {
        MNIST_FILES[0]: rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
        MNIST_FILES[1]: (np.arange(n_train) % 10).astype(np.uint8),
        MNIST_FILES[2]: rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
        MNIST_FILES[3]: (np.arange(n_test) % 10).astype(np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in arrays.items():
        data = idx_bytes(arr)
        if gz:
            (folder / name).write_bytes(gzip.compress(data))
        else:
            (folder / name[:-3]).write_bytes(data)
    return arrays


def write_csv(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------
# real MNIST
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mnist(mnist_dir: Path) -> Dataset:
    return load_dataset("mnist", data_dir=mnist_dir.parent)


def test_mnist_has_the_standard_splits_shapes_and_labels(mnist: Dataset, mnist_dir: Path):
    assert mnist.name == "mnist" and mnist.kind == "image"
    assert mnist.num_train == 60000 and mnist.num_test == 10000
    assert tuple(mnist.x_train.shape) == (60000, 1, 28, 28)
    assert tuple(mnist.x_test.shape) == (10000, 1, 28, 28)
    assert mnist.x_train.dtype == torch.float32 and mnist.y_train.dtype == torch.int64
    assert mnist.input_shape == (1, 28, 28) and mnist.num_classes == 10
    assert mnist.class_names == tuple(str(i) for i in range(10))
    assert torch.bincount(mnist.y_train, minlength=10).tolist() == MNIST_TRAIN_COUNTS
    assert torch.bincount(mnist.y_test, minlength=10).tolist() == MNIST_TEST_COUNTS
    assert str(mnist_dir) in mnist.source


def test_image_normalization_is_fixed_and_independent_of_the_private_data(mnist: Dataset):
    # Statistics of the training split would leave with the model without a guarantee.
    assert mnist.normalization["mean"] == [0.5] and mnist.normalization["std"] == [0.5]
    assert "independent of the data" in mnist.normalization["source"]
    # Pixels in [0, 1] map to [-1, 1]; MNIST's mean pixel 0.1307 maps to about -0.739.
    assert mnist.x_train.min().item() == -1.0 and mnist.x_train.max().item() == 1.0
    assert mnist.x_train.double().mean().item() == pytest.approx(2 * 0.1307 - 1, abs=1e-3)


def test_mnist_normalize_reproduces_the_training_tensors_from_raw_pixels(mnist: Dataset, mnist_dir: Path):
    raw = gzip.decompress((mnist_dir / "t10k-images-idx3-ubyte.gz").read_bytes())
    first = np.frombuffer(raw, dtype=np.uint8, count=28 * 28, offset=16).reshape(1, 28, 28) / 255.0
    expected = (first - mnist.normalization["mean"][0]) / mnist.normalization["std"][0]
    assert torch.allclose(mnist.normalize(first), torch.as_tensor(expected, dtype=torch.float32), atol=1e-5)
    assert torch.allclose(mnist.normalize(first), mnist.x_test[0], atol=1e-5)


def test_mnist_fingerprint_is_stable_across_loads(mnist: Dataset, mnist_dir: Path):
    again = load_dataset("mnist", data_dir=mnist_dir.parent)
    assert again.fingerprint == mnist.fingerprint
    assert len(mnist.fingerprint) == 64 and int(mnist.fingerprint, 16) >= 0
    assert torch.equal(again.y_train, mnist.y_train)


def test_data_dir_from_environment_finds_mnist(monkeypatch, mnist_dir: Path):
    monkeypatch.setenv("DPW_DATA_DIR", str(mnist_dir.parent))
    assert load_dataset("MNIST").num_train == 60000


# ------------------------------------------------------------------------------------------
# IDX parsing: layouts and failures (synthetic files)
# ------------------------------------------------------------------------------------------


def test_uncompressed_and_gzipped_idx_give_the_same_data_and_fingerprint(tmp_path: Path):
    arrays = write_idx_set(tmp_path / "a" / "mnist", gz=True)
    write_idx_set(tmp_path / "b" / "mnist", gz=False)
    a = load_dataset("mnist", data_dir=tmp_path / "a")
    b = load_dataset("mnist", data_dir=tmp_path / "b")
    assert a.fingerprint == b.fingerprint
    assert torch.equal(a.x_train, b.x_train)
    assert a.num_train == 20 and a.num_test == 10
    assert a.y_train.tolist() == arrays[MNIST_FILES[1]].tolist()
    raw = arrays[MNIST_FILES[0]] / 255.0
    assert torch.allclose(a.x_train[:, 0], torch.as_tensor((raw - 0.5) / 0.5, dtype=torch.float32), atol=1e-6)


def test_fingerprint_changes_when_a_pixel_changes(tmp_path: Path):
    write_idx_set(tmp_path / "a" / "mnist", seed=0)
    write_idx_set(tmp_path / "b" / "mnist", seed=1)
    assert load_dataset("mnist", data_dir=tmp_path / "a").fingerprint != load_dataset(
        "mnist", data_dir=tmp_path / "b"
    ).fingerprint


def test_fashion_mnist_reads_its_own_folder_with_clothing_class_names(tmp_path: Path):
    write_idx_set(tmp_path / "fashion-mnist")
    d = load_dataset("fashion-mnist", data_dir=tmp_path)
    assert d.name == "fashion-mnist" and d.class_names[0] == "T-shirt/top" and d.class_names[9] == "Ankle boot"
    with pytest.raises(DataError, match="mnist"):
        load_dataset("mnist", data_dir=tmp_path)


def test_a_data_dir_pointing_at_the_dataset_folder_itself_or_a_file_is_named(tmp_path: Path):
    """It said "not found in .../mnist/mnist (the folder does not exist)" and gave the generic advice."""
    write_idx_set(tmp_path / "mnist")
    with pytest.raises(DataError, match=f"data_dir {tmp_path / 'mnist'} is the mnist/ folder itself; give the folder "
                                        f"that holds it: {tmp_path}"):
        load_dataset("mnist", data_dir=tmp_path / "mnist")
    a_file = next((tmp_path / "mnist").iterdir())
    with pytest.raises(DataError, match=f"data_dir {a_file} is a file; give the folder that holds mnist/"):
        load_dataset("mnist", data_dir=a_file)


def test_training_and_test_files_swapped_as_pairs_are_refused(tmp_path: Path):
    """Each pair matches (images and labels), so only the sizes tell: a model trained on the 10,000 test
    images and evaluated on the 60,000 training ones would be reported as if all were well."""
    write_idx_set(tmp_path / "mnist", n_train=10, n_test=20)
    with pytest.raises(DataError, match="look swapped") as err:
        load_dataset("mnist", data_dir=tmp_path)
    assert "holds 10 examples" in err.value.message and "holds 20" in err.value.message
    assert "60,000" in err.value.hint


def test_torchvision_raw_folder_is_accepted(tmp_path: Path):
    write_idx_set(tmp_path / "MNIST" / "raw")
    assert load_dataset("mnist", data_dir=tmp_path).num_train == 20


def test_missing_mnist_files_error_lists_expected_files_and_folder(tmp_path: Path):
    with pytest.raises(DataError) as err:
        load_dataset("mnist", data_dir=tmp_path)
    message = str(err.value)
    assert str(tmp_path / "mnist") in message
    for name in MNIST_FILES:
        assert name in message
    assert "\n" not in message


def test_partly_missing_mnist_files_names_the_missing_one(tmp_path: Path):
    write_idx_set(tmp_path / "mnist")
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match=r"missing: t10k-labels-idx1-ubyte\.gz"):
        load_dataset("mnist", data_dir=tmp_path)
    assert find_missing_files("mnist", tmp_path) == ("t10k-labels-idx1-ubyte.gz",)


def test_truncated_gzip_file_error_names_the_file(tmp_path: Path):
    write_idx_set(tmp_path / "mnist")
    target = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    target.write_bytes(target.read_bytes()[:500])
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz") as err:
        load_dataset("mnist", data_dir=tmp_path)
    assert "corrupt or truncated" in str(err.value)


def test_garbage_file_error_names_the_file_and_the_bad_magic_number(tmp_path: Path):
    write_idx_set(tmp_path / "mnist")
    (tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz").write_bytes(b"<html>not found</html>" * 10)
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\.gz: magic number 0x3C68746D is not 0x00000803"):
        load_dataset("mnist", data_dir=tmp_path)


def test_truncated_uncompressed_idx_is_reported_with_sizes(tmp_path: Path):
    write_idx_set(tmp_path / "mnist", gz=False)
    target = tmp_path / "mnist" / "train-images-idx3-ubyte"
    target.write_bytes(target.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: truncated: header gives shape \(20, 28, 28\)"):
        load_dataset("mnist", data_dir=tmp_path)


def test_tiny_file_and_label_file_in_place_of_images_are_rejected(tmp_path: Path):
    write_idx_set(tmp_path / "mnist", gz=False)
    (tmp_path / "mnist" / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00")
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte: only 2 bytes"):
        load_dataset("mnist", data_dir=tmp_path)
    write_idx_set(tmp_path / "mnist", gz=False)
    labels = (tmp_path / "mnist" / "train-labels-idx1-ubyte").read_bytes()
    (tmp_path / "mnist" / "train-images-idx3-ubyte").write_bytes(labels)
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: magic number 0x00000801 is not 0x00000803"):
        load_dataset("mnist", data_dir=tmp_path)


def test_label_count_mismatch_and_bad_labels_and_wrong_image_size(tmp_path: Path):
    folder = tmp_path / "mnist"
    write_idx_set(folder)
    (folder / MNIST_FILES[1]).write_bytes(gzip.compress(idx_bytes(np.zeros(19, np.uint8))))
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte\.gz: 19 labels but train-images-idx3-\S+ has 20"):
        load_dataset("mnist", data_dir=tmp_path)
    write_idx_set(folder)
    (folder / MNIST_FILES[3]).write_bytes(gzip.compress(idx_bytes(np.full(10, 12, np.uint8))))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\.gz: label 12 is out of range 0\.\.9"):
        load_dataset("mnist", data_dir=tmp_path)
    write_idx_set(folder)
    (folder / MNIST_FILES[2]).write_bytes(gzip.compress(idx_bytes(np.zeros((10, 32, 32), np.uint8))))
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\.gz: images are 32x32"):
        load_dataset("mnist", data_dir=tmp_path)


def test_failed_download_is_a_data_error_with_manual_instructions(tmp_path: Path, monkeypatch):
    import torchvision.datasets.utils as tv_utils

    calls = []

    def no_network(url, *args, **kwargs):
        calls.append(url)
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(tv_utils, "download_url", no_network)
    with pytest.raises(DataError, match=r"mnist: download into .* failed \(URLError") as err:
        load_dataset("mnist", data_dir=tmp_path, allow_download=True)
    assert calls and "train-images-idx3-ubyte.gz" in str(err.value)


def test_download_is_not_attempted_without_allow_download(tmp_path: Path, monkeypatch):
    import torchvision.datasets.utils as tv_utils

    monkeypatch.setattr(tv_utils, "download_url", lambda *a, **k: pytest.fail("tried to download"))
    with pytest.raises(DataError, match="allow downloading"):
        load_dataset("mnist", data_dir=tmp_path)


# ------------------------------------------------------------------------------------------
# CIFAR-10 and SVHN error paths (no network)
# ------------------------------------------------------------------------------------------


def test_missing_cifar10_names_the_folder_archive_and_files(tmp_path: Path):
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", data_dir=tmp_path)
    message = str(err.value)
    assert str(tmp_path / "cifar10") in message
    assert "cifar-10-python.tar.gz" in message and "cifar-10-batches-py" in message
    assert "data_batch_1..5" in message and "test_batch" in message
    assert "http" not in message


def test_cifar10_download_failure_is_a_data_error(tmp_path: Path, monkeypatch):
    import torchvision.datasets

    class Offline:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("Error downloading cifar-10-python.tar.gz")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", Offline)
    with pytest.raises(DataError, match=r"cifar10: download into .*cifar10 failed \(RuntimeError"):
        load_dataset("cifar-10", data_dir=tmp_path, allow_download=True)


def test_corrupt_cifar10_files_fail_the_checksum_check(tmp_path: Path):
    base = tmp_path / "cifar10" / "cifar-10-batches-py"
    base.mkdir(parents=True)
    for name in (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"):
        (base / name).write_bytes(b"garbage")
    with pytest.raises(DataError, match=r"cifar-10-batches-py: the CIFAR-10 files failed torchvision's checksum check"):
        load_dataset("cifar10", data_dir=tmp_path)


def test_corrupt_cifar10_archive_is_named(tmp_path: Path):
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / "cifar-10-python.tar.gz").write_bytes(b"\x1f\x8b\x08 truncated")
    with pytest.raises(DataError, match=r"cifar-10-python\.tar\.gz: cannot unpack the archive"):
        load_dataset("cifar10", data_dir=tmp_path)


def test_missing_and_corrupt_svhn_files(tmp_path: Path):
    with pytest.raises(DataError) as err:
        load_dataset("svhn", data_dir=tmp_path)
    assert str(tmp_path / "svhn") in str(err.value)
    assert "train_32x32.mat" in str(err.value) and "test_32x32.mat" in str(err.value)
    (tmp_path / "svhn").mkdir()
    for name in ("train_32x32.mat", "test_32x32.mat"):
        (tmp_path / "svhn" / name).write_bytes(b"garbage")
    with pytest.raises(DataError, match=r"train_32x32\.mat: failed torchvision's checksum check"):
        load_dataset("svhn", data_dir=tmp_path)


# ------------------------------------------------------------------------------------------
# built-ins and the split
# ------------------------------------------------------------------------------------------


def test_digits_loads_as_8x8_images_scaled_to_unit_range():
    d = load_dataset("digits")
    assert d.kind == "image" and d.input_shape == (1, 8, 8) and d.num_classes == 10
    assert d.num_train + d.num_test == 1797 and within_chance(d.num_test, 1797, 0.2)
    raw = d.x_train * d.normalization["std"][0] + d.normalization["mean"][0]
    assert raw.min().item() == pytest.approx(0.0, abs=1e-6) and raw.max().item() == pytest.approx(1.0, abs=1e-6)
    assert d.source.startswith("scikit-learn bundled")


def test_breast_cancer_is_scaled_by_its_published_ranges_not_by_its_data():
    """By default the 30 features are clipped to the min/max table of the dataset's published
    description and mapped to [-1, 1]: the same transform whatever the training split."""
    d = load_dataset("breast_cancer")
    assert d.name == "breast-cancer" and d.kind == "table" and d.input_shape == (30,)
    assert d.num_train + d.num_test == 569 and d.class_names == ("malignant", "benign")
    assert len(d.normalization["mean"]) == len(d.normalization["std"]) == 30
    assert d.normalization["low"][0] == 6.981 and d.normalization["high"][0] == 28.11  # radius (mean)
    assert d.x_train.min() >= -1.0 and d.x_train.max() <= 1.0 and d.x_train.std() > 0.2
    other_split = load_dataset("breast_cancer", seed=5, test_fraction=0.5)
    assert other_split.normalization == d.normalization
    assert "independent of the data" in d.normalization["source"]


def test_breast_cancer_exact_normalization_standardizes_the_train_split():
    d = load_dataset("breast_cancer", normalization="exact")
    assert torch.allclose(d.x_train.mean(0), torch.zeros(30), atol=1e-5)
    assert torch.allclose(d.x_train.std(0, unbiased=False), torch.ones(30), atol=1e-4)
    assert load_dataset("breast_cancer", normalization="exact", seed=5).normalization != d.normalization
    assert "not covered by the guarantee" in d.normalization["source"]


def test_split_is_seeded_and_each_class_gives_its_share_within_chance():
    a, b, c = (load_dataset("breast-cancer", seed=s) for s in (7, 7, 8))
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert a.fingerprint == b.fingerprint == c.fingerprint
    assert not torch.equal(a.x_test, c.x_test)
    full = torch.cat([a.y_train, a.y_test])
    for cls in range(2):
        assert within_chance((a.y_test == cls).sum().item(), (full == cls).sum().item(), 0.2)


def test_test_fraction_sets_the_test_size_and_is_validated():
    assert within_chance(load_dataset("digits", test_fraction=0.5).num_test, 1797, 0.5)
    for bad in (0, 1, -0.1, 1.5, "0.2", True):
        with pytest.raises(ConfigError) as err:
            load_dataset("digits", test_fraction=bad)
        assert err.value.field == "test_fraction"
    with pytest.raises(ConfigError, match="seed"):
        load_dataset("digits", seed=-1)


def test_stratified_split_partitions_keeps_proportions_and_a_train_example_per_class():
    y = np.array([0] * 50 + [1] * 30 + [2] * 19 + [3])
    train, test = stratified_split(y, test_fraction=0.25, seed=3)
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(100))
    assert len(test) == 25
    assert [int((y[test] == k).sum()) for k in range(4)] in ([13, 7, 5, 0], [12, 8, 5, 0], [13, 8, 4, 0], [12, 7, 5, 0])
    assert (y[train] == 3).sum() == 1
    again, _ = stratified_split(y, test_fraction=0.25, seed=3)
    assert np.array_equal(train, again)


# ------------------------------------------------------------------------------------------
# CSV
# ------------------------------------------------------------------------------------------


def test_csv_with_integer_labels(tmp_path: Path):
    rows = "\n".join(f"{i},{i * 2.5},{7 if i % 2 else 3}" for i in range(20))
    path = write_csv(tmp_path / "data.csv", "a,b,label\n" + rows + "\n")
    d = load_dataset(str(path), seed=1, normalization="exact")
    assert d.name == "data.csv" and d.kind == "table" and d.input_shape == (2,)
    assert d.class_names == ("3", "7") and d.num_classes == 2
    assert d.num_train + d.num_test == 20 and d.num_test > 0
    assert d.fingerprint == hashlib.sha256(path.read_bytes()).hexdigest()
    assert torch.allclose(d.x_train.mean(0), torch.zeros(2), atol=1e-6)
    # Undo the normalization: feature a is the row number, whose parity decides the class.
    a = torch.round(d.x_train[:, 0] * d.normalization["std"][0] + d.normalization["mean"][0]).long()
    assert torch.equal(d.y_train, (a % 2 == 1).long())


def test_csv_with_string_labels_and_a_named_label_column(tmp_path: Path):
    species = ["dog", "cat", "bird"]
    text = "species,x1,x2\n" + "".join(f"{species[k % 3]},{k},{k * k}\n" for k in range(12))
    path = write_csv(tmp_path / "animals.csv", text)
    d = load_dataset(path, label_column="species", test_fraction=0.25)
    assert d.class_names == ("bird", "cat", "dog")
    x = torch.cat([d.x_train, d.x_test])[:, 0]
    x1 = torch.round(x * d.normalization["std"][0] + d.normalization["mean"][0]).long()
    names = [d.class_names[i] for i in torch.cat([d.y_train, d.y_test]).tolist()]
    assert names == [species[k % 3] for k in x1.tolist()]


@pytest.mark.parametrize("missing", ["nan", "NaN", "inf"])
def test_a_nan_among_numeric_csv_labels_is_refused_not_made_a_class(tmp_path: Path, missing: str):
    """A 'nan' label among 0s and 1s trained a third class named "nan"; an .npz with a NaN label is refused."""
    rows = "".join(f"{k},{k * 2},{k % 2}\n" for k in range(20)) + f"3,4,{missing}\n"
    path = write_csv(tmp_path / "data.csv", "a,b,label\n" + rows)
    with pytest.raises(DataError, match="column 'label': labels contain NaN or infinity; give every example a class"):
        load_dataset(str(path))
    names = write_csv(tmp_path / "names.csv", "a,label\n" + "".join(f"{k},{['cat', missing][k % 2]}\n" for k in range(20)))
    assert load_dataset(str(names)).class_names == tuple(sorted(["cat", missing]))  # among names, a name


def test_csv_missing_label_column_names_the_columns_found(tmp_path: Path):
    path = write_csv(tmp_path / "d.csv", "x,y,target\n1,2,0\n3,4,1\n")
    with pytest.raises(DataError, match=r"d\.csv: no label column 'label'; the columns are: 'x', 'y', 'target'"):
        load_dataset(str(path))


def test_csv_semicolon_separated_gets_a_hint(tmp_path: Path):
    path = write_csv(tmp_path / "d.csv", "x;label\n1;0\n2;1\n")
    with pytest.raises(DataError, match="save the file with commas"):
        load_dataset(str(path))


def test_csv_non_numeric_cell_names_line_column_and_value(tmp_path: Path):
    path = write_csv(tmp_path / "d.csv", "x,colour,label\n1,2,0\n3,red,1\n4,5,0\n")
    with pytest.raises(DataError, match=r"d\.csv, line 3, column 'colour': 'red' is not a number"):
        load_dataset(str(path))


def test_csv_empty_cell_and_nan_are_reported(tmp_path: Path):
    path = write_csv(tmp_path / "d.csv", "x,z,label\n1,2,0\n3,,1\n")
    with pytest.raises(DataError, match=r"line 3, column 'z': is empty \(a missing value\)"):
        load_dataset(str(path))
    path = write_csv(tmp_path / "e.csv", "x,z,label\n1,nan,0\n3,4,1\n")
    with pytest.raises(DataError, match=r"line 2, column 'z': 'nan' is not a finite number"):
        load_dataset(str(path))


def test_csv_value_beyond_32_bit_floats_is_refused_with_its_line_and_column(tmp_path: Path):
    """Training computes in 32-bit floats: 1e308 would become infinity there (and the run diverge with
    overflow warnings), so it is refused at load, where the line and column can be named."""
    path = write_csv(tmp_path / "d.csv", "x,z,label\n1,2,0\n3,-1e308,1\n")
    with pytest.raises(DataError, match=r"line 3, column 'z': '-1e308' is beyond the range training computes in"):
        load_dataset(str(path))
    path = write_csv(tmp_path / "e.csv", "x,z,label\n" + "".join(f"{i},3e38,0\n{i},-3e38,1\n" for i in range(5)))
    data = load_dataset(str(path))  # the 32-bit range itself is accepted
    assert data.num_train + data.num_test == 10


def test_csv_empty_file_header_only_ragged_row_and_one_class(tmp_path: Path):
    with pytest.raises(DataError, match="the file is empty"):
        load_dataset(str(write_csv(tmp_path / "a.csv", "")))
    with pytest.raises(DataError, match="has a header but no data rows"):
        load_dataset(str(write_csv(tmp_path / "b.csv", "x,label\n")))
    with pytest.raises(DataError, match=r"line 3: 3 values but the header has 2 columns"):
        load_dataset(str(write_csv(tmp_path / "c.csv", "x,label\n1,0\n2,1,9\n")))
    with pytest.raises(DataError, match=r"only the class 'yes'; classification needs at least 2 classes"):
        load_dataset(str(write_csv(tmp_path / "d.csv", "x,label\n1,yes\n2,yes\n3,yes\n")))
    with pytest.raises(DataError, match="fraction 0.5"):
        load_dataset(str(write_csv(tmp_path / "e.csv", "x,label\n1,0.5\n2,1\n3,2\n")))


def test_missing_file_unknown_name_and_unsupported_type(tmp_path: Path):
    with pytest.raises(DataError, match="file not found"):
        load_dataset(str(tmp_path / "nope.csv"))
    with pytest.raises(DataError, match=r"unknown dataset 'imagenet'; use one of: mnist, fashion-mnist"):
        load_dataset("imagenet")
    with pytest.raises(DataError, match="unsupported data file type '.txt'"):
        load_dataset(str(tmp_path / "x.txt"))


# ------------------------------------------------------------------------------------------
# NPZ
# ------------------------------------------------------------------------------------------


def test_npz_table_is_split_and_standardized(tmp_path: Path):
    rng = np.random.default_rng(0)
    path = tmp_path / "t.npz"
    np.savez(path, x=rng.normal(5, 3, size=(40, 4)), y=np.repeat(["no", "yes"], 20))
    d = load_dataset(str(path), normalization="exact")
    assert d.kind == "table" and d.input_shape == (4,) and d.class_names == ("no", "yes")
    assert d.num_train + d.num_test == 40 and d.num_test > 0
    assert torch.allclose(d.x_train.mean(0), torch.zeros(4), atol=1e-5)
    # Declared bounds name NPZ features by index; "*" covers the rest.
    b = load_dataset(str(path), feature_bounds="0=-4:14; *=0:10")
    assert b.normalization["mean"] == [5.0, 5.0, 5.0, 5.0] and b.normalization["std"] == [9.0, 5.0, 5.0, 5.0]
    assert b.x_train[:, 1:].min() >= -1.0 and b.x_train.max() <= 1.0


def test_npz_uint8_images_are_scaled_and_given_a_channel(tmp_path: Path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(30, 6, 5), dtype=np.uint8)
    x_test = rng.integers(0, 256, size=(7, 6, 5), dtype=np.uint8)
    path = tmp_path / "img.npz"
    np.savez(path, x=x, y=np.arange(30) % 3, x_test=x_test, y_test=np.arange(7) % 3)
    d = load_dataset(str(path))
    assert d.kind == "image" and d.input_shape == (1, 6, 5)
    assert d.num_train == 30 and d.num_test == 7 and "from the file" in d.split
    assert torch.allclose(d.x_train, torch.as_tensor((x[:, None] / 255.0 - 0.5) / 0.5, dtype=torch.float32), atol=1e-6)
    assert torch.allclose(d.x_test[3], d.normalize(x_test[3][None] / 255.0), atol=1e-5)


def test_npz_float_chw_images_in_unit_range(tmp_path: Path):
    x = np.random.default_rng(1).random((12, 3, 4, 4)).astype(np.float32)
    path = tmp_path / "c.npz"
    np.savez(path, x=x, y=np.arange(12) % 2)
    d = load_dataset(str(path), test_fraction=0.25)
    assert d.input_shape == (3, 4, 4) and len(d.normalization["mean"]) == 3
    np.savez(path, x=x * 255, y=np.arange(12) % 2)
    with pytest.raises(DataError, match=r"float pixels must be in \[0, 1\]"):
        load_dataset(str(path))


def test_npz_mismatched_lengths_missing_keys_and_half_test_arrays(tmp_path: Path):
    path = tmp_path / "bad.npz"
    np.savez(path, x=np.zeros((10, 3)), y=np.zeros(9))
    with pytest.raises(DataError, match="x has 10 examples but y has 9 labels"):
        load_dataset(str(path))
    np.savez(path, features=np.zeros((10, 3)), y=np.zeros(10))
    with pytest.raises(DataError, match=r"missing array\(s\) x; found: features, y"):
        load_dataset(str(path))
    np.savez(path, x=np.zeros((10, 3)), y=np.arange(10) % 2, x_test=np.zeros((2, 3)))
    with pytest.raises(DataError, match="has x_test but no y_test"):
        load_dataset(str(path))
    np.savez(path, x=np.zeros((10, 3)), y=np.arange(10) % 2, x_test=np.zeros((2, 4)), y_test=np.arange(2))
    with pytest.raises(DataError, match=r"x_test examples have shape \(4,\) but x examples have \(3,\)"):
        load_dataset(str(path))


def test_a_file_that_is_no_archive_is_not_called_pickled_data(tmp_path: Path):
    """numpy's message for a text file named .npz said it held pickled data and suggested allow_pickle."""
    path = tmp_path / "notes.npz"
    path.write_text("patient, outcome\n1, 0\n")
    with pytest.raises(DataError) as error:
        load_dataset(str(path))
    assert "it is not a zip archive of .npy arrays" in str(error.value) and "pickle" not in str(error.value)


def test_npz_table_values_that_are_not_finite_or_beyond_32_bit_floats_are_named(tmp_path: Path):
    path = tmp_path / "t.npz"
    x = np.zeros((10, 3))
    x[4, 2] = np.nan
    np.savez(path, x=x, y=np.arange(10) % 2)
    with pytest.raises(DataError, match=r"x\[4, 2\] is nan; replace missing values"):
        load_dataset(str(path))
    x[4, 2], x[7, 1] = 0.0, 1e300
    np.savez(path, x=x, y=np.arange(10) % 2)
    with pytest.raises(DataError, match=r"x\[7, 1\] is 1e\+300, beyond the range training computes in"):
        load_dataset(str(path))


def test_npz_channels_last_and_garbage_file(tmp_path: Path):
    path = tmp_path / "hwc.npz"
    np.savez(path, x=np.zeros((10, 32, 32, 3), np.uint8), y=np.arange(10) % 2)
    with pytest.raises(DataError, match=r"channels-last.*transpose\(0, 3, 1, 2\)"):
        load_dataset(str(path))
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file")
    with pytest.raises(DataError, match=r"junk\.npz: cannot read as an \.npz archive"):
        load_dataset(str(junk))


# ------------------------------------------------------------------------------------------
# registry and data folder
# ------------------------------------------------------------------------------------------


def test_registry_lists_every_dataset_with_its_files():
    names = [info.name for info in list_datasets()]
    assert names == ["mnist", "fashion-mnist", "cifar10", "svhn", "digits", "breast-cancer"]
    assert all(isinstance(info, DatasetInfo) for info in DATASETS.values())
    assert DATASETS["mnist"].needs_files and DATASETS["mnist"].files == MNIST_FILES
    assert not DATASETS["digits"].needs_files and DATASETS["digits"].files == ()
    assert DATASETS["cifar10"].archive == "cifar-10-python.tar.gz"
    assert find_missing_files("digits") == ()


def test_resolve_data_dir_precedence(tmp_path: Path, monkeypatch):
    import platformdirs

    monkeypatch.setenv("DPW_DATA_DIR", str(tmp_path / "from-env"))
    assert resolve_data_dir(tmp_path / "from-arg") == tmp_path / "from-arg"
    assert resolve_data_dir(str(tmp_path / "from-arg")) == tmp_path / "from-arg"
    assert resolve_data_dir() == tmp_path / "from-env"
    monkeypatch.delenv("DPW_DATA_DIR")
    assert resolve_data_dir() == Path(platformdirs.user_data_dir("dp-workbench")) / "data"
    monkeypatch.setenv("DPW_DATA_DIR", "")
    assert resolve_data_dir() == Path(platformdirs.user_data_dir("dp-workbench")) / "data"


def test_dataset_rejects_tensors_that_do_not_match_its_shape():
    x = torch.zeros(4, 3)
    with pytest.raises(DataError, match=r"x_test has shape \(4, 3\), expected \(N, 2\)"):
        Dataset(
            name="t", kind="table", x_train=torch.zeros(4, 2), y_train=torch.zeros(4, dtype=torch.long),
            x_test=x, y_test=torch.zeros(4, dtype=torch.long), input_shape=(2,), num_classes=2,
            normalization={"mean": [0, 0], "std": [1, 1]}, fingerprint="0" * 64, class_names=("a", "b"), source="t",
        )



# ------------------------------------------------------------------------------------------
# CIFAR-10 and SVHN happy paths on tiny files in the real formats (checksums bypassed)
# ------------------------------------------------------------------------------------------


def test_cifar10_files_are_read_through_torchvision_as_nchw(tmp_path: Path, monkeypatch):
    import pickle

    import torchvision.datasets

    base = tmp_path / "cifar10" / "cifar-10-batches-py"
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    batches = {}
    for name in (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"):
        data = rng.integers(0, 256, size=(4, 3072), dtype=np.uint8)  # rows are R plane, G plane, B plane
        labels = rng.integers(0, 10, size=4).tolist()
        batches[name] = (data, labels)
        (base / name).write_bytes(pickle.dumps({"data": data, "labels": labels}))
    (base / "batches.meta").write_bytes(pickle.dumps({"label_names": list(ds.CIFAR10_NAMES)}))
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *args, **kwargs: True)

    d = load_dataset("cifar10", data_dir=tmp_path)
    assert d.input_shape == (3, 32, 32) and d.num_train == 20 and d.num_test == 4
    assert d.class_names[0] == "airplane" and len(d.normalization["mean"]) == 3
    first = batches["data_batch_1"][0][0].reshape(3, 32, 32) / 255.0
    assert torch.allclose(d.x_train[0], d.normalize(first), atol=1e-5)
    assert d.y_test.tolist() == batches["test_batch"][1]


def test_svhn_mat_files_are_read_through_torchvision_with_ten_as_zero(tmp_path: Path, monkeypatch):
    import scipy.io
    import torchvision.datasets

    folder = tmp_path / "svhn"
    folder.mkdir()
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(32, 32, 3, 5), dtype=np.uint8)  # SVHN stores (H, W, C, N)
    for name in ("train_32x32.mat", "test_32x32.mat"):
        scipy.io.savemat(folder / name, {"X": x, "y": np.array([[10], [1], [2], [10], [9]], dtype=np.uint8)})
    monkeypatch.setattr(torchvision.datasets.SVHN, "_check_integrity", lambda self: True)

    d = load_dataset("svhn", data_dir=tmp_path)
    assert d.input_shape == (3, 32, 32) and d.num_train == 5 and d.y_train.tolist() == [0, 1, 2, 0, 9]
    assert torch.allclose(d.x_train[2], d.normalize(x[:, :, :, 2].transpose(2, 0, 1) / 255.0), atol=1e-5)


# ------------------------------------------------------------------------------------------
# CSV streaming (engine.csv_table): several chunks, progress, errors found deep in a file
# ------------------------------------------------------------------------------------------


def _big_csv(path: Path, rows: int, *, bad_line: int | None = None, bad_value: str = "oops") -> Path:
    """Rows 'i, i/7, label' (label = i % 3); line numbers count the header as line 1."""
    lines = ["x,y,label"]
    for i in range(rows):
        y = bad_value if bad_line is not None and i + 2 == bad_line else f"{i / 7:.6f}"
        lines.append(f"{i},{y},{i % 3}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_csv_of_several_chunks_loads_every_row_in_order_and_reports_progress(tmp_path: Path):
    from engine.csv_table import CHUNK_ROWS, PROGRESS_ROWS

    rows = PROGRESS_ROWS + 2 * CHUNK_ROWS + 17
    path = _big_csv(tmp_path / "big.csv", rows)
    calls: list[tuple[int, int]] = []
    d = load_dataset(str(path), normalization="bounds", feature_bounds=f"x=0:{rows}; y=0:{rows}",
                     progress=lambda done, total: calls.append((done, total)))
    assert d.num_train + d.num_test == rows
    assert d.fingerprint == hashlib.sha256(path.read_bytes()).hexdigest()
    # Undo the scaling: every row index comes back once, with its label and its y = x / 7.
    x = torch.cat([d.x_train, d.x_test]).double() * rows / 2 + rows / 2
    index = torch.round(x[:, 0]).long()
    assert sorted(index.tolist()) == list(range(rows))
    assert torch.allclose(x[:, 1], index.double() / 7, atol=0.02)  # float32 steps of ~0.006 at this scale
    assert torch.equal(torch.cat([d.y_train, d.y_test]), index % 3)
    assert calls and calls[-1] == (rows, rows)
    assert all(b[0] > a[0] for a, b in zip(calls, calls[1:]))


def test_csv_bad_value_deep_in_the_file_names_its_line(tmp_path: Path):
    from engine.csv_table import CHUNK_ROWS

    line = 3 * CHUNK_ROWS + 5
    path = _big_csv(tmp_path / "d.csv", 4 * CHUNK_ROWS, bad_line=line)
    with pytest.raises(DataError, match=rf"d\.csv, line {line}, column 'y': 'oops' is not a number"):
        load_dataset(str(path))
    path = _big_csv(tmp_path / "e.csv", 2 * CHUNK_ROWS, bad_line=CHUNK_ROWS + 9, bad_value="inf")
    with pytest.raises(DataError, match=rf"line {CHUNK_ROWS + 9}, column 'y': 'inf' is not a finite number"):
        load_dataset(str(path))


def test_csv_line_numbers_count_blank_lines_quoted_newlines_and_a_bom(tmp_path: Path):
    text = '\ufeffx,note,label\r\n1,2,0\r\n\r\n,,\r\n"3","4",1\r\n"5\n",6,1\r\n7,x,0\r\n'
    path = tmp_path / "d.csv"
    path.write_bytes(text.encode("utf-8"))
    with pytest.raises(DataError, match=r"line 8, column 'note': 'x' is not a number"):
        load_dataset(str(path))
    path.write_bytes(text.replace("7,x,0", "7,8,0").encode("utf-8"))
    d = load_dataset(str(path), normalization="exact", test_fraction=0.25)
    assert d.num_train + d.num_test == 4 and d.class_names == ("0", "1")


def test_csv_not_utf8_names_the_byte_offset(tmp_path: Path):
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"x,label\n" + b"1,0\n" * 50_000 + b"2,caf\xe9\n")
    with pytest.raises(DataError, match=r"not UTF-8 text \(bad byte at offset 200013\)"):
        load_dataset(str(path))


def test_csv_label_in_the_middle_and_text_labels(tmp_path: Path):
    path = tmp_path / "d.csv"
    path.write_text("a,kind,b\n" + "".join(f"{i},{'cat' if i % 2 else 'dog'},{2 * i}\n" for i in range(30)))
    d = load_dataset(str(path), label_column="kind", normalization="exact")
    assert d.class_names == ("cat", "dog") and d.input_shape == (2,)
    raw = torch.cat([d.x_train, d.x_test]) * torch.tensor(d.normalization["std"]) + torch.tensor(d.normalization["mean"])
    assert torch.allclose(raw[:, 1], 2 * raw[:, 0], atol=1e-4)
    names = [d.class_names[i] for i in torch.cat([d.y_train, d.y_test]).tolist()]
    assert names == ["cat" if round(v) % 2 else "dog" for v in raw[:, 0].tolist()]
