"""DP-SGD's clipped sum replayed from CUDA graphs: the same kernels, without launching each one.

On a GPU a small model's DP-SGD step is bound by launching its kernels one by one from Python:
the MNIST CNN on an H200 took 4.1 ms a step at batch 256 with the GPU busy for 0.5 ms of it. A CUDA
graph records the kernels of the clipped sum (forward, backward, per-example norms, clip factors,
weighted sums) once and replays them with one launch.

A graph replays fixed shapes, but a Poisson batch's size varies from step to step. Each chunk is
therefore padded up to a bucket size (BUCKETS_PER_DOUBLING sizes between each power of two and the
next, so less than a sixteenth of a chunk is padding) with rows of zeros whose clip factor is
multiplied by 0: they add exactly nothing to the sum, and the real rows are computed as without
padding, because every layer the layer-wise strategy supports treats the examples of a batch
independently (no batch normalisation). One graph per bucket, captured the first time a chunk of that
size is met (a Poisson batch's sizes fall in a few), all in one memory pool; the inputs are views of
one buffer of max_batch rows.

Only the clipped sum is replayed. Sampling, noise and the update stay outside the graphs, as they
are on the CPU: the secret generators draw exactly as they do without graphs.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

import torch

from engine.dpsgd.per_sample import LayerwiseGradients

BUCKETS_PER_DOUBLING = 16  # chunk sizes in [2^k, 2^(k+1)) pad up to a multiple of 2^k / 16
WARMUP_CALLS = 2  # eager calls on a side stream before a capture (cuDNN and cuBLAS pick kernels, autograd sets up)

ClippedSum = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]]


def clipped_sum_for(strategy, clipping_norm: float, max_batch: int, device: torch.device, *,
                    graphs: bool) -> ClippedSum:
    """`(x, y) -> (losses, summed, norms)` for chunks of at most `max_batch` examples: replayed from
    CUDA graphs when asked for (a run's `cuda_graphs`), on a GPU, for a model on the layer-wise path;
    else the strategy's own."""
    if graphs and device.type == "cuda" and isinstance(strategy, LayerwiseGradients):
        return GraphedClippedSum(strategy, clipping_norm, max_batch)
    return functools.partial(strategy.clipped_sum, clipping_norm=clipping_norm)


class GraphedClippedSum:
    """The strategy's clipped sum on chunks padded to bucket sizes, one CUDA graph per bucket.

    `capture=False` pads the same way and computes eagerly (what the CPU tests check). The summed
    gradients returned are the graph's own output tensors: use them before the next call."""

    def __init__(self, strategy: LayerwiseGradients, clipping_norm: float, max_batch: int, *, capture: bool = True):
        self.strategy = strategy
        self.clipping_norm = clipping_norm
        self.max_batch = max_batch
        self.capture = capture
        self._buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple]] = {}  # bucket -> (graph, its outputs)
        self._pool = None
        self._eager = False  # a capture failed: the strategy's own clipped sum from then on

    def bucket(self, batch: int) -> int:
        """The padded size of a chunk of `batch` examples (1 <= batch <= max_batch): the next multiple
        of 2^k / BUCKETS_PER_DOUBLING for 2^k <= batch < 2^(k+1), at most max_batch."""
        step = 1 << max(0, batch.bit_length() - BUCKETS_PER_DOUBLING.bit_length())
        return min(self.max_batch, -(-batch // step) * step)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        batch = x.shape[0]
        if self._eager or batch == 0:
            return self.strategy.clipped_sum(x, y, self.clipping_norm)
        if batch > self.max_batch:
            raise ValueError(f"a chunk of {batch} examples is larger than max_batch {self.max_batch}")
        size = self.bucket(batch)
        xs, ys, weights = self._inputs(x, y, size)
        xs[:batch].copy_(x)
        xs[batch:].zero_()
        ys[:batch].copy_(y)
        ys[batch:].zero_()
        weights.zero_()
        weights[:batch] = 1.0
        if not self.capture:
            outputs = self.strategy.clipped_sum(xs, ys, self.clipping_norm, weights)
        else:
            if size not in self._graphs and not self._captured(size, (xs, ys, weights)):
                return self.strategy.clipped_sum(x, y, self.clipping_norm)
            graph, outputs = self._graphs[size]
            graph.replay()
        losses, summed, norms = outputs
        return losses[:batch], summed, norms[:batch]

    def _inputs(self, x: torch.Tensor, y: torch.Tensor, size: int):
        """Views of the first `size` rows of the one input buffer (its addresses never change)."""
        if self._buffers is None:
            dtype = self.strategy.params[0].dtype if self.strategy.params else torch.float32
            self._buffers = (torch.zeros((self.max_batch, *x.shape[1:]), dtype=x.dtype, device=x.device),
                             torch.zeros(self.max_batch, dtype=y.dtype, device=y.device),
                             torch.zeros(self.max_batch, dtype=dtype, device=x.device))
        return tuple(b[:size] for b in self._buffers)

    def _captured(self, size: int, inputs: tuple) -> bool:
        """Capture the clipped sum of a padded chunk of `size` rows; False (and eager from then on)
        where the model cannot be captured."""
        xs, ys, weights = inputs
        current = torch.cuda.current_stream(xs.device)
        side = torch.cuda.Stream(device=xs.device)
        try:
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS):
                    self.strategy.clipped_sum(xs, ys, self.clipping_norm, weights)
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = self.strategy.clipped_sum(xs, ys, self.clipping_norm, weights)
        except RuntimeError as exc:  # an operation that cannot be captured (a host sync in the model)
            torch.cuda.synchronize(xs.device)
            warnings.warn(f"DP-SGD runs without CUDA graphs: capturing the clipped sum failed ({exc})", stacklevel=2)
            self._eager = True
            self._graphs.clear()
            return False
        self._pool = self._pool or graph.pool()
        self._graphs[size] = (graph, outputs)
        return True

    def close(self) -> None:
        """Free the graphs and their memory pool."""
        self._graphs.clear()
        self._buffers = None
        self._pool = None
