"""Canaries that ride along in a real training run, for the one-run audit of Steinke, Nasr and
Jagielski (NeurIPS 2023; the statistics are in engine.audit.canaries).

Each of `audit_canaries = m` canaries is included independently with probability 1/2, drawn from the
run's private randomness (engine.randomness.AUDIT_CANARY_INCLUSION). After training each canary gets
a score (higher: more likely included) and the pure module turns the guesses into an epsilon lower
bound. Which canaries were included is secret run state: it lives only in these objects (not printed,
not pickled) and is dropped once the audit is computed; only the counts leave.

- `InputCanaries` (black box, every mechanism): random inputs, uniform over the range of the training
  inputs, each with a random label (out-of-distribution, so nothing else in the data teaches the model
  that label there). The included ones join the training data before Poisson sampling (DP-SGD) or the
  teachers' shards (PATE). Score: minus the released model's cross-entropy on the canary's label.
- `GradientCanaries` (DP-SGD, white box): canary i is a fixed secret unit direction u_i; at every step
  each included canary joins independently with probability q (like an example) and adds the gradient
  C u_i to the clipped sum before the noise, so the mechanism is unchanged. The auditor sees each
  noisy gradient g_t (white box): x_t = <g_t, u_i> / C is N(0, sigma^2) plus 1 when the canary joined
  step t. Score: the sum over steps of the log-likelihood ratio of "included" (joins with probability q)
  against "not included", sum_t log(1 - q + q exp((2 x_t - 1) / (2 sigma^2))), the Neyman-Pearson test
  for this mixture (with sigma < 1 a few joins decide, which the plain sum of x_t would average away).
  The auditor is the adversary DP protects against, who knows every other record: it subtracts the
  step's clipped sum of the sampled training examples (known to the training code) before scoring, so
  x_t is exactly the pair the accountant analyses (the noise, plus 1 when the canary joined, plus the
  other canaries that joined). This is what makes the audit tight; without it the data's own gradient
  projects onto u_i and blurs the scores. The directions are orthonormal (when there are no more
  canaries than parameters and the orthogonalisation is affordable): the other canaries' joins then
  do not show in x_t at all and the noise's projections are independent, so the scores are exactly
  those of the ideal audit that engine.audit.canaries.plan_gradient_guesses simulates. Otherwise they
  are independent random unit vectors (|<u_i, u_j>| ~ 1 / sqrt(d)), and sigma^2 is replaced by the
  spread of x_t over all canaries when that is larger.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engine.audit.canaries import CanaryAudit, canary_audit, plan_gradient_guesses
from engine.dpsgd.mechanism import poisson_sample
from engine.errors import ConfigError
from engine.randomness import (
    AUDIT_CANARY_CONTENT,
    AUDIT_CANARY_INCLUSION,
    AUDIT_CANARY_SAMPLING,
    PrivateRandomness,
    SecureGenerator,
)

MAX_DIRECTION_ELEMENTS = 2**27
"""Gradient canaries keep an m x (number of parameters) matrix of directions (float32): at most this
many elements (512 MiB)."""

MAX_ORTHOGONALISATION_WORK = 1e12
"""Orthonormal directions cost about 2 m^2 d multiply-adds (m canaries, d parameters; Cholesky QR): up to
this much m^2 d (about 20 s on two cores) and with m <= d / 2 (a well-conditioned Gram matrix, so float32
keeps the rows orthogonal to ~1e-6); otherwise the directions stay random unit vectors (nearly
orthogonal)."""


class _Secret:
    """Holds which canaries were included; never shown, never pickled."""

    def __init__(self, included: np.ndarray):
        self._included: np.ndarray | None = included

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<secret>)"

    def __getstate__(self):
        raise TypeError("which canaries were included is a run's secret and cannot be pickled")

    @property
    def count(self) -> int:
        return int(self._included.size) if self._included is not None else 0

    def _take_included(self) -> np.ndarray:
        """The inclusion mask, handed over once (to the audit) and then forgotten."""
        if self._included is None:
            raise RuntimeError("the canary audit has already been computed")
        included, self._included = self._included, None
        return included


def draw_inclusion(randomness: PrivateRandomness, count: int) -> np.ndarray:
    """Each of `count` canaries included independently with probability exactly 1/2."""
    generator = randomness.numpy_generator(AUDIT_CANARY_INCLUSION)
    if isinstance(generator, SecureGenerator):
        bits = generator.uint64(count) & np.uint64(1)
    else:
        bits = generator.integers(0, 2, size=count)
    return np.asarray(bits, dtype=bool)


def _content_generator(randomness: PrivateRandomness) -> torch.Generator:
    """A CPU torch generator for the canaries' content (inputs, labels, directions): the private stream
    itself, or with the hardened sampler a generator keyed by 64 of its bits (the content only has to be
    unknown to the training, not to resist floating-point attacks, and SHAKE-256 would take minutes)."""
    generator = randomness.torch_generator(AUDIT_CANARY_CONTENT, "cpu")
    if isinstance(generator, SecureGenerator):
        return torch.Generator().manual_seed(int(generator.uint64(1)[0] >> np.uint64(1)))
    return generator


def check_input_canaries_fit(x_train: Any) -> None:
    """Input canaries are appended to training inputs held in memory; inputs read on demand
    (engine.array_data) have nowhere to take them. Checked before the run is stored."""
    if not isinstance(x_train, torch.Tensor):
        raise ConfigError("audit_canary_kind", "input canaries join training inputs held in memory; this "
                          "dataset's inputs are read from disk as training goes",
                          hint="use audit_canary_kind = 'gradient' (DP-SGD), or a dataset that fits in memory")


class InputCanaries(_Secret):
    """Mislabelled out-of-distribution inputs (see the module docstring)."""

    kind = "input"

    def __init__(self, x: torch.Tensor, y: torch.Tensor, included: np.ndarray):
        super().__init__(included)
        self.x, self.y = x, y
        keep = torch.as_tensor(np.flatnonzero(included), dtype=torch.long)
        self._x_in, self._y_in = x[keep], y[keep]

    @classmethod
    def draw(cls, randomness: PrivateRandomness, count: int, *, x_train: torch.Tensor,
             num_classes: int) -> "InputCanaries":
        included = draw_inclusion(randomness, count)
        generator = _content_generator(randomness)
        low, high = float(x_train.min()), float(x_train.max())
        shape = (count, *x_train.shape[1:])
        x = low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float32)
        y = torch.randint(0, num_classes, (count,), generator=generator)
        return cls(x.to(x_train.dtype), y, included)

    def join(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The training data with the included canaries appended (their number stays in this run)."""
        check_input_canaries_fit(x)
        return (torch.cat([x, self._x_in.to(x.device, x.dtype)]),
                torch.cat([y, self._y_in.to(y.device, y.dtype)]))

    def join_shards(self, x: torch.Tensor, y: torch.Tensor,
                    shards: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, list[np.ndarray]]:
        """PATE: the data with the included canaries appended, canary i in teacher (i mod teachers)'s shard
        (one canary influences one teacher, as one example does)."""
        n = x.shape[0]
        x_all, y_all = self.join(x, y)
        extra: list[list[int]] = [[] for _ in shards]
        for row, canary in enumerate(np.flatnonzero(self._included)):
            extra[canary % len(shards)].append(n + row)
        return x_all, y_all, [np.concatenate([s, np.asarray(e, dtype=s.dtype)]) if e else s
                              for s, e in zip(shards, extra)]

    @torch.no_grad()
    def scores(self, model: nn.Module, device: torch.device | str = "cpu", chunk: int = 2048) -> np.ndarray:
        """Minus the cross-entropy of each canary's label under `model` (in eval mode)."""
        was_training = model.training
        model.eval()
        out = []
        for start in range(0, self.x.shape[0], chunk):
            logits = model(self.x[start:start + chunk].to(device))
            loss = F.cross_entropy(logits, self.y[start:start + chunk].to(device), reduction="none")
            out.append((-loss).double().cpu().numpy())
        model.train(was_training)
        return np.maximum(np.concatenate(out), -1e6)

    def audit(self, model: nn.Module, *, delta: float, device: torch.device | str = "cpu") -> CanaryAudit:
        scores = self.scores(model, device)
        self._x_in = self._y_in = None
        return canary_audit(scores=scores, included=self._take_included(), kind=self.kind, delta=delta)


class GradientCanaries(_Secret):
    """Per-step synthetic gradients in fixed secret directions (see the module docstring)."""

    kind = "gradient"

    def __init__(self, directions: torch.Tensor, included: np.ndarray, shapes: list[torch.Size], *,
                 clipping_norm: float, noise_multiplier: float, sample_rate: float, sampler: Any,
                 orthonormal: bool = False):
        super().__init__(included)
        self.directions = directions  # (m, d), unit rows
        self.orthonormal = orthonormal  # rows orthogonal too: x_t carries no other canary
        self.shapes = shapes
        self.clipping_norm = clipping_norm
        self.sample_rate = sample_rate
        self._sampler = sampler
        self._in_rows = torch.as_tensor(np.flatnonzero(included), dtype=torch.long, device=directions.device)
        self._log_ratio = torch.zeros(directions.shape[0], dtype=torch.float64, device=directions.device)
        self.noise_multiplier = float(noise_multiplier)
        self._variance = self.noise_multiplier ** 2
        self._steps = 0
        self._log_out = float(np.log1p(-sample_rate))
        self._log_in = float(np.log(sample_rate))

    @classmethod
    def draw(cls, randomness: PrivateRandomness, count: int, *, params: list[nn.Parameter], clipping_norm: float,
             noise_multiplier: float, sample_rate: float, device: torch.device) -> "GradientCanaries":
        shapes = [p.shape for p in params]
        dim = sum(p.numel() for p in params)
        if count * dim > MAX_DIRECTION_ELEMENTS:
            raise ConfigError("audit_canaries", f"{count} gradient canaries for a model of {dim} parameters need "
                              f"{count * dim * 4 / 2**30:.1f} GiB of directions",
                              hint=f"use at most {MAX_DIRECTION_ELEMENTS // dim} gradient canaries for this model")
        included = draw_inclusion(randomness, count)
        generator = _content_generator(randomness)
        directions = torch.randn((count, dim), generator=generator, dtype=torch.float32)
        orthonormal = 2 * count <= dim and float(count) ** 2 * dim <= MAX_ORTHOGONALISATION_WORK
        if orthonormal:  # a uniformly random orthonormal frame: Cholesky QR of a Gaussian matrix
            lower = torch.linalg.cholesky(directions @ directions.T)
            directions = torch.linalg.solve_triangular(lower, directions, upper=False)
        directions /= directions.norm(dim=1, keepdim=True)
        sampler = randomness.torch_generator(AUDIT_CANARY_SAMPLING, device)
        return cls(directions.to(device), included, shapes, clipping_norm=clipping_norm,
                   noise_multiplier=noise_multiplier, sample_rate=sample_rate, sampler=sampler,
                   orthonormal=orthonormal)

    def inject(self, summed: list[torch.Tensor]) -> None:
        """Add C u_i for each included canary that joins this step (probability q each) to the clipped sum."""
        joined = poisson_sample(int(self._in_rows.numel()), self.sample_rate, self._sampler, self.directions.device)
        if joined.numel() == 0:
            return
        flat = self.clipping_norm * self.directions[self._in_rows[joined]].sum(dim=0)
        offset = 0
        for total, shape in zip(summed, self.shapes):
            size = total.numel()
            total += flat[offset:offset + size].view(shape).to(total.dtype)
            offset += size

    def observe(self, noisy: list[torch.Tensor]) -> None:
        """Score one step for every canary: `noisy` is the released noisy gradient minus the clipped sum
        of the sampled training examples (the auditor's white-box view, knowing every other record)."""
        flat = torch.cat([g.reshape(-1).to(self.directions.dtype) for g in noisy])
        x = (self.directions @ flat).double() / self.clipping_norm
        variance = self._variance
        if not self.orthonormal and x.numel() > 1:  # other canaries' joins leak in through |<u_i, u_j>| > 0
            variance = max(variance, float(x.var()))
        self._log_ratio += torch.logaddexp(torch.full_like(x, self._log_out),
                                           self._log_in + (2.0 * x - 1.0) / (2.0 * variance))
        self._steps += 1

    def scores(self) -> np.ndarray:
        """The summed log-likelihood ratios, one per canary."""
        return self._log_ratio.cpu().numpy()

    def audit(self, model: nn.Module | None = None, *, delta: float, device: Any = None) -> CanaryAudit:
        """The bound from guesses whose number was planned from the run's public parameters (the steps
        taken, q, sigma) before the scores are looked at, so no share has to be paid for by a correction."""
        scores = self.scores()
        self.directions = self._in_rows = None
        planned = None
        if self._steps and scores.size >= 2:
            planned = plan_gradient_guesses(canaries=scores.size, sample_rate=self.sample_rate,
                                            noise_multiplier=self.noise_multiplier, steps=self._steps, delta=delta)
        return canary_audit(scores=scores, included=self._take_included(), kind=self.kind, delta=delta,
                            planned=planned)
