"""Rehearsal-fidelity reports on real benchmark logs: BFCL ground-truth replays, tau2 golden-action runs,
and (optionally) demo reference conversations; the ``fidelity`` suite of ``launch/eval.py``.

    python launch/eval.py --config=configs/eval_fidelity.py --config.output_dir=/tmp/fid_oracle
    python launch/eval.py --config=configs/eval_fidelity.py --config.fidelity.rehearser=constant \
        --config.output_dir=/tmp/fid_constant
    python launch/eval.py --config=configs/eval_fidelity.py --config.fidelity.rehearser=model \
        --config.model.model_path=/ckpt/qwen3-8b --config.output_dir=/tmp/fid_qwen3

Rehearsers: ``oracle`` (the logged real response: every measure 1.0, no hallucination), ``constant``
(always ``{"status": "ok"}``: the floor, and optimistic on every real error), ``model`` (the loaded
model plays REHEARSE on the rollout's own prompt, ``eval.fidelity.PolicyRehearser``).

Files: ``fidelity.md`` and ``fidelity.json`` hold the full report (``eval.fidelity_report``: by domain,
by tool, by kind of call and real outcome, the hallucination rates); ``results.json`` / ``results.md``
get one row per domain where ``valid`` = an exact match, so ``accuracy`` is the exact rate with its
Wilson interval, and the per-kind figures ride along as extra columns.
"""

from __future__ import annotations

import os
from typing import Any

from envace_jax.eval import fidelity as F
from envace_jax.eval import progress
from envace_jax.eval.config import (
    REHEARSERS,
    DemoSuiteConfig,  # knobs live with every eval knob
    FidelityBenchConfig,
)
from envace_jax.eval.results import CategoryResult, EntryResult


def benchmark_cases(cfg: FidelityBenchConfig) -> list[F.FidelityCase]:
    """Every logged call of the configured BFCL categories, tau2 domains and demo tasks, in that order."""
    cases: list[F.FidelityCase] = []
    if cfg.bfcl_categories:
        from envace_jax.envs import bfcl

        for cat in cfg.bfcl_categories:
            entries = bfcl.load_entries(cat)
            entries = entries[: cfg.limit] if cfg.limit else entries
            cases += F.bfcl_cases(entries, bfcl.load_ground_truth(cat), with_reference=cfg.with_reference)
    if cfg.tau2_domains:
        from envace_jax.envs import tau2

        for dom in cfg.tau2_domains:
            tasks = tau2.load_tasks(dom, cfg.tau2_split)
            cases += F.tau2_cases(dom, tasks[: cfg.limit] if cfg.limit else tasks, with_reference=cfg.with_reference)
    if cfg.demo_tasks:
        from envace_jax.eval import demo_eval

        suite = DemoSuiteConfig(num_tasks=cfg.demo_tasks, seed=cfg.seed, split=cfg.demo_split)
        cases += F.demo_cases(demo_eval.load_tasks(suite))
    return cases


def make_rehearser(cfg: FidelityBenchConfig, codec: Any = None, client: Any = None, sampling: Any = None):
    if cfg.rehearser == "oracle":
        return F.oracle_rehearser
    if cfg.rehearser == "constant":
        return F.constant_rehearser()
    if codec is None or client is None:
        raise ValueError("config.fidelity.rehearser='model' needs a model (config.model.model_path or random_tiny)")
    kwargs = {"sampling": sampling} if sampling is not None else {}
    return F.PolicyRehearser(codec, client, batch_size=cfg.batch_size, seed=cfg.seed, progress_bar=True, **kwargs)


def categories(report: F.FidelityReport) -> list[CategoryResult]:
    """One results row per domain (``tau2/retail`` -> ``tau2_retail``): an entry per call, valid = exact
    match; extra = the kind split."""
    by_domain: dict[str, list[F.CallScore]] = {}
    for s in report.scores:
        by_domain.setdefault(s.domain, []).append(s)
    summ = report.summary()
    out = []
    for dom, rows in by_domain.items():
        entries = []
        for n, s in enumerate(rows):
            why = (
                None
                if s.exact == 1.0
                else (
                    "unparsed"
                    if not s.parsed
                    else "error_flag_differs"
                    if not s.error_agreement
                    else "response_differs"
                )
            )
            entries.append(
                EntryResult(
                    f"{s.task_uid}#{n}:{s.tool}",
                    s.exact == 1.0,
                    why,
                    {"kind": s.kind, "real_error": s.real_error, "field": s.field, "tool_label": s.tool_label},
                )
            )
        d, kinds = summ["by_domain"][dom], summ["by_domain_kind"][dom]
        extra = {
            "field": d["field"],
            "error_agreement": d["error_agreement"],
            "exact_read_only": kinds["read_only"]["exact"],
            "exact_state_changing": kinds["state_changing"]["exact"],
            "state_changing_calls": d["state_changing"],
            "real_errors": d["real_errors"],
            "optimistic_hallucination": d["optimistic_hallucination"],
            "pessimistic_hallucination": d["pessimistic_hallucination"],
        }
        out.append(CategoryResult(dom.replace("/", "_"), entries, extra))  # the name is also a file name
    return out


def write_report(report: F.FidelityReport, out_dir: str) -> dict[str, str]:
    """Writes ``fidelity.md`` and ``fidelity.json`` (with every call) into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "fidelity.md"), "w", encoding="utf-8") as f:
        f.write(report.to_markdown())
    with open(os.path.join(out_dir, "fidelity.json"), "w", encoding="utf-8") as f:
        f.write(report.to_json(with_calls=True))
    return {"fidelity_md": "fidelity.md", "fidelity_json": "fidelity.json"}


def run(
    cfg: FidelityBenchConfig, out_dir: str, *, codec: Any = None, client: Any = None, sampling: Any = None
) -> tuple[F.FidelityReport, list[CategoryResult], dict[str, str]]:
    """Builds the cases, scores the configured rehearser, writes the fidelity files."""
    with progress.stage("fidelity: replaying the logged calls"):
        cases = benchmark_cases(cfg)
    with progress.stage(f"fidelity: the {cfg.rehearser} rehearser on {len(cases)} calls"):
        report = F.evaluate_fidelity(cases, make_rehearser(cfg, codec, client, sampling))
    return report, categories(report), write_report(report, out_dir)


__all__ = [
    "FidelityBenchConfig",
    "REHEARSERS",
    "benchmark_cases",
    "categories",
    "make_rehearser",
    "run",
    "write_report",
]
