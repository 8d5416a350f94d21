"""`dpw privacy ...`: privacy accounting without training (numpy and scipy; no torch, no store), so
these commands start fast. Also the attack-risk table that `dpw show --risk` shares with `dpw privacy risk`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from engine import rounding
from engine.cli_shell import UserError, echo_json, epsilon_text
from engine.config import RELEASE_PARAMETERS, as_toml


@click.group()
def privacy() -> None:
    """Privacy accounting without training (no torch import: starts fast)."""


def _check_setting(option: str, value: float, setting: str) -> None:
    """Refuse a value the run config's `setting` would refuse, in its words (one range per idea)."""
    from engine.config import check_field

    error = check_field(setting, value)
    if error is not None:
        text = error.message.removeprefix(f"{setting}: ") + (f"; {error.hint}" if error.hint else "")
        raise UserError(f"--{option}: " + text.replace(", or unset", ""))


def check_number(name: str, value: float, low: float, high: float, *, open_low=True, open_high=False) -> None:
    bad = (value <= low if open_low else value < low) or (value >= high if open_high else value > high) or math.isnan(value)
    if bad:
        lo = "(" if open_low else "["
        hi = ")" if open_high else "]"
        raise UserError(f"--{name}: {as_toml(value)} is out of range; allowed {lo}{as_toml(low)}, {as_toml(high)}{hi}")


@privacy.command("dpsgd")
@click.option("--sample-rate", type=float, required=True, help="Poisson sampling rate q = expected batch / N.")
@click.option("--noise-multiplier", type=float, required=True, help="Noise std in units of the clipping norm.")
@click.option("--steps", type=click.IntRange(min=0), required=True, help="Number of training steps.")
@click.option("--delta", type=float, required=True, help="Target delta.")
@click.option("--accountant", type=click.Choice(["pld", "rdp"]), default="pld", show_default=True)
@click.option("--json", "as_json", is_flag=True, help='Print {"epsilon", "delta", "accountant"}.')
def privacy_dpsgd(sample_rate: float, noise_multiplier: float, steps: int, delta: float, accountant: str, as_json: bool) -> None:
    """Epsilon of DP-SGD (Poisson-subsampled Gaussian, add/remove one example).

    Example: dpw privacy dpsgd --sample-rate 0.004267 --noise-multiplier 1.1 --steps 9375 --delta 1e-5 --json
    """
    from engine import privacy as priv

    check_number("sample-rate", sample_rate, 0.0, 1.0)
    _check_setting("noise-multiplier", noise_multiplier, "noise_multiplier")
    check_number("delta", delta, 0.0, 1.0, open_high=True)
    eps = priv.dpsgd_epsilon(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps,
                             delta=delta, accountant=accountant)
    if as_json:
        echo_json({"epsilon": eps.value, "delta": eps.delta, "accountant": eps.accountant})
    else:
        click.echo(f"epsilon = {rounding.up(eps.value, '.6g')} at delta = {eps.delta:.10g} ({eps.accountant})"
                   + (": this noise bounds nothing; dpw privacy risk shows what an attacker can still not do"
                      if eps.value == math.inf else ""))


@privacy.command("risk")
@click.option("--sample-rate", type=float, required=True, help="Poisson sampling rate q = expected batch / N.")
@click.option("--noise-multiplier", type=float, required=True, help="Noise std in units of the clipping norm.")
@click.option("--steps", type=click.IntRange(min=0), required=True, help="Number of training steps.")
@click.option("--delta", type=float, required=True,
              help="Target delta: of the epsilon shown, and the probability the posterior bound may fail.")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"max_advantage", "tpr_at_fpr", "posterior", "tradeoff": {"fpr", "tpr"}, "epsilon", ...}.')
def privacy_risk(sample_rate: float, noise_multiplier: float, steps: int, delta: float, as_json: bool) -> None:
    """What DP-SGD's guarantee allows the best membership attacker (f-DP trade-off curve; upper bounds).

    The attacker knows everything but whether one record was used. Shown: the highest TPR at
    FPR 1% and 0.1%, the maximum advantage TPR - FPR, and the attacker's posterior for priors
    1% and 50% (holding except with probability delta), all from the PLD accountant.

    Example: dpw privacy risk --sample-rate 0.004267 --noise-multiplier 1.1 --steps 9375 --delta 1e-5 --json
    """
    from engine.privacy import risk

    check_number("sample-rate", sample_rate, 0.0, 1.0)  # as dpw privacy dpsgd: a rate of 0 trains on nothing
    _check_setting("noise-multiplier", noise_multiplier, "noise_multiplier")
    check_number("delta", delta, 0.0, 1.0, open_high=True)
    try:
        result = risk.dpsgd_attack_risk(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps,
                                        delta=delta)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        echo_json(result.to_json())
        return
    from engine import privacy as priv

    eps = priv.dpsgd_epsilon(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps, delta=delta,
                             accountant="pld")
    click.echo(f"Best membership attack against DP-SGD (sample rate {sample_rate:g}, noise multiplier "
               f"{noise_multiplier:g}, {steps} steps); every figure is an upper bound")
    echo_risk_rows(result, epsilon=eps.value, note=f"({eps.accountant})")


def _percent_up(x: float) -> str:
    """A probability bound as a percentage to 3 significant digits, rounded up."""
    from engine.rounding import percent_up

    return percent_up(x, 3)


@privacy.command("calibrate")
@click.option("--sample-rate", type=float, required=True, help="Poisson sampling rate q = expected batch / N.")
@click.option("--steps", type=click.IntRange(min=1), required=True, help="Number of training steps.")
@click.option("--epsilon", type=float, default=None, help="Target epsilon (with --delta).")
@click.option("--delta", type=float, default=None, help="Target delta (with --epsilon).")
@click.option("--attack-tpr", type=float, default=None,
              help="Instead of --epsilon: highest TPR allowed to a membership attack at --at-fpr.")
@click.option("--at-fpr", type=float, default=0.01, show_default=True, help="The FPR at which --attack-tpr holds.")
@click.option("--accountant", type=click.Choice(["pld", "rdp"]), default="pld", show_default=True)
@click.option("--json", "as_json", is_flag=True, help='Print {"noise_multiplier"}.')
def privacy_calibrate(sample_rate: float, steps: int, epsilon: float | None, delta: float | None,
                      attack_tpr: float | None, at_fpr: float, accountant: str, as_json: bool) -> None:
    """The smallest noise multiplier that meets a target (epsilon, delta), or a target attack TPR.

    Example: dpw privacy calibrate --sample-rate 0.004267 --steps 9375 --epsilon 3 --delta 1e-5 --json

    Example: dpw privacy calibrate --sample-rate 0.004267 --steps 9375 --attack-tpr 0.05 --at-fpr 0.01
    """
    from engine import privacy as priv

    check_number("sample-rate", sample_rate, 0.0, 1.0)
    if (epsilon is None) == (attack_tpr is None):
        raise UserError("give either --epsilon with --delta, or --attack-tpr (with --at-fpr)")
    try:
        if attack_tpr is not None:
            if accountant != "pld":
                raise UserError("--attack-tpr is calibrated on the PLD accountant; leave out --accountant")
            check_number("at-fpr", at_fpr, 0.0, 1.0, open_high=True)
            check_number("attack-tpr", attack_tpr, at_fpr, 1.0, open_high=True)
            sigma = priv.calibrate_noise_multiplier_for_attack(sample_rate=sample_rate, steps=steps,
                                                               target_tpr=attack_tpr, fpr=at_fpr)
        else:
            if delta is None:
                raise UserError("--delta is needed with --epsilon")
            _check_setting("epsilon", epsilon, "target_epsilon")
            check_number("delta", delta, 0.0, 1.0, open_high=True)
            sigma = priv.calibrate_noise_multiplier(sample_rate=sample_rate, steps=steps, target_epsilon=epsilon,
                                                    delta=delta, accountant=accountant)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        echo_json({"noise_multiplier": sigma})
    elif attack_tpr is not None:
        click.echo(f"noise multiplier = {rounding.up(sigma, '.6g')} (attack TPR <= {attack_tpr:g} at FPR {at_fpr:g}, pld)")
    else:
        click.echo(f"noise multiplier = {rounding.up(sigma, '.6g')} ({accountant})")  # more noise, never less


@privacy.command("tuning")
@click.option("--sample-rate", type=float, required=True, help="Each candidate's Poisson sampling rate q.")
@click.option("--noise-multiplier", type=float, required=True, help="Each candidate's noise multiplier.")
@click.option("--steps", type=click.IntRange(min=0), required=True, help="Each candidate's number of training steps.")
@click.option("--delta", type=float, required=True, help="Target delta.")
@click.option("--mean-runs", type=float, required=True, help="Expected number of candidate runs K (>= 1).")
@click.option("--shape", type=float, required=True,
              help="Distribution of K: truncated negative binomial shape eta > -1 (0 logarithmic, 1 geometric), "
              "or inf for Poisson.")
@click.option("--json", "as_json", is_flag=True, help='Print {"epsilon", "delta", "single_run_epsilon", ...}.')
def privacy_tuning(sample_rate: float, noise_multiplier: float, steps: int, delta: float, mean_runs: float,
                   shape: float, as_json: bool) -> None:
    """Epsilon of a private tuning study: a random number K of DP-SGD candidates, only the best released.

    Papernot & Steinke (ICLR 2022), Theorems 2 and 6, from each candidate's RDP curve. The score
    used to pick the best must itself be private (or computed on public data); its cost is not
    included here.

    Example: dpw privacy tuning --sample-rate 0.004267 --noise-multiplier 1.1 --steps 9375 --delta 1e-5 --mean-runs 8 --shape 1 --json
    """
    from engine.privacy import tuning

    check_number("sample-rate", sample_rate, 0.0, 1.0)
    _check_setting("noise-multiplier", noise_multiplier, "noise_multiplier")
    check_number("delta", delta, 0.0, 1.0, open_high=True)
    check_number("mean-runs", mean_runs, 1.0, 1e9, open_low=False)
    check_number("shape", shape, -1.0, math.inf)
    try:
        result = tuning.tuning_epsilon(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps,
                                       delta=delta, mean_runs=mean_runs, shape=shape)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    eps, single = result.epsilon, result.single_run
    if as_json:
        echo_json({"epsilon": eps.value, "delta": eps.delta, "single_run_epsilon": single.value,
                   "accountant": eps.accountant, "mean_runs": result.mean_runs,
                   "shape": "inf" if math.isinf(result.shape) else result.shape, "gamma": result.gamma})
        return
    if math.isinf(result.shape):
        law = f"Poisson with mean {result.mean_runs:g} (no run at all with probability {math.exp(-result.mean_runs):.3g})"
    else:
        law = f"truncated negative binomial, shape {result.shape:g}, mean {result.mean_runs:g} (gamma = {result.gamma:.6g})"
    click.echo("\n".join([
        f"K candidates ~ {law}; only the best is released",
        f"  epsilon (study)    = {rounding.up(eps.value, '.6g')} at delta = {eps.delta:g} ({eps.accountant}, "
        f"order {eps.order:g})" if eps.order is not None else
        f"  epsilon (study)    = {rounding.up(eps.value, '.6g')} at delta = {eps.delta:g} ({eps.accountant})",
        f"  epsilon (one run)  = {rounding.up(single.value, '.6g')} (same analysis; dpw privacy dpsgd gives the tighter pld figure)",
    ]))


def _load_npy(path: Path, what: str):
    """A plain .npy array from `path`, or one line saying what the file is instead (never loads pickles)."""
    import numpy as np

    hint = "save it with numpy.save(path, array) from an integer or boolean array"
    with open(path, "rb") as f:
        head = f.read(6)
    if not head:
        raise UserError(f"{what} {path}: the file is empty; {hint}")
    if head != b"\x93NUMPY":
        raise UserError(f"{what} {path}: not a .npy file (it does not start with numpy's .npy header); {hint}")
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise UserError(f"{what} {path}: a damaged or object .npy file ({type(exc).__name__}); {hint}") from None
    if not isinstance(array, np.ndarray):
        raise UserError(f"{what} {path}: holds several arrays, not one; {hint}")
    return array


@privacy.command("pate")
@click.option("--votes", "votes_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="A .npy file of integer vote counts, shape (queries, classes).")
@click.option("--mechanism", type=click.Choice(["gnmax", "confident", "lnmax"]), required=True,
              help="The aggregator that answered the queries.")
@click.option("--sigma", type=float, default=None, help="gnmax: std of the Gaussian noise on each count.")
@click.option("--threshold", type=float, default=None, help="confident: the threshold T on the top count.")
@click.option("--sigma1", type=float, default=None, help="confident: noise std of the threshold check.")
@click.option("--sigma2", type=float, default=None, help="confident: noise std of the answers (GNMax).")
@click.option("--laplace-scale", type=float, default=None, help="lnmax: scale b of the Laplace noise (gamma = 1/b).")
@click.option("--answered", "answered_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A .npy boolean array: which queries were answered. confident: the data-dependent epsilon "
              "charges the realised answers (default: the expected cost, as the 2018 paper's analysis); the "
              "data-independent one charges every query as answered either way.")
@click.option("--delta", type=float, required=True, help="Target delta.")
@click.option("--release", is_flag=True,
              help="Also release the data-dependent epsilon with the smooth-sensitivity mechanism (gnmax, "
              "confident), as a PATE run does: its noise from the operating system's secret randomness, its "
              "parameters fixed from public quantities, so the released epsilon is safe to publish.")
@click.option("--release-parameters", type=click.Choice(RELEASE_PARAMETERS), default="data-independent",
              show_default=True,
              help="How the release's order, beta and sigma are chosen. data-independent: from the number of "
              "teachers, queries and classes, the aggregator's noise and delta. data-dependent: by looking at "
              "the votes (the paper's choice), which the released epsilon does not cover.")
@click.option("--num-teachers", type=int, default=None,
              help="The number of teachers (public; default: the most votes cast on any query).")
@click.option("--release-seed", type=int, default=None,
              help="Debugging only (implies --release): draw the release noise from this seed. Anyone who knows "
              "the seed can remove that noise, so the released epsilon then carries no guarantee.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (with the RDP curve).")
def privacy_pate(votes_file: Path, mechanism: str, sigma: float | None, threshold: float | None,
                 sigma1: float | None, sigma2: float | None, laplace_scale: float | None,
                 answered_file: Path | None, delta: float, release: bool, release_parameters: str,
                 num_teachers: int | None, release_seed: int | None, as_json: bool) -> None:
    """Epsilon of PATE's noisy aggregation of teacher votes (data-dependent and data-independent).

    The data-dependent epsilon is a function of the private votes and not safe to publish as is;
    --release releases it with smooth-sensitivity noise (publishable when its parameters are fixed
    from public quantities, the default), as an estimate: the guarantee is the data-independent epsilon.

    Example: dpw privacy pate --votes votes.npy --mechanism confident --threshold 200 --sigma1 150 --sigma2 40 --delta 1e-5 --release --json
    """
    import numpy as np

    from engine.privacy import pate as pate_analysis

    check_number("delta", delta, 0.0, 1.0, open_high=True)
    needed = {"gnmax": {"sigma": sigma}, "lnmax": {"laplace-scale": laplace_scale},
              "confident": {"threshold": threshold, "sigma1": sigma1, "sigma2": sigma2}}[mechanism]
    for name, value in needed.items():
        if value is None:
            raise UserError(f"--{name} is needed for --mechanism {mechanism}")
        if name == "threshold":
            check_number(name, value, 0.0, 1e12, open_low=False)
        else:
            check_number(name, value, 0.0, 1e12)
    votes = _load_npy(votes_file, "--votes")
    if votes.ndim != 2 or votes.shape[1] < 2 or votes.dtype.kind not in "iub" and not (
        votes.dtype.kind == "f" and np.all(np.isfinite(votes)) and np.all(votes == np.round(votes))
    ):
        raise UserError(f"--votes {votes_file}: expected integer vote counts of shape (queries, classes >= 2); "
                        f"got {votes.dtype} of shape {votes.shape}")
    if votes.shape[0] == 0:
        raise UserError(f"--votes {votes_file}: holds no query (shape {votes.shape}); give one row of counts per query")
    if votes.min() < 0:
        raise UserError(f"--votes {votes_file}: vote counts must be >= 0; found {votes.min()}")
    from engine.config import field_spec

    most, teachers = int(votes.sum(axis=1).max()), int(field_spec("num_teachers").maximum)
    if most > teachers:
        raise UserError(f"--votes {votes_file}: a query has {most:,} votes, more than the {teachers:,} teachers "
                        f"a run may have; give one vote per teacher")
    answered = None
    if answered_file is not None:
        answered = _load_npy(answered_file, "--answered")
        if answered.shape != (votes.shape[0],) or answered.dtype.kind not in "bui":
            raise UserError(f"--answered {answered_file}: expected a boolean array of shape ({votes.shape[0]},); "
                            f"got {answered.dtype} of shape {answered.shape}")
    params = {name.replace("-", "_"): value for name, value in needed.items()}
    release = release or release_seed is not None
    if release and mechanism == "lnmax":
        raise UserError("--release: the smooth-sensitivity release covers gnmax and confident; LNMax's "
                        "data-independent epsilon is already publishable")
    if num_teachers is not None:
        check_number("num-teachers", num_teachers, 0, 1e9)
    if release_seed is not None:
        check_number("release-seed", release_seed, 0, 2**63 - 1, open_low=False)
    if answered is not None and not np.isin(answered, (0, 1)).all():
        raise UserError(f"--answered {answered_file}: expected a boolean array (or 0/1) saying which queries were "
                        f"answered; found the value {answered[~np.isin(answered, (0, 1))][0]}")
    try:
        result = pate_analysis.pate_epsilon(votes=votes, mechanism=mechanism, delta=delta, answered=answered, **params)
        released = None
        if release:
            released = release_votes(votes, mechanism=mechanism, delta=delta, answered=answered, params=params,
                                     rule=release_parameters, num_teachers=num_teachers, seed=release_seed)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    out = {
        "mechanism": mechanism,
        "epsilon_data_dependent": result.epsilon_data_dependent,
        "epsilon_data_independent": result.epsilon_data_independent,
        "delta": result.delta,
        "order": result.order,
        "order_data_independent": result.order_data_independent,
        "queries": result.num_queries,
        "answered": result.answered,
        "answered_is_expected": result.answered_is_expected,
        "orders": [float(a) for a in result.orders],
        "rdp": [float(r) for r in result.rdp],
        "rdp_data_independent": [float(r) for r in result.rdp_data_independent],
    }
    if released is not None:
        rel = released.release
        out["epsilon_released"] = rel.epsilon_released
        out["release"] = {"order": rel.order, "beta": rel.beta, "sigma_ss": rel.sigma_ss,
                          "release_rdp": float(rel.release_rdp), "rdp_released": float(rel.rdp_released),
                          "parameters_from_data": rel.parameters_from_data, "conditions_hold": rel.conditions_hold,
                          "noise": released.noise, "publishable": released.publishable,
                          "caveat": released.caveat}
    if as_json:
        echo_json(out)
        return
    expected = " (expected)" if result.answered_is_expected else ""
    lines = [
        f"{mechanism}: {result.num_queries} queries, {result.answered:.6g} answered{expected}",
        f"  epsilon (data-dependent)    = {result.epsilon_data_dependent:.6g} at order {result.order}"
        "  — depends on the votes: not safe to publish as is",
        f"  epsilon (data-independent)  = {rounding.up(result.epsilon_data_independent, '.6g')} at order {result.order_data_independent}"
        "  — the guarantee: holds whatever the votes",
    ]
    if released is not None:
        rel = released.release
        lines.append(f"  epsilon (released)          = {rel.epsilon_released:.6g} at order {rel.order:g} "
                     f"(smooth-sensitivity noise, {released.noise})"
                     + ("  — safe to publish as an estimate, not a bound (its noise is centred on the data-dependent "
                        "cost)" if released.publishable else f"  — NOT publishable: {released.caveat}"))
    lines.append(f"  delta = {result.delta:.10g}")
    click.echo("\n".join(lines))


@dataclass
class ReleasedVotes:
    """`dpw privacy pate --release`: the smooth-sensitivity release and whether it may be published."""

    release: Any  # engine.privacy.pate_smooth.ReleasedEpsilon
    noise: str  # "secret" or "seeded"
    publishable: bool
    caveat: str | None


def release_votes(votes, *, mechanism: str, delta: float, answered, params: dict[str, Any], rule: str,
                  num_teachers: int | None, seed: int | None) -> ReleasedVotes:
    """Release the data-dependent epsilon of `votes` as a PATE run does (engine.pate.run): noise from
    secret OS randomness (engine.randomness), unless a debugging `seed` is given, and parameters from
    public quantities unless `rule` is "data-dependent". Raises ValueError on settings that cannot work."""
    import numpy as np

    from engine.pate.aggregation import release_with_noise
    from engine.privacy import pate_smooth
    from engine.randomness import PrivateRandomness

    teachers = int(num_teachers) if num_teachers is not None else int(np.max(votes.sum(axis=1)))
    chosen: dict[str, float] = {}
    if rule == "data-independent":
        chosen = dataclasses.asdict(pate_smooth.data_independent_parameters(
            mechanism=mechanism, num_teachers=teachers, num_queries=votes.shape[0], num_classes=votes.shape[1],
            delta=delta, **params))
    randomness = PrivateRandomness(reproducible_noise=seed is not None, seed=seed or 0)
    release = release_with_noise(randomness, votes=votes, mechanism=mechanism, delta=delta, answered=answered,
                                 num_teachers=teachers, **params, **chosen)
    caveats = []
    if seed is not None:
        caveats.append(f"its noise is reproducible from --release-seed {seed}, so anyone who knows the seed can "
                       "remove it (no guarantee)")
    if release.parameters_from_data:
        caveats.append("its parameters were chosen by looking at the votes, which the released epsilon does not "
                       "cover")
    if not release.conditions_hold:
        caveats.append("the smooth-sensitivity conditions failed their numerical check (use a larger sigma)")
    return ReleasedVotes(release, "seeded" if seed is not None else "secret", not caveats,
                         "; ".join(caveats) or None)


RISK_LABEL = 24
"""Width of the label column in `dpw show --risk` and `dpw privacy risk`: one table layout for both."""


def echo_risk_rows(figures: Any, *, epsilon: float, note: str) -> None:
    """The attack-risk rows (engine.privacy.risk figures) shared by `dpw show --risk` and `dpw privacy risk`.
    `epsilon`: the accountant's, printed as every command prints it (the figures' own is the same
    guarantee read off a grid, a little above it)."""
    rows = [("epsilon", f"{epsilon_text(epsilon)} at delta {figures.delta:g} {note}"),
            ("max advantage (TPR-FPR)", _percent_up(figures.max_advantage))]
    rows += [(f"TPR at FPR {rounding.percent(fpr)}", _percent_up(tpr)) for fpr, tpr in figures.tpr_at_fpr.items()]
    rows += [(f"posterior, prior {rounding.percent(prior)}",
              f"{_percent_up(post)}  (except with probability {figures.delta:g})")
             for prior, post in figures.posterior.items()]
    for label, value in rows:
        click.echo(f"  {label:<{RISK_LABEL}} {value}")
