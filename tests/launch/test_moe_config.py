"""configs/moe_cpu.py end to end in subprocesses: a tiny Qwen3-MoE trains with launch/train.py (routing replay on),
exports in the Hub's per-expert layout that transformers loads with our logits, and evaluates with launch/eval.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np

from tests import helpers_loop as h


def _run(*args, timeout=900):
    r = subprocess.run([sys.executable, *args], env=h.env(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_moe_smoke_config_trains_exports_and_evaluates(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from envace_jax.models import hf_io

    run_dir, out = str(tmp_path / "run"), str(tmp_path / "hf")
    cfg = f"--config={h.ROOT}/configs/moe_cpu.py"
    small = [
        f"--config.tokenizer.path={h.tokenizer_dir()}",
        "--config.rollout.max_steps=4",
        "--config.rollout.max_assistant_turns=2",
        "--config.log.progress_bar=False",
        "--config.log.plot=False",
        "--config.log.tensorboard=False",
    ]
    _run(
        os.path.join(h.ROOT, "launch", "train.py"), cfg, f"--config.run_dir={run_dir}", "--config.total_steps=2", *small
    )
    lines = h.metrics_lines(run_dir)
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        # the update routed every generated token where the sampler did, with the sampler's log-probs
        assert m["update/routing/changed_tokens"] == 0.0
        assert m["act/logp_mismatch_sampler_max"] < 1e-5
        assert m["update/router_aux_loss"] > 0

    _run(
        os.path.join(h.ROOT, "launch", "export_hf.py"),
        cfg,
        f"--config.run_dir={run_dir}",
        f"--out_dir={out}",
        *small[:1],
    )
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["model_type"] == "qwen3_moe" and config["num_experts"] == 8 and config["mlp_only_layers"] == [1]
    hf = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    ours = hf_io.load_hf(out)
    ids = np.random.default_rng(0).integers(3, 400, (2, 12))
    with torch.no_grad():
        want = hf(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(ids, jnp.int32))), want, rtol=2e-4, atol=2e-5)

    results = str(tmp_path / "eval")
    _run(
        os.path.join(h.ROOT, "launch", "eval.py"),
        f"--config={h.ROOT}/configs/eval_demo.py",
        "--config.policy=model",
        f"--config.model.model_path={out}",
        "--config.demo.num_tasks=2",
        f"--config.output_dir={results}",
    )
    summary = json.load(open(os.path.join(results, "results.json")))
    assert summary["policy"] and summary["categories"]  # the MoE policy ran over its tasks
