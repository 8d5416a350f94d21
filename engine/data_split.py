"""How a dataset without its own test split is split, and how a training subset is drawn.

`SPLIT_BY_EXAMPLE` (every run since it exists): an example goes to the test split when its keyed
hash (engine.example_hash, key from the seed) falls below test_fraction, and a training subset of
k examples is the k training examples with the smallest keyed hash (another key). Each decision
depends on the example itself, so adding or removing one example of the data changes the training
split by that example only, and a training subset by at most that example in and one other out.
The privacy guarantee of the training split then carries over to the data as the user gave it.
The test fraction is met on average (the test split's size is binomial, as is each class's share).

`SPLIT_STRATIFIED` (runs recorded before `SPLIT_BY_EXAMPLE`, rebuilt the same way for their audits
and continued runs): exact per-class quotas drawn by a seeded permutation of each class, and a
training subset by a seeded permutation of the whole training split. One example more or less
reshuffles both, so the training split of neighbouring data sets can differ in many examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import ConfigError, DataError
from engine.example_hash import HASH_RANGE, hash_key, identity_digests, keyed_hashes_of

SPLIT_BY_EXAMPLE = "by-example"
SPLIT_STRATIFIED = "stratified"
SPLIT_RULES = (SPLIT_BY_EXAMPLE, SPLIT_STRATIFIED)
_TEST_SIDE, _SUBSET = 0x5E1F, 0x5AB5  # purposes of the two example hashes (engine.example_hash.hash_key)


def split_rule_of(plan: dict[str, Any] | None) -> str:
    """The rule a run's data was split by, from its plan event (runs before the rule was recorded
    used SPLIT_STRATIFIED)."""
    return (plan or {}).get("split_rule") or SPLIT_STRATIFIED


@dataclass(frozen=True)
class SplitRequest:
    """A config's test_fraction and seed, and the rule that turns them into a split."""

    test_fraction: float = 0.2
    seed: int = 0
    rule: str = SPLIT_BY_EXAMPLE

    def __post_init__(self) -> None:
        fraction, seed = self.test_fraction, self.seed
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < float(fraction) < 1.0:
            raise ConfigError("test_fraction",
                              f"{fraction!r} is not allowed; use a number strictly between 0 and 1 (e.g. 0.2)")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError("seed", f"{seed!r} is not allowed; use a whole number >= 0")
        if self.rule not in SPLIT_RULES:
            raise ValueError(f"unknown split rule {self.rule!r}; one of {', '.join(SPLIT_RULES)}")

    @property
    def text(self) -> str:
        """How the split came about, for Dataset.split."""
        kind = "per-example split" if self.rule == SPLIT_BY_EXAMPLE else "stratified split"
        return f"{kind}: test_fraction={self.test_fraction}, seed={self.seed}"

    def draw(self, examples: Any, y: np.ndarray, *, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(train_indices, test_indices, identities): the indices each sorted, of `examples` (rows,
        identified as engine.example_hash says) with labels `y`, and every row's identity digest
        (SPLIT_BY_EXAMPLE; None for SPLIT_STRATIFIED), which the dataset keeps for a training subset.
        A DataError naming `what` when a side is empty."""
        ids = None
        if self.rule == SPLIT_BY_EXAMPLE:
            ids = identity_digests(examples)
            train, test = example_split(ids, test_fraction=self.test_fraction, seed=self.seed)
        else:
            train, test = stratified_split(y, test_fraction=self.test_fraction, seed=self.seed)
        if len(train) == 0 or len(test) == 0:
            raise DataError(f"{what}: {len(y)} examples are too few to split with test_fraction={self.test_fraction} "
                            f"({len(train)} train, {len(test)} test); add examples or change test_fraction")
        return train, test, ids


def example_split(identities: np.ndarray, *, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """SPLIT_BY_EXAMPLE: an example is a test example when the keyed hash of its identity digest
    (engine.example_hash.identity_digests), as a fraction of the hash range, is below test_fraction.
    (train_indices, test_indices), each sorted ascending."""
    share = keyed_hashes_of(identities, key=hash_key(seed, _TEST_SIDE)).astype(np.float64) / HASH_RANGE
    is_test = share < float(test_fraction)
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


def stratified_split(y: np.ndarray, *, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """SPLIT_STRATIFIED: (train_indices, test_indices), each sorted ascending.

    Each class gives floor(n_c * test_fraction) examples to test; the remaining examples needed to
    reach N * test_fraction (rounded half up) go to the classes with the largest fractional remainders (ties by
    class order). A class keeps at least one train example. Within a class, which examples go to
    test is drawn with numpy's PCG64 generator seeded by `seed`.
    """
    y = np.asarray(y)
    n = len(y)
    classes, y_idx = np.unique(y, return_inverse=True)
    counts = np.bincount(y_idx, minlength=len(classes))
    quota = counts * float(test_fraction)
    n_test = np.minimum(np.floor(quota).astype(np.int64), counts - 1)
    wanted = int(math.floor(n * float(test_fraction) + 0.5))
    order = sorted(range(len(classes)), key=lambda c: (-(quota[c] - math.floor(quota[c])), c))
    for c in order:
        if int(n_test.sum()) >= wanted:
            break
        if n_test[c] < counts[c] - 1:
            n_test[c] += 1
    rng = np.random.default_rng(seed)
    train_parts, test_parts = [], []
    for c in range(len(classes)):
        members = rng.permutation(np.flatnonzero(y_idx == c))
        test_parts.append(members[: n_test[c]])
        train_parts.append(members[n_test[c]:])
    train = np.sort(np.concatenate(train_parts)) if train_parts else np.zeros(0, np.int64)
    test = np.sort(np.concatenate(test_parts)) if test_parts else np.zeros(0, np.int64)
    return train, test


def subset_rows(identities: np.ndarray, size: int, *, seed: int) -> np.ndarray:
    """SPLIT_BY_EXAMPLE's training subset: the rows (sorted) of the `size` examples whose identities
    (Dataset.train_identities) have the smallest keyed hash, ties by row."""
    hashes = keyed_hashes_of(identities, key=hash_key(seed, _SUBSET))
    return np.sort(np.argsort(hashes, kind="stable")[:size])


def permuted_subset_rows(num_examples: int, size: int, *, seed: int) -> np.ndarray:
    """SPLIT_STRATIFIED's training subset: the first `size` rows (sorted) of a seeded permutation
    (torch's generator, as runs before SPLIT_BY_EXAMPLE drew it)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(num_examples, generator=generator)[:size].sort().values.numpy()
