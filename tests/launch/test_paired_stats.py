"""launch/paired_stats.py on run directories written here: per-seed rows and the pooled row equal eval.paired's,
and bad input (no directory, no outcome files, an unknown arm, a malformed --pair) is one short message, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

from envace_jax.eval import paired
from tests.helpers_paths import ROOT

SCRIPT = os.path.join(ROOT, "launch", "paired_stats.py")


def _run(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("ENVACE_DEBUG", None)
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120)


def _cells(text, first):
    rows = [ln for ln in text.splitlines() if ln.startswith(f"| {first} ")]
    assert len(rows) == 1, (first, text)
    return [c.strip() for c in rows[0].strip().strip("|").split("|")]


def test_per_seed_and_pooled_rows(tmp_path):
    seeds = {}
    for k, (after, before) in enumerate((([1, 1, 1, 0], [0, 1, 0, 0]), ([1, 0, 1, 1, 1], [1, 0, 0, 1, 0]))):
        d = tmp_path / f"seed{k}"
        d.mkdir()
        arms = {}
        for arm, wins in (("after", after), ("before", before)):
            arms[arm] = paired.outcomes_of([f"s{k}t{i}" for i in range(len(wins))], [float(w) for w in wins])
            paired.write_outcomes(str(d), arm, arms[arm])
        seeds[str(d)] = arms
    r = _run(*seeds, "--pair=after:before", "--n_boot=2000", "--seed=5")
    assert r.returncode == 0, r.stderr
    assert "## after vs before (A = after, B = before): 95% paired interval excludes 0 on 0 of 2 run(s)" in r.stdout
    for d, arms in seeds.items():
        want = paired.compare(arms["after"], arms["before"], "after", "before", n_boot=2000, seed=5)
        assert _cells(r.stdout, d)[1:] == paired.paired_row(d, want)[1:]
    pooled = paired.pool([(a["after"], a["before"]) for a in seeds.values()], "after", "before", n_boot=2000, seed=5)
    # seed 0: 2 wins, 2 ties; seed 1: 2 wins, 3 ties; no losses -> exact McNemar on 4 wins of 4: 2 / 2^4
    assert _cells(r.stdout, "pooled (2 seeds)")[5:7] == ["0.125", "4 / 0 / 5"]
    assert _cells(r.stdout, "pooled (2 seeds)")[1:] == paired.paired_row("x", pooled)[1:]


def test_bad_input_is_one_short_message(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "run").mkdir()
    paired.write_outcomes(str(tmp_path / "run"), "after", paired.outcomes_of(["t0"], [1.0]))
    for args, needle in (
        ([], "name one or more run directories"),
        ([str(empty)], "no eval_<arm>_tasks.jsonl files"),
        ([str(tmp_path / "run"), "--pair=after:before"], "no outcomes of arm(s) ['before']; it has ['after']"),
        ([str(tmp_path / "run"), "--pair=after"], "expected two arm names as A:B"),
    ):
        r = _run(*args)
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    r = _run(str(tmp_path / "missing"))
    assert r.returncode == 1 and "not found" in r.stderr and "Traceback" not in r.stderr, r.stderr
