"""Each example's keyed hash: a number fixed by the example itself and a key, never by the other
examples or by where the example sits in the data.

Whatever is decided per example from this hash (its side of the train/test split, the training
subset, its PATE teacher) changes for that example alone when another is added or removed: the
add/remove neighbouring relation of the privacy analysis holds for the data as given, not only for
what is left after the split. Row positions, class counts and seeded permutations of the whole data
do not have that property: adding one example reshuffles them all.

An example's identity (`example_records`) is:
- inputs in memory (tensor or array, one row per example): the row's bytes as held, with the label
  when labels are given;
- inputs read on demand from an image folder: the file's path relative to the folder ("class/name"),
  with the label. Paths are listed at load already, so this costs no read, where the files' bytes
  would mean reading (and for a check, decoding) the whole folder again;
- other inputs read on demand (memory-mapped arrays): the row's stored bytes (float pixels as
  float32, as an in-memory copy of the same array holds them) with the label, read once,
  sequentially, READ_BYTES at a time (the data may be larger than memory);
- an int N: example i is identified by i (for callers whose indices are stable identities).
Equal examples have equal hashes. `identity_digests` hashes each identity once (no key); a keyed
hash of those digests (`keyed_hashes_of`) then costs one short hash per example, whatever its size.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

READ_BYTES = 1 << 25  # raw rows read at a time when inputs read on demand are hashed
HASH_RANGE = 2.0 ** 64  # keyed hashes are whole numbers in [0, HASH_RANGE)


def hash_key(seed: int, purpose: int) -> bytes:
    """The 32-byte key of one use of the example hash: a function of the run's seed and the use only,
    fixed before any data is seen. The arguments need a fixed key, not a secret one: the seed (public)
    is enough, and separate uses get independent keys."""
    return np.random.SeedSequence([seed, purpose]).generate_state(8, dtype=np.uint32).astype("<u4").tobytes()


def keyed_hashes(examples: Any, *, key: bytes, labels: Any = None) -> np.ndarray:
    """Each example's hash under `key` (uint64, one per example, in row order): `keyed_hashes_of` its
    `identity_digests`."""
    return keyed_hashes_of(identity_digests(examples, labels), key=key)


def identity_digests(examples: Any, labels: Any = None) -> np.ndarray:
    """Each example's identity hashed once, unkeyed: an (N, 16) uint8 array, one blake2b digest per row."""
    n = examples if isinstance(examples, (int, np.integer)) else len(examples)
    out = np.empty((int(n), 16), dtype=np.uint8)
    for i, record in enumerate(example_records(examples, labels)):
        out[i] = np.frombuffer(hashlib.blake2b(record, digest_size=16).digest(), dtype=np.uint8)
    return out


def keyed_hashes_of(digests: np.ndarray, *, key: bytes) -> np.ndarray:
    """The keyed hash (uint64) of each row of `identity_digests`."""
    out = np.empty(len(digests), dtype=np.uint64)
    for i, digest in enumerate(digests):
        out[i] = int.from_bytes(hashlib.blake2b(digest.tobytes(), key=key, digest_size=8).digest(), "little")
    return out


def example_records(examples: Any, labels: Any = None) -> Iterator[bytes]:
    """Each example's identity as bytes, in row order (see the module docstring)."""
    suffix = _label_bytes(labels)
    if isinstance(examples, (int, np.integer)):
        for i in range(int(examples)):
            yield i.to_bytes(8, "little") + suffix(i)
        return
    from engine.array_data import MappedRows

    if isinstance(examples, MappedRows):
        yield from _mapped_records(examples, suffix)
        return
    rows = examples.detach().cpu().numpy() if hasattr(examples, "detach") else np.asarray(examples)
    rows = np.ascontiguousarray(rows).reshape(len(rows), -1)
    for i in range(len(rows)):
        yield rows[i].tobytes() + suffix(i)


def _label_bytes(labels: Any):
    if labels is None:
        return lambda i: b""
    y = labels.detach().cpu().numpy() if hasattr(labels, "detach") else np.asarray(labels)
    y = np.ascontiguousarray(y.astype("<i8")).tobytes()
    return lambda i: b"|" + y[8 * i : 8 * i + 8]


def _mapped_records(x: Any, suffix) -> Iterator[bytes]:
    source = x.source
    rows = np.arange(source.shape[0]) if x.rows is None else x.rows
    files = getattr(source, "files", None)
    if files is not None:  # an image folder: folder/class/name
        for i, row in enumerate(rows):
            path = Path(files[int(row)])
            yield os.fsencode(f"{path.parent.name}/{path.name}") + suffix(i)
        return
    row_bytes = max(1, math.prod(source.shape[1:]) * 4)
    step = max(1, READ_BYTES // row_bytes)
    for start in range(0, len(rows), step):
        raw = source.read(rows[start : start + step])
        raw = np.ascontiguousarray(raw if raw.dtype.kind != "f" else raw.astype(np.float32, copy=False))
        raw = raw.reshape(len(raw), -1)
        for j in range(len(raw)):
            yield raw[j].tobytes() + suffix(start + j)
