"""Image folders (one sub-folder per class) as a dataset read on demand.

    folder/
      cat/  001.png  002.jpg ...
      dog/  ...

Class names are the sub-folder names in sorted order; every image file (png, jpg, jpeg, bmp, gif,
tif, tiff, webp) is one example. Hidden files and folders (a leading '.', e.g. the '._name.png'
files macOS leaves on other disks) are left out. Only the file list and the labels are held in
memory: a training step decodes exactly the images its Poisson sample drew (`ImageFileRows`), so
the folder may be far larger than memory. All images must have one size (every file's header is
checked at load); the colour mode is the first image's (grayscale "L" or "RGB"), and every image is
converted to it.
The train/test split is a seeded, stratified split of the files (engine.datasets.stratified_split).
"""

from __future__ import annotations

import io
import os
from collections.abc import Collection
from pathlib import Path

import numpy as np

from engine.array_data import HASH_READ, MappedRows, hash_files, image_dataset
from engine.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def is_image_folder(folder: Path) -> bool:
    """A folder with at least one sub-folder that holds an image file."""
    return any(any(_image_names(c)) for c in _subfolders(folder))


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
    with os.scandir(folder) as entries:
        return [Path(e.path) for e in entries if not e.name.startswith(".") and e.is_dir()]


def _image_names(folder: Path):
    """The names of `folder`'s image files, hidden ones left out."""
    with os.scandir(folder) as entries:
        return [e.name for e in entries
                if not e.name.startswith(".") and os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES
                and e.is_file()]


class ImageFileRows:
    """Examples as image files: `read(rows)` decodes those files into (n, C, H, W) uint8."""

    def __init__(self, files: list[Path], *, name: str):
        self.files = files
        self.name = name
        first = self._first_readable()
        self.mode = "L" if first.mode in ("1", "L", "I", "I;16", "F") else "RGB"
        self.size = first.size  # (width, height)
        channels = 1 if self.mode == "L" else 3
        self.shape = (len(files), channels, first.size[1], first.size[0])
        self._checked = False

    def _first_readable(self):
        """The first file that opens as an image (its header): it sets the folder's size and colour
        mode. A file before it that does not open is named by `check_every_row`, with the others."""
        problems = []
        for path in self.files:
            try:
                return self._open(path, decode=False)
            except DataError as problem:
                problems.append(problem)
        raise _refused(problems, self.name)

    def _open(self, path: Path, *, decode: bool = True, head: bytes | None = None):
        """The image in `path` (from `head`, its bytes already read, when given)."""
        from PIL import Image, UnidentifiedImageError

        try:
            image = Image.open(path if head is None else io.BytesIO(head))
            if decode:
                image.load()
        except (OSError, UnidentifiedImageError) as e:
            raise DataError(f"{path}: cannot be read as an image ({e}); remove or replace the file") from None
        return image

    def _check_size(self, path: Path, image) -> None:
        if image.size != self.size:
            raise DataError(f"{path}: is {image.size[0]}x{image.size[1]} pixels but the folder's images are "
                            f"{self.size[0]}x{self.size[1]}; resize every image to one size")

    def read(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), *self.shape[1:]), dtype=np.uint8)
        for i, row in enumerate(rows):
            path = self.files[int(row)]
            image = self._open(path)
            self._check_size(path, image)
            pixels = np.asarray(image.convert(self.mode), dtype=np.uint8)
            out[i] = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
        return out

    def check_every_row(self) -> None:
        """Refuse the folder before training if a file is not an image or has another size: said at
        load, no privacy is spent on a run that a step would stop. Only each file's header is read
        (its pixels are decoded when a step draws it; a file damaged past its header fails then).
        Done once: `checked_fingerprint` checks while it hashes."""
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
            with self._open(path, decode=False, head=head) as image:
                self._check_size(path, image)
        except DataError as problem:
            problems.append(problem)

    def _settle(self, problems: list[DataError]) -> None:
        if problems:
            raise _refused(problems, self.name)
        self._checked = True


def _refused(problems: list[DataError], folder: str) -> DataError:
    """The first file's problem, and how many more files have one."""
    more = len(problems) - 1
    return DataError(str(problems[0]) + (f" (and {more} more file{'s' if more > 1 else ''} in {folder} "
                                         "refused as well)" if more else ""))


def load_image_folder(folder: Path, *, test_fraction: float, seed: int, checked_before: Collection[str] = ()):
    """The images under `folder`'s class sub-folders as a Dataset whose inputs are decoded on demand.
    `checked_before`: as ImageFileRows.checked_fingerprint."""
    from engine.datasets import _need_two_classes, _split_or_fail, _split_text

    found = _class_files(folder)
    classes = [name for name, _ in found]
    files = [path for _, paths in found for path in paths]
    y = np.repeat(np.arange(len(found), dtype=np.int64), [len(paths) for _, paths in found])
    if not files:
        raise DataError(f"{folder}: holds no image files in class sub-folders; put each class's images "
                        f"({', '.join(IMAGE_SUFFIXES)}) in a sub-folder named after the class")
    _need_two_classes(classes, what=str(folder))
    source = ImageFileRows(files, name=str(folder))
    fingerprint = source.checked_fingerprint(root=folder, checked_before=checked_before)
    train, test = _split_or_fail(y, test_fraction=test_fraction, seed=seed, what=str(folder))
    return image_dataset(name=folder.name, source=source, y=y[train], train_rows=train,
                         test=MappedRows(source, test), y_test=y[test], class_names=classes,
                         fingerprint=fingerprint,
                         origin=str(folder.absolute()), split=_split_text(test_fraction, seed))
