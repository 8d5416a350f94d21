"""Differentially private per-feature mean and standard deviation of a table (Gaussian mechanism).

Each example's features are first clipped to declared ranges and mapped to z in [-1, 1]^F. The
released vector is (sum z, sum z^2) over the n training examples plus Gaussian noise. Adding or
removing one example changes it by (z, z^2), whose L2 norm is at most sqrt(2F), so noise of
standard deviation noise_multiplier * sqrt(2F) per coordinate makes the release the Gaussian
mechanism with that noise multiplier: (alpha, alpha / (2 noise_multiplier^2))-RDP [Mir17, Prop. 7],
composed with training by adding RDP [Mir17, Prop. 1]. The count n is treated as public, as the
DP-SGD sample rate already does.

[Mir17] I. Mironov, "Renyi Differential Privacy", CSF 2017.
"""

from __future__ import annotations

import math

import numpy as np

from engine.privacy.rdp import SMALLEST_SQUARABLE_SIGMA

__all__ = ["MIN_STD", "gaussian_rdp", "noisy_moments"]

MIN_STD = 1e-3
"""Smallest standard deviation released (in units of the half-range), so noise cannot make it 0."""


def gaussian_rdp(*, noise_multiplier: float, orders) -> np.ndarray:
    """RDP of one release of the Gaussian mechanism with L2 sensitivity 1 and noise std
    `noise_multiplier`: alpha / (2 noise_multiplier^2) at each order [Mir17, Prop. 7]; inf where that
    passes float range, and for a noise multiplier below ~1.5e-154 (whose square is no normal float)."""
    if not (isinstance(noise_multiplier, (int, float)) and math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be a finite number > 0; got {noise_multiplier!r}")
    alphas = np.asarray(orders, dtype=float)
    if noise_multiplier < SMALLEST_SQUARABLE_SIGMA:
        return np.full_like(alphas, np.inf)
    with np.errstate(over="ignore"):
        return alphas / (2.0 * float(noise_multiplier) ** 2)


def noisy_moments(*, z_sum: np.ndarray, z_sq_sum: np.ndarray, count: int, noise_multiplier: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) of z in [-1, 1] per feature from the noised sums (module docstring).

    The noise comes from `rng`, which must be the run's secret generator. Post-processing only
    (free): the mean is clipped to [-1, 1], the variance to [MIN_STD^2, 1].
    """
    z_sum = np.asarray(z_sum, dtype=float)
    z_sq_sum = np.asarray(z_sq_sum, dtype=float)
    if z_sum.shape != z_sq_sum.shape or z_sum.ndim != 1:
        raise ValueError("z_sum and z_sq_sum must be 1-d arrays of the same length (one entry per feature)")
    if count < 1:
        raise ValueError(f"count must be >= 1; got {count!r}")
    gaussian_rdp(noise_multiplier=noise_multiplier, orders=[2.0])  # validates
    scale = noise_multiplier * math.sqrt(2.0 * z_sum.size)
    noisy_sum = z_sum + rng.normal(0.0, scale, size=z_sum.size)
    noisy_sq = z_sq_sum + rng.normal(0.0, scale, size=z_sum.size)
    mean = np.clip(noisy_sum / count, -1.0, 1.0)
    var = np.clip(noisy_sq / count - mean**2, MIN_STD**2, 1.0)
    return mean, np.sqrt(var)
