"""Where a monotone privacy measure crosses its goal on the integers: shared by the accountants' searches.

Calibrations look for the least noise (sigma = m * tolerance) that meets a target, and budgets
for the most steps within one. Epsilon and an attack's TPR fall with the noise roughly like a
power of it, so the calibrations interpolate their logarithm against log m: a handful of
evaluations where interpolating the values themselves over [0.1, 1000] takes 20-30.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def find_boundary(
    score: Callable[[int], float], goal: float, ok: int, a_ok: float, fail: int, a_fail: float,
    *, log_scale: bool = False,
) -> int:
    """The x next to the crossing on ok's side: score(x) <= goal < score(x') for x' its neighbour towards fail.

    Given score(ok) = a_ok <= goal < score(fail), score monotone from ok to fail (ok may lie
    on either side of fail); a_fail may be math.inf for a `fail` that was not evaluated (e.g.
    one just outside the range searched). Illinois regula falsi, with a bisection step whenever
    two steps did not halve the bracket or a value is not finite. With `log_scale` (x >= 0) the
    interpolation is along log x and wide brackets are bisected geometrically; the scores are
    then usually logarithms too (see log_of). Every x returned was evaluated (or is `ok`) and met the goal.
    """
    if ok == fail:
        raise ValueError(f"ok and fail must differ; got {ok} twice")
    if log_scale and min(ok, fail) < 0:
        raise ValueError(f"log_scale needs x >= 0; got ok={ok}, fail={fail}")
    side, widths = 0, [abs(fail - ok)]
    while abs(fail - ok) > 1:
        a, b = sorted((ok, fail))
        stalled = len(widths) >= 3 and 2 * widths[-1] > widths[-3]
        if stalled or not (math.isfinite(a_ok) and math.isfinite(a_fail) and math.isfinite(goal)) or a_fail <= a_ok:
            wide = log_scale and b > 4 * max(a, 1)
            mid = int(round(math.sqrt(max(a, 1) * b))) if wide else (a + b) // 2
        else:
            share = (goal - a_ok) / (a_fail - a_ok)  # of the way from ok to fail
            if log_scale:
                log_ok, log_fail = math.log(max(ok, 1)), math.log(max(fail, 1))
                mid = int(round(math.exp(log_ok + share * (log_fail - log_ok))))
            else:
                mid = ok + int(round(share * (fail - ok)))
        mid = min(max(mid, a + 1), b - 1)
        value = score(mid)
        if value <= goal:
            ok, a_ok = mid, value
            if side == 1:
                a_fail = goal + (a_fail - goal) / 2.0
            side = 1
        else:
            fail, a_fail = mid, value
            if side == -1:
                a_ok = goal - (goal - a_ok) / 2.0
            side = -1
        widths.append(abs(fail - ok))
    return ok


def log_of(value: float) -> float:
    """log(value) for a score searched on the log scale; -inf for 0 (order kept: 0 meets any goal)."""
    return math.log(value) if value > 0.0 else -math.inf
