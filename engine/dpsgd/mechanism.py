"""The three privacy mechanisms of DP-SGD, each small enough to test statistically.

- Poisson sampling: every example joins a step independently with probability q.
- Per-example clipping: each example's gradient is scaled to L2 norm at most C.
- Gaussian noise: N(0, (sigma*C)^2) on every coordinate of the sum of clipped gradients.
"""

from __future__ import annotations

import torch

NORM_EPS = 1e-6  # keeps the clip factor finite for zero gradients; makes norms <= C strictly


def poisson_sample(num_examples: int, sample_rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of the examples in one Poisson-sampled batch (its size varies, mean q*N)."""
    device = generator.device
    mask = torch.rand(num_examples, generator=generator, device=device) < sample_rate
    return mask.nonzero().squeeze(1)


def per_example_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of each example's whole gradient (all parameters together), shape (B,)."""
    batch = grads[0].shape[0]
    total = torch.zeros(batch, dtype=grads[0].dtype, device=grads[0].device)
    for g in grads:
        total += g.reshape(batch, -1).pow(2).sum(1)
    return total.sqrt()


def clip_factors(norms: torch.Tensor, clipping_norm: float) -> torch.Tensor:
    """min(1, C / norm) per example: scaling by it leaves every gradient with norm <= C."""
    return (clipping_norm / (norms + NORM_EPS)).clamp(max=1.0)


def clipped_sum(grads: list[torch.Tensor], clipping_norm: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Sum over the batch of the clipped per-example gradients; also returns the raw norms."""
    norms = per_example_norms(grads)
    factors = clip_factors(norms, clipping_norm)
    batch = factors.shape[0]
    summed = [(factors @ g.reshape(batch, -1)).view(g.shape[1:]) for g in grads]
    return summed, norms


def add_gaussian_noise(
    summed: list[torch.Tensor], *, noise_multiplier: float, clipping_norm: float, generator: torch.Generator
) -> list[torch.Tensor]:
    """Add N(0, (noise_multiplier * clipping_norm)^2) to every coordinate."""
    std = noise_multiplier * clipping_norm
    return [
        s + std * torch.randn(s.shape, generator=generator, device=s.device, dtype=s.dtype) for s in summed
    ]
