"""PATE teacher groups trained and queried as Ray tasks (`teachers_backend = "ray"`).

The same groups as `engine.pate.teachers.train_teachers` (same group size, same members, same
per-group shuffling generator), each trained by `train_group` inside a Ray task (on the workers'
CPUs), so the same seed gives the same teachers as the local backend. Training inputs held in memory
go into Ray's object store once (`ray.put`) and each task gathers its own group's shards from them;
inputs read on demand (engine.array_data) are gathered on the driver a group at a time instead. A trained group stays
in the object store; voting runs as one task per group and only the predicted classes come back.

Privacy: nothing secret leaves the driver. Workers see the private training data (as the local
process does) but never the run's `PrivateRandomness`: the aggregation noise is drawn on the
driver from the votes the tasks return (engine.pate.run). The teachers live in Ray's object store,
so the cluster is inside the same trust boundary as the run's own process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from engine.errors import ConfigError, DPWError
from engine.pate.shards import shard_matrix
from engine.pate.teachers import (
    ACTIVATION_BUDGET, MakeOptimizer, OnEpoch, TrainedGroup, gather_shards, group_size_for, largest_activation,
    train_group,
)

WAIT_SECONDS = 0.2  # how often the driver checks should_stop while tasks run
INSTALL_HINT = "install the cluster extra: pip install 'dp-workbench[cluster]' (or set teachers_backend = \"local\")"


def import_ray() -> Any:
    """The `ray` module, or a one-line ConfigError naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise ConfigError("teachers_backend", "is 'ray' but Ray is not installed", hint=INSTALL_HINT) from None
    return ray


class RaySession:
    """Connects to `address` (an existing cluster) or starts a Ray on this machine; `close()` shuts
    down only a Ray this session started or connected (an already initialised Ray is left as is)."""

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None):
        self.ray = import_ray()
        self.owned = not self.ray.is_initialized()
        if self.owned:
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address is None and num_cpus is not None:
                kwargs["num_cpus"] = num_cpus
            try:
                self.ray.init(address=address, **kwargs)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError("ray_address", f"cannot connect to Ray at {address!r}: {exc}".splitlines()[0],
                                  hint="start the cluster (ray start --head) or leave ray_address unset") from None

    def close(self) -> None:
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()
        self.owned = False


def _train_group_task(x: np.ndarray, y: np.ndarray, index: np.ndarray | None, lengths: np.ndarray,
                      members: list[nn.Module], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """In a worker: gather this group's shards from the shared arrays (or take the shards already
    gathered, `index` None) and train it."""
    if index is None:
        xs, ys = torch.from_numpy(x.copy()), torch.from_numpy(y.copy())  # the object store's arrays are read-only
    else:
        xs, ys = torch.from_numpy(x[index]), torch.from_numpy(y[index])  # fancy indexing copies
    group: TrainedGroup = train_group(members, xs, ys, lengths, **kwargs)
    return group.ensemble, {"loss_sums": group.loss_sums, "epochs_done": group.epochs_done}


def _predict_task(ensemble: nn.Module, x: np.ndarray, activation: int) -> np.ndarray:
    """In a worker: each member's predicted class for each example, (members, examples) int16 (a
    quarter of int64's bytes to send back; classes < 32,768)."""
    chunk = max(1, ACTIVATION_BUDGET // (ensemble.num_members * activation))
    ensemble.eval()
    xt = torch.from_numpy(x)
    with torch.no_grad():
        parts = [ensemble.forward_shared(xt[s : s + chunk]).argmax(-1) for s in range(0, len(xt), chunk)]
    return torch.cat(parts, dim=1).to(torch.int16).numpy()


@dataclass
class RayTeachers:
    """Trained teachers held in Ray's object store: one reference per stacked group, in teacher order.
    The same surface as `engine.pate.teachers.Teachers` where a PATE run uses it."""

    session: RaySession
    group_refs: list[Any]
    group_sizes: list[int]
    model_name: str
    num_classes: int
    shard_sizes: np.ndarray
    seconds: float
    epochs_done: int
    train_loss: list[float] = field(default_factory=list)
    activation: int = 1

    @property
    def num_teachers(self) -> int:
        return sum(self.group_sizes)

    def predict(self, x: torch.Tensor, *, should_stop: Callable[[], bool] = lambda: False) -> torch.Tensor:
        """Each teacher's predicted class for each example: shape (teachers, examples), int64. One
        task per group; the examples go into the object store once."""
        ray = self.session.ray
        task = ray.remote(_predict_task)
        x_ref = ray.put(np.ascontiguousarray(x.detach().cpu().numpy()))
        refs = [task.remote(g, x_ref, self.activation) for g in self.group_refs]
        _wait_all(ray, refs, should_stop, on_done=None)
        return torch.from_numpy(np.concatenate(ray.get(refs), axis=0).astype(np.int64))

    def groups(self) -> list[nn.Module]:
        """The trained stacked groups, fetched to this process (tests and comparisons)."""
        return self.session.ray.get(self.group_refs)

    def member_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        for ref, size in zip(self.group_refs, self.group_sizes):
            if k < size:
                return self.session.ray.get(ref).member_state_dict(k)
            k -= size
        raise IndexError(k)

    def close(self) -> None:
        """Drop the teachers from the object store and shut down a Ray this run started."""
        self.group_refs = []
        self.session.close()


def _wait_all(ray: Any, refs: list[Any], should_stop: Callable[[], bool],
              on_done: Callable[[Any], None] | None) -> None:
    """Wait for every task, calling `on_done(ref)` as each finishes; on `should_stop()` cancel the
    rest and raise InterruptedError. A failed task is one DPWError line naming the backend."""
    pending = list(refs)
    while pending:
        if should_stop():
            for ref in pending:
                ray.cancel(ref)
            raise InterruptedError
        ready, pending = ray.wait(pending, num_returns=1, timeout=WAIT_SECONDS)
        for ref in ready:
            try:
                if on_done is not None:
                    on_done(ref)
                else:
                    ray.get(ref)
            except ray.exceptions.RayError as exc:
                for other in pending:
                    ray.cancel(other)
                cause = str(getattr(exc, "cause", None) or exc).strip().splitlines()
                raise DPWError(f"a teacher task failed on Ray: {cause[-1] if cause else type(exc).__name__}",
                               hint="see the Ray worker logs, or set teachers_backend = \"local\"") from None


def train_teachers_on_ray(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    shards: Sequence[np.ndarray],
    *,
    epochs: int,
    batch_size: int,
    make_optimizer: MakeOptimizer,
    seed: int,
    session: RaySession,
    on_epoch: OnEpoch | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    vectorize: str = "auto",
    group_size: int | None = None,
    model_name: str = "",
) -> RayTeachers:
    """Train the teachers as `train_teachers` does, one Ray task per stacked group (on CPU in the
    workers). `on_epoch(done, total, loss)` is called for each epoch of a group when the group
    finishes; `should_stop()` cancels the tasks not yet finished and returns what was trained."""
    if len(models) != len(shards):
        raise ValueError(f"{len(models)} models for {len(shards)} shards")
    ray = session.ray
    t0 = time.monotonic()
    size = group_size or group_size_for(models[0], tuple(x.shape[1:]), batch_size, len(models))
    starts = list(range(0, len(models), size))
    total = len(starts) * epochs
    # Inputs in memory go into the object store once; inputs read on demand (engine.array_data) are
    # gathered here a group at a time, so only the teachers' shards are ever in memory.
    in_memory = isinstance(x, torch.Tensor)
    if in_memory:
        x_ref = ray.put(np.ascontiguousarray(x.detach().cpu().numpy()))
        y_ref = ray.put(np.ascontiguousarray(y.detach().cpu().numpy()))
    task = ray.remote(num_returns=2)(_train_group_task)
    group_refs, stats_refs, sizes = [], [], []
    for start in starts:
        index, lengths = shard_matrix(list(shards[start : start + size]))
        kwargs = {"first_teacher": start, "epochs": epochs, "batch_size": batch_size,
                  "make_optimizer": make_optimizer, "seed": seed, "vectorize": vectorize}
        if in_memory:
            inputs = (x_ref, y_ref, index)
        else:
            xs, ys = gather_shards(x, y, index)
            inputs = (ray.put(xs.numpy()), ray.put(ys.numpy()), None)
        group_ref, stats_ref = task.remote(*inputs, lengths, list(models[start : start + size]), kwargs)
        group_refs.append(group_ref)
        stats_refs.append(stats_ref)
        sizes.append(len(index))
    losses = np.zeros(epochs)
    done = [0]

    def on_group(ref: Any) -> None:
        stats = ray.get(ref)
        k = sizes[stats_refs.index(ref)]
        for epoch, loss_sum in enumerate(stats["loss_sums"]):
            losses[epoch] += loss_sum
            done[0] += 1
            if on_epoch is not None:
                on_epoch(done[0], total, loss_sum / k)

    epochs_done, kept = epochs, len(group_refs)
    try:
        _wait_all(ray, stats_refs, should_stop, on_group)
    except InterruptedError:  # keep the groups finished before the stop, in teacher order
        finished, _ = ray.wait(stats_refs, num_returns=len(stats_refs), timeout=0)
        kept = next((i for i, ref in enumerate(stats_refs) if ref not in finished), len(stats_refs))
        epochs_done = 0 if kept == 0 else epochs_done
    group_refs, sizes = group_refs[:kept], sizes[:kept]
    num_classes, activation = _shape_facts(models[0], tuple(x.shape[1:]), x[:1].detach().cpu())
    return RayTeachers(
        session=session, group_refs=group_refs, group_sizes=sizes, model_name=model_name, num_classes=num_classes,
        shard_sizes=np.array([len(s) for s in shards]), seconds=time.monotonic() - t0, epochs_done=int(epochs_done),
        train_loss=[float(v) for v in losses / len(models)], activation=activation,
    )


def _shape_facts(model: nn.Module, input_shape: tuple[int, ...], x_one: torch.Tensor) -> tuple[int, int]:
    """(classes, floats in the largest activation for one example) of the teacher architecture."""
    with torch.no_grad():
        num_classes = int(model(x_one).shape[-1])
    return num_classes, largest_activation(model, input_shape)
