"""The test-time sweep's cost and fidelity table (demo.rehearsal_table.cost_table) from hand-made rows."""

from __future__ import annotations

from envace_jax.demo.config import DemoConfig
from envace_jax.demo.rehearsal_table import cost_table, sweep_dir


def _row(mode, n, seconds, gen, prompt, fid=None):
    r = {"mode": mode, "n": n, "seconds": seconds, "extra_generated_tokens": gen, "extra_prompt_tokens": prompt}
    if fid is not None:
        r["fidelity"] = fid
    return r


def test_cost_table_rows():
    fid = {
        "used": {"exact": 3, "same_outcome": 1, "wrong_outcome": 2},
        "all": {"exact": 5, "same_outcome": 1, "wrong_outcome": 4},
        "tasks_used": 7,
    }
    rows = [
        _row("parallel", 0, 8.0, 0.0, 0.0),
        _row("parallel", 2, 20.0, 71.25, 543.0, fid),
        _row("sequential", 0, 8.0, 0.0, 0.0),  # N = 0 is one run, listed once
    ]
    lines = cost_table(rows, num_tasks=16).splitlines()
    assert len(lines) == 4
    assert lines[2] == "| - | 0 | 8.0 | 0.500 | 0.0 | 0.0 | - | - | - |"
    assert lines[3] == "| parallel | 2 | 20.0 | 1.250 | 71.2 | 543.0 | 7 | 3 / 1 / 2 | 5 / 1 / 4 |"


def test_sweep_dir_keeps_the_default_tasks_in_the_run_dir():
    assert sweep_dir(DemoConfig(), "runs/x") == "runs/x"
    assert sweep_dir(DemoConfig(task_family="irreversible"), "runs/x") == "runs/x/rehearsal_irreversible"
