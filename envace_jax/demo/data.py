"""Demo data: task splits through tfds + grain, the demo tokenizer, and SFT rows for both roles.

JSON normal form. A rehearsed response reaches the caller re-serialised by ``parse_simulator_output``
(``json.dumps`` with default separators), while the demo worlds answer in compact canonical JSON. So
that a correct rehearsal and the real tool hand the caller the *same tokens*, the demo shows every tool
response in the parser's normal form: reference conversations are rewritten once at generation time,
and the real environment is wrapped (``NormalizedEnv``). Content is unchanged; only spacing differs.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import json
import os
from typing import Any, Mapping, Sequence

from envace_jax.chat import Qwen3ChatCodec, SimulatorPromptOptions, build_demo_tokenizer, load_tokenizer
from envace_jax.chat.simulator import is_failed_result
from envace_jax.data.demo_tasks import HAPPY, PUSH_BACK, branch_plan, generate_tasks, world_model_examples
from envace_jax.envs.base import ToolEnvironment, ToolResult
from envace_jax.envs.demo_worlds import make_env
from envace_jax.eval.fidelity import caller_raw_text, demo_cases, real_view
from envace_jax.rl.types import ACT, REHEARSE, Generation

DATASET_NAME = "envace_demo"
SIM_OPTIONS = SimulatorPromptOptions(few_shot=True, append_think=False, compact=True)
# Merges may span words (the tool-schema block and the prompts' fixed wording shrink to a few tokens,
# rows are ~4x shorter than with Qwen3's split) while digits stay single tokens, so reading a number
# out of a tool response is a copy the tiny model learns quickly.
PRE_SPLIT = "lines_digits"


def normal_json(content: str) -> str:
    """The JSON text the simulator parser would hand the caller for the same value."""
    try:
        return json.dumps(json.loads(content), ensure_ascii=False)
    except (TypeError, ValueError):
        return content


def normalize_task(task: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(task))
    for m in out["reference_messages"]:
        if m.get("role") == "tool":
            m["content"] = normal_json(m["content"])
    return out


class NormalizedEnv(ToolEnvironment):
    """A demo world whose responses are shown in the parser's JSON normal form (module docstring)."""

    def __init__(self, inner: ToolEnvironment):
        self.inner = inner

    def reset(self, task):
        self.inner.reset(task)

    @property
    def tool_schemas(self):
        return self.inner.tool_schemas

    def execute(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        r = self.inner.execute(name, arguments)
        return ToolResult(normal_json(r.content), r.error)


def make_real_env(task: Mapping[str, Any]) -> ToolEnvironment:
    return NormalizedEnv(make_env(task))


# ----------------------------------------------------------------------------- splits


def silent_push_back(task: Mapping[str, Any]) -> bool:
    """A push-back branch that no tool announces: every tool response of the reference conversation
    succeeds, and only the values in them say the plan does not go through ("if ana has at least 28, send
    28 ..." with a balance of 12). Its happy twin starts from the same kind of request."""
    return task.get("branch") == PUSH_BACK and not any(
        m.get("role") == "tool" and is_failed_result(m.get("content")) for m in task["reference_messages"]
    )


def draw_rl_tasks(cfg, exclude_uids: frozenset[str] | set[str] = frozenset()) -> list[dict[str, Any]]:
    """``cfg.rl_tasks`` train tasks at ``cfg.rl_push_back_share`` that are not in ``exclude_uids`` (the
    demonstrations, or every task the base's pretraining corpus showed).

    With ``cfg.rl_silent_odds="natural"`` the share is reached without changing the odds of a silent
    push-back against a happy path of the same task type (``silent_push_back``): forcing a share by branch
    alone fills the push-back slots with, e.g., conditional transfers whose condition fails, and the happy
    slots mostly with other types, so RL meets the condition failing in ~95% of conditional prompts and
    learns to send nothing without reading the balance."""
    family = cfg.task_family
    if family != "default":  # no push-back branch in that family: the share does not apply
        return [normalize_task(t) for t in _draw_excluding(cfg.rl_tasks, cfg.seed, set(exclude_uids), family)]
    if cfg.rl_push_back_share is not None and cfg.rl_silent_odds == "natural":
        return [
            normalize_task(t)
            for t in _draw_keeping_silent_odds(cfg.rl_tasks, cfg.rl_push_back_share, cfg.seed, set(exclude_uids))
        ]
    n = len(exclude_uids) + cfg.rl_tasks if not cfg.from_base else cfg.rl_tasks
    while True:
        pool = generate_tasks(n, cfg.seed, "train", push_back_share=cfg.rl_push_back_share)
        kept = [t for t in pool if t["uid"] not in exclude_uids]
        if len(kept) >= cfg.rl_tasks:
            return [normalize_task(t) for t in kept[: cfg.rl_tasks]]
        n += cfg.rl_tasks - len(kept) + 16


def _draw_excluding(n: int, seed: int, exclude: set[str], family: str) -> list[dict[str, Any]]:
    """The first ``n`` train tasks of ``family``'s natural stream that are not in ``exclude``."""
    size = n + len(exclude)
    while True:
        kept = [t for t in generate_tasks(size, seed, "train", family=family) if t["uid"] not in exclude]
        if len(kept) >= n:
            return kept[:n]
        size += n - len(kept) + 16


def _draw_keeping_silent_odds(n: int, share: float, seed: int, exclude: set[str]) -> list[dict[str, Any]]:
    """``n`` train tasks, ``branch_plan(n, share)``'s count of them push-backs (the first ones of the natural
    stream), and for each task type as many happy tasks per silent push-back taken as the natural stream
    has, while happy slots last (types whose push-backs are most often silent served first); the other
    happy slots take the stream's next happy tasks. Returned in draw order."""
    n_pb = branch_plan(n, share).count(PUSH_BACK)
    size = 8 * n + 64
    while True:
        pool = [t for t in generate_tasks(size, seed, "train") if t["uid"] not in exclude]  # natural mix
        push_backs = [i for i, t in enumerate(pool) if t["branch"] == PUSH_BACK]
        happy = [i for i, t in enumerate(pool) if t["branch"] == HAPPY]
        if len(push_backs) >= n_pb and len(happy) >= n - n_pb:
            break
        size *= 2
    taken = push_backs[:n_pb]
    silent = [silent_push_back(t) for t in pool]  # parses each tool reply: once per task
    by_type = collections.Counter(t["task_type"] for t in pool)
    silent_in_pool = collections.Counter(t["task_type"] for t, s in zip(pool, silent) if s)
    happy_in_pool = collections.Counter(pool[i]["task_type"] for i in happy)
    silent_taken = collections.Counter(pool[i]["task_type"] for i in taken if silent[i])
    # Types whose push-backs are most often silent first: their odds matter most, and when the happy
    # slots run out the types where silence is rare are the ones left skewed.
    want, free = {}, n - n_pb
    for k in sorted(silent_taken, key=lambda k: (-silent_in_pool[k] / by_type[k], k)):
        want[k] = min(free, int(round(silent_taken[k] * happy_in_pool[k] / silent_in_pool[k])))
        free -= want[k]
    paired = []
    for i in happy:
        if want.get(pool[i]["task_type"], 0) > 0:
            want[pool[i]["task_type"]] -= 1
            paired.append(i)
    kept = set(paired)
    rest = [i for i in happy if i not in kept][: n - n_pb - len(paired)]
    return [pool[i] for i in sorted(taken + paired + rest)]


def generate_splits(cfg, exclude_uids: frozenset[str] | set[str] = frozenset()) -> dict[str, list[dict[str, Any]]]:
    """train: (from scratch) the first ``sft_tasks`` natural-mix demonstrations, then the RL prompts;
    (from a base) the RL prompts only, none of them in ``exclude_uids``. validation and test: held-out tasks
    at ``cfg.eval_push_back_share``."""
    demos = [] if cfg.from_base else [normalize_task(t) for t in generate_tasks(cfg.sft_tasks, cfg.seed, "train")]
    exclude = set(exclude_uids) | {t["uid"] for t in demos}
    return {
        "train": demos + draw_rl_tasks(cfg, exclude),
        "validation": held_out_tasks(cfg, "validation"),
        "test": held_out_tasks(cfg, "test"),
    }


def held_out_tasks(cfg, split: str) -> list[dict[str, Any]]:
    n = {"validation": cfg.validation_tasks, "test": cfg.test_tasks}[split]
    family = cfg.task_family
    share = cfg.eval_push_back_share if family == "default" else None  # that family has no push-back branch
    return [normalize_task(t) for t in generate_tasks(n, cfg.seed, split, push_back_share=share, family=family)]


def write_and_read(splits: Mapping[str, Sequence[Mapping[str, Any]]], data_dir: str) -> dict[str, list[dict]]:
    """Writes the splits as a tfds array_record dataset, then reads every split back through grain.

    tfds stores examples in hash order, so each split is put back into generation order by uid (the
    first ``sft_tasks`` train tasks are the demonstrations).
    """
    from envace_jax.data.pipeline import PipelineConfig, PromptIterator
    from envace_jax.data.tfds_builder import dataset_dir, read_split, write_tfds

    if not os.path.exists(os.path.join(dataset_dir(data_dir, DATASET_NAME), "dataset_info.json")):
        write_tfds(splits, data_dir, DATASET_NAME)
    out = {}
    for split, recs in splits.items():
        raw = read_split(data_dir, DATASET_NAME, split, decode=False)
        it = PromptIterator(
            raw,
            PipelineConfig(
                batch_size=1,
                shuffle=False,
                num_epochs=1,
                drop_remainder=False,
                shard_index=0,
                shard_count=1,
                read_threads=0,
                prefetch=0,
            ),
        )
        by_uid = {batch[0]["uid"]: batch[0] for batch in it}
        missing = [r["uid"] for r in recs if r["uid"] not in by_uid]
        if missing or len(by_uid) != len(recs):
            raise RuntimeError(
                f"demo data in {data_dir}: split {split!r} read back {len(by_uid)} records for "
                f"{len(recs)} written; missing {missing[:3]} (delete the directory to regenerate)"
            )
        out[split] = [by_uid[r["uid"]] for r in recs]
    return out


# ----------------------------------------------------------------------------- tokenizer and codec


def make_codec(tok, tool_descriptions: bool = False) -> Qwen3ChatCodec:
    """The demo's codec; ``tool_descriptions``: REHEARSE's compact prompt carries the tools' descriptions
    (``SimulatorPromptOptions.tool_descriptions``; a base records it as ``rehearse_tool_descriptions``)."""
    options = dataclasses.replace(SIM_OPTIONS, tool_descriptions=tool_descriptions)
    return Qwen3ChatCodec(tok, enable_thinking=False, simulator_thinking=False, simulator_options=options)


def build_tokenizer(tasks: Sequence[Mapping[str, Any]], out_dir: str, vocab_size: int, extra_texts: Sequence[str] = ()):
    """Trains the demo BPE on ACT transcripts and REHEARSE prompts of ``tasks`` (train split only), plus
    ``extra_texts`` (e.g. rehearsal memories, so their fixed wording merges into a few tokens)."""
    if os.path.exists(os.path.join(out_dir, "tokenizer.json")):
        return load_tokenizer(out_dir)
    from envace_jax.chat import build_simulator_messages, render_chat_text

    texts = []
    for t in tasks:
        system = [m for m in t["messages"] if m["role"] == "system"]
        texts.append(render_chat_text(system + t["reference_messages"], t["tools"], enable_thinking=False))
        for c in demo_cases([t]):
            msgs = build_simulator_messages(
                tools=t["tools"],
                history=c.history,
                caller_text=c.caller_text,
                call_name=c.call[1],
                call_arguments=c.call[2],
                reference_messages=t["reference_messages"],
                options=SIM_OPTIONS,
            )
            texts.append(render_chat_text(msgs, None, enable_thinking=False) + rehearse_target(c.real_content, False))
    texts += list(extra_texts)
    tmp = f"{out_dir}.tmp{os.getpid()}"
    build_demo_tokenizer(texts, tmp, vocab_size=vocab_size, pre_split=PRE_SPLIT)
    os.replace(tmp, out_dir)
    return load_tokenizer(out_dir)


# ----------------------------------------------------------------------------- SFT rows


def rehearse_target(content: str, error: bool) -> str:
    """What REHEARSE should emit after its generation prompt for a real response ``content``."""
    return f"\n<execution_result>\n{json.dumps(real_view(content, error), ensure_ascii=False)}\n</execution_result>"


def _row(role: str, prompt: list[int], target: list[int], uid: str, episode: int, turn: int) -> Generation:
    return Generation(role, list(prompt), list(target), [0.0] * len(target), uid, episode, turn)


def act_rows(task: Mapping[str, Any], codec: Qwen3ChatCodec, episode: int = 0) -> list[Generation]:
    """One row per assistant message of the reference conversation, on the context the rollout engine
    would have built (initial render, then the engine's incremental pieces)."""
    r = codec.renderer
    end = [r.im_end_id]
    msgs = [dict(m) for m in task["messages"]]
    ctx = codec.caller_prompt(msgs, task["tools"])
    ref = task["reference_messages"]
    # reference_messages starts with the first user message, already in the prompt
    first_user = next(i for i, m in enumerate(ref) if m["role"] == "user")
    rows, turn, i = [], 0, first_user + 1
    while i < len(ref):
        m = ref[i]
        if m["role"] == "assistant":
            target = r.encode(caller_raw_text(m)) + end
            rows.append(_row(ACT, ctx, target, task["uid"], episode, turn))
            ctx = ctx + target + codec.close_assistant(target)
            i += 1
            tools = []
            while i < len(ref) and ref[i]["role"] == "tool":
                tools.append(ref[i])
                i += 1
            if tools:
                ctx = ctx + codec.tool_block(tools)
        elif m["role"] == "user":
            turn += 1
            ctx = ctx + codec.user_block(m)
            i += 1
        else:
            raise ValueError(f"task {task['uid']}: unexpected {m['role']!r} message at reference index {i}")
    return rows


def rehearse_rows(task: Mapping[str, Any], codec: Qwen3ChatCodec, episode: int = 0) -> list[Generation]:
    """One row per logged call: the real REHEARSE prompt and the real response as the target."""
    end = [codec.renderer.im_end_id]
    rows = []
    for c in demo_cases([task]):
        prompt = codec.simulator_prompt(c.record, c.history, c.caller_text, c.call)
        target = codec.renderer.encode(rehearse_target(c.real_content, c.real_error)) + end
        rows.append(_row(REHEARSE, prompt, target, task["uid"], episode, 0))
    return rows


# World-model rows come from their own stream of train worlds (not the demonstrations, not the RL prompts).
WORLD_MODEL_TASK_SEED_OFFSET = 7919


def world_model_rows(
    n: int, seed: int, codec: Qwen3ChatCodec, episode0: int = 0, exclude_uids: frozenset[str] | set[str] = frozenset()
) -> list[Generation]:
    """REHEARSE rows from real executions of varied calls (wrong ones included) on fresh worlds.

    Each call is posed as the task's first assistant step (history = system + first user message).
    The worlds are train tasks of a separate seed stream with ``exclude_uids`` removed.
    """
    examples = world_model_examples(n, seed, task_seed=seed + WORLD_MODEL_TASK_SEED_OFFSET, exclude_uids=exclude_uids)
    return rows_of_world_model_examples(examples, codec, episode0)


def rows_of_world_model_examples(examples, codec: Qwen3ChatCodec, episode0: int = 0) -> list[Generation]:
    """One REHEARSE row per real execution: the call posed as the task's first assistant step (history =
    system + first user message), the real response as the target."""
    end = [codec.renderer.im_end_id]
    rows = []
    for k, ex in enumerate(examples):
        task = normalize_task(ex.task)
        system = [m for m in task["messages"] if m["role"] == "system"]
        first_user = next(m for m in task["reference_messages"] if m["role"] == "user")
        call = {"id": "call_wm", "type": "function", "function": dict(ex.call)}
        caller = caller_raw_text({"role": "assistant", "content": "", "tool_calls": [call]})
        prompt = codec.simulator_prompt(
            task, system + [first_user], caller, ("call_wm", ex.call["name"], ex.call["arguments"])
        )
        content = normal_json(ex.response)
        err = is_failed_result(content)
        target = codec.renderer.encode(rehearse_target(content, err)) + end
        rows.append(_row(REHEARSE, prompt, target, task["uid"], episode0 + k, 0))
    return rows


def sft_rows(
    demos: Sequence[Mapping[str, Any]],
    codec: Qwen3ChatCodec,
    wm_rows: int,
    seed: int,
    exclude_uids: frozenset[str] | set[str] = frozenset(),
) -> list[Generation]:
    """Both roles' rows of the demonstrations, plus ``wm_rows`` world-model rows on worlds outside
    ``exclude_uids`` (pass the RL prompts' uids)."""
    rows: list[Generation] = []
    for e, t in enumerate(demos):
        rows += act_rows(t, codec, e) + rehearse_rows(t, codec, e)
    exclude = set(exclude_uids) | {t["uid"] for t in demos}
    rows += world_model_rows(wm_rows, seed, codec, len(demos), exclude_uids=exclude)
    return rows


__all__ = [
    "DATASET_NAME",
    "NormalizedEnv",
    "SIM_OPTIONS",
    "act_rows",
    "build_tokenizer",
    "generate_splits",
    "make_codec",
    "make_real_env",
    "normal_json",
    "normalize_task",
    "rehearse_rows",
    "rehearse_target",
    "sft_rows",
    "silent_push_back",
    "draw_rl_tasks",
    "held_out_tasks",
    "world_model_rows",
    "write_and_read",
]
