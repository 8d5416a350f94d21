"""Per-example gradients, vectorized.

Two strategies, chosen per model:

- `LayerwiseGradients` (fast path, models whose trainable parameters all sit in `nn.Linear`,
  `nn.Conv2d`, `nn.GroupNorm` and `nn.LayerNorm` layers): one forward pass records each layer's
  input; one backward pass asks autograd only for the gradients of the layer *outputs* (so the
  batched weight gradients are never computed); each layer's per-example gradient then follows
  from its input a and output gradient g (Goodfellow 2015, "Efficient per-example gradient
  computations"). For DP-SGD (`clipped_sum`) the dense layers never materialise per-example
  gradients: ||g_b a_b^T||_F = ||g_b|| ||a_b|| and sum_b f_b g_b a_b^T = (f*g)^T a is one matmul
  (the "ghost clipping" identity of Goodfellow 2015 / Li et al. 2022); Conv2d gradients are
  materialised by one batched matmul over strided patches, or one grouped convolution
  (Rochette et al. 2019), whichever the layer's shape favours.
- `VmapGradients` (any model): `torch.func.vmap(grad(loss of one example))`.

Both are called as `strategy(x, y) -> (losses, grads)`: the per-example losses and one tensor
per parameter of shape (B, *param.shape), in the order of `model.parameters()` (trainable ones
only). DP-SGD calls `strategy.clipped_sum(x, y, clipping_norm) -> (losses, summed, norms)`: the
sum over the batch of the clipped per-example gradients and each example's unclipped norm
(optional per-example `weights` multiply the clip factors: a weight of 0 leaves a padding row out,
see engine.dpsgd.cuda_graphs).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.dpsgd import mechanism
from engine.dpsgd.mechanism import finite_rows

_Params = dict[str, torch.Tensor]  # "weight"/"bias" -> tensor


class _Strategy:
    def clipped_sum(
        self, x: torch.Tensor, y: torch.Tensor, clipping_norm: float, weights: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        losses, grads = self(x, y)
        summed, norms = mechanism.clipped_sum(grads, clipping_norm, weights)
        return losses, summed, norms


class LayerwiseGradients(_Strategy):
    """Per-example gradients from layer inputs and output gradients (Linear, Conv2d, norms)."""

    SUPPORTED = (nn.Linear, nn.Conv2d, nn.GroupNorm, nn.LayerNorm)

    def __init__(self, model: nn.Module):
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.layers = [m for m in model.modules() if isinstance(m, self.SUPPORTED) and _trainable(m)]
        self._records: dict[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._handles = [m.register_forward_hook(self._record) for m in self.layers]
        self._capturing = False
        self._conv_plans: dict[Any, str] = {}
        # Map each trainable parameter to (layer, "weight"|"bias") so results come back in order.
        owner = {}
        for layer in self.layers:
            for pname in ("weight", "bias"):
                p = getattr(layer, pname, None)
                if isinstance(p, nn.Parameter) and p.requires_grad:
                    owner[id(p)] = (layer, pname)
        self._owner = [owner[id(p)] for p in self.params]
        self._wanted = {layer: [n for lay, n in self._owner if lay is layer] for layer in self.layers}

    @classmethod
    def supports(cls, model: nn.Module) -> bool:
        seen: set[int] = set()
        for module in model.modules():
            own = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            if not isinstance(module, cls.SUPPORTED):
                return False
            if isinstance(module, nn.Conv2d) and (module.groups != 1 or module.padding_mode != "zeros"):
                return False
            names = {n for n, p in module.named_parameters(recurse=False) if p.requires_grad}
            if not names <= {"weight", "bias"}:
                return False
            # A parameter shared by two layers would need its per-layer parts summed per example.
            if any(id(p) in seen for p in own):
                return False
            seen.update(id(p) for p in own)
        return True

    def _record(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if self._capturing:
            self._records.setdefault(module, []).append((inputs[0].detach(), output))

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor):
        """Per-example losses and, per layer, a list of (input, output grad), one per call."""
        self._records.clear()
        self._capturing = True
        try:
            logits = self.model(x)
        finally:
            self._capturing = False
        losses = F.cross_entropy(logits, y, reduction="none")
        records = self._records
        self._records = {}
        layers = [m for m in self.layers if m in records]
        outputs = [out for m in layers for _, out in records[m]]
        grads = torch.autograd.grad(losses.sum(), outputs, allow_unused=True) if outputs else []
        it = iter(grads)
        pairs: dict[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for m in layers:
            uses = []
            for a, out in records[m]:
                g = next(it)
                uses.append((a, torch.zeros_like(out) if g is None else g))
            pairs[m] = uses
        return losses.detach(), pairs

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        losses, pairs = self._forward_backward(x, y)
        batch = x.shape[0]
        per_layer: dict[nn.Module, _Params] = {}
        for layer in self.layers:
            per_layer[layer] = self._materialized(layer, pairs.get(layer, []), batch, x)
        grads = [per_layer[layer][pname] for layer, pname in self._owner]
        return losses, grads

    def clipped_sum(
        self, x: torch.Tensor, y: torch.Tensor, clipping_norm: float, weights: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        losses, pairs = self._forward_backward(x, y)
        batch = x.shape[0]
        norms_sq = torch.zeros(batch, dtype=losses.dtype, device=losses.device)
        parts = []
        for layer in self.layers:
            uses = pairs.get(layer, [])
            if len(uses) == 1:
                part = _ghost_part(layer, *uses[0], self._wanted[layer], self._conv_plan(layer, uses[0]))
            else:  # called 0 or several times: sum the uses' per-example gradients, then clip
                part = _MaterializedPart(self._materialized(layer, uses, batch, x))
            norms_sq += part.norms_sq()
            parts.append(part)
        norms = norms_sq.sqrt()
        factors = mechanism.clip_factors(norms, clipping_norm, weights)
        kept = mechanism.finite_norms(norms)  # the others are left out (mechanism.clip_factors)
        summed_by_layer = {layer: part.weighted_sum(factors, kept) for layer, part in zip(self.layers, parts)}
        summed = [summed_by_layer[layer][pname] for layer, pname in self._owner]
        return losses, summed, norms

    def _materialized(self, layer: nn.Module, uses: list, batch: int, x: torch.Tensor) -> _Params:
        wanted = self._wanted[layer]
        total: _Params = {}
        for a, g in uses:
            part = _ghost_part(layer, a, g, wanted, self._conv_plan(layer, (a, g)))
            for name, value in part.per_example().items():
                total[name] = value if name not in total else total[name] + value
        for name in wanted:  # a layer the forward pass never reached has zero gradients
            if name not in total:
                p = getattr(layer, name)
                total[name] = torch.zeros((batch, *p.shape), dtype=p.dtype, device=x.device)
        return total

    def _conv_plan(self, layer: nn.Module, use: tuple[torch.Tensor, torch.Tensor]) -> str:
        """How to materialise this Conv2d's per-example weight gradients, chosen once per shape."""
        if not isinstance(layer, nn.Conv2d) or "weight" not in self._wanted[layer]:
            return ""
        a, g = use
        key = (layer, tuple(a.shape[1:]), a.device.type, _is_channels_last(a))
        plan = self._conv_plans.get(key)
        if plan is None:
            plan = self._conv_plans[key] = _choose_conv_plan(layer, a, g)
        return plan

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters(recurse=False))


def _is_channels_last(t: torch.Tensor) -> bool:
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


# ------------------------------------------------------------------------------------------------
# One layer's share of the per-example gradients: its squared norms and its clipped sum
# ------------------------------------------------------------------------------------------------


def _sq_norms(t: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of each example's slice of t (B, ...), shape (B,)."""
    flat = t.flatten(1) if t.dim() > 1 else t.unsqueeze(1)
    return torch.linalg.vector_norm(flat, dim=1).square()


class _MaterializedPart:
    """A layer whose per-example gradients are held in full, (B, *shape) per parameter."""

    def __init__(self, grads: _Params):
        self.grads = grads

    def per_example(self) -> _Params:
        return self.grads

    def norms_sq(self) -> torch.Tensor:
        return sum(_sq_norms(g) for g in self.grads.values())

    def weighted_sum(self, factors: torch.Tensor, kept: torch.Tensor | None) -> _Params:
        return {n: (factors @ finite_rows(g, kept).flatten(1)).view(g.shape[1:]) for n, g in self.grads.items()}


class _LinearPart:
    """nn.Linear on (B, F) inputs: never materialises the (B, out, in) weight gradients.

    Per example the weight gradient is the outer product g_b a_b^T, whose Frobenius norm is
    ||g_b|| ||a_b||, and sum_b f_b g_b a_b^T = (f * g)^T a.
    """

    def __init__(self, a: torch.Tensor, g: torch.Tensor, wanted: list[str]):
        self.a, self.g, self.wanted = a, g, wanted

    def per_example(self) -> _Params:
        out = {}
        if "weight" in self.wanted:
            out["weight"] = self.g.unsqueeze(2) * self.a.unsqueeze(1)
        if "bias" in self.wanted:
            out["bias"] = self.g
        return out

    def norms_sq(self) -> torch.Tensor:
        g_sq = _sq_norms(self.g)
        total = g_sq * _sq_norms(self.a) if "weight" in self.wanted else torch.zeros_like(g_sq)
        if "bias" in self.wanted:
            total = total + g_sq
        return total

    def weighted_sum(self, factors: torch.Tensor, kept: torch.Tensor | None) -> _Params:
        out = {}
        g = finite_rows(self.g, kept)
        if "weight" in self.wanted:
            out["weight"] = (g * factors.unsqueeze(1)).t() @ finite_rows(self.a, kept)
        if "bias" in self.wanted:
            out["bias"] = factors @ g
        return out


class _LinearSeqPart:
    """nn.Linear on (B, T..., F) inputs: per-example weight gradient G_b^T A_b (T summed).

    Its squared norm is either taken from the materialised (B, out, in) gradients or, when T is
    small next to out*in/(out+in), from Gram matrices: ||G^T A||^2 = <G G^T, A A^T>.
    """

    def __init__(self, a: torch.Tensor, g: torch.Tensor, wanted: list[str]):
        batch, steps = a.shape[0], math.prod(a.shape[1:-1])
        self.a = a.reshape(batch, steps, a.shape[-1])
        self.g = g.reshape(batch, steps, g.shape[-1])
        self.wanted = wanted
        self._weight: torch.Tensor | None = None

    def _weight_grads(self) -> torch.Tensor:
        if self._weight is None:
            self._weight = torch.bmm(self.g.transpose(1, 2), self.a)
        return self._weight

    def per_example(self) -> _Params:
        out = {}
        if "weight" in self.wanted:
            out["weight"] = self._weight_grads()
        if "bias" in self.wanted:
            out["bias"] = self.g.sum(1)
        return out

    def norms_sq(self) -> torch.Tensor:
        batch, steps, f_out = self.g.shape
        f_in = self.a.shape[2]
        total = torch.zeros(batch, dtype=self.g.dtype, device=self.g.device)
        if "weight" in self.wanted:
            if steps * (f_in + f_out) < f_in * f_out:
                gram_g = torch.bmm(self.g, self.g.transpose(1, 2))
                gram_a = torch.bmm(self.a, self.a.transpose(1, 2))
                total = total + (gram_g * gram_a).sum((1, 2))
            else:
                total = total + _sq_norms(self._weight_grads())
        if "bias" in self.wanted:
            total = total + _sq_norms(self.g.sum(1))
        return total

    def weighted_sum(self, factors: torch.Tensor, kept: torch.Tensor | None) -> _Params:
        out = {}
        f_out, f_in = self.g.shape[2], self.a.shape[2]
        g = finite_rows(self.g, kept)
        if "weight" in self.wanted:
            scaled = g * factors.view(-1, 1, 1)
            out["weight"] = scaled.reshape(-1, f_out).t() @ finite_rows(self.a, kept).reshape(-1, f_in)
        if "bias" in self.wanted:
            out["bias"] = factors @ g.sum(1)
        return out


class _ConvPart(_MaterializedPart):
    """nn.Conv2d: per-example weight gradients materialised once, in the layout `plan` favours."""

    def __init__(self, layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor, wanted: list[str], plan: str):
        grads: _Params = {}
        self._weight_order = None
        if "weight" in wanted:
            weight, self._weight_order = _conv_weight_grads(layer, a, g, plan)
            grads["weight"] = weight
        if "bias" in wanted:
            grads["bias"] = g.sum((2, 3))
        super().__init__(grads)

    def per_example(self) -> _Params:
        out = dict(self.grads)
        if "weight" in out and self._weight_order is not None:
            out["weight"] = self._to_param_layout(out["weight"], batch=True)
        return out

    def weighted_sum(self, factors: torch.Tensor, kept: torch.Tensor | None) -> _Params:
        out = super().weighted_sum(factors, kept)
        if "weight" in out and self._weight_order is not None:
            out["weight"] = self._to_param_layout(out["weight"], batch=False)
        return out

    def _to_param_layout(self, w: torch.Tensor, *, batch: bool) -> torch.Tensor:
        # (.., out, kh, kw, in) -> (.., out, in, kh, kw)
        lead = 1 if batch else 0
        perm = list(range(lead)) + [lead, lead + 3, lead + 1, lead + 2]
        return w.permute(perm).contiguous()


class _NormPart(_MaterializedPart):
    """nn.GroupNorm / nn.LayerNorm: per-example affine gradients are per-channel sums.

    weight: sum over the non-channel positions of g * x_hat; bias: the same sum of g, where
    x_hat is the layer's input normalised without the affine step (recomputed here).
    """

    def __init__(self, layer: nn.Module, a: torch.Tensor, g: torch.Tensor, wanted: list[str]):
        if isinstance(layer, nn.GroupNorm):
            x_hat = F.group_norm(a, layer.num_groups, None, None, layer.eps)
            dims = tuple(range(2, a.dim()))
        else:
            shape = tuple(layer.normalized_shape)
            x_hat = F.layer_norm(a, shape, None, None, layer.eps)
            dims = tuple(range(1, a.dim() - len(shape)))
        grads: _Params = {}
        if "weight" in wanted:
            grads["weight"] = (g * x_hat).sum(dims) if dims else g * x_hat
        if "bias" in wanted:
            grads["bias"] = g.sum(dims) if dims else g
        super().__init__(grads)


def _ghost_part(layer: nn.Module, a: torch.Tensor, g: torch.Tensor, wanted: list[str], plan: str):
    if isinstance(layer, nn.Linear):
        return _LinearPart(a, g, wanted) if a.dim() == 2 else _LinearSeqPart(a, g, wanted)
    if isinstance(layer, nn.Conv2d):
        return _ConvPart(layer, a, g, wanted, plan)
    return _NormPart(layer, a, g, wanted)


# ------------------------------------------------------------------------------------------------
# Conv2d per-example weight gradients
# ------------------------------------------------------------------------------------------------
#
# grad_W[b, o, c, i, j] = sum_{p,q} g[b, o, p, q] * x_pad[b, c, s_h p + d_h i, s_w q + d_w j]
#
# "patches":  copy the strided patches of x_pad into (B, L, K) (L = output positions, K = in*kh*kw;
#             K ordered (kh, kw, in) when the input is channels-last, so each copied run is
#             contiguous) and do one batched matmul with g as (B, out, L).
# "grouped":  the same sum is a convolution of x_pad (examples as channels, input channels as the
#             batch) with g as the kernel, dilated by the stride, one group per example.


def _conv_padding(layer: nn.Conv2d, a: torch.Tensor) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) zero padding of the layer's input, as torch applies it."""
    kh, kw = layer.kernel_size
    dh, dw = layer.dilation
    if isinstance(layer.padding, str):
        if layer.padding == "valid":
            return (0, 0, 0, 0)
        # "same": total d*(k-1) per dimension, the odd one extra on the bottom/right (as torch).
        th, tw = dh * (kh - 1), dw * (kw - 1)
        return (th // 2, th - th // 2, tw // 2, tw - tw // 2)
    ph, pw = layer.padding
    return (ph, ph, pw, pw)


def _padded(a: torch.Tensor, pads: tuple[int, int, int, int], channels_last: bool) -> torch.Tensor:
    top, bottom, left, right = pads
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    if not any(pads):
        return a.contiguous(memory_format=fmt)
    batch, chans, h, w = a.shape
    shape = (batch, chans, h + top + bottom, w + left + right)
    out = torch.empty(shape, dtype=a.dtype, device=a.device, memory_format=fmt).zero_()
    out[:, :, top : top + h, left : left + w] = a
    return out


def _conv_weight_grads(
    layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor, plan: str
) -> tuple[torch.Tensor, str | None]:
    """Per-example weight gradients: (B, out, in, kh, kw), or (B, out, kh, kw, in) with the
    second return value "ohwi" (the caller permutes only what it needs)."""
    batch, c_in = a.shape[:2]
    c_out, oh, ow = g.shape[1:]
    kh, kw = layer.kernel_size
    sh, sw = layer.stride
    dh, dw = layer.dilation
    pads = _conv_padding(layer, a)
    if plan == "grouped" and batch > 0:
        xp = _padded(a, pads, channels_last=False)
        kernel = g.reshape(batch * c_out, 1, oh, ow)
        out = F.conv2d(xp.transpose(0, 1), kernel, None, stride=(dh, dw), dilation=(sh, sw), groups=batch)
        out = out[:, :, :kh, :kw].reshape(c_in, batch, c_out, kh, kw)
        return out.permute(1, 2, 0, 3, 4), None
    channels_last = plan == "patches_cl"
    xp = _padded(a, pads, channels_last)
    s0, s1, s2, s3 = xp.stride()
    if channels_last:
        view = xp.as_strided(
            (batch, oh, ow, kh, kw, c_in), (s0, sh * s2, sw * s3, dh * s2, dw * s3, s1), xp.storage_offset()
        )
        cols = view.reshape(batch, oh * ow, kh * kw * c_in)
        g_lo = g.permute(0, 2, 3, 1).reshape(batch, oh * ow, c_out)
        w = torch.bmm(g_lo.transpose(1, 2), cols)
        return w.view(batch, c_out, kh, kw, c_in), "ohwi"
    view = xp.as_strided(
        (batch, c_in, kh, kw, oh, ow), (s0, s1, dh * s2, dw * s3, sh * s2, sw * s3), xp.storage_offset()
    )
    cols = view.reshape(batch, c_in * kh * kw, oh * ow)
    w = torch.bmm(g.reshape(batch, c_out, oh * ow), cols.transpose(1, 2))
    return w.view(batch, c_out, c_in, kh, kw), None


def _choose_conv_plan(layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> str:
    """The patch layout that matches the input's; a grouped convolution for one-channel inputs
    on CPU, where the patch copy (in*kh*kw per output position) dominates."""
    if a.device.type == "cpu" and a.shape[1] == 1:
        return "grouped"
    return "patches_cl" if _is_channels_last(a) else "patches"


# ------------------------------------------------------------------------------------------------


class VmapGradients(_Strategy):
    """Per-example gradients of any model through torch.func (vmap of grad)."""

    def __init__(self, model: nn.Module):
        from torch.func import functional_call, grad, vmap

        self.model = model
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for p in model.parameters() if p.requires_grad]
        buffers = dict(model.named_buffers())

        def loss_one(params: dict, x: torch.Tensor, y: torch.Tensor):
            logits = functional_call(model, (params, buffers), (x.unsqueeze(0),))
            loss = F.cross_entropy(logits, y.unsqueeze(0))
            return loss, loss.detach()

        self._per_example = vmap(grad(loss_one, has_aux=True), in_dims=(None, 0, 0))

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        params = {n: p.detach() for n, p in zip(self.names, self.params)}
        grads, losses = self._per_example(params, x, y)
        return losses, [grads[n] for n in self.names]

    def close(self) -> None:
        pass


def per_example_gradients(model: nn.Module) -> LayerwiseGradients | VmapGradients:
    """The fastest strategy that supports this model."""
    if LayerwiseGradients.supports(model):
        return LayerwiseGradients(model)
    return VmapGradients(model)
