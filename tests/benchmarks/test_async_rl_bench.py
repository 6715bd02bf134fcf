"""benchmarks/async_rl.py without timing anything: the table's ratios against hand-computed numbers, and one
real run of the script at a tiny size (both lags, the loopback judge, every output written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import async_rl as bench
from tests import helpers_loop as h

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _result(s: int, steps: list[float]) -> bench.RunResult:
    phases = {"generate_s": 0.1, "judge_wait_s": 1.0, "update_s": 0.2, "idle_s": 0.5}
    return bench.RunResult("demo_cpu", 1.0, s, steps, phases, [], 10, 0.0)


def test_table_ratios_are_throughput_and_median_against_s0():
    # s = 0: steps 2, 2, 2 (mean 2, median 2); s = 1 alternates 0.5 and 2.5 (mean 1.5, median of 4: 1.5);
    # s = 2: 0.2, 0.2, 2.6 (mean 1.0, median 0.2).
    rows = bench.table(
        [_result(0, [2.0, 2.0, 2.0]), _result(1, [0.5, 2.5, 0.5, 2.5]), _result(2, [0.2, 0.2, 2.6])]
    ).splitlines()[2:]
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    # columns: arm, latency, s, steps/s, vs s = 0, mean step, median step, median vs s = 0, ...
    assert [c[2] for c in cells] == ["0", "1", "2"]
    assert [c[4] for c in cells] == ["1.00x", "1.33x", "2.00x"]  # 2 / 1.5, 2 / 1.0
    assert [c[3] for c in cells] == ["0.50", "0.67", "1.00"]
    assert [c[7] for c in cells] == ["1.00x", "1.33x", "10.00x"]  # 2 / 1.5, 2 / 0.2


@pytest.mark.slow
def test_script_runs_both_lags_with_a_loopback_judge(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "async_rl.py"), "--out", str(out)]
    cmd += ["--arms", "demo_cpu", "--latencies", "0.05", "--staleness", "0,1", "--steps", "2", "--warmup", "1"]
    r = subprocess.run(cmd + ["--no-prime"], env=h.env(), capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "async_rl.json").read_text())
    assert [(x["s"], len(x["step_s"])) for x in res] == [(0, 2), (1, 2)]
    assert all(x["verdicts"] > 0 for x in res)  # the judge was asked over HTTP
    # the lagged run's timeline has two rollout lanes (a slot per rollout in flight), the synchronous one one
    lanes = [sorted({e["lane"] for e in x["timeline"]}) for x in res]
    assert lanes == [["rollout 0", "update"], ["rollout 0", "rollout 1", "update"]]
    md = (out / "async_rl.md").read_text()
    assert "| demo_cpu | 0.05 | 1 |" in md
    assert (out / "timeline.png").stat().st_size > 0
