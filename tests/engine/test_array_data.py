"""Images read on demand (engine.array_data, engine.image_folder): folders of .npy arrays, .npz
archives mapped in place, image folders. Real files in tmp_path; the in-memory loaders are the
reference the on-demand ones must agree with, value for value."""

from __future__ import annotations

import dataclasses
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import array_data
from engine.array_data import MappedRows, NpyRows, open_npz_member
from engine.config import RunConfig
from engine.datasets import load_dataset
from engine.errors import DataError
from engine.runs import prepare


def _images(n: int = 400, classes: int = 4, seed: int = 0, size: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Noise images with a bright class-specific band: easy to learn, different in every row."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.integers(0, 80, (n, 1, size, size), dtype=np.uint8)
    for k in range(classes):
        x[y == k, 0, 2 * k : 2 * k + 2, :] = 240
    return x, y


def _array_folder(folder: Path, x, y, x_test=None, y_test=None) -> Path:
    folder.mkdir()
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    if x_test is not None:
        np.save(folder / "x_test.npy", x_test)
        np.save(folder / "y_test.npy", y_test)
    return folder


def test_an_array_folder_is_memory_mapped_and_reads_what_the_in_memory_loader_reads(tmp_path):
    x, y = _images()
    folder = _array_folder(tmp_path / "arrays", x, y)
    np.savez(tmp_path / "same.npz", x=x, y=y)
    mapped = load_dataset(folder, seed=3)
    in_memory = load_dataset(tmp_path / "same.npz", seed=3)
    assert isinstance(mapped.x_train, MappedRows) and isinstance(in_memory.x_train, torch.Tensor)
    assert isinstance(mapped.x_train.source.array, np.memmap)
    assert mapped.x_train.shape == tuple(in_memory.x_train.shape) and mapped.num_test == in_memory.num_test
    assert torch.equal(mapped.y_train, in_memory.y_train) and torch.equal(mapped.y_test, in_memory.y_test)
    assert mapped.normalization == in_memory.normalization and mapped.split == in_memory.split
    idx = torch.tensor([5, 0, mapped.num_train - 1, 5, 17])  # unsorted, repeated: as indexing a tensor
    assert torch.equal(mapped.x_train[idx], in_memory.x_train[idx])
    assert torch.equal(mapped.x_train[10:74], in_memory.x_train[10:74])
    assert torch.equal(mapped.x_test[:], in_memory.x_test)
    grid = torch.tensor([[1, 2], [3, 4]])  # a teacher group's (teachers, rows) index
    assert torch.equal(mapped.x_train[grid], in_memory.x_train[grid])
    assert len(mapped.fingerprint) == 64 and load_dataset(folder, seed=3).fingerprint == mapped.fingerprint


def test_dp_sgd_on_mapped_data_trains_the_same_model_as_on_the_same_data_in_memory(tmp_path):
    # Reproducible noise seeds the Poisson sampling and the noise: the same indices are drawn over
    # the same N rows, so the only difference could be the rows read - and there is none.
    x, y = _images(600)
    x_test, y_test = _images(100, seed=1)
    folder = _array_folder(tmp_path / "arrays", x, y, x_test, y_test)
    np.savez(tmp_path / "same.npz", x=x, y=y, x_test=x_test, y_test=y_test)
    runs = []
    for dataset in (folder, tmp_path / "same.npz"):
        config = RunConfig(dataset=str(dataset), mechanism="dpsgd", model="mlp", epochs=2, expected_batch_size=50,
                           noise_multiplier=1.0, clipping_norm=1.0, learning_rate=0.5, delta=1e-4,
                           reproducible_noise=True, seed=2, device="cpu")
        run = prepare(config)
        result = run.train()
        runs.append((run, result))
    (mapped, mapped_result), (in_memory, in_memory_result) = runs
    assert isinstance(mapped.data.x_train, MappedRows)
    for (name, a), (_, b) in zip(mapped.model.state_dict().items(), in_memory.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert mapped_result.test_accuracy == in_memory_result.test_accuracy > 0.8


def test_a_step_reads_only_its_sampled_rows(tmp_path):
    x, y = _images(1000)
    folder = _array_folder(tmp_path / "arrays", x, y)

    class CountingRows(NpyRows):  # the real reader, recording how many rows each read asks for
        reads: list[int] = []

        def read(self, rows):
            self.reads.append(len(rows))
            return super().read(rows)

    config = RunConfig(dataset=str(folder), mechanism="dpsgd", model="mlp", epochs=1, expected_batch_size=20,
                       noise_multiplier=1.0, clipping_norm=1.0, delta=1e-4, device="cpu")
    run = prepare(config)
    run.data.x_train.source.__class__ = CountingRows  # x_test reads from the same file
    result = run.train()
    evaluations = [n for n in CountingRows.reads if n == run.data.num_test]
    steps = [n for n in CountingRows.reads if n != run.data.num_test]
    assert len(evaluations) >= 1 and len(steps) == result.steps_done == run.plan.steps_planned  # one read a step
    assert max(steps) < 60 and 400 < sum(steps) < 1200  # Poisson batches around 20, never the whole split


def test_an_uncompressed_npz_is_mapped_in_place_and_a_compressed_one_is_loaded(tmp_path, monkeypatch):
    x, y = _images()
    np.savez(tmp_path / "plain.npz", x=x, y=y)
    np.savez_compressed(tmp_path / "packed.npz", x=x, y=y)
    in_memory = load_dataset(tmp_path / "plain.npz")
    monkeypatch.setattr(array_data, "MAP_NPZ_ABOVE_BYTES", 1000)  # as if this archive were large
    mapped = load_dataset(tmp_path / "plain.npz")
    assert isinstance(mapped.x_train, MappedRows) and isinstance(mapped.x_train.source.array, np.memmap)
    assert torch.equal(mapped.x_train[torch.arange(mapped.num_train)], in_memory.x_train)
    assert mapped.fingerprint == in_memory.fingerprint  # the file's sha256 either way
    assert isinstance(load_dataset(tmp_path / "packed.npz").x_train, torch.Tensor)
    with pytest.raises(DataError, match=r"packed.npz: array 'x' is compressed and cannot be memory-mapped; save "
                                         r"the archive with numpy.savez \(not savez_compressed\), or extract x"):
        open_npz_member(tmp_path / "packed.npz", "x")
    with zipfile.ZipFile(tmp_path / "plain.npz") as archive:
        assert archive.getinfo("x.npy").compress_type == zipfile.ZIP_STORED


def _image_folder(root: Path, x: np.ndarray, y: np.ndarray, mode: str = "L") -> list[Path]:
    from PIL import Image

    paths = []
    for i, (image, label) in enumerate(zip(x, y)):
        folder = root / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{i:05d}.png"
        pixels = image[0] if mode == "L" else image.transpose(1, 2, 0)
        Image.fromarray(pixels, mode=None).save(path)
        paths.append(path)
    return paths


def test_an_image_folder_is_decoded_on_demand_one_class_per_sub_folder(tmp_path):
    x, y = _images(120, classes=3)
    _image_folder(tmp_path / "pictures", x, y)
    data = load_dataset(tmp_path / "pictures", seed=1, test_fraction=0.25)
    assert data.class_names == ("class_0", "class_1", "class_2") and data.input_shape == (1, 10, 10)
    assert data.num_train + data.num_test == 120 and data.num_test > 0
    # Files are listed class by class in name order: file i of the listing is example order[i].
    order = np.concatenate([np.flatnonzero(y == k) for k in range(3)])
    reference = (torch.from_numpy(x[order].astype(np.float32)) / 255.0 - 0.5) / 0.5
    rows = data.x_train.rows
    assert torch.equal(data.x_train[torch.arange(data.num_train)], reference[rows])
    assert torch.equal(data.y_train, torch.from_numpy(y[order][rows]))
    assert torch.equal(data.x_test[0:data.num_test], reference[data.x_test.rows])


def test_loading_an_image_folder_opens_each_file_once(tmp_path, monkeypatch):
    """Its fingerprint and its check of every file's header are one pass: a folder of a million images
    is read once at load, not once to check and again to hash. The fingerprint is the same digest of
    names and bytes as before (runs recorded then still count in the same ledger)."""
    import builtins

    x, y = _images(60, classes=3)
    paths = _image_folder(tmp_path / "pictures", x, y)
    opened: list[str] = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if str(file).endswith(".png"):
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    data = load_dataset(tmp_path / "pictures", test_fraction=0.25)
    monkeypatch.setattr(builtins, "open", real_open)
    assert sorted(opened[1:]) == sorted(map(str, paths))  # the first file once more: its size and colours
    assert opened[0] == str(sorted(paths)[0])
    listed = sorted(paths, key=lambda p: (p.parent.name, p.name))
    assert data.fingerprint == array_data.hash_files(listed, tag="image-folder", root=tmp_path / "pictures")
    # A file larger than one read is opened again for its header, and is checked all the same.
    monkeypatch.setattr(array_data, "HASH_READ", 64)
    monkeypatch.setattr("engine.image_folder.HASH_READ", 64)
    assert load_dataset(tmp_path / "pictures", test_fraction=0.25).fingerprint == data.fingerprint
    from PIL import Image

    Image.fromarray(np.zeros((12, 12), np.uint8)).save(paths[5])
    with pytest.raises(DataError, match=rf"{paths[5].name}: is 12x12 pixels but the dataset's images are 10x10"):
        load_dataset(tmp_path / "pictures", test_fraction=0.25)


def test_colour_images_keep_three_channels(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (12, 3, 6, 5), dtype=np.uint8)
    _image_folder(tmp_path / "colour", x, np.arange(12) % 2, mode="RGB")
    data = load_dataset(tmp_path / "colour", test_fraction=0.25)
    assert data.input_shape == (3, 6, 5) and data.normalization["mean"] == [0.5, 0.5, 0.5]
    assert float(data.x_train[0:9].abs().max()) <= 1.0


def test_user_errors_are_one_line_naming_the_file(tmp_path, monkeypatch):
    x, y = _images(40, classes=2)
    paths = _image_folder(tmp_path / "pictures", x, y)
    from PIL import Image

    # Said when the data is loaded, before any step could spend privacy (it was said by the step that
    # drew the file, failing the run part-way).
    Image.fromarray(np.zeros((12, 12), np.uint8)).save(paths[7])
    with pytest.raises(DataError, match=rf"{paths[7].name}: is 12x12 pixels but the dataset's images are 10x10"):
        load_dataset(tmp_path / "pictures", test_fraction=0.5)
    paths[3].write_bytes(b"")  # an empty file: hashed as one empty read, checked all the same
    with pytest.raises(DataError, match=rf"{paths[3].name}: cannot be read as an image \(the file is empty, 0 bytes\); "
                                        r".* \(and 1 more file in "):
        load_dataset(tmp_path / "pictures", test_fraction=0.5)
    paths[3].write_bytes(b"not an image")
    with pytest.raises(DataError, match=rf"{paths[3].name}: cannot be read as an image \(not a PNG, .*\); .* "
                                        rf"\(and 1 more file in {tmp_path / 'pictures'} refused as well\)"):
        load_dataset(tmp_path / "pictures", test_fraction=0.5)
    # Hidden files and folders are not examples: macOS's '._name.png' companions (not images), a
    # checkpoint folder.
    Image.fromarray(x[0, 0]).save(paths[3])
    Image.fromarray(x[7, 0]).save(paths[7])
    (paths[5].parent / f"._{paths[5].name}").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    (tmp_path / "pictures" / ".ipynb_checkpoints").mkdir()
    Image.fromarray(x[0, 0]).save(tmp_path / "pictures" / ".ipynb_checkpoints" / "0.png")
    data = load_dataset(tmp_path / "pictures", test_fraction=0.5)
    assert data.num_train + data.num_test == 40 and data.class_names == ("class_0", "class_1")

    np.save(tmp_path / "x.npy", x)
    with pytest.raises(DataError, match="a .npy file holds one array; put the inputs in x.npy and the labels in y.npy"):
        load_dataset(tmp_path / "x.npy")
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    np.save(lonely / "x.npy", x)
    with pytest.raises(DataError, match="has x.npy but no y.npy"):
        load_dataset(lonely)
    pixels = np.full((40, 1, 4, 4), 0.5, np.float32)
    pixels[29, 0, 3, 2] = np.nan
    floats = _array_folder(tmp_path / "floats", pixels, y)
    for read_bytes in (1 << 26, 3 * 64):  # one read, and 3 rows of 64 bytes per read: row 29 in read 10
        monkeypatch.setattr(array_data, "CHECK_READ_BYTES", read_bytes)
        with pytest.raises(DataError, match=r"floats: x: row 29 has pixels outside \[0, 1\] \(or NaN\)"):
            load_dataset(floats)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="neither x.npy nor class sub-folders of images"):
        load_dataset(empty)



def _png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG whose header says `width` x `height` (8-bit grey) followed by no pixels: it opens, and
    decoding it would fail, so a check that names its size read the header alone."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"\x00" * 9)) + chunk(b"IEND", b""))


def test_a_huge_image_is_refused_from_its_header_naming_its_size(tmp_path):
    """Pillow raised DecompressionBombError (a traceback from `dpw run`) above 2 x 89 million pixels and
    warned above 89 million. The file is named with its size instead, before anything is decoded."""
    import warnings

    from PIL import Image

    x, y = _images(20, classes=2, size=8)
    paths = _image_folder(tmp_path / "pictures", x, y)
    _png_header_only(paths[4], 20000, 20000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with pytest.raises(DataError, match=rf"{paths[4].name}: is 20000x20000 pixels, more than .*; "
                                            "remove or resize it$"):
            load_dataset(tmp_path / "pictures", test_fraction=0.5)
        # Every file just past the warning's limit: the first one sets no size for the others to match.
        for path in paths:
            _png_header_only(path, 10000, 9000)
        with pytest.raises(DataError, match=rf"{min(paths).name}: is 10000x9000 pixels, more than .* "
                                            r"\(and 19 more files in "):
            load_dataset(tmp_path / "pictures", test_fraction=0.5)
    assert Image.MAX_IMAGE_PIXELS == 1024 * 1024 * 1024 // 4 // 3  # Pillow's own guard is left as it was


def test_16_bit_images_are_scaled_to_the_unit_range_not_clipped(tmp_path):
    """convert("L") clips 16-bit values to 255: dark and bright 16-bit images all became white and a
    separable folder trained at chance. A value is value / 65535, whichever path reads the folder."""
    from PIL import Image

    rng = np.random.default_rng(0)
    y = np.arange(20) % 2
    x = (rng.integers(0, 20000, (20, 1, 6, 6)) + 40000 * y[:, None, None, None]).astype(np.uint16)
    paths = _image_folder(tmp_path / "deep", x, y)
    order = np.concatenate([np.flatnonzero(y == k) for k in range(2)])
    data = load_dataset(tmp_path / "deep", test_fraction=0.5)
    source = data.x_train.source
    assert np.array_equal(source.read(np.arange(20)), x[order].astype(np.float32) / 65535)
    expected = (torch.from_numpy(x[order].astype(np.float32)) / 65535 - 0.5) / 0.5
    assert torch.equal(data.x_train[torch.arange(data.num_train)], expected[data.x_train.rows])
    again = load_dataset(tmp_path / "deep", test_fraction=0.5, checked_before={data.fingerprint})
    assert torch.equal(again.x_train[torch.arange(data.num_train)], expected[data.x_train.rows])
    # An 8-bit file among 16-bit ones is value / 255; a 16-bit file among 8-bit ones, the nearest of 256 levels.
    Image.fromarray(np.full((6, 6), 51, np.uint8)).save(paths[3])
    source = load_dataset(tmp_path / "deep", test_fraction=0.5).x_train.source
    assert np.array_equal(source.read(np.array([source.files.index(paths[3])]))[0, 0], np.full((6, 6), np.float32(0.2)))
    Image.fromarray(np.full((6, 6), 51, np.uint8)).save(paths[0])
    Image.fromarray(np.full((6, 6), 65535 // 3, np.uint16)).save(paths[5])
    source = load_dataset(tmp_path / "deep", test_fraction=0.5).x_train.source
    assert source.read(np.array([source.files.index(paths[5])])).max() == 85
    # Signed or 32-bit integers and floats have no fixed range to scale from: refused, naming the file.
    for pixels, kind in ((np.zeros((6, 6), np.float32), "floating-point"), (np.zeros((6, 6), np.int32), "integer")):
        Image.fromarray(pixels).save(paths[7].with_suffix(".tif"))
        with pytest.raises(DataError, match=rf"{paths[7].stem}.tif: has .*{kind} pixels \(Pillow mode [FI]\), "
                                            "which have no fixed range"):
            load_dataset(tmp_path / "deep", test_fraction=0.5)


def test_a_broken_link_in_a_class_folder_is_refused_naming_its_target(tmp_path):
    """It was left out without a word: the run trained on fewer files than the folder shows."""
    x, y = _images(20, classes=2, size=8)
    paths = _image_folder(tmp_path / "pictures", x, y)
    link = paths[0].parent / "link.png"
    link.symlink_to(tmp_path / "gone.png")
    with pytest.raises(DataError, match=rf"{link}: is a link to {tmp_path / 'gone.png'}, which does not exist; "
                                        "remove it$"):
        load_dataset(tmp_path / "pictures", test_fraction=0.5)
    link.unlink()
    loop = paths[0].parent / "loop.png"  # a loop of links was a traceback (OSError: too many levels of links)
    link.symlink_to(loop)
    loop.symlink_to(link)
    with pytest.raises(DataError, match=r"(link|loop)\.png: is a link in a loop of links that never reaches a file"):
        load_dataset(tmp_path / "pictures", test_fraction=0.5)
    link.unlink()
    loop.unlink()
    looped = tmp_path / "pictures" / "looped"  # a class folder that is a loop of links
    looped.symlink_to(tmp_path / "pictures" / "looped")
    with pytest.raises(DataError, match=r"looped: is a link in a loop of links that never reaches a file"):
        load_dataset(tmp_path / "pictures", test_fraction=0.5)
    looped.unlink()
    link.symlink_to(paths[1])  # a link to an image is an example like any other
    data = load_dataset(tmp_path / "pictures", test_fraction=0.5)
    assert data.num_train + data.num_test == 21
    moved = tmp_path / "pictures" / "birds"  # a class folder linked from elsewhere, since moved: its class was missing
    moved.symlink_to(tmp_path / "elsewhere" / "birds")
    with pytest.raises(DataError, match=rf"{moved}: is a link to {tmp_path / 'elsewhere' / 'birds'}, which does not "
                                        "exist; remove it$"):
        load_dataset(tmp_path / "pictures", test_fraction=0.5)


def test_an_unreadable_image_is_said_in_plain_words(tmp_path):
    """Pillow's own message named a Python object ('cannot identify image file <_io.BytesIO object at
    0x7f...>'); the line says what is wrong with the file instead."""
    x, y = _images(20, classes=2, size=8)
    paths = _image_folder(tmp_path / "pictures", x, y)
    whole = paths[2].read_bytes()
    pixels_start = whole.index(b"IDAT") + 8
    for content, why in ((b"", "the file is empty, 0 bytes"),
                         (b"hello", "not a PNG, JPEG, BMP, GIF, TIFF or WebP file"),
                         (whole[:pixels_start - 12], "a PNG file cut short or damaged")):
        paths[2].write_bytes(content)
        with pytest.raises(DataError) as refused:
            load_dataset(tmp_path / "pictures", test_fraction=0.5)
        assert str(refused.value) == f"{paths[2]}: cannot be read as an image ({why}); remove or replace the file"

def test_an_image_cut_short_after_its_header_is_refused_at_load(tmp_path):
    """It passed the load's check of headers and stopped the run at the step that first drew it: at a
    point set by that one example, with privacy spent on an unfinished model."""
    from PIL import Image

    x, y = _images(20, classes=2, size=8)
    paths = _image_folder(tmp_path / "pictures", x, y)
    whole = paths[2].read_bytes()
    pixels_start = whole.index(b"IDAT") + 8
    cut_short = rf"^{re.escape(str(paths[2]))}: cannot be read as an image \(a PNG file cut short or damaged\);"
    paths[2].write_bytes(whole[:pixels_start + 4])
    with pytest.raises(DataError, match=cut_short):
        load_dataset(tmp_path / "pictures", test_fraction=0.5)
    with pytest.raises(DataError, match=cut_short):  # checked again, as for a folder whose fingerprint changed
        load_dataset(tmp_path / "pictures", test_fraction=0.5, checked_before={"another-fingerprint"})
    # Formats without a fixed end are decoded at load; JPEG and GIF are checked by their end, like PNG.
    for suffix in (".bmp", ".tif", ".jpg", ".gif", ".webp"):
        paths[2].unlink()
        paths[2] = paths[2].with_suffix(suffix)
        Image.fromarray(x[2, 0]).save(paths[2])
        load_dataset(tmp_path / "pictures", test_fraction=0.5)
        paths[2].write_bytes(paths[2].read_bytes()[:-3])
        with pytest.raises(DataError, match=rf"{re.escape(str(paths[2]))}: cannot be read as an image \(a "
                                            r"\w+ file cut short or damaged\)"):
            load_dataset(tmp_path / "pictures", test_fraction=0.5)
    # Damaged in between, its end intact: found only by decoding, which a step does (said there, as before).
    damaged = bytearray(whole)
    damaged[pixels_start + 2:pixels_start + 10] = b"\xff" * 8
    paths[2].unlink()
    paths[2] = paths[2].with_suffix(".png")
    paths[2].write_bytes(bytes(damaged))
    source = load_dataset(tmp_path / "pictures", test_fraction=0.5).x_train.source
    with pytest.raises(DataError, match=rf"^{re.escape(str(paths[2]))}: cannot be read as an image \(a PNG file cut "
                                        r"short or damaged\);"):
        source.read(np.array([source.files.index(paths[2])]))

@pytest.mark.parametrize("read_bytes", [1 << 23, 64, 7, 3])  # 3: fewer bytes than a pixel per read
def test_float_pixels_are_checked_from_the_bytes_the_fingerprint_reads(tmp_path, monkeypatch, read_bytes):
    """A float array may be larger than memory: it is read once at load (hashed and range-checked
    together), not hashed and then read again through the mapping for the check."""
    streaming = []
    check = array_data._first_row_outside_unit_range
    monkeypatch.setattr(array_data, "_first_row_outside_unit_range", lambda block: streaming.append(1) or check(block))
    monkeypatch.setattr(array_data, "HASH_READ", read_bytes)
    monkeypatch.setattr(array_data, "MAP_NPZ_ABOVE_BYTES", 100)
    rng = np.random.default_rng(1)
    x = rng.random((60, 1, 4, 4)).astype(np.float32)
    x_test = rng.random((20, 1, 4, 4)).astype(">f8")  # big-endian doubles: read as stored
    y, y_test = rng.integers(0, 2, 60), rng.integers(0, 2, 20)
    clean = load_dataset(_array_folder(tmp_path / "clean", x, y, x_test, y_test))
    assert clean.x_train.source.scan.complete and clean.x_test.source.scan.complete and not streaming
    assert clean.fingerprint == array_data.hash_files(
        [tmp_path / "clean" / f"{k}.npy" for k in ("x", "y", "x_test", "y_test")], root=tmp_path / "clean")

    x[37, 0, 1, 2], x_test[5, 0, 3, 3] = 1.0000001, -0.0
    with pytest.raises(DataError, match=r"bad: x: row 37 has pixels outside \[0, 1\]"):
        load_dataset(_array_folder(tmp_path / "bad", x, y, x_test, y_test))
    x[37, 0, 1, 2], x_test[5, 0, 3, 3] = 0.5, np.nan
    with pytest.raises(DataError, match=r"bad_test: x_test: row 5 has pixels outside \[0, 1\] \(or NaN\)"):
        load_dataset(_array_folder(tmp_path / "bad_test", x, y, x_test, y_test))
    # An archive's members lie at offsets that need not be a multiple of a pixel's size.
    x_test[5, 0, 3, 3] = 0.5
    x[59, 0, 3, 3] = 2.0
    np.savez(tmp_path / "archive.npz", y=y, x=x, y_test=y_test, x_test=x_test)
    with pytest.raises(DataError, match=r"archive.npz: x: row 59 has pixels outside \[0, 1\]"):
        load_dataset(tmp_path / "archive.npz")
    assert not streaming
    # Stored column-major, rows are not contiguous in the file: the check reads through the mapping.
    fortran = _array_folder(tmp_path / "fortran", np.asfortranarray(x), y)
    with pytest.raises(DataError, match=r"fortran: x: row 59 has pixels outside \[0, 1\]"):
        load_dataset(fortran)
    assert streaming


def test_whole_number_labels_are_encoded_as_the_in_memory_loader_does():
    from engine.array_data import encode_labels
    from engine.datasets import _encode_labels

    for y in (np.array([7, 3, 100, 3, 7], np.uint8), np.array([2, 0, 1, 2], np.int64), np.array(["b", "a", "b"])):
        fast, names = encode_labels(y, what="y")
        reference, reference_names = _encode_labels(y, what="y")
        assert np.array_equal(fast, reference) and fast.dtype == np.int64 and names == reference_names


def test_dpw_run_refuses_a_folder_with_a_bad_image_and_stores_no_run(tmp_path):
    """One file of another size among 40: `dpw run` says which before storing a run, so no privacy is
    spent (it failed the run at the step that drew the file, with the epsilon of the steps before)."""
    from click.testing import CliRunner
    from PIL import Image

    from engine.cli import cli
    from engine.store import Store

    x, y = _images(40, classes=2)
    paths = _image_folder(tmp_path / "pictures", x, y)
    Image.fromarray(np.zeros((10, 11), np.uint8)).save(paths[21])
    config = tmp_path / "run.toml"
    config.write_text(f'dataset = "{tmp_path / "pictures"}"\nmechanism = "dpsgd"\nmodel = "mlp"\n'
                      'noise_multiplier = 1.0\nexpected_batch_size = 8\nepochs = 1\ndelta = 1e-4\n')
    result = CliRunner().invoke(cli, ["run", str(config), "--db", str(tmp_path / "runs.sqlite")])
    assert result.exit_code == 1, result.output
    assert f"{paths[21]}: is 11x10 pixels but the dataset's images are 10x10" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs.sqlite").exists() or Store(tmp_path / "runs.sqlite").list_runs() == []


def test_an_image_folder_a_run_trained_on_is_hashed_but_not_checked_again(tmp_path, monkeypatch):
    """Parsing every header is most of an image folder's load (a million files: most of a minute). A
    store's runs record the fingerprint of data that passed the check: the same fingerprint is the same
    bytes, so the next run, audit or `dpw run` check on them only hashes; changed files are checked."""
    from click.testing import CliRunner
    from PIL import Image

    from engine.cli import cli
    from engine.image_folder import ImageFileRows
    from engine.store import Store

    x, y = _images(40, classes=2)
    paths = _image_folder(tmp_path / "pictures", x, y)
    config = tmp_path / "run.toml"
    config.write_text(f'dataset = "{tmp_path / "pictures"}"\nmechanism = "dpsgd"\nmodel = "mlp"\n'
                      'noise_multiplier = 1.0\nexpected_batch_size = 8\nepochs = 1\ndelta = 1e-4\n')
    db = str(tmp_path / "runs.sqlite")
    assert CliRunner().invoke(cli, ["run", str(config), "--db", db]).exit_code == 0
    store = Store(db)
    checked = store.checked_fingerprints(str(tmp_path / "pictures"))
    assert checked == {store.get_run(1)["dataset_fingerprint"]}
    assert store.checked_fingerprints(str(tmp_path / "elsewhere")) == frozenset()

    parsed: list[Path] = []
    check_file = ImageFileRows._check_file
    monkeypatch.setattr(ImageFileRows, "_check_file",
                        lambda self, path, head, problems: parsed.append(path) or check_file(self, path, head, problems))
    again = load_dataset(tmp_path / "pictures", test_fraction=0.5, checked_before=checked)
    assert again.fingerprint in checked and parsed == []
    assert load_dataset(tmp_path / "pictures", test_fraction=0.5).fingerprint == again.fingerprint and parsed

    Image.fromarray(np.zeros((10, 11), np.uint8)).save(paths[21])  # changed bytes: checked, and refused
    with pytest.raises(DataError, match=rf"{paths[21].name}: is 11x10 pixels"):
        load_dataset(tmp_path / "pictures", test_fraction=0.5, checked_before=checked)
    result = CliRunner().invoke(cli, ["run", str(config), "--db", db])
    assert result.exit_code == 1 and f"{paths[21]}: is 11x10 pixels" in result.output
    assert len(store.list_runs()) == 1


def test_input_canaries_on_data_read_from_disk_are_refused_before_the_run_is_stored(tmp_path):
    """prepare() (what `dpw run` and the window check before storing a run) refuses them; the refusal
    came from the first training step's set-up, leaving a failed run in the store."""
    from engine.errors import ConfigError

    x, y = _images(60, classes=2)
    folder = _array_folder(tmp_path / "arrays", x, y)
    config = RunConfig(dataset=str(folder), mechanism="dpsgd", model="mlp", epochs=1, expected_batch_size=10,
                       noise_multiplier=1.0, delta=1e-4, audit_canaries=10, audit_canary_kind="input")
    with pytest.raises(ConfigError, match="input canaries join training inputs held in memory") as raised:
        prepare(config)
    assert raised.value.field == "audit_canary_kind"
    prepare(dataclasses.replace(config, audit_canary_kind="gradient"))  # what the hint says works


def test_a_canary_audit_in_a_data_parallel_run_is_refused_before_training():
    from engine.errors import ConfigError

    config = RunConfig(dataset="digits", mechanism="dpsgd", model="mlp", epochs=1, noise_multiplier=1.0,
                       audit_canaries=10)
    # (engine.distributed_launch.check_distributable, before any data is loaded; the trainer's own
    # check of it was a second copy, now gone)
    with pytest.raises(ConfigError, match="the canary audit runs in one process, not with --nproc"):
        prepare(config, data_parallel=object())
