"""Short task records whose checklist a random tiny policy sometimes passes (so advantages are not
all zero), and a tiny config for end-to-end runs of launch/train.py."""

from __future__ import annotations

import functools
import json
import os
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}
LETTERS = "aeionrst"


def short_task(i: int) -> dict:
    letter = LETTERS[i % len(LETTERS)]
    item = {
        "question": f"Does the reply contain {letter!r}?",
        "focus_on": "assistant.content.user_visible_reply",
        "pass_condition": f"The reply contains {letter!r}.",
        "failure_examples": ["No such letter."],
        "evidence": [],
        "weight": 1.0,
        "required_for_next_turn": False,
        "rule": {"type": "reply_contains", "values": [letter]},
    }
    user = {"role": "user", "content": f"Task {i}: write a word with the letter {letter}."}
    return {
        "uid": f"short-{i}",
        "data_source": "test",
        "messages": [{"role": "system", "content": "Be brief."}, user],
        "tools": [TOOL],
        "reference_messages": [user, {"role": "assistant", "content": f"{letter}{letter}"}],
        "checklist": [[[item]]],
    }


def write_tasks(path: str, n: int = 16) -> str:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps(short_task(i)) + "\n")
    return path


@functools.lru_cache(maxsize=None)
def shared_dir() -> str:
    """One temp dir per test process holding the task file and a prebuilt demo tokenizer."""
    d = tempfile.mkdtemp(prefix="envace_loop_")
    write_tasks(os.path.join(d, "tasks.jsonl"))
    return d


def tokenizer_dir() -> str:
    from envace_jax.config import load_config
    from envace_jax.rl import train as rl_train

    out = os.path.join(shared_dir(), "tok_run")
    if not os.path.exists(os.path.join(out, "tokenizer", "tokenizer.json")):
        rl_train.build_tokenizer(load_config({"run_dir": out, "tokenizer": {"demo_vocab_size": 480}}))
    return os.path.join(out, "tokenizer")


def _tiny_kv(run_dir: str, steps: int, **extra) -> dict:
    kv = {
        "run_dir": run_dir,
        "total_steps": steps,
        "tokenizer.path": tokenizer_dir(),
        "data.source": "jsonl",
        "data.path": os.path.join(shared_dir(), "tasks.jsonl"),
        "data.prompts_per_step": 2,
        "rl.n_rollouts": 4,
        "rl.max_row_length": 320,
        "rl.length_multiple": 64,
        "rl.micro_batch_size": 8,
        "rollout.max_steps": 1,
        "rollout.max_assistant_turns": 1,
        "rollout.max_user_turns": 1,
        "rollout.act.max_new_tokens": 16,
        "rollout.rehearse.max_new_tokens": 16,
        "optim.lr": 0.01,
        "checkpoint.every": 1,
        "checkpoint.keep": 2,
        "checkpoint.async_save": True,
        "log.progress_bar": False,
        "log.plot": False,
        "log.tensorboard": False,
    }
    kv.update(extra)
    return kv


def tiny_overrides(run_dir: str, steps: int, **extra) -> list[str]:
    """Command-line overrides for a fast, deterministic demo run (one ACT call per episode)."""
    return [f"--config.{k}={v}" for k, v in _tiny_kv(run_dir, steps, **extra).items()]


def tiny_config(run_dir: str, steps: int, **extra):
    """The ``ExperimentConfig`` that ``train_cmd(run_dir, steps, **extra)`` runs, for in-process tests.
    Same shapes as the subprocess runs, so with ``use_compile_cache()`` they share compiled programs."""
    from envace_jax.config import config_from_file, load_config

    c = config_from_file(os.path.join(ROOT, "configs", "demo_cpu.py"))
    for k, v in _tiny_kv(run_dir, steps, **extra).items():
        *head, last = k.split(".")
        node = c
        for part in head:
            node = node[part]
        node[last] = v
    return load_config(c)


def use_compile_cache() -> None:
    """Points this process's JAX persistent compilation cache at the directory the subprocesses use."""
    import jax

    jax.config.update("jax_compilation_cache_dir", os.path.join(shared_dir(), "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def train_cmd(run_dir: str, steps: int, *extra_flags: str, **overrides) -> list[str]:
    import sys

    return [
        sys.executable,
        os.path.join(ROOT, "launch", "train.py"),
        f"--config={ROOT}/configs/demo_cpu.py",
        *tiny_overrides(run_dir, steps, **overrides),
        *extra_flags,
    ]


def env() -> dict:
    # A persistent compilation cache shared by the subprocesses of a test: the same programs are
    # compiled once, not once per process (the same executable also gives the same bits).
    return dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        TOKENIZERS_PARALLELISM="false",
        JAX_COMPILATION_CACHE_DIR=os.path.join(shared_dir(), "jax_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )


def metrics_lines(run_dir: str) -> list[dict]:
    """Every whole line of ``<run_dir>/metrics.jsonl`` in order, repeats included; a last line still being
    written (no newline yet) by a run the test watches is left out."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.endswith("\n") and x.strip()]
