"""`dpw`: one-line errors, JSON outputs, fast privacy and registry commands, checks before a run is stored
(the README's commands: tests/test_readme.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from engine import privacy
from engine.cli import cli
from engine.config import RunConfig
from engine.store import Store

REPO = Path(__file__).resolve().parents[2]


def dpw(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=600, **kwargs)


def test_privacy_dpsgd_json_matches_the_library_and_does_not_import_torch():
    code = (
        "import sys; from engine.cli import main; sys.argv=['dpw','privacy','dpsgd','--sample-rate','0.01',"
        "'--noise-multiplier','1.1','--steps','1000','--delta','1e-5','--json'];\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    expected = privacy.dpsgd_epsilon(sample_rate=0.01, noise_multiplier=1.1, steps=1000, delta=1e-5)
    assert result == {"epsilon": expected.value, "delta": 1e-5, "accountant": "pld"}


@pytest.mark.parametrize("command, first_name", [("datasets", "mnist"), ("models", "mnist_cnn"), ("settings", "name")])
def test_registry_listings_answer_without_importing_torch(command, first_name):
    code = (
        f"import sys; from engine.cli import main; sys.argv=['dpw', {command!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'torchvision', 'sklearn') if m in sys.modules]\n"
        "assert not heavy, f'imported {heavy}'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == first_name


def test_dpw_settings_lists_every_config_field_with_its_default_and_range():
    from engine.config import config_fields

    listed = json.loads(CliRunner().invoke(cli, ["settings", "--json"]).output)
    assert [row["name"] for row in listed] == [name for name, _, _ in config_fields()]
    delta = next(row for row in listed if row["name"] == "delta")
    assert delta["allowed"] == "a number > 0 and < 1" and delta["default"] == 1e-5
    one = CliRunner().invoke(cli, ["settings", "delta"]).output
    assert one.startswith("delta = 1e-05    (a number > 0 and < 1") and "1/N" in one
    unknown = CliRunner().invoke(cli, ["settings", "sigma"])
    assert unknown.exit_code == 1 and "no setting named 'sigma'" in unknown.output


def test_privacy_calibrate_json_round_trips():
    result = CliRunner().invoke(cli, ["privacy", "calibrate", "--sample-rate", "0.01", "--steps", "1000",
                                      "--epsilon", "2", "--delta", "1e-5", "--json"])
    assert result.exit_code == 0, result.output
    sigma = json.loads(result.output)["noise_multiplier"]
    eps = privacy.dpsgd_epsilon(sample_rate=0.01, noise_multiplier=sigma, steps=1000, delta=1e-5).value
    assert eps <= 2.0
    assert privacy.dpsgd_epsilon(sample_rate=0.01, noise_multiplier=sigma - 0.01, steps=1000, delta=1e-5).value > 2.0


def test_privacy_rdp_accountant_is_selectable():
    result = CliRunner().invoke(cli, ["privacy", "dpsgd", "--sample-rate", "0.01", "--noise-multiplier", "1.1",
                                      "--steps", "1000", "--delta", "1e-5", "--accountant", "rdp", "--json"])
    assert json.loads(result.output)["accountant"] == "rdp"


def test_privacy_dpsgd_of_noise_too_small_for_any_bound_answers_inf_and_says_so():
    """Noise multiplier 1e-9 printed an OverflowError traceback (engine.privacy.pld)."""
    args = ["privacy", "dpsgd", "--sample-rate", "0.01", "--noise-multiplier", "1e-9", "--steps", "10", "--delta", "1e-5"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0 and result.output.startswith("epsilon = inf at delta = 1e-05 (pld): this noise bounds")
    assert json.loads(CliRunner().invoke(cli, args + ["--json"]).output)["epsilon"] == "Infinity"


@pytest.mark.parametrize(
    "args, words",
    [
        (["privacy", "dpsgd", "--sample-rate", "1.5", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"],
         ["--sample-rate", "1.5"]),
        (["privacy", "dpsgd", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--delta", "1"],
         ["--delta", "1"]),
        (["show", "999"], ["no run with id 999"]),
        # the privacy commands take the ranges a run config takes
        (["privacy", "dpsgd", "--sample-rate", "0.1", "--noise-multiplier", "2000", "--steps", "10", "--delta", "1e-5"],
         ["--noise-multiplier: 2000 is out of range; allowed: a number > 0 and <= 1000"]),
        (["privacy", "calibrate", "--sample-rate", "0.1", "--steps", "10", "--epsilon", "500", "--delta", "1e-5"],
         ["--epsilon: 500 is out of range; allowed: a number > 0 and <= 100"]),
        # an unset shell variable: Path("") is the current folder, where it exported
        (["export", "1", "--out", ""], ["--out: is empty; give a path"]),
        (["report", "1", "--out", " "], ["--out: is empty; give a path"]),
    ],
)
def test_user_errors_are_one_line_without_traceback(tmp_path, args, words):
    Store(tmp_path / "r.sqlite").close()
    result = CliRunner().invoke(cli, [*args, *(["--db", str(tmp_path / "r.sqlite")] if args[0] == "show" else [])])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.output


def test_a_run_named_twice_is_deleted_once(tmp_path):
    """`dpw delete 1 1 --yes` deleted run 1, then failed on the second 1 with exit status 1."""
    store = Store(tmp_path / "r.sqlite")
    store.create_run(RunConfig(name="twice", dataset="digits", noise_multiplier=1.0))
    result = CliRunner().invoke(cli, ["delete", "1", "twice", "--yes", "--db", str(store.path)])
    assert result.exit_code == 0 and result.output == "deleted run 1 (twice)\n"


def test_commands_taking_a_run_read_minus_one_as_the_newest_and_still_refuse_unknown_options(tmp_path):
    """`dpw show -1` was refused as the unknown option -1."""
    store = Store(tmp_path / "r.sqlite")
    store.create_run(RunConfig(name="older", noise_multiplier=1.0))
    store.create_run(RunConfig(name="newest", noise_multiplier=1.0))
    db = ["--db", str(store.path)]
    shown = CliRunner().invoke(cli, ["show", "-1", "--json", *db])
    assert shown.exit_code == 0 and json.loads(shown.output)["run"]["name"] == "newest"
    tagged = CliRunner().invoke(cli, ["tag", "-2", "kept", *db])
    assert tagged.exit_code == 0 and "run 1 (older) tags: kept" in tagged.output
    noted = CliRunner().invoke(cli, ["note", "-1", *db, "--", "-x made it worse"])
    assert noted.exit_code == 0 and store.get_run(2)["notes"] == "-x made it worse"
    for args, unknown in ((["show", "-1", "--jsn"], "--jsn"), (["delete", "2", "--yse"], "--yse"),
                          (["show", "-x"], "-x"), (["tag", "1", "--baseline"], "--baseline"),
                          (["report", "-1", "--out", "-r.html", "--bogus"], "--bogus")):  # -r.html: --out's
        refused = CliRunner().invoke(cli, [*args, *db])
        assert refused.exit_code == 2 and f"No such option '{unknown}'" in refused.output, args
    assert len(store.list_runs()) == 2 and store.get_run(1)["tags"] == ["kept"]


def test_dpw_rename_gives_the_newest_run_another_name(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    store.create_run(RunConfig(name="quickstart", noise_multiplier=1.0))
    result = CliRunner().invoke(cli, ["rename", "-1", "digits, lr 0.5", "--db", str(store.path)])
    assert result.exit_code == 0 and result.output == "run 1 renamed: quickstart -> digits, lr 0.5\n"
    assert store.find_run("digits, lr 0.5")["id"] == 1
    refused = CliRunner().invoke(cli, ["rename", "1", " ", "--db", str(store.path)])
    assert refused.exit_code == 1 and refused.output == "error: name: must not be empty\n"


def test_bad_config_file_is_one_line_naming_the_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('dataset = "digits"\nnoise_multiplier = -2.0\n')
    result = CliRunner().invoke(cli, ["run", str(bad), "--db", str(tmp_path / "r.sqlite")])
    assert result.exit_code == 1
    assert result.output.strip().startswith("error: noise_multiplier: -2 is out of range")
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("mechanism,setting,readers", [
    ("pate", "target_epsilon = 3.5", "'dpsgd'"), ("pate", "noise_multiplier = 0.8", "'dpsgd'"),
    ("none", "epsilon_budget = 2.5", "'dpsgd' and 'pate'"), ("dpsgd", "num_teachers = 10", "'pate'")])
def test_a_setting_the_runs_mechanism_does_not_read_is_named_before_it_runs(tmp_path, mechanism, setting, readers):
    """A PATE run with target_epsilon = 3.5 trained at the epsilon its own settings give, without a word."""
    config = tmp_path / "c.toml"
    noise = "noise_multiplier = 1.0\n" if mechanism == "dpsgd" else ""
    config.write_text(f'dataset = "{tmp_path / "missing.csv"}"\nmechanism = "{mechanism}"\n{noise}{setting}\n')
    ran = dpw("run", str(config), "--db", str(tmp_path / "r.sqlite"))
    assert (f"warning: {setting} has no effect: only {readers} runs read it, and this run's mechanism is "
            f"'{mechanism}'") in ran.stderr
    assert ran.returncode == 1 and "missing.csv" in ran.stderr  # then the run goes on as before (here: no data)


@pytest.mark.parametrize("noise, shown", [('noise_multiplier = 1e-200', "ε = inf"),
                                          ('mechanism = "pate"\nnum_teachers = 5\nteacher_epochs = 1\nstudent_epochs = 1\n'
                                           'aggregator = "lnmax"\nlaplace_scale = 1e-300\nnum_queries = 20', "ε = 4.001e+301")])  # 4.0000…e+301, rounded up
def test_noise_too_small_to_bound_anything_runs_to_an_epsilon_that_says_so(tmp_path, noise, shown):
    """noise_multiplier = 1e-200 was a traceback (negative RDP from an overflow); laplace_scale = 1e-300 an
    OverflowError, and its epsilon would have printed in 302 digits."""
    config = tmp_path / "tiny.toml"
    config.write_text(f'dataset = "digits"\nmodel = "mlp"\nepochs = 1\nmembership_audit = false\n{noise}\n')
    ran = dpw("run", str(config), "--db", str(tmp_path / "r.sqlite"))
    assert ran.returncode == 0 and "Traceback" not in ran.stderr and "Warning" not in ran.stderr, ran.stderr
    assert f"privacy        {shown}, δ = 1e-05" in ran.stdout


def test_run_list_and_show_on_a_tiny_real_run(tmp_path):
    config = tmp_path / "digits.toml"
    config.write_text('name = "tiny"\ndataset = "digits"\nnoise_multiplier = 1.0\nexpected_batch_size = 64\n'
                      'epochs = 1\nlearning_rate = 0.5\n')
    db = str(tmp_path / "r.sqlite")
    ran = dpw("run", str(config), "--db", db)
    assert ran.returncode == 0, ran.stderr
    assert "run 1 (tiny): finished" in ran.stdout and "has no effect" not in ran.stderr
    assert re.search(r"ε = \d+\.\d+, δ = 1e-05 \(pld\)", ran.stdout)

    listed = json.loads(dpw("list", "--db", db, "--json").stdout)
    assert len(listed) == 1
    row = listed[0]
    assert set(row) == {"id", "name", "mechanism", "dataset", "status", "epsilon", "delta", "budget", "accuracy",
                        "accountant", "guarantee", "tags", "notes"}
    assert row["accountant"] == "pld" and row["guarantee"] is True
    assert row["status"] == "finished" and row["epsilon"] > 0 and 0 <= row["accuracy"] <= 1

    shown = json.loads(dpw("show", "tiny", "--db", db, "--json").stdout)
    assert shown["run"]["id"] == 1 and shown["rows"]["privacy"] > 0 and shown["artifacts"]
    text = dpw("show", "tiny", "--db", db).stdout  # the split it drew; only the settings in effect
    assert "  data split     per-example split: test_fraction=0.2, seed=0\n" in text
    assert "  test_fraction = 0.2\n" in text and "  seed = 0\n" in text
    assert "label_column" not in text and "momentum" not in text and "classes" not in text

    artifacts = tmp_path / "r-artifacts" / "run-1"  # named after the store, r.sqlite
    assert artifacts.is_dir()
    kept = dpw("delete", "tiny", "--db", db, input="n\n")  # asks first; "n" keeps it
    assert kept.returncode != 0 and "Delete run 1 (tiny, finished)" in kept.stdout
    assert len(json.loads(dpw("list", "--db", db, "--json").stdout)) == 1
    deleted = dpw("delete", "tiny", "--db", db, "--yes")
    assert deleted.returncode == 0 and "deleted run 1 (tiny)" in deleted.stdout
    assert json.loads(dpw("list", "--db", db, "--json").stdout) == [] and not artifacts.exists()


def test_the_summary_line_of_a_kept_audit_says_what_its_check_could_see():
    from engine.cli import membership_line

    theory = {"above_theory": False, "confidence": 0.95, "resolution": {"fpr": 0.01, "tpr": 0.2751}}
    summary = {"membership_audit": {"mia": {"auc": 0.488, "members": 359, "nonmembers": 359,
                                            "tpr_at_fpr": {"0.01": 0.0084, "0.001": None}, "theory": theory}}}
    assert membership_line(summary, 1) == (
        "loss attack AUC 0.488, TPR 0.84% at FPR 1% (not significantly above the guarantee's curve, where only a "
        "TPR above 27.5% at FPR 1% would have been flagged; a lower bound on the risk, not a confirmation; from "
        "private data, kept locally: dpw audit 1)")
    summary["membership_audit"]["mia"].update(members=60, nonmembers=60)
    assert "TPR at FPR 1% not measurable with 60 non-members" in membership_line(summary, 1)


def test_engine_never_imports_qt():
    code = (
        "import sys, pkgutil, importlib, engine\n"
        "for m in pkgutil.walk_packages(engine.__path__, 'engine.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = [m for m in sys.modules if m.startswith(('PySide6', 'PyQt', 'pyqtgraph'))]\n"
        "assert not bad, bad\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr


# ---- checks before a run is stored ----------------------------------------------------------------
MNIST_FILE_NAMES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                    "t10k-labels-idx1-ubyte.gz")


def offline_env(data_dir: Path) -> dict[str, str]:
    """An empty data folder, and every HTTP(S) request sent to a closed local port: nothing can download."""
    import os

    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "all_proxy")}
    closed = "http://127.0.0.1:9"
    env.update(DPW_DATA_DIR=str(data_dir), http_proxy=closed, https_proxy=closed, HTTP_PROXY=closed,
               HTTPS_PROXY=closed)
    return env


def stored_runs(db: Path) -> list:
    return json.loads(dpw("list", "--db", str(db), "--json").stdout) if db.exists() else []


@pytest.mark.parametrize(
    "config_text, words",
    [
        ('dataset = "digits"\nnoise_multiplier = 1.1\ndelta = 0.01\n', ["delta: 0.01 is not below 1/N", "N = 1441"]),
        ('dataset = "breast-cancer"\nmodel = "mnist_cnn"\nnoise_multiplier = 1.1\ndelta = 1e-5\n',
         ["model 'mnist_cnn' does not fit input shape (30,)", "mlp, logistic"]),
        ('dataset = "no-such-data.csv"\nnoise_multiplier = 1.1\n', ["no-such-data.csv: file not found"]),
        # it "finished" at step 0 with the untrained model, which could be exported
        ('dataset = "digits"\nnoise_multiplier = 1.0\nepsilon_budget = 1e-6\n',
         ["epsilon_budget: 1e-06 allows no training step", "raise epsilon_budget"]),
    ],
)
def test_config_that_cannot_train_prints_one_line_and_stores_no_run(tmp_path, config_text, words):
    config = tmp_path / "bad.toml"
    config.write_text(config_text)
    db = tmp_path / "r.sqlite"
    ran = dpw("run", str(config), "--db", str(db))
    assert ran.returncode == 1
    assert ran.stdout == "" and len(ran.stderr.strip().splitlines()) == 1, ran.stderr
    assert ran.stderr.startswith("error: ") and "Traceback" not in ran.stderr
    for word in words:
        assert word in ran.stderr
    assert not db.exists()  # no store file either: the check runs before a new store is created


def processes_marked(marker: str) -> list[int]:
    """The processes whose environment holds `marker` (a test's own children, whatever the other tests run)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads processes' environments from /proc")
def test_a_refused_config_leaves_no_runner_behind(tmp_path):
    """dpw run starts the runner on standby while it checks the config: a config refused by the check
    ends that runner too, at once, and creates no store."""
    import uuid

    marker = f"DPW_TEST_MARK={uuid.uuid4().hex}"
    config = tmp_path / "bad.toml"
    config.write_text('dataset = "digits"\nnoise_multiplier = 1.1\ndelta = 0.01\n')
    ran = dpw("run", str(config), "--db", str(tmp_path / "r.sqlite"),
              env={**os.environ, marker.split("=")[0]: marker.split("=")[1]})
    assert ran.returncode == 1 and "delta: 0.01 is not below 1/N" in ran.stderr
    assert processes_marked(marker) == [] and not (tmp_path / "r.sqlite").exists()


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal")
def test_dpw_run_says_it_checks_the_data_on_a_terminal_and_nowhere_else(tmp_path):
    """Reading a large dataset for the check took seconds with nothing said; a pipe (scripts, these
    tests) still gets only the command's output and errors."""
    import pty

    config = tmp_path / "bad.toml"
    config.write_text('dataset = "digits"\nnoise_multiplier = 1.1\ndelta = 0.01\n')
    args = [sys.executable, "-m", "engine.cli", "run", str(config), "--db", str(tmp_path / "r.sqlite")]
    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, cwd=REPO)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=300) == 1
    lines = seen.decode().replace("\r", "").splitlines()
    assert lines[0] == "checking bad.toml against its data…" and "delta: 0.01 is not below 1/N" in lines[-1]
    piped = dpw("run", str(config), "--db", str(tmp_path / "r.sqlite"))
    assert "checking" not in piped.stderr and piped.stderr.startswith("error: delta: 0.01")


def test_a_runner_on_standby_that_is_handed_no_run_ends_quietly(tmp_path):
    ended = subprocess.run([sys.executable, "-m", "engine.runner", "--standby"], input="", capture_output=True,
                           text=True, cwd=tmp_path, timeout=300)
    assert ended.returncode == 0 and ended.stdout == "" and ended.stderr == ""
    assert list(tmp_path.iterdir()) == []  # it opened no store


def test_a_runner_that_died_on_standby_is_replaced_and_its_run_trains(tmp_path, capsys):
    """Killed, or out of memory while it checked the config: the run is not failed for it."""
    from engine.cli_follow import StandbyRunner, follow_runner

    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(name="replaced", dataset="digits", noise_multiplier=1.0, epochs=1,
                                        membership_audit=False))
    standby = StandbyRunner()
    standby.proc.kill()
    standby.proc.wait()
    assert follow_runner(store.path, run_id, store=store, standby=standby, as_json=True) == "finished"
    assert store.get_run(run_id)["status"] == "finished"


def test_config_that_cannot_train_stores_no_run_in_an_existing_store(tmp_path):
    from engine.store import Store

    db = tmp_path / "r.sqlite"
    Store(db)
    config = tmp_path / "bad.toml"
    config.write_text('dataset = "digits"\nnoise_multiplier = 1.1\ndelta = 0.01\n')
    ran = dpw("run", str(config), "--db", str(db))
    assert ran.returncode == 1 and "delta: 0.01 is not below 1/N" in ran.stderr
    assert db.exists() and stored_runs(db) == []


def test_missing_mnist_offline_says_which_files_go_where_and_stores_no_run(tmp_path):
    config = tmp_path / "mnist.toml"
    config.write_text('dataset = "mnist"\nnoise_multiplier = 1.1\n')
    db = tmp_path / "r.sqlite"
    ran = dpw("run", str(config), "--db", str(db), env=offline_env(tmp_path / "data"))
    assert ran.returncode == 1 and len(ran.stderr.strip().splitlines()) == 1, ran.stderr
    assert f"not found in {tmp_path / 'data' / 'mnist'}" in ran.stderr
    assert all(name in ran.stderr for name in MNIST_FILE_NAMES)
    assert "dpw run --download" in ran.stderr
    assert stored_runs(db) == []


def test_download_flag_tries_to_fetch_mnist_and_offline_says_where_to_put_the_files(tmp_path):
    config = tmp_path / "mnist.toml"
    config.write_text('dataset = "mnist"\nnoise_multiplier = 1.1\n')
    db = tmp_path / "r.sqlite"
    folder = tmp_path / "data" / "mnist"
    ran = dpw("run", str(config), "--db", str(db), "--download", env=offline_env(tmp_path / "data"))
    assert ran.returncode == 1, ran.stderr
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: mnist: download into {folder} failed (URLError")
    assert all(name in last for name in MNIST_FILE_NAMES) and f"in {folder}" in last
    assert stored_runs(db) == []


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"]])
def test_help_shows_the_quick_start_and_no_developer_folder(args):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0
    assert "dpw run resources/examples/quickstart.toml" in result.output
    assert "../shared" not in result.output


def test_a_relative_db_keeps_its_models_findable_from_any_folder(tmp_path):
    """`dpw run --db rel/runs.sqlite` records the saved model by its absolute path, so `dpw export` works
    from another folder (a relative path was stored, and the model read as missing elsewhere)."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    config = project / "tiny.toml"
    config.write_text('name = "tiny"\ndataset = "breast-cancer"\nmodel = "logistic"\nnoise_multiplier = 1.0\n'
                      'epochs = 1\nexpected_batch_size = 32\ndelta = 1e-4\nmembership_audit = false\n',
                      encoding="utf-8")
    env = {"PYTHONPATH": str(REPO)}
    ran = subprocess.run([sys.executable, "-m", "engine.cli", "run", "tiny.toml", "--db", "rel/runs.sqlite"],
                         capture_output=True, text=True, cwd=project, timeout=600, env={**os.environ, **env})
    assert ran.returncode == 0, ran.stderr
    exported = subprocess.run([sys.executable, "-m", "engine.cli", "export", "1", "--db",
                               str(project / "rel" / "runs.sqlite"), "--out", "out"],
                              capture_output=True, text=True, cwd=elsewhere, timeout=600, env={**os.environ, **env})
    assert exported.returncode == 0, exported.stderr
    assert (elsewhere / "out" / "model.safetensors").is_file()


def test_the_progress_bar_shows_the_epsilon_the_run_reports_not_the_live_bound():
    """DP-SGD streams a looser live RDP bound every step besides its reported accountant (here pld), and PATE
    its data-dependent epsilon (not publishable) besides the data-independent one: the bar shows only the
    plan's accountant, so it never reads above a target the run meets, nor a number not to publish."""
    from engine.cli_follow import ProgressDisplay

    bar = ProgressDisplay()
    bar.handle({"type": "plan", "run_id": 1, "num_train": 10, "model": "mlp", "device": "cpu", "steps": 3,
                "sample_rate": 0.1, "noise_multiplier": 1.0, "accountant": "pld"})
    bar.handle({"type": "privacy", "step": 1, "epsilon": 1.119, "delta": 1e-5, "accountant": "rdp"})
    assert bar.epsilon is None
    bar.handle({"type": "privacy", "step": 1, "epsilon": 0.98, "delta": 1e-5, "accountant": "pld"})
    bar.handle({"type": "privacy", "step": 2, "epsilon": 1.2, "delta": 1e-5, "accountant": "rdp"})
    assert bar.epsilon == 0.98 and bar._label() == "ε=0.980"
    pate = ProgressDisplay()
    pate.handle({"type": "plan", "accountant": "pate-di", "mechanism": "pate", "run_id": 2, "num_train": 10,
                 "num_teachers": 5, "teacher_model": "mlp", "shard_size": 2, "aggregator": "gnmax", "steps": 9,
                 "model": "mlp", "device": "cpu"})
    pate.handle({"type": "privacy", "step": 9, "epsilon": 3.0, "delta": 1e-5, "accountant": "pate-di"})
    pate.handle({"type": "privacy", "step": 9, "epsilon": 0.4, "delta": 1e-5, "accountant": "pate-dd"})
    assert pate.epsilon == 3.0


def test_a_failed_run_states_its_error_once_in_the_summary(tmp_path):
    """`dpw run` ends with the run's summary, which states the error and its hint: the live display
    does not print the same error a line above it."""
    rows = ["f1,f2,label"] + [f"{1e30 * (-1) ** i},{1e30 * (1 - i % 3)},{i % 2}" for i in range(200)]
    (tmp_path / "huge.csv").write_text("\n".join(rows) + "\n")
    config = tmp_path / "diverges.toml"
    config.write_text(f'name = "diverges"\ndataset = "{tmp_path / "huge.csv"}"\nmechanism = "pate"\nnum_teachers = 2\n'
                      'teacher_epochs = 2\nteacher_batch_size = 16\nteacher_model = "logistic"\naggregator = "gnmax"\n'
                      'gnmax_sigma = 1.0\n'
                      'learning_rate = 1000.0\nnum_queries = 20\ndelta = 1e-4\nstudent_epochs = 1\n')
    ran = dpw("run", str(config), "--db", str(tmp_path / "r.sqlite"))
    assert ran.returncode == 1
    assert "run 1 (diverges): failed" in ran.stdout
    assert "  error          the teachers' training diverged" in ran.stdout
    assert "  hint           lower the learning_rate" in ran.stdout
    assert (ran.stdout + ran.stderr).count("the teachers' training diverged") == 1, ran.stderr


@pytest.mark.parametrize("votes, words", [
    ("empty", "holds no query (shape (0, 3)); give one row of counts per query"),
    ("huge", "a query has 1,000,000,000,000,005 votes, more than the 100,000 teachers a run may have"),
])
def test_privacy_pate_refuses_votes_no_run_could_give_in_one_line(tmp_path, votes, words):
    import numpy as np

    path = tmp_path / f"{votes}.npy"
    np.save(path, np.zeros((0, 3), int) if votes == "empty" else np.array([[10**15, 0], [5, 10**15]]))
    result = CliRunner().invoke(cli, ["privacy", "pate", "--votes", str(path), "--mechanism", "gnmax", "--sigma", "40",
                                      "--delta", "1e-5", "--release"])
    assert result.exit_code != 0 and words in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("option, words", [
    (["--release-seed", "-1"], "--release-seed: -1 is out of range; allowed [0, 9223372036854775807]"),
    (["--answered", "ANSWERED"], "--answered ANSWERED: expected a boolean array (or 0/1) saying which queries were "
                                 "answered; found the value 2"),
])
def test_privacy_pate_names_the_option_it_refuses(tmp_path, option, words):
    """They said only "expected non-negative integer" and "answered must be a boolean mask"."""
    import numpy as np

    np.save(tmp_path / "votes.npy", np.array([[9, 1], [4, 6], [10, 0]]))
    np.save(tmp_path / "answered.npy", np.array([1, 0, 2]))
    option = [str(tmp_path / "answered.npy") if o == "ANSWERED" else o for o in option]
    result = CliRunner().invoke(cli, ["privacy", "pate", "--votes", str(tmp_path / "votes.npy"), "--mechanism", "gnmax",
                                      "--sigma", "4", "--delta", "1e-5", *option])
    expected = words.replace("ANSWERED", str(tmp_path / "answered.npy"))
    assert result.exit_code == 1 and result.output == f"error: {expected}\n"


def test_privacy_states_the_delta_it_was_given():
    """--delta 0.9999999 was printed as delta = 1."""
    result = CliRunner().invoke(cli, ["privacy", "dpsgd", "--sample-rate", "0.01", "--noise-multiplier", "1",
                                      "--steps", "100", "--delta", "0.9999999"])
    assert result.exit_code == 0 and "at delta = 0.9999999 (pld)" in result.output


def test_a_command_that_reads_never_creates_a_store_at_a_mistyped_path(tmp_path):
    typo = tmp_path / "typo" / "runs.sqltie"
    for args in (["list"], ["ledger"], ["show", "1"]):
        result = CliRunner().invoke(cli, [*args, "--db", str(typo)])
        assert result.exit_code == 1 and f"no store at {typo}" in result.output, result.output
    assert not (tmp_path / "typo").exists()


def test_a_command_that_reads_refuses_an_empty_file_and_leaves_it_empty(tmp_path):
    """A 0-byte file (e.g. made by `touch`) is not a store: SQLite would quietly write a new store into
    it; the window refused it, the CLI's read commands now do too."""
    empty = tmp_path / "runs.sqlite"
    empty.touch()
    for args in (["list"], ["ledger"], ["show", "1"], ["report", "1", "--out", str(tmp_path / "r")]):
        result = CliRunner().invoke(cli, [*args, "--db", str(empty)])
        assert result.exit_code == 1, (args, result.output)
        assert f"{empty} is an empty file (0 bytes), not a DP Workbench store" in result.output, result.output
        assert "Traceback" not in result.output
    assert empty.stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["runs.sqlite"]


def test_ctrl_c_before_training_starts_is_one_line_and_exit_status_130(tmp_path):
    """Ctrl-C while the config is checked against its data (before any runner): click printed a blank
    line and 'Aborted!'; now one line, and the shell's status for an interrupt."""
    import signal
    import time

    # 1,000,000 rows: reading them takes seconds, so the interrupt lands while the data is checked,
    # after torch is imported (an interrupt inside its import aborts it) and long before any runner starts.
    rows = "\n".join(f"{i % 7},{i % 5},{i % 2}" for i in range(1_000_000))
    (tmp_path / "big.csv").write_text("x,y,label\n" + rows + "\n")
    config = tmp_path / "c.toml"
    config.write_text(f'dataset = "{tmp_path / "big.csv"}"\nnoise_multiplier = 1.0\nepochs = 1\ndelta = 1e-7\n')
    marker = f"{time.time_ns()}-{os.getpid()}"
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "run", str(config), "--db", str(tmp_path / "r.sqlite")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "DPW_TEST_MARK": marker},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(3.0)  # torch imported, the CSV being read
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert err == "error: interrupted (Ctrl-C) before any training started\n" and "Aborted" not in out + err
    assert processes_marked(f"DPW_TEST_MARK={marker}") == []  # the runner on standby ended with it


def test_an_error_the_store_could_not_record_is_printed_by_dpw_run(tmp_path, capsys):
    """On a disk that filled up mid-run the runner's error ("the disk holding ... is full") reached
    `dpw run` only as an event, which it hid because the summary would state the error: the summary,
    read from the store that could not record it, said only "running"."""
    import io

    from engine.cli_follow import _render_runner
    from engine.config import RunConfig
    from engine.events import encode, make_event
    from engine.store import Store

    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(name="full", noise_multiplier=1.0))
    error = make_event("error", run_id, 1.0, message="the disk holding runs.sqlite is full", hint="free some space")

    class Runner:
        pid = os.getpid()
        stdout = io.StringIO(encode(error) + "\n")

        def wait(self):
            return 1

    _render_runner(Runner(), run_id, as_json=False, store=store, summary_follows=True)
    assert "error: the disk holding runs.sqlite is full — free some space" in capsys.readouterr().err
    store.update_run(run_id, status="failed", error="the disk holding runs.sqlite is full")
    Runner.stdout = io.StringIO(encode(error) + "\n")
    _render_runner(Runner(), run_id, as_json=False, store=store, summary_follows=True)
    assert "error:" not in capsys.readouterr().err  # recorded: the summary states it, once


@pytest.mark.parametrize("status, exit_code", [("finished", None), ("failed", 1)])
def test_dpw_run_says_so_when_its_run_was_deleted_as_it_ended(tmp_path, capsys, status, exit_code):
    """`dpw delete` the moment a run finished, while its runner still ran the membership audit: dpw run
    printed only "error: no run with id 1" for a run that had finished."""
    from engine.cli import end_of_run

    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(name="gone", noise_multiplier=1.0))
    store.update_run(run_id, status=status)
    store.delete_run(run_id)
    if exit_code is None:
        end_of_run(store, run_id, status, as_json=False)
    else:
        with pytest.raises(SystemExit) as ended:
            end_of_run(store, run_id, status, as_json=False)
        assert ended.value.code == exit_code
    assert f"run {run_id} ended ({status}) and was deleted meanwhile" in capsys.readouterr().out
    with pytest.raises(Exception, match="no run with id 99"):
        end_of_run(store, 99, "finished", as_json=False)  # never a run here: still the plain error


def test_dpw_show_names_its_time_the_training_time(tmp_path, capsys):
    """The window shows the wall time (start to end) beside it: one label each, never a bare 'time'."""
    from engine.cli import print_summary

    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(RunConfig(name="timed", noise_multiplier=1.0))
    store.update_run(run_id, status="finished", summary={"seconds": 8.6, "samples_per_second": 1673})
    print_summary(store.get_run(run_id))
    assert "  training time  8.6 s (1673 samples/s)" in capsys.readouterr().out
