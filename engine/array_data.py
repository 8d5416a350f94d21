"""Training images larger than memory: rows read on demand from memory-mapped arrays.

`MappedRows` stands where a `Dataset` holds an in-memory input tensor (`x_train`, `x_test`): it has
the tensor's shape and, when indexed (a slice, or an index tensor as Poisson sampling draws it),
reads exactly those rows from its `RowSource`, scales them like in-memory images (uint8 / 255 or
float in [0, 1], then (x - 0.5) / 0.5) and returns a float32 tensor. So DP-SGD samples over the
indices 0..N-1 exactly as before (the privacy analysis is unchanged) and a step reads only its
sampled rows; nothing holds the whole array.

Sources:
- `NpyRows`: a `.npy` file opened with `np.load(mmap_mode="r")`, or an array stored *uncompressed*
  inside an `.npz` archive (numpy.savez, not savez_compressed), mapped at its offset in the archive;
  a compressed member cannot be mapped (extract it to .npy, or save with numpy.savez);
- `engine.image_folder.ImageFileRows`: image files decoded one by one.

Rows are copied out of a mapping `READ_GROUP_ROWS` at a time, and after each group the mapping's
resident pages are handed back to the kernel (madvise DONTNEED: they stay in the page cache, but
stop counting in the process's memory). Without that, each randomly placed row maps a whole
page-cache folio (up to 2 MB on current kernels): 256 random rows of 784 bytes were measured holding
~300 MB of the process's resident memory, and a few steps over 2 GB of data 1.5 GB.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import zipfile
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from engine.data_split import SplitRequest
from engine.errors import DataError

IMAGE_MEAN = 0.5  # as engine.datasets: fixed constants, independent of the data
IMAGE_STD = 0.5
READ_GROUP_ROWS = 32  # rows copied out of a mapping between two hand-backs of its pages
HASH_READ = 1 << 23  # bytes per read when hashing files
CHECK_READ_BYTES = 1 << 26  # what the load-time check of float pixels reads at a time

MAP_NPZ_ABOVE_BYTES = 1 << 30
"""An .npz archive whose uncompressed image array x is larger than this is memory-mapped, not loaded."""


class RowSource(Protocol):
    """Raw examples by row: `read(rows)` gives (len(rows), *shape) uint8 or float32 in [0, 1]."""

    shape: tuple[int, ...]  # (N, C, H, W)
    name: str

    def read(self, rows: np.ndarray) -> np.ndarray: ...

    def check_every_row(self) -> None:
        """DataError, before any step, for a row that `read` would refuse."""


class NpyRows:
    """Rows of a memory-mapped (N, H, W) or (N, C, H, W) image array (uint8 0..255, or float in [0, 1])."""

    def __init__(self, array: np.memmap, *, name: str):
        if array.ndim not in (3, 4):
            raise DataError(f"{name}: has shape {array.shape}; images must be (N, H, W) or (N, C, H, W)")
        if array.dtype.kind not in "uf" or (array.dtype.kind == "u" and array.dtype != np.uint8):
            raise DataError(f"{name}: has dtype {array.dtype}; memory-mapped images must be uint8 (0..255) or "
                            f"float32 in [0, 1]")
        if array.ndim == 4 and array.shape[1] > 4 and array.shape[3] in (1, 3, 4):
            raise DataError(f"{name}: has shape {array.shape}, which looks channels-last (N, H, W, C); images must "
                            f"be (N, C, H, W)")
        self.array = array
        self.name = name
        self.shape = tuple(int(d) for d in (array.shape if array.ndim == 4 else (array.shape[0], 1, *array.shape[1:])))
        self.scan = UnitRangeScan(array) if UnitRangeScan.applies(array) else None

    def read(self, rows: np.ndarray) -> np.ndarray:
        order = np.argsort(rows, kind="stable")  # ascending rows: the reads go forward through the file
        out = np.empty((len(rows), *self.shape[1:]), dtype=self.array.dtype)
        for start in range(0, len(rows), READ_GROUP_ROWS):
            part = order[start : start + READ_GROUP_ROWS]
            out[part] = self.array[rows[part]].reshape(len(part), *self.shape[1:])
            drop_pages(self.array)
        first_bad = _first_row_outside_unit_range(out)
        if first_bad is not None:
            raise self._outside_unit_range(int(rows[first_bad]))
        return out

    def check_every_row(self) -> None:
        """Refuse the array before training if any row holds a float pixel a step would refuse
        (outside [0, 1], NaN): said at load, no privacy is spent on a run that cannot finish. From the
        bytes the fingerprint read (`scan`, fed by hash_files) when it saw the whole array; otherwise
        one streaming pass, CHECK_READ_BYTES at a time. 8-bit pixels need none."""
        if self.array.dtype.kind != "f":
            return
        if self.scan is not None and self.scan.complete:
            if self.scan.first_bad_row is not None:
                raise self._outside_unit_range(self.scan.first_bad_row)
            return
        row_bytes = max(1, self.array.itemsize * int(np.prod(self.shape[1:])))
        step = max(1, CHECK_READ_BYTES // row_bytes)
        for start in range(0, self.shape[0], step):
            first_bad = _first_row_outside_unit_range(np.asarray(self.array[start : start + step]))
            drop_pages(self.array)
            if first_bad is not None:
                raise self._outside_unit_range(start + first_bad)

    def _outside_unit_range(self, row: int) -> DataError:
        return DataError(f"{self.name}: row {row} has pixels outside [0, 1] (or NaN); float pixels must be "
                         f"in [0, 1] (divide 8-bit pixels by 255)")


class UnitRangeScan:
    """The unit-range check of a memory-mapped float array, made on its file's bytes as they are
    read for the fingerprint (`feed` is hash_files' on_read): a float array is then read from disk
    once at load, not twice (it may be larger than memory). Reads must come in file order."""

    @staticmethod
    def applies(array: np.memmap) -> bool:
        """Float pixels, in row order, in a file: what the scan can check."""
        return (array.dtype.kind == "f" and getattr(array, "filename", None) is not None
                and array.flags.c_contiguous and array.size > 0)

    def __init__(self, array: np.memmap):
        self.path = os.path.abspath(array.filename)
        self.dtype = array.dtype
        self.row_items = max(1, int(np.prod(array.shape[1:])))
        self.start = int(array.offset)
        self.end = self.start + int(array.nbytes)
        self.seen = self.start  # the next byte of the array to check
        self.carry = b""  # bytes of an element split between two reads
        self.first_bad_row: int | None = None

    @property
    def complete(self) -> bool:
        """Whether every byte of the array was fed (or a bad row found)."""
        return self.first_bad_row is not None or (self.seen == self.end and not self.carry)

    def feed(self, path: Path, offset: int, chunk: bytes) -> None:
        if self.complete or not offset <= self.seen < offset + len(chunk):
            return
        if os.path.abspath(path) != self.path:
            return
        size = self.dtype.itemsize
        first_item = (self.seen - self.start - len(self.carry)) // size
        piece = memoryview(chunk)[self.seen - offset : self.end - offset]
        self.seen += len(piece)
        if self.carry:
            head = bytes(piece[: size - len(self.carry)])
            self.carry, piece = self.carry + head, piece[len(head):]
            if len(self.carry) < size:
                return
            self._check(np.frombuffer(self.carry, dtype=self.dtype), first_item)
            self.carry, first_item = b"", first_item + 1
        whole = len(piece) - len(piece) % size
        self._check(np.frombuffer(piece[:whole], dtype=self.dtype), first_item)
        self.carry = bytes(piece[whole:])

    def _check(self, values: np.ndarray, first_item: int) -> None:
        if self.first_bad_row is not None or values.size == 0:
            return
        ok = (values >= 0.0) & (values <= 1.0)  # NaN compares False: refused as well
        if not ok.all():
            self.first_bad_row = (first_item + int(np.argmin(ok))) // self.row_items


def _first_row_outside_unit_range(block: np.ndarray) -> int | None:
    """Index of the first row of `block` with a float pixel outside [0, 1] or NaN; None if none."""
    if block.dtype.kind != "f" or len(block) == 0:
        return None
    bad = (~np.isfinite(block) | (block < 0.0) | (block > 1.0)).reshape(len(block), -1).any(axis=1)
    return int(np.argmax(bad)) if bad.any() else None


def drop_pages(array: np.ndarray) -> None:
    """Hand a memory map's resident pages back to the kernel (they stay in the page cache)."""
    mapping = getattr(array, "_mmap", None)
    if mapping is None and isinstance(getattr(array, "base", None), mmap.mmap):
        mapping = array.base
    if mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
        try:
            mapping.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):
            pass


def open_npy(path: Path) -> np.memmap:
    """`path` memory-mapped (never read whole); a one-line DataError when it is not a plain .npy array."""
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"{path}: cannot be memory-mapped as a .npy array ({str(e).splitlines()[0]}); save it with "
                        f"numpy.save(path, array)") from None
    if not isinstance(array, np.memmap):
        raise DataError(f"{path}: is not a .npy array; save it with numpy.save(path, array)")
    return array


def open_npz_member(path: Path, key: str) -> np.memmap:
    """Array `key` of the .npz archive `path`, memory-mapped where it lies in the archive. Only an
    uncompressed member (numpy.savez) can be mapped; a compressed one is a DataError saying what to do."""
    try:
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo(f"{key}.npy")
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"{path}: cannot read as an .npz archive ({e}); save it with numpy.savez(path, x=..., y=...)")
    except KeyError:
        raise DataError(f"{path}: has no array {key!r}") from None
    if info.compress_type != zipfile.ZIP_STORED:
        raise DataError(f"{path}: array {key!r} is compressed and cannot be memory-mapped; save the archive with "
                        f"numpy.savez (not savez_compressed), or extract {key} to {key}.npy in a folder")
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
        if local[:4] != b"PK\x03\x04":
            raise DataError(f"{path}: array {key!r} has a damaged zip header; save the archive again")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        start = info.header_offset + 30 + name_len + extra_len
        f.seek(start)
        try:
            version = np.lib.format.read_magic(f)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise ValueError(f".npy format version {version} (save it with numpy.savez)")
            shape, fortran, dtype = read_header(f)
        except ValueError as e:
            raise DataError(f"{path}: array {key!r} is not a readable .npy member ({e})") from None
        offset = f.tell()
    if dtype.hasobject:
        raise DataError(f"{path}: array {key!r} holds Python objects; store plain numbers")
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")


def hash_files(paths: Sequence[Path], *, tag: str = "", root: Path | None = None,
               on_read: Callable[[Path, int, bytes], None] | None = None) -> str:
    """sha256 over each file's name (relative to `root`) and bytes, read in chunks (constant memory).
    `on_read(path, offset, chunk)` is given every read (HASH_READ bytes at most, in file order; an
    empty file's one empty read too), so a caller that checks a file's contents reads it only once."""
    h = hashlib.sha256(tag.encode())
    base = str(root).rstrip("/") + "/" if root is not None else ""
    for path in paths:
        if root is not None:
            h.update(f"|{_relative(path, root, base)}|".encode())
        with open(path, "rb") as f:
            chunk, offset = f.read(HASH_READ), 0
            while True:  # an empty file is one empty read: its callers see it too
                if on_read is not None:
                    on_read(path, offset, chunk)
                h.update(chunk)
                offset += len(chunk)
                chunk = f.read(HASH_READ)
                if not chunk:
                    break
    return h.hexdigest()


def _relative(path: Path, root: Path, base: str) -> str:
    """`path` relative to `root` in posix form: the text after `base` (root and a slash) when the path
    was built from it, as every listed file is (Path.relative_to costs ~20 us a file)."""
    text = str(path)
    if os.sep == "/" and text.startswith(base):
        return text[len(base):]
    return path.relative_to(root).as_posix()


class MappedRows:
    """An input split read on demand: rows `rows` (all when None) of `source`, scaled like in-memory
    images. Indexing returns float32 tensors on `device`; `to(device)` moves nothing but the result."""

    def __init__(self, source: RowSource, rows: np.ndarray | None = None, *, device: Any = "cpu"):
        self.source = source
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        self._device = device

    # ---- the tensor surface the trainers use ---------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        n = self.source.shape[0] if self.rows is None else len(self.rows)
        return (n, *self.source.shape[1:])

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self):
        import torch

        return torch.float32

    @property
    def device(self):
        import torch

        return torch.device(self._device)

    def to(self, device: Any = None, *args: Any, **kwargs: Any) -> "MappedRows":
        return MappedRows(self.source, self.rows, device=device if device is not None else self._device)

    def cpu(self) -> "MappedRows":
        return self.to("cpu")

    def min(self):
        """The smallest value a scaled pixel can take (not a pass over the data)."""
        import torch

        return torch.tensor((0.0 - IMAGE_MEAN) / IMAGE_STD)

    def max(self):
        """The largest value a scaled pixel can take (not a pass over the data)."""
        import torch

        return torch.tensor((1.0 - IMAGE_MEAN) / IMAGE_STD)

    def __getitem__(self, index: Any):
        """Rows as a float32 tensor: `index` is an int, a slice, or an integer array/tensor of any shape."""
        import torch

        if isinstance(index, (int, np.integer)):
            return self[np.array([int(index)])][0]
        wanted = self._positions(index)
        flat = wanted.reshape(-1)
        source_rows = flat if self.rows is None else self.rows[flat]
        raw = self.source.read(source_rows) if len(flat) else np.zeros((0, *self.source.shape[1:]), np.uint8)
        x = torch.from_numpy(raw.astype(np.float32))
        if raw.dtype == np.uint8:
            x.div_(255.0)
        x = x.sub_(IMAGE_MEAN).div_(IMAGE_STD).reshape(*wanted.shape, *self.source.shape[1:])
        return x.to(self._device)

    def subset(self, rows: Any) -> "MappedRows":
        """The rows `rows` of this split (a slice, or an integer array/tensor as indexing a tensor
        takes), in that order, still read on demand: nothing is read here."""
        wanted = self._positions(rows)
        return MappedRows(self.source, wanted if self.rows is None else self.rows[wanted], device=self._device)

    def _positions(self, index: Any) -> np.ndarray:
        """`index` (a slice, or an integer or boolean array/tensor) as row positions 0..len-1."""
        import torch

        if isinstance(index, slice):
            return np.arange(len(self), dtype=np.int64)[index]
        if isinstance(index, torch.Tensor):
            index = index.detach().cpu().numpy()
        wanted = np.asarray(index)
        if wanted.dtype == np.bool_:
            if wanted.shape != (len(self),):
                raise IndexError(f"a boolean row mask of shape {wanted.shape} for {len(self)} rows")
            return np.flatnonzero(wanted)
        wanted = wanted.astype(np.int64, copy=False)
        if wanted.size and (wanted.min() < -len(self) or wanted.max() >= len(self)):
            raise IndexError(f"row index out of range for {len(self)} rows")
        return np.where(wanted < 0, wanted + len(self), wanted)

    def __repr__(self) -> str:
        return f"MappedRows({self.source.name}, shape={self.shape})"


class MappedGrid:
    """Rows of a `MappedRows` laid out as an index matrix, e.g. a PATE teacher group's padded shards
    (teachers, max_len): indexing it as the gathered (teachers, max_len, ...) tensor is indexed
    (`grid[rows, cols]`, index tensors that broadcast) reads only the rows `index[rows, cols]`."""

    def __init__(self, rows: MappedRows, index: np.ndarray):
        self.rows = rows
        self.index = np.asarray(index, dtype=np.int64)

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.index.shape, *self.rows.shape[1:])

    def to(self, device: Any = None, *args: Any, **kwargs: Any) -> "MappedGrid":
        return MappedGrid(self.rows.to(device), self.index)

    def __getitem__(self, key: Any):
        import torch

        key = key if isinstance(key, tuple) else (key,)
        parts = tuple(k.detach().cpu().numpy() if isinstance(k, torch.Tensor) else k for k in key)
        return self.rows[self.index[parts]]

    def numpy(self) -> np.ndarray:
        """Every row of the grid, read now (for a consumer that needs an array, e.g. Ray's object store)."""
        return self.rows[self.index].numpy()


def gather_rows(x: Any, index: np.ndarray, *, max_bytes: int) -> Any:
    """`x[index]` for an index matrix: a tensor for inputs in memory, and for inputs read on demand
    whose gathered float32 rows would stay within `max_bytes`; beyond that a `MappedGrid` that reads
    each batch's rows when asked. Both hold the same values, so what is trained does not change."""
    import torch

    if isinstance(x, MappedRows) and np.size(index) * int(np.prod(x.shape[1:])) * 4 > max_bytes:
        return MappedGrid(x, index)
    return x[torch.as_tensor(index)]


def take_rows(x: Any, rows: Any) -> Any:
    """Rows `rows` (a slice, or an index tensor/array) of an input split, in that order: a `MappedRows`
    stays read on demand (a view over those rows, nothing read), an in-memory tensor is indexed as
    always (`x[rows]`). Every selection of training, test or pool rows (a rank's shard, a
    `train_subset`, PATE's public pool) goes through here, so data larger than memory stays mapped."""
    return x.subset(rows) if isinstance(x, MappedRows) else x[rows]


# ---- datasets ----------------------------------------------------------------------------------


def image_dataset(*, name: str, source: RowSource, y: np.ndarray, train_rows: np.ndarray | None,
                  test: "MappedRows", y_test: np.ndarray, class_names: Sequence[str], fingerprint: str, origin: str,
                  split: str, train_ids: np.ndarray | None = None):
    """A `Dataset` whose inputs are read on demand (labels are in memory: 8 bytes per example);
    `train_ids`: the training rows' identity digests where the split computed them (Dataset.train_ids)."""
    import torch

    from engine.datasets import IMAGE, Dataset

    source.check_every_row()
    if test.source is not source:
        test.source.check_every_row()
    channels = source.shape[1]
    return Dataset(
        name=name,
        kind=IMAGE,
        x_train=MappedRows(source, train_rows),
        y_train=torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64)),
        x_test=test,
        y_test=torch.from_numpy(np.ascontiguousarray(y_test, dtype=np.int64)),
        input_shape=tuple(source.shape[1:]),
        num_classes=len(class_names),
        normalization={"mean": [IMAGE_MEAN] * channels, "std": [IMAGE_STD] * channels,
                       "source": "fixed constants (independent of the data)"},
        fingerprint=fingerprint,
        class_names=tuple(class_names),
        source=origin,
        split=split,
        train_ids=train_ids,
    )


def encode_labels(y: np.ndarray, *, what: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """engine.datasets._encode_labels, with a path for whole-number labels 0..2**20 that allocates
    only the int64 result (the general path holds several copies: ~40 bytes per example, 0.8 GB for
    20 million labels)."""
    from engine.datasets import _encode_labels

    if y.dtype.kind in "iu" and y.size and int(y.min()) >= 0 and int(y.max()) < 1 << 20:
        counts = np.bincount(y)
        classes = np.flatnonzero(counts)
        lookup = np.full(len(counts), -1, dtype=np.int64)
        lookup[classes] = np.arange(len(classes))
        return lookup[y], tuple(str(int(c)) for c in classes)
    return _encode_labels(y, what=what)


def load_mapped_arrays(x: np.memmap, y: np.ndarray, x_test: np.memmap | None, y_test: np.ndarray | None, *,
                       name: str, where: str, hashed: Sequence[Path], hash_root: Path | None, origin: str,
                       split: SplitRequest):
    """Images `x` (and `x_test`) memory-mapped, labels `y` (`y_test`) read: a Dataset reading rows on
    demand. Without x_test, `split` draws the test rows (engine.data_split). The
    fingerprint is hash_files over `hashed` (names relative to `hash_root`); float pixels are
    range-checked from the bytes it reads."""
    from engine.datasets import _labels_1d, _need_two_classes

    path = Path(where)
    source = NpyRows(x, name=f"{where}: x")
    test_source = None if x_test is None else NpyRows(x_test, name=f"{where}: x_test")
    scans = [rows.scan for rows in (source, test_source) if rows is not None and rows.scan is not None]

    def feed(file: Path, offset: int, chunk: bytes) -> None:
        for scan in scans:
            scan.feed(file, offset, chunk)

    fingerprint = hash_files(hashed, root=hash_root, on_read=feed if scans else None)
    y = _labels_1d(np.asarray(y), path=path, key="y")
    if len(y) != source.shape[0]:
        raise DataError(f"{where}: x has {source.shape[0]} examples but y has {len(y)} labels; they must have the "
                        f"same length")
    if x_test is None:
        y_enc, class_names = encode_labels(y, what=f"{where}, y")
        _need_two_classes(class_names, what=f"{where}, y")
        train, test, ids = split.draw(MappedRows(source), y_enc, what=where)
        return image_dataset(name=name, source=source, y=y_enc[train], train_rows=train,
                             test=MappedRows(source, test), y_test=y_enc[test], class_names=class_names,
                             fingerprint=fingerprint, origin=origin, split=split.text,
                             train_ids=None if ids is None else ids[train])
    y_test = _labels_1d(np.asarray(y_test), path=path, key="y_test")
    if test_source.shape[1:] != source.shape[1:]:
        raise DataError(f"{where}: x_test examples have shape {test_source.shape[1:]} but x examples have "
                        f"{source.shape[1:]}; they must match")
    if len(y_test) != test_source.shape[0] or len(y_test) == 0:
        raise DataError(f"{where}: x_test has {test_source.shape[0]} examples and y_test {len(y_test)} labels; "
                        f"they must be the same number, at least 1")
    numeric = y.dtype.kind in "biuf" and y_test.dtype.kind in "biuf"
    both = np.concatenate([y, y_test]) if numeric else np.array([*map(str, y), *map(str, y_test)], dtype=object)
    y_all, class_names = encode_labels(both, what=f"{where}, y/y_test")
    _need_two_classes(class_names, what=f"{where}, y")
    return image_dataset(name=name, source=source, y=y_all[: len(y)], train_rows=None,
                         test=MappedRows(test_source), y_test=y_all[len(y):], class_names=class_names,
                         fingerprint=fingerprint, origin=origin,
                         split=f"train/test arrays from the files ({len(y)}/{len(y_test)})")


def load_array_folder(folder: Path, *, split: SplitRequest):
    """A folder holding x.npy and y.npy (optionally x_test.npy and y_test.npy): the images are
    memory-mapped, never read whole."""
    files = {key: folder / f"{key}.npy" for key in ("x", "y", "x_test", "y_test")}
    present = {key for key, p in files.items() if p.is_file()}
    if ("x_test" in present) != ("y_test" in present):
        have, lack = ("x_test", "y_test") if "x_test" in present else ("y_test", "x_test")
        raise DataError(f"{folder}: has {have}.npy but no {lack}.npy; give both or neither (then a split is drawn)")
    if "y" not in present:
        raise DataError(f"{folder}: has x.npy but no y.npy; save the labels beside it: numpy.save('y.npy', labels)")
    arrays = {key: open_npy(files[key]) for key in present}
    used = [files[k] for k in ("x", "y", "x_test", "y_test") if k in present]
    return load_mapped_arrays(arrays["x"], np.asarray(arrays["y"]), arrays.get("x_test"),
                              None if "y_test" not in arrays else np.asarray(arrays["y_test"]),
                              name=folder.name, where=str(folder), hashed=used, hash_root=folder,
                              origin=str(folder.absolute()), split=split)


def npz_can_be_mapped(path: Path, *, above_bytes: int) -> bool:
    """Whether `path`'s x is an uncompressed image array larger than `above_bytes` (then it is
    memory-mapped instead of loaded; a compressed one is loaded, as before)."""
    try:
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo("x.npy")
    except (zipfile.BadZipFile, OSError, KeyError):
        return False
    if info.compress_type != zipfile.ZIP_STORED or info.file_size <= above_bytes:
        return False
    try:
        return open_npz_member(path, "x").ndim in (3, 4)
    except DataError:
        return False


def load_mapped_npz(path: Path, *, split: SplitRequest):
    """An .npz archive whose x (and x_test) are stored uncompressed: images memory-mapped in place."""
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
    has_test = "x_test.npy" in names and "y_test.npy" in names
    with np.load(path, allow_pickle=False) as archive:  # the labels are small: read them
        y = archive["y"]
        y_test = archive["y_test"] if has_test else None
    x = open_npz_member(path, "x")
    x_test = open_npz_member(path, "x_test") if has_test else None
    return load_mapped_arrays(x, y, x_test, y_test, name=path.name, where=str(path),
                              hashed=[path], hash_root=None, origin=str(path.absolute()),
                              split=split)
