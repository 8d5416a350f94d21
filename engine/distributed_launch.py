"""Start a run's runner as several processes under torch.distributed.run (torchrun).

`dpw run CONFIG --nproc N` runs `python -m engine.distributed_launch <torchrun flags> -m engine.runner
RUN_ID --db PATH`: torchrun's own launcher (its Python entry point, not a home-made one), gloo on CPU
and NCCL on CUDA (engine.dpsgd.distributed). Rank 0 writes the run's events, store row and
artifacts; the other ranks never open the store. On one machine the rendezvous is torchrun's
`--standalone` (a free local port); across machines every node runs the same `dpw run` with
`--nnodes`, `--node-rank`, `--master-addr` and `--master-port` (torchrun's static rendezvous), and
only node 0 (which holds rank 0) stores the run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

from engine.errors import ConfigError, DPWError

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class Launch:
    """How many processes on how many machines, and where they meet (torchrun's rendezvous)."""

    nproc: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def distributed(self) -> bool:
        return self.nproc * self.nnodes > 1

    @property
    def stores_the_run(self) -> bool:
        """Node 0 holds rank 0, which writes the store; other nodes only train."""
        return self.node_rank == 0

    def check(self) -> None:
        if self.nproc < 1:
            raise DPWError(f"--nproc {self.nproc}: the number of processes on this machine must be at least 1")
        if self.nnodes < 1:
            raise DPWError(f"--nnodes {self.nnodes}: the number of machines must be at least 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise DPWError(f"--node-rank {self.node_rank} is not between 0 and --nnodes - 1 ({self.nnodes - 1})",
                           hint="number the machines 0, 1, ...; machine 0 stores the run")
        if self.nnodes > 1 and not self.master_addr:
            raise DPWError(f"--nnodes {self.nnodes} needs --master-addr: the address of machine 0 that every "
                           "machine can reach", hint="e.g. --master-addr 10.0.0.1 --master-port 29500")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise DPWError(f"--master-port {self.master_port} is not a TCP port (1 to 65535)")

    def torchrun_args(self) -> list[str]:
        args = ["--nproc-per-node", str(self.nproc), "--nnodes", str(self.nnodes), "--max-restarts", "0"]
        if self.nnodes == 1 and not self.master_addr:
            return args + ["--standalone"]
        return args + ["--node-rank", str(self.node_rank), "--master-addr", str(self.master_addr),
                       "--master-port", str(self.master_port or DEFAULT_MASTER_PORT)]

    def command(self, runner_args: list[str]) -> list[str]:
        """The launcher's command line for `python -m engine.runner <runner_args>` on every rank."""
        return [sys.executable, "-m", "engine.distributed_launch", *self.torchrun_args(),
                "-m", "engine.runner", *runner_args]


def check_distributable(config: Any) -> None:
    """A distributed run is private DP-SGD (the mechanism its steps split across processes)."""
    if config.mechanism != "dpsgd":
        raise ConfigError("mechanism", f"--nproc splits DP-SGD steps across processes; mechanism "
                          f"{config.mechanism!r} runs in one process", hint="drop --nproc (or use mechanism 'dpsgd')")
    if getattr(config, "audit_canaries", None):
        raise ConfigError("audit_canaries", "the canary audit runs in one process, not with --nproc",
                          hint="drop --nproc, or set audit_canaries = 0 for a distributed run")


def main(argv: list[str] | None = None) -> int:
    """torchrun's own launcher; a failed rank is one line here (the run's record says why)."""
    os.environ.setdefault("LOGLEVEL", "CRITICAL")  # torchrun's loggers read it on import: its own reports
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    for name in ("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.CRITICAL)  # a failure is told once, below and in the run's record
    args = get_args_parser().parse_args(argv)
    if str(args.nproc_per_node).isdigit():  # torchrun's own default is 1 thread per rank whatever the cores
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(args.nproc_per_node))))
    try:
        run(args)
    except SignalException:  # asked to stop (dpw's Ctrl-C): the ranks stopped together, rank 0 recorded it
        return 0
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if (rank, failure.exitcode) != (0, 1):  # rank 0 exiting 1 has recorded the run's failure itself
            print(f"error: rank {rank} of the distributed run ended first ({_exit(failure.exitcode)})", file=sys.stderr)
        return 1
    except Exception as exc:  # e.g. the rendezvous timed out: one line, not torchrun's traceback
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: torchrun could not run the distributed run: {message}", file=sys.stderr)
        return 1
    return 0


def _exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


if __name__ == "__main__":
    sys.exit(main())
