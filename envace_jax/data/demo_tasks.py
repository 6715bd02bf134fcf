"""Deterministic generator of the demo tool-use tasks (CM2 checklist records) and world-model rows.

A task is played in one of the four worlds of ``envace_jax.envs.demo_worlds``. Its reference
conversation is not written by hand: an oracle script *executes* its plan against the real
world, so every tool message in ``reference_messages`` is exactly what the world returns, and
the final answers copy values out of those responses. Each user turn gets checklist items with
the natural-language fields of CM2 plus a machine-checkable ``rule`` (one ``tool_called`` item
per required call, one ``reply_contains`` item for the answer). The oracle scripts of each world are in
``envace_jax.data.task_builders``; this module draws them and turns a recording into a task record.

Tasks need 1-4 calls; about a third get a follow-up user turn played in the same world state.
The reference's few-shot block (every logged call of the conversation) is what grounds
REHEARSE, so a generated conversation never holds one call (name + arguments) twice with two
different responses: such a draw is rejected and re-sampled.

Splits are disjoint by construction: a task belongs to the split named by a hash of its
content (80% train, 10% validation, 10% test buckets), and each split draws from its own
seeded stream, rejecting draws that hash into another split's bucket or repeat one already made.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Callable, NamedTuple, Sequence

from envace_jax.chat.template import render_chat_text
from envace_jax.data.task_builders import (
    RULE_WORLD_TASKS,
    WORLD_TASKS,
    Builder,
    Recorder,
    Reject,
    WorldTasks,
    normalise_weights,
)
from envace_jax.envs.demo_worlds import ALL_WORLDS, WORLDS, DemoWorld, canonical_json, sample_call, tool_schemas

SPLITS = ("train", "validation", "test")
# Branch kinds. HAPPY: every tool answers and the plan the user asked for goes through. PUSH_BACK: the
# environment pushes back (a tool returns an error, or a value it returns makes the user's condition fail),
# so the right reply depends on what the tool said.
HAPPY, PUSH_BACK = "happy", "push_back"
BRANCHES = (HAPPY, PUSH_BACK)
_BUCKETS = {"train": range(0, 8), "validation": range(8, 9), "test": range(9, 10)}
MAX_CALLS = 4
FOLLOW_UP_PROB = 0.35
# Task families: "default" (the demo's four worlds) and "irreversible" (the opt-in wire world, whose wrong
# calls cannot be undone and whose rules are in the tool descriptions: the test-time rehearsal tasks). Each
# family draws from its own seeded stream, so adding one never changes another's tasks.
FAMILIES: dict[str, dict[str, WorldTasks]] = {"default": WORLD_TASKS, "irreversible": RULE_WORLD_TASKS}


def _play_one(rng: random.Random, rec: Recorder, tasks: list[tuple[str, Builder, int]]) -> None:
    """Draws a task type by weight and plays its user turn."""
    name, builder, _ = rng.choices(tasks, weights=[w for _, _, w in tasks])[0]
    rec.types.append(name)
    builder(rng, rec)


def _build_task(rng: random.Random, world: str, family: str = "default") -> dict[str, Any]:
    spec = FAMILIES[family][world]
    state = spec.state(rng)
    rec = Recorder(ALL_WORLDS[world](state))
    _play_one(rng, rec, spec.tasks)
    if rng.random() < FOLLOW_UP_PROB:
        _play_one(rng, rec, spec.tasks)
    if not 1 <= rec.n_calls <= MAX_CALLS:
        raise Reject(f"{rec.n_calls} calls")
    for items in rec.turns:
        normalise_weights(items)
    system = {"role": "system", "content": spec.system(state)}
    return {
        "uid": "",
        "data_source": f"envace_demo/{world}",
        "messages": [system, dict(rec.messages[0])],
        "tools": tool_schemas(world, state),
        "reference_messages": rec.messages,
        "checklist": [rec.turns],
        "env": {"name": world, "state": state},
        # not read by any model or judge: labels for reporting and for drawing split mixes
        "branch": PUSH_BACK if rec.push_back else HAPPY,
        "task_type": f"{world}/{rec.types[0]}",
    }


def task_content_key(task: dict[str, Any]) -> str:
    """Hash of what makes a task distinct (world, initial state, user turns); decides its split."""
    users = [m["content"] for m in task["reference_messages"] if m["role"] == "user"]
    return hashlib.sha256(canonical_json({"env": task["env"], "users": users}).encode()).hexdigest()


def split_of(task: dict[str, Any]) -> str:
    bucket = int(task_content_key(task)[:8], 16) % 10
    return next(s for s, b in _BUCKETS.items() if bucket in b)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def branch_plan(n: int, push_back_share: float) -> list[str]:
    """The branch kind of each of ``n`` positions: push-back positions spread evenly at the given share
    (a longer plan starts with the shorter one)."""
    return [PUSH_BACK if int((i + 1) * push_back_share) > int(i * push_back_share) else HAPPY for i in range(n)]


def generate_tasks(
    n: int, seed: int, split: str = "train", push_back_share: float | None = None, family: str = "default"
) -> list[dict[str, Any]]:
    """``n`` distinct task records of ``split``; the same arguments always give the same list, and a
    longer list starts with the shorter one.

    ``push_back_share=None`` keeps the natural mix of branch kinds (about one task in six pushes back).
    A share in [0, 1] fixes it: position ``i`` holds a task of kind ``branch_plan(n, share)[i]``, taken in
    draw order from the same stream (tasks of the kind that is already full are skipped).

    ``family`` names the worlds drawn from (``FAMILIES``), each from its own seeded stream; uids start
    ``demo-<split>-`` in the default family and ``demo-<family>-<split>-`` otherwise. The content hash decides
    the split in every family, so an "irreversible" test task is never an "irreversible" train task.
    """
    _check_split(split)
    if family not in FAMILIES:
        raise ValueError(f"task family must be one of {sorted(FAMILIES)}, got {family!r}")
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if push_back_share is not None and not 0.0 <= push_back_share <= 1.0:
        raise ValueError(f"push_back_share must be None or in [0, 1], got {push_back_share!r}")
    default = family == "default"
    rng = random.Random(f"envace-demo/{split}/{seed}" if default else f"envace-demo/{family}/{split}/{seed}")
    worlds = sorted(FAMILIES[family])
    plan = None if push_back_share is None else branch_plan(n, push_back_share)
    need = {b: (n if plan is None else plan.count(b)) for b in BRANCHES}
    pools: dict[str, list[dict[str, Any]]] = {b: [] for b in BRANCHES}
    drawn: list[dict[str, Any]] = []  # natural mix: every accepted task, in draw order
    seen: set[str] = set()
    budget = 100 * n + 1000 if plan is None else 1000 * n + 1000

    def full() -> bool:
        return len(drawn) >= n if plan is None else all(len(pools[b]) >= need[b] for b in BRANCHES)

    while not full():
        budget -= 1
        if budget < 0:
            raise RuntimeError(
                f"could not draw {n} distinct {split} tasks from seed {seed}"
                + ("" if plan is None else f" with push_back_share={push_back_share}")
            )
        try:
            task = _build_task(rng, rng.choice(worlds), family)
        except Reject:
            continue
        key = task_content_key(task)
        if key in seen or split_of(task) != split:
            continue
        seen.add(key)
        task["uid"] = f"demo-{split}-{key[:16]}" if default else f"demo-{family}-{split}-{key[:16]}"
        if plan is None:
            drawn.append(task)
        elif len(pools[task["branch"]]) < need[task["branch"]]:
            pools[task["branch"]].append(task)
    if plan is None:
        return drawn
    taken = {b: iter(pools[b]) for b in BRANCHES}
    return [next(taken[b]) for b in plan]


# --------------------------------------------------------------------------- world-model rows
class WorldModelExample(NamedTuple):
    task: dict[str, Any]  # the task whose fresh world answered (its few-shot block grounds the row)
    call: dict[str, Any]  # {"name": str, "arguments": dict}
    response: str  # the real tool's canonical JSON response


_WM_KINDS = [
    ("reference", 4),
    ("valid", 3),
    ("bad_id", 2),
    ("bad_value", 2),
    ("missing_arg", 1),
    ("extra_arg", 1),
    ("wrong_type", 1),
    ("other_tool", 1),
]


def _wm_call(kind: str, rng: random.Random, task: dict[str, Any], env: DemoWorld) -> tuple[str, dict[str, Any]]:
    world = task["env"]["name"]
    if kind == "reference":
        calls = [c["function"] for m in task["reference_messages"] for c in m.get("tool_calls", [])]
        c = rng.choice(calls)
        return c["name"], dict(c["arguments"])
    if kind in ("bad_id", "bad_value"):
        return sample_call(world, kind, rng, env)
    if kind == "other_tool":
        # a tool of another world, called with arguments that would suit that world
        other = rng.choice([w for w in WORLDS if w != world])
        other_env = WORLDS[other](WORLD_TASKS[other].state(rng))
        return sample_call(other, "valid", rng, other_env)
    name, args = sample_call(world, "valid", rng, env)
    if kind == "missing_arg":
        del args[rng.choice(sorted(args))]
    elif kind == "extra_arg":
        args[rng.choice(["note", "currency", "user"])] = "x"
    elif kind == "wrong_type":
        key = rng.choice(sorted(args))
        args[key] = str(args[key]) if isinstance(args[key], (int, float)) else 7
    return name, args


def world_model_examples(
    n: int, seed: int, *, task_seed: int | None = None, exclude_uids: frozenset[str] | set[str] = frozenset()
) -> list[WorldModelExample]:
    """``n`` real executions of varied calls, each the first call on a fresh world of a train task.

    Calls mix the task's own reference calls, other valid calls, unknown ids, bad values,
    missing/extra/mistyped arguments and tools of another world. A call that the task's
    reference conversation logs with a *different* response (state changed earlier in the
    conversation) is re-drawn, so a row never contradicts the few-shot block it is shown with.

    The worlds come from the train tasks of ``task_seed`` (default ``seed``), minus ``exclude_uids``:
    a caller that keeps other train tasks for RL passes another seed and excludes them, so these
    rows never show an RL prompt's reference conversation.
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    rng = random.Random(f"envace-demo/world-model/{seed}")
    pool = generate_tasks(max(1, n // 4) + len(exclude_uids), seed if task_seed is None else task_seed, "train")
    tasks = [t for t in pool if t["uid"] not in exclude_uids][: max(1, n // 4)]  # never empty: the pool is padded
    return draw_world_model_examples(n, rng, tasks, _WM_KINDS, _wm_call, f"world-model examples from seed {seed}")


def draw_world_model_examples(
    n: int,
    rng: random.Random,
    tasks: Sequence[dict[str, Any]],
    kinds: Sequence[tuple[str, int]],
    make_call: Callable[[str, random.Random, dict[str, Any], DemoWorld], tuple[str, dict[str, Any]]],
    what: str,
) -> list[WorldModelExample]:
    """The drawing loop of world-model rows: ``n`` times a task of ``tasks``, a fresh world of it, a call kind
    drawn by weight from ``kinds`` and ``make_call(kind, rng, task, env)`` (``Reject`` or ``IndexError``: draw
    again), executed for real. A call the task's reference conversation logs with another response is drawn
    again, so a row never contradicts the few-shot block it is shown with. ``what`` names the draw in the error
    raised when ``50 n + 100`` tries do not give ``n``."""
    out: list[WorldModelExample] = []
    budget = 50 * n + 100
    while len(out) < n:
        budget -= 1
        if budget < 0:
            raise RuntimeError(f"could not draw {n} {what}")
        task = rng.choice(tasks)
        env = ALL_WORLDS[task["env"]["name"]](task["env"]["state"])
        kind = rng.choices([k for k, _ in kinds], weights=[w for _, w in kinds])[0]
        try:
            name, args = make_call(kind, rng, task, env)
        except (Reject, IndexError):
            continue
        response = env.execute(name, args).content
        logged = reference_responses(task).get(canonical_json({"arguments": args, "name": name}))
        if logged is not None and logged != response:
            continue
        out.append(WorldModelExample(task, {"name": name, "arguments": args}, response))
    return out


def reference_responses(task: dict[str, Any]) -> dict[str, str]:
    """The few-shot view of a task: canonical call JSON -> logged response, from reference_messages."""
    calls: dict[str, str] = {}
    by_id: dict[str, str] = {}
    for m in task["reference_messages"]:
        for c in m.get("tool_calls") or []:
            by_id[c["id"]] = canonical_json({"arguments": c["function"]["arguments"], "name": c["function"]["name"]})
        if m["role"] == "tool":
            calls[by_id[m["tool_call_id"]]] = m["content"]
    return calls


def demo_corpus(num_tasks: int = 48) -> list[str]:
    """Texts the offline demo tokenizer is trained on when no tokenizer is given (training configs without
    ``tokenizer.path``, ``random_tiny`` eval runs): the reference conversations of ``num_tasks`` demo tasks
    of the train and validation splits, rendered with thinking on and off."""
    texts = []
    for split in ("train", "validation"):
        for t in generate_tasks(num_tasks, 0, split):
            system = [m for m in t["messages"] if m["role"] == "system"]
            for thinking in (True, False):
                texts.append(render_chat_text(system + t["reference_messages"], t["tools"], enable_thinking=thinking))
    return texts
