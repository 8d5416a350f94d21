"""How table features are scaled before training, and what of the data that scaling reveals.

Three choices (config field `normalization`):

- "bounds" (default): data-independent. Each feature with a declared range [low, high]
  (`feature_bounds`) is clipped to it and mapped to [-1, 1]: mean = (low + high) / 2,
  std = (high - low) / 2. A feature without a declared range is used as it is (mean 0, std 1).
  Nothing about the data is released.
- "dp": the per-feature mean and standard deviation are estimated with the Gaussian mechanism
  (engine.privacy.feature_stats) inside declared ranges (every feature needs one), and the run's
  epsilon includes that release (RDP composition with the training).
- "exact": mean and standard deviation of the training split without noise (the old behaviour):
  released with the model, so a private run states no guarantee at all (engine.publication). Fine
  for a non-private baseline. Tables only, as "dp" (images use fixed constants).

The transform shipped with the model is x_normalized = (clip(x_raw, low, high) - mean) / std,
with `low`/`high` None for an unclipped feature.

`feature_bounds` is text: "low:high" for every feature, or entries "name=low:high" separated by
";" where "*=low:high" covers the features not named, e.g. "age=0:120; income=0:1e6; *=-5:5".
CSV features are named by their header; NPZ features by their index ("0", "1", ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.errors import ConfigError

NORMALIZATIONS = ("bounds", "dp", "exact")
_BLOCK_ROWS = 65_536  # rows scaled at a time into the float32 output


@dataclass(frozen=True)
class FeatureBounds:
    """Declared ranges: per feature name, and `default` for the features not named (or None)."""

    named: tuple[tuple[str, float, float], ...] = ()
    default: tuple[float, float] | None = None
    origin: str = "declared feature bounds"  # where the ranges come from, for the shipped description

    def for_features(self, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) arrays over `names`; NaN where a feature has no declared range."""
        known = {name: (lo, hi) for name, lo, hi in self.named}
        unknown = sorted(set(known) - set(names))
        if unknown:
            raise ConfigError(
                "feature_bounds",
                f"names feature(s) {', '.join(map(repr, unknown))} that the data does not have",
                hint="the features are: " + ", ".join(map(repr, names[:20])) + (" ..." if len(names) > 20 else ""),
            )
        fallback = self.default if self.default is not None else (math.nan, math.nan)
        pairs = [known.get(name, fallback) for name in names]
        return np.array([p[0] for p in pairs], dtype=np.float64), np.array([p[1] for p in pairs], dtype=np.float64)


def parse_feature_bounds(text: str | None) -> FeatureBounds:
    """Parse `feature_bounds` text (see the module docstring); ConfigError naming the bad entry."""
    if text is None or not text.strip():
        return FeatureBounds()
    entries = [e.strip() for e in text.split(";") if e.strip()]
    named: list[tuple[str, float, float]] = []
    default = None
    for entry in entries:
        name, _, rng = entry.rpartition("=") if "=" in entry else ("*", "=", entry)
        name = name.strip()
        low, high = _range(entry, rng)
        if name == "*":
            if default is not None:
                raise ConfigError("feature_bounds", f"gives the range for all other features twice ({entry!r})")
            default = (low, high)
        elif not name:
            raise ConfigError("feature_bounds", f"{entry!r} has no feature name before '='",
                              hint="write name=low:high, or *=low:high for every feature not named")
        elif any(n == name for n, _, _ in named):
            raise ConfigError("feature_bounds", f"names feature {name!r} twice")
        else:
            named.append((name, low, high))
    if len(entries) > 1 and any("=" not in e for e in entries):
        raise ConfigError("feature_bounds", "mixes a bare low:high with named ranges",
                          hint="write *=low:high for the features not named")
    return FeatureBounds(tuple(named), default)


def _range(entry: str, text: str) -> tuple[float, float]:
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        low, high = float(parts[0]), float(parts[1])
    except ValueError:
        raise ConfigError("feature_bounds", f"{entry!r} is not a range low:high",
                          hint='e.g. "0:1" for every feature, or "age=0:120; *=-5:5"') from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ConfigError("feature_bounds", f"{entry!r}: the range must be finite with low < high")
    return low, high


@dataclass(frozen=True)
class Scaling:
    """The per-feature transform (x - mean) / std after clipping to [low, high] (NaN: no clip)."""

    mean: np.ndarray
    std: np.ndarray
    low: np.ndarray
    high: np.ndarray
    source: str
    noise_multiplier: float | None = None  # "dp": the Gaussian mechanism's noise multiplier

    def as_dict(self) -> dict:
        """The JSON form stored with the model (`Dataset.normalization`)."""
        out = {
            "mean": [float(v) for v in self.mean],
            "std": [float(v) for v in self.std],
            "source": self.source,
        }
        if np.isfinite(self.low).any() or np.isfinite(self.high).any():
            out["low"] = [float(v) if math.isfinite(v) else None for v in self.low]
            out["high"] = [float(v) if math.isfinite(v) else None for v in self.high]
        if self.noise_multiplier is not None:
            out["noise_multiplier"] = self.noise_multiplier
        return out

    def apply(self, x: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """float32 (clip(x[rows]) - mean) / std, a block of rows at a time (no float64 copy of x)."""
        n = len(x) if rows is None else len(rows)
        out = np.empty((n, x.shape[1]), dtype=np.float32)
        low = np.where(np.isfinite(self.low), self.low, -np.inf)
        high = np.where(np.isfinite(self.high), self.high, np.inf)
        for start in range(0, n, _BLOCK_ROWS):
            stop = min(start + _BLOCK_ROWS, n)
            block = x[start:stop] if rows is None else x[rows[start:stop]]
            block = np.clip(block, low, high)
            out[start:stop] = (block - self.mean) / self.std
        return out


def table_scaling(x: np.ndarray, rows: np.ndarray | None, *, names: tuple[str, ...], normalization: str,
                  bounds: FeatureBounds, noise_multiplier: float | None = None,
                  rng: np.random.Generator | None = None) -> Scaling:
    """The scaling of a table's features from its training rows `rows` of `x` (None: all rows)."""
    low, high = bounds.for_features(names)
    bounded = np.isfinite(low)
    if normalization == "exact":
        train = x if rows is None else x[rows]
        clipped = np.clip(train, np.where(bounded, low, -np.inf), np.where(bounded, high, np.inf))
        mean, std = clipped.mean(axis=0), clipped.std(axis=0)
        std = np.where(std > 1e-12, std, 1.0)
        return Scaling(mean, std, low, high, "training split statistics (computed without noise: not covered by "
                       "the guarantee)")
    mid = np.where(bounded, (low + high) / 2.0, 0.0)
    half = np.where(bounded, (high - low) / 2.0, 1.0)
    if normalization == "bounds":
        source = f"{bounds.origin} (independent of the data)"
        if not bounded.all():
            source += f"; {int((~bounded).sum())} feature(s) without bounds used unscaled"
        return Scaling(mid, half, low, high, source)
    if normalization == "dp":
        if not bounded.all():
            missing = [n for n, b in zip(names, bounded) if not b]
            raise ConfigError(
                "feature_bounds",
                f"normalization 'dp' needs a range for every feature; none for {', '.join(map(repr, missing[:5]))}"
                + (" ..." if len(missing) > 5 else ""),
                hint="add name=low:high entries, or *=low:high for all features not named",
            )
        from engine.privacy.feature_stats import noisy_moments

        if noise_multiplier is None or rng is None:
            raise ValueError("normalization 'dp' needs noise_multiplier and a secret generator")
        n = len(x) if rows is None else len(rows)
        z_sum = np.zeros(x.shape[1])
        z_sq_sum = np.zeros(x.shape[1])
        for start in range(0, n, _BLOCK_ROWS):
            stop = min(start + _BLOCK_ROWS, n)
            block = x[start:stop] if rows is None else x[rows[start:stop]]
            z = (np.clip(block, low, high) - mid) / half
            z_sum += z.sum(axis=0)
            z_sq_sum += np.square(z).sum(axis=0)
        mean_z, std_z = noisy_moments(z_sum=z_sum, z_sq_sum=z_sq_sum, count=n, noise_multiplier=noise_multiplier,
                                      rng=rng)
        return Scaling(mid + half * mean_z, half * std_z, low, high,
                       f"differentially private estimate inside declared feature bounds (Gaussian mechanism, "
                       f"noise multiplier {noise_multiplier:g}; included in the run's epsilon)", noise_multiplier)
    raise ConfigError("normalization", f"{normalization!r} is not one of {', '.join(map(repr, NORMALIZATIONS))}")
