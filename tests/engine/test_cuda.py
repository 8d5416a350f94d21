"""The CUDA path: per-example gradients, DP-SGD's sampling and noise, runs through `dpw run`, and the
exported model of a CUDA-trained run used on a machine without a GPU.

The GPU tests are marked `cuda` and skipped where torch sees no CUDA GPU (CI on CPU). On a GPU machine:

    QT_QPA_PLATFORM=offscreen python -m pytest -m cuda tests/engine/test_cuda.py -v

Every check lives in a helper that takes the device as a parameter; the tests call it with "cuda"
and compare with the CPU (the definition of right for the engine: tests/engine/test_per_sample.py
pins the CPU to single-example backward passes). One test runs only where there is NO GPU: asking
for "cuda" there is a one-line error that stores no run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from engine import privacy
from engine.datasets import load_dataset
from engine.dpsgd import mechanism
from engine.dpsgd.fast_layers import accelerate_model
from engine.dpsgd.per_sample import per_example_gradients
from engine.dpsgd.trainer import DPSGDStep, predict
from engine.export import load_trained_model
from engine.models import build_model
from engine.randomness import PrivateRandomness
from engine.runner import sha256_of
from engine.store import Store

REPO = Path(__file__).resolve().parents[2]

_NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (torch.cuda.is_available() is False); run with -m cuda on one")


def on_cuda(test):
    """Mark a test `cuda` and skip it where torch sees no CUDA GPU."""
    return pytest.mark.cuda(_NEEDS_GPU(test))


# float32 on a GPU against float32 on a CPU: the same math with other kernels and summation orders.
ATOL, RTOL = 1e-4, 1e-3
# With TF32 (cuDNN's default for float32 convolutions on Ampere and later: 10-bit mantissa), whole
# per-parameter tensors are compared by relative Frobenius error; a wrong kernel is off by O(1).
# Measured on an H200 (torch 2.11, CUDA 13.0): up to 0.053 (cifar_cnn) and 0.035 (mnist_cnn), in the
# first convolution's weights, whose gradient sums many products of rounded inputs.
TF32_RELATIVE_ERROR = 0.1


# ------------------------------------------------------------------------------------------------
# Models and data
# ------------------------------------------------------------------------------------------------


class PReLUNet(nn.Module):
    """A parameter outside the layer-wise strategy's layers (PReLU): the torch.func vmap path."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 32), nn.PReLU(32), nn.Linear(32, 10))

    def forward(self, x):
        return self.body(x)


CASES = {
    # name: (builder, input shape); mnist_cnn and cifar_cnn take the layer-wise path (Conv2d,
    # GroupNorm, Linear), prelu_mlp the vmap path.
    "mnist_cnn": (lambda: build_model("mnist_cnn", input_shape=(1, 28, 28), num_classes=10), (1, 28, 28)),
    "cifar_cnn": (lambda: build_model("cifar_cnn", input_shape=(3, 32, 32), num_classes=10), (3, 32, 32)),
    "prelu_mlp": (PReLUNet, (1, 28, 28)),
}


def case_model_and_batch(name: str, batch: int = 48, seed: int = 0):
    """A model's initial weights and a batch (inputs, labels), all on the CPU."""
    builder, shape = CASES[name]
    torch.manual_seed(seed)
    state = builder().state_dict()
    x = torch.randn(batch, *shape, generator=torch.Generator().manual_seed(seed + 1))
    y = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(seed + 2))
    return state, x, y


def engine_model(name: str, state: dict, device: str) -> nn.Module:
    """The model as the engine trains it on `device` (trainer.train: to(device), then accelerate_model)."""
    model = CASES[name][0]()
    model.load_state_dict(state)
    return accelerate_model(model.to(device).train())


@contextlib.contextmanager
def ieee_float32():
    """Full float32 in CUDA convolutions and matrix products (no TF32) for the duration."""
    cudnn_conv = getattr(torch.backends.cudnn, "conv", None)
    matmul = torch.backends.cuda.matmul
    if cudnn_conv is not None and hasattr(cudnn_conv, "fp32_precision"):
        before = (cudnn_conv.fp32_precision, matmul.fp32_precision)
        cudnn_conv.fp32_precision = matmul.fp32_precision = "ieee"
        try:
            yield
        finally:
            cudnn_conv.fp32_precision, matmul.fp32_precision = before
    else:  # torch releases before the fp32_precision settings
        before = (torch.backends.cudnn.allow_tf32, matmul.allow_tf32)
        torch.backends.cudnn.allow_tf32 = matmul.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cudnn.allow_tf32, matmul.allow_tf32 = before


def on_cpu(tensors):
    return [t.detach().to("cpu", torch.float64) for t in tensors]


def assert_close_list(got, want, *, atol=ATOL, rtol=RTOL, what="parameter"):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(on_cpu(got), on_cpu(want))):
        assert a.shape == b.shape, f"{what} {i}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=lambda m: f"{what} {i}: {m}")


def relative_errors(got, want) -> list[float]:
    return [float((a - b).norm() / b.norm().clamp(min=1e-12)) for a, b in zip(on_cpu(got), on_cpu(want))]


# ------------------------------------------------------------------------------------------------
# (a) per-example gradients, clipping and one DP-SGD step: the device against the CPU
# ------------------------------------------------------------------------------------------------


def engine_gradients(name: str, state: dict, x: torch.Tensor, y: torch.Tensor, device: str, *,
                     clipping_norm: float = 0.5) -> dict:
    """What the engine's per-example strategy computes on `device`: per-example losses and gradients,
    and DP-SGD's clipped sum with each example's norm (all returned on the CPU)."""
    model = engine_model(name, state, device)
    strategy = per_example_gradients(model)
    try:
        xd, yd = x.to(device), y.to(device)
        losses, grads = strategy(xd, yd)
        clipped_losses, summed, norms = strategy.clipped_sum(xd, yd, clipping_norm)
    finally:
        strategy.close()
    return {"strategy": type(strategy).__name__, "losses": losses.cpu(), "grads": on_cpu(grads),
            "clipped_losses": clipped_losses.cpu(), "summed": on_cpu(summed), "norms": norms.cpu()}


def dpsgd_step_weights(name: str, state: dict, x: torch.Tensor, y: torch.Tensor, device: str) -> list[torch.Tensor]:
    """The weights after one engine DP-SGD step on `device` with noise multiplier 0 (so the step is a
    function of the data), the batch split into physical chunks as a large logical batch is."""
    model = engine_model(name, state, device)
    params = [p for p in model.parameters() if p.requires_grad]
    step = DPSGDStep(model, torch.optim.SGD(params, lr=0.5, momentum=0.9), clipping_norm=0.5, noise_multiplier=0.0,
                     expected_batch_size=x.shape[0], max_physical_batch_size=max(1, x.shape[0] // 3),
                     noise_generator=PrivateRandomness().torch_generator("dpsgd_noise", device))
    try:
        loss_sum = step(x.to(device), y.to(device))
    finally:
        step.close()
    assert math.isfinite(loss_sum)
    return on_cpu(params)


@on_cuda
@pytest.mark.parametrize("name", sorted(CASES))
def test_per_example_gradients_on_cuda_equal_the_cpu_ones(name):
    state, x, y = case_model_and_batch(name)
    want = engine_gradients(name, state, x, y, "cpu")
    with ieee_float32():
        got = engine_gradients(name, state, x, y, "cuda")
    assert got["strategy"] == want["strategy"]
    torch.testing.assert_close(got["losses"], want["losses"], atol=ATOL, rtol=RTOL)
    assert_close_list(got["grads"], want["grads"])
    torch.testing.assert_close(got["norms"], want["norms"], atol=ATOL, rtol=RTOL)
    assert_close_list(got["summed"], want["summed"])


@on_cuda
@pytest.mark.parametrize("name", sorted(CASES))
def test_clipped_sums_on_cuda_at_default_precision_are_within_tf32_error(name):
    """What a run computes (cuDNN's default TF32 convolutions included) stays close to the CPU's."""
    state, x, y = case_model_and_batch(name, seed=5)
    want = engine_gradients(name, state, x, y, "cpu")
    got = engine_gradients(name, state, x, y, "cuda")
    assert max(relative_errors(got["summed"], want["summed"])) < TF32_RELATIVE_ERROR
    assert max(relative_errors([got["norms"]], [want["norms"]])) < TF32_RELATIVE_ERROR


@on_cuda
@pytest.mark.parametrize("name", ["mnist_cnn", "prelu_mlp"])
def test_a_dpsgd_step_on_cuda_updates_the_weights_as_on_the_cpu(name):
    state, x, y = case_model_and_batch(name, batch=100, seed=7)
    want = dpsgd_step_weights(name, state, x, y, "cpu")
    with ieee_float32():
        got = dpsgd_step_weights(name, state, x, y, "cuda")
    assert_close_list(got, want)
    assert not all(torch.equal(w, s.double()) for w, s in zip(want, state.values()))  # the step did move them


# ------------------------------------------------------------------------------------------------
# DP-SGD's sampling and noise drawn on the device
# ------------------------------------------------------------------------------------------------


def sampling_and_noise(device: str, noise_sampler: str) -> dict:
    """Poisson batches (N = 1,000,000, q = 0.01) and N(0, (sigma C)^2) noise on 1,000,000 coordinates
    (sigma 1.1, C 2.0), drawn on `device` from two runs' private randomness."""
    n, q, std = 1_000_000, 0.01, 1.1 * 2.0
    out: dict = {"sizes": [], "noise": []}
    for _ in range(2):  # two runs: two secret roots
        randomness = PrivateRandomness(noise_sampler=noise_sampler)
        sampler = randomness.torch_generator("poisson_sampling", device)
        batches = [mechanism.poisson_sample(n, q, sampler, device) for _ in range(3)]
        for idx in batches:
            assert idx.device.type == torch.device(device).type and idx.dtype == torch.int64
            assert bool((idx[1:] > idx[:-1]).all()) and 0 <= int(idx[0]) and int(idx[-1]) < n
        out["sizes"] += [int(idx.numel()) for idx in batches]
        zeros = [torch.zeros(1000, 1000, device=device)]
        noise = mechanism.add_gaussian_noise(zeros, noise_multiplier=1.1, clipping_norm=2.0,
                                             generator=randomness.torch_generator("dpsgd_noise", device))[0]
        assert noise.device.type == torch.device(device).type and noise.dtype == torch.float32
        out["noise"].append(noise.flatten().cpu().double())
    out.update(n=n, q=q, std=std)
    return out


@on_cuda
@pytest.mark.parametrize("noise_sampler", ["standard", "hardened"])
def test_poisson_sampling_and_noise_on_cuda_have_their_distributions(noise_sampler):
    drawn = sampling_and_noise("cuda", noise_sampler)
    mean, sd = drawn["n"] * drawn["q"], math.sqrt(drawn["n"] * drawn["q"] * (1 - drawn["q"]))
    assert all(abs(size - mean) < 6 * sd for size in drawn["sizes"])  # each batch size ~ Binomial(N, q)
    assert len(set(drawn["sizes"])) > 1
    for noise in drawn["noise"]:
        m = noise.numel()
        assert abs(float(noise.mean())) < 6 * drawn["std"] / math.sqrt(m)
        # the sample std of m Gaussians has sd ~ std / sqrt(2m)
        assert abs(float(noise.std()) - drawn["std"]) < 6 * drawn["std"] / math.sqrt(2 * m)
    first, second = drawn["noise"]
    assert not torch.equal(first, second)  # each run's noise comes from its own secret root
    assert abs(float(torch.corrcoef(torch.stack([first, second]))[0, 1])) < 0.01


# ------------------------------------------------------------------------------------------------
# (b) runs through `dpw run` on the device, (c) their exported model on a machine without a GPU
# ------------------------------------------------------------------------------------------------


def dpw(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=600, env=env)


def toml_text(values: dict) -> str:
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())


def dpsgd_config(mnist_dir: Path, device: str, noise_sampler: str, cuda_graphs: bool = False) -> dict:
    """A short real-MNIST DP-SGD run: mnist_cnn, 2,000 images, 2 epochs of batches of 100 (40 steps), each
    logical batch in physical chunks of 64 (so the chunked sum runs on the device too)."""
    variant = "graphs" if cuda_graphs else noise_sampler
    return dict(name=f"mnist-{device}-{variant}", dataset="mnist", data_dir=str(mnist_dir.parent),
                cuda_graphs=cuda_graphs,
                model="mnist_cnn", mechanism="dpsgd", noise_multiplier=1.0, clipping_norm=1.0, delta=1e-5,
                train_subset=2000, expected_batch_size=100, max_physical_batch_size=64, epochs=2,
                learning_rate=0.5, optimizer="momentum", evaluations_per_epoch=2, seed=3,
                noise_sampler=noise_sampler, device=device)


def run_with_dpw(tmp_path: Path, config: dict, db: Path) -> tuple[Store, int, subprocess.CompletedProcess]:
    """`dpw run CONFIG --db DB` as a user types it; the store and the new run's id."""
    path = tmp_path / f"{config['name']}.toml"
    path.write_text(toml_text(config))
    ran = dpw("run", str(path), "--db", str(db))
    assert ran.returncode == 0, ran.stderr[-3000:]
    store = Store(db)
    run_id = max(r["id"] for r in store.list_runs() if r["name"] == config["name"])
    return store, run_id, ran


def check_dpsgd_run(store: Store, run_id: int, device: str) -> dict:
    """A finished DP-SGD run trained on `device`, with its epsilon, privacy rows and model recorded."""
    run = store.get_run(run_id)
    assert run["status"] == "finished" and run["stop_reason"] == "completed", run.get("error")
    assert run["device"] == device
    assert run["num_train"] == 2000 and run["steps_done"] == run["steps_planned"] == 40
    expected = privacy.dpsgd_epsilon(sample_rate=100 / 2000, noise_multiplier=1.0, steps=40, delta=1e-5)
    assert run["accountant"] == "pld"
    assert run["epsilon"] == pytest.approx(expected.value, rel=1e-9)
    live = [p["epsilon"] for p in store.privacy(run_id, "rdp")]
    assert len(live) == 40 and live == sorted(live)
    assert len(store.metrics(run_id, "train_loss")) == 40
    assert all(math.isfinite(m["value"]) for m in store.metrics(run_id, "train_loss"))
    assert run["accuracy"] > 0.3  # chance is 0.1; 40 noisy steps on 2,000 images reach 0.58-0.63 on a CPU
    artifact = store.artifacts(run_id)[0]
    assert sha256_of(Path(artifact["path"])) == artifact["sha256"]
    return run


def raw_mnist_test(mnist_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MNIST's test images as the engine feeds them, as a user has them ([0, 1] pixels), and labels."""
    data = load_dataset("mnist", data_dir=mnist_dir.parent)
    norm = data.normalization
    mean = torch.tensor(norm["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(norm["std"]).view(1, -1, 1, 1)
    return data.x_test, data.x_test * std + mean, data.y_test


def check_export_on_a_machine_without_gpu(store: Store, run_id: int, out: Path, mnist_dir: Path) -> dict:
    """`dpw export` in a process that sees no GPU; every exported form, loaded on the CPU, predicts the
    MNIST test set as the saved model does, at the accuracy the run recorded."""
    no_gpu = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    exported = dpw("export", str(run_id), "--db", str(store.path), "--out", str(out), env=no_gpu)
    assert exported.returncode == 0, exported.stderr[-3000:]
    run = store.get_run(run_id)

    # model.pt (the run's artifact) holds CPU tensors only: it loads without map_location anywhere.
    saved = torch.load(store.artifacts(run_id)[0]["path"], weights_only=True)
    assert all(t.device.type == "cpu" for t in saved["state_dict"].values())

    x_test, raw, y_test = raw_mnist_test(mnist_dir)
    assert run["num_test"] == x_test.shape[0]
    reference = predict(load_trained_model(store, run_id).model, x_test)
    accuracy = float((reference == y_test).float().mean())
    # Recorded on the GPU (TF32 convolutions): a handful of near-ties may fall the other way on the CPU.
    assert abs(accuracy - run["accuracy"]) <= 0.003, (accuracy, run["accuracy"])

    from safetensors.torch import load_file

    weights = load_file(str(out / "model.safetensors"))
    assert all(t.device.type == "cpu" for t in weights.values())
    model = build_model("mnist_cnn", input_shape=(1, 28, 28), num_classes=10)
    model.load_state_dict(weights)
    assert torch.equal(predict(model.eval(), x_test), reference)

    program = torch.export.load(str(out / "model.pt2")).module()
    with torch.no_grad():
        program_pred = torch.cat([program(raw[s : s + 2000]).argmax(1) for s in range(0, raw.shape[0], 2000)])
    assert (program_pred == reference).float().mean() >= 0.999  # raw pixels: normalised inside, float rounding

    import onnxruntime

    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    onnx_pred = torch.from_numpy(session.run(None, {"input": raw.numpy().astype(np.float32)})[0].argmax(1))
    assert (onnx_pred == program_pred).float().mean() >= 0.999
    card = json.loads((out / "model_card.json").read_text())
    assert card["privacy"]["epsilon"] == run["epsilon"]
    return {"accuracy_on_cpu": accuracy, "accuracy_recorded": run["accuracy"]}


@pytest.fixture(scope="module")
def cuda_runs(tmp_path_factory, mnist_dir):
    """Three DP-SGD runs trained on the GPU through `dpw run` in one store: noise sampler standard,
    hardened, and standard with the clipped sum replayed from CUDA graphs."""
    folder = tmp_path_factory.mktemp("cuda-runs")
    db = folder / "runs.sqlite"
    runs = {}
    for variant, noise_sampler, graphs in [("standard", "standard", False), ("hardened", "hardened", False),
                                           ("graphs", "standard", True)]:
        store, run_id, _ = run_with_dpw(folder, dpsgd_config(mnist_dir, "cuda", noise_sampler, graphs), db)
        runs[variant] = run_id
    return Store(db), runs


@on_cuda
@pytest.mark.parametrize("variant", ["standard", "hardened", "graphs"])
def test_dpsgd_run_on_cuda_through_dpw_run_finishes_with_its_epsilon_recorded(cuda_runs, variant):
    store, runs = cuda_runs
    run = check_dpsgd_run(store, runs[variant], "cuda")
    assert run["summary"]["randomness"]  # the private randomness is described, as on the CPU


@on_cuda
def test_model_trained_on_cuda_exports_and_predicts_on_a_machine_without_gpu(cuda_runs, tmp_path, mnist_dir):
    store, runs = cuda_runs
    check_export_on_a_machine_without_gpu(store, runs["standard"], tmp_path / "exported", mnist_dir)


def pate_config(mnist_dir: Path, device: str) -> dict:
    """A short real-MNIST PATE run: 20 CNN teachers (stacked ensembles on the device), 300 queries, a
    semi-supervised student (its augmentations drawn on the CPU, applied on the device)."""
    return dict(name=f"pate-{device}", dataset="mnist", data_dir=str(mnist_dir.parent), mechanism="pate",
                train_subset=4000, num_teachers=20, teacher_model="mnist_cnn", teacher_epochs=5,
                teacher_batch_size=32, optimizer="adam", learning_rate=0.003, aggregator="confident",
                threshold=13.0, sigma1=4.0, sigma2=2.0, num_queries=300, model="mnist_cnn", student_epochs=5,
                semi_supervised=True, delta=1e-5, seed=1, device=device)


def check_pate_run(store: Store, run_id: int, device: str) -> dict:
    run = store.get_run(run_id)
    assert run["status"] == "finished" and run["stop_reason"] == "completed", run.get("error")
    assert run["device"] == device and run["mechanism"] == "pate"
    votes = store.votes(run_id)
    assert [v["query_index"] for v in votes] == list(range(300))
    assert all(sum(v["histogram"]) == 20 for v in votes)
    teacher_acc = store.metrics(run_id, "teacher_accuracy")
    assert len(teacher_acc) == 20 and all(0.5 < m["value"] <= 1 for m in teacher_acc)
    assert run["epsilon"] > 0 and run["accuracy"] > 0.5
    assert [a["kind"] for a in store.artifacts(run_id)] == ["model"]
    return run


@on_cuda
def test_pate_run_on_cuda_through_dpw_run_trains_teachers_and_student_on_the_gpu(tmp_path, mnist_dir):
    store, run_id, _ = run_with_dpw(tmp_path, pate_config(mnist_dir, "cuda"), tmp_path / "runs.sqlite")
    check_pate_run(store, run_id, "cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: the error is for machines without")
@pytest.mark.parametrize("mechanism", ["dpsgd", "pate"])
def test_cuda_asked_for_without_a_gpu_is_one_line_naming_device_and_stores_no_run(tmp_path, mechanism):
    extra = {"pate": dict(num_teachers=5, threshold=4.0, sigma1=1.5, sigma2=1.0, num_queries=50),
             "dpsgd": dict(noise_multiplier=1.0, epochs=1)}[mechanism]
    config = tmp_path / "gpu.toml"
    config.write_text(toml_text(dict(name="gpu", dataset="digits", mechanism=mechanism, delta=1e-4, device="cuda",
                                     **extra)))
    db = tmp_path / "runs.sqlite"
    ran = dpw("run", str(config), "--db", str(db))
    assert ran.returncode == 1
    assert ran.stderr.strip().splitlines() == [
        "error: device: 'cuda' was asked for but no CUDA GPU is available — use 'cpu' or 'auto'"]
    assert not db.exists() or Store(db).list_runs() == []
