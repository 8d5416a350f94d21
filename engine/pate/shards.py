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
