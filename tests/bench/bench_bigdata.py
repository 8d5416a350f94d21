"""DP-SGD on a dataset larger than memory (a script, not a test): peak memory against data size.

Writes a synthetic MNIST-shaped dataset (uint8 images, 1x28x28, random pixels and labels) as a
folder of x.npy / y.npy / x_test.npy / y_test.npy, by default twice this machine's MemAvailable
(/proc/meminfo), then trains a few DP-SGD steps on it in a fresh process through the engine's own
loader (engine.array_data: memory-mapped, Poisson sampling over all N rows, each step reading only
its sampled rows) and reports that process's peak resident memory (VmHWM: every page it touched,
the memory-mapped file's pages included) next to the data size. The folder is always deleted at
the end. The labels are random: the accuracy means nothing, the memory does.

Refuses any size that would leave less than 30 GB free on the disk of `--dir` (others share it).

With `--memory-limit-gb L` (Linux, root: a memory cgroup, v1 or v2) the training process may use at
most L GB, page cache included, and the data defaults to 2 x L: a machine whose disk cannot hold twice
its free memory still shows training on data twice the memory it has. A loader that read the file
whole would be killed by the limit; the table states the cgroup's peak and how often it hit the limit.

Example (on a machine with enough free disk; the default size is 2 x MemAvailable):
    python tests/bench/bench_bigdata.py
On a machine whose disk cannot hold that (as root):
    python tests/bench/bench_bigdata.py --memory-limit-gb 6       # 12 GB of data, 6 GB of memory
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
GB = 1e9
KEEP_FREE_GB = 30.0
IMAGE_SHAPE = (1, 28, 28)
CHUNK_BYTES = 256 << 20
TEST_EXAMPLES = 10_000


def mem_available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("cannot read MemAvailable from /proc/meminfo (Linux only)")


def write_images(path: Path, n: int, rng: np.random.Generator) -> None:
    """An (n, 1, 28, 28) uint8 .npy file written a chunk at a time (never held in memory)."""
    header = {"descr": "|u1", "fortran_order": False, "shape": (n, *IMAGE_SHAPE)}
    row = int(np.prod(IMAGE_SHAPE))
    rows_per_chunk = max(1, CHUNK_BYTES // row)
    block = rng.integers(0, 256, (rows_per_chunk, row), dtype=np.uint8)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_2_0(f, header)
        for i, start in enumerate(range(0, n, rows_per_chunk)):
            rows = min(rows_per_chunk, n - start)
            f.write((block[:rows] + np.uint8(i % 251)).tobytes())  # wraps mod 256: cheap, not constant
            if i % 8 == 0:
                f.flush()
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # written pages need not stay cached


def make_dataset(folder: Path, size_bytes: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    n = size_bytes // int(np.prod(IMAGE_SHAPE))
    write_images(folder / "x.npy", n, rng)
    np.save(folder / "y.npy", rng.integers(0, 10, n, dtype=np.uint8))
    write_images(folder / "x_test.npy", TEST_EXAMPLES, rng)
    np.save(folder / "y_test.npy", rng.integers(0, 10, TEST_EXAMPLES, dtype=np.uint8))
    return n


def train_child(folder: str, steps: int, batch: int) -> None:
    """In a fresh process: load through the engine, take `steps` DP-SGD steps, print one JSON line."""
    sys.path.insert(0, str(REPO))
    import torch

    from engine.config import RunConfig
    from engine.runs import prepare

    torch.set_num_threads(2)
    t0 = time.monotonic()
    config = RunConfig(dataset=folder, mechanism="dpsgd", model="mnist_cnn", epochs=1, expected_batch_size=batch,
                       max_physical_batch_size=batch, noise_multiplier=1.0, clipping_norm=1.0, learning_rate=0.5,
                       delta=1e-9, device="cpu")
    run = prepare(config)
    loaded = time.monotonic() - t0
    calls = [0]

    def should_stop() -> bool:
        calls[0] += 1
        return calls[0] > steps

    t1 = time.monotonic()
    result = run.train(should_stop=should_stop)
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    kb = lambda key: int(status[key].split()[0]) * 1024  # noqa: E731
    mapped = mapped_rss_bytes(Path(folder))
    print(json.dumps({
        "num_train": run.data.num_train, "x_train": type(run.data.x_train).__name__, "steps": result.steps_done,
        "samples": result.samples_processed, "load_s": loaded, "train_s": time.monotonic() - t1,
        "peak_rss": kb("VmHWM"), "rss_anon_end": kb("RssAnon"), "rss_file_end": kb("RssFile"),
        "test_accuracy": result.test_accuracy, "mapped_rss_end": mapped,
    }))


def mapped_rss_bytes(folder: Path) -> dict[str, int]:
    """Resident bytes of this process's mappings of the data files, by file (/proc/self/smaps)."""
    out: dict[str, int] = {}
    current = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if parts and "-" in parts[0] and len(parts) >= 6 and parts[5].startswith(str(folder)):
            current = Path(parts[5]).name
        elif parts and "-" in parts[0]:
            current = None
        elif current and parts[0] == "Rss:":
            out[current] = out.get(current, 0) + int(parts[1]) * 1024
    return out


class MemoryCgroup:
    """A memory cgroup (v1 or v2) limiting what the training process may hold, page cache included."""

    def __init__(self, limit_bytes: int) -> None:
        v1 = Path("/sys/fs/cgroup/memory")
        self.v1 = v1.is_dir()
        self.path = (v1 if self.v1 else Path("/sys/fs/cgroup")) / f"dpw-bench-{os.getpid()}"
        try:
            self.path.mkdir()
            limit_file = "memory.limit_in_bytes" if self.v1 else "memory.max"
            (self.path / limit_file).write_text(str(limit_bytes))
        except OSError as error:
            raise SystemExit(f"--memory-limit-gb needs a writable memory cgroup (root on Linux): {error}") from None
        self.limit = int((self.path / limit_file).read_text().strip())

    def enter(self) -> None:
        """Called in the child before exec: it and everything it starts are limited."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak_bytes(self) -> int | None:
        name = "memory.max_usage_in_bytes" if self.v1 else "memory.peak"
        try:
            return int((self.path / name).read_text().strip())
        except OSError:
            return None

    def limit_hits(self) -> str:
        if self.v1:
            return (self.path / "memory.failcnt").read_text().strip() + " (failcnt: reclaims forced by the limit)"
        events = dict(line.split() for line in (self.path / "memory.events").read_text().splitlines())
        return f"{events.get('max', '?')} (memory.events max), OOM kills {events.get('oom_kill', '?')}"

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=None, help="data size in GB (default: 2 x MemAvailable)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the data folder is written")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=256, help="expected batch size")
    parser.add_argument("--memory-limit-gb", type=float, default=None,
                        help="train in a memory cgroup of this size (root); the data defaults to twice it")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        train_child(args.child, args.steps, args.batch)
        return 0

    available = mem_available_bytes()
    cgroup = MemoryCgroup(int(args.memory_limit_gb * GB)) if args.memory_limit_gb is not None else None
    memory = cgroup.limit if cgroup is not None else available
    size = int(args.size_gb * GB) if args.size_gb is not None else 2 * memory
    free = shutil.disk_usage(args.dir).free
    if free - size < KEEP_FREE_GB * GB:
        print(f"refusing: {size / GB:.1f} GB in {args.dir} would leave {(free - size) / GB:.1f} GB free of "
              f"{free / GB:.1f} GB (at least {KEEP_FREE_GB:g} GB must stay free); use a smaller --size-gb, "
              f"--memory-limit-gb or another --dir", file=sys.stderr)
        if cgroup is not None:
            cgroup.remove()
        return 2
    folder = Path(tempfile.mkdtemp(prefix="dpw-bigdata-", dir=args.dir))
    try:
        t0 = time.monotonic()
        n = make_dataset(folder, size)
        written = sum(p.stat().st_size for p in folder.iterdir())
        print(f"wrote {written / GB:.2f} GB ({n:,} images 1x28x28 uint8) in {time.monotonic() - t0:.0f} s to {folder}; "
              f"MemAvailable {available / GB:.2f} GB", flush=True)
        if cgroup is not None:  # start cold: the pages written above are not in memory for the child
            os.sync()
            with open(folder / "x.npy", "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        proc = subprocess.run([sys.executable, __file__, "--child", str(folder), "--steps", str(args.steps),
                               "--batch", str(args.batch)], capture_output=True, text=True, cwd=REPO,
                              preexec_fn=cgroup.enter if cgroup is not None else None)
        if proc.returncode != 0:
            print(f"training process ended with {proc.returncode}", file=sys.stderr)
            print(proc.stderr[-3000:], file=sys.stderr)
            if cgroup is not None:
                print(f"cgroup limit {cgroup.limit / GB:.2f} GB, hits {cgroup.limit_hits()}", file=sys.stderr)
            return 1
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        from tabulate import tabulate

        print(tabulate([
            ("data (x.npy)", f"{(folder / 'x.npy').stat().st_size / GB:.2f} GB"),
            ("MemAvailable before", f"{available / GB:.2f} GB"),
            *([("memory limit of the training process (cgroup)", f"{cgroup.limit / GB:.2f} GB"),
               ("data size / memory limit", f"{(folder / 'x.npy').stat().st_size / cgroup.limit:.2f}"),
               ("cgroup peak (RSS + page cache)", f"{(cgroup.peak_bytes() or 0) / GB:.3f} GB"),
               ("times the limit was hit", cgroup.limit_hits())] if cgroup is not None else []),
            ("training examples", f"{r['num_train']:,} ({r['x_train']})"),
            ("DP-SGD steps (Poisson, expected batch)", f"{r['steps']} ({args.batch}), {r['samples']:,} examples read"),
            ("load s (incl. sha256 of the files)", f"{r['load_s']:.1f}"),
            ("train s (steps + final evaluation)", f"{r['train_s']:.1f}"),
            ("peak RSS of the training process", f"{r['peak_rss'] / GB:.3f} GB"),
            ("at the end: anonymous / file-backed", f"{r['rss_anon_end'] / GB:.3f} / {r['rss_file_end'] / GB:.3f} GB"),
            ("resident pages of the mapped files at the end",
             ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(r["mapped_rss_end"].items())) or "none"),
            ("peak RSS / data size", f"{r['peak_rss'] / (folder / 'x.npy').stat().st_size:.2%}"),
        ], tablefmt="plain"))
        return 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        print(f"deleted {folder}", flush=True)
        if cgroup is not None:
            cgroup.remove()


if __name__ == "__main__":
    sys.exit(main())
