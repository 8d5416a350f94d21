"""A first start offers an example that runs on this machine: MNIST when its files are there."""

from __future__ import annotations

from engine.config import RunConfig
from workbench.first_start import BUILT_IN_EXAMPLE, MNIST_EXAMPLE, first_config


def test_without_mnist_files_the_first_example_is_the_built_in_quick_start(tmp_path):
    chosen = first_config(tmp_path)
    assert chosen == BUILT_IN_EXAMPLE
    assert RunConfig.load_toml(chosen).dataset == "digits"


def test_with_mnist_files_the_first_example_is_the_quick_mnist_run(mnist_dir):
    chosen = first_config(mnist_dir.parent)
    assert chosen == MNIST_EXAMPLE
    assert RunConfig.load_toml(chosen).dataset == "mnist"
