"""benchmarks/moe_block.py at a tiny width: every dispatch runs against transformers' block, prints its table,
and agrees with it (the script's own max relative difference)."""

from __future__ import annotations

import re

from benchmarks import moe_block


def test_moe_block_benchmark_runs_every_dispatch(capsys):
    argv = "--tokens 9,24 --hidden 16 --moe_intermediate 8 --experts 6 --top_k 2 --reps 1"
    assert moe_block.main(argv.split() + ["--dispatches", "blocked,dense,ragged"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (\d+) \| (\w+) \|.*\| ([0-9.e+-]+) \|$", out, flags=re.M)
    assert {(t, d) for t, d, _ in rows} == {(t, d) for t in ("9", "24") for d in ("blocked", "dense", "ragged")}
    assert all(float(err) < 1e-5 for _, _, err in rows)
