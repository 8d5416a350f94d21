"""Faults during the edits made after training: a run's tags, notes, name and summary keys (the window's
tags box, notes and Rename run, a kept membership audit). A writer killed with SIGKILL at a random moment leaves each
edit whole or absent, never half written, and the ledger intact; two writers setting different
summary keys at once lose neither key."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import textwrap
import time

import pytest
from fault_helpers import check_ledger, snapshot, start, store_with_history

from engine.store import Store

# Edits one run as fast as it can: generation k sets tags t<k>-a..t<k>-e, notes "note <k>", the name
# "name <k>" and the summary key given on the command line to {"generation": k, "rows": [k] * 200}, in
# that order, each its own transaction, and prints k after the four (so the parent knows what was committed).
EDITOR = textwrap.dedent("""
    import sys
    from engine.store import Store
    store = Store(sys.argv[1])
    run_id, key = int(sys.argv[2]), sys.argv[3]
    k = 0
    while True:
        k += 1
        store.set_tags(run_id, [f"t{k}-{c}" for c in "abcde"])
        store.set_notes(run_id, f"note {k}")
        store.rename_run(run_id, f"name {k}")
        store.set_summary_key(run_id, key, {"generation": k, "rows": [k] * 200})
        print(k, flush=True)
""")


def edits_of(db, run_id: int) -> tuple[list[str], str | None, dict]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tags = [t for (t,) in conn.execute("select tag from run_tags where run_id = ? order by rowid", [run_id])]
        notes, summary = conn.execute("select notes, summary from runs where id = ?", [run_id]).fetchone()
    finally:
        conn.close()
    return tags, notes, json.loads(summary) if summary else {}


def name_of(db, run_id: int) -> tuple[str, dict, str]:
    """The run's name, its stored config and config hash, as the row holds them."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        name, config, config_hash = conn.execute(
            "select name, config, config_hash from runs where id = ?", [run_id]).fetchone()
    finally:
        conn.close()
    return name, json.loads(config), config_hash


def store_with_a_result(path):
    """store_with_history's store, its first run's summary holding a result of training to keep."""
    db = store_with_history(path)
    store = Store(db)
    store.set_summary_key(1, "test_accuracy", 0.93)
    store.close()
    return db


def generation_of(tags: list[str]) -> int:
    """The generation the tags were written in; the five tags must all come from that one."""
    generations = {tag.split("-")[0] for tag in tags}
    assert len(generations) == 1 and len(tags) == 5, f"tags half written: {tags}"
    return int(generations.pop()[1:])


@pytest.mark.parametrize("seed", [0, 1])
def test_a_writer_killed_mid_edit_leaves_each_edit_whole(tmp_path, seed):
    """Twenty kills, each at a random moment of the edit cycle, each followed by the checks."""
    db = store_with_a_result(tmp_path / "runs.sqlite")
    before, before_1 = snapshot(db, [2]), snapshot(db, [1])
    _, config_before, hash_before = name_of(db, 1)
    rng = random.Random(seed)
    for _ in range(20):
        proc = start(["-c", EDITOR, db, 1, "membership_audit"])
        committed, wanted = 0, rng.randint(1, 40)
        while committed < wanted:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-2000:]
            committed = int(line)
        time.sleep(rng.random() * 0.01)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

        runs = check_ledger(db)  # intact file, final statuses, privacy spent as before
        tags, notes, summary = edits_of(db, 1)
        generation = generation_of(tags)
        assert generation >= committed
        assert notes in (f"note {generation}", f"note {generation - 1}")  # notes follow tags in a generation
        name, config, config_hash = name_of(db, 1)
        assert name in (f"name {generation}", f"name {generation - 1}")  # the name follows the notes
        assert config == {**config_before, "name": name}  # the row and its config renamed together, nothing else
        assert config_hash == hash_before  # the name is not in the hash: what the run states is unchanged
        kept = summary["membership_audit"]
        assert kept["rows"] == [kept["generation"]] * 200 and kept["generation"] in (generation, generation - 1)
        assert summary["test_accuracy"] == 0.93  # the training's result kept
        assert runs[1]["status"] == "finished" and snapshot(db, [2]) == before  # the other run untouched
        after_1 = snapshot(db, [1])
        assert all(after_1[table] == before_1[table] for table in before_1 if table != "runs")  # its ledger rows


def test_two_writers_setting_different_summary_keys_lose_neither(tmp_path):
    db = store_with_a_result(tmp_path / "runs.sqlite")
    _, _, original = edits_of(db, 1)
    writers = [start(["-c", EDITOR, db, 1, key]) for key in ("audit_a", "audit_b")]
    counts = [0, 0]
    for i, proc in enumerate(writers):
        for _ in range(30):
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-2000:]
            counts[i] = int(line)
    for proc in writers:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    check_ledger(db)
    _, _, summary = edits_of(db, 1)
    assert summary["audit_a"]["generation"] >= counts[0] and summary["audit_b"]["generation"] >= counts[1]
    assert {k: v for k, v in summary.items() if k in original} == original  # the training's keys kept
