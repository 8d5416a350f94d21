"""engine.ledger and `dpw ledger`: the privacy spent on each dataset by all its runs, deleted ones
included: DP-SGD runs composed exactly, the others added, and no bound once a non-private or seeded
run touched the data."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from engine.cli import cli
from engine.ledger import dataset_ledgers
from engine.privacy.pld import pld_epsilon
from engine.store import Store


def dpsgd(run_id, *, dataset="digits", q=0.05, sigma=1.0, steps=100, epsilon=1.0, delta=1e-5, status="finished",
          **extra):
    return {"id": run_id, "name": f"r{run_id}", "mechanism": "dpsgd", "dataset": dataset, "status": status,
            "started": "2026-11-24T10:00:00+00:00", "sample_rate": q, "noise_multiplier": sigma, "steps_done": steps,
            "epsilon": epsilon, "delta": delta, "accountant": "pld", "config": {"seed": 0, "reproducible_noise": False}, "summary": {}, **extra}


def test_two_dpsgd_runs_compose_like_one_run_of_their_steps():
    """Two runs of the same (q, sigma) on one dataset are one subsampled Gaussian of T1 + T2 steps:
    checked against the single-run accountant, and far below adding the two epsilons."""
    one = pld_epsilon(sample_rate=0.05, noise_multiplier=1.0, steps=100, delta=1e-5).value
    (ledger,) = dataset_ledgers([dpsgd(1, epsilon=one), dpsgd(2, epsilon=one)], [])
    both = pld_epsilon(sample_rate=0.05, noise_multiplier=1.0, steps=200, delta=1e-5).value
    assert ledger.composed_epsilon == pytest.approx(both, rel=1e-6)
    assert ledger.epsilon == pytest.approx(both, rel=1e-6) and ledger.delta == pytest.approx(1e-5)
    assert one < ledger.epsilon < 2 * one
    assert "2 runs: together (ε = " in ledger.statement()


def test_the_gaussian_releases_a_runs_epsilon_includes_are_composed_with_its_steps():
    """normalization = "dp" releases feature statistics before training, and a private study scores
    each candidate with Gaussian noise: the run's (or study's) epsilon includes them, so the ledger
    does too; it stated 4.13 for a run whose own epsilon was 5.30."""
    from engine.privacy.pld import SubsampledGaussian, pld_epsilon_composed

    statistics = dpsgd(1, config={"reproducible_noise": False, "normalization": "dp",
                                  "normalization_noise_multiplier": 2.0})
    (ledger,) = dataset_ledgers([statistics], [])
    steps = pld_epsilon(sample_rate=0.05, noise_multiplier=1.0, steps=100, delta=1e-5).value
    with_statistics = pld_epsilon_composed(mechanisms=[SubsampledGaussian(0.05, 1.0, 100),
                                                       SubsampledGaussian(1.0, 2.0, 1)], delta=1e-5).value
    assert ledger.epsilon == pytest.approx(with_statistics, rel=1e-6) and ledger.epsilon > steps * 1.05
    study = {"id": 7, "mode": "private", "status": "finished", "config": {"score_noise_multiplier": 5.0}}
    (scored,) = dataset_ledgers([dpsgd(2, study=study), dpsgd(3, study=study)], [])
    expected = pld_epsilon_composed(mechanisms=[SubsampledGaussian(0.05, 1.0, 100)] * 2
                                    + [SubsampledGaussian(1.0, 5.0, 1)] * 2, delta=1e-5).value
    assert scored.epsilon == pytest.approx(expected, rel=1e-6)
    assert scored.epsilon > pld_epsilon(sample_rate=0.05, noise_multiplier=1.0, steps=200, delta=1e-5).value


def test_a_study_runs_row_says_it_counts_the_run_alone_and_what_the_study_states():
    """The list and dashboard show a study's run at the study's epsilon (4.3), the ledger at its own
    (2.31), with nothing saying which was which."""
    study = {"id": 7, "name": "s", "mode": "private", "status": "finished", "epsilon": 4.302, "delta": 1e-5,
             "accountant": "rdp-repeat-and-select", "released_run_id": 2, "config": {"score_noise_multiplier": 5.0}}
    (ledger,) = dataset_ledgers([dpsgd(2, epsilon=2.311, study=study), dpsgd(3)], [])
    assert ledger.entries[0].why == "this run alone (its study states ε = 4.302)"
    assert ledger.entries[1].why == ""


def test_other_runs_and_deleted_ones_add_their_epsilon_and_delta():
    pate = {"id": 3, "name": "p", "mechanism": "pate", "dataset": "digits", "status": "finished",
            "started": "2026-11-24T10:00:00+00:00", "epsilon": 2.0, "delta": 1e-5, "accountant": "pate-di",
            "config": {"seed": 0, "reproducible_noise": False}, "summary": {"epsilon_data_independent": 2.0, "delta": 1e-5}}
    deleted = {"id": 4, "name": "gone", "mechanism": "dpsgd", "dataset": "digits", "status": "finished",
               "epsilon": 0.5, "delta": 1e-6, "accountant": "rdp"}
    composed = pld_epsilon(sample_rate=0.05, noise_multiplier=1.0, steps=100, delta=1e-5).value
    (ledger,) = dataset_ledgers([dpsgd(1, epsilon=composed), pate], [deleted])
    assert ledger.epsilon == pytest.approx(composed + 2.0 + 0.5)
    assert ledger.delta == pytest.approx(1e-5 + 1e-5 + 1e-6)
    assert [e.counted for e in ledger.entries] == ["composed", "added", "added"]
    assert ledger.entries[-1].deleted and "(1 deleted)" in ledger.statement()


@pytest.mark.parametrize("culprit, why", [
    ({"mechanism": "none", "epsilon": None, "accountant": None}, "trained without privacy"),
    ({"config": {"seed": 3, "reproducible_noise": True}}, "reproducible from the published seed"),
])
def test_a_non_private_or_seeded_run_leaves_the_data_without_a_bound(culprit, why):
    (ledger,) = dataset_ledgers([dpsgd(1), {**dpsgd(2), **culprit}], [])
    assert math.isinf(ledger.epsilon) and [e.run_id for e in ledger.unbounded] == [2]
    assert "no bound on the privacy spent" in ledger.statement() and why in ledger.statement()
    assert ledger.to_json()["epsilon"] is None and ledger.to_json()["bounded"] is False


def test_a_deleted_non_private_run_still_counts():
    deleted = {"id": 9, "name": "baseline", "mechanism": "none", "dataset": "digits", "status": "finished",
               "epsilon": None, "delta": None}
    (ledger,) = dataset_ledgers([dpsgd(1)], [deleted])
    assert math.isinf(ledger.epsilon) and "deleted" in ledger.unbounded[0].why


def test_queued_and_not_started_runs_spend_nothing_and_datasets_stay_apart():
    queued = {**dpsgd(2), "status": "queued", "started": None, "steps_done": None, "epsilon": None}
    ledgers = {entry.dataset: entry for entry in dataset_ledgers([dpsgd(1), queued, dpsgd(3, dataset="mnist")], [])}
    assert set(ledgers) == {"digits", "mnist"}
    assert [e.counted for e in ledgers["digits"].entries] == ["composed", "none"]
    assert ledgers["digits"].epsilon == pytest.approx(ledgers["mnist"].epsilon)  # one run of the same settings each


def test_a_dpsgd_run_that_took_no_step_spends_nothing_not_even_delta():
    """A budget too small for one step: the run finishes at step 0 with epsilon 0; it touched nothing."""
    (ledger,) = dataset_ledgers([dpsgd(1), dpsgd(2, steps=0, epsilon=0.0)], [])
    assert [e.counted for e in ledger.entries] == ["composed", "none"]
    assert ledger.delta == pytest.approx(1e-5)


def test_a_running_run_is_counted_and_said_to_grow():
    (ledger,) = dataset_ledgers([dpsgd(1, status="running", steps=40)], [])
    assert ledger.still_running == [1] and "still growing: run 1 is running" in ledger.statement()


def test_dpw_ledger_on_a_real_store_with_a_deleted_run(tmp_path):
    """Real runs trained into a real store, one deleted: the deleted run's spend is still in the total."""
    from test_export_paths import train_in_store

    store = Store(tmp_path / "runs.sqlite")
    settings = dict(dataset="digits", noise_multiplier=1.0, expected_batch_size=64, epochs=1, learning_rate=0.5)
    first = train_in_store(store, name="first", **settings)
    second = train_in_store(store, name="second", **settings)
    spent = {run["id"]: run["epsilon"] for run in store.list_runs()}
    alone = CliRunner().invoke(cli, ["ledger", "--db", str(store.path), "--json"])
    assert alone.exit_code == 0, alone.output
    (before,) = json.loads(alone.output)
    assert before["composed"]["epsilon"] < spent[first] + spent[second]
    assert CliRunner().invoke(cli, ["delete", str(second), "--db", str(store.path), "--yes"]).exit_code == 0

    out = CliRunner().invoke(cli, ["ledger", "--db", str(store.path), "--json"])
    (after,) = json.loads(out.output)
    assert after["epsilon"] == pytest.approx(spent[first] + spent[second], rel=1e-9)  # one composed, one added
    assert [(r["id"], r["deleted"], r["counted"]) for r in after["runs"]] == [(first, False, "composed"),
                                                                             (second, True, "added")]
    text = CliRunner().invoke(cli, ["ledger", "--db", str(store.path)])
    assert text.exit_code == 0 and text.output.startswith("digits: 2 runs (1 deleted): together (ε = ")
    # the PLD line names the runs it composes: it read "DP-SGD runs composed" without the deleted one
    assert "\n  the 1 run counted 'composed' below, together (PLD): ε = " in text.output
    missing = CliRunner().invoke(cli, ["ledger", "--db", str(store.path), "--dataset", "mnist"])
    assert missing.exit_code != 0 and "no runs on dataset 'mnist'" in missing.output


def test_deleting_a_run_without_a_guarantee_leaves_the_ledger_unbounded(tmp_path):
    """A run whose noise is reproducible from its seed bounds nothing; once deleted, its record kept
    only its epsilon, which the ledger then added as if it held ("together (ε = ...)-DP")."""
    from test_export_paths import train_in_store

    store = Store(tmp_path / "runs.sqlite")
    settings = dict(dataset="digits", noise_multiplier=1.0, expected_batch_size=64, epochs=1, learning_rate=0.5)
    train_in_store(store, name="secret", **settings)
    seeded = train_in_store(store, name="seeded", reproducible_noise=True, **settings)
    assert CliRunner().invoke(cli, ["delete", str(seeded), "--db", str(store.path), "--yes"]).exit_code == 0

    out = CliRunner().invoke(cli, ["ledger", "--db", str(store.path), "--json"])
    (ledger,) = json.loads(out.output)
    assert not ledger["bounded"] and ledger["epsilon"] is None
    assert "no bound on the privacy spent (run 2: the noise is reproducible" in ledger["statement"]
    assert ledger["statement"].endswith("(deleted))")
    assert [(r["id"], r["counted"]) for r in ledger["runs"]] == [(1, "composed"), (seeded, "unbounded")]
    listed = CliRunner().invoke(cli, ["list", "--deleted", "--db", str(store.path)])
    assert listed.exit_code == 0 and "(no guarantee)" in listed.output, listed.output
    (record,) = json.loads(CliRunner().invoke(cli, ["list", "--deleted", "--db", str(store.path), "--json"]).output)
    assert record["no_guarantee"].startswith("the noise is reproducible from the published seed")


def test_an_infinite_epsilon_is_unbounded_and_strict_json(tmp_path):
    """A run of epsilon inf (a noise multiplier far too small): the ledger says it has no finite
    bound ("bounded": false, epsilon null), and every --json output is strict JSON ("Infinity")."""
    (ledger,) = dataset_ledgers([dpsgd(1, q=1.0, sigma=0.01, steps=1, epsilon=math.inf)], [])
    assert ledger.epsilon == math.inf and "no finite bound" in ledger.statement()
    body = ledger.to_json()
    assert body["bounded"] is False and body["epsilon"] is None
    runner = CliRunner()
    result = runner.invoke(cli, ["privacy", "dpsgd", "--sample-rate", "1", "--noise-multiplier", "0.01", "--steps", "1",
                                 "--delta", "1e-5", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output, parse_constant=lambda c: pytest.fail(f"bare {c}"))["epsilon"] == "Infinity"


def test_the_same_contents_under_two_names_are_one_ledger_and_names_alone_still_join():
    """Runs join when they share a name or a fingerprint, also through other runs; a run without a
    fingerprint (recorded before fingerprints were) joins by name only."""
    one = pld_epsilon(sample_rate=0.05, noise_multiplier=1.0, steps=100, delta=1e-5).value
    runs = [dpsgd(1, dataset="patients.csv", dataset_fingerprint="aa"),
            dpsgd(2, dataset="copy-of-patients.csv", dataset_fingerprint="aa"),
            dpsgd(3, dataset="copy-of-patients.csv", dataset_fingerprint="bb"),  # edited later, same name
            dpsgd(4, dataset="other.csv", dataset_fingerprint="cc"),
            dpsgd(5, dataset="patients.csv")]
    deleted = [{"id": 6, "name": "gone", "mechanism": "pate", "dataset": "renamed.csv", "dataset_fingerprint": "bb",
                "status": "finished", "epsilon": 2.0, "delta": 1e-6}]
    ledgers = {ledger.dataset: ledger for ledger in dataset_ledgers(runs, deleted)}
    assert set(ledgers) == {"patients.csv", "other.csv"}
    joined = ledgers["patients.csv"]
    assert [e.run_id for e in joined.entries] == [1, 2, 3, 5, 6]
    assert joined.also_named == ["copy-of-patients.csv", "renamed.csv"]
    assert joined.title == "patients.csv (the same data also as copy-of-patients.csv, renamed.csv)"
    four = pld_epsilon(sample_rate=0.05, noise_multiplier=1.0, steps=400, delta=1e-5).value
    assert joined.epsilon == pytest.approx(four + 2.0, rel=1e-6)  # four runs composed, the deleted one added
    assert joined.named("renamed.csv") and not joined.named("other.csv")
    assert ledgers["other.csv"].epsilon == pytest.approx(one, rel=1e-6) and ledgers["other.csv"].title == "other.csv"


def test_dpw_ledger_counts_a_copied_csv_file_with_the_original(tmp_path):
    """Real runs on a CSV file and on a copy of it under another name: one ledger, both runs composed;
    `--dataset` finds it by either name. A file with other contents stays apart."""
    from test_export_paths import train_in_store

    rng = np.random.default_rng(0)
    features = rng.normal(size=(300, 3))
    labels = (features[:, 0] + features[:, 1] > 0).astype(int)
    text = "a,b,c,label\n" + "\n".join(f"{a:.6f},{b:.6f},{c:.6f},{y}" for (a, b, c), y in zip(features, labels))
    original, copy, other = tmp_path / "patients.csv", tmp_path / "export-2026.csv", tmp_path / "other.csv"
    original.write_text(text + "\n")
    copy.write_bytes(original.read_bytes())
    other.write_text(text.replace("label\n", "label\n0.5,0.5,0.5,1\n", 1) + "\n")
    store = Store(tmp_path / "runs.sqlite")
    settings = dict(model="logistic", noise_multiplier=1.0, expected_batch_size=32, epochs=1, learning_rate=0.5)
    ids = [train_in_store(store, name=path.stem, dataset=str(path), **settings) for path in (original, copy, other)]
    rows = {run["id"]: run for run in store.list_runs()}
    assert rows[ids[0]]["dataset_fingerprint"] == rows[ids[1]]["dataset_fingerprint"] != rows[ids[2]]["dataset_fingerprint"]

    out = CliRunner().invoke(cli, ["ledger", "--db", str(store.path), "--dataset", str(copy), "--json"])
    assert out.exit_code == 0, out.output
    (joined,) = json.loads(out.output)
    assert joined["dataset"] == str(original) and joined["also_named"] == [str(copy)]
    assert [r["id"] for r in joined["runs"]] == ids[:2] and {r["counted"] for r in joined["runs"]} == {"composed"}
    text_out = CliRunner().invoke(cli, ["ledger", "--db", str(store.path)])
    assert f"{original} (the same data also as {copy}): 2 runs: together (ε = " in text_out.output
    assert f"{other}: 1 run: together" in text_out.output


def test_the_total_is_never_below_a_run_it_contains():
    """A run accounted by RDP states a larger epsilon than the PLD of its steps: both are upper bounds, but
    a total below one of its parts reads as an error, so the total takes the run's own figure (still an
    upper bound: any number above a valid bound is one)."""
    from engine import privacy

    rdp = privacy.dpsgd_epsilon(sample_rate=0.05, noise_multiplier=1.0, steps=100, delta=1e-5, accountant="rdp")
    pld_alone = pld_epsilon(sample_rate=0.05, noise_multiplier=1.0, steps=100, delta=1e-5).value
    assert rdp.accountant == "rdp" and rdp.value > pld_alone * 1.05
    runs = [dpsgd(1, epsilon=rdp.value, accountant="rdp"), dpsgd(2, q=0.001, sigma=5.0, steps=1, epsilon=0.01)]
    (ledger,) = dataset_ledgers(runs, [])
    assert ledger.composed_epsilon == pytest.approx(rdp.value, rel=1e-12)
    assert ledger.epsilon == pytest.approx(rdp.value, rel=1e-12)
    # a run accounted at a larger delta than the ledger's says nothing at the ledger's delta
    looser = [dpsgd(1, epsilon=rdp.value, delta=1e-3, accountant="rdp"), dpsgd(2, delta=1e-5)]
    (ledger,) = dataset_ledgers(looser, [], delta=1e-5)
    assert ledger.epsilon == pytest.approx(
        pld_epsilon(sample_rate=0.05, noise_multiplier=1.0, steps=200, delta=1e-5).value, rel=1e-6)
