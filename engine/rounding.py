"""Bounds as text, rounded toward the safe side: an upper bound (an epsilon, a delta, an attack's
TPR) up, a lower bound (the epsilon an audit proves) down. Rounded to nearest, an epsilon of 2.3114
shown as "2.31" states a guarantee stronger than the one proven.

The value is read as the shortest decimal that gives it back (its repr): the last bits of a float
are below any accountant's precision, and 0.1 stays "0.1".
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal

_EXACT = Context(prec=800)  # every digit of any float at ".Nf": 1e308 has 309 before the point


def up(value: float, spec: str) -> str:
    """`format(value, spec)` with the last digit shown rounded up: up(2.3114, ".3g") == "2.32",
    up(1.91025, ".4f") == "1.9103". `spec`: ".Nf" (N decimals) or ".Ng" (N significant digits)."""
    return _rounded(value, spec, ROUND_CEILING)


def down(value: float, spec: str) -> str:
    """`format(value, spec)` with the last digit shown rounded down, for a lower bound."""
    return _rounded(value, spec, ROUND_FLOOR)


def _rounded(value: float, spec: str, rounding: str) -> str:
    value = float(value)
    if not math.isfinite(value) or value == 0.0:
        return format(value, spec)
    kind, digits = spec[-1], int(spec.lstrip(".")[:-1] or 6)
    exact = Decimal(repr(value))
    if kind == "f":
        quantum = Decimal(1).scaleb(-digits)
    elif kind == "g":
        quantum = _significant_quantum(exact, digits)
    else:
        raise ValueError(f"format {spec!r}: only .Nf and .Ng are rounded as bounds")
    return format(float(exact.quantize(quantum, rounding=rounding, context=_EXACT)), spec)


def bound_cell(value: float | None, spec: str) -> str | None:
    """An upper bound (an epsilon, a delta) in a table: rounded up, "∞" where no finite bound holds,
    None where there is none (the table shows its own blank)."""
    if value is None:
        return None
    return "∞" if math.isinf(value) else up(value, spec)


def significant_up(value: float, digits: int = 2) -> str:
    """An upper bound to `digits` significant digits in plain notation, rounded up: 0.0412 -> "0.042",
    4 -> "4.0", 99.91 -> "100", 412 -> "420"."""
    return _plain(Decimal(repr(float(value))), digits, ROUND_CEILING)


def percent_up(x: float, digits: int = 2) -> str:
    """A probability bound as a percentage, rounded up and capped at "100%": 0.0412 -> "4.2%". Scaled in
    decimal, so 0.041 stays "4.1%" (100 * 0.041 in floats is 4.1000000000000005)."""
    return _percent_bound(x, digits, ROUND_CEILING)


def percent_down(x: float, digits: int = 2) -> str:
    """A lower bound on a probability as a percentage, rounded down: 0.0419 -> "4.1%"."""
    return _percent_bound(x, digits, ROUND_FLOOR)


def _percent_bound(x: float, digits: int, rounding: str) -> str:
    x = float(x)
    if math.isnan(x):
        return "nan%"
    if x >= 1.0:
        return "100%"
    return f"{_plain(Decimal(repr(x)) * 100, digits, rounding)}%" if x > 0 else "0%"


def _plain(exact: Decimal, digits: int, rounding: str) -> str:
    if not exact.is_finite() or exact <= 0:
        return f"{float(exact):g}"
    rounded = exact.quantize(_significant_quantum(exact, digits), rounding=rounding, context=_EXACT)
    return format(rounded, "f")


def _significant_quantum(exact: Decimal, digits: int) -> Decimal:
    """The place of the last of `digits` significant digits of `exact` (0.01 for 4.123 at 3 digits)."""
    return Decimal(1).scaleb(exact.adjusted() - max(digits, 1) + 1)


def percent(x: float) -> str:
    """A probability given as a level, not a bound (an FPR of 0.01 is "1%", a prior of 0.5 "50%")."""
    return f"{100 * x:g}%"
