"""Partition of the private training set into disjoint teacher shards."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.example_hash import hash_key, keyed_hashes


def shard_key(seed: int) -> bytes:
    """The key of the example hash that deals examples to teachers (engine.example_hash.hash_key)."""
    return hash_key(seed, 0x5A7E)


def teacher_of(examples: Any, num_teachers: int, *, seed: int, labels: Any = None) -> np.ndarray:
    """The teacher of each example (int64, 0..num_teachers-1): its keyed hash (engine.example_hash,
    `shard_key(seed)`) mod num_teachers.

    Teacher j's shard is then a function of the examples in it and nothing else: adding or removing
    one example changes exactly one shard, by that example — the add/remove neighbouring relation of
    the PATE analysis. Shard sizes are multinomial (about N/T each, possibly 0 for small N/T); equal
    examples share a teacher. `examples` and `labels` identify each example as
    engine.example_hash.example_records says.
    """
    if num_teachers < 1:
        raise ValueError(f"num_teachers must be at least 1; got {num_teachers}")
    return (keyed_hashes(examples, key=shard_key(seed), labels=labels) % np.uint64(num_teachers)).astype(np.int64)


def partition(examples: Any, num_teachers: int, *, seed: int, labels: Any = None) -> list[np.ndarray]:
    """Example indices grouped by teacher (`teacher_of`): `num_teachers` disjoint shards, every example
    in exactly one, each shard's indices sorted. A shard may be empty (its teacher votes untrained)."""
    owner = teacher_of(examples, num_teachers, seed=seed, labels=labels)
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=num_teachers)
    return [part.astype(np.int64) for part in np.split(order, np.cumsum(counts)[:-1])]


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
