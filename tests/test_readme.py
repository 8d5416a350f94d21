"""The README is true: the commands it shows exist, the ones that need no network run as written on
a fresh machine (empty data folder, new store, no ../shared), and every example config it names
exists and passes the checks a run goes through before it is stored."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from engine.cli import cli
from engine.config import RunConfig

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
# Run configs; study-*.toml are tuning studies (engine.study_config), checked in tests/engine/test_study.py.
EXAMPLES = sorted(p for p in (REPO / "resources" / "examples").glob("*.toml") if not p.name.startswith("study-"))
QUICK_START = "dpw run resources/examples/quickstart.toml"


def bash_blocks(heading: str | None = None) -> list[str]:
    """The ```bash blocks of the README, or of one `## heading` section."""
    text = README
    if heading is not None:
        text = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", text, re.S)


def dpw_lines(heading: str | None = None) -> list[str]:
    lines = [line.split("#")[0].strip() for block in bash_blocks(heading) for line in block.splitlines()]
    return [line for line in lines if line.startswith("dpw ")]


def test_every_dpw_command_in_the_readme_names_real_commands_and_options():
    lines = dpw_lines()
    assert lines, "the README shows no dpw command"
    for line in lines:
        words = shlex.split(line)[1:]
        command = cli
        while isinstance(command, click.Group):
            assert words and words[0] in command.commands, f"unknown command in README: {line}"
            command = command.commands[words.pop(0)]
        options = {o for p in command.params for o in getattr(p, "opts", [])}
        for word in words:
            if word.startswith("--"):
                assert word in options, f"README uses unknown option {word} in: {line}"


def test_the_quick_start_comes_first_and_needs_no_files():
    assert README.index("## Quick start") < README.index("## Install") < README.index("## Test")
    assert QUICK_START in dpw_lines("Quick start")
    config = RunConfig.load_toml(REPO / "resources" / "examples" / "quickstart.toml")
    assert config.dataset in ("digits", "breast-cancer") and not config.allow_download
    assert "../shared" not in README.split("## Test", 1)[0], "a user has no ../shared"


def test_readme_install_uses_a_virtual_environment_and_ci_runs_the_same_commands():
    install = bash_blocks("Quick start")[0]
    assert "python3 -m venv .venv && .venv/bin/pip install -e \".[dev]\"" in install
    test_command = bash_blocks("Test")[0].strip()
    ci = (REPO / ".ci" / "run").read_text()
    ci_lines = [line.strip() for line in ci.splitlines()]
    assert "python3 -m venv .venv" in ci_lines and '.venv/bin/pip install -q -e ".[dev]"' in ci_lines
    assert ci_lines[-1] == test_command, "CI must end with the README's test command"
    assert QUICK_START in ci, "CI must run the README's quick-start command"
    packages = set(re.search(r"apt-get install (.*)", install).group(1).split())
    ci_packages = set(re.search(r"apt-get install -y -qq --no-install-recommends \\\n(.*?)>/dev/null", ci,
                                re.S).group(1).replace("\\", " ").split())
    assert packages <= ci_packages, f"README names packages CI does not install: {packages - ci_packages}"


def test_every_path_the_readme_names_exists():
    paths = set(re.findall(r"(?<![\w./~-])((?:resources|docs|tests|engine|workbench|packaging)/[\w./-]*\w/?)", README))
    assert paths
    for path in paths:
        assert (REPO / path).exists(), f"README names {path}, which does not exist"
    for name in re.findall(r"`([\w-]+\.toml)`", README):
        assert (REPO / "resources" / "examples" / name).is_file(), f"README names the example {name}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_valid_named_in_the_readme_and_points_nowhere_private(path):
    config = RunConfig.load_toml(path)
    assert config.name == path.stem
    assert f"`{path.name}`" in README, f"the README does not describe {path.name}"
    assert "../shared" not in path.read_text()


def shortened(config: RunConfig) -> RunConfig:
    """The same example with a few hundred examples and one pass: every check, a fraction of the work."""
    changes = {"train_subset": 600} if config.dataset == "mnist" else {}
    if config.mechanism == "pate":  # ten teachers; Confident GNMax's threshold is a vote count, scaled with them
        teachers = min(config.num_teachers, 10)
        changes.update(num_teachers=teachers, threshold=min(config.threshold, 0.8 * teachers), teacher_epochs=1,
                       num_queries=20, public_pool_size=200, student_epochs=1)
    else:
        changes.update(epochs=1, expected_batch_size=min(config.expected_batch_size, 64))
        if config.epsilon_budget is not None or config.target_epsilon is not None:
            changes.update(target_epsilon=None, epsilon_budget=None, noise_multiplier=1.1)
    return config.replace(**changes)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_a_shortened_version_of_every_example_trains(path, mnist_dir, tmp_path):
    from engine.runner import execute
    from engine.store import Store

    config = shortened(RunConfig.load_toml(path)).replace(data_dir=str(mnist_dir.parent))
    store = Store(tmp_path / "runs.sqlite")
    run_id = store.create_run(config)
    assert execute(store, run_id, stream=open(os.devnull, "w")) == "finished", store.get_run(run_id).get("error")
    run = store.get_run(run_id)
    assert 0.0 <= run["accuracy"] <= 1.0


def fresh_machine(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the examples with no ../shared beside it, an empty home, data folder and store, and
    every HTTP(S) request sent to a closed local port."""
    checkout = tmp_path / "main"
    shutil.copytree(REPO / "resources" / "examples", checkout / "resources" / "examples")
    (tmp_path / "home").mkdir()
    (tmp_path / "data").mkdir()
    closed = "http://127.0.0.1:9"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPW_") and k.lower() != "no_proxy"}
    env.update(HOME=str(tmp_path / "home"), DPW_DATA_DIR=str(tmp_path / "data"), DPW_DB=str(tmp_path / "runs.sqlite"),
               http_proxy=closed, https_proxy=closed, QT_QPA_PLATFORM="offscreen",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    return checkout, env


def run_readme_line(line: str, checkout: Path, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess:
    args = shlex.split(line)[1:]
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=checkout, env=env, input=stdin,
                          capture_output=True, text=True, timeout=900)


def test_quick_start_and_the_commands_after_it_run_as_written_on_a_fresh_machine(tmp_path):
    checkout, env = fresh_machine(tmp_path)
    ran = run_readme_line(QUICK_START, checkout, env)
    assert ran.returncode == 0, ran.stderr
    shown = re.search(r"```\n(run 1 \(quickstart\): finished\n.*?)```", README, re.S).group(1)
    assert ran.stdout.startswith(shown.splitlines()[0])
    epsilon_line = next(line for line in shown.splitlines() if "privacy" in line)
    assert epsilon_line in ran.stdout, "the README's summary states the epsilon the quick start reaches"
    audit_line = next(line for line in shown.splitlines() if "membership" in line).split("AUC")[0]
    assert audit_line in ran.stdout, "the README's summary ends with the run's own membership audit"

    for line in dpw_lines("Run"):
        ran = run_readme_line(line, checkout, env, stdin="y\n")
        assert ran.returncode == 0, f"{line}: {ran.stderr}"
    assert sorted(p.name for p in (checkout / "out" / "model-1").iterdir()) == [
        "model.onnx", "model.pt2", "model.safetensors", "model_card.json"]
    assert (checkout / "out" / "report-1.pdf").read_bytes().startswith(b"%PDF")
    assert list((tmp_path / "data").iterdir()) == [], "the quick start must not download or write data"
