"""Test-time private rehearsal on the demo suite with the demo-trained model (issue 7's demo table).

Loads the model the demo exported (``run_dir/model``, Hugging Face format) and the demo tokenizer,
then runs the held-out tasks against the real (JSON-normalised) demo worlds with N imagined episodes
before the real one, for each N and mode; writes ``rehearsal_sweep.md`` / ``.json`` with 95% CIs, the
paired rows of N = k against N = 0, and per setting its cost (seconds, extra tokens per task) and what its
rehearsals predicted against what the tools did (``eval.imagined_fidelity``). With ``task_family`` other than
"default" (the irreversible wire tasks of issue 36) everything goes to ``run_dir/rehearsal_<family>/``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Sequence

from envace_jax.demo import arms
from envace_jax.demo import data as demo_data
from envace_jax.demo import pretrain, stages
from envace_jax.demo.config import DemoConfig, tool_names
from envace_jax.eval import imagined_fidelity, paired

MODEL_DIR = "model"


def export_model(model, run_dir: str, codec=None) -> str:
    """Writes the live model to ``run_dir/model`` (safetensors + config) next to the demo tokenizer.

    With ``codec``, its stop and pad ids go into config.json and generation_config.json, so transformers'
    ``generate`` on the export stops where our sampler does instead of running to its length limit."""
    from envace_jax.models import hf_io

    out = os.path.join(run_dir, MODEL_DIR)
    ids = {} if codec is None else {"eos_token_ids": codec.stop_token_ids, "pad_token_id": codec.pad_token_id}
    hf_io.save_hf(model, out, **ids)
    return out


def sweep_settings(ns: Sequence[str], modes: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The sweep's numbers of rehearsals and modes from their command-line spellings, checked: distinct
    N >= 0 (N = 0 is the baseline every other N is paired against) and modes of ``REHEARSAL_MODES``."""
    from envace_jax.config import ConfigError
    from envace_jax.eval.config import REHEARSAL_MODES

    try:
        n_values = tuple(int(n) for n in ns)
    except ValueError:
        raise ConfigError(f"--sweep_ns must be integers, got {','.join(ns)!r}") from None
    if not n_values or any(n < 0 for n in n_values) or len(set(n_values)) != len(n_values):
        raise ConfigError(f"--sweep_ns must be distinct integers >= 0, got {','.join(ns)!r}")
    bad = [m for m in modes if m not in REHEARSAL_MODES]
    if not modes or bad or len(set(modes)) != len(modes):
        raise ConfigError(f"--sweep_modes must be distinct names of {list(REHEARSAL_MODES)}, got {','.join(modes)!r}")
    return n_values, tuple(modes)


def demo_rehearsal_config(cfg: DemoConfig, n: int):
    """The demo's test-time rehearsal settings (``rehearsal_*`` fields) with ``n`` imagined episodes: the one
    source of the memory's settings, at test time and in RL prompts (``demo.rl_memory``)."""
    from envace_jax.eval.rehearsal import RehearsalConfig

    return RehearsalConfig(
        n=n,
        max_tokens_per_rehearsal=1024,
        max_memory_chars=cfg.rehearsal_max_memory_chars,
        temperature=cfg.rehearsal_temperature,
        place_memory=cfg.rehearsal_place_memory,
        seed=cfg.seed,
        real_reads=tool_names(cfg.rehearsal_real_reads),
        memory_tools=tool_names(cfg.rehearsal_memory_tools),
    )


def run_rehearsal_table(
    cfg: DemoConfig,
    run_dir: str,
    *,
    ns: Sequence[int] = (0, 1, 2),
    modes: Sequence[str] = ("parallel", "sequential"),
    num_tasks: int | None = None,
    model_dir: str | None = None,
) -> dict[str, Any]:
    from envace_jax.chat import load_tokenizer
    from envace_jax.eval import demo_eval
    from envace_jax.models import hf_io

    model_dir = model_dir or os.path.join(run_dir, MODEL_DIR)
    tok_dir = os.path.join(run_dir, "tokenizer")
    for path, what in ((model_dir, "the exported demo model (run `make demo` first)"), (tok_dir, "the demo tokenizer")):
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path}: missing {what}")
    # REHEARSE's prompt is the one the run's base was trained with
    described = cfg.from_base and pretrain.load_base(cfg.base_dir).config.rehearse_tool_descriptions
    codec = demo_data.make_codec(load_tokenizer(tok_dir), described)
    model = hf_io.load_hf(model_dir)
    # Another task family than the default writes everything (its data, per-task outcomes, tables) under
    # RUN_DIR/rehearsal_<family>/, so the run's own files (of the tasks it was evaluated on) stay as they are.
    out_dir = sweep_dir(cfg, run_dir)
    os.makedirs(out_dir, exist_ok=True)
    # The tasks go through the same tfds + grain path as in the demo run (reused from out_dir/data when it
    # exists), so the prompts are the very records the model was trained and evaluated on.
    split = cfg.eval_split
    tasks = demo_data.write_and_read({split: demo_data.held_out_tasks(cfg, split)}, os.path.join(out_dir, "data"))[
        split
    ]
    tasks = tasks[: num_tasks or len(tasks)]
    # The rehearsal memory goes into the system prompt: leave room for it.
    rollout = stages.rollout_config(cfg, "real", greedy=True)
    rollout = dataclasses.replace(rollout, max_model_len=max(cfg.max_model_len, 1536))
    base = demo_rehearsal_config(cfg, n=0)
    runs: dict = {}
    # The demo's evaluation client: with cfg.rolling, eval_batch slots that the tasks pass through (a lockstep
    # call over all the tasks at once holds every row's cache: 2,048 wire tasks went past 21 GB).
    client = stages.make_client(model, codec, cfg.replace(max_model_len=rollout.max_model_len), slots=cfg.eval_batch)
    result, cats = demo_eval.sweep(
        tasks,
        codec,
        client,
        rollout,
        base,
        ns,
        modes,
        make_env=demo_data.make_real_env,
        runs=runs,
    )
    # what the rehearsals predicted against what the tools did, for each setting with rehearsals
    for row in result.rows:
        if row["n"] > 0:
            row["fidelity"] = imagined_fidelity.fidelity_split(
                runs[(row["mode"], row["n"])], tasks, demo_data.make_real_env
            )
    # per-task outcomes of each N (eval_n0_tasks.jsonl, eval_n1_tasks.jsonl, ...) and N = k against N = 0
    outcomes = {}
    for row, cat in zip(result.rows, cats):
        arm = arms.rehearsal_arm(row["n"], row["mode"])
        if arm not in outcomes:
            outcomes[arm] = paired.outcomes_of([e.id for e in cat.entries], [e.detail["score"] for e in cat.entries])
            paired.write_outcomes(out_dir, arm, outcomes[arm])
            if row["n"] > 0:
                write_rehearsals(out_dir, arm, runs[(row["mode"], row["n"])])
    paired_text, paired_rows = arms.paired_section(outcomes, arms.REHEARSAL_PAIRS)
    header = (
        f"# Test-time rehearsal on the demo suite ({cfg.eval_split} split, task family {cfg.task_family}, "
        f"{len(tasks)} tasks, real tools, greedy)\n\nModel: {model_dir}. N imagined episodes (REHEARSE plays the "
        f"tools, no logged results) are condensed into a memory in the system prompt before the one real episode "
        f"(placed: {cfg.rehearsal_place_memory}).\n\n"
    )
    markdown = (
        result.to_markdown()
        + f"\nCost and fidelity per setting:\n\n{cost_table(result.rows, len(tasks))}"
        + outcome_tables(result.rows)
        + (f"\nPaired against N = 0 on the same tasks (A - B):\n\n{paired_text}\n" if paired_text else "")
    )
    with open(os.path.join(out_dir, "rehearsal_sweep.md"), "w", encoding="utf-8") as f:
        f.write(header + markdown)
    with open(os.path.join(out_dir, "rehearsal_sweep.json"), "w", encoding="utf-8") as f:
        json.dump({"rows": result.rows, "paired": paired_rows}, f, indent=2)
    return {"rows": result.rows, "markdown": markdown, "paired": paired_rows, "dir": out_dir}


def write_rehearsals(out_dir: str, arm: str, run) -> str:
    """``eval_<arm>_rehearsals.jsonl``: per task, the memory placed and what each rehearsal imagined, so that
    a gate or a memory format can be studied offline against the arm's per-task outcomes."""
    from envace_jax.eval.rehearsal import rehearsal_record

    path = os.path.join(out_dir, f"eval_{arm}_rehearsals.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for t in run.rehearsals:
            f.write(json.dumps(rehearsal_record(t), ensure_ascii=False) + "\n")
    return path


def outcomes_of_records(cfg: DemoConfig, run_dir: str, arm: str) -> dict[str, Any]:
    """What the rehearsals of a finished sweep's arm (``n1``, ``n2``, ``n2_sequential``...) predicted against what the
    tools did, recomputed from its ``eval_<arm>_rehearsals.jsonl`` (no model runs): ``fidelity_split``'s
    counts and their markdown tables. ``cfg`` must be the sweep's (its seed, task family and split give the
    tasks the records name)."""
    from envace_jax.eval.rehearsal import RehearsalRun, rehearsal_from_record

    path = os.path.join(sweep_dir(cfg, run_dir), f"eval_{arm}_rehearsals.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no rehearsal records of arm {arm!r} (run --rehearsal_sweep first)")
    with open(path, encoding="utf-8") as f:
        rehearsals = [rehearsal_from_record(json.loads(line)) for line in f if line.strip()]
    tasks = {str(t["uid"]): t for t in demo_data.held_out_tasks(cfg, cfg.eval_split)}
    missing = [r.uid for r in rehearsals if r.uid not in tasks]
    if missing:
        raise ValueError(
            f"{len(missing)} of the {len(rehearsals)} tasks in {path} are not in the {cfg.eval_split} split of this "
            f"config (first: {missing[0]}): pass the sweep's own --config settings (seed, task family, task count)"
        )
    run = RehearsalRun(demo_rehearsal_config(cfg, n=0), [], rehearsals)
    fid = imagined_fidelity.fidelity_split(run, [tasks[r.uid] for r in rehearsals], demo_data.make_real_env)
    used = " / ".join(str(fid["used"][k]) for k in imagined_fidelity.KINDS)
    markdown = (
        f"# What the rehearsals of {arm} predicted against what the tools did ({len(rehearsals)} tasks, memory "
        f"placed in {fid['tasks_used']})\n\nImagined steps of the placed memories: exact / same outcome / wrong "
        f"outcome {used}.\n\n" + imagined_fidelity.outcome_section(fid, top=15)
    )
    return {"fidelity": fid, "markdown": markdown}


def sweep_dir(cfg: DemoConfig, run_dir: str) -> str:
    """Where ``run_rehearsal_table`` writes: the run directory for the default tasks, else its
    ``rehearsal_<family>`` subdirectory."""
    return run_dir if cfg.task_family == "default" else os.path.join(run_dir, f"rehearsal_{cfg.task_family}")


def outcome_tables(rows: Sequence[Mapping[str, Any]]) -> str:
    """Per setting with rehearsals, what the imagined steps of the placed memories predicted (success or
    refusal) against what each tool did when the same calls were replayed on the real world."""
    parts = [
        f"\nPredicted against real, imagined steps of the placed memories ({r['mode']}, N = {r['n']}):\n\n"
        + imagined_fidelity.outcome_section(r["fidelity"])
        for r in rows
        if r.get("fidelity") and r["fidelity"].get("by_tool")
    ]
    return "".join(parts)


def cost_table(rows: Sequence[Mapping[str, Any]], num_tasks: int) -> str:
    """Seconds and extra tokens per task of each setting, and the fidelity split of the imagined steps of the
    rehearsals whose memory was used (``eval.imagined_fidelity``)."""
    lines = [
        "| mode | N | seconds | seconds/task | extra gen tokens/task | extra prompt tokens/task | tasks with memory "
        "| imagined steps used: exact / same outcome / wrong outcome | all imagined steps: exact / same / wrong |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    seen_zero = False
    for r in rows:
        if r["n"] == 0:
            if seen_zero:
                continue
            seen_zero = True
        fid = r.get("fidelity")
        used = all_ = "-"
        if fid is not None:
            used = " / ".join(str(fid["used"][k]) for k in imagined_fidelity.KINDS)
            all_ = " / ".join(str(fid["all"][k]) for k in imagined_fidelity.KINDS)
        mode = "-" if r["n"] == 0 else r["mode"]
        lines.append(
            f"| {mode} | {r['n']} | {r['seconds']:.1f} | {r['seconds'] / max(1, num_tasks):.3f} | "
            f"{r['extra_generated_tokens']:.1f} | {r['extra_prompt_tokens']:.1f} | "
            f"{'-' if fid is None else fid['tasks_used']} | {used} | {all_} |"
        )
    return "\n".join(lines) + "\n"
