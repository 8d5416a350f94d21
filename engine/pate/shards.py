"""Partition of the private training set into disjoint teacher shards."""

from __future__ import annotations

import numpy as np


def partition(num_examples: int, num_teachers: int, *, seed: int) -> list[np.ndarray]:
    """Split example indices 0..num_examples-1 into `num_teachers` disjoint shards.

    A seeded random permutation cut into nearly equal parts (sizes differ by at most one): every
    example is in exactly one shard, so one example influences exactly one teacher — the
    neighbouring relation of the PATE analysis. Each shard's indices are sorted.
    """
    if num_teachers < 1 or num_examples < num_teachers:
        raise ValueError(
            f"cannot split {num_examples} examples into {num_teachers} non-empty shards; "
            f"need 1 <= num_teachers <= num_examples"
        )
    perm = np.random.default_rng(np.random.SeedSequence([seed, 0x5A7E])).permutation(num_examples)
    return [np.sort(part) for part in np.array_split(perm, num_teachers)]


def shard_matrix(shards: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(indices, lengths): shards padded to a (num_teachers, max_size) matrix (padding repeats the
    shard's first index and is never used: positions >= length are masked)."""
    lengths = np.array([len(s) for s in shards], dtype=np.int64)
    out = np.empty((len(shards), int(lengths.max())), dtype=np.int64)
    for k, s in enumerate(shards):
        out[k, : len(s)] = s
        out[k, len(s):] = s[0]
    return out, lengths


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
