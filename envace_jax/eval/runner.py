"""``run_eval(config)``: one evaluation from an ml-collections config (used by launch/eval.py).

The config (``configs/eval_*.py``, a dict, or an ``EvalConfig``) is read into the typed ``EvalConfig``
of ``eval.config``: ``suite`` (bfcl | tau2 | demo | rehearsal_sweep | fidelity), ``policy`` (oracle | model |
http: a served model, bfcl and tau2),
``output_dir``, ``model``, ``sampling``, ``sampler`` shape buckets, ``max_model_len``, ``enable_thinking``,
``rehearsal`` and one section per suite. A field that is misspelt or out of range is an error naming it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

from envace_jax.eval import progress
from envace_jax.eval import results as R
from envace_jax.eval.config import DEMO_SWEEP_NS, POLICIES, SUITES, EvalConfig, load_eval_config
from envace_jax.eval.harness import build_model_agent


def _agent(cfg: EvalConfig, out_dir: str, model_path: str | None = None):
    spec = cfg.model if model_path is None else dataclasses.replace(cfg.model, model_path=model_path)
    what = spec.model_path or ("a random tiny model" if spec.random_tiny else "the model (no model_path)")
    with progress.stage(f"loading {what}"):
        return build_model_agent(
            spec,
            cfg.sampling,
            max_model_len=cfg.max_model_len,
            work_dir=out_dir,
            enable_thinking=cfg.enable_thinking,
            seed=cfg.seed,
            shapes=cfg.sampler,
        )


def _policy_agent(cfg: EvalConfig, out_dir: str):
    """The agent of the bfcl and tau2 suites: our model in-process, or a served one (``policy=http``)."""
    if cfg.policy == "http":
        from envace_jax.eval.http_agent import HttpAgent

        return HttpAgent(cfg.http, cfg.sampling, enable_thinking=cfg.enable_thinking, seed=cfg.seed)
    return _agent(cfg, out_dir)[0]


def _rollout_cfg(cfg: EvalConfig):
    from envace_jax.rl.rollout import RolloutConfig

    d = cfg.demo
    return RolloutConfig(
        mode="real",
        max_steps=d.max_steps,
        max_assistant_turns=d.max_assistant_turns,
        max_user_turns=d.max_user_turns,
        max_model_len=cfg.max_model_len,
        act=cfg.sampling,
        rehearse=cfg.sampling,
        seed=cfg.seed,
    )


def run_eval(config: Any) -> dict[str, Any]:
    """Runs the configured evaluation and writes ``output_dir/results.{json,md}``; returns the results dict."""
    cfg = config if isinstance(config, EvalConfig) else load_eval_config(config)
    out_dir = cfg.output_dir
    if not out_dir:
        raise ValueError("config.output_dir is empty: give the directory for results.json and results.md")
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    who = f"rehearser {cfg.fidelity.rehearser}" if cfg.suite == "fidelity" else f"policy {cfg.policy}"
    with progress.stage(f"{cfg.suite} suite, {who}"):
        cats, policy, extra_files = _run_suite(cfg, out_dir)
    res = R.results_dict(cfg.suite, policy, cats, json.loads(json.dumps(dataclasses.asdict(cfg))))
    res["wall_seconds"] = round(time.time() - t0, 2)
    if extra_files:
        res["files"] = extra_files
    per_entry = {c.name: c.entries for c in cats} if cfg.write_entries else None
    R.write_results(out_dir, res, per_entry)
    return res


def _run_suite(cfg: EvalConfig, out_dir: str) -> tuple[list[R.CategoryResult], str, dict[str, str]]:
    """(categories, the policy name to report, extra files written) of the configured suite."""
    policy = cfg.policy
    extra_files: dict[str, str] = {}
    if cfg.suite in ("bfcl", "tau2") and cfg.rehearsal.rehearses:
        # test-time rehearsal on the benchmark (one setting, or the sweep over N): our model in process, or a served
        # one (EvalConfig checks which)
        from envace_jax.eval import benchmark_rehearsal

        if cfg.policy == "http":
            from envace_jax.eval.http_policy_client import build_http_policy

            agent, codec, client = build_http_policy(cfg)
        else:
            agent, codec, client = _agent(cfg, out_dir)
        user_agent = None
        if cfg.suite == "tau2" and cfg.tau2.user == "model":
            # the policy's weights (or its server) play the user unless a user checkpoint is named
            user_agent = agent if not cfg.tau2.user_model_path else _agent(cfg, out_dir, cfg.tau2.user_model_path)[0]
        cats, extra_files = benchmark_rehearsal.run(cfg, out_dir, agent, codec, client, user_agent)
    elif cfg.suite == "bfcl":
        from envace_jax.eval import bfcl_eval

        agent = "oracle" if cfg.policy == "oracle" else _policy_agent(cfg, out_dir)
        cats = bfcl_eval.evaluate(agent, cfg.bfcl)
    elif cfg.suite == "tau2":
        from envace_jax.eval import tau2_eval

        if cfg.policy == "oracle":
            cats = tau2_eval.evaluate("oracle", cfg.tau2)
        else:
            agent = _policy_agent(cfg, out_dir)
            user_agent = None
            if cfg.tau2.user == "model":
                # Without a separate user model the policy's own weights play the user (separate caches); a
                # served policy plays it through its server.
                if cfg.policy == "http" and not cfg.tau2.user_model_path:
                    user_agent = _policy_agent(cfg, out_dir)
                else:
                    user_agent = _agent(cfg, out_dir, cfg.tau2.user_model_path or None)[0]
            cats = tau2_eval.evaluate(agent, cfg.tau2, user_agent)
    elif cfg.suite == "fidelity":
        # REHEARSE on the benchmarks' logged calls; the rehearser (oracle | constant | model) names the run
        from envace_jax.eval import fidelity_bench

        fcfg = dataclasses.replace(cfg.fidelity, seed=cfg.seed)
        codec = client = None
        if fcfg.rehearser == "model":
            _, codec, client = _agent(cfg, out_dir)
        _, cats, extra_files = fidelity_bench.run(fcfg, out_dir, codec=codec, client=client, sampling=cfg.sampling)
        policy = fcfg.rehearser
    else:
        from envace_jax.eval import demo_eval

        tasks = demo_eval.load_tasks(cfg.demo)
        if cfg.policy == "oracle":
            if cfg.suite == "rehearsal_sweep":
                raise ValueError("config.suite='rehearsal_sweep' needs config.policy='model'")
            cats = [demo_eval.evaluate_oracle(tasks)]
        else:
            _, codec, client = _agent(cfg, out_dir)
            rehearsal = dataclasses.replace(cfg.rehearsal.rehearsal(), seed=cfg.seed)
            if cfg.suite == "demo":
                cats = [demo_eval.evaluate_model(tasks, codec, client, _rollout_cfg(cfg), rehearsal)]
            else:
                sweep, cats = demo_eval.sweep(
                    tasks,
                    codec,
                    client,
                    _rollout_cfg(cfg),
                    rehearsal,
                    cfg.rehearsal.sweep_ns or DEMO_SWEEP_NS,
                    cfg.rehearsal.sweep_modes,
                )
                with open(os.path.join(out_dir, "sweep.md"), "w", encoding="utf-8") as f:
                    f.write(sweep.to_markdown())
                with open(os.path.join(out_dir, "sweep.json"), "w", encoding="utf-8") as f:
                    f.write(sweep.to_json())
                extra_files = {"sweep_md": "sweep.md", "sweep_json": "sweep.json"}
    return cats, policy, extra_files


__all__ = ["POLICIES", "SUITES", "run_eval"]
