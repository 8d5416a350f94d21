"""Data-parallel DP-SGD over torch.distributed: one logical run, several processes.

Launched by `dpw run CONFIG --nproc N` (engine.distributed_launch, i.e. torchrun). What each step does,
and why it is the single-process mechanism exactly (Abadi et al. 2016, Algorithm 1):

- Rank r holds the strided shard r, r+W, r+2W, ... of the training indices and Poisson-samples it at
  the GLOBAL rate q from its own private stream (engine.randomness, one secret root per process). The
  shards partition the training set and the draws are independent, so the union is exactly a
  Poisson(q) sample of all N examples: the subsampling the accountant assumes.
- Each rank clips per example and sums; one all-reduce adds the clipped sums (and the loss sum and
  batch size, for the metrics).
- Rank 0 alone adds the Gaussian noise N(0, (sigma*C)^2) per coordinate, to the all-reduced total,
  through the same `mechanism.add_gaussian_noise` as a single process (so the hardened sampler's
  float64 addition and single rounding hold too), and broadcasts the noisy total. The noise is added
  once per step in total, never leaves rank 0 on its own, and every rank applies the very bits rank 0
  computed, so the parameters stay identical by construction (not by trusting that a reduction
  rounds the same everywhere). The price is one broadcast per step besides the all-reduce.
- Every rank divides by the global expected batch size q*N (never a realised size) and steps its
  optimizer: the accountant sees the single-process (q, sigma, steps).

Only rank 0 writes events, the store and artifacts; the other ranks never open the store.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from engine.array_data import take_rows
from engine.datasets import Dataset
from engine.errors import ConfigError, DPWError

NOISE_ADDED_BY = "rank 0"
TIMEOUT_ENV = "DPW_DISTRIBUTED_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0  # a rank silent this long fails the run (a killed peer fails it at once)


class DistributedRunError(DPWError):
    """Another process of a distributed run ended or stopped answering."""


@dataclass
class DataParallel:
    """This process's place in a distributed run and the collectives DP-SGD needs."""

    rank: int
    world_size: int
    local_rank: int = 0
    num_train: int | None = None  # N of the whole training split (set by `shard`)
    last_batch_size: int = 0  # the global (all ranks) size of the last Poisson batch

    @classmethod
    def from_environment(cls) -> "DataParallel | None":
        """The torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK), or None in a plain process."""
        if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
            return None
        return cls(rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                   local_rank=int(os.environ.get("LOCAL_RANK", "0")))

    @property
    def reports(self) -> bool:
        """Rank 0 writes the events, the store and the artifacts."""
        return self.rank == 0

    @property
    def sampling_purpose(self) -> str:
        """This rank's private stream for Poisson sampling: its own, even with reproducible_noise."""
        return "poisson_sampling" if self.rank == 0 else f"poisson_sampling/rank-{self.rank}"

    def summary(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "noise_added_by": NOISE_ADDED_BY}

    # ---- setting up --------------------------------------------------------------------------
    def start(self) -> None:
        """Join the process group: gloo for CPU tensors, NCCL for CUDA tensors when a GPU is here."""
        if dist.is_initialized():
            return
        timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
        backend = "gloo"
        if torch.cuda.is_available() and dist.is_nccl_available():
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
            backend = "cpu:gloo,cuda:nccl"
        self._collective(lambda: dist.init_process_group(backend=backend, timeout=timeout), "joining the run")

    def stop(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def share(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (a config, a privacy plan: small picklable objects)."""
        box = [value if self.reports else None]
        self._collective(lambda: dist.broadcast_object_list(box, src=0, device=torch.device("cpu")),
                         "receiving the run's settings from rank 0")
        return box[0]

    def check_same_data(self, fingerprint: str) -> None:
        """Every rank must have loaded the same training data (another node may have other files)."""
        prints: list[Any] = [None] * self.world_size
        self._collective(lambda: dist.all_gather_object(prints, fingerprint), "comparing the data")
        if len(set(prints)) != 1:
            ranks = [r for r, p in enumerate(prints) if p != prints[0]]
            raise ConfigError("data_dir", f"ranks {ranks} loaded other data than rank 0 (dataset fingerprints "
                              "differ)", hint="give every node the same dataset files (--data-dir on each node)")

    def shard(self, data: Dataset) -> Dataset:
        """This rank's strided shard of the training split (the test split stays whole for rank 0).
        Inputs read on demand (engine.array_data) stay so: the shard is a view over its rows."""
        self.num_train = data.num_train
        keep = torch.arange(self.rank, data.num_train, self.world_size)
        test = slice(None) if self.reports else slice(0, 0)  # only rank 0 evaluates and reports
        return dataclasses.replace(data.take_train(keep), x_test=take_rows(data.x_test, test),
                                   y_test=data.y_test[test])

    def broadcast_parameters(self, model: nn.Module) -> None:
        """Start every rank from rank 0's weights (seeded initialisation makes them equal already)."""
        for tensor in list(model.parameters()) + list(model.buffers()):
            self._collective(lambda t=tensor: dist.broadcast(t.data, src=0), "sharing the initial weights")

    def parameters_digest(self, model: nn.Module) -> list[str]:
        """sha256 of each rank's parameters (bytes), gathered on every rank: all equal after training."""
        digest = hashlib.sha256()
        for tensor in model.parameters():
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        digests: list[Any] = [None] * self.world_size
        self._collective(lambda: dist.all_gather_object(digests, digest.hexdigest()), "comparing the weights")
        return digests

    # ---- each step ---------------------------------------------------------------------------
    def agree_to_stop(self, requested: bool) -> bool:
        """True on every rank when a stop was asked of any of them (all leave after the same step)."""
        flag = torch.tensor([1.0 if requested else 0.0])
        self._collective(lambda: dist.all_reduce(flag, op=dist.ReduceOp.MAX), "agreeing on a stop")
        return bool(flag.item() > 0)

    def noisy_total(self, summed: list[torch.Tensor], tally: torch.Tensor, batch_size: int,
                    add_noise: Callable[[list[torch.Tensor]], list[torch.Tensor]]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """All-reduce the clipped sums (with `tally`, e.g. the loss sum, and the batch size); rank 0 adds
        the noise once and broadcasts the noisy total. Returns (noisy sums, global tally); sets
        `last_batch_size`."""
        extra = tally.numel() + 1
        flat = torch.cat([s.reshape(-1) for s in summed]
                         + [tally.reshape(-1).to(summed[0].dtype),
                            torch.tensor([float(batch_size)], dtype=summed[0].dtype, device=summed[0].device)])
        self._collective(lambda: dist.all_reduce(flat, op=dist.ReduceOp.SUM), "adding the clipped gradients")
        totals, extras = _unflatten(flat, summed), flat[-extra:]
        self.last_batch_size = int(round(float(extras[-1])))
        noisy_flat = (torch.cat([n.reshape(-1) for n in add_noise(totals)]) if self.reports
                      else torch.empty(flat.numel() - extra, dtype=flat.dtype, device=flat.device))
        self._collective(lambda: dist.broadcast(noisy_flat, src=0), "receiving the noisy gradient from rank 0")
        return _unflatten(noisy_flat, summed), extras[:-1].reshape(tally.shape).to(tally.dtype)

    def _collective(self, call: Callable[[], Any], doing: str) -> Any:
        try:
            return call()
        except (RuntimeError, ValueError, OSError) as exc:  # DistBackendError and gloo's errors are RuntimeErrors
            first = _first_sentence(exc)
            raise DistributedRunError(
                f"rank {self.rank} of {self.world_size}: another process of the distributed run ended or stopped "
                f"answering while {doing} ({first})",
                hint="the privacy spent up to the last completed step is recorded; the launcher's output names "
                "the rank that failed",
            ) from None


def _first_sentence(exc: BaseException) -> str:
    """gloo's message without its source location and advice: 'Read error [addr]: Connection reset by peer'."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    first = re.sub(r"^\[[^\]]*\]\s*", "", text.splitlines()[0])
    return first.split(". ")[0].rstrip(".")


def _unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    parts, offset = [], 0
    for tensor in like:
        parts.append(flat[offset : offset + tensor.numel()].view(tensor.shape))
        offset += tensor.numel()
    return parts
