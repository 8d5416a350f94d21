"""Many models of one architecture as one module with stacked parameters.

Each parameter gets a leading "member" axis, so K teachers train in one forward/backward pass
instead of K small ones: member k only ever sees its own inputs and its own parameters, so the
gradient of sum_k loss_k with respect to member k's parameters is exactly the gradient of loss_k,
and elementwise optimizers (SGD, momentum, Adam) on the stacked tensors are K independent ones.

Two ways to run the members:
- a layer-by-layer path for `nn.Sequential` models of standard layers (all registered models):
  image activations are kept "wide", shape (B, K*C, H, W), so convolutions are grouped
  convolutions (groups = K), pooling and activations act per channel, GroupNorm uses K*G groups,
  and dense layers are batched matrix products on (K, B, F);
- any other model: `torch.func.functional_call` vectorised with `torch.func.vmap` over the
  stacked parameters (slower on CPU, where vmap turns convolutions into grouped ones anyway but
  with extra copies).
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

_ELEMENTWISE = (
    nn.Tanh, nn.ReLU, nn.Sigmoid, nn.GELU, nn.ELU, nn.LeakyReLU, nn.SiLU, nn.Softplus, nn.Identity, nn.Dropout,
)
_POOLS = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)


def _leaves(module: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]] | None:
    """The leaf layers of a (nested) nn.Sequential in order, or None for other containers."""
    if not isinstance(module, nn.Sequential):
        return None
    out: list[tuple[str, nn.Module]] = []
    for name, child in module.named_children():
        qual = f"{prefix}{name}"
        if isinstance(child, nn.Sequential):
            inner = _leaves(child, qual + ".")
            if inner is None:
                return None
            out.extend(inner)
        else:
            out.append((qual, child))
    return out


def _supported(layer: nn.Module) -> bool:
    if isinstance(layer, nn.Conv2d):
        return layer.padding_mode == "zeros"
    if isinstance(layer, nn.Flatten):
        return layer.start_dim == 1 and layer.end_dim == -1
    if isinstance(layer, nn.LayerNorm):
        return len(layer.normalized_shape) == 1
    return isinstance(layer, (nn.Linear, nn.GroupNorm, *_ELEMENTWISE, *_POOLS))


class StackedEnsemble(nn.Module):
    """K members of one architecture, run together. Inputs have a leading member axis.

    `forward(x)` with x of shape (K, B, *input_shape) gives logits (K, B, classes): member k on
    x[k]. `forward_shared(x)` with x of shape (B, *input_shape) runs every member on the same
    batch. `member_state_dict(k)` is member k as a plain state dict of the original architecture.
    """

    def __init__(self, models: Sequence[nn.Module], *, vectorize: str = "auto"):
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.num_members = len(models)
        template = models[0]
        # Kept out of the module tree (plain attributes), so their meta parameters are not ours.
        self.__dict__["_template_module"] = copy.deepcopy(template).to("meta")
        leaves = _leaves(template)
        fast_ok = leaves is not None and all(_supported(layer) for _, layer in leaves)
        if vectorize not in ("auto", "layers", "vmap"):
            raise ValueError(f"vectorize must be 'auto', 'layers' or 'vmap'; got {vectorize!r}")
        if vectorize == "layers" and not fast_ok:
            raise ValueError("this architecture has layers the layer-by-layer path does not cover; use 'vmap'")
        self.mode = "layers" if fast_ok and vectorize != "vmap" else "vmap"
        self.channels_last = True
        self.stacked = nn.ParameterDict()
        self._names: dict[str, str] = {}  # ParameterDict key -> name in the member's state dict
        self._transposed: set[str] = set()  # Linear weights, stored as (K, in, out)
        if self.mode == "layers":
            assert leaves is not None
            self._layers = [(qual, copy.deepcopy(layer).to("meta") if _has_params(layer) else layer)
                            for qual, layer in leaves]
            member_params = [dict(m.named_parameters()) for m in models]
            for qual, layer in leaves:
                for pname, _ in layer.named_parameters(recurse=False):
                    full = f"{qual}.{pname}"
                    key = full.replace(".", "__")
                    value = torch.stack([mp[full].detach() for mp in member_params])
                    if isinstance(layer, nn.Linear) and pname == "weight":
                        # Stored as (K, in, out): h @ W needs no transpose, and the gradient comes out
                        # in the parameter's own layout (no copy when it is accumulated).
                        value = value.transpose(1, 2)
                        self._transposed.add(key)
                    self.stacked[key] = nn.Parameter(value.contiguous().clone())
                    self._names[key] = full
            self._buffers_stacked: dict[str, torch.Tensor] = {}
        else:
            from torch.func import stack_module_state

            params, buffers = stack_module_state(list(models))
            for full, value in params.items():
                key = full.replace(".", "__")
                self.stacked[key] = nn.Parameter(value.detach().clone())
                self._names[key] = full
            self._buffers_stacked = {k: v.detach().clone() for k, v in buffers.items()}
            self.__dict__["_template"] = copy.deepcopy(template).to("meta")

    # ---- running ---------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != self.num_members:
            raise ValueError(f"expected inputs of shape ({self.num_members}, B, ...); got {tuple(x.shape)}")
        if self.mode == "vmap":
            return self._vmap(x, shared=False)
        return self._layers_forward(x, "stacked_image" if x.dim() == 5 else "flat")

    def forward_shared(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "vmap":
            return self._vmap(x, shared=True)
        return self._layers_forward(x, "shared_image" if x.dim() == 4 else "shared_flat")

    # Layouts of the activations h:
    #   stacked_image (K, B, C, H, W)  per-member images, before the first spatial layer
    #   shared_image  (B, C, H, W)     one batch for every member, before the first parameter
    #   shared_flat   (B, F)
    #   wide          (B, K*C, H, W)   channels_last: grouped convolutions, per-channel pooling
    #   flat          (K, B, F)        batched matrix products
    def _layers_forward(self, h: torch.Tensor, layout: str) -> torch.Tensor:
        k = self.num_members
        batch = h.shape[1] if layout in ("stacked_image", "flat") else h.shape[0]
        if layout == "flat":
            h = h.reshape(k, batch, -1)
        elif layout == "shared_flat":
            h = h.reshape(batch, -1)

        def to_wide(h: torch.Tensor, layout: str) -> torch.Tensor:
            if layout == "stacked_image":
                h = h.transpose(0, 1).reshape(batch, k * h.shape[2], h.shape[3], h.shape[4])
            elif layout == "shared_image":
                h = h.repeat(1, k, 1, 1)
            return h.contiguous(memory_format=torch.channels_last) if self.channels_last else h

        def to_flat(h: torch.Tensor, layout: str) -> torch.Tensor:
            if layout == "shared_flat":
                return h.unsqueeze(0).expand(k, batch, h.shape[1])
            if layout in ("stacked_image", "shared_image"):
                h = h.reshape(k, batch, -1) if layout == "stacked_image" else h.reshape(batch, -1)
                return h if layout == "stacked_image" else h.unsqueeze(0).expand(k, batch, h.shape[1])
            return h

        for qual, layer in self._layers:
            key = qual.replace(".", "__")
            if isinstance(layer, nn.Conv2d):
                w = self.stacked[key + "__weight"]
                w = w.reshape(k * w.shape[1], *w.shape[2:])
                bias = self.stacked[key + "__bias"].reshape(-1) if layer.bias is not None else None
                if layout == "shared_image" and layer.groups == 1:
                    # Same input for all members: one dense convolution with K * out channels.
                    h = F.conv2d(h.contiguous(memory_format=torch.channels_last) if self.channels_last else h,
                                 w, bias, layer.stride, layer.padding, layer.dilation, 1)
                else:
                    if layout not in ("wide", "stacked_image", "shared_image"):
                        raise ValueError(f"layer {qual!r} (Conv2d) needs image inputs")
                    if layout != "wide":
                        h = to_wide(h, layout)
                    h = F.conv2d(h, w, bias, layer.stride, layer.padding, layer.dilation, k * layer.groups)
                if self.channels_last:  # pooling and activations are much faster channels-last
                    h = h.contiguous(memory_format=torch.channels_last)
                layout = "wide"
            elif isinstance(layer, nn.Linear):
                if layout in ("wide", "stacked_image", "shared_image"):
                    raise ValueError(f"layer {qual!r} (Linear) needs flat inputs; add a Flatten before it")
                w = self.stacked[key + "__weight"]  # (K, in, out)
                bias = self.stacked[key + "__bias"] if layer.bias is not None else None
                if layout == "shared_flat":
                    # Same input for all members: one matrix product with all members' weights.
                    h = torch.einsum("bi,kio->kbo", h, w)
                    h = h + bias.unsqueeze(1) if bias is not None else h
                elif bias is not None:
                    h = torch.baddbmm(bias.unsqueeze(1), h, w)
                else:
                    h = torch.bmm(h, w)
                layout = "flat"
            elif isinstance(layer, nn.Flatten):
                if layout == "wide":
                    # One copy into (K, B, F) order, so the batched products see contiguous members.
                    h = h.reshape(batch, k, -1).transpose(0, 1).contiguous()
                    layout = "flat"
                elif layout == "stacked_image":
                    h, layout = h.reshape(k, batch, -1), "flat"
                elif layout == "shared_image":
                    h, layout = h.reshape(batch, -1), "shared_flat"
            elif isinstance(layer, nn.GroupNorm):
                h, layout = to_wide(h, layout), "wide"
                weight = self.stacked[key + "__weight"].reshape(-1) if layer.affine else None
                bias = self.stacked[key + "__bias"].reshape(-1) if layer.affine else None
                h = F.group_norm(h, k * layer.num_groups, weight, bias, layer.eps)
            elif isinstance(layer, nn.LayerNorm):
                h, layout = to_flat(h, layout), "flat"
                h = F.layer_norm(h, layer.normalized_shape, None, None, layer.eps)
                if layer.elementwise_affine:
                    h = h * self.stacked[key + "__weight"].unsqueeze(1)
                    if layer.bias is not None:
                        h = h + self.stacked[key + "__bias"].unsqueeze(1)
            elif isinstance(layer, nn.Dropout):
                if layout.startswith("shared"):  # independent masks per member from here on
                    h, layout = (to_wide(h, layout), "wide") if layout == "shared_image" else (to_flat(h, layout), "flat")
                h = F.dropout(h, layer.p, self.training)
            elif isinstance(layer, _POOLS):
                if layout == "stacked_image":
                    h, layout = to_wide(h, layout), "wide"
                h = layer(h)
            elif isinstance(layer, (nn.Tanh, nn.ReLU)) and layout in ("wide", "flat") and h.is_contiguous(
                memory_format=torch.channels_last if layout == "wide" and self.channels_last else torch.contiguous_format
            ) and h._base is None:
                # In place on an activation this module produced (half the memory traffic of a copy).
                h = torch.tanh_(h) if isinstance(layer, nn.Tanh) else torch.relu_(h)
            else:  # other elementwise activations
                h = layer(h)
        if layout == "wide":
            h = h.reshape(batch, k, -1).transpose(0, 1)
        elif layout == "stacked_image":
            h = h.reshape(k, batch, -1)
        elif layout.startswith("shared"):
            h = to_flat(h.reshape(batch, -1), "shared_flat")
        return h

    def _vmap(self, x: torch.Tensor, *, shared: bool) -> torch.Tensor:
        from torch.func import functional_call, vmap

        params = {self._names[key]: value for key, value in self.stacked.items()}
        buffers = {name: value.to(x.device) for name, value in self._buffers_stacked.items()}
        template = self._template

        def one(p, bufs, xi):
            return functional_call(template, (p, bufs), (xi,))

        run = vmap(one, in_dims=(0, 0, None if shared else 0), randomness="different")
        return run(params, buffers, x)

    # ---- members ---------------------------------------------------------------------------------
    def member_module(self, k: int) -> nn.Module:
        """Member k as a plain module of the original architecture (a copy)."""
        module = copy.deepcopy(self._template_module).to_empty(device=next(iter(self.stacked.values())).device)
        module.load_state_dict(self.member_state_dict(k))
        return module

    def member_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's parameters (and buffers), keyed as in the original architecture."""
        state = {
            self._names[key]: (value[k].t() if key in self._transposed else value[k]).detach().clone()
            for key, value in self.stacked.items()
        }
        state.update({name: value[k].clone() for name, value in self._buffers_stacked.items()})
        return state


def _has_params(layer: nn.Module) -> bool:
    return any(True for _ in layer.parameters(recurse=False))
