"""Dataset registry: every dataset a run can train on, loaded into one `Dataset` shape.

Three sources resolve through `load_dataset(name_or_path)`:

- registry names that need files in the data folder (`mnist`, `fashion-mnist`, `cifar10`, `svhn`),
  downloaded only with `allow_download=True`; otherwise a `DataError` says which files go where;
- built-ins that need no files (`digits`, `breast-cancer`, bundled with scikit-learn);
- the user's own `.csv` (one label column, every other column numeric) or `.npz` (`x`, `y`,
  optionally `x_test`, `y_test`);
- images larger than memory, read on demand (engine.array_data, engine.image_folder): a folder
  holding `x.npy` and `y.npy` (optionally `x_test.npy`, `y_test.npy`), memory-mapped; an `.npz`
  whose uncompressed image array `x` is larger than `array_data.MAP_NPZ_ABOVE_BYTES` (1 GiB),
  mapped in place (a compressed one is loaded into memory: save big archives with numpy.savez, not
  savez_compressed, or extract them to .npy); an image folder, one sub-folder per class.

Normalization contract (the export code relies on it)::

    x_normalized = (clip(x_raw, low, high) - mean) / std

with `mean`/`std` from `Dataset.normalization`, one entry per channel (images, broadcast over
height and width) or per feature (tables); `low`/`high` are present only for tables with declared
feature ranges (None: that feature is not clipped). For images `x_raw` is in [0, 1] (8-bit
pixels / 255) and mean = std = 0.5 for every channel: fixed constants, because statistics of the
private training split would leave with the model without any guarantee. Tables are scaled as
engine.feature_scaling says: by default by declared ranges (data-independent), or by a DP estimate,
or (`normalization="exact"`) by the train split's own statistics, which the privacy report says are
not covered by the guarantee; `normalization["source"]` says which. `Dataset.normalize(x_raw)`
applies exactly this.

Datasets without a test split of their own (built-ins, CSV and image folders without `test_data`,
NPZ without `x_test`, array folders without `x_test.npy`) are split per example (engine.data_split):
each example's side is a keyed hash of the example, so one example more or less changes the training
split by that example only, and the same seed gives the same split on any machine.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import math
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

import numpy as np

# torch is imported inside the functions that make tensors: listing the registry needs no torch.
from engine.csv_table import FLOAT32_MAX, read_csv_table
from engine.data_split import SPLIT_BY_EXAMPLE, SplitRequest
from engine.declared_classes import output_of_each_label, parse_classes
from engine.example_hash import identity_digests
from engine.errors import ConfigError, DataError
from engine.feature_scaling import FeatureBounds, parse_feature_bounds, table_scaling

IMAGE = "image"
TABLE = "table"
KINDS = (IMAGE, TABLE)

DATA_DIR_ENV = "DPW_DATA_DIR"
IMAGE_MEAN = 0.5  # images: x_normalized = (x_raw - 0.5) / 0.5, in [-1, 1] for pixels in [0, 1]
IMAGE_STD = 0.5
APP_NAME = "dp-workbench"


# --------------------------------------------------------------------------------------------
# Public types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Dataset:
    """A loaded dataset: normalized float32 inputs, int64 labels 0..num_classes-1, and provenance.

    `normalization` holds {"mean": [...], "std": [...]} (see the module docstring for the exact
    formula); `fingerprint` is a sha256 hex digest of the source data (decoded file contents or raw
    arrays), identical across loads of the same data. The split parameters are not part of it.
    """

    name: str
    kind: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    input_shape: tuple[int, ...]
    num_classes: int
    normalization: dict
    fingerprint: str
    class_names: tuple[str, ...]
    source: str
    split: str = ""  # how train/test came about, e.g. "per-example split: test_fraction=0.2, seed=0"
    train_ids: np.ndarray | None = field(default=None, repr=False)  # engine.example_hash.identity_digests
    # of the training examples as loaded (before scaling), in order; None: from x_train when asked

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(int(d) for d in self.input_shape))
        object.__setattr__(self, "class_names", tuple(str(c) for c in self.class_names))
        if self.kind not in KINDS:
            raise DataError(f"dataset {self.name!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        for split_name, x, y in (("train", self.x_train, self.y_train), ("test", self.x_test, self.y_test)):
            if tuple(x.shape[1:]) != self.input_shape:
                raise DataError(
                    f"dataset {self.name!r}: x_{split_name} has shape {tuple(x.shape)}, "
                    f"expected (N, {', '.join(map(str, self.input_shape))})"
                )
            if y.ndim != 1 or len(y) != len(x):
                raise DataError(
                    f"dataset {self.name!r}: y_{split_name} has shape {tuple(y.shape)}, "
                    f"expected ({len(x)},) to match x_{split_name}"
                )
        if self.train_ids is not None and len(self.train_ids) != len(self.x_train):
            raise ValueError(f"dataset {self.name!r}: {len(self.train_ids)} training identities for "
                             f"{len(self.x_train)} training examples")

    def train_identities(self) -> np.ndarray:
        """Each training example's identity digest (engine.example_hash.identity_digests), from the
        example as loaded, before any scaling: one example's identity depends on no other example,
        and the same data gives the same identities in memory and read on demand."""
        from engine.example_hash import identity_digests

        return self.train_ids if self.train_ids is not None else identity_digests(self.x_train)

    def take_train(self, rows: Any) -> "Dataset":
        """This dataset with only the training examples `rows` (engine.array_data.take_rows), their
        identities kept with them."""
        from engine.array_data import take_rows

        ids = None if self.train_ids is None else self.train_ids[rows if isinstance(rows, slice) else np.asarray(rows)]
        return dataclasses.replace(self, x_train=take_rows(self.x_train, rows), y_train=self.y_train[rows],
                                   train_ids=ids)

    @property
    def num_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.x_test.shape[0])

    def normalize(self, x_raw: torch.Tensor | np.ndarray) -> torch.Tensor:
        """(x_raw - mean) / std for raw inputs of shape (*input_shape) or (N, *input_shape).

        Images: x_raw in [0, 1]. This is the transform the training tensors went through.
        """
        import torch

        x = torch.as_tensor(np.asarray(x_raw) if not isinstance(x_raw, torch.Tensor) else x_raw)
        x = x.to(torch.float32)
        mean = torch.tensor(self.normalization["mean"], dtype=torch.float32)
        std = torch.tensor(self.normalization["std"], dtype=torch.float32)
        if self.kind == IMAGE:
            mean, std = mean.view(-1, 1, 1), std.view(-1, 1, 1)
        if "low" in self.normalization:
            low = torch.tensor([-math.inf if v is None else v for v in self.normalization["low"]])
            high = torch.tensor([math.inf if v is None else v for v in self.normalization["high"]])
            x = torch.maximum(torch.minimum(x, high), low)
        return (x - mean) / std

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, kind={self.kind!r}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes}, num_train={self.num_train}, num_test={self.num_test}, "
            f"fingerprint={self.fingerprint[:12]}…)"
        )


@dataclass(frozen=True)
class DatasetInfo:
    """A registry entry: what a dataset is and, for file-based ones, which files it needs where.

    `files` are file names inside `<data_dir>/<folder>/`; `archive` is the name of the archive they
    come in when downloaded by hand (no URL: the user finds it under that name).
    """

    name: str
    kind: str
    description: str
    needs_files: bool
    files: tuple[str, ...] = ()
    folder: str = ""
    input_shape: tuple[int, ...] | None = None
    num_classes: int | None = None
    can_download: bool = False
    archive: str = ""
    aliases: tuple[str, ...] = ()
    _loader: Callable[..., Dataset] | None = field(default=None, repr=False, compare=False)

    def folder_in(self, data_dir: str | Path | None = None) -> Path:
        """Where this dataset's files go: `<data_dir>/<folder>` (data_dir resolved like `resolve_data_dir`)."""
        return resolve_data_dir(data_dir) / self.folder


# --------------------------------------------------------------------------------------------
# Data folder
# --------------------------------------------------------------------------------------------


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """The data folder: `data_dir` if given, else $DPW_DATA_DIR, else the per-user data folder.

    The per-user folder is `platformdirs.user_data_dir("dp-workbench") / "data"`. Not created here.
    """
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser().absolute()
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    if env:
        return Path(env).expanduser().absolute()
    import platformdirs

    return Path(platformdirs.user_data_dir(APP_NAME)) / "data"


# --------------------------------------------------------------------------------------------
# Registry and entry points
# --------------------------------------------------------------------------------------------

MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_FILES = tuple(
    f"{CIFAR10_FOLDER}/{n}" for n in (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta")
)
SVHN_FILES = ("train_32x32.mat", "test_32x32.mat")

DIGIT_NAMES = tuple(str(i) for i in range(10))
FASHION_NAMES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
CIFAR10_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def list_datasets() -> list[DatasetInfo]:
    """Every registered dataset, in display order."""
    return list(DATASETS.values())


def dataset_info(name: str) -> DatasetInfo:
    """The registry entry for `name` (aliases and case ignored); DataError if there is none."""
    info = _lookup(name)
    if info is None:
        raise DataError(f"unknown dataset {name!r}; registered datasets are: {', '.join(DATASETS)}")
    return info


def is_registered(name: str) -> bool:
    """Whether `name` is a registered dataset (by name or alias), not a user's file or folder."""
    return _lookup(str(name)) is not None


def takes_test_data(dataset: str) -> bool:
    """Whether `dataset` may have its test examples given apart (config `test_data`): a CSV file or a
    folder; not a registered dataset (its test split is published or drawn) nor an .npz/.npy (an .npz
    holds its own x_test, a folder of arrays x_test.npy)."""
    dataset = str(dataset).strip()
    return not is_registered(dataset) and not dataset.lower().endswith((".npz", ".npy"))


def is_registered_image(name: str) -> bool:
    """Whether `name` is a registered image dataset (MNIST, CIFAR-10 ...): scaled by fixed constants,
    so the table settings (normalization, feature_bounds) do not apply to it."""
    info = _lookup(str(name))
    return info is not None and info.kind == IMAGE


def has_published_test_split(name: str) -> bool:
    """Whether `name` is a registered dataset that comes with its own test files (MNIST, CIFAR-10,
    SVHN ...), in their published order; any other test split is drawn here or given by the user."""
    info = _lookup(str(name))
    return info is not None and info.needs_files


def load_dataset(
    name_or_path: str | Path,
    *,
    data_dir: str | Path | None = None,
    label_column: str = "label",
    test_fraction: float = 0.2,
    seed: int = 0,
    allow_download: bool = False,
    normalization: str = "bounds",
    feature_bounds: str | None = None,
    statistics_noise_multiplier: float | None = None,
    rng: np.random.Generator | None = None,
    progress: Callable[[int, int], None] | None = None,
    checked_before: Collection[str] = (),
    split_rule: str = SPLIT_BY_EXAMPLE,
    classes: str | None = None,
    test_data: str | Path | None = None,
) -> Dataset:
    """Load a registered dataset by name, or a user's `.csv` / `.npz` file by path.

    `test_fraction` and `seed` apply only where the data has no test split of its own (built-ins,
    CSV or image folder without `test_data`, NPZ without x_test/y_test); `label_column` only to CSV;
    `test_data` (the test examples given apart: a CSV file with the same columns, or a folder of
    class sub-folders) only to CSV and image folders; `data_dir` and `allow_download`
    only to registered datasets that need files. `normalization`, `feature_bounds` (and for "dp"
    `statistics_noise_multiplier` and the run's secret generator `rng`) say how tables are scaled
    (engine.feature_scaling); images always use fixed constants. `progress(rows_done, rows_total)`
    is called while a large CSV file loads. `checked_before`: fingerprints of data that passed the
    load's check before (an image folder with one of them is not checked again: the same bytes).
    `split_rule`: engine.data_split's rule (a stored run is rebuilt with the rule it recorded).
    `classes`: the declared classes of a user's data (engine.declared_classes), in output order.
    """
    split = SplitRequest(test_fraction, seed, split_rule)
    scaling = _ScalingRequest(normalization, parse_feature_bounds(feature_bounds), statistics_noise_multiplier, rng)
    declared = parse_classes(classes)
    info = _lookup(str(name_or_path)) if isinstance(name_or_path, str) else None
    if info is not None:
        assert info._loader is not None
        if declared is not None:
            raise ConfigError("classes", f"{info.name} has its own published classes; classes declares those of "
                              "your own data", hint="leave classes unset for a registered dataset")
        return info._loader(
            info,
            data_dir=resolve_data_dir(data_dir) if info.needs_files else None,
            label_column=label_column,
            split=split,
            allow_download=allow_download,
            scaling=scaling,
        )

    data = _load_path(Path(name_or_path).expanduser(), label_column=label_column, split=split, scaling=scaling,
                      progress=progress, checked_before=checked_before,
                      test_data=None if test_data is None else Path(test_data).expanduser())
    return data if declared is None else with_declared_classes(data, declared)


def with_declared_classes(data: Dataset, declared: Sequence[str]) -> Dataset:
    """`data` with its labels coded as the declared classes (engine.declared_classes): one model
    output per declared class, whichever of them the data holds."""
    import torch

    code = torch.from_numpy(output_of_each_label(data.class_names, declared, what=data.source))
    return dataclasses.replace(data, y_train=code[data.y_train], y_test=code[data.y_test],
                               class_names=tuple(declared), num_classes=len(declared))


def _load_path(path: Path, *, label_column: str, split: SplitRequest, scaling: _ScalingRequest,
               progress: Callable[[int, int], None] | None, checked_before: Collection[str],
               test_data: Path | None = None) -> Dataset:
    """A user's data: a .csv (with its test file, if given) or .npz file, or a folder (arrays or images)."""
    name_or_path = str(path)
    suffix = path.suffix.lower()
    if path.is_dir() and suffix not in (".csv", ".npz"):
        return _load_folder(path, split=split, checked_before=checked_before, test_data=test_data)
    if suffix == ".npy":
        raise DataError(f"{path}: a .npy file holds one array; put the inputs in x.npy and the labels in y.npy "
                        f"(optionally x_test.npy, y_test.npy) in one folder and give the folder")
    if suffix in (".csv", ".npz"):
        if not path.exists():
            raise DataError(f"{path}: file not found (looked at {path.absolute()}); check the path")
        if not path.is_file():
            raise DataError(f"{path}: is a folder, not a {suffix} file; give the path of the file itself")
        if suffix == ".csv":
            return _load_csv(path, label_column=label_column, split=split,
                             scaling=scaling, progress=progress, test_data=test_data)
        return _load_npz(path, split=split, scaling=scaling)
    if suffix or os.sep in str(name_or_path) or "/" in str(name_or_path):
        raise DataError(
            f"{name_or_path}: unsupported data file type {suffix or '(no extension)'!r}; "
            f"use a .csv file (one label column, numeric features), a .npz file (arrays x and y), a folder "
            f"holding x.npy and y.npy, or an image folder (one sub-folder per class)"
        )
    raise DataError(
        f"unknown dataset {str(name_or_path)!r}; use one of: {', '.join(DATASETS)}, "
        f"or the path of a .csv or .npz file, a folder holding x.npy and y.npy, or an image folder"
    )


def find_missing_files(name: str, data_dir: str | Path | None = None) -> tuple[str, ...]:
    """The files a registered dataset still needs in its folder (empty when ready or built-in)."""
    info = dataset_info(name)
    if not info.needs_files:
        return ()
    folder = info.folder_in(data_dir)
    if info.name in ("mnist", "fashion-mnist"):
        found = _find_idx_files(folder, _torchvision_raw_dir(info, resolve_data_dir(data_dir)))
        return () if found is not None else tuple(n for n in info.files if _idx_candidate(folder, n) is None)
    return tuple(n for n in info.files if not (folder / n).is_file())


def _lookup(name: str) -> DatasetInfo | None:
    key = name.strip().lower().replace("_", "-")
    for info in DATASETS.values():
        if key == info.name or key in info.aliases:
            return info
    return None


# --------------------------------------------------------------------------------------------
# Shared building blocks
# --------------------------------------------------------------------------------------------


def _encode_labels(values: np.ndarray, *, what: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """Map labels (ints, integral floats or strings) to 0..K-1 in sorted order; names are the originals."""
    values = np.asarray(values)
    if values.dtype.kind == "U":
        return _encode_text_labels(values, what=what)
    if values.dtype.kind in "biuf":
        numeric = values.astype(np.float64)
    else:
        strings = np.array([str(v).strip() for v in values.tolist()], dtype=object)
        numeric = None
        try:
            numeric = np.array([float(s) for s in strings], dtype=np.float64)
        except ValueError:
            pass
        if numeric is None:  # names ("nan" among numbers is a missing label, refused below)
            classes = sorted(set(strings.tolist()))
            if "" in classes:
                raise DataError(f"{what}: some labels are empty; give every example a class")
            lookup = {c: i for i, c in enumerate(classes)}
            return np.array([lookup[s] for s in strings], dtype=np.int64), tuple(classes)
    if not np.all(np.isfinite(numeric)):
        raise DataError(f"{what}: labels contain NaN or infinity; give every example a class")
    if not np.all(numeric == np.round(numeric)):
        example = numeric[numeric != np.round(numeric)][0]
        raise DataError(
            f"{what}: labels must be classes (whole numbers or names), found the fraction {example:g}; "
            f"this looks like a regression target, which DP Workbench does not train"
        )
    ints = numeric.astype(np.int64)
    classes, y = np.unique(ints, return_inverse=True)
    return y.astype(np.int64), tuple(str(int(c)) for c in classes)


def _encode_text_labels(values: np.ndarray, *, what: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """_encode_labels for a numpy text array, vectorised (a million labels without a Python string each):
    numbers when every label parses as a number (a "nan" among them is a missing label: refused), else
    names in sorted order."""
    strings = np.char.strip(values)
    try:
        numeric = strings.astype(np.float64)
    except ValueError:
        numeric = None
    if numeric is not None:
        return _encode_labels(numeric, what=what)
    classes, y = np.unique(strings, return_inverse=True)
    if "" in classes:
        raise DataError(f"{what}: some labels are empty; give every example a class")
    return y.astype(np.int64).ravel(), tuple(str(c) for c in classes)


def _encode_both_labels(y: np.ndarray, y_test: np.ndarray, *, what: str
                        ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Training and test labels given apart, coded as one set of classes (_encode_labels over both: a
    class only the test labels hold gets its own code). Numbers stay numbers unless either side has text."""
    numeric = y.dtype.kind in "biuf" and y_test.dtype.kind in "biuf"
    both = np.concatenate([y, y_test]) if numeric else np.array([*map(str, y), *map(str, y_test)], dtype=object)
    codes, class_names = _encode_labels(both, what=what)
    return codes[:len(y)], codes[len(y):], class_names


def _need_two_classes(class_names: Sequence[str], *, what: str) -> None:
    if len(class_names) < 2:
        found = f"only the class {class_names[0]!r}" if class_names else "no classes"
        raise DataError(f"{what}: the labels hold {found}; classification needs at least 2 classes")


def _image_tensor(x: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 (/255) or float [0, 1] images (N, C, H, W) -> normalized float32 tensor."""
    import torch

    if x.dtype == np.uint8:
        t = torch.from_numpy(x.astype(np.float32)).div_(255.0)
    else:
        t = torch.from_numpy(np.array(x, dtype=np.float32, order="C", copy=True))
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return t.sub_(m).div_(s)


def _image_dataset(
    *,
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    class_names: Sequence[str],
    fingerprint: str,
    source: str,
    split: str,
    train_ids: np.ndarray | None = None,
) -> Dataset:
    # Fixed, data-independent constants: statistics of the private training split would be
    # released with the model without any privacy guarantee.
    import torch

    channels = x_train.shape[1]
    mean, std = [IMAGE_MEAN] * channels, [IMAGE_STD] * channels
    return Dataset(
        name=name,
        kind=IMAGE,
        x_train=_image_tensor(x_train, mean, std),
        y_train=torch.from_numpy(np.ascontiguousarray(y_train, dtype=np.int64)),
        train_ids=train_ids if train_ids is not None else identity_digests(x_train),
        x_test=_image_tensor(x_test, mean, std),
        y_test=torch.from_numpy(np.ascontiguousarray(y_test, dtype=np.int64)),
        input_shape=tuple(x_train.shape[1:]),
        num_classes=len(class_names),
        normalization={"mean": mean, "std": std, "source": "fixed constants (independent of the data)"},
        fingerprint=fingerprint,
        class_names=tuple(class_names),
        source=source,
        split=split,
    )


@dataclass(frozen=True)
class _ScalingRequest:
    """How a table is to be scaled (engine.feature_scaling), as asked by the run."""

    normalization: str = "bounds"
    bounds: FeatureBounds = FeatureBounds()
    noise_multiplier: float | None = None
    rng: np.random.Generator | None = None


def _table_dataset(
    *,
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    class_names: Sequence[str],
    fingerprint: str,
    source: str,
    split: str,
    scaling: _ScalingRequest,
    feature_names: Sequence[str] | None = None,
    train_rows: np.ndarray | None = None,
    test_rows: np.ndarray | None = None,
    train_ids: np.ndarray | None = None,
) -> Dataset:
    """A table dataset. With `train_rows`/`test_rows`, x_train and x_test are the same full array
    and the rows select each split (no copy of the float64 data is made)."""
    import torch

    x_train = np.asarray(x_train, dtype=np.float64)
    x_test = np.asarray(x_test, dtype=np.float64)
    names = tuple(feature_names) if feature_names is not None else tuple(str(i) for i in range(x_train.shape[1]))
    transform = table_scaling(x_train, train_rows, names=names, normalization=scaling.normalization,
                              bounds=scaling.bounds, noise_multiplier=scaling.noise_multiplier, rng=scaling.rng)
    return Dataset(
        name=name,
        kind=TABLE,
        x_train=torch.from_numpy(transform.apply(x_train, train_rows)),
        y_train=torch.from_numpy(np.ascontiguousarray(y_train, dtype=np.int64)),
        train_ids=train_ids if train_ids is not None else
        identity_digests(x_train if train_rows is None else x_train[train_rows]),
        x_test=torch.from_numpy(transform.apply(x_test, test_rows)),
        y_test=torch.from_numpy(np.ascontiguousarray(y_test, dtype=np.int64)),
        input_shape=(x_train.shape[1],),
        num_classes=len(class_names),
        normalization=transform.as_dict(),
        fingerprint=fingerprint,
        class_names=tuple(class_names),
        source=source,
        split=split,
    )


def _hash_arrays(tag: str, *arrays: np.ndarray) -> str:
    """sha256 over a tag and each array's dtype, shape and little-endian C-order bytes."""
    h = hashlib.sha256(tag.encode())
    for a in arrays:
        a = np.asarray(a)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False) if a.dtype.byteorder == ">" else a
        h.update(f"|{a.dtype.str}|{a.shape}|".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# MNIST and Fashion-MNIST (IDX files, parsed here)
# --------------------------------------------------------------------------------------------


def _read_maybe_gzip(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read the file ({e.strerror or e}); check its permissions") from e
    if data[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as e:
            raise DataError(
                f"{path}: the gzip data is corrupt or truncated ({e}); download or copy the file again"
            ) from e
    return data


def _read_idx(path: Path, *, ndim: int) -> tuple[np.ndarray, bytes]:
    """Parse an unsigned-byte IDX file (magic 0x0000080N); returns (array, decoded bytes)."""
    raw = _read_maybe_gzip(path)
    expected_magic = 0x0800 + ndim
    what = "images" if ndim == 3 else "labels"
    if len(raw) < 4:
        raise DataError(
            f"{path}: only {len(raw)} bytes, not an IDX {what} file (expected magic number "
            f"0x{expected_magic:08X}); download or copy the file again"
        )
    magic = struct.unpack(">I", raw[:4])[0]
    if magic != expected_magic:
        raise DataError(
            f"{path}: magic number 0x{magic:08X} is not 0x{expected_magic:08X} (IDX unsigned-byte {what}, "
            f"{ndim} dimension{'s' if ndim > 1 else ''}); the file is corrupt, compressed twice, "
            f"or a different file; download or copy it again"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header ({len(raw)} of {header} bytes); download or copy the file again")
    dims = struct.unpack(">" + "I" * ndim, raw[4:header])
    expected = header + math.prod(dims)
    if len(raw) != expected:
        state = "truncated" if len(raw) < expected else "longer than its header says"
        raise DataError(
            f"{path}: {state}: header gives shape {dims} = {expected} bytes, the file has {len(raw)}; "
            f"download or copy the file again"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims), raw


def _idx_candidate(folder: Path, gz_name: str) -> Path | None:
    for name in (gz_name, gz_name[:-3]):
        p = folder / name
        if p.is_file():
            return p
    return None


def _find_idx_files(*folders: Path) -> dict[str, Path] | None:
    """The first folder holding all four IDX files (.gz or uncompressed)."""
    for folder in folders:
        found = {n: _idx_candidate(folder, n) for n in MNIST_FILES}
        if all(found.values()):
            return found  # type: ignore[return-value]
    return None


def _torchvision_raw_dir(info: DatasetInfo, data_dir: Path) -> Path:
    # Where torchvision.datasets.MNIST / FashionMNIST put their downloads; accepted as a fallback.
    return data_dir / ("MNIST" if info.name == "mnist" else "FashionMNIST") / "raw"


def _download_idx(info: DatasetInfo, folder: Path) -> None:
    from torchvision.datasets import FashionMNIST, MNIST
    from torchvision.datasets.utils import download_url

    cls = MNIST if info.name == "mnist" else FashionMNIST
    folder.mkdir(parents=True, exist_ok=True)
    for filename, md5 in cls.resources:
        last: Exception | None = None
        for mirror in cls.mirrors:
            try:
                download_url(f"{mirror}{filename}", root=str(folder), filename=filename, md5=md5)
                last = None
                break
            except Exception as e:  # noqa: BLE001 - any failure means: try the next mirror
                last = e
        if last is not None:
            raise last


def _download(info: DatasetInfo, folder: Path, fetch: Callable[[DatasetInfo, Path], None]) -> None:
    try:
        fetch(info, folder)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - network, disk, checksum: all reported the same way
        raise DataError(
            f"{info.name}: download into {folder} failed ({type(e).__name__}: {e}); "
            f"{_manual_instructions(info, folder)}"
        ) from e


def _manual_instructions(info: DatasetInfo, folder: Path) -> str:
    if info.name in ("mnist", "fashion-mnist"):
        return f"put the four IDX files {', '.join(info.files)} (gzip'd or uncompressed) in {folder}"
    if info.name == "cifar10":
        return (
            f"put the archive {info.archive} in {folder} (it is unpacked on first use) or unpack it there "
            f"so that {folder / CIFAR10_FOLDER} holds data_batch_1..5, test_batch and batches.meta"
        )
    return f"put {', '.join(info.files)} (the SVHN 'cropped digits' format 2 files) in {folder}"


def _missing_files_error(info: DatasetInfo, folder: Path, missing: Sequence[str]) -> DataError:
    where = "the folder does not exist" if not folder.exists() else f"missing: {', '.join(missing)}"
    given = folder.parent  # data_dir
    if given.name == info.folder and any((given / name).exists() or (given / (name + ".gz")).exists()
                                         for name in info.files):
        return DataError(f"{info.name}: data_dir {given} is the {info.folder}/ folder itself; give the folder "
                         f"that holds it: {given.parent}")
    if given.is_file():
        return DataError(f"{info.name}: data_dir {given} is a file; give the folder that holds {info.folder}/")
    return DataError(
        f"{info.name}: dataset files not found in {folder} ({where}); {_manual_instructions(info, folder)} "
        f"(or give data_dir, --data-dir or ${DATA_DIR_ENV} the folder that holds {info.folder}/), "
        f"or allow downloading",
        hint=f"with network access, `dpw run --download` (allow_download = true in a config) fetches them once "
        f"into {folder}",
    )


def _load_idx_dataset(info: DatasetInfo, *, data_dir: Path, allow_download: bool, **_: object) -> Dataset:
    folder = data_dir / info.folder
    found = _find_idx_files(folder, _torchvision_raw_dir(info, data_dir))
    if found is None and allow_download:
        _download(info, folder, _download_idx)
        found = _find_idx_files(folder)
    if found is None:
        missing = [n for n in info.files if _idx_candidate(folder, n) is None]
        raise _missing_files_error(info, folder, missing)

    tr_x, tr_x_raw = _read_idx(found[MNIST_FILES[0]], ndim=3)
    tr_y, tr_y_raw = _read_idx(found[MNIST_FILES[1]], ndim=1)
    te_x, te_x_raw = _read_idx(found[MNIST_FILES[2]], ndim=3)
    te_y, te_y_raw = _read_idx(found[MNIST_FILES[3]], ndim=1)
    for x_name, x, y_name, y in (
        (MNIST_FILES[0], tr_x, MNIST_FILES[1], tr_y),
        (MNIST_FILES[2], te_x, MNIST_FILES[3], te_y),
    ):
        x_path, y_path = found[x_name], found[y_name]
        if x.shape[1:] != (28, 28):
            raise DataError(
                f"{x_path}: images are {x.shape[1]}x{x.shape[2]}, {info.name} images are 28x28; "
                f"this is not the {info.name} file, replace it"
            )
        if len(x) != len(y):
            raise DataError(
                f"{y_path}: {len(y)} labels but {x_path.name} has {len(x)} images; "
                f"the two files do not belong together, replace them with a matching pair"
            )
        if len(y) == 0:
            raise DataError(f"{y_path}: holds no examples; replace it with the full {info.name} file")
        if int(y.max()) > 9:
            raise DataError(
                f"{y_path}: label {int(y.max())} is out of range 0..9; the file is corrupt, replace it"
            )

    if len(tr_y) < len(te_y):  # MNIST-style sets have 60,000 training and 10,000 test examples
        raise DataError(
            f"{found[MNIST_FILES[0]]} holds {len(tr_y)} examples but the test file {found[MNIST_FILES[2]].name} "
            f"holds {len(te_y)}: the training and test files look swapped",
            hint=f"{info.files[0]} and {info.files[1]} are the training pair (60,000 examples), "
            f"{info.files[2]} and {info.files[3]} the test pair (10,000)",
        )

    h = hashlib.sha256(f"idx:{info.name}".encode())
    for raw in (tr_x_raw, tr_y_raw, te_x_raw, te_y_raw):
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return _image_dataset(
        name=info.name,
        x_train=tr_x[:, None],
        y_train=tr_y.astype(np.int64),
        x_test=te_x[:, None],
        y_test=te_y.astype(np.int64),
        class_names=DIGIT_NAMES if info.name == "mnist" else FASHION_NAMES,
        fingerprint=h.hexdigest(),
        source=", ".join(str(found[n]) for n in MNIST_FILES),
        split=f"standard train/test files ({len(tr_y)}/{len(te_y)})",
    )


# --------------------------------------------------------------------------------------------
# CIFAR-10 and SVHN (through torchvision.datasets)
# --------------------------------------------------------------------------------------------


def _download_cifar10(info: DatasetInfo, folder: Path) -> None:
    from torchvision.datasets import CIFAR10

    folder.mkdir(parents=True, exist_ok=True)
    CIFAR10(str(folder), train=True, download=True)


def _download_svhn(info: DatasetInfo, folder: Path) -> None:
    from torchvision.datasets import SVHN

    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        SVHN(str(folder), split=split, download=True)


def _load_cifar10(info: DatasetInfo, *, data_dir: Path, allow_download: bool, **_: object) -> Dataset:
    folder = data_dir / info.folder
    missing = [n for n in info.files if not (folder / n).is_file()]
    archive = folder / info.archive
    if missing and archive.is_file():
        from torchvision.datasets.utils import extract_archive

        try:
            extract_archive(str(archive), str(folder))
        except Exception as e:  # noqa: BLE001 - tarfile/gzip raise many types
            raise DataError(
                f"{archive}: cannot unpack the archive ({type(e).__name__}: {e}); it is corrupt or "
                f"incomplete, download it again"
            ) from e
        missing = [n for n in info.files if not (folder / n).is_file()]
    if missing and allow_download:
        _download(info, folder, _download_cifar10)
        missing = [n for n in info.files if not (folder / n).is_file()]
    if missing:
        raise _missing_files_error(info, folder, missing)

    from torchvision.datasets import CIFAR10

    try:
        train = CIFAR10(str(folder), train=True, download=False)
        test = CIFAR10(str(folder), train=False, download=False)
    except Exception as e:  # noqa: BLE001 - torchvision: RuntimeError on checksum, pickle errors
        raise DataError(
            f"{folder / CIFAR10_FOLDER}: the CIFAR-10 files failed torchvision's checksum check or could "
            f"not be read ({type(e).__name__}: {e}); replace them with a fresh copy of {info.archive}"
        ) from e
    x_tr = np.ascontiguousarray(np.asarray(train.data, dtype=np.uint8).transpose(0, 3, 1, 2))
    x_te = np.ascontiguousarray(np.asarray(test.data, dtype=np.uint8).transpose(0, 3, 1, 2))
    y_tr = np.asarray(train.targets, dtype=np.int64)
    y_te = np.asarray(test.targets, dtype=np.int64)
    return _image_dataset(
        name=info.name,
        x_train=x_tr,
        y_train=y_tr,
        x_test=x_te,
        y_test=y_te,
        class_names=tuple(getattr(train, "classes", CIFAR10_NAMES)),
        fingerprint=_hash_arrays("cifar10", x_tr, y_tr, x_te, y_te),
        source=str(folder / CIFAR10_FOLDER),
        split=f"standard train/test files ({len(y_tr)}/{len(y_te)})",
    )


def _load_svhn(info: DatasetInfo, *, data_dir: Path, allow_download: bool, **_: object) -> Dataset:
    folder = data_dir / info.folder
    missing = [n for n in info.files if not (folder / n).is_file()]
    if missing and allow_download:
        _download(info, folder, _download_svhn)
        missing = [n for n in info.files if not (folder / n).is_file()]
    if missing:
        raise _missing_files_error(info, folder, missing)

    from torchvision.datasets import SVHN

    parts = {}
    for split, filename in zip(("train", "test"), info.files):
        try:
            parts[split] = SVHN(str(folder), split=split, download=False)
        except Exception as e:  # noqa: BLE001 - torchvision: RuntimeError on checksum, scipy errors
            raise DataError(
                f"{folder / filename}: failed torchvision's checksum check or could not be read "
                f"({type(e).__name__}: {e}); replace it with a fresh copy of {filename}"
            ) from e
    # torchvision already maps SVHN's label 10 (digit zero) to 0 and stores images as (N, 3, 32, 32).
    x_tr = np.ascontiguousarray(parts["train"].data, dtype=np.uint8)
    x_te = np.ascontiguousarray(parts["test"].data, dtype=np.uint8)
    y_tr = np.asarray(parts["train"].labels, dtype=np.int64)
    y_te = np.asarray(parts["test"].labels, dtype=np.int64)
    return _image_dataset(
        name=info.name,
        x_train=x_tr,
        y_train=y_tr,
        x_test=x_te,
        y_test=y_te,
        class_names=DIGIT_NAMES,
        fingerprint=_hash_arrays("svhn", x_tr, y_tr, x_te, y_te),
        source=", ".join(str(folder / n) for n in info.files),
        split=f"standard train/test files ({len(y_tr)}/{len(y_te)})",
    )


# --------------------------------------------------------------------------------------------
# Built-ins (scikit-learn bundled, no files, no network)
# --------------------------------------------------------------------------------------------


def _load_digits(info: DatasetInfo, *, split: SplitRequest, **_: object) -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    raw = np.asarray(bunch.images, dtype=np.float64)  # (1797, 8, 8), values 0..16
    y = np.asarray(bunch.target, dtype=np.int64)
    x = (raw / 16.0)[:, None].astype(np.float32)
    train, test, _ = split.draw(raw, y, what=info.name)
    return _image_dataset(
        name=info.name,
        x_train=x[train],
        y_train=y[train],
        x_test=x[test],
        y_test=y[test],
        class_names=DIGIT_NAMES,
        fingerprint=_hash_arrays("sklearn:digits", raw, y),
        source="scikit-learn bundled (sklearn.datasets.load_digits)",
        split=split.text,
    )


def _load_breast_cancer(info: DatasetInfo, *, split: SplitRequest, scaling: _ScalingRequest,
                        **_: object) -> Dataset:
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    names = tuple(str(n) for n in bunch.feature_names)
    if not scaling.bounds.named and scaling.bounds.default is None:
        scaling = dataclasses.replace(scaling, bounds=_published_ranges(bunch.DESCR, names))
    train, test, ids = split.draw(x, y, what=info.name)
    return _table_dataset(
        name=info.name,
        x_train=x[train],
        y_train=y[train],
        x_test=x[test],
        y_test=y[test],
        class_names=tuple(str(n) for n in bunch.target_names),
        fingerprint=_hash_arrays("sklearn:breast_cancer", x, y),
        source="scikit-learn bundled (sklearn.datasets.load_breast_cancer)",
        split=split.text,
        scaling=scaling,
        feature_names=names,
        train_ids=None if ids is None else ids[train],
    )


def _published_ranges(description: str, names: tuple[str, ...]) -> FeatureBounds:
    """The min/max table of the dataset's published description (its "Summary Statistics", one row
    per feature in order): public documentation, used as the declared feature bounds by default."""
    rows = []
    for line in description.splitlines():
        parts = line.rsplit(None, 2)
        if len(parts) == 3 and parts[0].endswith(":"):
            try:
                rows.append((float(parts[1]), float(parts[2])))
            except ValueError:
                continue
    if len(rows) != len(names):
        return FeatureBounds()
    return FeatureBounds(tuple((n, lo, hi) for n, (lo, hi) in zip(names, rows)),
                         origin="published feature ranges (the dataset description's min/max table)")


# --------------------------------------------------------------------------------------------
# User files: CSV and NPZ
# --------------------------------------------------------------------------------------------


def _load_csv(path: Path, *, label_column: str, split: SplitRequest, scaling: _ScalingRequest,
              progress: Callable[[int, int], None] | None = None, test_data: Path | None = None) -> Dataset:
    table = read_csv_table(path, label_column=label_column, progress=progress)
    if test_data is not None:
        return _csv_with_test_file(path, table, test_data, label_column=label_column, scaling=scaling)
    y, class_names = _encode_labels(table.labels, what=f"{path}, column {label_column!r}")
    _need_two_classes(class_names, what=f"{path}, column {label_column!r}")
    train, test, ids = split.draw(table.features, y, what=str(path))
    return _table_dataset(
        name=path.name,
        x_train=table.features,
        y_train=y[train],
        x_test=table.features,
        y_test=y[test],
        class_names=class_names,
        fingerprint=table.sha256,
        source=str(path.absolute()),
        split=split.text,
        scaling=scaling,
        feature_names=table.feature_names,
        train_rows=train,
        test_rows=test,
        train_ids=None if ids is None else ids[train],
    )


def _csv_with_test_file(path: Path, table: Any, test_path: Path, *, label_column: str,
                        scaling: _ScalingRequest) -> Dataset:
    """A CSV dataset whose held-out examples are another CSV file with the same columns: every row of
    `path` trains. The classes are those of both files (the test file is public; a class only it holds
    gets its model output). The fingerprint stays the training file's: the private data."""
    if not test_path.is_file():
        where = ("is a folder, not a .csv file" if test_path.is_dir() else
                 f"file not found (looked at {test_path.absolute()})")
        raise ConfigError("test_data", f"{test_path}: {where}", hint="give the CSV file of held-out examples")
    test = read_csv_table(test_path, label_column=label_column)
    if test.feature_names != table.feature_names:
        lacks = [c for c in table.feature_names if c not in test.feature_names]
        extra = [c for c in test.feature_names if c not in table.feature_names]
        what = (f"lacks {', '.join(map(repr, lacks[:3]))}" if lacks else
                f"has {', '.join(map(repr, extra[:3]))}, which {path.name} lacks" if extra else
                "has them in another order")
        raise ConfigError("test_data", f"{test_path}: its feature columns differ from {path.name}'s (it {what})",
                          hint="give the held-out examples with the dataset's columns, in its order")
    y_train, y_test, class_names = _encode_both_labels(table.labels, test.labels,
                                                       what=f"{path} and {test_path}, column {label_column!r}")
    _need_two_classes(class_names, what=f"{path}, column {label_column!r}")
    return _table_dataset(
        name=path.name,
        x_train=table.features,
        y_train=y_train,
        x_test=test.features,
        y_test=y_test,
        class_names=class_names,
        fingerprint=table.sha256,
        source=str(path.absolute()),
        split=f"test file given: {test_path.absolute()} ({len(test.labels)} examples, sha256 {test.sha256[:16]})",
        scaling=scaling,
        feature_names=table.feature_names,
    )


_NPZ_LAYOUT = "arrays x (examples) and y (labels), optionally x_test and y_test"


def _load_folder(path: Path, *, split: SplitRequest, checked_before: Collection[str] = (),
                 test_data: Path | None = None) -> Dataset:
    """A folder of arrays (x.npy, y.npy: memory-mapped) or of images (one sub-folder per class; its
    test images may be another such folder, `test_data`)."""
    from engine.array_data import load_array_folder
    from engine.image_folder import is_image_folder, load_image_folder

    if (path / "x.npy").is_file():
        if test_data is not None:
            raise ConfigError("test_data", f"{path} holds arrays: its test examples go beside them as x_test.npy "
                              "and y_test.npy", hint="leave test_data unset")
        return load_array_folder(path, split=split)
    if is_image_folder(path):
        return load_image_folder(path, split=split, checked_before=checked_before, test_folder=test_data)
    raise DataError(f"{path}: is a folder with neither x.npy nor class sub-folders of images; give a folder "
                    f"holding x.npy and y.npy, or one sub-folder of images per class")


def _load_npz(path: Path, *, split: SplitRequest, scaling: _ScalingRequest) -> Dataset:
    from engine import array_data

    if array_data.npz_can_be_mapped(path, above_bytes=array_data.MAP_NPZ_ABOVE_BYTES):
        return array_data.load_mapped_npz(path, split=split)
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        # numpy takes a file that is neither .npy nor zip for a pickle (and suggests loading it unsafely)
        problem = str(e).splitlines()[0] if zipfile.is_zipfile(path) else "it is not a zip archive of .npy arrays"
        raise DataError(
            f"{path}: cannot read as an .npz archive ({problem}); save it with numpy.savez(path, x=..., y=...)"
        ) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(f"{path}: holds a single array, not an .npz archive with {_NPZ_LAYOUT}; use numpy.savez")
    with archive:
        keys = set(archive.files)
        missing = [k for k in ("x", "y") if k not in keys]
        if missing:
            raise DataError(
                f"{path}: missing array(s) {', '.join(missing)}; found: {', '.join(sorted(keys)) or 'none'}; "
                f"expected {_NPZ_LAYOUT}"
            )
        if ("x_test" in keys) != ("y_test" in keys):
            have, lack = ("x_test", "y_test") if "x_test" in keys else ("y_test", "x_test")
            raise DataError(f"{path}: has {have} but no {lack}; give both or neither (then a split is drawn)")
        arrays = {}
        for k in ("x", "y", "x_test", "y_test"):
            if k in keys:
                try:
                    arrays[k] = archive[k]
                except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
                    raise DataError(
                        f"{path}: array {k!r} cannot be read ({e}); store plain numeric or string arrays"
                    ) from e

    x, y = arrays["x"], _labels_1d(arrays["y"], path=path, key="y")
    _check_features(x, path=path, key="x")
    if len(x) != len(y):
        raise DataError(f"{path}: x has {len(x)} examples but y has {len(y)} labels; they must have the same length")
    if len(x) == 0:
        raise DataError(f"{path}: x holds no examples")
    has_test = "x_test" in arrays
    if has_test:
        x_test, y_test = arrays["x_test"], _labels_1d(arrays["y_test"], path=path, key="y_test")
        _check_features(x_test, path=path, key="x_test")
        if x_test.shape[1:] != x.shape[1:]:
            raise DataError(
                f"{path}: x_test examples have shape {x_test.shape[1:]} but x examples have {x.shape[1:]}; "
                f"they must match"
            )
        if len(x_test) != len(y_test):
            raise DataError(
                f"{path}: x_test has {len(x_test)} examples but y_test has {len(y_test)} labels; "
                f"they must have the same length"
            )
        if len(x_test) == 0:
            raise DataError(f"{path}: x_test holds no examples; drop x_test/y_test to draw a split instead")
        y_enc, y_test_enc, class_names = _encode_both_labels(y, y_test, what=f"{path}, arrays y/y_test")
    else:
        y_enc, class_names = _encode_labels(y, what=f"{path}, array y")
    _need_two_classes(class_names, what=f"{path}, array y")

    is_image = x.ndim in (3, 4)
    x = _as_image(x, path=path, key="x") if is_image else _as_table(x, path=path, key="x")
    fingerprint = _hash_file(path)
    if has_test:
        x_te = _as_image(x_test, path=path, key="x_test") if is_image else _as_table(x_test, path=path, key="x_test")
        x_tr, y_tr, y_te = x, y_enc, y_test_enc
        split_text = f"train/test arrays from the file ({len(y_tr)}/{len(y_te)})"
        train_ids = None
    else:
        train, test, ids = split.draw(x, y_enc, what=str(path))
        x_tr, y_tr, x_te, y_te = x[train], y_enc[train], x[test], y_enc[test]
        split_text = split.text
        train_ids = None if ids is None else ids[train]
    build = _image_dataset if is_image else functools.partial(_table_dataset, scaling=scaling)
    return build(
        name=path.name,
        x_train=x_tr,
        y_train=y_tr,
        x_test=x_te,
        y_test=y_te,
        class_names=class_names,
        fingerprint=fingerprint,
        source=str(path.absolute()),
        split=split_text,
        train_ids=train_ids,
    )


def _labels_1d(y: np.ndarray, *, path: Path, key: str) -> np.ndarray:
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(
            f"{path}: array {key!r} has shape {y.shape}; labels must be one class per example, shape (N,) "
            f"(for one-hot labels save y.argmax(axis=1))"
        )
    if y.dtype.kind not in "biufUS":
        raise DataError(f"{path}: array {key!r} has dtype {y.dtype}; labels must be integers or strings")
    return y


def _check_features(x: np.ndarray, *, path: Path, key: str) -> None:
    if x.dtype.kind not in "biuf":
        raise DataError(f"{path}: array {key!r} has dtype {x.dtype}; inputs must be numbers")
    if x.ndim not in (2, 3, 4):
        raise DataError(
            f"{path}: array {key!r} has shape {x.shape}; use (N, features) for a table, "
            f"(N, H, W) or (N, C, H, W) for images"
        )
    if x.ndim == 4 and x.shape[1] > 4 and x.shape[3] in (1, 3, 4):
        raise DataError(
            f"{path}: array {key!r} has shape {x.shape}, which looks channels-last (N, H, W, C); "
            f"images must be (N, C, H, W): save {key}.transpose(0, 3, 1, 2)"
        )


def _as_image(x: np.ndarray, *, path: Path, key: str) -> np.ndarray:
    """(N, H, W) or (N, C, H, W) -> (N, C, H, W), uint8 0..255 or float32 in [0, 1]."""
    if x.ndim == 3:
        x = x[:, None]
    if x.dtype.kind == "b":
        return x.astype(np.float32)
    if x.dtype.kind in "iu":
        lo, hi = int(x.min()), int(x.max())
        if lo < 0 or hi > 255:
            raise DataError(
                f"{path}: integer images in {key!r} range over {lo}..{hi}; integer pixels must be 0..255 "
                f"(or store floats in [0, 1])"
            )
        return x.astype(np.uint8)
    if not np.all(np.isfinite(x)):
        raise DataError(f"{path}: images in {key!r} contain NaN or infinity; replace them")
    lo, hi = float(x.min()), float(x.max())
    if lo < 0.0 or hi > 1.0:
        raise DataError(
            f"{path}: float images in {key!r} range over {lo:g}..{hi:g}; float pixels must be in [0, 1] "
            f"(divide 8-bit pixels by 255; do not normalize them yourself, the loader does)"
        )
    return x.astype(np.float32)


def _as_table(x: np.ndarray, *, path: Path, key: str) -> np.ndarray:
    x = x.astype(np.float64)
    if not np.all(np.isfinite(x)):
        row, col = np.argwhere(~np.isfinite(x))[0]
        raise DataError(
            f"{path}: {key}[{row}, {col}] is {x[row, col]}; replace missing values (NaN) and infinities"
        )
    beyond = np.abs(x) > FLOAT32_MAX
    if beyond.any():
        row, col = np.argwhere(beyond)[0]
        raise DataError(
            f"{path}: {key}[{row}, {col}] is {x[row, col]:g}, beyond the range training computes in (32-bit "
            f"floats, ±{FLOAT32_MAX:.3g}); rescale that feature (e.g. to other units or its logarithm)"
        )
    return x


# --------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------

DATASETS: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo(
            name="mnist",
            kind=IMAGE,
            description="MNIST handwritten digits: 60,000 train / 10,000 test grayscale 28x28 images, 10 classes",
            needs_files=True,
            files=MNIST_FILES,
            folder="mnist",
            input_shape=(1, 28, 28),
            num_classes=10,
            can_download=True,
            _loader=_load_idx_dataset,
        ),
        DatasetInfo(
            name="fashion-mnist",
            kind=IMAGE,
            description="Fashion-MNIST clothing: 60,000 train / 10,000 test grayscale 28x28 images, 10 classes",
            needs_files=True,
            files=MNIST_FILES,
            folder="fashion-mnist",
            input_shape=(1, 28, 28),
            num_classes=10,
            can_download=True,
            aliases=("fashionmnist", "fmnist"),
            _loader=_load_idx_dataset,
        ),
        DatasetInfo(
            name="cifar10",
            kind=IMAGE,
            description="CIFAR-10: 50,000 train / 10,000 test colour 32x32 images, 10 classes",
            needs_files=True,
            files=CIFAR10_FILES,
            folder="cifar10",
            input_shape=(3, 32, 32),
            num_classes=10,
            can_download=True,
            archive="cifar-10-python.tar.gz",
            aliases=("cifar-10",),
            _loader=_load_cifar10,
        ),
        DatasetInfo(
            name="svhn",
            kind=IMAGE,
            description="SVHN house numbers: 73,257 train / 26,032 test colour 32x32 digit crops, 10 classes",
            needs_files=True,
            files=SVHN_FILES,
            folder="svhn",
            input_shape=(3, 32, 32),
            num_classes=10,
            can_download=True,
            _loader=_load_svhn,
        ),
        DatasetInfo(
            name="digits",
            kind=IMAGE,
            description="scikit-learn digits: 1,797 grayscale 8x8 images, 10 classes; built in, no download",
            needs_files=False,
            input_shape=(1, 8, 8),
            num_classes=10,
            _loader=_load_digits,
        ),
        DatasetInfo(
            name="breast-cancer",
            kind=TABLE,
            description="Wisconsin breast cancer: 569 rows, 30 numeric features, 2 classes; built in, no download",
            needs_files=False,
            input_shape=(30,),
            num_classes=2,
            _loader=_load_breast_cancer,
        ),
    )
}
