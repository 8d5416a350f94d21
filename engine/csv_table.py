"""Streaming reader for a CSV table: one label column, every other column numeric.

The file is read twice, never held whole: a first pass hashes it (the dataset fingerprint) and
counts its lines (an upper bound on the rows, so the float64 feature matrix is allocated once);
the second pass parses it with the csv module and converts `CHUNK_ROWS` rows at a time into that
matrix. Peak memory is about the feature matrix plus one chunk of text.

Every problem is a `DataError` naming the file, and where it is known the line and column.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from engine.errors import DataError

CHUNK_ROWS = 16_384
"""Rows converted to numbers at a time (their text as Python strings is the reader's working memory)."""
PROGRESS_ROWS = 65_536
"""Progress is reported about every this many rows, for files of more rows than this."""
FLOAT32_MAX = float(np.finfo(np.float32).max)
"""The largest feature value accepted: features are trained as 32-bit floats."""

_READ_BYTES = 1 << 23  # 8 MiB per read in the hashing pass

Progress = Callable[[int, int], None]
"""progress(rows_done, rows_total): rows_total is an estimate (lines in the file) until the last call."""


@dataclass(frozen=True, eq=False)
class CsvTable:
    """The parsed table: `features` float64 (rows, columns), `labels` the label cells as text
    (rows,), the feature column names in file order, and the sha256 of the file's bytes."""

    features: np.ndarray
    labels: np.ndarray
    feature_names: tuple[str, ...]
    sha256: str


def read_csv_table(path: Path, *, label_column: str, progress: Progress | None = None) -> CsvTable:
    """Parse `path` (UTF-8, optional BOM, comma-separated, blank rows skipped) into a CsvTable."""
    sha256, line_count = _hash_and_count_lines(path)
    with open(path, "rb") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        reader = csv.reader(text)
        try:
            return _parse(path, reader, label_column, sha256, line_count, progress)
        except UnicodeDecodeError:
            offset = _first_bad_utf8_offset(path)
            raise DataError(f"{path}: not UTF-8 text (bad byte at offset {offset}); save the CSV as UTF-8") from None
        except csv.Error as e:
            raise DataError(
                f"{path}, line {reader.line_num}: cannot parse as CSV ({e}); fix the quoting on that line"
            ) from e


def _hash_and_count_lines(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    lines = 0
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(_READ_BYTES), b""):
                h.update(block)
                lines += block.count(b"\n") + block.count(b"\r")
    except OSError as e:
        raise DataError(f"{path}: cannot read the file ({e.strerror or e}); check its permissions") from e
    return h.hexdigest(), lines + 1


def _first_bad_utf8_offset(path: Path) -> int:
    decoder = codecs.getincrementaldecoder("utf-8")()
    done = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_READ_BYTES), b""):
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(block)
            except UnicodeDecodeError as e:
                return done - pending + e.start
            done += len(block)
    return done


def _is_blank(row: list[str]) -> bool:
    return not row or not any(map(str.strip, row))


def _parse(path: Path, reader, label_column: str, sha256: str, line_count: int,
           progress: Progress | None) -> CsvTable:
    header: list[str] | None = None
    for row in reader:
        if not _is_blank(row):
            header = [h.strip() for h in row]
            break
    if header is None:
        raise DataError(
            f"{path}: the file is empty; expected a header row of column names (one of them {label_column!r}) "
            f"and one row per example"
        )
    _check_header(path, header, label_column)
    label_at = header.index(label_column)
    feature_at = [i for i in range(len(header)) if i != label_at]
    names = tuple(header[i] for i in feature_at)
    width = len(header)

    # Rows <= lines after the header's; np.empty leaves untouched pages unallocated.
    features = np.empty((max(line_count - reader.line_num, 1), len(feature_at)), dtype=np.float64)
    label_parts: list[np.ndarray] = []
    rows: list[list[str]] = []
    lines: list[int] = []
    done = 0
    total_estimate = max(line_count - reader.line_num, 1)
    report = progress if progress is not None and total_estimate > PROGRESS_ROWS else None

    def flush() -> None:
        nonlocal done
        block = _convert(path, rows, lines, header, feature_at, label_column)
        features[done: done + len(rows)] = block
        labels = _labels(path, rows, lines, label_at, label_column)
        label_parts.append(labels)
        done += len(block)
        rows.clear()
        lines.clear()
        if report is not None and done // PROGRESS_ROWS != (done - len(block)) // PROGRESS_ROWS:
            report(done, max(done, total_estimate))

    for row in reader:
        if (len(row) != width or not row[0].strip()) and _is_blank(row):
            continue
        if len(row) != width:
            raise DataError(
                f"{path}, line {reader.line_num}: {len(row)} values but the header has {width} columns; "
                f"every row needs one value per column"
            )
        rows.append(row)
        lines.append(reader.line_num)
        if len(rows) == CHUNK_ROWS:
            flush()
    if rows:
        flush()
    if done == 0:
        raise DataError(f"{path}: has a header but no data rows; add one row per example")
    if report is not None:
        report(done, done)
    labels = label_parts[0] if len(label_parts) == 1 else np.concatenate(label_parts)
    return CsvTable(features=features[:done], labels=labels, feature_names=names, sha256=sha256)


def _check_header(path: Path, header: list[str], label_column: str) -> None:
    if label_column not in header:
        hint = ""
        if len(header) == 1 and any(sep in header[0] for sep in ";\t|"):
            hint = " (the header looks like it uses ';', tab or '|' between columns; save the file with commas)"
        raise DataError(
            f"{path}: no label column {label_column!r}; the columns are: {', '.join(map(repr, header))}{hint}; "
            f"set label_column to the column that holds the classes"
        )
    duplicates = sorted({h for h in header if header.count(h) > 1})
    if duplicates:
        raise DataError(f"{path}: column name(s) {', '.join(map(repr, duplicates))} appear more than once; rename them")
    if len(header) == 1:
        raise DataError(f"{path}: only the label column {label_column!r}; add at least one numeric feature column")


def _convert(path: Path, rows: list[list[str]], lines: list[int], header: list[str], feature_at: list[int],
             label_column: str) -> np.ndarray:
    """One chunk of rows as float64 features; a bad cell is reported by line and column name."""
    label_at = next(i for i in range(len(header)) if i not in feature_at)
    if label_at == len(header) - 1:
        cells = [row[:-1] for row in rows]
    elif label_at == 0:
        cells = [row[1:] for row in rows]
    else:
        cells = [row[:label_at] + row[label_at + 1:] for row in rows]
    try:
        block = np.array(cells, dtype=np.float64)
        if np.all(np.abs(block) <= FLOAT32_MAX):  # also False for NaN
            return block
    except ValueError:
        pass
    for line, values in zip(lines, cells):
        for col, value in zip(feature_at, values):
            name = header[col]
            try:
                number = float(value)
            except ValueError:
                shown = "is empty (a missing value)" if not value.strip() else f"{value.strip()!r} is not a number"
                raise DataError(
                    f"{path}, line {line}, column {name!r}: {shown}; every column except the label column "
                    f"{label_column!r} must hold numbers, so fill it in, drop the row, or encode/drop the column"
                ) from None
            if not math.isfinite(number):
                raise DataError(
                    f"{path}, line {line}, column {name!r}: {value.strip()!r} is not a finite number; "
                    f"replace missing values (NaN) and infinities, or drop the row"
                )
            if abs(number) > FLOAT32_MAX:
                raise DataError(
                    f"{path}, line {line}, column {name!r}: {value.strip()!r} is beyond the range training "
                    f"computes in (32-bit floats, ±{FLOAT32_MAX:.3g}); rescale the column (e.g. to other units or "
                    f"its logarithm)"
                )
    raise DataError(f"{path}: cannot read the feature columns as numbers; check the file")  # pragma: no cover


def _labels(path: Path, rows: list[list[str]], lines: list[int], label_at: int, label_column: str) -> np.ndarray:
    values = np.array([row[label_at] for row in rows], dtype=np.str_)
    blank = np.char.str_len(np.char.strip(values)) == 0
    if blank.any():
        line = lines[int(np.argmax(blank))]
        raise DataError(
            f"{path}, line {line}, column {label_column!r}: the label is empty; give every row a class or drop it"
        )
    return values
