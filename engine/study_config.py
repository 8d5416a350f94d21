"""A tuning study's configuration: a base RunConfig, a search space and a mode, read from TOML.

    name = "study-digits"
    mode = "private"            # private | composition | exploratory
    search = "random"           # grid | random (private studies: random only)
    mean_runs = 3               # private: E[K], the mean number of candidate runs
    shape = 1.0                 # private: eta of the truncated negative binomial; "poisson" for Poisson
    score_noise_multiplier = 5  # private: std of the noise on each candidate's count of correct answers
    [base]                      # a run config, as in `dpw run`
    ...
    [space]                     # each searched setting and the values it may take
    learning_rate = [0.5, 1.0]

A PATE study (base mechanism = "pate") searches the aggregator and its noise, the number of
teachers, the student's queries and the teachers' training (PATE_SEARCHABLE); its candidates are
accounted by their data-independent bound (engine.study).

Every candidate is a RunConfig built from the base and one setting of the space, so the run
rules (bounds, combinations) are checked once, in engine.config, for the base and each candidate.
Errors are one line naming the field (`mode`, `base.epochs`, `space.learning_rate`).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config import RunConfig, read_toml
from engine.errors import ConfigError

MODES = ("private", "composition", "exploratory")
SEARCHES = ("grid", "random")
DPSGD_SEARCHABLE = ("learning_rate", "clipping_norm", "noise_multiplier", "target_epsilon", "expected_batch_size",
                    "epochs", "model")
PATE_SEARCHABLE = ("aggregator", "gnmax_sigma", "threshold", "sigma1", "sigma2", "laplace_scale", "num_teachers",
                   "num_queries", "teacher_epochs", "teacher_model", "learning_rate", "epochs", "model")
SEARCHABLE = tuple(dict.fromkeys(DPSGD_SEARCHABLE + PATE_SEARCHABLE))
# A setting of the space that fixes the noise replaces the base's other way of fixing it.
_NOISE_FIELDS = ("noise_multiplier", "target_epsilon", "target_attack_tpr")
MAX_CANDIDATES = 1000
TOP_LEVEL = ("name", "mode", "search", "num_candidates", "mean_runs", "shape", "score_noise_multiplier",
             "seed", "base", "space")


@dataclass(frozen=True)
class StudyConfig:
    """A validated study. `space` maps each searched field to the tuple of values it may take.

    `num_candidates`: how many runs a grid gives or a random search draws (composition,
    exploratory); a private study instead draws its number of runs K at random (`mean_runs`,
    `shape`: shape = inf is Poisson [PS22, Thm. 6]). `score_noise_multiplier`: a private study
    scores a candidate by its count of correct answers on the test split plus Gaussian noise of
    this standard deviation (sensitivity 1), whose cost enters the study's epsilon."""

    name: str
    mode: str
    base: RunConfig
    space: dict[str, tuple[Any, ...]]
    search: str = "grid"
    num_candidates: int | None = None
    mean_runs: float | None = None
    shape: float = 1.0
    score_noise_multiplier: float = 5.0
    seed: int = 0

    # ---- candidates ---------------------------------------------------------------------------
    def grid(self) -> list[dict[str, Any]]:
        """Every combination of the space's values, in the order they are written."""
        keys = list(self.space)
        return [dict(zip(keys, values)) for values in itertools.product(*(self.space[k] for k in keys))]

    def candidate(self, setting: dict[str, Any]) -> RunConfig:
        """The run config of one candidate: the base with `setting` applied (validated by RunConfig).
        Named by the study and the setting, not by its place in the study: a private study's released
        run must not tell how many candidates came before it."""
        shown = ", ".join(f"{k}={v}" for k, v in setting.items())
        return candidate_config(self.base, setting, name=f"{self.name} ({shown})")

    def with_data_dir(self, data_dir: str) -> "StudyConfig":
        return dataclasses.replace(self, base=self.base.replace(data_dir=data_dir))

    def to_dict(self) -> dict[str, Any]:
        """The study as its file would hold it (StudyConfig.from_dict reads it back)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.mode != "private":
            for key in ("mean_runs", "shape", "score_noise_multiplier"):
                del values[key]
        values = {k: v for k, v in values.items() if v is not None}
        values["base"] = self.base.to_dict()
        values["space"] = {k: list(v) for k, v in self.space.items()}
        if self.mode == "private":
            values["shape"] = "poisson" if math.isinf(self.shape) else self.shape
        return values

    # ---- reading ------------------------------------------------------------------------------
    @classmethod
    def load_toml(cls, path: str | Path) -> "StudyConfig":
        """A study file, its base config's relative paths taken from the file's folder."""
        config = cls.from_dict(read_toml(path, "study"))
        return dataclasses.replace(config, base=config.base.with_paths_from(Path(path).parent))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "StudyConfig":
        """Check every field and every candidate; the first problem is raised as one ConfigError."""
        values = dict(values)
        for key in values:
            if key not in TOP_LEVEL:
                close = difflib.get_close_matches(key, TOP_LEVEL, n=1)
                raise ConfigError(key, "is not a known study setting",
                                  hint=f"did you mean '{close[0]}'?" if close else "known: " + ", ".join(TOP_LEVEL))
        name = _text(values, "name", "study")
        mode = _choice(values, "mode", MODES, None)
        search = _choice(values, "search", SEARCHES, "random" if mode == "private" else "grid")
        base = _base(values.get("base"))
        space = _space(values.get("space"), base)
        num_candidates = _optional_int(values, "num_candidates", 1, MAX_CANDIDATES)
        seed = _optional_int(values, "seed", 0, 2**63 - 1)
        config = cls(name=name, mode=mode, base=base, space=space, search=search, num_candidates=num_candidates,
                     mean_runs=_optional_number(values, "mean_runs"), shape=_shape(values.get("shape", 1.0)),
                     score_noise_multiplier=_positive(values, "score_noise_multiplier", 5.0),
                     seed=base.seed if seed is None else seed)
        config._check_mode(values)
        for setting in config.grid():
            config.candidate(setting)  # every value the search may pick makes a valid run
        return config

    def _check_mode(self, values: dict[str, Any]) -> None:
        if self.mode in ("private", "composition"):
            if self.base.mechanism not in ("dpsgd", "pate"):
                raise ConfigError("base.mechanism", f"a {self.mode} study accounts DP-SGD or PATE candidates; got "
                                  f"{self.base.mechanism!r}", hint="use mechanism = \"dpsgd\" or \"pate\", or "
                                  "mode = \"exploratory\"")
            if self.base.normalization == "dp":
                raise ConfigError("base.normalization", f"a {self.mode} study does not yet account DP feature "
                                  "statistics", hint="use normalization = \"bounds\" (the default)")
        if self.mode == "private":
            if self.search != "random":
                raise ConfigError("search", "a private study repeats one randomised candidate [Papernot and "
                                  "Steinke 2022], so each candidate's settings are drawn at random",
                                  hint="use search = \"random\"")
            if self.num_candidates is not None:
                raise ConfigError("num_candidates", "a private study draws its number of runs at random "
                                  "(a fixed number would not be covered by its epsilon)",
                                  hint="remove it and set mean_runs")
            if self.mean_runs is None:
                raise ConfigError("mean_runs", "a private study needs the mean number of candidate runs",
                                  hint="set mean_runs, e.g. 3")
            if not 1 <= self.mean_runs <= MAX_CANDIDATES:
                raise ConfigError("mean_runs", f"{self.mean_runs:g} is out of range; allowed: from 1 to "
                                  f"{MAX_CANDIDATES}")
            return
        for key in ("mean_runs", "shape", "score_noise_multiplier"):
            if key in values:
                raise ConfigError(key, f"is used by private studies only (this one is {self.mode})",
                                  hint="remove it, or set mode = \"private\"")
        if self.search == "random" and self.num_candidates is None:
            raise ConfigError("num_candidates", "a random search needs the number of runs to draw",
                              hint="set num_candidates, e.g. 4")
        if self.search == "grid":
            if self.num_candidates is not None:
                raise ConfigError("num_candidates", "a grid runs every combination of the space",
                                  hint="remove it, or set search = \"random\"")
            if len(self.grid()) > MAX_CANDIDATES:
                raise ConfigError("space", f"the grid has {len(self.grid())} combinations; at most "
                                  f"{MAX_CANDIDATES}", hint="use fewer values, or search = \"random\"")


def candidate_config(base: RunConfig, setting: dict[str, Any], *, name: str) -> RunConfig:
    """`base` with `setting` applied; a noise setting (noise_multiplier or target_epsilon) replaces
    the base's. Errors name the searched field as `space.FIELD` and any other as `base.FIELD`."""
    changes: dict[str, Any] = {"name": name}
    for key in _NOISE_FIELDS:
        if key in setting:
            changes.update({k: None for k in _NOISE_FIELDS})
    changes.update(setting)
    values = {**base.to_dict(), **changes}
    try:
        return RunConfig.from_dict(values)
    except ConfigError as exc:
        prefix = "space" if exc.field in setting else "base"
        shown = ", ".join(f"{k} = {v!r}" for k, v in setting.items())
        raise _prefixed(exc, prefix, f" (in the candidate {shown})" if shown else "") from None


def _prefixed(exc: ConfigError, prefix: str, suffix: str = "") -> ConfigError:
    """The run config's error, its field named as in the study file (`base.epochs`)."""
    message = exc.message.removeprefix(f"{exc.field}: ")
    return ConfigError(f"{prefix}.{exc.field}", message + suffix, hint=exc.hint)


# ---- field readers ------------------------------------------------------------------------------
def _text(values: dict[str, Any], key: str, default: str) -> str:
    value = values.get(key, default)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(key, f"{value!r} is not a non-empty text")
    return value


def _choice(values: dict[str, Any], key: str, choices: tuple[str, ...], default: str | None) -> str:
    value = values.get(key, default)
    if value is None:
        raise ConfigError(key, "must be set", hint="allowed: " + ", ".join(choices))
    if value not in choices:
        raise ConfigError(key, f"{value!r} is not one of " + ", ".join(choices))
    return value


def _optional_int(values: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = values.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(key, f"{value!r} is not a whole number from {low} to {high}")
    return value


def _optional_number(values: dict[str, Any], key: str) -> float | None:
    value = values.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(key, f"{value!r} is not a finite number")
    return float(value)


def _positive(values: dict[str, Any], key: str, default: float) -> float:
    value = _optional_number(values, key)
    if value is None:
        return default
    if value <= 0:
        raise ConfigError(key, f"{value:g} is out of range; allowed: above 0")
    return value


def _shape(value: Any) -> float:
    if value == "poisson":
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > -1 and math.isfinite(value)):
        raise ConfigError("shape", f"{value!r} is out of range; allowed: a number above -1 (the truncated negative "
                          "binomial's eta: 1 geometric, 0 logarithmic), or \"poisson\"")
    return float(value)


def _base(table: Any) -> RunConfig:
    if not isinstance(table, dict):
        raise ConfigError("base", "must be a table of run settings", hint="add a [base] section as in `dpw run`")
    try:
        return RunConfig.from_dict(table)
    except ConfigError as exc:
        raise _prefixed(exc, "base") from None


def _space(table: Any, base: RunConfig) -> dict[str, tuple[Any, ...]]:
    if not isinstance(table, dict) or not table:
        raise ConfigError("space", "must be a table of the settings searched, each with its values",
                          hint="add e.g. [space] learning_rate = [0.5, 1.0]")
    space: dict[str, tuple[Any, ...]] = {}
    searchable = PATE_SEARCHABLE if base.mechanism == "pate" else DPSGD_SEARCHABLE
    for key, values in table.items():
        if key not in searchable:
            where = f"with mechanism = {base.mechanism!r}" if key in SEARCHABLE else "in a study"
            raise ConfigError(f"space.{key}", f"cannot be searched {where}",
                              hint="searchable: " + ", ".join(searchable))
        if not isinstance(values, list) or not values:
            raise ConfigError(f"space.{key}", f"{values!r} is not a non-empty list of values",
                              hint=f"e.g. {key} = [{getattr(base, key)!r}]")
        if len(set(map(repr, values))) != len(values):
            raise ConfigError(f"space.{key}", f"{values!r} lists a value twice")
        space[key] = tuple(values)
    if "noise_multiplier" in space and "target_epsilon" in space:
        raise ConfigError("space.target_epsilon", "cannot be searched together with noise_multiplier",
                          hint="search one way of setting the noise")
    return space
