"""Runs side by side, as the window's Compare view and `dpw compare` show them: results first (with the
epsilon engine.publication says each run may state), then the settings each run read
(engine.settings_in_effect), those that differ first.

Accuracy is comparable on one dataset and epsilon within one mechanism: `groups_of` says which
(dataset, mechanism) groups a selection spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.publication import publishable_epsilon, publishable_text
from engine.run_times import duration_seconds, format_duration

MECHANISM_NAMES = {"dpsgd": "DP-SGD", "pate": "PATE", "none": "non-private"}
NOT_USED = "—"  # a setting the run does not read

# The results rows that open a comparison: (key, label).
RESULT_ROWS = (
    ("accuracy", "Test accuracy"),
    ("epsilon", "ε (publishable)"),
    ("delta", "δ"),
    ("accountant", "Accountant"),
    ("steps", "Steps done / planned"),
    ("duration", "Wall time"),
    ("status", "Status"),
)


# ---- groups ------------------------------------------------------------------------------------------
def group_key(row: dict[str, Any]) -> tuple[str, str]:
    return (str(row.get("dataset") or "?"), str(row.get("mechanism") or "?"))


def group_label(key: tuple[str, str]) -> str:
    dataset, mechanism = key
    return f"{dataset} · {MECHANISM_NAMES.get(mechanism, mechanism)}"


def groups_of(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[int]]:
    """(dataset, mechanism) -> ids of the runs in it; the group of most runs first, ties in the order
    their first run comes."""
    groups: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        groups.setdefault(group_key(row), []).append(row["id"])
    return dict(sorted(groups.items(), key=lambda item: -len(item[1])))


# ---- results and settings ----------------------------------------------------------------------------
def result_texts(row: dict[str, Any]) -> dict[str, str]:
    """A run's results as a comparison shows them, with the epsilon engine.publication says it may state."""
    eps = publishable_epsilon(row)
    done, planned = row.get("steps_done"), row.get("steps_planned")
    return {
        "accuracy": "" if row.get("accuracy") is None else f"{row['accuracy']:.4f}",
        "epsilon": publishable_text(row),
        "delta": "" if eps.delta is None else f"{eps.delta:g}",
        "accountant": eps.accountant or "",
        "steps": "" if done is None else f"{done:,} / {planned:,}" if planned else f"{done:,}",
        "duration": format_duration(duration_seconds(row)),
        "status": str(row.get("status") or ""),
    }


def relevant_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings the run read (engine.settings_in_effect: a DP-SGD run has no PATE threshold, an
    MNIST run no test fraction), but its name, which heads its column; settings of another config
    version stay visible."""
    from engine.config import config_fields
    from engine.settings_in_effect import settings_in_effect

    used = set(settings_in_effect(config))
    known = {name for name, _, _ in config_fields()}
    return {k: v for k, v in config.items() if k not in ("schema_version", "name") and (k in used or k not in known)}


def differing_keys(configs: list[dict[str, Any]]) -> set[str]:
    """Settings whose value differs between the runs that read them (a PATE threshold is not a
    difference from a DP-SGD run, which has none)."""
    keys = set().union(*configs) if configs else set()
    return {k for k in keys if len({repr(c[k]) for c in configs if k in c}) > 1}


def setting_label(key: str) -> str:
    """A config key as the setup form labels it, with its unit: "Noise multiplier (× clipping norm)"."""
    from engine.config import field_spec

    try:
        spec = field_spec(key)
    except KeyError:
        return key  # a setting of another config version: its own name
    return f"{spec.label} ({spec.unit})" if spec.unit else spec.label


@dataclass(frozen=True)
class Comparison:
    """Runs side by side: `results[key][j]` the text of result `key` (RESULT_ROWS) of run j;
    `settings` the keys the runs read, those in `differ` first; `values[j]` run j's settings (a key
    it does not read is missing)."""

    results: dict[str, list[str]]
    settings: list[str]
    differ: set[str]
    values: list[dict[str, Any]]

    def setting_text(self, key: str, j: int) -> str:
        """Run j's value of `key` as shown: NOT_USED where it does not read it, 'unset' (as the setup
        form says) where it read no value."""
        if key not in self.values[j]:
            return NOT_USED
        value = self.values[j][key]
        return "unset" if value is None else str(value)


def compare_runs(rows: list[dict[str, Any]]) -> Comparison:
    """The comparison of stored runs (their rows, config included)."""
    values = [relevant_settings(r.get("config") or {}) for r in rows]
    differ = differing_keys(values)
    every = sorted(set().union(*values)) if values else []
    texts = [result_texts(r) for r in rows]
    return Comparison(results={key: [t[key] for t in texts] for key, _ in RESULT_ROWS},
                      settings=sorted(differ) + [k for k in every if k not in differ], differ=differ, values=values)
