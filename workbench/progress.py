"""What the dashboard's progress bar says, without Qt: steps done against the step the run will really
stop at (the budget stop, `steps_allowed`, when it comes before `steps_planned`), and the time left to it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from workbench.run_data import RunData


@dataclass(frozen=True)
class Progress:
    done: int
    maximum: int  # 0: nothing to count (the bar stays empty)
    text: str
    tooltip: str = ""


def last_step(data: RunData) -> int:
    """The newest training step any curve has reached (progress events come at most twice a second,
    curves every step: the header's step and the bar use this same number)."""
    steps = [int(s.x[-1]) for s in (*data.metrics.values(), *data.privacy.values()) if len(s)]
    return max(steps, default=0)


def shown_phase(data: RunData) -> str:
    """The phase the dashboard shows: the current one, except that a DP-SGD run that ended during its
    canary audit (a moment after its last step) shows its training, which is what it did."""
    if data.finished and data.phase == "auditing" and data.mechanism != "pate":
        return "training"
    return data.phase


def planned_total(data: RunData) -> int:
    """The shown phase's total: the current phase's, or the planned training steps after an audit."""
    if shown_phase(data) != data.phase:
        return int(data.plan.get("steps") or 0)
    return data.total


def stop_step(data: RunData) -> int:
    """The step training ends at: the budget stop when it comes first, else the planned steps."""
    allowed = data.plan.get("steps_allowed")
    total = planned_total(data)
    if total and isinstance(allowed, int) and 0 < allowed < total:
        return allowed
    return total


def progress(data: RunData) -> Progress:
    """The bar of `data`'s current phase. A run that ended without a step shows an empty bar."""
    training = shown_phase(data) == "training" and data.mechanism != "pate"
    done = max(data.done, last_step(data)) if training else data.done
    maximum = stop_step(data) if training else data.total
    tooltip = ""
    if training and maximum < planned_total(data):
        tooltip = (f"The ε budget stops training at step {maximum:,} of the {planned_total(data):,} planned "
                   f"(steps_allowed).")
    if data.finished:
        if done <= 0:
            return Progress(0, 0, f"{data.status}: no step done", tooltip)
        maximum = max(maximum, done)
        return Progress(done, maximum, f"{done:,} / {maximum:,}" + (f" ({data.status})" if data.status else ""),
                        tooltip)
    if maximum <= 0:
        return Progress(0, 0, "", tooltip)
    done = min(done, maximum)
    return Progress(done, maximum, f"{done:,} / {maximum:,}", tooltip)


def seconds_left(data: RunData, now: float | None = None) -> float | None:
    """Time left until the phase ends, counting a budget stop, from this phase's pace so far."""
    if data.phase_started is None or data.finished:
        return None
    training = data.phase == "training" and data.mechanism != "pate"
    done = max(data.done, last_step(data)) if training else data.done
    target = stop_step(data) if training else data.total
    counted = done - data.phase_done_at_start
    if target <= 0 or counted <= 0:
        return None
    elapsed = (time.monotonic() if now is None else now) - data.phase_started
    return max(elapsed / counted * (target - done), 0.0)
