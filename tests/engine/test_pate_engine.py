"""PATE engine parts: shards, the stacked teacher ensemble, the aggregators (statistically), the
student, the PATE config rules and `dpw privacy pate`."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from engine.config import RunConfig
from engine.errors import ConfigError
from engine.models import build_model
from engine.pate.aggregation import REJECTED, aggregate
from engine.pate.ensemble import StackedEnsemble
from engine.pate.shards import partition
from engine.pate.student import train_student
from engine.pate.teachers import build_teachers, group_size_for, train_teachers, vote_counts

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---- shards ------------------------------------------------------------------------------------


# Each example's teacher is a keyed hash of the example (engine.pate.shards.teacher_of); disjointness,
# completeness, binomial sizes, empty shards and the one-example-one-shard property are pinned in
# test_pate_shards.py.


def test_shards_are_seeded():
    a, b, c = partition(500, 5, seed=1), partition(500, 5, seed=1), partition(500, 5, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    few = partition(3, 5, seed=0)  # fewer examples than teachers: some shards are empty, nothing is refused
    assert len(few) == 5 and sorted(np.concatenate(few).tolist()) == [0, 1, 2]


# ---- the stacked ensemble ------------------------------------------------------------------------

MODELS = [("mnist_cnn", (1, 28, 28)), ("mlp", (1, 28, 28)), ("digits_cnn", (1, 8, 8)), ("logistic", (30,)),
          ("cifar_cnn", (3, 32, 32))]


@pytest.mark.parametrize("mode", ["layers", "vmap"])
@pytest.mark.parametrize("name, shape", MODELS)
def test_ensemble_computes_what_the_separate_models_compute(name, shape, mode):
    # In float64, so that "the same" means equal to round-off, not float32's accumulation order.
    torch.manual_seed(0)
    models = [build_model(name, input_shape=shape, num_classes=10).double() for _ in range(2)]
    ens = StackedEnsemble(models, vectorize=mode)
    assert ens.mode == mode
    x, y = torch.randn(2, 3, *shape, dtype=torch.float64), torch.randint(0, 10, (2, 3))
    out = ens(x)
    torch.testing.assert_close(out, torch.stack([m(x[k]) for k, m in enumerate(models)]), rtol=1e-10, atol=1e-12)
    shared = torch.randn(4, *shape, dtype=torch.float64)
    torch.testing.assert_close(ens.forward_shared(shared), torch.stack([m(shared) for m in models]),
                               rtol=1e-10, atol=1e-12)
    # Member k's gradient is the gradient of its own loss.
    F.cross_entropy(out.reshape(-1, 10), y.reshape(-1), reduction="none").view(2, -1).mean(1).sum().backward()
    for k, m in enumerate(models):
        F.cross_entropy(m(x[k]), y[k]).backward()
    for k, m in enumerate(models):
        ens_grads = _member_grads(ens, k)
        for pname, p in m.named_parameters():
            torch.testing.assert_close(ens_grads[pname], p.grad, rtol=1e-9, atol=1e-12)
        member = build_model(name, input_shape=shape, num_classes=10).double()
        member.load_state_dict(ens.member_state_dict(k))
        torch.testing.assert_close(member(shared), m(shared))


def _member_grads(ens: StackedEnsemble, k: int) -> dict[str, torch.Tensor]:
    grads = {}
    for key, p in ens.stacked.items():
        g = p.grad[k]
        grads[ens._names[key]] = g.t() if key in ens._transposed else g
    return grads


def test_training_teachers_together_equals_training_them_one_by_one():
    # Full-batch SGD (one step per epoch): the stacked run must reproduce each separate run.
    torch.manual_seed(1)
    x, y = torch.randn(60, 1, 8, 8), torch.randint(0, 10, (60,))
    shards = partition(x, 4, seed=0, labels=y)  # unequal sizes; a batch as large as the data: one step each
    assert len({len(s) for s in shards}) > 1
    models = build_teachers("digits_cnn", input_shape=(1, 8, 8), num_classes=10, num_teachers=4, seed=5)
    separate = build_teachers("digits_cnn", input_shape=(1, 8, 8), num_classes=10, num_teachers=4, seed=5)
    sgd = lambda params: torch.optim.SGD(params, lr=0.5)  # noqa: E731
    teachers = train_teachers(models, x, y, shards, epochs=3, batch_size=60, make_optimizer=sgd, seed=0)
    for k, (model, shard) in enumerate(zip(separate, shards)):
        opt = sgd(list(model.parameters()))
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(model(x[shard]), y[shard]).backward()
            opt.step()
        for name, value in model.state_dict().items():
            torch.testing.assert_close(teachers.member_state_dict(k)[name], value, rtol=1e-4, atol=1e-6)
    assert teachers.num_teachers == 4 and teachers.epochs_done == 3 and teachers.num_classes == 10


def test_teacher_groups_are_sized_for_the_device():
    """CPU: groups whose activations stay near the cache (mnist_cnn: 24 teachers of batch 32); GPU:
    as many as about 256 MB per layer output holds (all 250 MNIST teachers in one group)."""
    model = build_model("mnist_cnn", input_shape=(1, 28, 28), num_classes=10)
    assert group_size_for(model, (1, 28, 28), 32, 250) == 24
    assert group_size_for(model, (1, 28, 28), 32, 250, "cuda") == 250
    assert group_size_for(model, (1, 28, 28), 32, 5000, "cuda") == 637
    assert group_size_for(model, (1, 28, 28), 10**9, 50, "cuda") == 1  # never below one teacher


def test_teacher_groups_and_votes():
    torch.manual_seed(2)
    x, y = torch.randn(90, 30), torch.randint(0, 3, (90,))
    shards = partition(90, 9, seed=0)
    models = build_teachers("logistic", input_shape=(30,), num_classes=3, num_teachers=9, seed=0)
    teachers = train_teachers(models, x, y, shards, epochs=2, batch_size=4,
                              make_optimizer=lambda p: torch.optim.Adam(p, lr=1e-2), seed=0, group_size=4)
    assert [g.num_members for g in teachers.groups] == [4, 4, 1]
    pred = teachers.predict(x[:17])
    assert pred.shape == (9, 17)
    votes = vote_counts(pred, 3)
    assert votes.shape == (17, 3) and np.all(votes.sum(axis=1) == 9)
    for k in (0, 5, 8):  # predictions are each member's own
        member = build_model("logistic", input_shape=(30,), num_classes=3)
        member.load_state_dict(teachers.member_state_dict(k))
        assert torch.equal(member(x[:17]).argmax(1), pred[k])


def test_training_stops_when_asked():
    x, y = torch.randn(40, 30), torch.randint(0, 3, (40,))
    models = build_teachers("logistic", input_shape=(30,), num_classes=3, num_teachers=2, seed=0)
    calls = iter(range(1000))
    teachers = train_teachers(models, x, y, partition(40, 2, seed=0), epochs=50, batch_size=5,
                              make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1), seed=0,
                              should_stop=lambda: next(calls) >= 10)
    assert teachers.epochs_done < 50


# ---- aggregators, statistically ------------------------------------------------------------------

DRAWS = 40_000


def _within(freq: float, p: float, draws: int = DRAWS) -> bool:
    return abs(freq - p) <= 4.5 * math.sqrt(p * (1 - p) / draws) + 1e-9


@pytest.mark.parametrize("gap, sigma", [(0, 40.0), (30, 40.0), (60, 20.0)])
def test_gnmax_noise_scale(gap, sigma):
    votes = np.tile([[100 + gap, 100]], (DRAWS, 1))
    out = aggregate(votes, aggregator="gnmax", rng=np.random.default_rng(0), sigma=sigma)
    # argmax(n0 + Z0, n1 + Z1) = 0 iff Z1 - Z0 < gap, Z1 - Z0 ~ N(0, 2 sigma^2)
    assert _within(float(np.mean(out.labels == 0)), stats.norm.cdf(gap / (math.sqrt(2) * sigma)))
    assert out.answered.all()


@pytest.mark.parametrize("gap, b", [(0, 20.0), (20, 20.0), (10, 5.0)])
def test_lnmax_noise_scale(gap, b):
    votes = np.tile([[50 + gap, 50]], (DRAWS, 1))
    out = aggregate(votes, aggregator="lnmax", rng=np.random.default_rng(1), laplace_scale=b)
    # The difference of two Laplace(b) has P(D < x) = 1 - e^(-x/b) (1 + x/(2b)) / 2 for x >= 0.
    p = 1 - 0.5 * math.exp(-gap / b) * (1 + gap / (2 * b))
    assert _within(float(np.mean(out.labels == 0)), p)


def test_confident_gnmax_threshold_and_answers():
    votes = np.tile([[180, 70, 0]], (DRAWS, 1))
    out = aggregate(votes, aggregator="confident", rng=np.random.default_rng(2), threshold=200.0, sigma1=50.0,
                    sigma2=40.0)
    assert _within(float(out.answered.mean()), stats.norm.sf((200 - 180) / 50.0))
    assert np.all(out.labels[~out.answered] == REJECTED) and np.all(out.labels[out.answered] >= 0)
    answered = out.labels[out.answered]
    assert _within(float(np.mean(answered == 0)), stats.norm.cdf(110 / (math.sqrt(2) * 40.0)), draws=len(answered))


def test_aggregators_are_reproducible_from_the_seed():
    votes = np.random.default_rng(0).integers(0, 50, size=(100, 10))
    a = aggregate(votes, aggregator="confident", rng=np.random.default_rng(7), threshold=40, sigma1=5, sigma2=3)
    b = aggregate(votes, aggregator="confident", rng=np.random.default_rng(7), threshold=40, sigma1=5, sigma2=3)
    assert np.array_equal(a.labels, b.labels) and np.array_equal(a.answered, b.answered)


# ---- student ------------------------------------------------------------------------------------


def test_semi_supervised_student_trains_and_reports_pseudo_labels():
    from engine.datasets import load_dataset

    data = load_dataset("digits", seed=0)
    torch.manual_seed(0)
    model = build_model("digits_cnn", input_shape=data.input_shape, num_classes=data.num_classes)
    events = []
    res = train_student(model, data.x_train[:200], data.y_train[:200], x_pool=data.x_train[200:],
                        x_eval=data.x_test, y_eval=data.y_test, epochs=10, batch_size=32,
                        make_optimizer=lambda p: torch.optim.Adam(p, lr=3e-3), seed=0, semi_supervised=True,
                        emit=lambda kind, **kw: events.append((kind, kw)))
    assert res.stop_reason == "completed" and res.epochs_done == 10
    assert res.test_accuracy > 0.5
    assert res.pseudo_label_rate is not None and 0 < res.pseudo_label_rate <= 1
    names = {kw.get("name") for kind, kw in events if kind == "metric"}
    assert {"train_loss", "test_accuracy", "pseudo_label_rate"} <= names


def test_semi_supervised_student_learns_from_the_unlabeled_pool(mnist_dir):
    """Real MNIST, 100 labels and 3,000 unlabeled pool images: with the same number of steps (280)
    the student is clearly more accurate when it also learns from the pool (measured over seeds
    0-3: 73.5-75.0% -> 81.2-82.7%). Semi-supervised, an epoch covers the pool: 14 steps, not 4."""
    from engine.datasets import load_dataset

    data = load_dataset("mnist", data_dir=mnist_dir.parent)
    pool, labels = data.x_test[:3000], data.y_test[:100]
    results = {}
    for semi, epochs in ((False, 70), (True, 20)):
        torch.manual_seed(0)
        model = build_model("mnist_cnn", input_shape=data.input_shape, num_classes=10)
        results[semi] = train_student(model, pool[:100], labels, x_pool=pool, x_eval=data.x_test[9000:],
                                      y_eval=data.y_test[9000:], epochs=epochs, batch_size=32,
                                      make_optimizer=lambda p: torch.optim.Adam(p, lr=3e-3), seed=0,
                                      semi_supervised=semi)
    assert results[False].steps == results[True].steps == 280
    assert results[True].test_accuracy >= results[False].test_accuracy + 0.04, results


# ---- config -------------------------------------------------------------------------------------


def test_pate_defaults_are_valid_and_dpsgd_configs_unchanged():
    config = RunConfig(mechanism="pate")
    assert config.aggregator == "confident" and config.num_teachers == 250
    config.check_against_dataset(60000, 10000)
    assert config.pool_size_for(10000) == 9000
    RunConfig(noise_multiplier=1.1)  # a DP-SGD config needs no PATE field


@pytest.mark.parametrize("values, field, words", [
    ({"threshold": 300.0}, "threshold", ["300", "num_teachers = 250", "0 to 250"]),
    ({"num_queries": 500, "public_pool_size": 100}, "num_queries", ["500", "100"]),
    ({"num_teachers": 1}, "num_teachers", ["1", ">= 2"]),
    ({"sigma1": 0.0}, "sigma1", ["0", "> 0"]),
    ({"aggregator": "rnm"}, "aggregator", ["rnm", "'confident'"]),
    ({"laplace_scale": -1.0}, "laplace_scale", ["-1"]),
])
def test_pate_settings_are_refused_with_field_value_and_range(values, field, words):
    with pytest.raises(ConfigError) as info:
        RunConfig(mechanism="pate", **values)
    assert info.value.field == field
    for word in words:
        assert word in str(info.value) + (info.value.hint or "")


def test_pate_rules_against_the_dataset():
    with pytest.raises(ConfigError, match="num_teachers"):
        RunConfig(mechanism="pate", num_teachers=500).check_against_dataset(400, 100)
    with pytest.raises(ConfigError, match="public_pool_size"):
        RunConfig(mechanism="pate", public_pool_size=100, num_queries=50).check_against_dataset(1000, 100)
    with pytest.raises(ConfigError, match="num_queries"):
        RunConfig(mechanism="pate", num_queries=95).check_against_dataset(1000, 100)
    with pytest.raises(ConfigError, match="delta"):
        RunConfig(mechanism="pate", delta=1e-2, num_teachers=10, threshold=8.0).check_against_dataset(1000, 100)


def test_threshold_above_teachers_is_fine_for_other_aggregators():
    RunConfig(mechanism="pate", aggregator="gnmax", threshold=300.0)


# ---- CLI ----------------------------------------------------------------------------------------


def _dpw(*args: str) -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        "from engine.cli import cli\n"
        "try:\n"
        "    cli(list(sys.argv[1:]), prog_name='dpw')\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "else:\n"
        "    code = 0\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_cli_privacy_pate_json_without_torch(tmp_path):
    rng = np.random.default_rng(0)
    votes = np.array([rng.multinomial(250, [0.9] + [0.1 / 9] * 9) for _ in range(50)])
    np.save(tmp_path / "votes.npy", votes)
    np.save(tmp_path / "mask.npy", rng.random(50) < 0.7)
    res = _dpw("privacy", "pate", "--votes", str(tmp_path / "votes.npy"), "--mechanism", "confident",
               "--threshold", "200", "--sigma1", "150", "--sigma2", "40", "--answered", str(tmp_path / "mask.npy"),
               "--delta", "1e-5", "--json")
    assert res.returncode == 0, res.stderr
    assert "NO-TORCH" in res.stderr
    out = json.loads(res.stdout)
    for key in ("epsilon_data_dependent", "epsilon_data_independent", "answered", "order", "delta", "orders", "rdp"):
        assert key in out
    assert out["answered"] == int(np.load(tmp_path / "mask.npy").sum()) and not out["answered_is_expected"]
    assert len(out["orders"]) == len(out["rdp"])
    assert 0 < out["epsilon_data_dependent"] < out["epsilon_data_independent"]
    expected = _dpw("privacy", "pate", "--votes", str(tmp_path / "votes.npy"), "--mechanism", "confident",
                    "--threshold", "200", "--sigma1", "150", "--sigma2", "40", "--delta", "1e-5", "--json")
    assert json.loads(expected.stdout)["answered_is_expected"] is True


def test_cli_privacy_pate_release_draws_secret_noise_with_public_parameters(tmp_path):
    """--release is what a PATE run releases: noise from secret OS randomness (two calls differ; nothing
    given rebuilds it), parameters fixed from public quantities, stated safe to publish; a debugging
    --release-seed repeats exactly and says it carries no guarantee; parameters chosen from the votes
    are stated as not covered. Without torch, as the other privacy commands."""
    rng = np.random.default_rng(1)
    votes = np.array([rng.multinomial(250, [0.85] + [0.15 / 9] * 9) for _ in range(80)])
    np.save(tmp_path / "votes.npy", votes)
    base = ("privacy", "pate", "--votes", str(tmp_path / "votes.npy"), "--mechanism", "confident", "--threshold",
            "200", "--sigma1", "150", "--sigma2", "40", "--delta", "1e-5", "--json")

    def release(*extra: str) -> dict:
        res = _dpw(*base, *extra)
        assert res.returncode == 0, res.stderr
        assert "NO-TORCH" in res.stderr
        return json.loads(res.stdout)

    first, second = release("--release"), release("--release")
    # a fresh secret draw each time (the noisy RDP itself: the epsilon clamps a negative one at 0)
    assert first["release"]["rdp_released"] != second["release"]["rdp_released"]
    for out in (first, second):
        assert out["release"]["noise"] == "secret" and out["release"]["publishable"] is True
        assert out["release"]["parameters_from_data"] is False and out["release"]["caveat"] is None
    assert first["release"]["order"] == second["release"]["order"]  # fixed before the votes, the same each time
    seeded = [release("--release-seed", "7") for _ in range(2)]
    assert seeded[0]["release"]["rdp_released"] == seeded[1]["release"]["rdp_released"]
    assert seeded[0]["release"]["noise"] == "seeded" and seeded[0]["release"]["publishable"] is False
    assert "no guarantee" in seeded[0]["release"]["caveat"]
    from_votes = release("--release", "--release-parameters", "data-dependent")
    assert from_votes["release"]["parameters_from_data"] is True and from_votes["release"]["publishable"] is False
    text = _dpw(*base[:-1], "--release-seed", "7")
    assert "NOT publishable" in text.stdout and "--release-seed 7" in text.stdout
    lnmax = _dpw("privacy", "pate", "--votes", str(tmp_path / "votes.npy"), "--mechanism", "lnmax",
                 "--laplace-scale", "20", "--delta", "1e-5", "--release")
    assert lnmax.returncode != 0 and "covers gnmax and confident" in lnmax.stderr and "Traceback" not in lnmax.stderr


def test_cli_privacy_pate_user_errors_are_one_line(tmp_path):
    np.save(tmp_path / "votes.npy", np.array([[1.5, 2.0]]))
    res = _dpw("privacy", "pate", "--votes", str(tmp_path / "votes.npy"), "--mechanism", "gnmax", "--sigma", "4",
               "--delta", "1e-5")
    assert res.returncode != 0 and "integer vote counts" in res.stderr and "Traceback" not in res.stderr
    np.save(tmp_path / "votes.npy", np.array([[3, 1]]))
    res = _dpw("privacy", "pate", "--votes", str(tmp_path / "votes.npy"), "--mechanism", "gnmax", "--delta", "1e-5")
    assert res.returncode != 0 and "--sigma is needed" in res.stderr
    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "votes.toml").write_text("name = 1\n", encoding="utf-8")
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for name, said in (("empty.npy", "the file is empty"), ("votes.toml", "not a .npy file"),
                       ("objects.npy", "a damaged or object .npy file")):
        res = _dpw("privacy", "pate", "--votes", str(tmp_path / name), "--mechanism", "gnmax", "--sigma", "4",
                   "--delta", "1e-5")
        assert res.returncode == 1 and said in res.stderr and "numpy.save" in res.stderr, res.stderr
        assert "Aborted" not in res.stderr and "pickle" not in res.stderr and "Traceback" not in res.stderr
