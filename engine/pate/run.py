"""A whole PATE run for the runner: teachers -> votes -> noisy answers -> student.

`prepare_pate(config, data)` fixes the split and the models; `.train()` trains the teachers on
disjoint shards of the private training set, lets them vote on the student's queries (the first
`num_queries` examples of the public pool), releases answers with the configured aggregator until
the epsilon budget would be exceeded, accounts privacy after every query, releases the
data-dependent epsilon with smooth-sensitivity noise, and trains the student on what was released;
`.finish()` writes the vote rows and saves the student (never a teacher).

Epsilons of a run:
- data-dependent ("pate-dd"): the papers' bound from the votes. It depends on the private votes:
  not itself safe to publish; an internal diagnostic (and the budget's, if asked for).
- data-independent ("pate-di"): from the noise settings and the number of (answered) queries.
- released ("pate-released"): the data-dependent cost plus Gaussian noise scaled to its smooth
  sensitivity, plus the cost of that release (Papernot et al. 2018, App. C), with its order, beta
  and sigma fixed from public settings by default (`release_parameters`). For LNMax it is the
  data-independent value. Safe to show, as an estimate of the data-dependent cost: its noise is
  centred on that cost, so it bounds nothing.
The run's `epsilon` column holds the guarantee, the data-independent bound (engine.publication
decides this for every view).

Store note: the `votes` table holds the teachers' raw vote counts, which are NOT private outputs
(only what the aggregator released is); keep the store file inside the trust boundary.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from engine.array_data import take_rows
from engine.config import RunConfig
from engine.data_split import SPLIT_BY_EXAMPLE
from engine.datasets import Dataset
from engine.dpsgd.trainer import resolve_device
from engine.errors import ConfigError, DataError
from engine.models import build_model, default_model_for
from engine.pate import aggregation
from engine.pate.ray_backend import RaySession, RayTeachers, import_ray, train_teachers_on_ray
from engine.pate.shards import expected_empty_shards, partition, public_order_for, public_rows
from engine.pate.student import StudentResult, train_student
from engine.pate.teachers import Teachers, build_teachers, train_teachers, vote_counts
from engine.privacy import pate as analysis
from engine.privacy import pate_smooth
from engine.privacy.types import Epsilon
from engine.publication import pate_publishable
from engine.randomness import PrivateRandomness, randomness_summary

Emit = Callable[..., Any]

QUERY_BATCH = 100  # queries per vote_batch / privacy event
QUERY_CHUNK = 1000  # queries the teachers vote on at a time
MAX_TEACHER_METRICS = 1000  # per-teacher accuracy metrics beyond this are summarised only


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def make_optimizer(config: RunConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """The configured optimizer; fused kernels where torch has them (one pass over the stacked
    teacher parameters instead of several — Adam on 250 stacked teachers is memory-bound)."""
    kwargs: dict[str, Any] = {"lr": config.learning_rate}
    if config.optimizer == "momentum":
        kwargs["momentum"] = config.momentum
    cls = torch.optim.Adam if config.optimizer == "adam" else torch.optim.SGD
    try:
        return cls(params, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        return cls(params, **kwargs)


def _seed(config: RunConfig, purpose: int) -> int:
    return int(np.random.SeedSequence([config.seed, purpose]).generate_state(1)[0])


@dataclass
class PATEResult:
    """What a PATE run did. `epsilon` is the data-dependent guarantee of the released labels."""

    stop_reason: str  # "completed", "budget", "stopped"
    seconds: float
    teacher_seconds: float = 0.0
    teacher_accuracy: np.ndarray | None = None
    ensemble_accuracy: float | None = None
    queries_processed: int = 0
    answered: int = 0
    label_accuracy: float | None = None
    analysis: analysis.PateEpsilon | None = None
    released: pate_smooth.ReleasedEpsilon | None = None
    epsilon_released: float | None = None
    student: StudentResult | None = None
    canaries: dict[str, Any] | None = None  # the one-run canary audit's counts (engine.dpsgd.canaries)
    vote_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    vote_rows_stored: int = 0  # how many of vote_rows the vote sink has already written

    @property
    def epsilon(self) -> Epsilon | None:
        return self.analysis.as_epsilon() if self.analysis is not None else None

    @property
    def test_accuracy(self) -> float | None:
        return self.student.test_accuracy if self.student is not None else None


@dataclass
class PreparedPATERun:
    config: RunConfig
    data: Dataset
    model_name: str  # the student's
    model: nn.Module  # the student
    teacher_model_name: str
    device: torch.device
    emit: Emit
    x_pool: torch.Tensor  # or engine.array_data.MappedRows: inputs read on demand stay so
    y_pool: torch.Tensor
    x_holdout: torch.Tensor  # as x_pool
    y_holdout: torch.Tensor
    # Called with each batch of vote rows as soon as it is released (the runner writes them to the
    # store, so a window can show recent votes live and a killed run keeps what it released).
    vote_sink: Callable[[list[dict[str, Any]]], None] | None = None
    # The run's private randomness (aggregation and release noise; never from `seed` unless
    # reproducible_noise); made from the config when not given.
    randomness: PrivateRandomness | None = None

    def __post_init__(self) -> None:
        if self.randomness is None:
            self.randomness = PrivateRandomness.for_run(self.config)

    @property
    def num_queries(self) -> int:
        return self.config.num_queries

    # ---- training ------------------------------------------------------------------------------
    def train(self, should_stop: Callable[[], bool] = lambda: False) -> PATEResult:
        t0 = time.monotonic()
        result = PATEResult(stop_reason="completed", seconds=0.0)
        if self.config.audit_canaries:  # mislabelled inputs in the teachers' shards, scored on the student
            from engine.dpsgd.canaries import InputCanaries

            self._canaries = InputCanaries.draw(self.randomness, self.config.audit_canaries,
                                                x_train=self.data.x_train, num_classes=self.data.num_classes)
        teachers = self._train_teachers(should_stop)
        try:
            result = self._use_teachers(teachers, result, t0, should_stop)
        finally:
            teachers.close()
        if getattr(self, "_canaries", None) is not None and result.student is not None:
            result.canaries = self._canaries.audit(self.model, delta=self.config.delta,
                                                   device=self.device).to_json()
        self._canaries = None
        return result

    def _use_teachers(self, teachers: Teachers | RayTeachers, result: PATEResult, t0: float,
                      should_stop: Callable[[], bool]) -> PATEResult:
        """Votes, answers and the student, from trained teachers (closed by the caller)."""
        config, emit = self.config, self.emit
        result.teacher_seconds = teachers.seconds
        if teachers.epochs_done < config.teacher_epochs or teachers.num_teachers < config.num_teachers:
            result.stop_reason = "stopped"
            result.seconds = time.monotonic() - t0
            return result

        try:
            emit("progress", phase="evaluating", done=0, total=1)
            holdout_pred = self._predictions(teachers, self.x_holdout, should_stop)
            result.teacher_accuracy, result.ensemble_accuracy = self._report_teachers(holdout_pred)
            released = self._answer_queries(teachers, result, should_stop)
        except InterruptedError:
            result.stop_reason = "stopped"
            result.seconds = time.monotonic() - t0
            return result
        del teachers  # the teachers go no further than their votes
        if result.stop_reason == "stopped":
            result.seconds = time.monotonic() - t0
            return result

        answered_idx = np.flatnonzero(released.answered[: result.queries_processed])
        x_lab = take_rows(self.x_pool, torch.as_tensor(answered_idx, dtype=torch.long))
        y_lab = torch.as_tensor(released.labels[answered_idx], dtype=torch.long)
        torch.manual_seed(_seed(config, 4))
        result.student = train_student(
            self.model,
            x_lab,
            y_lab,
            x_pool=self.x_pool,
            x_eval=self.x_holdout,
            y_eval=self.y_holdout,
            epochs=config.student_epochs,
            batch_size=config.student_batch_size,
            make_optimizer=lambda params: make_optimizer(config, params),
            seed=_seed(config, 5),
            semi_supervised=config.semi_supervised,
            evaluations_per_epoch=config.evaluations_per_epoch,
            device=self.device,
            emit=emit,
            should_stop=should_stop,
        )
        if result.student.stop_reason == "stopped":
            result.stop_reason = "stopped"
        elif result.student.stop_reason == "no_labels":
            emit("warning", message="no query was answered: the student was not trained "
                 "(lower the threshold, raise the budget or ask more queries)")
        result.seconds = time.monotonic() - t0
        return result

    def _predictions(self, teachers: Teachers | RayTeachers, x: Any,
                     should_stop: Callable[[], bool]) -> torch.Tensor:
        """Each teacher's predicted class for each row of `x`: (teachers, examples). Inputs read on demand
        (engine.array_data) are read QUERY_CHUNK rows at a time: the split need not fit in memory, and
        Ray's teachers take arrays."""
        if isinstance(x, torch.Tensor):
            return teachers.predict(x.to(self.device), should_stop=should_stop).cpu()
        return torch.cat([teachers.predict(x[s : s + QUERY_CHUNK].to(self.device), should_stop=should_stop).cpu()
                          for s in range(0, len(x), QUERY_CHUNK)], dim=1)

    def _train_teachers(self, should_stop: Callable[[], bool]) -> Teachers | RayTeachers:
        config, emit, data = self.config, self.emit, self.data
        # Each example's teacher is a keyed hash of the example itself (engine.pate.shards.teacher_of):
        # one example added or removed changes one shard only.
        shards = partition(data.x_train, config.num_teachers, seed=_seed(config, 1), labels=data.y_train)
        x_train, y_train = data.x_train, data.y_train
        if getattr(self, "_canaries", None) is not None:
            x_train, y_train, shards = self._canaries.join_shards(x_train, y_train, shards)
        models = build_teachers(self.teacher_model_name, input_shape=data.input_shape,
                                num_classes=data.num_classes, num_teachers=config.num_teachers,
                                seed=_seed(config, 2))
        emit("progress", phase="teachers", done=0, total=config.teacher_epochs)
        last = [0.0]

        def on_epoch(done: int, total: int, loss: float) -> None:
            emit("metric", step=done, epoch=float(done), name="teacher_train_loss", value=loss)
            if not math.isfinite(loss):  # NaN teachers would spend privacy on meaningless votes
                raise DataError(f"the teachers' training diverged: their mean training loss became {loss} in "
                                f"epoch {done}; no query was answered",
                                hint="lower the learning_rate (and check the data for extreme values)")
            now = time.monotonic()
            if now - last[0] > 0.5 or done == total:
                emit("progress", phase="teachers", done=done, total=total)
                last[0] = now

        common = dict(epochs=config.teacher_epochs, batch_size=config.teacher_batch_size,
                      make_optimizer=functools.partial(make_optimizer, config), seed=_seed(config, 3),
                      on_epoch=on_epoch, should_stop=should_stop, model_name=self.teacher_model_name)
        if config.teachers_backend == "ray":
            session = RaySession(config.ray_address)
            try:
                return train_teachers_on_ray(models, x_train, y_train, shards, session=session, **common)
            except BaseException:
                session.close()
                raise
        return train_teachers(models, x_train, y_train, shards, device=self.device, **common)

    def _report_teachers(self, holdout_pred: torch.Tensor) -> tuple[np.ndarray, float]:
        emit = self.emit
        accuracy = (holdout_pred == self.y_holdout[None, :]).float().mean(dim=1).numpy()
        for k, acc in enumerate(accuracy[:MAX_TEACHER_METRICS]):
            emit("metric", step=k, epoch=0.0, name="teacher_accuracy", value=float(acc))
        for name, value in (("teacher_accuracy_mean", accuracy.mean()), ("teacher_accuracy_min", accuracy.min()),
                            ("teacher_accuracy_max", accuracy.max())):
            emit("metric", step=0, epoch=0.0, name=name, value=float(value))
        plurality = vote_counts(holdout_pred, self.data.num_classes).argmax(axis=1)
        ensemble = float((plurality == self.y_holdout.numpy()).mean())
        emit("metric", step=0, epoch=0.0, name="ensemble_accuracy", value=ensemble)
        return accuracy, ensemble

    # ---- queries -------------------------------------------------------------------------------
    def _answer_queries(self, teachers: Teachers, result: PATEResult,
                        should_stop: Callable[[], bool]) -> aggregation.Released:
        """Ask the student's queries in order, a chunk at a time: the teachers vote, the aggregator
        releases, privacy is accounted per query; stop before the query that could exceed the budget."""
        config, emit = self.config, self.emit
        params = _aggregator_params(config)
        rng = self.randomness.numpy_generator("pate_aggregation")
        orders = analysis.PATE_ORDERS
        cum_dd = np.zeros(orders.size)
        cum_di = np.zeros(orders.size)
        total = self.num_queries
        all_votes, labels, answered = [], [], []
        previous = 0.0
        emit("progress", phase="querying", done=0, total=total)
        for start in range(0, total, QUERY_CHUNK):
            end = min(start + QUERY_CHUNK, total)
            try:
                pred = teachers.predict(self.x_pool[start:end].to(self.device), should_stop=should_stop)
            except InterruptedError:  # stopped while voting: account for the queries answered so far
                result.stop_reason = "stopped"
                break
            votes = vote_counts(pred.cpu(), self.data.num_classes)
            released = aggregation.aggregate(votes, aggregator=config.aggregator, rng=rng, **params.noise)
            real = analysis.query_costs(votes=votes, answered=released.answered, orders=orders, **params.analysis)
            allowed = len(votes)
            if config.epsilon_budget is not None:
                # Ask the next query only if even its worst outcome (answered) stays within the budget.
                worst = analysis.query_costs(votes=votes, answered=np.ones(len(votes), bool), orders=orders,
                                             **params.analysis)
                on_dd = config.pate_budget_on == "data-dependent"
                cum = cum_dd if on_dd else cum_di
                allowed = analysis.queries_within_budget(
                    rdp_per_query=np.vstack([cum, real.data_dependent if on_dd else real.data_independent]),
                    rdp_worst_case=np.vstack([cum, worst.data_dependent if on_dd else worst.data_independent]),
                    orders=orders, delta=config.delta, budget=config.epsilon_budget) - 1
            eps_dd = analysis.epsilon_after_each(rdp_per_query=np.vstack([cum_dd, real.data_dependent[:allowed]]),
                                                 orders=orders, delta=config.delta)[1:]
            eps_di = analysis.epsilon_after_each(rdp_per_query=np.vstack([cum_di, real.data_independent[:allowed]]),
                                                 orders=orders, delta=config.delta)[1:]
            cum_dd += real.data_dependent[:allowed].sum(axis=0)
            cum_di += real.data_independent[:allowed].sum(axis=0)
            true_labels = self.y_pool[start:end].numpy()
            for b0 in range(0, allowed, QUERY_BATCH):
                if should_stop():
                    result.stop_reason = "stopped"
                    break
                b1 = min(b0 + QUERY_BATCH, allowed)
                for i in range(b0, b1):
                    ok = bool(released.answered[i])
                    result.vote_rows.append({
                        "query_index": start + i,
                        "histogram": json.dumps([int(c) for c in votes[i]]),
                        "answered": int(ok),
                        "label": int(released.labels[i]) if ok else None,
                        "true_label": int(true_labels[i]),
                        # (once the bound is inf, as for noise too small to bound anything, so is each cost)
                        "epsilon_cost": float(eps_dd[i] - previous) if math.isfinite(previous) else math.inf,
                        "epsilon_after": float(eps_dd[i]),
                    })
                    previous = float(eps_dd[i])
                if self.vote_sink is not None:
                    self.vote_sink(result.vote_rows[result.vote_rows_stored:])
                    result.vote_rows_stored = len(result.vote_rows)
                n_ok = int(released.answered[b0:b1].sum())
                emit("vote_batch", first_query=start + b0, count=b1 - b0, answered=n_ok, rejected=b1 - b0 - n_ok)
                emit("privacy", step=start + b1, epsilon=float(eps_dd[b1 - 1]), delta=config.delta,
                     accountant=analysis.ACCOUNTANT_DATA_DEPENDENT)
                emit("privacy", step=start + b1, epsilon=float(eps_di[b1 - 1]), delta=config.delta,
                     accountant=analysis.ACCOUNTANT_DATA_INDEPENDENT)
                emit("progress", phase="querying", done=start + b1, total=total)
                result.queries_processed = start + b1
                all_votes.append(votes[b0:b1])
                labels.append(released.labels[b0:b1])
                answered.append(released.answered[b0:b1])
            if result.stop_reason == "stopped":
                break
            if allowed < len(votes):
                result.stop_reason = "budget"
                emit("warning", message=f"stopped before query {start + allowed + 1} of {total}: it could exceed "
                     f"the epsilon budget {config.epsilon_budget:g} ({config.pate_budget_on}, delta {config.delta:g})")
                break
        n = result.queries_processed
        classes = self.data.num_classes
        out = aggregation.Released(
            np.concatenate(labels) if labels else np.zeros(0, np.int64),
            np.concatenate(answered) if answered else np.zeros(0, bool),
        )
        result.answered = out.num_answered
        if n:
            votes_all = np.concatenate(all_votes) if all_votes else np.zeros((0, classes), np.int64)
            self._finish_analysis(votes_all, out, result, params)
        return out

    def _finish_analysis(self, votes: np.ndarray, released: aggregation.Released, result: PATEResult,
                         params: "_AggregatorParams") -> None:
        config, emit = self.config, self.emit
        n = votes.shape[0]
        answered = released.answered[:n]
        result.analysis = analysis.pate_epsilon(votes=votes, answered=answered, delta=config.delta, **params.analysis)
        correct = released.labels[:n][answered] == self.y_pool[:n].numpy()[answered]
        result.label_accuracy = float(correct.mean()) if answered.any() else None
        if result.label_accuracy is not None:
            emit("metric", step=n, epoch=0.0, name="label_accuracy", value=result.label_accuracy)
        emit("metric", step=n, epoch=0.0, name="answered", value=float(answered.sum()))
        if config.aggregator == "lnmax":
            result.epsilon_released = result.analysis.epsilon_data_independent
        else:
            rel = aggregation.release_with_noise(self.randomness, votes=votes, answered=answered, delta=config.delta,
                                                 num_teachers=config.num_teachers, **params.analysis,
                                                 **release_parameters(config, self.data.num_classes))
            result.released = rel
            # Shown as an estimate beside the guarantee (engine.publication) when the release's own
            # parameters were fixed before the votes (the default). At an order where conditions C5-C6
            # fail the release's own analysis does not hold, and parameters chosen from the votes are a
            # choice it does not cover: not shown then.
            usable = rel.conditions_hold and not rel.parameters_from_data
            result.epsilon_released = rel.epsilon_released if usable else None
            if not rel.conditions_hold:
                emit("warning", message=f"the smooth-sensitivity conditions C5-C6 failed the numerical check at "
                     f"order {rel.order:g}, so no estimate of the data-dependent epsilon is shown "
                     f"(use a larger sigma, or leave release_order unset)")
            elif rel.parameters_from_data:
                emit("warning", message="the smooth-sensitivity release's parameters were chosen from the votes "
                     "(release_parameters = \"data-dependent\"), which its epsilon does not cover, so it is not "
                     "shown",
                     hint="leave release_parameters at \"data-independent\" for an estimate that is shown")
        if result.epsilon_released is not None:
            emit("privacy", step=n, epsilon=float(result.epsilon_released), delta=config.delta,
                 accountant="pate-released")

    # ---- runner interface ----------------------------------------------------------------------
    def run_fields(self, result: PATEResult | None) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "model": self.model_name,
            "device": str(self.device),
            "num_train": self.data.num_train,
            "num_test": int(self.x_holdout.shape[0]),
            "steps_planned": self.num_queries,
            "delta": self.config.delta,
            "accountant": analysis.ACCOUNTANT_DATA_INDEPENDENT,
        }
        if result is not None:
            fields.update(steps_done=result.queries_processed, stop_reason=result.stop_reason,
                          accuracy=result.test_accuracy,
                          epochs_done=result.student.epochs_done if result.student else 0)
            if result.analysis is not None:
                epsilon, accountant = pate_publishable(result.analysis.epsilon_data_independent)
                fields.update(epsilon=epsilon, accountant=accountant)
        return fields

    def summary(self, result: PATEResult) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "stop_reason": result.stop_reason,
            "seconds": round(result.seconds, 3),
            "teacher_seconds": round(result.teacher_seconds, 3),
            "num_teachers": self.config.num_teachers,
            "teacher_model": self.teacher_model_name,
            "teachers_backend": self.config.teachers_backend,
            "aggregator": self.config.aggregator,
            "queries": result.queries_processed,
            "answered": result.answered,
            "ensemble_accuracy": result.ensemble_accuracy,
            "label_accuracy": result.label_accuracy,
            "randomness": randomness_summary(self.config),
        }
        if result.teacher_accuracy is not None:
            acc = result.teacher_accuracy
            summary["teacher_accuracy"] = {"mean": float(acc.mean()), "min": float(acc.min()),
                                           "max": float(acc.max()), "std": float(acc.std())}
        if result.analysis is not None:
            a = result.analysis
            epsilon, accountant = pate_publishable(a.epsilon_data_independent)
            summary.update(epsilon=epsilon, accountant=accountant, epsilon_data_dependent=a.epsilon_data_dependent,
                           epsilon_data_independent=a.epsilon_data_independent, delta=a.delta, order=a.order,
                           epsilon_released=result.epsilon_released)
        if result.released is not None:
            r = result.released
            summary["release"] = {"order": r.order, "beta": r.beta, "sigma_ss": r.sigma_ss,
                                  "release_rdp": float(r.release_rdp), "rdp_released": float(r.rdp_released),
                                  "parameters_from_data": r.parameters_from_data,
                                  "conditions_hold": r.conditions_hold}
        if result.canaries is not None:
            summary.update(canaries=result.canaries, audit_model=True)
        if result.student is not None:
            s = result.student
            summary.update(test_accuracy=s.test_accuracy, test_loss=s.test_loss, student_epochs=s.epochs_done,
                           student_steps=s.steps, student_seconds=round(s.seconds, 3))
            if s.pseudo_label_rate is not None:
                summary["pseudo_label_rate"] = s.pseudo_label_rate
        return summary

    def finish(self, result: PATEResult | None, *, store: Any, out_dir: Path, emit: Emit) -> dict[str, Any]:
        """Write the vote rows, save the student as an artifact; return the run's summary."""
        if result is None:
            return {"stop_reason": "stopped"}
        unstored = result.vote_rows[result.vote_rows_stored:]
        if unstored:  # only when train() ran without a sink; rows must not be dropped silently
            if self.vote_sink is None:
                raise ValueError("the released votes have nowhere to go: connect the run to a store "
                                 "(engine.runs.store_votes) before train()")
            self.vote_sink(unstored)
            result.vote_rows_stored = len(result.vote_rows)
        summary = self.summary(result)
        if result.student is None:
            return summary
        from engine.dpsgd.trainer import predict
        from engine.runs import per_class_accuracy, save_model_artifact

        summary["per_class_accuracy"] = per_class_accuracy(
            predict(self.model, self.x_holdout.to(self.device)).cpu(), self.y_holdout, self.data.class_names)
        save_model_artifact(self.model, model_name=self.model_name, data=self.data, config=self.config,
                            out_dir=out_dir, emit=emit, summary=summary)
        return summary


@dataclass(frozen=True)
class _AggregatorParams:
    noise: dict[str, Any]  # for aggregation.aggregate
    analysis: dict[str, Any]  # for engine.privacy.pate


def _aggregator_params(config: RunConfig) -> _AggregatorParams:
    values = aggregation.aggregator_noise(config.to_dict())
    if config.aggregator == "confident":
        values = {"threshold": config.threshold, **values}
    return _AggregatorParams(values, {"mechanism": config.aggregator, **values})


def release_parameters(config: RunConfig, num_classes: int) -> dict[str, float]:
    """Order, beta and sigma_ss of the smooth-sensitivity release, as far as they are fixed before any
    vote: the config's values, the rest from public settings (`release_parameters =
    "data-independent"`, pate_smooth.data_independent_parameters); with "data-dependent" the unset
    ones are left to release_epsilon's search over the votes. Empty for LNMax (nothing released)."""
    if config.aggregator == "lnmax":
        return {}
    fixed = {"order": config.release_order, "beta": config.release_beta, "sigma_ss": config.release_sigma}
    if config.release_parameters == "data-independent":
        analysis_params = _aggregator_params(config).analysis
        try:
            chosen = pate_smooth.data_independent_parameters(
                num_teachers=config.num_teachers, num_queries=config.num_queries, num_classes=num_classes,
                delta=config.delta, **analysis_params, **fixed)
        except ValueError as exc:  # e.g. a release_beta too large for the order chosen
            raise ConfigError("release_beta", str(exc), hint="set release_order too, or leave release_beta unset")
        return dataclasses.asdict(chosen)
    return {k: v for k, v in fixed.items() if v is not None}


def prepare_pate(config: RunConfig, data: Dataset, *, emit: Emit = _noop,
                 split_rule: str = SPLIT_BY_EXAMPLE) -> PreparedPATERun:
    """Split the test set into pool and held-out part, pick the models; emits a `plan` event."""
    config.check_against_dataset(data.num_train, data.num_test)
    if config.teachers_backend == "ray":
        import_ray()  # before the run is stored: without Ray, one line naming the extra
    pool = config.pool_size_for(data.num_test)
    order = public_order_for(config.dataset)
    rows = torch.from_numpy(public_rows(data.num_test, order=order, seed=config.seed))
    teacher_name = default_model_for(data) if config.teacher_model == "auto" else config.teacher_model
    try:
        build_model(teacher_name, input_shape=data.input_shape, num_classes=data.num_classes)
    except Exception as exc:
        message = getattr(exc, "message", str(exc))
        raise ConfigError("teacher_model", message, hint=getattr(exc, "hint", None)) from None
    model_name = default_model_for(data) if config.model == "auto" else config.model
    torch.manual_seed(config.seed)
    model = build_model(model_name, input_shape=data.input_shape, num_classes=data.num_classes)
    device = resolve_device(config.device)
    shard = data.num_train // config.num_teachers
    from engine.runs import software_versions

    emit(
        "plan",
        software=software_versions(),
        threads=torch.get_num_threads(),
        mechanism="pate",
        model=model_name,
        teacher_model=teacher_name,
        device=str(device),
        num_train=data.num_train,
        num_test=data.num_test - pool,
        public_pool_size=pool,
        public_order=order,
        input_shape=list(data.input_shape),
        num_classes=data.num_classes,
        dataset_fingerprint=data.fingerprint,
        data_split=data.split,
        split_rule=split_rule,
        normalization=json.loads(json.dumps(data.normalization)),
        num_teachers=config.num_teachers,
        shard_size=shard,
        aggregator=config.aggregator,
        steps=config.num_queries,
        steps_allowed=config.num_queries,
        sample_rate=None,
        noise_multiplier=None,
        noise_calibrated=False,
        delta=config.delta,
        accountant=analysis.ACCOUNTANT_DATA_INDEPENDENT,
        epsilon_budget=config.epsilon_budget,
        release_parameters=release_parameters(config, data.num_classes) or None,
        epsilon_data_independent_if_all_answered=aggregation.planned_epsilon_data_independent(config),
        randomness=randomness_summary(config),
    )
    if shard < 50:
        empty = expected_empty_shards(data.num_train, config.num_teachers)
        none = (f"; about {empty:.2g} teachers are expected to get no example at all (they vote untrained)"
                if empty >= 0.01 else "")
        emit("warning", message=f"each teacher gets only about {shard} training examples{none}; expect weak "
             f"teachers (fewer teachers, or a larger training set)")
    return PreparedPATERun(
        config=config,
        data=data,
        model_name=model_name,
        model=model,
        teacher_model_name=teacher_name,
        device=device,
        emit=emit,
        x_pool=take_rows(data.x_test, rows[:pool]),
        y_pool=data.y_test[rows[:pool]],
        x_holdout=take_rows(data.x_test, rows[pool:]),
        y_holdout=data.y_test[rows[pool:]],
    )
