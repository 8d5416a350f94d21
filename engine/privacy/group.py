"""Group privacy: what an (epsilon, delta) guarantee for one example says about k examples at once.

Dwork and Roth 2014, "The Algorithmic Foundations of Differential Privacy", Theorem 2.2 (and the
remark after it): an (epsilon, delta)-DP mechanism is (k epsilon, k e^((k-1) epsilon) delta)-DP for
datasets that differ in k examples. The delta term grows exponentially with k: a person with several
training rows can be left with no guarantee at all (delta >= 1) long before k epsilon looks large.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GroupBound", "group_bound"]


@dataclass(frozen=True)
class GroupBound:
    """The guarantee for a group of `group_size` examples; `vacuous` when delta >= 1 (it bounds nothing)."""

    group_size: int
    epsilon: float
    delta: float

    @property
    def vacuous(self) -> bool:
        return self.delta >= 1.0


def group_bound(*, epsilon: float, delta: float, group_size: int) -> GroupBound:
    """(k epsilon, k e^((k-1) epsilon) delta) for k = `group_size` >= 1 (Dwork and Roth 2014, Thm 2.2)."""
    k = int(group_size)
    if k < 1 or k != group_size:
        raise ValueError(f"group_size must be a whole number of examples >= 1; got {group_size!r}")
    if not (epsilon >= 0.0 and 0.0 <= delta <= 1.0):
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1]; got epsilon={epsilon!r}, delta={delta!r}")
    exponent = (k - 1) * epsilon
    scaled = k * delta * math.exp(exponent) if exponent < 700 else (math.inf if delta > 0 else 0.0)
    return GroupBound(k, k * epsilon, scaled)
