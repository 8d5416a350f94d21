"""The DP-SGD training loop (and the non-private baseline through the same loop).

One step: Poisson-sample a logical batch, process it in physical chunks of at most
`max_physical_batch_size`, sum the clipped per-example gradients, add Gaussian noise once,
divide by the expected batch size, then take an optimizer step. Privacy is accounted after
every step; the budget is enforced before the step that would exceed it.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine import checkpoint, privacy
from engine.config import RunConfig
from engine.datasets import Dataset
from engine.errors import ConfigError, DPWError
from engine.dpsgd import mechanism
from engine.dpsgd.canaries import GradientCanaries, InputCanaries
from engine.dpsgd.cuda_graphs import GraphedClippedSum, clipped_sum_for
from engine.dpsgd.fast_layers import accelerate_model
from engine.dpsgd.per_sample import per_example_gradients
from engine.randomness import PrivateRandomness, seeded_torch_generator

Emit = Callable[..., Any]


class TrainingDiverged(DPWError):
    """The model's weights became NaN or infinite."""


#: Below this RDP epsilon every accountant's bound is finite (the PLD grid reaches losses of 600).
_CLEARLY_FINITE_EPSILON = 100.0


@dataclass
class PrivacyPlan:
    """What the privacy settings imply for this dataset, fixed before the first step."""

    sample_rate: float
    steps_planned: int
    noise_multiplier: float | None
    delta: float
    accountant: str
    steps_allowed: int  # by the budget; == steps_planned when no budget binds
    calibrated: bool = False
    statistics_noise_multiplier: float | None = None  # normalization = "dp": released before step 1

    @property
    def private(self) -> bool:
        return self.noise_multiplier is not None

    def bounds_nothing(self) -> bool:
        """Whether the noise set by hand is so small that the run will state epsilon = inf (said
        before training rather than at its end). The RDP bound (milliseconds) settles the usual case;
        only a huge one asks the run's own accountant (the PLD takes up to seconds)."""
        if not self.private or self.calibrated:
            return False
        kwargs = dict(sample_rate=self.sample_rate, noise_multiplier=self.noise_multiplier, steps=self.steps_allowed,
                      delta=self.delta, statistics_noise_multiplier=self.statistics_noise_multiplier)
        if privacy.dpsgd_epsilon(**kwargs, accountant="rdp").value <= _CLEARLY_FINITE_EPSILON:
            return False
        return math.isinf(privacy.dpsgd_epsilon(**kwargs, accountant=self.accountant).value)


@dataclass
class TrainResult:
    steps_done: int
    epochs_done: float
    stop_reason: str  # "completed", "budget", "stopped"
    test_accuracy: float | None
    test_loss: float | None
    epsilon: privacy.Epsilon | None
    seconds: float
    samples_processed: int
    extra: dict[str, Any] = field(default_factory=dict)


def plan_privacy(config: RunConfig, num_train: int, emit: Emit | None = None) -> PrivacyPlan:
    """Sample rate, steps, the (possibly calibrated) noise multiplier and the budget's step limit."""
    q = config.sample_rate_for(num_train)
    steps = config.steps_for(num_train)
    if config.mechanism != "dpsgd":
        return PrivacyPlan(q, steps, None, config.delta, config.accountant, steps)
    sigma = config.noise_multiplier
    calibrated = False
    # DP feature statistics are composed with the training by RDP (engine.privacy.feature_stats).
    statistics = config.normalization_noise_multiplier if config.normalization == "dp" else None
    accountant = "rdp" if statistics is not None else config.accountant
    if sigma is None:
        if emit:
            emit("progress", phase="calibrating", done=0, total=1)
        if config.target_attack_tpr is not None:
            sigma = privacy.calibrate_noise_multiplier_for_attack(
                sample_rate=q,
                steps=steps,
                target_tpr=config.target_attack_tpr,
                fpr=config.target_attack_fpr,
            )
        else:
            sigma = privacy.calibrate_noise_multiplier(
                sample_rate=q,
                steps=steps,
                target_epsilon=config.target_epsilon,
                delta=config.delta,
                accountant=accountant,
                statistics_noise_multiplier=statistics,
            )
        calibrated = True
    allowed = steps
    if config.epsilon_budget is not None:
        allowed = privacy.max_steps_within_budget(
            sample_rate=q,
            noise_multiplier=sigma,
            delta=config.delta,
            budget=config.epsilon_budget,
            accountant=accountant,
            upper=steps,
            statistics_noise_multiplier=statistics,
        )
        allowed = min(allowed, steps)
    return PrivacyPlan(q, steps, sigma, config.delta, accountant, allowed, calibrated, statistics)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "'cuda' was asked for but no CUDA GPU is available", hint="use 'cpu' or 'auto'")
    return torch.device(name)


def learning_rate_at(config: RunConfig, step: int, total_steps: int) -> float:
    """The learning rate for step `step` (0-based) of `total_steps`: constant, or cosine-decayed to 0."""
    if config.lr_schedule == "cosine" and total_steps > 0:
        return config.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))
    return config.learning_rate


def make_optimizer(config: RunConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.learning_rate)
    if config.optimizer == "momentum":
        return torch.optim.SGD(params, lr=config.learning_rate, momentum=config.momentum)
    return torch.optim.Adam(params, lr=config.learning_rate)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int = 2048) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) over a whole split."""
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, x.shape[0], chunk):
        logits = model(x[start : start + chunk])
        target = y[start : start + chunk]
        loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(1) == target).sum())
    model.train(was_training)
    n = max(1, x.shape[0])
    return correct / n, loss_sum / n


def predict(model: nn.Module, x: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(x[s : s + chunk]).argmax(1) for s in range(0, x.shape[0], chunk)])


class DPSGDStep:
    """One DP-SGD step on a Poisson-sampled logical batch: clip, sum, noise, scale, update."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        clipping_norm: float,
        noise_multiplier: float,
        expected_batch_size: int,
        max_physical_batch_size: int,
        noise_generator: mechanism.PrivateGenerator,
        canaries: GradientCanaries | None = None,
        data_parallel: Any = None,
        cuda_graphs: bool = False,
    ):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = optimizer
        self.strategy = per_example_gradients(model)
        device = self.params[0].device if self.params else torch.device("cpu")
        self.clipped_sum = clipped_sum_for(self.strategy, clipping_norm, max_physical_batch_size, device,
                                           graphs=cuda_graphs)
        self.clipping_norm = clipping_norm
        self.noise_multiplier = noise_multiplier
        self.expected_batch_size = expected_batch_size
        self.max_physical_batch_size = max_physical_batch_size
        self.noise_generator = noise_generator
        self.canaries = canaries
        self.data_parallel = data_parallel  # engine.dpsgd.distributed.DataParallel, or None

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Update the model; returns the sum of the batch's per-example losses, a 0-d tensor on the
        model's device (not read here: reading it would make the host wait for the GPU every step).
        An example whose loss or gradient is not finite is left out of the step (mechanism.clip_factors)
        and of the sum; `left_out` counts them (a 0-d tensor, read as late as the loss)."""
        tally = torch.zeros(2, device=x.device)  # the kept examples' loss sum, the examples left out
        summed = [torch.zeros_like(p) for p in self.params]
        for start in range(0, x.shape[0], self.max_physical_batch_size):
            end = start + self.max_physical_batch_size
            losses, part, norms = self.clipped_sum(x[start:end], y[start:end])
            kept = torch.isfinite(norms)
            tally += torch.stack([torch.where(kept, losses, 0.0).sum(), (~kept).sum()]).to(tally.dtype)
            torch._foreach_add_(summed, part)
        if self.canaries is not None:  # the auditor knows every other record's clipped sum (DP's adversary)
            known = [total.clone() for total in summed]
            self.canaries.inject(summed)
        add_noise = functools.partial(mechanism.add_gaussian_noise, noise_multiplier=self.noise_multiplier,
                                      clipping_norm=self.clipping_norm, generator=self.noise_generator)
        if self.data_parallel is None:
            noisy = add_noise(summed)
        else:  # all ranks' sums added, the noise added once by rank 0 (engine.dpsgd.distributed)
            noisy, tally = self.data_parallel.noisy_total(summed, tally, x.shape[0], add_noise)
        if self.canaries is not None:
            self.canaries.observe([g - k for g, k in zip(noisy, known)])
        # Divide by the EXPECTED batch size (not the realised one, which depends on the data).
        for p, g in zip(self.params, noisy):
            p.grad = g / self.expected_batch_size
        self.optimizer.step()
        self.left_out = tally[1]
        return tally[0]

    def close(self) -> None:
        if isinstance(self.clipped_sum, GraphedClippedSum):
            self.clipped_sum.close()
        self.strategy.close()


class NonPrivateStep:
    """One plain SGD step on the batch's mean loss (the non-private baseline)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model = model
        self.optimizer = optimizer

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Update the model; returns the batch's loss sum as a 0-d tensor (as DPSGDStep)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.detach() * x.shape[0]

    def close(self) -> None:
        pass


def train(
    model: nn.Module,
    data: Dataset,
    config: RunConfig,
    plan: PrivacyPlan,
    *,
    device: torch.device,
    emit: Emit,
    should_stop: Callable[[], bool] = lambda: False,
    data_parallel: Any = None,
    checkpoint_path: Path | None = None,
    resume: dict[str, Any] | None = None,
) -> TrainResult:
    """Train `model` on `data` under `plan`, emitting metric/privacy/progress events.

    `config.seed` fixes the initial weights and the non-private baseline's order; a private run's
    Poisson sampling and noise come from the run's private randomness (engine.randomness).
    With `audit_canaries`, the canaries ride along (engine.dpsgd.canaries) and the result's
    `extra["canaries"]` holds the audit's counts and epsilon lower bound. With `checkpoint_path`, a
    checkpoint is written there at every evaluation, every CHECKPOINT_EVERY_S between them and when
    training ends (engine.checkpoint); with `resume` (a loaded checkpoint) training continues from its
    step, its steps counted in epsilon."""
    torch.manual_seed(config.seed)
    accelerate_model(model.to(device).train())
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    x_test, y_test = data.x_test.to(device), data.y_test.to(device)
    # the public training-set size: steps and epochs count in it (all ranks' shards together)
    n = x_train.shape[0] if data_parallel is None else data_parallel.num_train
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(config, params)
    if resume is not None:
        checkpoint.apply_checkpoint(resume, model, optimizer)
    private = PrivateRandomness.for_run(config) if plan.private or config.audit_canaries else None
    canaries = _draw_canaries(config, plan, private, x_train=x_train, num_classes=data.num_classes,
                              params=params, device=device, emit=emit)
    if isinstance(canaries, InputCanaries):
        x_train, y_train = canaries.join(x_train, y_train)
    pool = x_train.shape[0]  # what batches are drawn from: the data and any included input canaries
    if plan.private:
        sampler_gen = private.torch_generator(data_parallel.sampling_purpose if data_parallel else "poisson_sampling",
                                              device)
        step_fn = DPSGDStep(
            model,
            optimizer,
            clipping_norm=config.clipping_norm,
            noise_multiplier=plan.noise_multiplier,
            expected_batch_size=config.expected_batch_size,
            max_physical_batch_size=config.max_physical_batch_size,
            noise_generator=private.torch_generator("dpsgd_noise", device),
            canaries=canaries if isinstance(canaries, GradientCanaries) else None,
            data_parallel=data_parallel,
            cuda_graphs=config.cuda_graphs,
        )
    else:
        sampler_gen = seeded_torch_generator(config.seed, "baseline_order", device)
        step_fn = NonPrivateStep(model, optimizer)
    live = (
        privacy.LiveAccountant(
            sample_rate=plan.sample_rate, noise_multiplier=plan.noise_multiplier, delta=plan.delta,
            statistics_noise_multiplier=plan.statistics_noise_multiplier,
        )
        if plan.private
        else None
    )
    steps_per_epoch = n / config.expected_batch_size
    eval_every = max(1, round(steps_per_epoch / config.evaluations_per_epoch))
    total = plan.steps_planned
    stop_reason = "completed"
    step = resume["step"] if resume is not None else 0
    samples = 0  # this run's own (its throughput)
    if live is not None:
        live.step(step)  # the steps the checkpoint's model already took
    accuracy = test_loss = None
    t0 = time.monotonic()
    last_progress = 0.0
    shuffled = None
    evaluated_at = -1
    losses = _LossReport(emit, steps_per_epoch)

    checkpoints = {"path": checkpoint_path, "written": t0}

    def save_checkpoint_now() -> None:
        """A checkpoint that cannot be written (full disk, a file where its folder goes) never ends the
        run: it is said once, and the run goes on without them."""
        if checkpoints["path"] is None:
            return
        checkpoints["written"] = time.monotonic()
        try:
            checkpoint.save_checkpoint(checkpoints["path"], model=model, optimizer=optimizer, step=step)
        except (OSError, RuntimeError) as exc:
            checkpoints["path"] = None
            emit("warning", message=f"no checkpoint kept at {checkpoint_path} ({exc}): if this run ends early it "
                 "cannot be continued with dpw resume")

    emit("progress", phase="training", done=0, total=total)
    while step < total:
        if should_stop():
            stop_reason = "stopped"
            break
        if step >= plan.steps_allowed:
            stop_reason = "budget"
            emit(
                "warning",
                message=f"stopped before step {step + 1}: it would exceed the epsilon budget "
                f"{config.epsilon_budget:g} ({config.accountant})",
            )
            break
        if plan.private:
            # (on a GPU the draw's count comes back to the host: that waits for the step before to finish)
            idx = mechanism.poisson_sample(pool, plan.sample_rate, sampler_gen, device)
        else:
            # Non-private baseline: shuffled fixed-size batches.
            offset = (step * config.expected_batch_size) % pool
            if shuffled is None or offset < config.expected_batch_size:
                shuffled = torch.randperm(pool, generator=sampler_gen, device=device)
            idx = shuffled[offset : offset + config.expected_batch_size]
        if config.lr_schedule != "constant":
            for group in optimizer.param_groups:
                group["lr"] = learning_rate_at(config, step, min(total, plan.steps_allowed))
        loss_sum = step_fn(x_train[idx], y_train[idx])
        weights_finite = torch.stack([p.isfinite().all() for p in model.parameters()]).all()
        batch_size = int(idx.numel()) if data_parallel is None else data_parallel.last_batch_size
        step += 1
        samples += batch_size
        epoch = step / steps_per_epoch
        if live is not None:
            live.step()
            eps = live.epsilon()
            emit("privacy", step=step, epsilon=eps.value, delta=eps.delta, accountant=eps.accountant)
        losses.report_previous()  # the step before: the GPU may still finish it, but this one is queued behind it
        losses.hold(step, batch_size, loss_sum, getattr(step_fn, "left_out", None), weights_finite)
        if step % eval_every == 0 or step == total or step >= plan.steps_allowed:
            losses.report_previous()
            accuracy, test_loss = _evaluate_and_report(model, x_test, y_test, step, epoch, live, plan, emit)
            evaluated_at = step
            save_checkpoint_now()
        now = time.monotonic()
        if now - checkpoints["written"] >= checkpoint.CHECKPOINT_EVERY_S:  # evaluations far apart: a kill
            save_checkpoint_now()  # loses no more than this much training
        if now - last_progress > 0.5 or step == total:
            emit("progress", phase="training", done=step, total=total)
            last_progress = now

    losses.report_previous()
    if evaluated_at != step or accuracy is None:
        accuracy, test_loss = _evaluate_and_report(
            model, x_test, y_test, step, step / steps_per_epoch, live, plan, emit
        )
        save_checkpoint_now()
    final_eps = live.epsilon_reported(plan.accountant) if live is not None else None
    step_fn.close()
    extra: dict[str, Any] = {}
    if canaries is not None:
        emit("progress", phase="auditing", done=0, total=1)
        extra["canaries"] = canaries.audit(model, delta=config.delta, device=device).to_json()
        emit("progress", phase="auditing", done=1, total=1)
    return TrainResult(
        steps_done=step,
        epochs_done=step / steps_per_epoch,
        stop_reason=stop_reason,
        test_accuracy=accuracy,
        test_loss=test_loss,
        epsilon=final_eps,
        seconds=time.monotonic() - t0,
        samples_processed=samples,
        extra=extra,
    )


class _LossReport:
    """Each step's training loss, read and emitted one step late: on a GPU, reading a step's loss right
    after launching it would make the host wait for the whole step before it could launch the next.

    Weights that became NaN or infinite end the run (TrainingDiverged) naming the step. That check reads
    the model, which the noise already protects; the loss of the private batch has no noise, so a
    non-finite loss ends nothing: its example was left out of the step (mechanism.clip_factors), which
    the first such step says in a warning, and the loss shown is the mean over the examples kept."""

    def __init__(self, emit: Emit, steps_per_epoch: float):
        self.emit = emit
        self.steps_per_epoch = steps_per_epoch
        self.held: tuple | None = None
        self.warned_left_out = False  # the first step that leaves examples out says so, once

    def hold(self, step: int, batch_size: int, loss_sum: torch.Tensor, left_out: torch.Tensor | None,
             weights_finite: torch.Tensor) -> None:
        self.held = (step, batch_size, loss_sum, left_out, weights_finite)

    def report_previous(self) -> None:
        if self.held is None:
            return
        (step, batch_size, loss_sum, left_out, weights_finite), self.held = self.held, None
        if not bool(weights_finite):
            raise TrainingDiverged(
                f"training diverged: the model's weights became NaN or infinite at step {step}",
                hint="lower the learning_rate",
            )
        left = 0 if left_out is None else int(left_out)
        if left and not self.warned_left_out:
            self.warned_left_out = True
            self.emit("warning", message=f"step {step}: {left} example(s) of the batch had a loss or gradient "
                      "that is not finite (NaN or infinite) and were left out of the step; the guarantee is "
                      "unchanged, but such examples never train the model",
                      hint="check the data for extreme values (or scale the features: normalization, "
                      "feature_bounds), or lower the learning_rate")
        value = float(loss_sum)
        if batch_size > left and math.isfinite(value):
            self.emit("metric", step=step, epoch=round(step / self.steps_per_epoch, 5), name="train_loss",
                      value=value / (batch_size - left))


def _draw_canaries(config: RunConfig, plan: PrivacyPlan, private: PrivateRandomness | None, *, x_train, num_classes,
                   params, device, emit) -> InputCanaries | GradientCanaries | None:
    """The run's audit canaries (None without `audit_canaries`), drawn from its private randomness."""
    if not config.audit_canaries:
        return None
    if config.audit_canary_kind == "gradient":
        if not plan.private:
            raise ConfigError("audit_canary_kind", "'gradient' canaries need a DP-SGD run",
                              hint="use audit_canary_kind = 'input'")
        return GradientCanaries.draw(private, config.audit_canaries, params=params, clipping_norm=config.clipping_norm,
                                     noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate,
                                     device=device)
    return InputCanaries.draw(private, config.audit_canaries, x_train=x_train, num_classes=num_classes)


def _evaluate_and_report(model, x_test, y_test, step, epoch, live, plan, emit) -> tuple[float, float]:
    """Test metrics, and the reported (tight) epsilon when it differs from the live one."""
    accuracy, test_loss = evaluate(model, x_test, y_test)
    emit("metric", step=step, epoch=round(epoch, 5), name="test_accuracy", value=accuracy)
    emit("metric", step=step, epoch=round(epoch, 5), name="test_loss", value=test_loss)
    if live is not None and plan.accountant != "rdp":
        rep = live.epsilon_reported(plan.accountant)
        emit("privacy", step=step, epsilon=rep.value, delta=rep.delta, accountant=rep.accountant)
    return accuracy, test_loss
