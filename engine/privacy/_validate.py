"""Argument checks shared by the privacy modules: one clear ValueError per bad input.

Each message names the argument, the value received and the allowed range, so that the
CLI and the window can show it to a person as it is.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def sample_rate(value: float) -> float:
    """Poisson sampling rate q: a probability, 0 <= q <= 1."""
    q = _real("sample_rate", value, "in [0, 1]")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"sample_rate must be in [0, 1] (a probability); got {value!r}")
    return q


def noise_multiplier(value: float) -> float:
    """Noise multiplier sigma (noise std / clipping norm): sigma >= 0, finite."""
    sigma = _real("noise_multiplier", value, ">= 0")
    if not 0.0 <= sigma < math.inf:
        raise ValueError(f"noise_multiplier must be finite and >= 0; got {value!r}")
    return sigma


def steps(value: int) -> int:
    """Number of composed steps: an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"steps must be a whole number >= 0; got {value!r}")
    if value < 0:
        raise ValueError(f"steps must be a whole number >= 0; got {value!r}")
    return int(value)


def delta(value: float) -> float:
    """Target delta: 0 < delta < 1."""
    d = _real("delta", value, "in (0, 1)")
    if not 0.0 < d < 1.0:
        raise ValueError(f"delta must be in (0, 1) (exclusive); got {value!r}")
    return d


def epsilon(value: float, name: str = "epsilon") -> float:
    """An epsilon: finite and >= 0."""
    e = _real(name, value, ">= 0")
    if not 0.0 <= e < math.inf:
        raise ValueError(f"{name} must be finite and >= 0; got {value!r}")
    return e


def positive(name: str, value: float) -> float:
    """A finite number > 0 (discretization steps, tolerances)."""
    x = _real(name, value, "> 0")
    if not 0.0 < x < math.inf:
        raise ValueError(f"{name} must be finite and > 0; got {value!r}")
    return x


def orders(value) -> np.ndarray:
    """RDP orders: a non-empty 1-d array of finite numbers > 1."""
    a = np.atleast_1d(np.asarray(value, dtype=float))
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"orders must be a non-empty 1-d sequence of numbers > 1; got {value!r}")
    bad = ~(np.isfinite(a) & (a > 1.0))
    if bad.any():
        raise ValueError(
            f"orders must be finite and > 1 (Renyi orders); got {a[bad][0]!r} among {a.size} orders"
        )
    return a


def rdp_curve(orders_value, rdp_value) -> tuple[np.ndarray, np.ndarray]:
    """An RDP curve: valid `orders` and one Renyi divergence (>= 0) per order, as float arrays."""
    alphas = orders(orders_value)
    values = np.atleast_1d(np.asarray(rdp_value, dtype=float))
    if values.shape != alphas.shape:
        raise ValueError(f"rdp must have one value per order: got {values.size} values for {alphas.size} orders")
    if np.isnan(values).any() or (values < 0).any():
        raise ValueError("rdp values must be >= 0 (Renyi divergences); got a negative or NaN value")
    return alphas, values


def _real(name: str, value, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number {allowed}; got {value!r}")
    x = float(value)
    if math.isnan(x):
        raise ValueError(f"{name} must be a number {allowed}; got NaN")
    return x
