"""``run_eval(config)``: one evaluation from an ml-collections config (used by launch/eval.py).

Config fields (see configs/eval_*.py): ``suite`` (bfcl | tau2 | demo | rehearsal_sweep | fidelity), ``policy``
(oracle | model), ``output_dir``, ``model`` (model_path, tokenizer_path, random_tiny, dtype),
``sampling`` (temperature, top_p, top_k, max_new_tokens), optional ``sampler`` shape buckets
(batch_buckets, length_buckets, window_buckets, max_chunk; see ``harness.SamplerShapes``),
``max_model_len``, ``enable_thinking``, and
one section per suite. List-valued fields are comma-separated strings so they override cleanly from
the command line (``--config.bfcl.categories=multi_turn_base,simple_python``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping

from envace_jax.eval import results as R
from envace_jax.eval.harness import ModelSpec, SamplerShapes, build_model_agent
from envace_jax.rl.rollout import RoleSampling

SUITES = ("bfcl", "tau2", "demo", "rehearsal_sweep", "fidelity")
POLICIES = ("oracle", "model")


def _get(c: Any, dotted: str, default: Any = None) -> Any:
    for part in dotted.split("."):
        if c is None:
            return default
        c = c.get(part) if isinstance(c, Mapping) else getattr(c, part, None)
    return default if c is None else c


def _list(value: Any, field: str) -> tuple:
    if isinstance(value, str):
        items = tuple(v.strip() for v in value.split(",") if v.strip())
    elif isinstance(value, (list, tuple)):
        items = tuple(value)
    else:
        raise ValueError(f"config.{field} must be a comma-separated string or a list, got {value!r}")
    if not items:
        raise ValueError(f"config.{field} is empty")
    return items


def _as_dict(cfg: Any) -> dict[str, Any]:
    if hasattr(cfg, "to_dict"):
        return cfg.to_dict()
    return json.loads(json.dumps(cfg, default=str))


def _sampling(cfg: Any) -> RoleSampling:
    return RoleSampling(temperature=float(_get(cfg, "sampling.temperature", 0.0)),
                        top_p=float(_get(cfg, "sampling.top_p", 1.0)), top_k=int(_get(cfg, "sampling.top_k", 0)),
                        max_new_tokens=int(_get(cfg, "sampling.max_new_tokens", 512)))


def _model_spec(cfg: Any, path_field: str = "model.model_path") -> ModelSpec:
    return ModelSpec(model_path=str(_get(cfg, path_field, "")), tokenizer_path=str(_get(cfg, "model.tokenizer_path", "")),
                     random_tiny=bool(_get(cfg, "model.random_tiny", False)), dtype=str(_get(cfg, "model.dtype", "float32")),
                     tiny_hidden=int(_get(cfg, "model.tiny.hidden", 64)), tiny_layers=int(_get(cfg, "model.tiny.layers", 2)),
                     tiny_heads=int(_get(cfg, "model.tiny.heads", 4)), tiny_kv_heads=int(_get(cfg, "model.tiny.kv_heads", 2)),
                     tiny_head_dim=int(_get(cfg, "model.tiny.head_dim", 16)),
                     demo_vocab_size=int(_get(cfg, "model.tiny.vocab_size", 480)),
                     tokenizer_corpus=str(_get(cfg, "model.tiny.tokenizer_corpus", "demo")),
                     tokenizer_pre_split=str(_get(cfg, "model.tiny.pre_split", "qwen")),
                     tokenizer_max_token_chars=int(_get(cfg, "model.tiny.max_token_chars", 0)),
                     seed=int(_get(cfg, "seed", 0)))


def _ints(cfg: Any, field: str) -> tuple[int, ...]:
    value = _get(cfg, field, "")
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        return tuple(int(v) for v in items if str(v).strip())
    except ValueError:
        raise ValueError(f"config.{field} must be comma-separated ints, got {value!r}") from None


def _shapes(cfg: Any) -> SamplerShapes:
    return SamplerShapes(batch=_ints(cfg, "sampler.batch_buckets"), length=_ints(cfg, "sampler.length_buckets"),
                         window=_ints(cfg, "sampler.window_buckets"),
                         max_chunk=int(_get(cfg, "sampler.max_chunk", 512)))


def _agent(cfg: Any, out_dir: str, path_field: str = "model.model_path"):
    return build_model_agent(_model_spec(cfg, path_field), _sampling(cfg), max_model_len=int(_get(cfg, "max_model_len", 16384)),
                             work_dir=out_dir, enable_thinking=bool(_get(cfg, "enable_thinking", True)),
                             seed=int(_get(cfg, "seed", 0)), shapes=_shapes(cfg))


def _rollout_cfg(cfg: Any):
    from envace_jax.rl.rollout import RolloutConfig
    s = _sampling(cfg)
    return RolloutConfig(mode="real", max_steps=int(_get(cfg, "demo.max_steps", 24)),
                         max_assistant_turns=int(_get(cfg, "demo.max_assistant_turns", 8)),
                         max_user_turns=int(_get(cfg, "demo.max_user_turns", 4)),
                         max_model_len=int(_get(cfg, "max_model_len", 16384)), act=s, rehearse=s,
                         seed=int(_get(cfg, "seed", 0)))


def _rehearsal_cfg(cfg: Any):
    from envace_jax.eval.rehearsal import RehearsalConfig
    return RehearsalConfig(n=int(_get(cfg, "rehearsal.n", 0)), mode=str(_get(cfg, "rehearsal.mode", "parallel")),
                           memory=str(_get(cfg, "rehearsal.memory", "template")),
                           max_tokens_per_rehearsal=int(_get(cfg, "rehearsal.max_tokens_per_rehearsal", 2048)),
                           max_memory_chars=int(_get(cfg, "rehearsal.max_memory_chars", 1500)),
                           seed=int(_get(cfg, "seed", 0)))


def run_eval(cfg: Any) -> dict[str, Any]:
    """Runs the configured evaluation and writes ``output_dir/results.{json,md}``; returns the results dict."""
    suite, policy = str(_get(cfg, "suite", "")), str(_get(cfg, "policy", ""))
    if suite not in SUITES:
        raise ValueError(f"config.suite={suite!r}; choose one of {SUITES}")
    if policy not in POLICIES:
        raise ValueError(f"config.policy={policy!r}; choose one of {POLICIES}")
    out_dir = str(_get(cfg, "output_dir", ""))
    if not out_dir:
        raise ValueError("config.output_dir is empty: give the directory for results.json and results.md")
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    extra_files: dict[str, str] = {}
    if suite == "bfcl":
        from envace_jax.eval import bfcl_eval
        bcfg = bfcl_eval.BfclConfig(categories=_list(_get(cfg, "bfcl.categories", "multi_turn_base"), "bfcl.categories"),
                                    limit=int(_get(cfg, "bfcl.limit", 0)),
                                    max_steps_per_turn=int(_get(cfg, "bfcl.max_steps_per_turn", 20)),
                                    batch_size=int(_get(cfg, "bfcl.batch_size", 16)))
        agent = "oracle" if policy == "oracle" else _agent(cfg, out_dir)[0]
        cats = bfcl_eval.evaluate(agent, bcfg)
    elif suite == "tau2":
        from envace_jax.eval import tau2_eval
        tcfg = tau2_eval.Tau2Config(domains=_list(_get(cfg, "tau2.domains", "airline,retail,telecom"), "tau2.domains"),
                                    split=str(_get(cfg, "tau2.split", "test")), limit=int(_get(cfg, "tau2.limit", 0)),
                                    user=str(_get(cfg, "tau2.user", "scripted")),
                                    max_steps=int(_get(cfg, "tau2.max_steps", 30)),
                                    batch_size=int(_get(cfg, "tau2.batch_size", 8)))
        if policy == "oracle":
            cats = tau2_eval.evaluate("oracle", tcfg)
        else:
            agent = _agent(cfg, out_dir)[0]
            user_agent = None
            if tcfg.user == "model":
                # Without a separate user model the policy's own weights play the user (separate caches).
                user_agent = (_agent(cfg, out_dir, "tau2.user_model_path")[0] if _get(cfg, "tau2.user_model_path", "")
                              else _agent(cfg, out_dir)[0])
            cats = tau2_eval.evaluate(agent, tcfg, user_agent)
    elif suite == "fidelity":
        # REHEARSE on the benchmarks' logged calls; the rehearser (oracle | constant | model) names the run
        from envace_jax.eval import fidelity_bench
        fcfg = fidelity_bench.FidelityBenchConfig.from_mapping(_get(cfg, "fidelity", {}), seed=int(_get(cfg, "seed", 0)))
        codec = client = None
        if fcfg.rehearser == "model":
            _, codec, client = _agent(cfg, out_dir)
        _, cats, extra_files = fidelity_bench.run(fcfg, out_dir, codec=codec, client=client, sampling=_sampling(cfg))
        policy = fcfg.rehearser
    else:
        from envace_jax.eval import demo_eval
        dcfg = demo_eval.DemoConfig(num_tasks=int(_get(cfg, "demo.num_tasks", 40)), seed=int(_get(cfg, "demo.seed", 0)),
                                    split=str(_get(cfg, "demo.split", "test")))
        tasks = demo_eval.load_tasks(dcfg)
        if policy == "oracle":
            if suite == "rehearsal_sweep":
                raise ValueError("config.suite='rehearsal_sweep' needs config.policy='model'")
            cats = [demo_eval.evaluate_oracle(tasks)]
        else:
            _, codec, client = _agent(cfg, out_dir)
            if suite == "demo":
                cats = [demo_eval.evaluate_model(tasks, codec, client, _rollout_cfg(cfg), _rehearsal_cfg(cfg))]
            else:
                ns = tuple(int(x) for x in _list(_get(cfg, "rehearsal.sweep_ns", "0,1,2,4"), "rehearsal.sweep_ns"))
                modes = _list(_get(cfg, "rehearsal.sweep_modes", "parallel,sequential"), "rehearsal.sweep_modes")
                sweep, cats = demo_eval.sweep(tasks, codec, client, _rollout_cfg(cfg), _rehearsal_cfg(cfg), ns, modes)
                with open(os.path.join(out_dir, "sweep.md"), "w", encoding="utf-8") as f:
                    f.write(sweep.to_markdown())
                with open(os.path.join(out_dir, "sweep.json"), "w", encoding="utf-8") as f:
                    f.write(sweep.to_json())
                extra_files = {"sweep_md": "sweep.md", "sweep_json": "sweep.json"}
    res = R.results_dict(suite, policy, cats, _as_dict(cfg))
    res["wall_seconds"] = round(time.time() - t0, 2)
    if extra_files:
        res["files"] = extra_files
    per_entry = {c.name: c.entries for c in cats} if bool(_get(cfg, "write_entries", True)) else None
    R.write_results(out_dir, res, per_entry)
    return res


__all__ = ["POLICIES", "SUITES", "run_eval"]
