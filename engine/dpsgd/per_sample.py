"""Per-example gradients, vectorized.

Two strategies, chosen per model:

- `LayerwiseGradients` (fast path, models whose parameters all sit in `nn.Linear` and
  `nn.Conv2d` layers): one forward pass records each layer's input; one backward pass asks
  autograd only for the gradients of the layer *outputs* (so the batched weight gradients are
  never computed); each layer's per-example weight gradient is then one batched matmul of the
  output gradient with the (unfolded) input, as in Goodfellow 2015, "Efficient per-example
  gradient computations".
- `VmapGradients` (any model): `torch.func.vmap(grad(loss of one example))`.

Both are called as `strategy(x, y) -> (losses, grads)`: the per-example losses and one tensor
per parameter of shape (B, *param.shape), in the order of `model.parameters()` (trainable ones
only). DP-SGD calls `strategy.clipped_sum(x, y, clipping_norm) -> (losses, summed, norms)`: the
sum over the batch of the clipped per-example gradients and each example's unclipped norm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.dpsgd import mechanism


class _Strategy:
    def clipped_sum(
        self, x: torch.Tensor, y: torch.Tensor, clipping_norm: float
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        losses, grads = self(x, y)
        summed, norms = mechanism.clipped_sum(grads, clipping_norm)
        return losses, summed, norms


class LayerwiseGradients(_Strategy):
    """Per-example gradients from layer inputs and output gradients (Linear and Conv2d)."""

    SUPPORTED = (nn.Linear, nn.Conv2d)

    def __init__(self, model: nn.Module):
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.layers = [m for m in model.modules() if isinstance(m, self.SUPPORTED)]
        self._inputs: dict[nn.Module, torch.Tensor] = {}
        self._outputs: dict[nn.Module, torch.Tensor] = {}
        self._handles = [m.register_forward_hook(self._record) for m in self.layers]
        self._capturing = False
        # Map each trainable parameter to (layer, "weight"|"bias") so results come back in order.
        owner = {}
        for layer in self.layers:
            for pname in ("weight", "bias"):
                p = getattr(layer, pname, None)
                if p is not None and p.requires_grad:
                    owner[id(p)] = (layer, pname)
        self._owner = [owner[id(p)] for p in self.params]

    @classmethod
    def supports(cls, model: nn.Module) -> bool:
        for module in model.modules():
            own = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            if not isinstance(module, cls.SUPPORTED):
                return False
            if isinstance(module, nn.Conv2d) and (module.groups != 1 or module.padding_mode != "zeros"):
                return False
        return True

    def _record(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if self._capturing:
            self._inputs[module] = inputs[0].detach()
            self._outputs[module] = output

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        self._capturing = True
        try:
            logits = self.model(x)
        finally:
            self._capturing = False
        losses = F.cross_entropy(logits, y, reduction="none")
        outputs = [self._outputs[m] for m in self.layers]
        grad_outputs = torch.autograd.grad(losses.sum(), outputs)
        per_layer = {}
        for layer, grad_out in zip(self.layers, grad_outputs):
            per_layer[layer] = _layer_grads(layer, self._inputs[layer], grad_out)
        self._inputs.clear()
        self._outputs.clear()
        grads = [per_layer[layer][pname] for layer, pname in self._owner]
        return losses.detach(), grads

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def _layer_grads(layer: nn.Module, a: torch.Tensor, g: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-example weight (and bias) gradients of one layer from its input a and output grad g."""
    batch = a.shape[0]
    out: dict[str, torch.Tensor] = {}
    if isinstance(layer, nn.Linear):
        if a.dim() == 2:
            out["weight"] = g.unsqueeze(2) * a.unsqueeze(1)  # outer product per example
            if layer.bias is not None:
                out["bias"] = g
        else:  # extra dims (B, ..., F): sum over them
            a2 = a.reshape(batch, -1, a.shape[-1])
            g2 = g.reshape(batch, -1, g.shape[-1])
            out["weight"] = torch.bmm(g2.transpose(1, 2), a2)
            if layer.bias is not None:
                out["bias"] = g2.sum(1)
        return out
    # Conv2d: grad_W[b] = G[b] (Cout x L) @ unfold(A[b])^T (L x Cin*kh*kw)
    cols = F.unfold(a, layer.kernel_size, dilation=layer.dilation, padding=layer.padding, stride=layer.stride)
    g2 = g.reshape(batch, g.shape[1], -1)
    out["weight"] = torch.bmm(g2, cols.transpose(1, 2)).view(batch, *layer.weight.shape)
    if layer.bias is not None:
        out["bias"] = g2.sum(2)
    return out


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
