"""Long work says what it is doing: eval prints stage lines with seconds and a bar over episodes,
aot_compile a line before and after each compilation (stderr; stdout keeps the results)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from envace_jax.eval.runner import run_eval
from tests.helpers_paths import ROOT

TINY = {"random_tiny": True, "tiny": {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "head_dim": 8}}


def test_eval_prints_stages_with_seconds_and_an_episode_bar(tmp_path, capsys):
    res = run_eval(
        {
            "suite": "demo",
            "policy": "model",
            "output_dir": str(tmp_path),
            "model": TINY,
            "sampling": {"temperature": 1.0, "max_new_tokens": 12},
            "max_model_len": 2048,
            "demo": {"num_tasks": 3, "max_steps": 4},
            "rehearsal": {"n": 1, "mode": "parallel", "max_tokens_per_rehearsal": 16},
        }
    )
    assert res["categories"]["demo_rehearsal_parallel_n1"]["count"] == 3
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.startswith("eval: ")]
    label = "demo after 1 parallel rehearsal(s): 3 tasks"
    assert [re.sub(r"\d+\.\d s$", "S s", line) for line in lines] == [
        "eval: demo suite, policy model ...",
        "eval: loading a random tiny model ...",
        "eval: loading a random tiny model: done in S s",
        f"eval: {label} ...",
        "eval: rehearsal round 1/1: 3 imagined episodes ...",
        "eval: rehearsal round 1/1: 3 imagined episodes: done in S s",
        f"eval: {label}: done in S s",
        "eval: demo suite, policy model: done in S s",
    ]
    # tqdm's bars over the 3 imagined episodes and the 3 committed ones end full
    assert re.search(r"rehearsal round 1/1: 100%\|.*\| 3/3 ", out.err)
    assert re.search(r"demo after 1 parallel rehearsal\(s\): 100%\|.*\| 3/3 ", out.err)
    assert "eval:" not in out.out


def test_eval_stage_that_fails_says_so(tmp_path, capsys):
    with pytest.raises(ValueError, match="model_path is empty"):
        run_eval({"suite": "demo", "policy": "model", "output_dir": str(tmp_path)})
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("eval: ")]
    assert [re.sub(r"\d+\.\d s$", "S s", line) for line in lines] == [
        "eval: demo suite, policy model ...",
        "eval: loading the model (no model_path) ...",
        "eval: loading the model (no model_path): failed after S s",
        "eval: demo suite, policy model: failed after S s",
    ]


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed (`make aot-deps`)")
def test_aot_compile_prints_a_line_before_and_after_each_compilation(tmp_path):
    cmd = [
        sys.executable,
        "launch/aot_compile.py",
        "--config=configs/demo_cpu.py",
        "--topology=v5e:2x2",
        "--programs=logprobs",
        "--config.rollout.max_model_len=512",
        "--config.rl.max_row_length=512",
        "--config.data.prompts_per_step=2",
        "--config.rl.n_rollouts=2",
        "--config.mesh.fsdp=-1",
    ]
    p = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [re.sub(r": \d+\.\d s$", ": S s", line) for line in p.stderr.splitlines() if line.startswith("aot: ")]
    compile_ = "aot: [1/1] logprobs (4 rows x 512 tokens): lowering and compiling for v5e:2x2"
    cost = "aot: [1/1] logprobs: compiling 1- and 2-layer copies for its cost"
    assert lines == [f"{compile_} ...", f"{compile_}: S s", f"{cost} ...", f"{cost}: S s"]
    assert "logprobs" in p.stdout and "aot:" not in p.stdout


def test_bfcl_multi_turn_loop_counts_entries_as_they_end(monkeypatch, capsys):
    """The BFCL loop's bar, on a stand-in environment (BFCL itself is an optional package): entries
    with 1, 2 and 3 user turns and an agent that never calls a tool end after 1, 2 and 3 agent calls."""
    from envace_jax.eval import bfcl_eval
    from envace_jax.eval.config import BfclConfig
    from envace_jax.eval.harness import AgentTurn

    class NoToolsEnv:
        tool_schemas: list = []

        def __init__(self, entry):
            pass

    class Replier:
        def __init__(self):
            self.calls = 0

        def act(self, conversations):
            self.calls += 1
            return [AgentTurn("ok") for _ in conversations]

        def release(self, keys):
            pass

    monkeypatch.setattr(bfcl_eval.bfcl, "BfclMultiTurnEnv", NoToolsEnv)
    entries = [
        {"id": f"e{n}", "question": [[{"role": "user", "content": f"turn {t}"}] for t in range(n)]} for n in (1, 2, 3)
    ]
    agent = Replier()
    eps = bfcl_eval.play_multi_turn(entries, agent, BfclConfig(batch_size=8), desc="multi_turn_fake")
    assert [e.termination for e in eps] == ["completed"] * 3 and agent.calls == 3
    err = capsys.readouterr().err
    counts = [int(n) for n in re.findall(r"multi_turn_fake:\s+\d+%\|[^|]*\|\s*(\d)/3", err)]
    assert counts[0] == 0 and counts[-1] == 3 and counts == sorted(counts)


def test_fidelity_suite_prints_its_stages_and_a_bar_over_the_rehearsed_calls(tmp_path, capsys):
    res = run_eval(
        {
            "suite": "fidelity",
            "output_dir": str(tmp_path),
            "model": TINY,
            "sampling": {"temperature": 0.0, "max_new_tokens": 8},
            "fidelity": {
                "rehearser": "model",
                "bfcl_categories": (),
                "tau2_domains": (),
                "demo_tasks": 3,
                "batch_size": 4,
            },
        }
    )
    calls = sum(r["count"] for r in res["categories"].values())
    assert calls > 4  # more than one generate call, so the bar moves more than once
    err = capsys.readouterr().err
    stage = f"eval: fidelity: the model rehearser on {calls} calls"
    lines = [re.sub(r"\d+\.\d s$", "S s", line) for line in err.splitlines() if line.startswith("eval: fidelity")]
    assert lines == [
        "eval: fidelity suite, rehearser model ...",
        "eval: fidelity: replaying the logged calls ...",
        "eval: fidelity: replaying the logged calls: done in S s",
        f"{stage} ...",
        f"{stage}: done in S s",
        "eval: fidelity suite, rehearser model: done in S s",
    ]
    assert re.search(rf"REHEARSE: 100%\|.*\| {calls}/{calls} ", err)
