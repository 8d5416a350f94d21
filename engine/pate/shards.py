"""Partition of the private training set into disjoint teacher shards."""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

READ_BYTES = 1 << 25  # raw rows read at a time when inputs read on demand are hashed


def shard_key(seed: int) -> bytes:
    """The 32-byte key of the example hash: a function of the run's seed only, fixed before any data is
    seen. The argument needs a fixed key, not a secret one, so the seed (public) is enough."""
    return np.random.SeedSequence([seed, 0x5A7E]).generate_state(8, dtype=np.uint32).astype("<u4").tobytes()


def teacher_of(examples: Any, num_teachers: int, *, seed: int, labels: Any = None) -> np.ndarray:
    """The teacher of each example (int64, 0..num_teachers-1): a keyed hash (blake2b, `shard_key(seed)`)
    of the example's own identity, mod num_teachers.

    Teacher j's shard is then a function of the examples in it and nothing else: adding or removing
    one example changes exactly one shard, by that example — the add/remove neighbouring relation of
    the PATE analysis. Shard sizes are multinomial (about N/T each, possibly 0 for small N/T); equal
    examples share a teacher. The identity (`example_records`) is:
    - inputs in memory (tensor or array, one row per example): the row's bytes as held, with the label;
    - inputs read on demand from an image folder: the file's path relative to the folder
      ("class/name") with the label. Paths are listed at load already, so this costs no read, where
      the files' bytes would mean reading (and for a check, decoding) the whole folder again;
    - other inputs read on demand (memory-mapped arrays): the row's stored bytes with the label, read
      once, sequentially, READ_BYTES at a time (the data may be larger than memory);
    - an int N: example i is identified by i (for callers whose indices are stable identities).
    """
    if num_teachers < 1:
        raise ValueError(f"num_teachers must be at least 1; got {num_teachers}")
    key = shard_key(seed)
    n = examples if isinstance(examples, (int, np.integer)) else len(examples)
    out = np.empty(int(n), dtype=np.int64)
    for i, record in enumerate(example_records(examples, labels)):
        digest = hashlib.blake2b(record, key=key, digest_size=8).digest()
        out[i] = int.from_bytes(digest, "little") % num_teachers
    return out


def partition(examples: Any, num_teachers: int, *, seed: int, labels: Any = None) -> list[np.ndarray]:
    """Example indices grouped by teacher (`teacher_of`): `num_teachers` disjoint shards, every example
    in exactly one, each shard's indices sorted. A shard may be empty (its teacher votes untrained)."""
    owner = teacher_of(examples, num_teachers, seed=seed, labels=labels)
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=num_teachers)
    return [part.astype(np.int64) for part in np.split(order, np.cumsum(counts)[:-1])]


def example_records(examples: Any, labels: Any = None) -> Iterator[bytes]:
    """Each example's identity as bytes, in row order (see `teacher_of`)."""
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
        raw = np.ascontiguousarray(source.read(rows[start : start + step]))
        raw = raw.reshape(len(raw), -1)
        for j in range(len(raw)):
            yield raw[j].tobytes() + suffix(start + j)


def shard_matrix(shards: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(indices, lengths): shards padded to a (num_teachers, max_size) matrix. Padding is never used
    (positions >= length are masked): it repeats the shard's first index, or row 0 for an empty shard."""
    lengths = np.array([len(s) for s in shards], dtype=np.int64)
    out = np.zeros((len(shards), int(lengths.max(initial=0))), dtype=np.int64)
    for k, s in enumerate(shards):
        out[k, : len(s)] = s
        out[k, len(s):] = s[0] if len(s) else 0
    return out, lengths


def expected_empty_shards(num_examples: int, num_teachers: int) -> float:
    """How many teachers are expected to get no example at all: T (1 - 1/T)^N, from N and T only."""
    if num_teachers <= 1:
        return 0.0
    return num_teachers * math.exp(num_examples * math.log1p(-1.0 / num_teachers))


AS_STORED, SHUFFLED = "as stored", "shuffled"  # how the test split's rows are ordered into pool and held-out


def public_order_for(dataset: str) -> str:
    """A registered dataset with its own test files (MNIST, CIFAR-10, SVHN ...) keeps their published
    order, as the PATE papers use it (the MNIST pool is the first 9,000 test images). Any other test
    split is shuffled: one drawn here lists its rows in file order and a user's test file may be
    sorted too, by class (an image folder always is), which put only the first classes in the pool
    and the queries and only the last ones in the held-out part the student is scored on."""
    from engine.datasets import has_published_test_split

    return AS_STORED if has_published_test_split(dataset) else SHUFFLED


def public_rows(num_test: int, *, order: str, seed: int) -> np.ndarray:
    """The test split's rows in the order PATE uses them: the public pool first (its queries in
    that order), the held-out examples after it. A seeded permutation when `order` is SHUFFLED:
    fixed before any private data is seen, so the queries stay chosen in advance."""
    if order == AS_STORED:
        return np.arange(num_test)
    if order != SHUFFLED:
        raise ValueError(f"unknown public order {order!r}")
    return np.random.default_rng(np.random.SeedSequence([seed, 0x9B1C])).permutation(num_test)
