"""Which runs a search text picks (engine.run_filter): the window's filter box and `dpw list WORD...`."""

from __future__ import annotations

import json

from click.testing import CliRunner

from engine.cli import cli
from engine.config import RunConfig
from engine.run_filter import matches
from engine.store import Store


def test_every_word_must_be_found_in_name_dataset_mechanism_status_tags_or_study():
    row = {"id": 3, "name": "lr 0.5", "dataset": "digits", "mechanism": "dpsgd", "status": "finished",
           "tags": ["baseline", "Clip Tight"],
           "study": {"id": 2, "name": "study-digits", "mode": "private", "status": "finished", "released_run_id": 3}}
    assert matches(row, [])
    assert matches(row, ["digits", "finished"]) and matches(row, ["clip", "tight"])
    assert matches(row, ["released"]) and matches(row, ["study-digits"])
    assert not matches(row, ["digits", "pate"]) and not matches(row, ["mnist"])


def test_dpw_list_with_words_lists_only_the_runs_that_match(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    for name, dataset in (("first", "digits"), ("second", "breast-cancer"), ("third", "digits")):
        store.create_run(RunConfig(name=name, dataset=dataset, noise_multiplier=1.0))
    store.add_tags(3, ["baseline"])
    db = ["--db", str(store.path)]
    listed = json.loads(CliRunner().invoke(cli, ["list", "digits", "--json", *db]).output)
    assert [row["name"] for row in listed] == ["first", "third"]
    tagged = CliRunner().invoke(cli, ["list", "DIGITS baseline", *db]).output
    assert "third" in tagged and "first" not in tagged
    none = CliRunner().invoke(cli, ["list", "pate", *db])
    assert none.exit_code == 0 and none.output == f"no runs match 'pate' (of 3 in {store.path})\n"
