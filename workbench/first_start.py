"""The example a first start of the window offers: a run that works on this machine as it is.

The quick MNIST run when the MNIST files are in the data folder, else the quick start on built-in
data (no files, no network), so Start works on a fresh machine. Qt-free, so it is tested without
a window.
"""

from __future__ import annotations

from pathlib import Path

from engine.datasets import find_missing_files
from engine.errors import DPWError

EXAMPLES = Path(__file__).resolve().parents[1] / "resources" / "examples"
MNIST_EXAMPLE = EXAMPLES / "dpsgd-mnist-quick.toml"
BUILT_IN_EXAMPLE = EXAMPLES / "quickstart.toml"


def first_config(data_dir: str | Path | None = None) -> Path:
    """The example config to load into an empty form (data_dir as `engine.datasets.resolve_data_dir`)."""
    try:
        if not find_missing_files("mnist", data_dir):
            return MNIST_EXAMPLE
    except (DPWError, OSError):  # an unreadable data folder: offer what needs none
        pass
    return BUILT_IN_EXAMPLE
