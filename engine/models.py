"""Model registry: small networks known to train well with DP-SGD, built from standard layers.

Every model is a plain `nn.Sequential` of Conv2d, Linear, GroupNorm, Tanh, MaxPool2d and Flatten, so
a DP engine can compute per-example gradients layer by layer. Weights are initialised by torch's
global generator: seed it (`torch.manual_seed`) before `build_model` for reproducible weights.
Inputs are the normalized tensors of `engine.datasets.Dataset`, shape (B, *input_shape); outputs
are logits of shape (B, num_classes).

Tanh rather than ReLU: bounded activations train better under gradient clipping and noise
(Papernot et al. 2021, "Tempered Sigmoid Activations for Deep Learning with Differential Privacy").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from engine.errors import ModelError

if TYPE_CHECKING:
    from torch import nn

# torch is imported inside the builders: listing the registry (`dpw models`) needs no torch.

AUTO = "auto"
IMAGE_KIND = "image"  # same strings as engine.datasets.IMAGE / TABLE
TABLE_KIND = "table"


@dataclass(frozen=True)
class ModelInfo:
    """A registry entry. `shapes` says in words which input shapes the model accepts."""

    name: str
    description: str
    kinds: tuple[str, ...]
    shapes: str = "any"
    accepts: Callable[[tuple[int, ...]], bool] = field(default=lambda shape: True, repr=False, compare=False)
    builder: Callable[[tuple[int, ...], int], nn.Module] | None = field(default=None, repr=False, compare=False)

    def fits(self, input_shape: tuple[int, ...]) -> bool:
        """Whether this model can be built for inputs of shape `input_shape` (no batch dimension)."""
        return bool(self.accepts(tuple(input_shape)))


# --------------------------------------------------------------------------------------------
# Architectures
# --------------------------------------------------------------------------------------------


def _mnist_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Tramer & Boneh 2021 / Opacus MNIST example; 28x28 -> 14x14 -> 13x13 -> 5x5 -> 4x4."""
    from torch import nn

    channels = input_shape[0]
    return nn.Sequential(
        nn.Conv2d(channels, 16, kernel_size=8, stride=2, padding=3),
        nn.Tanh(),
        nn.MaxPool2d(kernel_size=2, stride=1),
        nn.Conv2d(16, 32, kernel_size=4, stride=2),
        nn.Tanh(),
        nn.MaxPool2d(kernel_size=2, stride=1),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 32),
        nn.Tanh(),
        nn.Linear(32, num_classes),
    )


MLP_HIDDEN = 64


def _mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Flatten -> Linear(F, 64) -> Tanh -> Linear(64, num_classes), F = prod(input_shape)."""
    from torch import nn

    features = math.prod(input_shape)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(features, MLP_HIDDEN),
        nn.Tanh(),
        nn.Linear(MLP_HIDDEN, num_classes),
    )


def _logistic(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Multinomial logistic regression: Flatten -> Linear(F, num_classes)."""
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


CIFAR_GROUPS = 8


def _conv_block(c_in: int, c_out: int) -> list[nn.Module]:
    from torch import nn

    return [nn.Conv2d(c_in, c_out, kernel_size=3, padding=1), nn.GroupNorm(CIFAR_GROUPS, c_out), nn.Tanh()]


def _cifar_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Papernot et al. 2021 CIFAR-10 CNN (32-32-pool-64-64-pool-128-128-pool, dense 128) with
    GroupNorm(8 groups) after each conv; 32x32 -> 16 -> 8 -> 4. About 550k parameters."""
    from torch import nn

    channels = input_shape[0]
    return nn.Sequential(
        *_conv_block(channels, 32),
        *_conv_block(32, 32),
        nn.MaxPool2d(2),
        *_conv_block(32, 64),
        *_conv_block(64, 64),
        nn.MaxPool2d(2),
        *_conv_block(64, 128),
        *_conv_block(128, 128),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(128 * 4 * 4, 128),
        nn.Tanh(),
        nn.Linear(128, num_classes),
    )


def _digits_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Small CNN for 8x8 images: 8x8 -> 4x4 -> 2x2, then a 32-unit dense layer."""
    from torch import nn

    channels = input_shape[0]
    return nn.Sequential(
        nn.Conv2d(channels, 16, kernel_size=3, padding=1),
        nn.Tanh(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, kernel_size=3, padding=1),
        nn.Tanh(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 2 * 2, 32),
        nn.Tanh(),
        nn.Linear(32, num_classes),
    )


def _image_of(h: int, w: int) -> Callable[[tuple[int, ...]], bool]:
    return lambda shape: len(shape) == 3 and shape[0] >= 1 and tuple(shape[1:]) == (h, w)


MODELS: dict[str, ModelInfo] = {
    info.name: info
    for info in (
        ModelInfo(
            name="mnist_cnn",
            description="DP MNIST CNN (Tramer & Boneh 2021; Opacus example): 2 conv + 2 dense, tanh, 26k parameters",
            kinds=("image",),
            shapes="images of shape (C, 28, 28)",
            accepts=_image_of(28, 28),
            builder=_mnist_cnn,
        ),
        ModelInfo(
            name="cifar_cnn",
            description="small CIFAR CNN: 6 conv with GroupNorm + 2 dense, tanh, about 550k parameters",
            kinds=("image",),
            shapes="images of shape (C, 32, 32)",
            accepts=_image_of(32, 32),
            builder=_cifar_cnn,
        ),
        ModelInfo(
            name="digits_cnn",
            description="small CNN for 8x8 images (scikit-learn digits): 2 conv + 2 dense, tanh",
            kinds=("image",),
            shapes="images of shape (C, 8, 8)",
            accepts=_image_of(8, 8),
            builder=_digits_cnn,
        ),
        ModelInfo(
            name="mlp",
            description=f"one hidden layer of {MLP_HIDDEN} tanh units on the flattened input",
            kinds=("table", "image"),
            shapes="any shape (flattened)",
            builder=_mlp,
        ),
        ModelInfo(
            name="logistic",
            description="multinomial logistic regression on the flattened input",
            kinds=("table", "image"),
            shapes="any shape (flattened)",
            builder=_logistic,
        ),
    )
}


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def list_models() -> list[ModelInfo]:
    """Every registered model, in display order."""
    return list(MODELS.values())


def models_for(input_shape: tuple[int, ...]) -> list[str]:
    """Names of the registered models that can be built for `input_shape`."""
    shape = tuple(input_shape)
    return [info.name for info in MODELS.values() if info.fits(shape)]


def _check_shape(name: str, input_shape: Any) -> tuple[int, ...]:
    try:
        shape = tuple(input_shape)
        ok = len(shape) > 0 and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
    except TypeError:
        ok = False
    if not ok:
        raise ModelError(
            f"model {name!r}: input_shape {input_shape!r} is not a shape; give positive whole numbers without "
            f"the batch dimension, e.g. (1, 28, 28) for images or (30,) for a table"
        )
    return shape


def build_model(name: str, *, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Build registry model `name` for inputs (B, *input_shape) and `num_classes` logits.

    `name="auto"` picks `default_model_for` the shape (3 dimensions: image, 1: table).
    """
    key = str(name).strip().lower().replace("-", "_")
    shape = _check_shape(key, input_shape)
    if key == AUTO:
        key = default_model_for(IMAGE_KIND if len(shape) == 3 else TABLE_KIND, shape)
    info = MODELS.get(key)
    if info is None:
        raise ModelError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}, or {AUTO!r}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ModelError(f"model {key!r}: num_classes {num_classes!r} is not allowed; it must be a whole number >= 2")
    if not info.fits(shape):
        fitting = models_for(shape)
        raise ModelError(
            f"model {key!r} does not fit input shape {shape}: it needs {info.shapes}; "
            f"models that fit {shape}: {', '.join(fitting) or 'none'}"
        )
    assert info.builder is not None
    return info.builder(shape, num_classes)


def default_model_for(dataset: Any, input_shape: tuple[int, ...] | None = None) -> str:
    """The model used for `model = "auto"`.

    Call as `default_model_for(dataset)` with anything having `.kind` and `.input_shape` (a
    `Dataset`), or `default_model_for(kind, input_shape)`. Images of 28x28 get mnist_cnn, 32x32
    cifar_cnn, 8x8 digits_cnn; other images and all tables get mlp.
    """
    if isinstance(dataset, str):
        kind = dataset
        if input_shape is None:
            raise ModelError(f"default_model_for({kind!r}): give the input_shape as well as the kind")
        shape = tuple(input_shape)
    else:
        kind, shape = dataset.kind, tuple(dataset.input_shape)
    if kind == IMAGE_KIND and len(shape) == 3:
        by_size = {(28, 28): "mnist_cnn", (32, 32): "cifar_cnn", (8, 8): "digits_cnn"}
        return by_size.get(tuple(shape[1:]), "mlp")
    if kind in (IMAGE_KIND, TABLE_KIND):
        return "mlp"
    raise ModelError(f"unknown dataset kind {kind!r}; expected {IMAGE_KIND!r} or {TABLE_KIND!r}")


def check_dp_compatible(model: nn.Module) -> None:
    """Raise ModelError if `model` holds a layer that breaks DP-SGD's per-example guarantee.

    BatchNorm (every `_BatchNorm` subclass, SyncBatchNorm included) normalizes with statistics of the
    whole batch, so one example's gradient depends on the others and clipping each example's gradient
    no longer bounds that example's influence. Instance norm with `track_running_stats` keeps running
    averages computed from the private batch without noise, which leak into the released model.
    GroupNorm and LayerNorm work per example and are fine.
    """
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.instancenorm import _InstanceNorm

    offenders: list[tuple[str, nn.Module, str]] = []
    for layer_name, module in model.named_modules():
        if isinstance(module, _BatchNorm):
            offenders.append((layer_name, module, "batch"))
        elif isinstance(module, _InstanceNorm) and module.track_running_stats:
            offenders.append((layer_name, module, "running"))
    if not offenders:
        return
    layer_name, module, why = offenders[0]
    extra = len(offenders) - 1
    more = f" (and {extra} more such layer{'s' if extra > 1 else ''})" if extra else ""
    where = f"layer {layer_name!r} ({type(module).__name__})" if layer_name else type(module).__name__
    if why == "batch":
        reason = (
            "batch normalization mixes examples within a batch, so per-example clipping no longer bounds one "
            "example's influence and the DP guarantee does not hold"
        )
    else:
        reason = (
            "its running statistics (track_running_stats=True) are averaged over the private batch without "
            "noise and would leak into the released model"
        )
    raise ModelError(
        f"{where}{more} cannot be trained with differential privacy: {reason}; "
        f"use GroupNorm (e.g. nn.GroupNorm(8, channels)) or LayerNorm instead",
        hint="the built-in models (see list_models) use GroupNorm or no normalization",
    )
