"""Live privacy-cost preview: what the settings imply, computed off the GUI thread.

The numbers come from the engine's pure privacy functions (numpy/scipy, no torch):
DP-SGD: the epsilon the noise multiplier reaches after the planned steps, or the noise
multiplier a target epsilon calls for; PATE: the data-independent bound if every query were
answered. Requests are debounced, and a result that arrives after newer input is dropped.
"""

from __future__ import annotations

import atexit
import functools
import math
from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, QTimer, Signal

from engine import rounding
from engine.config import RunConfig
from workbench.form_state import DataSize

DEBOUNCE_MS = 250


def estimate(config: RunConfig, size: DataSize) -> str:
    """One or two lines of text for the preview (runs in a worker thread)."""
    about = "" if size.exact else "≈ "
    if config.mechanism == "none":
        return "Non-private baseline: no privacy guarantee (ε = ∞)."
    if config.mechanism == "pate":
        return _pate(config, size)
    from engine.privacy.accountants import calibrate_noise_multiplier, dpsgd_epsilon, max_steps_within_budget

    q = config.sample_rate_for(size.num_train)
    steps = config.steps_for(size.num_train)
    plan = f"N {about}{size.num_train:,}, sampling rate q = {q:.4g}, {steps:,} steps"
    if config.noise_multiplier is not None:
        sigma = config.noise_multiplier
        eps = dpsgd_epsilon(sample_rate=q, noise_multiplier=sigma, steps=steps, delta=config.delta,
                            accountant=config.accountant).value
        text = f"ε = {rounding.up(eps, '.3g')} at δ = {config.delta:g} after training ({config.accountant}); {plan}."
        if eps == float("inf"):
            text += "\nThis noise bounds nothing (no finite ε): raise the noise multiplier or set a target ε."
    elif config.target_attack_tpr is not None:
        from engine.privacy.risk import calibrate_noise_multiplier_for_attack

        try:
            sigma = calibrate_noise_multiplier_for_attack(
                sample_rate=q, steps=steps, target_tpr=config.target_attack_tpr, fpr=config.target_attack_fpr)
        except ValueError as exc:
            return f"Cannot calibrate: {exc}"
        eps = dpsgd_epsilon(sample_rate=q, noise_multiplier=sigma, steps=steps, delta=config.delta,
                            accountant=config.accountant).value
        text = (f"Noise multiplier σ = {rounding.up(sigma, '.3f')} keeps any membership attack at "
                f"TPR ≤ {config.target_attack_tpr:g} at FPR {config.target_attack_fpr:g} "
                f"(ε = {rounding.up(eps, '.3g')} at δ = {config.delta:g}, {config.accountant}); {plan}.")
    else:
        try:
            sigma = calibrate_noise_multiplier(sample_rate=q, steps=steps, target_epsilon=config.target_epsilon,
                                               delta=config.delta, accountant=config.accountant)
        except ValueError as exc:
            return f"Cannot calibrate: {exc}"
        text = (f"Noise multiplier σ = {rounding.up(sigma, '.3f')} reaches ε = {config.target_epsilon:g} at δ = {config.delta:g} "
                f"({config.accountant}); {plan}.")
    if config.epsilon_budget is not None:
        allowed = max_steps_within_budget(sample_rate=q, noise_multiplier=sigma, delta=config.delta,
                                          budget=config.epsilon_budget, accountant=config.accountant, upper=steps)
        if allowed < steps:
            text += f"\nThe budget ε = {config.epsilon_budget:g} stops training after {allowed:,} of {steps:,} steps."
            steps = allowed
    statistics = config.normalization_noise_multiplier if config.normalization == "dp" else None
    return text + "\n" + attacker_line(config, _dpsgd_tpr_at_1_percent(q, sigma, steps, statistics))


NO_BOUND = "No bound on any attack"  # how attacker_line starts for a run without a guarantee


def attacker_line(config: RunConfig, tpr_at_1_percent: float) -> str:
    """The bound in an attacker's terms, or why the run would have none (engine.publication)."""
    from engine.attack_risk import preview_statement
    from engine.publication import no_guarantee_reason

    reason = no_guarantee_reason({"mechanism": config.mechanism, "config": config.to_dict()})
    if reason is not None:
        return f"{NO_BOUND}: {reason}."

    return preview_statement(tpr_at_1_percent)


@functools.lru_cache(maxsize=128)
def _dpsgd_tpr_at_1_percent(sample_rate: float, noise_multiplier: float, steps: int,
                            statistics_noise_multiplier: float | None) -> float:
    """TPR bound at FPR 1% of DP-SGD (engine.attack_risk.dpsgd_profile; 0.1-0.5 s, so cached: typing a
    value back costs nothing)."""
    from engine.attack_risk import dpsgd_profile
    from engine.privacy.risk import highest_tpr

    profile, _ = dpsgd_profile(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps,
                               statistics_noise_multiplier=statistics_noise_multiplier)
    return float(highest_tpr(profile=profile, fpr=[0.01])[0])


@functools.lru_cache(maxsize=128)
def _pate_tpr_at_1_percent(config_items: tuple) -> float:
    """TPR bound at FPR 1% of PATE's data-independent bound if every query were answered."""
    from engine.attack_risk import pate_data_independent_rdp
    from engine.privacy.risk import highest_tpr, rdp_privacy_profile

    config = dict(config_items)
    queries = config["num_queries"]
    orders, curve = pate_data_independent_rdp({"config": config, "summary": {"queries": queries,
                                                                             "answered": queries}})
    return float(highest_tpr(profile=rdp_privacy_profile(orders=orders, rdp=curve), fpr=[0.01])[0])


def _pate(config: RunConfig, size: DataSize) -> str:
    """The guarantee a PATE run will state: the data-independent epsilon of answering every query (the
    data-dependent one is usually far smaller, but is known only once the teachers vote and is then
    shown only as a released estimate, not a bound)."""
    from engine.pate.aggregation import planned_epsilon_data_independent

    eps = planned_epsilon_data_independent(config)
    shard = size.num_train // config.num_teachers
    value = "∞" if math.isinf(eps) else rounding.up(eps, ".3g")
    keys = ("aggregator", "num_queries", "gnmax_sigma", "sigma1", "sigma2", "laplace_scale")
    tpr = _pate_tpr_at_1_percent(tuple((k, getattr(config, k)) for k in keys))
    attacker = attacker_line(config, tpr)
    return (f"Guarantee if all {config.num_queries:,} queries were answered: ε ≤ {value} at δ = {config.delta:g} "
            "(data-independent; the data-dependent ε, usually much smaller, is shown after the run as an "
            "estimate, not a bound).\n"
            f"{config.num_teachers:,} teachers of about {shard:,} examples each.\n"
            + (attacker if attacker.startswith(NO_BOUND) else attacker.removesuffix(".") +
               " (if every query were answered)."))


class _Signals(QObject):
    done = Signal(int, str)


# Jobs being run, kept alive here until they end: a form deleted meanwhile (a window that never
# opened) must not take the Python object of a job the thread pool is still running with it; and
# the interpreter waits for them before it ends (a job cut off by the interpreter's end aborts).
_RUNNING: set["_Job"] = set()


@atexit.register
def _wait_for_running_jobs() -> None:
    for job in list(_RUNNING):
        try:
            job.pool.waitForDone(30_000)
        except RuntimeError:  # its pool is gone, and with it the job
            pass


class _Job(QRunnable):
    def __init__(self, generation: int, config: RunConfig, size: DataSize, signals: _Signals):
        super().__init__()
        self.generation, self.config, self.size, self.signals = generation, config, size, signals

    def run(self) -> None:
        try:
            text = estimate(self.config, self.size)
        except Exception as exc:  # the preview never takes the window down
            text = f"No estimate: {exc}"
        try:
            self.signals.done.emit(self.generation, text)
        except Exception:  # the form was deleted meanwhile (a window that never opened): nobody to tell
            pass
        finally:
            _RUNNING.discard(self)


class CostPreview(QObject):
    """Debounced estimates; `ready(text, is_estimate)` carries the newest one (is_estimate False: the
    text says why there is none)."""

    ready = Signal(str, bool)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.pool = QThreadPool(self)
        self.pool.setMaxThreadCount(1)
        self._signals = _Signals(self)
        self._signals.done.connect(self._done)
        self._generation = 0
        self._pending: tuple[Any, Any] | None = None
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(DEBOUNCE_MS)
        self._timer.timeout.connect(self._launch)
        self.busy = False
        self._jobs: list[_Job] = []

    def request(self, config: RunConfig | None, size: DataSize | None, reason: str = "") -> None:
        self._generation += 1
        if config is None or size is None:
            self._timer.stop()
            self._pending = None
            self.ready.emit(reason, False)
            return
        self._pending = (config, size)
        self._timer.start()

    def _launch(self) -> None:
        if self._pending is None:
            return
        config, size = self._pending
        self._pending = None
        self.busy = True
        job = _Job(self._generation, config, size, self._signals)
        job.pool = self.pool
        job.setAutoDelete(False)  # Python owns the job: Qt deleting a Python QRunnable is unsafe
        self._jobs.append(job)
        _RUNNING.add(job)
        self.pool.start(job)

    def _done(self, generation: int, text: str) -> None:
        self.busy = False
        self._jobs = [job for job in self._jobs if job.generation > generation]
        if generation == self._generation:
            self.ready.emit(text, True)
