"""From a RunConfig to a trained model: load the data, build the model, plan privacy, train, save.

The runner calls `prepare(config)` then `.train()` and `.finish()`; tests can do the same
in-process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection

import torch
from torch import nn

from engine.config import TABLE_STATISTICS, RunConfig, image_normalization_error
from engine.data_split import SPLIT_BY_EXAMPLE, permuted_subset_rows, subset_rows
from engine.datasets import Dataset, load_dataset
from engine.dpsgd import trainer
from engine.errors import BudgetError, ConfigError, ModelSaveError
from engine.models import build_model, check_dp_compatible, default_model_for
from engine.randomness import PrivateRandomness, randomness_summary

Emit = Callable[..., Any]


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


@dataclass
class PreparedRun:
    config: RunConfig
    data: Dataset
    model_name: str
    model: torch.nn.Module
    plan: trainer.PrivacyPlan
    device: torch.device
    emit: Emit
    data_parallel: Any = None  # engine.dpsgd.distributed.DataParallel in a `--nproc` run
    parameters_identical: bool | None = None  # a distributed run: every rank ended with the same weights
    checkpoint_path: Path | None = None  # where the run (rank 0 of several) keeps its checkpoint (engine.checkpoint)
    resume: dict[str, Any] | None = None  # the checkpoint a continued run starts from

    def train(self, should_stop: Callable[[], bool] = lambda: False) -> trainer.TrainResult:
        parallel = self.data_parallel
        if parallel is None:
            return trainer.train(
                self.model, self.data, self.config, self.plan, device=self.device, emit=self.emit,
                should_stop=should_stop, checkpoint_path=self.checkpoint_path, resume=self.resume,
            )
        parallel.broadcast_parameters(self.model)
        result = trainer.train(
            self.model, parallel.shard(self.data), self.config, self.plan, device=self.device, emit=self.emit,
            should_stop=lambda: parallel.agree_to_stop(should_stop()), data_parallel=parallel,
            checkpoint_path=self.checkpoint_path,  # rank 0's (the others have none): the same weights on every rank
            resume=self.resume,  # rank 0's checkpoint, shared: every rank starts from its weights, optimizer and step
        )
        self.parameters_identical = len(set(parallel.parameters_digest(self.model))) == 1
        if not self.parameters_identical:
            self.emit("warning", message="the ranks ended with different weights; rank 0's model is saved")
        return result

    def run_fields(self, result: trainer.TrainResult | None) -> dict[str, Any]:
        """Columns of the runs table that this run fills."""
        fields: dict[str, Any] = {
            "model": self.model_name,
            "device": str(self.device),
            "num_train": self.data.num_train,
            "num_test": int(self.data.x_test.shape[0]),
            "sample_rate": self.plan.sample_rate,
            "noise_multiplier": self.plan.noise_multiplier,
            "clipping_norm": self.config.clipping_norm if self.plan.private else None,
            "steps_planned": self.plan.steps_planned,
            "delta": self.config.delta if self.plan.private else None,
            "accountant": self.plan.accountant if self.plan.private else None,
        }
        if result is not None:
            fields.update(
                steps_done=result.steps_done,
                epochs_done=result.epochs_done,
                accuracy=result.test_accuracy,
                stop_reason=result.stop_reason,
            )
            if result.epsilon is not None:
                fields.update(epsilon=result.epsilon.value, delta=result.epsilon.delta,
                              accountant=result.epsilon.accountant)
        return fields

    def finish(self, result: trainer.TrainResult | None, *, store: Any, out_dir: Path, emit: Emit) -> dict[str, Any]:
        """Save the trained model as an artifact; return the run's summary."""
        summary: dict[str, Any] = {"stop_reason": "stopped" if result is None else result.stop_reason}
        if result is None:
            return summary
        summary.update(
            steps=result.steps_done,
            epochs=round(result.epochs_done, 4),
            test_accuracy=result.test_accuracy,
            test_loss=result.test_loss,
            seconds=round(result.seconds, 3),
            samples_per_second=round(result.samples_processed / max(result.seconds, 1e-9), 1),
        )
        if result.epsilon is not None:
            summary.update(epsilon=result.epsilon.value, delta=result.epsilon.delta, accountant=result.epsilon.accountant)
        if self.plan.noise_multiplier is not None:
            summary["noise_multiplier"] = self.plan.noise_multiplier
        if self.plan.private:
            summary["randomness"] = randomness_summary(self.config)
        if self.data_parallel is not None:
            summary["distributed"] = dict(self.data_parallel.summary(), parameters_identical=self.parameters_identical)
        if "canaries" in result.extra:  # the one-run canary audit (engine.dpsgd.canaries): counts only
            summary.update(canaries=result.extra["canaries"], audit_model=True)
        summary["per_class_accuracy"] = per_class_accuracy(
            trainer.predict(self.model, self.data.x_test.to(self.device)).cpu(), self.data.y_test, self.data.class_names
        )
        save_model_artifact(self.model, model_name=self.model_name, data=self.data, config=self.config,
                            out_dir=out_dir, emit=emit, summary=summary)
        return summary


def save_model_artifact(model: nn.Module, *, model_name: str, data: Dataset, config: RunConfig, out_dir: Path,
                        emit: Emit, summary: dict[str, Any] | None = None) -> Path:
    """Save the released model with what it needs to be rebuilt and used (architecture, input shape,
    normalization, class names, config) as `model.pt`, and announce it as an `artifact` event.
    Raises ModelSaveError naming the path when it cannot be written (a file in the way, full disk); it
    carries the run's `summary`, so the results stay with the run."""
    path = out_dir / "model.pt"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
                "model": model_name,
                "input_shape": list(data.input_shape),
                "num_classes": data.num_classes,
                "normalization": data.normalization,
                "class_names": list(data.class_names),
                "config": config.to_dict(),
            },
            path,
        )
    except (OSError, RuntimeError) as exc:  # torch's zip writer reports write failures as RuntimeError
        with contextlib.suppress(OSError):
            path.unlink()
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        error = ModelSaveError(f"the trained model could not be saved to {path}: {reason}",
                             hint="the run's results and the privacy it spent are kept; make that folder "
                             "writable (or move what is in the way) and train again to get the model")
        error.summary = summary
        raise error from None
    from engine.runner import sha256_of

    emit("artifact", kind="model", path=str(path), sha256=sha256_of(path))
    return path


def software_versions() -> dict[str, str]:
    """Versions of what trained the model, recorded with the run for its report."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": platform.python_version()}
    for package in ("dp-workbench", "torch", "numpy", "scipy"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def per_class_accuracy(predicted: torch.Tensor, target: torch.Tensor, class_names) -> dict[str, float | None]:
    """Test accuracy of each class (None for a class absent from the test split)."""
    result: dict[str, float | None] = {}
    for index, name in enumerate(class_names):
        mask = target == index
        count = int(mask.sum())
        result[str(name)] = float((predicted[mask] == index).float().mean()) if count else None
    return result


def train_subset(data: Dataset, size: int, *, seed: int, split_rule: str = SPLIT_BY_EXAMPLE) -> Dataset:
    """A seeded subset of `size` training examples (engine.data_split.subset_rows; the test split is
    kept whole); inputs read on demand (engine.array_data) stay so."""
    keep = subset_rows(data.train_identities(), size, seed=seed) if split_rule == SPLIT_BY_EXAMPLE \
        else permuted_subset_rows(data.num_train, size, seed=seed)
    keep = torch.from_numpy(keep)
    return dataclasses.replace(data.take_train(keep), split=(data.split + "; " if data.split else "")
                               + f"training subset of {size} (seed {seed})")


def load_run_data(config: RunConfig, *, emit: Emit = _noop, checked_before: Collection[str] = (),
                  split_rule: str = SPLIT_BY_EXAMPLE) -> Dataset:
    """The data a run trains on: the dataset as the config reads it (split, scaling, DP feature
    statistics), then its training subset. Every problem with the data is a one-line DPWError here.
    `checked_before`: fingerprints of data that passed the load's check before (engine.datasets.load_dataset).
    `split_rule`: engine.data_split's rule for the split and the subset (a continued run keeps its first run's)."""
    dp_statistics = config.normalization == "dp" and config.mechanism == "dpsgd"
    data = load_dataset(
        config.dataset,
        data_dir=config.data_dir,
        label_column=config.label_column,
        test_fraction=config.test_fraction,
        seed=config.seed,
        allow_download=config.allow_download,
        normalization=config.normalization,
        feature_bounds=config.feature_bounds,
        classes=config.classes,
        test_data=config.test_data,
        statistics_noise_multiplier=config.normalization_noise_multiplier if dp_statistics else None,
        rng=PrivateRandomness.for_run(config).numpy_generator("normalization_noise") if dp_statistics else None,
        progress=lambda done, total: emit("progress", phase="loading", done=done, total=total),
        checked_before=checked_before,
        split_rule=split_rule,
    )
    if config.normalization in TABLE_STATISTICS and data.kind != "table":
        raise image_normalization_error(config.normalization, data.name)
    if config.normalization == "exact" and config.mechanism != "none":
        emit("warning", message="normalization 'exact' scales the features by the training data's own mean and std, "
             "which the model ships with: this run states no differential privacy guarantee",
             hint="use 'bounds' (declared ranges) or 'dp' (statistics counted in epsilon) for a guarantee")
    if config.train_subset is not None and config.train_subset < data.num_train:
        data = train_subset(data, config.train_subset, seed=config.seed, split_rule=split_rule)
    return data


def prepare(config: RunConfig, *, emit: Emit = _noop, data_parallel: Any = None,
            checked_before: Collection[str] = (), split_rule: str = SPLIT_BY_EXAMPLE) -> PreparedRun:
    """Load the data, build the model and fix the privacy plan; emits a `plan` event.

    PATE runs (mechanism "pate") get an `engine.pate.run.PreparedPATERun`, with the same
    train() / run_fields() / finish() interface. With `data_parallel` (a `--nproc` run) every rank
    prepares the same run: the same data (checked), weights and rank 0's privacy plan.
    `checked_before`: fingerprints of data that passed the load's check before (Store.checked_fingerprints).
    `split_rule`: as load_run_data; the plan records it, for the run's audit and its continuation.
    """
    if data_parallel is not None:
        from engine.distributed_launch import check_distributable

        check_distributable(config)
    data = load_run_data(config, emit=emit, checked_before=checked_before, split_rule=split_rule)
    if config.audit_canaries and config.audit_canary_kind == "input":
        from engine.dpsgd.canaries import check_input_canaries_fit

        check_input_canaries_fit(data.x_train)  # said before the run is stored, not when training starts
    if config.mechanism == "pate":
        from engine.pate.run import prepare_pate

        return prepare_pate(config, data, emit=emit, split_rule=split_rule)
    config.check_against_dataset(data.num_train)
    model_name = default_model_for(data) if config.model == "auto" else config.model
    torch.manual_seed(config.seed)
    model = build_model(model_name, input_shape=data.input_shape, num_classes=data.num_classes)
    if config.mechanism == "dpsgd":
        check_dp_compatible(model)
    device = trainer.resolve_device(config.device)
    try:
        plan = trainer.plan_privacy(config, data.num_train, emit)
    except ValueError as exc:
        if config.target_epsilon is None and config.target_attack_tpr is None:
            raise
        # The settings ask for a privacy level no noise in the supported range gives: the user's choice.
        target = "target_epsilon or delta" if config.target_attack_tpr is None else "target_attack_tpr"
        raise BudgetError(str(exc), hint=f"raise {target}, or lower epochs or expected_batch_size") from None
    if data_parallel is not None:
        data_parallel.check_same_data(data.fingerprint)
        plan = data_parallel.share(plan)  # one plan for all ranks: rank 0's
    if plan.private and plan.steps_allowed == 0:  # it would "finish" with the untrained model
        raise ConfigError("epsilon_budget", f"{config.epsilon_budget:g} allows no training step: one step at noise "
                          f"multiplier {plan.noise_multiplier:.4g} and sample rate {plan.sample_rate:.3g} already "
                          f"spends more ({plan.accountant})",
                          hint="raise epsilon_budget or noise_multiplier, or lower expected_batch_size")
    emit(
        "plan",
        model=model_name,
        device=str(device),
        num_train=data.num_train,
        num_test=int(data.x_test.shape[0]),
        input_shape=list(data.input_shape),
        num_classes=data.num_classes,
        dataset_fingerprint=data.fingerprint,
        data_split=data.split,
        split_rule=split_rule,
        normalization=json.loads(json.dumps(data.normalization)),
        sample_rate=plan.sample_rate,
        steps=plan.steps_planned,
        steps_allowed=plan.steps_allowed,
        noise_multiplier=plan.noise_multiplier,
        noise_calibrated=plan.calibrated,
        delta=plan.delta if plan.private else None,
        accountant=plan.accountant if plan.private else None,
        epsilon_budget=config.epsilon_budget,
        randomness=randomness_summary(config) if plan.private else None,
        software=software_versions(),
        threads=torch.get_num_threads(),
    )
    if plan.bounds_nothing():
        emit("warning", message=f"noise multiplier {plan.noise_multiplier:g} bounds nothing: no finite ε holds "
             f"at δ = {plan.delta:g} after {plan.steps_allowed:,} steps, so this run carries no guarantee",
             hint="raise noise_multiplier, or set target_epsilon instead")
    if plan.steps_allowed < plan.steps_planned:
        emit(
            "warning",
            message=f"the epsilon budget {config.epsilon_budget:g} allows {plan.steps_allowed} of the "
            f"{plan.steps_planned} planned steps; training will stop there",
        )
    return PreparedRun(config, data, model_name, model, plan, device, emit, data_parallel)


def store_votes(prepared: Any, store: Any, run_id: int) -> None:
    """Connect a prepared run to the store: a PATE run writes its vote rows to run `run_id` batch by
    batch as they are released (a window shows them live; a killed run keeps them). No-op for DP-SGD."""
    if hasattr(prepared, "vote_sink"):
        prepared.vote_sink = lambda rows: store.insert_many("votes", [dict(r, run_id=run_id) for r in rows])
