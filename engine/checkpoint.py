"""Checkpoints of a training run, and continuing a run that ended early from its last one.

A DP-SGD (or non-private) run writes `checkpoint.pt` beside its saved model at every evaluation, at
least every CHECKPOINT_EVERY_S seconds of training between them, and when training ends, however it
ends: the weights, the optimizer's state and the step count (a `--nproc` run: rank 0's, every rank
holding the same weights). A run that was stopped, or that failed part-way (killed, out of memory,
the machine went down), can then be continued (`dpw resume RUN`, in one process or with --nproc in
several) as a new run from that step instead of from the start.

The privacy side: a checkpoint holds only what DP-SGD released up to its step (the noisy model and
what the optimizer derived from it), so continuing from it is post-processing plus more steps. The
continued run's own epsilon is that of every step its model took, both runs' together (the same q
and sigma, so one subsampled Gaussian of all the steps); the dataset's ledger counts the first run's
recorded steps (those after its last checkpoint too: they were taken and are spent) and the new
run's own. Batches and noise of the continued steps come from fresh secret randomness.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import DPWError

if TYPE_CHECKING:  # torch is imported where a checkpoint is written or read: the window never needs it
    import torch

CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINT_EVERY_S = 300.0  # the most training a kill loses when evaluations are further apart than this
FORMAT = 1


class CannotResume(DPWError):
    """A run that cannot be continued, with the reason for a person."""


def save_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Write the checkpoint whole or not at all: a temporary file, flushed to disk, then renamed over
    the old one (a kill or a full disk mid-write leaves the previous checkpoint)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"format": FORMAT, "step": int(step),
             "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
             "optimizer": _to_cpu(optimizer.state_dict())}
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint at `path` (weights only: no code runs while it is read)."""
    import torch

    if not path.is_file():
        raise CannotResume(f"{path}: no checkpoint there", hint="a run writes one at each evaluation, every "
                           "5 minutes of training and at its end; start the run again instead")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a damaged or foreign file, whatever torch says of it
        raise CannotResume(f"{path}: cannot be read as a checkpoint ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:200]})", hint="start the run again instead") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CannotResume(f"{path}: not a checkpoint this version writes", hint="start the run again instead")
    return state


def apply_checkpoint(state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Put the checkpoint's weights and optimizer state into a freshly built model and optimizer."""
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise CannotResume(f"the checkpoint does not fit the run's model ({str(exc).splitlines()[0][:200]})",
                           hint="the config must be the first run's; start the run again instead") from None


def resume_problem(parent: dict[str, Any]) -> str | None:
    """Why the stored run `parent` cannot be continued (None when it can), from its row alone."""
    config = parent.get("config") or {}
    ref = f"run {parent['id']}"
    if parent.get("status") not in ("stopped", "failed"):
        return f"{ref} is {parent.get('status')}: only a stopped or failed run is continued"
    if parent.get("mechanism") not in ("dpsgd", "none"):
        return f"{ref} is a {parent.get('mechanism')} run: only DP-SGD and non-private runs are continued"
    if parent.get("stop_reason") == "budget":
        return f"{ref} stopped at its epsilon budget: more steps would exceed it"
    if config.get("audit_canaries"):
        return f"{ref} trained with audit canaries: their audit needs one whole run"
    if config.get("normalization") == "dp":
        return (f"{ref} released DP feature statistics before training: a continued run would release "
                "them again")
    if parent.get("study_id") is not None:
        return f"{ref} is a candidate of study {parent['study_id']}: a study's runs are not continued one by one"
    return None


def resume_refusal(run: dict[str, Any], *, continued_by: list[dict[str, Any]], checkpoint: Path
                   ) -> CannotResume | None:
    """Why `dpw resume` (the window's Continue run) cannot take `run`, None when it can: the kind of
    run, a continuation in the way (`continued_by`: those of `in_the_way`), or no checkpoint at `checkpoint`."""
    problem = resume_problem(run)
    if problem:
        return CannotResume(problem, hint="start a new run instead")
    ref = f"run {run['id']}"
    if continued_by:
        later = continued_by[-1]
        if later.get("status") in ("queued", "running"):
            return CannotResume(f"{ref} is being continued by run {later['id']} ({later['status']})",
                                hint=f"wait for run {later['id']} to end")
        return CannotResume(f"{ref} was already continued by run {later['id']} ({later.get('status')}), which "
                            "holds its later steps", hint=f"continue run {later['id']} instead, or start a new run")
    if not checkpoint.is_file():
        return CannotResume(f"{ref} kept no checkpoint (it ended before its first one was written)",
                            hint="start a new run instead")
    return None


def in_the_way(continuations: list[dict[str, Any]], *, store: Any) -> list[dict[str, Any]]:
    """Of the runs that continue a run (store rows), those a new continuation of it would compete with:
    one queued or running, one that finished its training, one that kept a checkpoint (continuing it
    goes further). One that was stopped or failed before its first checkpoint is not in the way: the
    steps it took are counted as its own in the ledger, and it left nothing to continue from."""
    from engine.runner import checkpoint_of

    return [c for c in continuations
            if c.get("status") in ("queued", "running", "finished") or checkpoint_of(store, c["id"]).is_file()]


def continue_refusal(run: dict[str, Any], *, store: Any, continuations: list[dict[str, Any]]) -> CannotResume | None:
    """Why `dpw resume` cannot take `run` (resume_refusal), None when it can, given the runs that
    continue it, its checkpoint looked for in `store`'s folder."""
    from engine.runner import checkpoint_of

    return resume_refusal(run, continued_by=in_the_way(continuations, store=store),
                          checkpoint=checkpoint_of(store, run["id"]))


def can_continue(run: dict[str, Any], *, store: Any, continuations: list[dict[str, Any]]) -> bool:
    """Whether `dpw resume` can take `run` (continue_refusal)."""
    return continue_refusal(run, store=store, continuations=continuations) is None


def _to_cpu(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value
