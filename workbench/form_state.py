"""The setup form's state without Qt: text per field, parsed values, errors, the RunConfig.

The form widgets only hold text; everything they show about validity comes from here, and
every rule comes from `engine.config` (`config_fields`, `check_field`, `collect_errors`,
`RunConfig.check_against_dataset`), so the window never keeps a second copy of the rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from engine.config import RunConfig, check_field, collect_errors, config_fields
from engine.errors import ConfigError
from engine.settings_in_effect import settings_in_effect

UNSET_WHEN_HIDDEN = frozenset({"test_data", "normalization"})
"""Settings the config refuses where they do not apply (test examples given apart beside a registered
dataset, a table's normalization beside a registered image dataset): hidden by the dataset chosen, they
are left unset rather than kept to block Start unseen."""
THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+")  # 1,000 and 60,000: commas between groups of three

# Training/test split sizes of the registered datasets, for the live cost preview before any data
# is loaded (the engine's registry states them only in its descriptions). Built-in tables have no
# standard split: (total, None) and the split follows test_fraction.
KNOWN_SIZES: dict[str, tuple[int, int | None]] = {
    "mnist": (60_000, 10_000),
    "fashion-mnist": (60_000, 10_000),
    "cifar10": (50_000, 10_000),
    "svhn": (73_257, 26_032),
    "digits": (1_797, None),
    "breast-cancer": (569, None),
}

GROUP_TITLES = {
    "run": "Run",
    "data": "Data",
    "model": "Model",
    "privacy": "Privacy",
    "training": "Training",
    "pate": "PATE",
}


@dataclass(frozen=True)
class DataSize:
    """How many training (and test) examples a config will see, and whether that is exact."""

    num_train: int
    num_test: int | None
    exact: bool


def field_names() -> list[str]:
    return [name for name, _, _ in config_fields()]


def specs() -> dict[str, Any]:
    return {name: spec for name, _, spec in config_fields()}


def defaults() -> dict[str, Any]:
    return {name: default for name, default, _ in config_fields()}


def to_text(name: str, value: Any) -> str:
    """How a value is shown in its text box ('' for unset)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if abs(value) < 1e16 else repr(value)
    return str(value)


def parse(name: str, text: str) -> tuple[Any, ConfigError | None]:
    """Text → value of the field's kind; the error says what was typed and what is allowed."""
    spec = specs()[name]
    text = text.strip()
    if text == "":
        if spec.kind is str and not spec.optional:
            return "", check_field(name, "")
        return None, check_field(name, None)
    if spec.kind is bool:
        lowered = text.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True, None
        if lowered in ("false", "0", "no", "off"):
            return False, None
        return None, ConfigError(name, f"{text!r} is not {spec.allowed()}")
    if spec.kind is int:
        try:  # a comma only as a thousands separator: "1,5" is a decimal comma, not fifteen
            if "," in text and not THOUSANDS.fullmatch(text):
                raise ValueError(text)
            value: Any = int(text.replace("_", "").replace(",", ""))
        except ValueError:
            return None, ConfigError(name, f"{text!r} is not {spec.allowed()}")
    elif spec.kind is float:
        try:
            value = float(text.replace("_", ""))
        except ValueError:
            return None, ConfigError(name, f"{text!r} is not {spec.allowed()}")
    else:
        value = text
    return value, check_field(name, value)


class FormState:
    """Texts of every field, the mechanism's visible subset, and what is wrong with them."""

    def __init__(self, values: dict[str, Any] | None = None):
        self.load_values(values or {})
        # dataset -> (input shape, models that fit it), from the engine's registry via the probe
        self.model_fits: dict[str, tuple[tuple[int, ...], list[str]]] = {}

    # ---- input ---------------------------------------------------------------------------------
    def set_text(self, name: str, text: str) -> None:
        self.texts[name] = text

    def set_values(self, values: dict[str, Any]) -> None:
        """Load plain values (a RunConfig's dict or a TOML file); unset optional fields become ''."""
        for name in field_names():
            if name in values:
                self.texts[name] = to_text(name, values[name])

    def load_values(self, values: dict[str, Any]) -> None:
        """The defaults, then each known setting of `values` (a config file that is not valid as a
        whole: its wrong settings are then marked, not refused one at a time)."""
        self.texts = {name: to_text(name, value) for name, value in defaults().items()}
        self.set_values(values)

    def load_config(self, config: RunConfig) -> None:
        values = config.to_dict()
        values.pop("schema_version", None)
        self.texts = {name: to_text(name, values.get(name)) for name in field_names()}

    @property
    def mechanism(self) -> str:
        return self.texts.get("mechanism", "dpsgd").strip() or "dpsgd"

    def visible(self) -> list[str]:
        """The fields this config reads (engine.settings_in_effect): the mechanism's, and of those
        only the ones the chosen optimizer, aggregator and dataset use."""
        return settings_in_effect(self.texts)

    # ---- derived -------------------------------------------------------------------------------
    def values(self) -> dict[str, Any]:
        """Parsed values of every field. A hidden field whose text does not parse keeps its default,
        so a setting of another mechanism never blocks this one invisibly; so does a hidden setting
        that the config refuses outright where it does not apply (UNSET_WHEN_HIDDEN)."""
        visible = set(self.visible())
        out: dict[str, Any] = {}
        for name, default in defaults().items():
            value, error = parse(name, self.texts[name])
            hidden = name not in visible
            out[name] = default if hidden and (error is not None or name in UNSET_WHEN_HIDDEN) else value
        return out

    def field_errors(self) -> dict[str, ConfigError]:
        """Errors of the visible fields on their own."""
        errors = {}
        for name in self.visible():
            _, error = parse(name, self.texts[name])
            if error is not None:
                errors[name] = error
        return errors

    def errors(self, size: DataSize | None = None) -> dict[str, ConfigError]:
        """Every problem at once, keyed by the field it is shown at: each field's own rule, the rules
        across fields, the model's fit and (when the data size is known) the rules that need the
        dataset, such as delta < 1/N. A field whose text is invalid takes its default for the rules
        that involve it, so its own error does not hide another field's."""
        errors = self.field_errors()
        values = self.values()
        defaults_ = defaults()
        for name in errors:
            values[name] = defaults_[name]
        for error in collect_errors(values):
            errors.setdefault(error.field, error)
        for name, error in self.model_errors(values).items():
            errors.setdefault(name, error)
        if size is not None:
            for error in self._dataset_errors(values, size):
                errors.setdefault(error.field, error)
        return errors

    @staticmethod
    def _dataset_errors(values: dict[str, Any], size: DataSize) -> list[ConfigError]:
        """The rules that need the data size (`RunConfig.check_against_dataset` stops at the first:
        ask again with that field at its default until none is left)."""
        found: list[ConfigError] = []
        values = dict(values)
        defaults_ = defaults()
        for _ in range(2 * len(values)):
            try:
                config = RunConfig.from_dict(values)
            except ConfigError as error:  # a field's own or a cross-field rule: shown already
                if values.get(error.field) == defaults_.get(error.field):
                    return found
                values[error.field] = defaults_.get(error.field)
                continue
            try:
                config.check_against_dataset(size.num_train, size.num_test)
                return found
            except ConfigError as error:
                if any(e.field == error.field for e in found):
                    return found
                found.append(error)
                if values.get(error.field) == defaults_.get(error.field):
                    return found
                values[error.field] = defaults_.get(error.field)
        return found

    def model_errors(self, values: dict[str, Any]) -> dict[str, ConfigError]:
        """A chosen model that does not fit the registered dataset's inputs (the engine would refuse
        it when the run starts)."""
        known = self.model_fits.get(str(values.get("dataset") or "").strip().lower())
        if known is None:
            return {}
        shape, fits = known
        fields = ["model"] + (["teacher_model"] if values.get("mechanism") == "pate" else [])
        errors = {}
        for name in fields:
            model = values.get(name)
            if model and model != "auto" and model not in fits:
                errors[name] = ConfigError(
                    name, f"{model!r} does not fit {values['dataset']!r} (inputs of shape {tuple(shape)})",
                    hint="models that fit: " + ", ".join(["auto", *fits]))
        return errors

    def config(self) -> RunConfig:
        """The RunConfig of these values; ConfigError (naming the field) when they are invalid."""
        return RunConfig.from_dict(self.values())

    def data_size(self) -> DataSize | None:
        """The training-set size N this config will see, from the table of known datasets."""
        values = self.values()
        known = KNOWN_SIZES.get(str(values.get("dataset") or "").strip().lower())
        if known is None:
            return None
        total, test = known
        exact = test is not None
        if test is None:  # a fraction the form refuses (1: no training example) is not the size to check against
            fraction = values.get("test_fraction")
            if fraction is None or check_field("test_fraction", fraction) is not None:
                fraction = defaults()["test_fraction"]
            test = round(total * fraction)
            total = total - test
            exact = False
        train = total
        subset = values.get("train_subset")
        if subset is not None and subset < train:
            train = subset
        return DataSize(train, test, exact)
