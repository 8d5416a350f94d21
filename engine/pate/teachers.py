"""Teachers: one model per shard, trained all at once; their votes and their accuracy.

`train_teachers` trains the teachers as stacked ensembles (`ensemble.StackedEnsemble`): every
step, each teacher takes its own mini-batch from its own shard and all teachers step together.
`train_teachers_one_by_one` is the textbook loop (a model, an optimizer and a DataLoader per
teacher), kept as the baseline the benchmark compares against.

Teachers never leave the engine: nothing here writes them anywhere.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engine.array_data import gather_rows
from engine.models import build_model
from engine.pate.ensemble import StackedEnsemble
from engine.pate.member_adam import MemberAdam, for_members
from engine.pate.shards import shard_matrix

MakeOptimizer = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
OnEpoch = Callable[[int, int, float], None]  # (epochs done over all groups, total, mean train loss)

# Teachers are trained in groups sized so that one layer's activations for a whole group step stay
# around this many floats (10 MB): small enough to stay in cache on a CPU, large enough that each
# operation does a lot of work. Measured on 2 cores: mnist_cnn is fastest at ~25 teachers x 32
# examples, mlp at ~100-150 teachers.
ACTIVATION_BUDGET = 2_500_000
# On a GPU, launches cost more than cache misses: as many teachers per group as fit in about 256 MB
# per layer output. Measured on an H200 (250 mnist_cnn teachers, 30 epochs): groups of 24 (the CPU
# budget) 10.2 s, of 50 6.8 s, all 250 in one group 2.7 s; the same accuracy.
GPU_ACTIVATION_BUDGET = 64_000_000
GATHER_BYTES = 1 << 30  # a group's shards read on demand are gathered into memory up to this size


def largest_activation(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Floats in the largest input or layer output of `model` for one example."""
    sizes = [math.prod(input_shape)]
    hooks = [m.register_forward_hook(lambda _m, _i, out: sizes.append(out[0].numel()))
             for m in model.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape))
    finally:
        for h in hooks:
            h.remove()
    return max(sizes)


def group_size_for(model: nn.Module, input_shape: tuple[int, ...], batch_size: int, num_teachers: int,
                   device: torch.device | str = "cpu") -> int:
    """Teachers per stacked group: the activation budget of the device over one teacher's batch."""
    per_teacher = batch_size * largest_activation(model, input_shape)
    budget = GPU_ACTIVATION_BUDGET if torch.device(device).type == "cuda" else ACTIVATION_BUDGET
    return int(min(num_teachers, max(1, budget // per_teacher)))


def build_teachers(model_name: str, *, input_shape: tuple[int, ...], num_classes: int, num_teachers: int,
                   seed: int) -> list[nn.Module]:
    """`num_teachers` freshly initialised models; teacher k's weights depend only on (seed, k)."""
    models = []
    for k in range(num_teachers):
        torch.manual_seed(int(np.random.SeedSequence([seed, k, 0x7EAC]).generate_state(1)[0]))
        models.append(build_model(model_name, input_shape=input_shape, num_classes=num_classes))
    return models


@dataclass
class Teachers:
    """Trained teachers (in memory only): stacked groups, in teacher order."""

    groups: list[StackedEnsemble]
    model_name: str
    num_classes: int
    shard_sizes: np.ndarray
    seconds: float
    epochs_done: int
    train_loss: list[float] = field(default_factory=list)  # mean over teachers, per epoch
    activation: int = 1  # floats in one member's largest activation for one example

    @property
    def num_teachers(self) -> int:
        return sum(g.num_members for g in self.groups)

    @torch.no_grad()
    def predict(self, x: torch.Tensor, *, should_stop: Callable[[], bool] = lambda: False) -> torch.Tensor:
        """Each teacher's predicted class for each example: shape (teachers, examples), int64."""
        out = []
        for group in self.groups:
            was = group.training
            group.eval()
            chunk = max(1, ACTIVATION_BUDGET // (group.num_members * self.activation))
            parts = []
            for start in range(0, x.shape[0], chunk):
                if should_stop():
                    raise InterruptedError
                parts.append(group.forward_shared(x[start : start + chunk]).argmax(-1))
            group.train(was)
            out.append(torch.cat(parts, dim=1))
        return torch.cat(out, dim=0)

    def close(self) -> None:
        """Nothing to release for teachers in this process (engine.pate.ray_backend's need it)."""

    def member_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        for group in self.groups:
            if k < group.num_members:
                return group.member_state_dict(k)
            k -= group.num_members
        raise IndexError(k)


def vote_counts(predictions: torch.Tensor, num_classes: int) -> np.ndarray:
    """Histogram of the teachers' predictions per example: shape (examples, classes), int64."""
    # Counted in place: a one-hot (teachers, examples, classes) tensor would take teachers x classes x 8
    # bytes per example (10 GB for 250 teachers voting on 500,000 held-out examples).
    pred = predictions.T.to(torch.int64)  # (examples, teachers)
    counts = torch.zeros(pred.shape[0], num_classes, dtype=torch.int64, device=pred.device)
    return counts.scatter_add_(1, pred, torch.ones_like(pred)).cpu().numpy()


def train_teachers(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    shards: Sequence[np.ndarray],
    *,
    epochs: int,
    batch_size: int,
    make_optimizer: MakeOptimizer,
    seed: int,
    device: torch.device = torch.device("cpu"),
    on_epoch: OnEpoch | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    vectorize: str = "auto",
    group_size: int | None = None,
    model_name: str = "",
) -> Teachers:
    """Train teacher k on shard k, all teachers of a group in one stacked ensemble (`train_group`),
    one group after the other in this process. Stops early (returning what was trained) when
    `should_stop()` turns true between steps. engine.pate.ray_backend trains the same groups as Ray
    tasks and gets the same teachers."""
    if len(models) != len(shards):
        raise ValueError(f"{len(models)} models for {len(shards)} shards")
    t0 = time.monotonic()
    size = group_size or group_size_for(models[0], tuple(x.shape[1:]), batch_size, len(models), device)
    starts = list(range(0, len(models), size))
    total = len(starts) * epochs
    done = 0
    groups: list[StackedEnsemble] = []
    losses = np.zeros(epochs)
    epochs_done = epochs
    for start in starts:
        index, lengths = shard_matrix(list(shards[start : start + size]))
        xs, ys = gather_shards(x, y, index)

        def on_group_epoch(epoch: int, loss_sum: float, k: int = len(index)) -> None:
            nonlocal done
            losses[epoch] += loss_sum
            done += 1
            if on_epoch is not None:
                on_epoch(done, total, loss_sum / k)

        group = train_group(list(models[start : start + size]), xs, ys, lengths, first_teacher=start, epochs=epochs,
                            batch_size=batch_size, make_optimizer=make_optimizer, seed=seed, device=device,
                            on_epoch=on_group_epoch, should_stop=should_stop, vectorize=vectorize)
        groups.append(group.ensemble)
        if group.epochs_done < epochs:
            epochs_done = group.epochs_done
            return _finish(groups, x, shards, t0, epochs_done, losses[:epochs_done] / len(models), model_name)
    return _finish(groups, x, shards, t0, epochs_done, losses / len(models), model_name)


def gather_shards(x: torch.Tensor, y: torch.Tensor, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """One group's shards as (teachers, max_len, ...) inputs and (teachers, max_len) labels. Inputs read
    on demand (engine.array_data) whose group would take more than GATHER_BYTES in memory stay on disk:
    each step then reads its batch's rows (the same values, so the same teachers, only slower)."""
    return gather_rows(x, index, max_bytes=GATHER_BYTES), y[torch.as_tensor(index)]


@dataclass
class TrainedGroup:
    """One stacked group after `train_group`: the ensemble, its summed loss per epoch, epochs done."""

    ensemble: StackedEnsemble
    loss_sums: list[float]  # per epoch: the sum over the group's teachers of their mean batch loss
    epochs_done: int


def teacher_generator(seed: int, teacher: int) -> torch.Generator:
    """The shuffling generator of teacher `teacher`: a function of (seed, teacher) only, so a teacher
    trains the same whatever group it is in, whatever its group's other shards, wherever it runs."""
    state = np.random.SeedSequence([seed, 0xBA7C, teacher]).generate_state(1)[0]
    return torch.Generator(device="cpu").manual_seed(int(state))


def epoch_order(generator: torch.Generator, length: int) -> torch.Tensor:
    """One epoch's visiting order of a shard of `length` examples (positions 0..length-1)."""
    return torch.randperm(length, generator=generator)


def train_group(
    members: Sequence[nn.Module],
    xs: torch.Tensor,
    ys: torch.Tensor,
    lengths: np.ndarray,
    *,
    first_teacher: int,
    epochs: int,
    batch_size: int,
    make_optimizer: MakeOptimizer,
    seed: int,
    device: torch.device = torch.device("cpu"),
    on_epoch: Callable[[int, float], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    vectorize: str = "auto",
) -> TrainedGroup:
    """Train one group of teachers as a stacked ensemble on their shards `xs`, `ys` (padded to
    (k, max_len, ...); positions >= lengths[k] are padding).

    Teacher k trains as it would alone: every epoch it visits its own shard in a fresh random order
    (`teacher_generator`, `epoch_order`) in mini-batches of `batch_size`, its loss the mean over its
    own batch, one optimizer step per batch. The group steps together; at a step where a teacher's
    shard has no batch left (a smaller shard, or an empty one), the teacher does not step: Adam and
    AdamW become `MemberAdam` (a step count per teacher, only the active teachers stepped), other
    optimizers get its parameters and state put back as they were (`_keep_members`). So no teacher
    depends on another's shard (PATE's one-example-one-teacher argument), and an empty shard's
    teacher keeps its initial weights.
    `on_epoch(epoch, loss_sum)` after each epoch; stops between steps when `should_stop()` is true.
    """
    generators = [teacher_generator(seed, first_teacher + j) for j in range(len(lengths))]
    ensemble = StackedEnsemble(list(members), vectorize=vectorize).to(device).train()
    optimizer = for_members(make_optimizer(list(ensemble.parameters())))
    k, max_len = xs.shape[0], xs.shape[1]
    xs, ys = xs.to(device), ys.to(device)
    lengths_t = torch.as_tensor(lengths, device=device)
    rows = torch.arange(k, device=device)[:, None]
    steps = max(1, math.ceil(max_len / batch_size))
    loss_sums: list[float] = []
    for epoch in range(epochs):
        order = torch.zeros(k, max_len, dtype=torch.long)
        for j, n in enumerate(lengths.tolist()):
            order[j, :n] = epoch_order(generators[j], n)
        order = order.to(device)
        loss_sum = 0.0
        for s in range(0, max_len, batch_size):
            if should_stop():
                return TrainedGroup(ensemble, loss_sums, epoch)
            idx = order[:, s : s + batch_size]
            mask = (s + torch.arange(idx.shape[1], device=device))[None, :] < lengths_t[:, None]
            logits = ensemble(xs[rows, idx])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ys[rows, idx].reshape(-1),
                                   reduction="none").view(k, -1)
            per_teacher = (loss * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
            optimizer.zero_grad(set_to_none=True)
            per_teacher.sum().backward()
            active = np.asarray(lengths) > s
            if isinstance(optimizer, MemberAdam):
                optimizer.step(members=np.flatnonzero(active))
            else:
                with _keep_members(optimizer, list(ensemble.parameters()), np.flatnonzero(~active)):
                    optimizer.step()
            loss_sum += float(per_teacher.detach().sum())
        loss_sums.append(loss_sum / steps)
        if on_epoch is not None:
            on_epoch(epoch, loss_sums[-1])
    return TrainedGroup(ensemble, loss_sums, epochs)


class _keep_members:
    """Around an optimizer step of stacked parameters: members `idle` (indices on the leading axis) end
    it as they began, parameters and per-member optimizer state (momentum buffers) alike. A state
    tensor the step creates starts at zero for them, which for SGD momentum is the same as no state.
    Not enough for state shared by the members, such as Adam's step count: Adam uses `MemberAdam`."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[nn.Parameter], idle: np.ndarray):
        self.optimizer, self.params = optimizer, params
        self.idle = torch.as_tensor(idle, dtype=torch.long)

    def __enter__(self) -> None:
        self.saved: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []
        if not len(self.idle):
            return
        for p in self.params:
            idle = self.idle.to(p.device)
            state = {name: v[idle].clone() for name, v in self.optimizer.state.get(p, {}).items()
                     if isinstance(v, torch.Tensor) and v.shape == p.shape}
            self.saved.append((p.detach()[idle].clone(), state))

    def __exit__(self, *exc: Any) -> None:
        if not len(self.idle) or exc[0] is not None:
            return
        with torch.no_grad():
            for p, (value, state) in zip(self.params, self.saved):
                idle = self.idle.to(p.device)
                p[idle] = value
                for name, v in self.optimizer.state.get(p, {}).items():
                    if isinstance(v, torch.Tensor) and v.shape == p.shape:
                        v[idle] = state[name] if name in state else 0


def _finish(groups: list[StackedEnsemble], x: torch.Tensor, shards, t0: float, epochs_done: int,
            losses: np.ndarray, model_name: str) -> Teachers:
    with torch.no_grad():
        num_classes = int(groups[0].forward_shared(x[:1].to(next(groups[0].parameters()).device)).shape[-1])
    activation = largest_activation(groups[0].member_module(0).cpu(), tuple(x.shape[1:]))
    return Teachers(
        groups=groups,
        model_name=model_name,
        num_classes=num_classes,
        shard_sizes=np.array([len(s) for s in shards]),
        seconds=time.monotonic() - t0,
        epochs_done=int(epochs_done),
        train_loss=[float(v) for v in losses],
        activation=activation,
    )


def train_teachers_one_by_one(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    shards: Sequence[np.ndarray],
    *,
    epochs: int,
    batch_size: int,
    make_optimizer: MakeOptimizer,
    seed: int,
) -> list[nn.Module]:
    """The baseline: the textbook loop, one teacher after the other (a DataLoader per teacher)."""
    from torch.utils.data import DataLoader, TensorDataset

    trained = []
    for k, (model, shard) in enumerate(zip(models, shards)):
        index = torch.as_tensor(shard)
        loader = DataLoader(TensorDataset(x[index], y[index]), batch_size=batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(seed * 100_003 + k))
        optimizer = make_optimizer(list(model.parameters()))
        model.train()
        for _ in range(epochs):
            for xb, yb in loader:
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(model(xb), yb).backward()
                optimizer.step()
        trained.append(model)
    return trained
