"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The real MNIST folder (the four IDX .gz files). Fails, never skips, when it is missing.

    Looked up in $DPW_TEST_MNIST_DIR, then ../shared/data/mnist beside the repository, then
    /work/shared/data/mnist. Its parent is a valid data_dir for load_dataset("mnist").
    """
    repo = Path(__file__).resolve().parents[1]
    candidates = [Path(p) for p in (os.environ.get("DPW_TEST_MNIST_DIR"),) if p]
    candidates += [repo.parent / "shared" / "data" / "mnist", Path("/work/shared/data/mnist")]
    for folder in candidates:
        if all((folder / name).is_file() for name in _MNIST_FILES):
            return folder.resolve()  # a config's relative data_dir is taken from the config's own folder
    pytest.fail(
        f"real MNIST files not found; looked in {', '.join(map(str, candidates))} for {', '.join(_MNIST_FILES)} "
        f"(set DPW_TEST_MNIST_DIR to the folder holding them)"
    )


@pytest.fixture(scope="module")
def one_torch_thread():
    """For modules of many small torch operations (`pytestmark = pytest.mark.usefixtures(...)`): on a
    shared 2-core machine two OpenMP threads wait on each other (10-30x slower when another process
    holds a core), one thread does not."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
