"""The one run configuration: fields, defaults, units and bounds in one place.

The GUI form, the CLI's TOML files and the engine all go through `RunConfig`. Each field's
rules live in its `FieldSpec` (in the dataclass field's metadata), so a form can be generated
from `config_fields()` and every error names the field, the value and the allowed range.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import hashlib
import json
import math
import re
import tomllib
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import ConfigError

SCHEMA_VERSION = 1

MECHANISMS = ("dpsgd", "pate", "none")
PATE_AGGREGATORS = ("confident", "gnmax", "lnmax")
PATE_BUDGET_ON = ("data-independent", "data-dependent")
RELEASE_PARAMETERS = ("data-independent", "data-dependent")
TEACHERS_BACKENDS = ("local", "ray")  # engine.pate.ray_backend
# The noise settings each PATE aggregator uses (the others are ignored for that aggregator).
AGGREGATOR_FIELDS = {
    "lnmax": ("laplace_scale",),
    "gnmax": ("gnmax_sigma",),
    "confident": ("threshold", "sigma1", "sigma2"),
}
OPTIMIZERS = ("sgd", "momentum", "adam")
LR_SCHEDULES = ("constant", "cosine")
DEVICES = ("auto", "cpu", "cuda")
ACCOUNTANT_CHOICES = ("pld", "rdp")
NOISE_SAMPLERS = ("standard", "hardened")
NORMALIZATIONS = ("bounds", "dp", "exact")  # engine.feature_scaling
AUDIT_CANARY_KINDS = ("input", "gradient")  # engine.dpsgd.canaries


@dataclass(frozen=True)
class FieldSpec:
    """What a config field means and which values it accepts."""

    label: str
    help: str
    kind: type  # str, int, float or bool
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False
    choices: tuple[str, ...] | None = None
    optional: bool = False  # None is an allowed value
    unit: str = ""
    mechanisms: tuple[str, ...] = ()  # mechanisms that use it; empty = all
    group: str = "run"

    def allowed(self) -> str:
        """The allowed values in words, for error messages and tooltips."""
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        parts = []
        if self.minimum is not None:
            parts.append(("> " if self.exclusive_minimum else ">= ") + as_toml(self.minimum))
        if self.maximum is not None:
            parts.append(("< " if self.exclusive_maximum else "<= ") + as_toml(self.maximum))
        kind = {int: "a whole number", float: "a number", str: "text", bool: "true or false"}[self.kind]
        text = kind + (" " + " and ".join(parts) if parts else "")
        return text + (", or unset" if self.optional else "")


def _spec(default: Any, **kwargs: Any) -> Any:
    return field(default=default, metadata={"spec": FieldSpec(**kwargs)})


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a training run. Validated on construction."""

    name: str = _spec("run", label="Name", help="A name to find the run by.", kind=str)
    dataset: str = _spec(
        "mnist",
        label="Dataset",
        help="A registered dataset (mnist, fashion-mnist, cifar10, svhn, digits, breast-cancer) "
        "or the path of a .csv or .npz file, of a folder holding x.npy and y.npy (memory-mapped: images "
        "larger than memory), or of an image folder (one sub-folder per class, read on demand). In a "
        "config file, a relative path is taken from the file's folder.",
        kind=str,
        group="data",
    )
    data_dir: str | None = _spec(
        None,
        label="Data directory",
        help="Where registered datasets' files are; unset: $DPW_DATA_DIR, else the per-user data folder.",
        kind=str,
        optional=True,
        group="data",
    )
    label_column: str = _spec(
        "label", label="Label column", help="The CSV column that holds the class label.", kind=str, group="data"
    )
    classes: str | None = _spec(
        None,
        label="Classes",
        help="The classes, known without looking at the data, separated by commas (e.g. 'healthy, flu, other'): "
        "the model gets one output per class in this order, and a label outside them is refused. Unset: the "
        "labels found in the data, whose set the report then states as treated as public.",
        kind=str,
        optional=True,
        group="data",
    )
    test_data: str | None = _spec(
        None,
        label="Test data",
        help="The test examples, given apart: for a CSV dataset a CSV file with its columns, for an image "
        "folder a folder with its class sub-folders. They are the test split (and PATE's public pool) instead "
        "of one drawn from the dataset, so every example of the dataset trains and is protected. Unset: "
        "test_fraction of the dataset is held out.",
        kind=str,
        optional=True,
        group="data",
    )
    test_fraction: float = _spec(
        0.2,
        label="Test fraction",
        help="Share of examples held out for testing when the dataset has no test split (on average: "
        "each example's side is decided by a keyed hash of the example and the seed).",
        kind=float,
        minimum=0.0,
        maximum=0.9,
        exclusive_minimum=True,
        group="data",
    )
    train_subset: int | None = _spec(
        None,
        label="Training subset",
        help="Train on this many of the training examples, chosen by a keyed hash of each example and the "
        "seed (quick trials); one example more or less in the data can swap one of the subset for another, "
        "so for the data as given the guarantee is that of two rows. Unset: all of them.",
        kind=int,
        minimum=10,
        maximum=100_000_000,
        optional=True,
        unit="examples",
        group="data",
    )
    allow_download: bool = _spec(
        False,
        label="Allow download",
        help="Download a registered dataset's files when they are missing and the network allows.",
        kind=bool,
        group="data",
    )
    normalization: str = _spec(
        "bounds",
        label="Table normalization",
        help="How table features are scaled (images always use fixed constants). bounds: clip each feature "
        "to its declared range and map it to [-1, 1], revealing nothing about the data; dp: estimate each "
        "feature's mean and std with the Gaussian mechanism inside the declared ranges, counted in the "
        "run's epsilon (DP-SGD only); exact: the training split's own mean and std, released with the "
        "model: a private run then states no guarantee at all (fine for a non-private baseline).",
        kind=str,
        choices=NORMALIZATIONS,
        group="data",
    )
    feature_bounds: str | None = _spec(
        None,
        label="Feature bounds",
        help="Declared range of table features, known without looking at the data: 'low:high' for every "
        "feature, or 'name=low:high; name=low:high; *=low:high' (CSV: header names; NPZ: 0, 1, ...). "
        "Unset: features without a range are used unscaled (built-in tables use their published ranges).",
        kind=str,
        optional=True,
        group="data",
    )
    normalization_noise_multiplier: float = _spec(
        10.0,
        label="Normalization noise multiplier",
        help="normalization = dp: standard deviation of the Gaussian noise on the features' sums, in "
        "units of their sensitivity (sqrt(2 x features) in [-1, 1] units). Larger: less privacy spent, "
        "noisier statistics.",
        kind=float,
        minimum=0.0,
        maximum=1e6,
        exclusive_minimum=True,
        unit="× sensitivity",
        mechanisms=("dpsgd",),
        group="data",
    )
    model: str = _spec(
        "auto",
        label="Model",
        help="A registered model, or 'auto' to pick one that suits the dataset (PATE: the student).",
        kind=str,
        group="model",
    )
    mechanism: str = _spec(
        "dpsgd",
        label="Mechanism",
        help="dpsgd: differentially private SGD; pate: private aggregation of teacher ensembles "
        "(teachers on disjoint shards label a public pool through a noisy vote); none: a non-private baseline.",
        kind=str,
        choices=MECHANISMS,
        group="privacy",
    )
    noise_multiplier: float | None = _spec(
        None,
        label="Noise multiplier",
        help="Standard deviation of the Gaussian noise, in units of the clipping norm. "
        "Set this or a target epsilon, not both.",
        kind=float,
        minimum=0.0,
        maximum=1000.0,
        exclusive_minimum=True,
        optional=True,
        unit="× clipping norm",
        mechanisms=("dpsgd",),
        group="privacy",
    )
    target_epsilon: float | None = _spec(
        None,
        label="Target epsilon",
        help="Calibrate the noise multiplier so that training ends at this epsilon. "
        "Set this or a noise multiplier, not both.",
        kind=float,
        minimum=0.0,
        maximum=100.0,
        exclusive_minimum=True,
        optional=True,
        unit="ε",
        mechanisms=("dpsgd",),
        group="privacy",
    )
    target_attack_tpr: float | None = _spec(
        None,
        label="Target attack TPR",
        help="Calibrate the noise multiplier so that no membership attack can reach a higher true-positive "
        "rate than this at the attack FPR (the f-DP bound of the PLD accountant). Set this, a target "
        "epsilon or a noise multiplier.",
        kind=float,
        minimum=0.0,
        maximum=1.0,
        exclusive_minimum=True,
        exclusive_maximum=True,
        optional=True,
        unit="TPR",
        mechanisms=("dpsgd",),
        group="privacy",
    )
    target_attack_fpr: float = _spec(
        0.01,
        label="Attack FPR",
        help="The false-positive rate at which the target attack TPR holds (used only with it).",
        kind=float,
        minimum=0.0,
        maximum=0.5,
        exclusive_minimum=True,
        unit="FPR",
        mechanisms=("dpsgd",),
        group="privacy",
    )
    clipping_norm: float = _spec(
        1.0,
        label="Clipping norm",
        help="Each example's gradient is scaled down to at most this L2 norm.",
        kind=float,
        minimum=0.0,
        maximum=1e4,
        exclusive_minimum=True,
        unit="L2 norm",
        mechanisms=("dpsgd",),
        group="privacy",
    )
    delta: float = _spec(
        1e-5,
        label="Delta",
        help="Probability with which the epsilon guarantee may fail; must be below 1/N.",
        kind=float,
        minimum=0.0,
        maximum=1.0,
        exclusive_minimum=True,
        exclusive_maximum=True,
        unit="δ",
        mechanisms=("dpsgd", "pate"),
        group="privacy",
    )
    epsilon_budget: float | None = _spec(
        None,
        label="Epsilon budget",
        help="Hard cap: training stops before the first step that would exceed it "
        "(PATE: the teachers stop answering before the query that would exceed it).",
        kind=float,
        minimum=0.0,
        maximum=1000.0,
        exclusive_minimum=True,
        optional=True,
        unit="ε",
        mechanisms=("dpsgd", "pate"),
        group="privacy",
    )
    accountant: str = _spec(
        "pld",
        label="Accountant",
        help="pld: privacy loss distributions (tight, reported); rdp: Rényi DP (looser).",
        kind=str,
        choices=ACCOUNTANT_CHOICES,
        mechanisms=("dpsgd",),
        group="privacy",
    )
    expected_batch_size: int = _spec(
        256,
        label="Expected batch size",
        help="Each example joins a step independently with probability expected_batch_size / N "
        "(Poisson sampling), so batch sizes vary around this.",
        kind=int,
        minimum=1,
        maximum=1_000_000,
        unit="examples",
        mechanisms=("dpsgd", "none"),
        group="training",
    )
    max_physical_batch_size: int = _spec(
        512,
        label="Physical batch limit",
        help="Largest chunk processed at once; larger batches are split so memory stays bounded.",
        kind=int,
        minimum=1,
        maximum=1_000_000,
        unit="examples",
        mechanisms=("dpsgd", "none"),
        group="training",
    )
    epochs: int = _spec(
        10, label="Epochs", help="Passes over the training set (in expectation).", kind=int,
        minimum=1, maximum=10_000, mechanisms=("dpsgd", "none"), group="training",
    )
    learning_rate: float = _spec(
        0.1, label="Learning rate", help="Step size of the optimizer (PATE: of the teachers and the student).",
        kind=float,
        minimum=0.0, maximum=1000.0, exclusive_minimum=True, group="training",
    )
    optimizer: str = _spec(
        "sgd", label="Optimizer", help="sgd, momentum (SGD with momentum) or adam.", kind=str,
        choices=OPTIMIZERS, group="training",
    )
    momentum: float = _spec(
        0.9, label="Momentum", help="Momentum of the 'momentum' optimizer.", kind=float,
        minimum=0.0, maximum=1.0, exclusive_maximum=True, group="training",
    )
    lr_schedule: str = _spec(
        "constant", label="Learning-rate schedule",
        help="constant, or cosine: decay from the learning rate to zero over the steps the run will take "
        "(averages out the DP noise late in training).", kind=str, choices=LR_SCHEDULES,
        mechanisms=("dpsgd", "none"), group="training",
    )
    evaluations_per_epoch: int = _spec(
        1, label="Evaluations per epoch", help="How often test accuracy is measured.", kind=int,
        minimum=1, maximum=100, group="training",
    )
    # ---- PATE (Papernot et al. 2017, 2018) -------------------------------------------------------
    num_teachers: int = _spec(
        250, label="Teachers", help="The private training set is split into this many disjoint shards, "
        "one teacher per shard.", kind=int, minimum=2, maximum=100_000, unit="teachers",
        mechanisms=("pate",), group="pate",
    )
    teacher_model: str = _spec(
        "auto", label="Teacher model", help="A registered model for the teachers, or 'auto' to pick one "
        "that suits the dataset.", kind=str, mechanisms=("pate",), group="pate",
    )
    teacher_epochs: int = _spec(
        40, label="Teacher epochs", help="Passes of each teacher over its own shard.", kind=int,
        minimum=1, maximum=10_000, mechanisms=("pate",), group="pate",
    )
    teacher_batch_size: int = _spec(
        32, label="Teacher batch size", help="Examples of its shard per teacher step; all teachers "
        "step together.", kind=int, minimum=1, maximum=100_000, unit="examples", mechanisms=("pate",),
        group="pate",
    )
    teachers_backend: str = _spec(
        "local", label="Teachers on", help="local: the teachers train in the run's own process. ray: teacher "
        "groups train as Ray tasks (pip install 'dp-workbench[cluster]'), on ray_address or a Ray started on this "
        "machine; the same seed gives the same teachers either way, and the aggregation noise is drawn here only.",
        kind=str, choices=TEACHERS_BACKENDS, mechanisms=("pate",), group="pate",
    )
    ray_address: str | None = _spec(
        None, label="Ray address", help="An existing Ray cluster for teachers_backend = 'ray' (e.g. "
        "'ray://head:10001' or 'auto'). Unset: a Ray is started on this machine for the run.", kind=str,
        optional=True, mechanisms=("pate",), group="pate",
    )
    aggregator: str = _spec(
        "confident", label="Aggregator", help="How the teachers' votes are released. lnmax: Laplace noise "
        "on each count (2017); gnmax: Gaussian noise (2018); confident: answer only when the top count "
        "plus Gaussian noise (sigma1) reaches the threshold, then GNMax with sigma2 (2018).", kind=str,
        choices=PATE_AGGREGATORS, mechanisms=("pate",), group="pate",
    )
    laplace_scale: float = _spec(
        20.0, label="Laplace scale", help="LNMax: scale b of the Laplace noise added to each vote count "
        "(gamma = 1/b in the 2017 paper; each query is 2/b-DP).", kind=float, minimum=0.0,
        maximum=1e6, exclusive_minimum=True, unit="votes", mechanisms=("pate",), group="pate",
    )
    gnmax_sigma: float = _spec(
        40.0, label="GNMax sigma", help="GNMax: standard deviation of the Gaussian noise added to each "
        "vote count.", kind=float, minimum=0.0, maximum=1e6, exclusive_minimum=True, unit="votes",
        mechanisms=("pate",), group="pate",
    )
    threshold: float = _spec(
        200.0, label="Threshold", help="Confident GNMax: a query is answered when its top vote count "
        "plus N(0, sigma1^2) noise reaches this many votes.", kind=float, minimum=0.0, maximum=1e6,
        unit="votes", mechanisms=("pate",), group="pate",
    )
    sigma1: float = _spec(
        150.0, label="Sigma 1 (threshold check)", help="Confident GNMax: standard deviation of the noise "
        "of the threshold check (paid by every query).", kind=float, minimum=0.0, maximum=1e6,
        exclusive_minimum=True, unit="votes", mechanisms=("pate",), group="pate",
    )
    sigma2: float = _spec(
        40.0, label="Sigma 2 (answer)", help="Confident GNMax: standard deviation of the Gaussian noise on "
        "the counts of answered queries (paid by answered queries only).", kind=float, minimum=0.0,
        maximum=1e6, exclusive_minimum=True, unit="votes", mechanisms=("pate",), group="pate",
    )
    num_queries: int = _spec(
        1000, label="Student queries", help="How many examples of the public pool the student asks the "
        "teachers to label, in order.", kind=int, minimum=1, maximum=100_000_000, unit="queries",
        mechanisms=("pate",), group="pate",
    )
    public_pool_size: int | None = _spec(
        None, label="Public pool size", help="The first this many examples of the test split form the "
        "student's public unlabeled pool; the rest are held out for evaluation (as in the papers: MNIST "
        "9,000 / 1,000). Standard test files (MNIST, CIFAR-10, SVHN ...) keep their published order; any "
        "other test split is shuffled with the seed first, as it may be sorted by class. Unset: 90% of "
        "the test split.", kind=int, minimum=1, maximum=100_000_000,
        optional=True, unit="examples", mechanisms=("pate",), group="pate",
    )
    student_epochs: int = _spec(
        30, label="Student epochs", help="Passes of the student over the released labels (semi-supervised: "
        "over the released labels and the unlabeled pool, whichever takes more steps).", kind=int,
        minimum=1, maximum=10_000, mechanisms=("pate",), group="pate",
    )
    student_batch_size: int = _spec(
        64, label="Student batch size", help="Labeled examples per student step.", kind=int, minimum=1,
        maximum=100_000, unit="examples", mechanisms=("pate",), group="pate",
    )
    pate_budget_on: str = _spec(
        "data-independent", label="PATE budget checked on",
        help="Which epsilon the budget stops the teachers on. data-independent: where they stop depends "
        "only on released answers, so every reported epsilon covers it. data-dependent: answers far more "
        "queries, but where the teachers stop then depends on the private votes and no reported epsilon "
        "covers that.", kind=str, choices=PATE_BUDGET_ON, mechanisms=("pate",), group="pate",
    )
    semi_supervised: bool = _spec(
        False, label="Semi-supervised student", help="Also learn from the whole unlabeled pool (confident "
        "pseudo-labels that must stay consistent under augmentation). Costs no privacy: it only "
        "post-processes released labels and public data.", kind=bool, mechanisms=("pate",), group="pate",
    )
    release_parameters: str = _spec(
        "data-independent", label="Release parameters chosen",
        help="How the order, beta and sigma of the smooth-sensitivity release of PATE's data-dependent epsilon "
        "are chosen (GNMax and Confident GNMax). data-independent: from public settings only (teachers, "
        "queries, aggregator noise, delta; engine.privacy.pate_smooth.data_independent_parameters), so the "
        "released epsilon covers the choice. data-dependent: the paper's choice by looking at the votes, "
        "which no reported epsilon covers. release_order, release_beta and release_sigma override either.",
        kind=str, choices=RELEASE_PARAMETERS, mechanisms=("pate",), group="pate",
    )
    release_order: float | None = _spec(
        None, label="Release order", help="RDP order at which the data-dependent cost is released. Unset: "
        "chosen as release_parameters says.", kind=float, minimum=1.0, maximum=1000.0, exclusive_minimum=True,
        optional=True, mechanisms=("pate",), group="pate",
    )
    release_beta: float | None = _spec(
        None, label="Release beta", help="Smoothness beta of the smooth sensitivity; must be below "
        "1 / (2 release order). Unset: chosen as release_parameters says.", kind=float, minimum=0.0,
        maximum=0.5, exclusive_minimum=True, exclusive_maximum=True, optional=True, mechanisms=("pate",),
        group="pate",
    )
    release_sigma: float | None = _spec(
        None, label="Release sigma", help="sigma_ss: the release noise is N(0, sigma^2) times the smooth "
        "sensitivity. Unset: chosen as release_parameters says.", kind=float, minimum=0.0, maximum=1e6,
        exclusive_minimum=True, optional=True, mechanisms=("pate",), group="pate",
    )
    # ---- one-run canary audit (Steinke, Nasr & Jagielski 2023; engine.dpsgd.canaries) ------------
    audit_canaries: int = _spec(
        0, label="Audit canaries", help="Insert this many canaries, each included with probability 1/2 "
        "(secret randomness), and after training turn the guesses about which were included into an epsilon "
        "lower bound (95% confidence). The model is then marked as an audit model. 0: no audit.", kind=int,
        minimum=0, maximum=100_000, unit="canaries", group="audit",
    )
    audit_canary_kind: str = _spec(
        "input", label="Canary kind", help="input: mislabelled random inputs added to the training data (black "
        "box, every mechanism). gradient (DP-SGD only): a synthetic per-step gradient of norm clipping_norm in "
        "a fixed secret direction, sampled like an example (white box, much tighter).", kind=str,
        choices=AUDIT_CANARY_KINDS, group="audit",
    )
    membership_audit: bool = _spec(
        True, label="Membership audit after training", help="When the run finishes, attack its own model: "
        "the loss of training examples against held-out ones (AUC, TPR at low FPR, ROC), checked against "
        "what the guarantee allows. Computed from the private data, kept in the local store, shown in the "
        "Audit tab and `dpw audit`; a report includes it only with --include-audit. Costs a few seconds, "
        "no training.", kind=bool, group="audit",
    )

    seed: int = _spec(
        0, label="Seed", help="Seeds initialisation, splits, shards, augmentation and training order, so "
        "runs are comparable. It never seeds the privacy noise or the sampling of batches: those come "
        "from secret operating-system randomness.", kind=int,
        minimum=0, maximum=2**63 - 1, group="run",
    )
    noise_sampler: str = _spec(
        "standard", label="Noise sampler", help="How privacy noise is drawn. standard: fast floating-point "
        "Gaussian noise from a secret generator. hardened: a cryptographically secure generator and a "
        "sampler built against floating-point attacks on the low bits of noised values (slower).",
        kind=str, choices=NOISE_SAMPLERS, group="run",
    )
    reproducible_noise: bool = _spec(
        False, label="Reproducible noise (no guarantee)", help="Debugging only: draw the privacy noise and "
        "the sampling from the seed, so a run can be repeated exactly. Such a run carries NO differential "
        "privacy guarantee: anyone who knows the seed can rebuild the noise.", kind=bool, group="run",
    )
    device: str = _spec(
        "auto", label="Device", help="cpu, cuda, or auto (cuda when available).", kind=str,
        choices=DEVICES, group="run",
    )
    cuda_graphs: bool = _spec(
        False, label="CUDA graphs (GPU)", help="On a CUDA GPU, replay DP-SGD's per-example clipped sum "
        "from CUDA graphs (batches padded to a few sizes with rows that add nothing): several times faster for "
        "small models, whose steps are bound by launching kernels. Same sampling, noise and accounting. "
        "Ignored on the CPU and for models outside the layer-wise path.", kind=bool, group="run",
        mechanisms=("dpsgd",),
    )

    def __post_init__(self) -> None:
        errors = collect_errors(dataclasses.asdict(self))
        if errors:
            raise errors[0]

    # ---- conversion -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunConfig":
        """Build from plain values (e.g. parsed TOML); unknown keys are refused by name."""
        values = dict(values)
        version = values.pop("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise ConfigError(
                "schema_version", f"{version!r} is not supported; this version reads {SCHEMA_VERSION}"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        if "space" in values and "base" in values:
            raise ConfigError("config", "this file describes a tuning study (it has [base] and [space]), not a run",
                              hint="run it with `dpw study FILE`")
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = (f"did you mean '{close[0]}'?" if close else
                        "every setting is a top-level key (no [tables]); `dpw settings` lists them")
                raise ConfigError(key, "is not a known setting", hint=hint)
        return cls(**{k: _coerce(k, v) for k, v in values.items()})

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **dataclasses.asdict(self)}

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def to_toml(self) -> str:
        import tomli_w

        values = {k: v for k, v in self.to_dict().items() if v is not None}
        return tomli_w.dumps(values)

    def save_toml(self, path: str | Path) -> None:
        Path(path).write_text(self.to_toml(), encoding="utf-8")

    @classmethod
    def load_toml(cls, path: str | Path) -> "RunConfig":
        """A config file, its relative paths taken from the file's folder (`with_paths_from`)."""
        return cls.from_dict(read_toml(path, "config")).with_paths_from(Path(path).parent)

    def with_paths_from(self, folder: str | Path) -> "RunConfig":
        """Relative paths in a config file are the file's folder's: a relative data_dir, and a dataset
        or test_data path that exists there (a registered dataset's name stays a name; a path found
        only from the working folder is kept as given, as configs written before this rule meant it).
        Absolute paths are stored with the run, so the run's data is found again from any folder."""
        changes = paths_from_file(self.to_dict(), folder)
        return self.replace(**changes) if changes else self

    def config_hash(self) -> str:
        """Stable hash of everything that determines the run's result: not its name, not where its
        files or teachers are (data_dir, teachers_backend, ray_address), and settings left at their
        defaults are left out, so a setting added to a later version keeps older runs' hashes."""
        defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
        values = {key: value for key, value in self.to_dict().items()
                  if key not in _NOT_IN_HASH and (key not in defaults or value != defaults[key])}
        canonical = json.dumps(values, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    # ---- rules that need the dataset -----------------------------------------------------------
    def check_against_dataset(self, num_train: int, num_test: int | None = None) -> None:
        """Rules that depend on the training-set size N (known once the data is loaded), and for
        PATE on the test-split size (the public pool and the held-out examples come from it)."""
        if num_train < 1:
            raise ConfigError("test_fraction", f"leaves no training example ({self.test_fraction:g} of the data is "
                              "held out for testing)", hint="lower test_fraction, e.g. 0.2")
        if self.mechanism in ("dpsgd", "pate") and self.delta >= 1.0 / num_train:
            raise ConfigError(
                "delta",
                f"{self.delta:g} is not below 1/N = {1.0 / num_train:.3g} (N = {num_train} training examples)",
                hint="a delta of 1/N or more allows releasing one person's example outright; "
                "use a delta well below 1/N, e.g. " + f"{10 ** math.floor(math.log10(0.1 / num_train)):g}",
            )
        if self.mechanism == "pate":
            self._check_audit_against_dataset(num_train)
            self._check_pate_against_dataset(num_train, num_test)
            return
        self._check_audit_against_dataset(num_train)
        if self.expected_batch_size > num_train:
            raise ConfigError(
                "expected_batch_size",
                f"{self.expected_batch_size} is larger than the {num_train} training examples",
                hint=f"allowed: 1 to {num_train}",
            )

    def _check_audit_against_dataset(self, num_train: int) -> None:
        """Input canaries join the training data: at most a quarter of it, so that the audited model is
        still mostly the model of the real data."""
        if self.audit_canary_kind == "input" and self.audit_canaries > num_train // 4:
            raise ConfigError(
                "audit_canaries",
                f"{self.audit_canaries} input canaries are more than a quarter of the {num_train} training examples",
                hint=f"allowed: 0 to {num_train // 4} (a few hundred are enough for a lower bound)",
            )

    def _check_pate_against_dataset(self, num_train: int, num_test: int | None) -> None:
        if self.num_teachers > num_train:
            raise ConfigError(
                "num_teachers",
                f"{self.num_teachers} is more than the {num_train} training examples; each teacher needs a shard",
                hint=f"allowed: 2 to {num_train} (each teacher should see at least a few hundred examples)",
            )
        if num_test is None:
            return
        pool = self.pool_size_for(num_test)
        if not 1 <= pool < num_test:
            raise ConfigError(
                "public_pool_size",
                f"{pool} leaves no held-out examples: the test split has {num_test}",
                hint=f"allowed: 1 to {num_test - 1}; the rest of the test split evaluates the student",
            )
        if self.num_queries > pool:
            raise ConfigError(
                "num_queries",
                f"{self.num_queries} is more than the {pool} examples of the public pool",
                hint=f"allowed: 1 to {pool}, or enlarge public_pool_size",
            )

    def pool_size_for(self, num_test: int) -> int:
        """PATE: size of the public pool (the first examples of the test split, in the order of
        engine.pate.shards.public_rows)."""
        return self.public_pool_size if self.public_pool_size is not None else int(0.9 * num_test)

    def sample_rate_for(self, num_train: int) -> float:
        return self.expected_batch_size / num_train

    def steps_for(self, num_train: int) -> int:
        """Number of steps: epochs × N / expected batch size, rounded up."""
        return math.ceil(self.epochs * num_train / self.expected_batch_size)


def paths_from_file(values: dict[str, Any], folder: str | Path) -> dict[str, Any]:
    """The relative paths among a config file's `values` taken from the file's `folder`, as
    RunConfig.with_paths_from states the rule: {field: absolute path} for those that change."""
    from engine.datasets import DATASETS

    folder = Path(folder)
    changes: dict[str, Any] = {}
    data_dir, dataset = values.get("data_dir"), values.get("dataset")
    if isinstance(data_dir, str) and data_dir and not Path(data_dir).expanduser().is_absolute():
        changes["data_dir"] = str((folder / data_dir).resolve())
    for name, path in (("dataset", None if dataset in DATASETS else dataset), ("test_data", values.get("test_data"))):
        if (isinstance(path, str) and path and not Path(path).expanduser().is_absolute()
                and (folder / Path(path).expanduser()).exists()):
            changes[name] = str((folder / Path(path).expanduser()).resolve())
    return changes


def read_toml(path: str | Path, field: str) -> dict[str, Any]:
    """The values of a TOML file (a run config or a study); any failure is one ConfigError naming
    `field` and the file: unreadable, not UTF-8, or not valid TOML."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(field, f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at position "
                          f"{exc.start})", hint="save the file as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(field, f"{path} is not valid TOML: {_toml_problem(str(exc), text)}") from None


def _toml_problem(message: str, text: str) -> str:
    """tomllib's message, naming the key where it says only "Cannot overwrite a value" (a key set twice)."""
    found = re.search(r"Cannot overwrite a value \(at line (\d+), column \d+\)", message)
    lines = text.splitlines()
    if found and 0 < int(found.group(1)) <= len(lines):
        key = lines[int(found.group(1)) - 1].split("=", 1)[0].strip()
        return f"{key!r} is set twice (again at line {found.group(1)}); keep one"
    return message


def config_fields() -> list[tuple[str, Any, FieldSpec]]:
    """(name, default, spec) for every field, in form order."""
    return [(f.name, f.default, f.metadata["spec"]) for f in dataclasses.fields(RunConfig)]


def fields_used(mechanism: str, aggregator: str | None = None) -> list[str]:
    """The fields a run of `mechanism` uses, in form order (a FieldSpec with no mechanisms applies to
    all); for PATE with a known aggregator, only that aggregator's noise settings."""
    unused = ({f for agg, names in AGGREGATOR_FIELDS.items() if agg != aggregator for f in names}
              if aggregator in AGGREGATOR_FIELDS else set())
    return [name for name, _, spec in config_fields()
            if (not spec.mechanisms or mechanism in spec.mechanisms) and name not in unused]


def field_spec(name: str) -> FieldSpec:
    for fname, _, spec in config_fields():
        if fname == name:
            return spec
    raise KeyError(name)


def _coerce(name: str, value: Any) -> Any:
    """Accept ints for float fields (TOML writes 1 for 1.0) and whole floats for int fields (64.0 is 64);
    everything else is checked as is."""
    spec = field_spec(name)
    if spec.kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if spec.kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def as_toml(value: Any) -> str:
    """A value as a config file spells it (true, not True; a whole number in full, not 9.22e+18)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (datetime.date, datetime.time)):  # TOML dates and times, as the file writes them
        return value.isoformat()
    return repr(value)


def check_field(name: str, value: Any) -> ConfigError | None:
    """The error for one field's value on its own, or None when it is allowed."""
    spec = field_spec(name)
    if value is None:
        return None if spec.optional else ConfigError(name, "must be set", hint=f"allowed: {spec.allowed()}")
    ok_type = isinstance(value, spec.kind) and not (spec.kind is not bool and isinstance(value, bool))
    if spec.kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok_type = True
    if not ok_type:
        return ConfigError(name, f"{as_toml(value)} is not {spec.allowed()}")
    if spec.kind is float and not math.isfinite(value):
        return ConfigError(name, f"{as_toml(value)} is not a finite number", hint=f"allowed: {spec.allowed()}")
    if spec.choices is not None and value not in spec.choices:
        return ConfigError(name, f"{as_toml(value)} is not {spec.allowed()}")
    if spec.kind in (int, float):
        too_low = spec.minimum is not None and (
            value <= spec.minimum if spec.exclusive_minimum else value < spec.minimum
        )
        too_high = spec.maximum is not None and (
            value >= spec.maximum if spec.exclusive_maximum else value > spec.maximum
        )
        if too_low or too_high:
            return ConfigError(name, f"{as_toml(value)} is out of range; allowed: {spec.allowed()}")
    if spec.kind is str and not value.strip() and not spec.optional:
        return ConfigError(name, "must not be empty")
    if name == "name" and any(unicodedata.category(c) == "Cc" for c in value):
        return ConfigError(name, f"{value!r} holds a line break or another control character",
                           hint="a run's name is one line of text")
    return None


def collect_errors(values: dict[str, Any]) -> list[ConfigError]:
    """Every problem with a set of values, field rules first, then rules across fields."""
    errors = [e for name, v in values.items() if name in _FIELD_NAMES and (e := check_field(name, v))]
    if errors:
        return errors
    if values.get("mechanism") == "dpsgd":
        sigma, target = values.get("noise_multiplier"), values.get("target_epsilon")
        attack_tpr = values.get("target_attack_tpr")
        if sigma is None and target is None and attack_tpr is None:
            errors.append(
                ConfigError(
                    "noise_multiplier",
                    "DP-SGD needs a noise multiplier or a target epsilon",
                    hint="set noise_multiplier (e.g. 1.1) or target_epsilon (e.g. 3.0)",
                )
            )
        elif sigma is not None and target is not None:
            errors.append(
                ConfigError(
                    "target_epsilon",
                    "set either noise_multiplier or target_epsilon, not both",
                    hint="the noise multiplier is calibrated from the target epsilon",
                )
            )
        elif attack_tpr is not None and (sigma is not None or target is not None):
            errors.append(
                ConfigError(
                    "target_attack_tpr",
                    "set only one of noise_multiplier, target_epsilon and target_attack_tpr",
                    hint="the noise multiplier is calibrated from the target attack TPR",
                )
            )
        if attack_tpr is not None and values.get("normalization") == "dp":
            errors.append(
                ConfigError(
                    "target_attack_tpr",
                    "the attack bound covers the training steps only; normalization = 'dp' also spends privacy "
                    "on feature statistics",
                    hint="use normalization = 'bounds', or target_epsilon (which composes both)",
                )
            )
        attack_fpr = values.get("target_attack_fpr", 0.01)
        if attack_tpr is not None and attack_fpr is not None and attack_tpr <= attack_fpr:
            errors.append(
                ConfigError(
                    "target_attack_tpr",
                    f"{attack_tpr:g} is not above the attack FPR {attack_fpr:g}: guessing already reaches TPR = FPR",
                    hint="raise target_attack_tpr or lower target_attack_fpr",
                )
            )
        budget = values.get("epsilon_budget")
        if target is not None and budget is not None and target > budget:
            errors.append(
                ConfigError(
                    "target_epsilon",
                    f"{target:g} exceeds the epsilon budget {budget:g}",
                    hint="lower the target or raise the budget",
                )
            )
    if values.get("mechanism") == "pate":
        errors.extend(_pate_errors(values))
    errors.extend(_data_errors(values))
    errors.extend(_audit_errors(values))
    return errors


def _audit_errors(values: dict[str, Any]) -> list[ConfigError]:
    if values.get("audit_canaries") and values.get("audit_canary_kind") == "gradient" \
            and values.get("mechanism") != "dpsgd":
        return [ConfigError("audit_canary_kind", f"'gradient' canaries need DP-SGD's per-step gradients, not "
                            f"mechanism {values.get('mechanism')!r}", hint="use audit_canary_kind = 'input'")]
    return []


def _data_errors(values: dict[str, Any]) -> list[ConfigError]:
    from engine.feature_scaling import parse_feature_bounds

    from engine.datasets import is_registered_image
    from engine.declared_classes import parse_classes

    errors = []
    for parse, name in ((parse_feature_bounds, "feature_bounds"), (parse_classes, "classes")):
        try:
            parse(values.get(name))
        except ConfigError as exc:
            errors.append(exc)
    errors.extend(_test_data_errors(values.get("test_data"), values.get("dataset")))
    if values.get("normalization") in TABLE_STATISTICS and is_registered_image(str(values.get("dataset") or "")):
        errors.append(image_normalization_error(values["normalization"], values["dataset"]))
    elif values.get("normalization") == "dp" and values.get("mechanism") != "dpsgd":
        errors.append(
            ConfigError(
                "normalization",
                f"'dp' is accounted for DP-SGD runs only, not for mechanism {values.get('mechanism')!r}",
                hint="use 'bounds' (data-independent) with declared feature_bounds",
            )
        )
    return errors


TABLE_STATISTICS = ("dp", "exact")  # normalizations that compute statistics of the data: tables only


def image_normalization_error(normalization: str, dataset: str) -> ConfigError:
    """A normalization of TABLE_STATISTICS asked of image data (scaled by fixed constants): refused
    from the config for a registered image dataset, once loaded for a user's images."""
    return ConfigError("normalization", f"{normalization!r} computes statistics of tables; {dataset} is an image "
                       "dataset with fixed constants", hint="use 'bounds' (the default) for image datasets")


def _test_data_errors(test_data: str | None, dataset: Any) -> list[ConfigError]:
    """The test examples given apart: a CSV file beside a CSV dataset, a folder of class sub-folders
    beside an image folder. An .npz holds its own x_test and y_test, a registered dataset has its
    test split (published, or drawn per example)."""
    from engine.datasets import takes_test_data

    if test_data is None:
        return []
    dataset = str(dataset or "").strip()
    given_csv = test_data.strip().lower().endswith(".csv")
    if not takes_test_data(dataset):
        return [ConfigError("test_data", f"only a CSV dataset or an image folder reads test examples given apart, "
                            f"not {dataset!r}",
                            hint="an .npz holds its own x_test and y_test, a folder of arrays x_test.npy and "
                            "y_test.npy, and a registered dataset has its own test split; leave test_data unset")]
    if dataset.lower().endswith(".csv") and not given_csv:
        return [ConfigError("test_data", f"{test_data!r} is not a .csv file",
                            hint="give a CSV file of held-out examples with the dataset's columns")]
    if not dataset.lower().endswith(".csv") and given_csv:
        return [ConfigError("test_data", f"{test_data!r} is a CSV file, but the dataset {dataset!r} is a folder",
                            hint="give the folder of test images, one sub-folder per class as in the dataset")]
    return []


def _pate_errors(values: dict[str, Any]) -> list[ConfigError]:
    errors = []
    teachers = values.get("num_teachers")
    threshold = values.get("threshold")
    if values.get("aggregator") == "confident" and teachers is not None and threshold is not None and threshold > teachers:
        errors.append(
            ConfigError(
                "threshold",
                f"{threshold:g} is above num_teachers = {teachers}: no vote count can reach it without noise",
                hint=f"allowed: 0 to {teachers}; the papers use about 0.8 x num_teachers (200 of 250)",
            )
        )
    order, beta = values.get("release_order"), values.get("release_beta")
    if order is not None and beta is not None and not beta < 1.0 / (2.0 * order):
        errors.append(
            ConfigError(
                "release_beta",
                f"{beta:g} is not below 1 / (2 release_order) = {1.0 / (2.0 * order):.4g}",
                hint="lower release_beta (the authors use 0.3 to 0.49 divided by the order) or the order",
            )
        )
    pool, queries = values.get("public_pool_size"), values.get("num_queries")
    if pool is not None and queries is not None and queries > pool:
        errors.append(
            ConfigError(
                "num_queries",
                f"{queries} is more than the public_pool_size {pool}",
                hint=f"allowed: 1 to {pool}; the student can only ask about examples of its pool",
            )
        )
    return errors


_NOT_IN_HASH = frozenset({"name", "data_dir", "teachers_backend", "ray_address", "membership_audit"})
"""Settings that name the run, say where things are or what is checked after training, not what it
computes (RunConfig.config_hash)."""

_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(RunConfig))
