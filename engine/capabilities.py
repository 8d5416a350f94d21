"""What the engine offers on this machine: its device, the registered datasets (and which of their
files are missing), the models and which fit each dataset.

The window asks this of a process that imports torch anyway: its runner on standby
(engine.runner.wait_for_run), else its pre-run check's helper (engine.precheck); the answer fills in
the status bar's device and the dataset and model lists.
"""

from __future__ import annotations

from typing import Any


def engine_capabilities() -> dict[str, Any]:
    """{"device", "device_name", "torch", "datasets": [...], "models": [...]}, JSON-ready."""
    import torch

    from engine.datasets import find_missing_files, list_datasets
    from engine.models import list_models, models_for

    cuda = bool(torch.cuda.is_available())
    datasets = []
    for info in list_datasets():
        try:
            missing = list(find_missing_files(info.name)) if info.needs_files else []
        except Exception:  # a data folder we cannot read is the runner's to report
            missing = []
        datasets.append({"name": info.name, "kind": info.kind, "description": info.description,
                         "needs_files": info.needs_files, "missing": missing,
                         "input_shape": list(info.input_shape) if info.input_shape else None,
                         "models": models_for(tuple(info.input_shape)) if info.input_shape else None})
    return {
        "device": "cuda" if cuda else "cpu",
        "device_name": torch.cuda.get_device_name(0) if cuda else "",
        "torch": torch.__version__,
        "datasets": datasets,
        "models": [{"name": m.name, "kinds": list(m.kinds), "description": m.description} for m in list_models()],
    }
