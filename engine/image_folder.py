"""Image folders (one sub-folder per class) as a dataset read on demand.

    folder/
      cat/  001.png  002.jpg ...
      dog/  ...

Class names are the sub-folder names in sorted order (with a test folder given apart, those of both
folders); every image file (png, jpg, jpeg, bmp, gif, tif, tiff, webp) is one example. Hidden files
and folders (a leading '.', e.g. the '._name.png' files macOS leaves on other disks) are left out; a
link to a file that does not exist is refused. Only the file list and the labels are held in memory:
a training step decodes exactly the images its Poisson sample drew (`ImageFileRows`), so the folder
may be far larger than memory. All images must have one size, at most MAX_PIXELS (every file's
header is checked at load, and that it is whole: see ENDINGS); the colour mode is the first image's
(grayscale "L" or "RGB"), and every image is converted to it (a test folder given apart is read in
the training images' size, mode and dtype). 16-bit grayscale images are scaled by value / 65535 (a
folder of them reads as float32 in [0, 1]); 32-bit integer and float images, which have no fixed
range, are refused.
The train/test split is per file (engine.data_split): each file's side is a keyed hash of its path
relative to the folder ("class/name").
"""

from __future__ import annotations

import errno
import io
import os
import threading
from collections.abc import Collection
from pathlib import Path

import numpy as np

from engine.array_data import HASH_READ, MappedRows, hash_files, image_dataset
from engine.data_split import SplitRequest
from engine.errors import ConfigError, DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
SIGNATURES = ((0, b"\x89PNG", "PNG"), (0, b"\xff\xd8", "JPEG"), (0, b"GIF8", "GIF"), (0, b"BM", "BMP"),
              (0, b"II*\x00", "TIFF"), (0, b"MM\x00*", "TIFF"), (8, b"WEBP", "WebP"))
"""(offset, bytes, format) that start a file of each format read here: a file that starts so but
does not open is a damaged one, not another kind of file."""
MAX_PIXELS = 1024 * 1024 * 1024 // 4 // 3
"""An image's largest width x height (89 million pixels): Pillow's own limit against decompression
bombs, checked here from the header so that the refusal can name the size."""
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
ENDINGS = {"PNG": b"IEND\xaeB`\x82", "JPEG": b"\xff\xd9", "GIF": b";"}
"""How a whole file of each format ends. At load, a file that ends so is taken as whole; any other
(a format without a fixed end, or a file cut short, e.g. by an interrupted copy) is decoded to find
out. A file cut short would otherwise be refused only when a step drew it: the run would stop there,
at a point set by that one example, with privacy spent on an unfinished model."""

_PILLOW_LIMIT_LOCK = threading.Lock()  # held while Image.MAX_IMAGE_PIXELS (a module global) is lifted


def is_image_folder(folder: Path) -> bool:
    """A folder with at least one sub-folder that holds an image file."""
    return any(any(_image_names(c)) for c in _subfolders(folder))


def _test_classes(folder: Path) -> list[tuple[str, list[Path]]]:
    """The test folder's classes and files (_class_files), or a ConfigError naming test_data."""
    if not folder.is_dir():
        where = "is a file, not a folder" if folder.exists() else f"folder not found (looked at {folder.absolute()})"
        raise ConfigError("test_data", f"{folder}: {where}",
                          hint="give the folder of test images, one sub-folder per class as in the dataset")
    found = _class_files(folder)
    if not found:
        raise ConfigError("test_data", f"{folder}: holds no image files in class sub-folders",
                          hint="give the folder of test images, one sub-folder per class as in the dataset")
    return found


def _files_and_labels(found: list[tuple[str, list[Path]]], classes: list[str]) -> tuple[list[Path], np.ndarray]:
    """The files of `found` (_class_files) in order, and each one's class as an index into `classes`."""
    index = {name: i for i, name in enumerate(classes)}
    files = [path for _, paths in found for path in paths]
    y = np.repeat(np.array([index[name] for name, _ in found], dtype=np.int64), [len(paths) for _, paths in found])
    return files, y


def _class_files(folder: Path) -> list[tuple[str, list[Path]]]:
    """(class name, its image files) for each sub-folder holding an image, both in sorted order. Names
    are sorted as strings, which is the order of their paths (one listing per folder, no Path compares)."""
    classes = []
    for child in sorted(_subfolders(folder), key=lambda c: c.name):
        names = sorted(_image_names(child))
        if names:
            classes.append((child.name, [child / name for name in names]))
    return classes


def _subfolders(folder: Path):
    """`folder`'s visible sub-folders. A link without a file suffix that leads nowhere is refused (a class
    folder linked from elsewhere and since moved: left out, its class would silently be missing)."""
    folders = []
    with os.scandir(folder) as entries:
        for e in entries:
            if e.name.startswith("."):
                continue
            if _leads_nowhere(e):  # asked first: is_dir() raises on a loop of links
                if not os.path.splitext(e.name)[1]:
                    raise _broken_link(e)
            elif e.is_dir():
                folders.append(Path(e.path))
    return folders


def _image_names(folder: Path):
    """The names of `folder`'s image files, hidden ones left out. A link to a file that does not exist
    is refused: left out, the run would train on fewer files than the folder shows."""
    names = []
    with os.scandir(folder) as entries:
        for e in entries:
            if e.name.startswith(".") or os.path.splitext(e.name)[1].lower() not in IMAGE_SUFFIXES:
                continue
            if _leads_nowhere(e):  # asked first: is_file() raises on a loop of links
                raise _broken_link(e)
            if e.is_file():
                names.append(e.name)
    return names


def _leads_nowhere(entry: os.DirEntry) -> bool:
    """A link whose target does not exist (moved or deleted)."""
    return entry.is_symlink() and not os.path.exists(entry.path)


def _broken_link(entry: os.DirEntry) -> DataError:
    try:
        os.stat(entry.path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return DataError(f"{entry.path}: is a link in a loop of links that never reaches a file; remove it")
    return DataError(f"{entry.path}: is a link to {os.readlink(entry.path)}, which does not exist; remove it")


class ImageFileRows:
    """Examples as image files: `read(rows)` decodes those files into (n, C, H, W) `dtype`: uint8, or
    float32 in [0, 1] when the first image is 16-bit (uint8 would lose its depth)."""

    def __init__(self, files: list[Path], *, name: str, like: "ImageFileRows | None" = None):
        """`like`: read the files as that folder's images are read (its size, colour mode and dtype), as
        a test folder given apart is read like the training images."""
        self.files = files
        self.name = name
        if like is not None:
            self.mode, self.dtype, self.size = like.mode, like.dtype, like.size
        else:
            with self._first_readable() as first:
                deep = first.mode in SIXTEEN_BIT_MODES
                self.mode = "L" if deep or first.mode in ("1", "L") else "RGB"
                self.dtype = np.float32 if deep else np.uint8
                self.size = first.size  # (width, height)
        channels = 1 if self.mode == "L" else 3
        self.shape = (len(files), channels, self.size[1], self.size[0])
        self._checked = False

    def _first_readable(self):
        """The first file whose header `_open` accepts: it sets the folder's size, colour mode and
        dtype. A file before it that is refused is named by `check_every_row`, with the others."""
        problems = []
        for path in self.files:
            try:
                return self._open(path)
            except DataError as problem:
                problems.append(problem)
        raise _refused(problems, self.name)

    def _open(self, path: Path, *, head: bytes | None = None):
        """The image in `path` (from `head`, its bytes already read, when given), its header read and
        checked, its pixels not yet decoded."""
        from PIL import Image

        with _PILLOW_LIMIT_LOCK:  # Pillow's limit raises or warns without the size: MAX_PIXELS below names it
            limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
            try:
                image = Image.open(path if head is None else io.BytesIO(head))
            except OSError as e:
                why = e.strerror.lower() if e.strerror else _unreadable(path, head)
                raise DataError(f"{path}: cannot be read as an image ({why}); remove or replace the file") from None
            finally:
                Image.MAX_IMAGE_PIXELS = limit
        refusal = _refusal(image)
        if refusal:
            image.close()
            raise DataError(f"{path}: {refusal}")
        return image

    def _check_size(self, path: Path, image) -> None:
        if image.size != self.size:
            raise DataError(f"{path}: is {image.size[0]}x{image.size[1]} pixels but the dataset's images are "
                            f"{self.size[0]}x{self.size[1]}; resize every image to one size")

    def read(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), *self.shape[1:]), dtype=self.dtype)
        for i, row in enumerate(rows):
            path = self.files[int(row)]
            with self._open(path) as image:
                self._check_size(path, image)
                out[i] = self._pixels(path, image)
        return out

    def _pixels(self, path: Path, image) -> np.ndarray:
        """`image` decoded as (C, H, W) in the folder's colour mode and dtype. A 16-bit image is
        value / 65535 (convert("L") clips every value above 255), rounded to 256 levels in a uint8 folder."""
        _decode(path, image)
        if image.mode in SIXTEEN_BIT_MODES:
            unit = np.asarray(image, dtype=np.float32)[None] / 65535
            pixels = np.repeat(unit, 3, axis=0) if self.mode == "RGB" else unit
            return pixels if self.dtype == np.float32 else np.rint(pixels * 255).astype(np.uint8)
        pixels = np.asarray(image.convert(self.mode), dtype=np.uint8)
        pixels = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
        return pixels if self.dtype == np.uint8 else pixels / np.float32(255)

    def check_every_row(self) -> None:
        """Refuse the folder before training if a file is not an image, has another size or is cut
        short: said at load, no privacy is spent on a run that a step would stop. Each file's header
        and end are read (ENDINGS); its pixels are decoded when a step draws it, so a file damaged in
        between, not cut short, still fails then. Done once: `checked_fingerprint` checks while it hashes."""
        if self._checked:
            return
        problems: list[DataError] = []
        for path in self.files:
            self._check_file(path, None, problems)
        self._settle(problems)

    def checked_fingerprint(self, *, root: Path, checked_before: Collection[str] = ()) -> str:
        """The folder's fingerprint (hash_files over the files, names relative to `root`) and
        `check_every_row`'s check in the same pass: each file is opened once, its header parsed from
        the bytes the hash reads. With `checked_before` (fingerprints of folders that passed this
        check), the files are only hashed: the same fingerprint is the same bytes, so the check would
        give the same result (parsing the headers is most of the time a load takes); another
        fingerprint is checked after all."""
        if checked_before:
            fingerprint = hash_files(self.files, tag="image-folder", root=root)
            if fingerprint in checked_before:
                self._checked = True
            else:
                self.check_every_row()
            return fingerprint
        problems: list[DataError] = []

        def first_read(path: Path, offset: int, head: bytes) -> None:
            if offset == 0:
                self._check_file(path, head, problems)

        fingerprint = hash_files(self.files, tag="image-folder", root=root, on_read=first_read)
        self._settle(problems)
        return fingerprint

    def _check_file(self, path: Path, head: bytes | None, problems: list[DataError]) -> None:
        if head is not None and len(head) == HASH_READ:  # a file larger than one read: open it whole
            head = None
        try:
            with self._open(path, head=head) as image:
                self._check_size(path, image)
                ending = ENDINGS.get(image.format)
                if ending is None or not _ends_with(path, head, ending):
                    _decode(path, image)
        except DataError as problem:
            problems.append(problem)

    def _settle(self, problems: list[DataError]) -> None:
        if problems:
            raise _refused(problems, self.name)
        self._checked = True


def _ends_with(path: Path, whole: bytes | None, ending: bytes) -> bool:
    """Whether the file ends with `ending`: `whole` is its bytes when already read, None to read its end."""
    if whole is not None:
        return whole.endswith(ending)
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - len(ending)))
        return f.read() == ending


def _decode(path: Path, image) -> None:
    """Decode `image`'s pixels (Pillow decodes lazily), refusing a file damaged past its header."""
    try:
        image.load()
    except (OSError, ValueError, EOFError, SyntaxError):
        raise DataError(f"{path}: cannot be read as an image (a {image.format} file cut short or damaged); "
                        "remove or replace the file") from None


def _refusal(image) -> str | None:
    """What is wrong with an image that opens, from its header alone (nothing is decoded yet)."""
    width, height = image.size
    if width * height > MAX_PIXELS:
        return (f"is {width}x{height} pixels, more than the {MAX_PIXELS:,} an image may have (Pillow's limit "
                "against decompression bombs); remove or resize it")
    if image.mode in ("I", "F"):
        kind = "signed or 32-bit integer" if image.mode == "I" else "floating-point"
        return (f"has {kind} pixels (Pillow mode {image.mode}), which have no fixed range to scale from; "
                "save 8- or 16-bit images, or put the images in x.npy as floats in [0, 1]")
    return None


def _unreadable(path: Path, head: bytes | None) -> str:
    """Why Pillow could not open the file, said from its first bytes (Pillow's message names a Python
    object, '<_io.BytesIO object at 0x...>')."""
    if head is None:
        with open(path, "rb") as f:
            head = f.read(16)
    if not head:
        return "the file is empty, 0 bytes"
    for offset, start, kind in SIGNATURES:
        if head[offset:].startswith(start):
            return f"a {kind} file cut short or damaged"
    return "not a PNG, JPEG, BMP, GIF, TIFF or WebP file"


def _refused(problems: list[DataError], folder: str) -> DataError:
    """The first file's problem, and how many more files have one."""
    more = len(problems) - 1
    return DataError(str(problems[0]) + (f" (and {more} more file{'s' if more > 1 else ''} in {folder} "
                                         "refused as well)" if more else ""))


def load_image_folder(folder: Path, *, split: SplitRequest, checked_before: Collection[str] = (),
                      test_folder: Path | None = None):
    """The images under `folder`'s class sub-folders as a Dataset whose inputs are decoded on demand.
    `checked_before`: as ImageFileRows.checked_fingerprint. `test_folder`: the test images, in class
    sub-folders of their own (every image of `folder` then trains); the classes are those of both."""
    from engine.datasets import _need_two_classes

    found = _class_files(folder)
    test_found = _test_classes(test_folder) if test_folder is not None else []
    classes = sorted({name for name, _ in found} | {name for name, _ in test_found})
    files, y = _files_and_labels(found, classes)
    if not files:
        raise DataError(f"{folder}: holds no image files in class sub-folders; put each class's images "
                        f"({', '.join(IMAGE_SUFFIXES)}) in a sub-folder named after the class")
    _need_two_classes(classes, what=str(folder))
    source = ImageFileRows(files, name=str(folder))
    fingerprint = source.checked_fingerprint(root=folder, checked_before=checked_before)
    if test_folder is not None:
        test_files, y_test = _files_and_labels(test_found, classes)
        test_source = ImageFileRows(test_files, name=str(test_folder), like=source)  # checked by image_dataset
        return image_dataset(name=folder.name, source=source, y=y, train_rows=None, test=MappedRows(test_source),
                             y_test=y_test, class_names=classes, fingerprint=fingerprint,
                             origin=str(folder.absolute()),
                             split=f"test folder given: {test_folder.absolute()} ({len(test_files)} images)")
    train, test, ids = split.draw(MappedRows(source), y, what=str(folder))
    return image_dataset(name=folder.name, source=source, y=y[train], train_rows=train,
                         test=MappedRows(source, test), y_test=y[test], class_names=classes,
                         fingerprint=fingerprint,
                         origin=str(folder.absolute()), split=split.text,
                         train_ids=None if ids is None else ids[train])
