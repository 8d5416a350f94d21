"""The three privacy mechanisms of DP-SGD, each small enough to test statistically.

- Poisson sampling: every example joins a step independently with probability (at most) q.
- Per-example clipping: each example's gradient is scaled to L2 norm at most C.
- Gaussian noise: N(0, (sigma*C)^2) on every coordinate of the sum of clipped gradients.

Sampling and noise draw from the run's private randomness (`engine.randomness`): a secret torch
generator ("standard" noise sampler) or a `SecureGenerator` ("hardened").
"""

from __future__ import annotations

import math

import torch

from engine.randomness import SecureGenerator

NORM_EPS = 1e-6  # keeps the clip factor finite for zero gradients; makes norms <= C strictly
SAMPLING_BITS = 62  # inclusion draws are uniform integers in [0, 2^62)

PrivateGenerator = torch.Generator | SecureGenerator


def inclusion_threshold(sample_rate: float) -> int:
    """floor(q * 2^62): an example joins a batch when a uniform integer in [0, 2^62) is below it.

    Its inclusion probability is then threshold / 2^62, never above q and below it by less than
    2^-62; the accountant's q is an upper bound, as the proof needs. (Comparing float32 uniforms
    with q gave ceil(q * 2^24) / 2^24, above q.) q * 2^62 is exact in floating point (a power of two).
    """
    if not 0.0 <= sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be in [0, 1]; got {sample_rate!r}")
    return math.floor(sample_rate * 2.0**SAMPLING_BITS)


def poisson_sample(num_examples: int, sample_rate: float, generator: PrivateGenerator,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """Indices of the examples in one Poisson-sampled batch (its size varies, mean q*N).

    `device`: where the indices go when `generator` is a SecureGenerator (a torch generator draws on
    its own device)."""
    threshold = inclusion_threshold(sample_rate)
    if isinstance(generator, SecureGenerator):
        draws = torch.from_numpy(generator.integers62(num_examples)).to(device or "cpu")
    else:
        draws = torch.randint(0, 2**SAMPLING_BITS, (num_examples,), generator=generator, device=generator.device,
                              dtype=torch.int64)
    return (draws < threshold).nonzero().squeeze(1)


def per_example_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of each example's whole gradient (all parameters together), shape (B,)."""
    batch = grads[0].shape[0]
    total = torch.zeros(batch, dtype=grads[0].dtype, device=grads[0].device)
    for g in grads:
        total += g.reshape(batch, -1).pow(2).sum(1)
    return total.sqrt()


def clip_factors(norms: torch.Tensor, clipping_norm: float, weights: torch.Tensor | None = None) -> torch.Tensor:
    """min(1, C / norm) per example: scaling by it leaves every gradient with norm <= C.

    An example whose norm is not finite (NaN or infinite: its loss or gradient overflowed) gets 0: it
    is left out of the step (`finite_rows` zeroes its gradient, where 0 * NaN would still be NaN),
    so one extreme example can neither ruin the sum nor reveal itself through it.
    `weights` (0 or 1 per example) multiply the factors: a padding row (weight 0) adds exactly nothing."""
    factors = torch.where(torch.isfinite(norms), (clipping_norm / (norms + NORM_EPS)).clamp(max=1.0), 0.0)
    return factors if weights is None else factors * weights


def finite_norms(norms: torch.Tensor) -> torch.Tensor | None:
    """Which examples' norms are finite (B,), the examples clip_factors keeps; None when all are on CPU,
    where asking costs nothing and spares finite_rows a pass over every gradient. (On a GPU the
    answer would make the host wait for the step; there the rows are always masked.)"""
    kept = torch.isfinite(norms)
    return None if kept.device.type == "cpu" and bool(kept.all()) else kept


def finite_rows(t: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
    """`t` (B, ...) with the rows of the examples not `kept` (B,) set to zero (see clip_factors): a factor
    of 0 alone would leave them NaN (0 * NaN). `kept` None: every row is kept."""
    return t if kept is None else torch.where(kept.view((-1,) + (1,) * (t.dim() - 1)), t, 0.0)


def clipped_sum(grads: list[torch.Tensor], clipping_norm: float,
                weights: torch.Tensor | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Sum over the batch of the clipped per-example gradients; also returns the raw norms."""
    norms = per_example_norms(grads)
    factors = clip_factors(norms, clipping_norm, weights)
    kept = finite_norms(norms)
    batch = factors.shape[0]
    summed = [(factors @ finite_rows(g, kept).reshape(batch, -1)).view(g.shape[1:]) for g in grads]
    return summed, norms


def add_gaussian_noise(
    summed: list[torch.Tensor], *, noise_multiplier: float, clipping_norm: float, generator: PrivateGenerator
) -> list[torch.Tensor]:
    """Add N(0, (noise_multiplier * clipping_norm)^2) to every coordinate.

    A torch generator: torch.randn in the gradient's dtype (fast). A SecureGenerator (hardened): the
    noise is drawn in float64 as a sum of independent Gaussians from CSPRNG bits, added to the sum in
    float64 and rounded once to the gradient's dtype (see `SecureGenerator` for what that defends)."""
    std = noise_multiplier * clipping_norm
    if isinstance(generator, SecureGenerator):
        return [
            (s.double() + torch.from_numpy(generator.normal(0.0, std, tuple(s.shape))).to(s.device)).to(s.dtype)
            for s in summed
        ]
    return [
        s + std * torch.randn(s.shape, generator=generator, device=s.device, dtype=s.dtype) for s in summed
    ]
