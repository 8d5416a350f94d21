"""Small immutable results returned by the privacy accountants."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Epsilon:
    """An (epsilon, delta)-DP guarantee: `value` is an upper bound on epsilon at `delta`.

    `accountant` names the analysis that produced it ("rdp" or "pld"); `order` is the
    Renyi order at which the RDP conversion attained its minimum (None for "pld").
    """

    value: float
    delta: float
    accountant: str
    order: float | None = None
