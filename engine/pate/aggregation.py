"""The noisy aggregators that release the teachers' plurality vote (numpy).

- LNMax [Papernot et al. 2017, Eq. 1]: argmax_j (n_j + Lap(b)).
- GNMax [Papernot et al. 2018, Sec. 4.1]: argmax_j (n_j + N(0, sigma^2)).
- Confident GNMax [Papernot et al. 2018, Algorithm 1]: answer only if
  max_j n_j + N(0, sigma1^2) >= T, then GNMax with sigma2; otherwise release "rejected" (-1).

Their privacy costs are in `engine.privacy.pate`. The noise comes from the generator the caller
passes: in a run, the run's private randomness (`engine.randomness`: a secret numpy generator, or a
SecureGenerator with the hardened noise sampler), never one seeded from the public `seed` unless
reproducible_noise is on. Nothing here is private state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.privacy.pate_smooth import ReleasedEpsilon, release_epsilon
from engine.randomness import PrivateRandomness, SecureGenerator

AGGREGATORS = ("confident", "gnmax", "lnmax")
REJECTED = -1


@dataclass(frozen=True)
class Released:
    """What the aggregator released per query: `labels` (REJECTED = -1 where not answered) and
    the `answered` mask (itself released: the student knows which queries went unanswered)."""

    labels: np.ndarray
    answered: np.ndarray

    @property
    def num_answered(self) -> int:
        return int(self.answered.sum())


def aggregate(
    votes: np.ndarray,
    *,
    aggregator: str,
    rng: np.random.Generator | SecureGenerator,
    laplace_scale: float | None = None,
    sigma: float | None = None,
    threshold: float | None = None,
    sigma1: float | None = None,
    sigma2: float | None = None,
) -> Released:
    """Release a label (or a rejection) for each row of `votes` (shape (queries, classes)).

    aggregator "lnmax" uses `laplace_scale`; "gnmax" uses `sigma`; "confident" uses `threshold`,
    `sigma1` and `sigma2`. Noise is drawn for every query in order, so the same generator state gives
    the same releases.
    """
    counts = np.asarray(votes, dtype=float)
    if counts.ndim != 2 or counts.shape[1] < 2:
        raise ValueError(f"votes must have shape (queries, classes >= 2); got {counts.shape}")
    n = counts.shape[0]
    if aggregator == "lnmax":
        _positive("laplace_scale", laplace_scale)
        labels = np.argmax(counts + rng.laplace(0.0, laplace_scale, size=counts.shape), axis=1)
        return Released(labels.astype(np.int64), np.ones(n, dtype=bool))
    if aggregator == "gnmax":
        _positive("sigma", sigma)
        labels = np.argmax(counts + rng.normal(0.0, sigma, size=counts.shape), axis=1)
        return Released(labels.astype(np.int64), np.ones(n, dtype=bool))
    if aggregator == "confident":
        _positive("sigma1", sigma1)
        _positive("sigma2", sigma2)
        if threshold is None:
            raise ValueError("threshold is needed for Confident GNMax")
        check = counts.max(axis=1) + rng.normal(0.0, sigma1, size=n)
        noisy = counts + rng.normal(0.0, sigma2, size=counts.shape)
        answered = check >= threshold
        labels = np.where(answered, np.argmax(noisy, axis=1), REJECTED)
        return Released(labels.astype(np.int64), answered)
    raise ValueError(f"aggregator must be one of {', '.join(AGGREGATORS)}; got {aggregator!r}")


def _positive(name: str, value: float | None) -> None:
    if value is None or not value > 0:
        raise ValueError(f"{name} must be > 0; got {value!r}")


def aggregator_noise(config: dict[str, Any]) -> dict[str, float]:
    """A PATE config's aggregator noise (`RunConfig.to_dict()` or a stored run's config), named as
    `aggregate` and engine.privacy.pate name it; Confident GNMax's threshold is not noise and is left out."""
    aggregator = config.get("aggregator")
    if aggregator == "gnmax":
        return {"sigma": config["gnmax_sigma"]}
    if aggregator == "lnmax":
        return {"laplace_scale": config["laplace_scale"]}
    return {"sigma1": config["sigma1"], "sigma2": config["sigma2"]}


def planned_epsilon_data_independent(config: Any, delta: float | None = None) -> float:
    """The data-independent epsilon of a PATE config (a RunConfig) if all its `num_queries` queries were
    answered, at `delta` (default: the config's): the bound a run states at most, known before training."""
    from engine.privacy.pate import epsilon_if_all_answered

    return epsilon_if_all_answered(mechanism=config.aggregator, num_queries=config.num_queries,
                                   delta=config.delta if delta is None else delta,
                                   **aggregator_noise(config.to_dict()))


def release_with_noise(randomness: PrivateRandomness, **release: Any) -> ReleasedEpsilon:
    """`pate_smooth.release_epsilon(**release)` with its one Gaussian draw from `randomness` (secret
    operating-system randomness unless the run's noise is reproducible): a PATE run's release and
    `dpw privacy pate --release` draw it the same way."""
    noise = float(randomness.numpy_generator("smooth_sensitivity_release").standard_normal())
    return release_epsilon(noise=noise, **release)
