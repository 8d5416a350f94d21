"""Model registry: shapes, the exact DP MNIST CNN, auto choice, and the DP compatibility check."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.errors import ModelError
from engine.models import (
    MODELS,
    ModelInfo,
    build_model,
    check_dp_compatible,
    default_model_for,
    list_models,
    models_for,
)

CASES = [
    ("mnist_cnn", (1, 28, 28)),
    ("mnist_cnn", (3, 28, 28)),
    ("cifar_cnn", (3, 32, 32)),
    ("digits_cnn", (1, 8, 8)),
    ("mlp", (30,)),
    ("mlp", (1, 8, 8)),
    ("logistic", (30,)),
    ("logistic", (1, 28, 28)),
]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,shape", CASES)
def test_each_model_gives_logits_per_example(name, shape):
    torch.manual_seed(0)
    model = build_model(name, input_shape=shape, num_classes=7)
    out = model(torch.randn(5, *shape))
    assert out.shape == (5, 7) and out.dtype == torch.float32 and torch.isfinite(out).all()
    check_dp_compatible(model)


def test_mnist_cnn_has_the_exact_published_layers():
    model = build_model("mnist_cnn", input_shape=(1, 28, 28), num_classes=10)
    assert isinstance(model, nn.Sequential)
    assert [type(m) for m in model] == [
        nn.Conv2d, nn.Tanh, nn.MaxPool2d, nn.Conv2d, nn.Tanh, nn.MaxPool2d, nn.Flatten, nn.Linear, nn.Tanh, nn.Linear,
    ]
    conv1, conv2, fc1, fc2 = model[0], model[3], model[7], model[9]
    assert (conv1.in_channels, conv1.out_channels, conv1.kernel_size, conv1.stride, conv1.padding) == (
        1, 16, (8, 8), (2, 2), (3, 3)
    )
    assert (conv2.in_channels, conv2.out_channels, conv2.kernel_size, conv2.stride, conv2.padding) == (
        16, 32, (4, 4), (2, 2), (0, 0)
    )
    assert (model[2].kernel_size, model[2].stride) == (2, 1) and (model[5].kernel_size, model[5].stride) == (2, 1)
    assert (fc1.in_features, fc1.out_features, fc2.in_features, fc2.out_features) == (512, 32, 32, 10)
    # conv1 16*1*8*8+16, conv2 32*16*4*4+32, fc1 512*32+32, fc2 32*10+10
    assert n_params(model) == 1040 + 8224 + 16416 + 330 == 26010


def test_model_sizes_are_as_documented():
    assert n_params(build_model("logistic", input_shape=(30,), num_classes=2)) == 30 * 2 + 2
    assert n_params(build_model("mlp", input_shape=(30,), num_classes=2)) == 30 * 64 + 64 + 64 * 2 + 2
    cifar = build_model("cifar_cnn", input_shape=(3, 32, 32), num_classes=10)
    assert any(isinstance(m, nn.GroupNorm) for m in cifar)
    assert 400_000 < n_params(cifar) < 700_000


def test_incompatible_shape_names_model_shape_and_models_that_fit():
    with pytest.raises(ModelError) as err:
        build_model("mnist_cnn", input_shape=(3, 32, 32), num_classes=10)
    message = str(err.value)
    assert "'mnist_cnn'" in message and "(3, 32, 32)" in message
    assert "models that fit (3, 32, 32): cifar_cnn, mlp, logistic" in message
    with pytest.raises(ModelError, match=r"models that fit \(30,\): mlp, logistic"):
        build_model("cifar_cnn", input_shape=(30,), num_classes=2)


def test_bad_name_shape_and_class_count_are_model_errors():
    with pytest.raises(ModelError, match=r"unknown model 'resnet50'; choose one of: mnist_cnn"):
        build_model("resnet50", input_shape=(1, 28, 28), num_classes=10)
    with pytest.raises(ModelError, match="input_shape"):
        build_model("mlp", input_shape=(0, 4), num_classes=10)
    with pytest.raises(ModelError, match="num_classes 1"):
        build_model("mlp", input_shape=(4,), num_classes=1)


def test_default_model_for_datasets_and_shapes():
    class FakeDataset:
        kind = "image"
        input_shape = (1, 28, 28)

    assert default_model_for(FakeDataset()) == "mnist_cnn"
    assert default_model_for("image", (3, 32, 32)) == "cifar_cnn"
    assert default_model_for("image", (1, 8, 8)) == "digits_cnn"
    assert default_model_for("image", (1, 64, 64)) == "mlp"
    assert default_model_for("table", (30,)) == "mlp"
    with pytest.raises(ModelError):
        default_model_for("audio", (100,))
    auto = build_model("auto", input_shape=(1, 28, 28), num_classes=10)
    assert n_params(auto) == 26010


def test_default_model_for_a_loaded_dataset():
    from engine.datasets import load_dataset

    assert default_model_for(load_dataset("digits")) == "digits_cnn"
    assert default_model_for(load_dataset("breast-cancer")) == "mlp"


def test_batchnorm_is_refused_with_the_reason():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Tanh(), nn.Flatten(), nn.LazyLinear(2))
    with pytest.raises(ModelError) as err:
        check_dp_compatible(model)
    message = str(err.value)
    assert "layer '1' (BatchNorm2d)" in message
    assert "mixes examples within a batch" in message and "per-example clipping" in message
    assert "GroupNorm" in message


@pytest.mark.parametrize(
    "layer",
    [nn.BatchNorm1d(4), nn.BatchNorm3d(4), nn.SyncBatchNorm(4), nn.BatchNorm2d(4, track_running_stats=False)],
)
def test_every_batchnorm_variant_is_refused_even_when_nested(layer):
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), layer))
    with pytest.raises(ModelError, match=type(layer).__name__):
        check_dp_compatible(model)


def test_instance_norm_is_refused_only_with_running_stats():
    check_dp_compatible(nn.Sequential(nn.Conv2d(1, 4, 3), nn.InstanceNorm2d(4)))
    with pytest.raises(ModelError, match="track_running_stats"):
        check_dp_compatible(nn.Sequential(nn.Conv2d(1, 4, 3), nn.InstanceNorm2d(4, track_running_stats=True)))


def test_groupnorm_and_layernorm_models_are_accepted():
    check_dp_compatible(nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(4, 8), nn.Tanh()))
    check_dp_compatible(nn.Sequential(nn.Linear(3, 8), nn.LayerNorm(8)))


def test_registry_lists_models_with_kinds_and_fits():
    assert [m.name for m in list_models()] == ["mnist_cnn", "cifar_cnn", "digits_cnn", "mlp", "logistic"]
    assert all(isinstance(m, ModelInfo) and m.description and m.kinds for m in MODELS.values())
    assert "table" in MODELS["mlp"].kinds and MODELS["mnist_cnn"].kinds == ("image",)
    assert models_for((1, 8, 8)) == ["digits_cnn", "mlp", "logistic"]
    assert MODELS["cifar_cnn"].fits((3, 32, 32)) and not MODELS["cifar_cnn"].fits((1, 28, 28))
