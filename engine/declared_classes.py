"""Classes declared in the config (`classes`), known without looking at the data.

Without them, a user's data (a CSV, an `.npz`, a folder) gets its classes from its own labels: the
model has one output per label found and the export names them all, so an example whose class no
other example has changes the model's shape, and the guarantee does not hide it. Declared classes
fix the model's outputs in advance: a class the data lacks still gets its output, and a label
outside them is refused before training.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.errors import ConfigError, DataError

FIELD = "classes"


def parse_classes(text: str | None) -> tuple[str, ...] | None:
    """The class names of `classes` ("healthy, flu, other": comma separated, in output order), None
    when unset; ConfigError for an empty name, a name given twice, or fewer than two classes."""
    if text is None or not str(text).strip():
        return None
    names = tuple(name.strip() for name in str(text).split(","))
    if any(not name for name in names):
        raise ConfigError(FIELD, f"{text!r} has an empty class name", hint="separate the names by single commas")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(FIELD, f"names {', '.join(map(repr, twice))} more than once", hint="name each class once")
    if len(names) < 2:
        raise ConfigError(FIELD, f"{text!r} names one class; classification needs at least two",
                          hint="list every class the model should tell apart, separated by commas")
    return names


def output_of_each_label(found: Sequence[str], declared: Sequence[str], *, what: str) -> np.ndarray:
    """For the labels found in the data (their names, in the order of their codes 0..k-1), the
    declared class each becomes (int64 codes into `declared`); DataError naming a label outside them."""
    index = {name: i for i, name in enumerate(declared)}
    outside = [name for name in found if name not in index]
    if outside:
        shown = ", ".join(repr(n) for n in outside[:5]) + (f" and {len(outside) - 5} more" if len(outside) > 5 else "")
        raise DataError(f"{what}: label {shown} is not among the declared classes ({', '.join(declared)}); add it "
                        "to classes or correct the data")
    return np.array([index[name] for name in found], dtype=np.int64)
