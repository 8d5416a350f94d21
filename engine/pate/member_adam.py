"""Adam and AdamW for stacked parameters, with one step count per member.

torch's Adam keeps one step count per parameter tensor. On a stacked tensor (a leading member axis,
engine.pate.ensemble) the members would share it, so a member's bias correction 1 - beta^t would count
the steps of its whole group (set by the group's largest shard) instead of its own. `MemberAdam` runs
torch's own Adam update (`torch.optim.adam.adam`, behind both torch.optim.Adam and AdamW) on each
member's slice with that member's own step count, and only for the members that take the step: member
k ends with exactly the weights torch's Adam gives member k trained alone.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.optim.adam import adam


class MemberAdam(torch.optim.Adam):
    """torch.optim.Adam (same arguments, defaults and formula; AdamW with decoupled_weight_decay=True)
    over parameters whose first axis is the member: `step(members=...)` steps only those members,
    each with its own step count (state["step"] has one entry per member); the others are untouched."""

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None, *,
             members: Sequence[int] | np.ndarray | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["differentiable"]:
                raise ValueError("MemberAdam does not support differentiable=True")
            lists: tuple[list[torch.Tensor], ...] = ([], [], [], [], [], [])
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Adam does not support sparse gradients")
                state = self.state[p]
                if not state:
                    on_device = group["fused"] or group["capturable"]
                    state["step"] = torch.zeros(p.shape[0], dtype=torch.float32,
                                                device=p.device if on_device else "cpu")
                    for name in ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ()):
                        state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)
                tensors = (p, p.grad, state["exp_avg"], state["exp_avg_sq"],
                           state.get("max_exp_avg_sq"), state["step"])
                for out, t in zip(lists, tensors):
                    if t is not None:
                        views = t.unbind(0)  # member k's slice of a stacked tensor, as a view
                        out.extend(views if members is None else (views[int(i)] for i in members))
            if not lists[0]:
                continue
            foreach = group["foreach"]
            if foreach is None and not group["fused"]:
                # A tensor per member: torch's per-tensor Python loop would be slow on CPU; its foreach
                # path computes the same numbers (see tests/engine/test_pate_shards.py).
                foreach = True
            beta1, beta2 = group["betas"]
            with _one_thread(lists[0][0].device.type == "cpu"):
                adam(*lists, foreach=foreach, fused=group["fused"], capturable=group["capturable"],
                     differentiable=False, has_complex=any(torch.is_complex(p) for p in lists[0]),
                     grad_scale=getattr(self, "grad_scale", None), found_inf=getattr(self, "found_inf", None),
                     decoupled_weight_decay=group["decoupled_weight_decay"], amsgrad=group["amsgrad"],
                     beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
                     eps=group["eps"], maximize=group["maximize"])
        return loss


class _one_thread:
    """On CPU, the members' slices are stepped on the calling thread only: torch's fused CPU kernel opens a
    parallel region for every tensor however small (and sqrt one for every 2,048 floats), so a tensor per
    member meant thousands of thread hand-offs per step. Measured on 2 busy cores, 24 mnist_cnn teachers:
    a step took 1.1 s with 2 threads, 3 ms with one (torch's fused Adam on the stacked tensors: 1-60 ms).
    torch's thread count is process-wide: for those milliseconds other threads' torch work also runs on
    one thread (a run trains in its own process); the lock keeps concurrent steps from losing the count."""

    _lock = threading.Lock()

    def __init__(self, active: bool):
        self.active = active

    def __enter__(self) -> None:
        if self.active:
            self._lock.acquire()
            self.before = torch.get_num_threads()
            torch.set_num_threads(1)

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            torch.set_num_threads(self.before)
            self._lock.release()


def for_members(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """`optimizer` as an optimizer of stacked members: a fresh torch Adam or AdamW becomes a `MemberAdam`
    with the same settings; any other optimizer is returned as it is (its state is per element, so
    keeping a member's slice unchanged is enough; see engine.pate.teachers._keep_members)."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW) or optimizer.state:
        return optimizer
    groups = [dict(g) for g in optimizer.param_groups]
    return MemberAdam(groups, **optimizer.defaults)
