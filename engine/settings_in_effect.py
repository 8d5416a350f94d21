"""Which settings of a run config take effect, given the values of the others.

`engine.config.fields_used` says which fields a mechanism (and PATE aggregator) reads; a few more
fields matter only for some values of another one: the momentum only for the 'momentum' optimizer,
the label column only for a CSV file, test examples given apart only for a CSV file or a folder,
the test fraction only for data without a test split of its own (published, or given apart), the
declared classes only for a user's own data, the table scaling settings not for a registered image
dataset (scaled by fixed constants), the statistics' noise multiplier only for normalization = 'dp',
the attack FPR only with a target attack TPR, the canary kind only with audit canaries. The setup
form shows, and `dpw show`, the window's run panel, Compare and a report list, exactly these.
"""

from __future__ import annotations

from typing import Any, Mapping

from engine.config import config_fields, fields_used

TABLE_SCALING = ("normalization", "feature_bounds", "normalization_noise_multiplier")


def settings_in_effect(values: Mapping[str, Any]) -> list[str]:
    """The field names a run with these `values` reads, in form order."""
    mechanism = str(values.get("mechanism") or "dpsgd").strip()
    aggregator = values.get("aggregator")
    aggregator = str(aggregator).strip() if aggregator is not None else None
    from engine.datasets import has_published_test_split, is_registered, is_registered_image, takes_test_data

    dataset = str(values.get("dataset") or "").strip().lower()
    unused = set()
    if str(values.get("optimizer") or "").strip() != "momentum":
        unused.add("momentum")
    if not dataset.endswith(".csv"):
        unused.add("label_column")
    given_apart = takes_test_data(dataset)
    if not given_apart:
        unused.add("test_data")
    if has_published_test_split(dataset) or (given_apart and str(values.get("test_data") or "").strip()):
        unused.add("test_fraction")
    if is_registered(dataset):  # its classes are published
        unused.add("classes")
    if is_registered_image(dataset):
        unused.update(TABLE_SCALING)
    if str(values.get("normalization") or "").strip() != "dp":
        unused.add("normalization_noise_multiplier")
    if _unset(values.get("target_attack_tpr")):
        unused.add("target_attack_fpr")
    if _unset(values.get("audit_canaries")) or str(values.get("audit_canaries")).strip() == "0":
        unused.add("audit_canary_kind")
    return [name for name in fields_used(mechanism, aggregator) if name not in unused]


def _unset(value: Any) -> bool:
    """No value: None in a config, an empty text in the form."""
    return value is None or str(value).strip() == ""


def settings_without_effect(values: Mapping[str, Any]) -> list[str]:
    """Settings set away from their default that a run with these `values` does not read (a PATE run's
    target_epsilon, a baseline's noise_multiplier): what a config file says that the run will not do."""
    used = set(settings_in_effect(values))
    return [name for name, default, _ in config_fields()
            if name in values and name not in used and values[name] != default]


def why_without_effect(name: str, values: Mapping[str, Any]) -> str:
    """Why `name` (one of settings_without_effect) is not read, in words."""
    from engine.config import field_spec

    from engine.datasets import is_registered_image

    mechanisms = field_spec(name).mechanisms
    mechanism = str(values.get("mechanism") or "dpsgd").strip()
    if mechanisms and mechanism not in mechanisms:
        return f"only {' and '.join(repr(m) for m in mechanisms)} runs read it, and this run's mechanism is {mechanism!r}"
    if name in TABLE_SCALING and is_registered_image(str(values.get("dataset") or "")):
        return f"{values.get('dataset')} is an image dataset, scaled by fixed constants"
    return "this run does not read it with its other settings (`dpw settings NAME` says when it applies)"
