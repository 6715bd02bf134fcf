"""BFCL-v4 evaluation: multi-turn categories in BFCL's executable environments, single-turn AST categories.

Multi-turn follows BFCL's own inference loop (bfcl_eval/model_handler/base_handler.py, FC mode): the
user messages of ``entry["question"][turn]`` open each turn; at a miss_func turn the held-out
function docs are added to the tools and the user says BFCL's "I have updated some more functions you
can choose from. What about now?"; within a turn the policy keeps stepping while it emits tool calls
(every call runs for real in ``BfclMultiTurnEnv``), and a step with no call, or one that does not
parse, ends the turn. More than ``max_steps_per_turn`` steps in a turn (BFCL: 20) force-quits the
entry, which BFCL's checker then fails. The calls of every step are scored by BFCL's
``multi_turn_checker`` (``envs.bfcl.check_multi_turn``).

Single-turn: one generation per entry; its parsed calls go to BFCL's ``ast_checker``.

Calls whose name or argument names are not Python identifiers are executed (they fail as unknown
functions) but left out of the trajectory handed to the checker: BFCL's checker ``eval``s call text,
and such a call cannot change any state the checker compares.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Mapping, Sequence

from envace_jax.envs import bfcl
from envace_jax.eval import progress
from envace_jax.eval.config import BfclConfig  # the suite's knobs live with every eval knob
from envace_jax.eval.harness import (
    LENGTH_BUDGET,
    Agent,
    AgentTurn,
    Conversation,
    number_calls,
    parse_turn,
    tool_call_text,
)
from envace_jax.eval.results import CategoryResult, EntryResult

MISS_FUNC_PROMPT = "I have updated some more functions you can choose from. What about now?"


def _checkable(call: tuple[str, Mapping[str, Any]]) -> bool:
    name, kwargs = call
    return all(p.isidentifier() for p in name.split(".")) and all(
        isinstance(k, str) and k.isidentifier() for k in kwargs
    )


# ----------------------------------------------------------------------------- oracle agents


class BfclMultiTurnOracle:
    """Replays BFCL's ground truth, then a tool-free reply ends the turn.

    One GT call per step, except in turns with more calls than the step limit allows (a few
    long_context turns delete 30+ files): those are packed evenly, several calls per step.
    """

    def __init__(
        self,
        entries: Sequence[Mapping[str, Any]],
        ground_truth: Mapping[str, Sequence[Sequence[str]]],
        max_steps_per_turn: int = 20,
    ):
        self._steps: dict[str, list[list[list[tuple[str, dict]]]]] = {}
        for e in entries:
            env = bfcl.BfclMultiTurnEnv(e)  # only for naming positional GT arguments; never executed
            turns = []
            for turn in ground_truth[e["id"]]:
                calls = [env.parse_call(s) for s in turn]
                per = max(1, -(-len(calls) // max_steps_per_turn))
                turns.append([calls[i : i + per] for i in range(0, len(calls), per)])
            self._steps[e["id"]] = turns

    def act(self, conversations: Sequence[Conversation]) -> list[AgentTurn]:
        out = []
        for c in conversations:
            turn = self._steps[c.info["entry_id"]][c.turn]
            out.append(AgentTurn(tool_call_text(turn[c.step]) if c.step < len(turn) else "Done."))
        return out

    def release(self, keys: Sequence[str]) -> None:
        pass


class BfclSingleTurnOracle:
    """Answers each entry with one concrete call per possible answer (all calls in one message)."""

    def __init__(self, entries: Sequence[Mapping[str, Any]], possible_answers: Mapping[str, Sequence[Mapping]]):
        self._text = {
            e["id"]: tool_call_text(bfcl.possible_answer_to_calls(possible_answers[e["id"]], e["function"]))
            for e in entries
        }

    def act(self, conversations: Sequence[Conversation]) -> list[AgentTurn]:
        return [AgentTurn(self._text[c.info["entry_id"]]) for c in conversations]

    def release(self, keys: Sequence[str]) -> None:
        pass


# ----------------------------------------------------------------------------- multi-turn loop


@dataclasses.dataclass
class _Episode:
    entry: dict[str, Any]
    env: bfcl.BfclMultiTurnEnv
    conv: Conversation
    trajectory: list[list[list[tuple[str, dict]]]] = dataclasses.field(default_factory=list)
    done: bool = False
    termination: str = ""
    calls: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    # every call that ran: (name, arguments, response, failed), for comparing rehearsals with the real run
    real_calls: list[tuple[str, Any, str, bool]] = dataclasses.field(default_factory=list)


def _open_turn(ep: _Episode) -> None:
    t = ep.conv.turn
    missed = ep.entry.get("missed_function") or {}
    users = [dict(m) for m in ep.entry["question"][t]]
    if str(t) in missed:
        ep.env.add_functions(missed[str(t)])
        ep.conv.tools = ep.env.tool_schemas
        users = [{"role": "user", "content": MISS_FUNC_PROMPT}]
    ep.conv.messages.extend(users)
    ep.conv.step = 0
    ep.trajectory.append([])


def _end_turn(ep: _Episode) -> None:
    ep.conv.turn += 1
    if ep.conv.turn >= len(ep.entry["question"]):
        ep.done, ep.termination = True, "completed"
    else:
        _open_turn(ep)


def _start(e: Mapping[str, Any], memory: str = "") -> _Episode:
    env = bfcl.BfclMultiTurnEnv(e)
    ep = _Episode(
        dict(e),
        env,
        Conversation(key=f"bfcl/{e['id']}", messages=[], tools=env.tool_schemas, info={"entry_id": e["id"]}),
    )
    if memory:  # BFCL prompts have no system message of their own: the memory is one, before the first turn
        ep.conv.messages.append({"role": "system", "content": memory})
    _open_turn(ep)
    return ep


def play_multi_turn(
    entries: Sequence[Mapping[str, Any]],
    agent: Agent,
    cfg: BfclConfig,
    desc: str = "bfcl",
    memories: Mapping[str, str] | None = None,
) -> list[_Episode]:
    """Plays every entry to its end (or force-quit); returns the episodes in entry order. A bar named
    ``desc`` on stderr counts the entries that ended. ``memories``: entry id -> a test-time rehearsal memory
    (``eval.benchmark_rehearsal``), a system message before the entry's first user message.

    At most ``cfg.batch_size`` entries are live at once, and an entry that ends hands its slot to the
    next one at once: entries differ a lot in turns and steps, so fixed groups would spend most agent
    calls on a shrinking tail of each group.
    """
    episodes: list[_Episode | None] = [None] * len(entries)
    todo = iter(range(len(entries)))
    live: list[int] = []
    bar = progress.EpisodeBar(len(entries), desc)
    bar.start()
    while True:
        while len(live) < cfg.batch_size and (j := next(todo, None)) is not None:
            episodes[j] = _start(entries[j], (memories or {}).get(entries[j]["id"], ""))
            live.append(j)
        if not live:
            break
        turns = agent.act([episodes[j].conv for j in live])
        ended = []
        for j, out in zip(live, turns):
            _advance(episodes[j], out, cfg)
            if episodes[j].done:
                ended.append(episodes[j].conv.key)
        if ended:
            agent.release(ended)
        live = [j for j in live if not episodes[j].done]
        bar.on_step(0, [e for e in episodes if e is not None])
    bar.close()
    return episodes  # type: ignore[return-value]


def _advance(ep: _Episode, out: AgentTurn, cfg: BfclConfig) -> None:
    ep.generated_tokens += out.generated_tokens
    ep.prompt_tokens += out.prompt_tokens
    if out.finish_reason == LENGTH_BUDGET:
        ep.done, ep.termination = True, LENGTH_BUDGET
        return
    msg, calls, error = parse_turn(out.text)
    c = ep.conv
    number_calls(msg, f"call_{c.turn}_{c.step}")
    c.messages.append(msg)
    if error is not None or not calls:
        # BFCL: an undecodable or call-free response ends the turn.
        _end_turn(ep)
        return
    # BFCL's classes keep references to argument lists (a tweet's mentions list is extended by a
    # later mention()), so the recorded calls and the message must never share objects with the env.
    ep.trajectory[-1].append([copy.deepcopy(x) for x in calls if _checkable(x)])
    for (name, args), tc in zip(calls, msg["tool_calls"]):
        res = ep.env.execute(name, copy.deepcopy(args))
        ep.real_calls.append((name, copy.deepcopy(args), res.content, bool(res.error)))
        c.messages.append({"role": "tool", "name": name, "tool_call_id": tc["id"], "content": res.content})
    ep.calls += len(calls)
    c.step += 1
    if c.step > cfg.max_steps_per_turn:  # as BFCL: the step after the limit force-quits the entry
        ep.done, ep.termination = True, "step_limit"


def evaluate_multi_turn(category: str, agent: Agent | str, cfg: BfclConfig) -> CategoryResult:
    """Plays ``category`` with ``agent`` ("oracle" replays the ground truth) and scores it with BFCL."""
    entries = bfcl.load_entries(category)
    gts = bfcl.load_ground_truth(category)
    if cfg.limit:
        entries = entries[: cfg.limit]
    if agent == "oracle":
        agent = BfclMultiTurnOracle(entries, gts, cfg.max_steps_per_turn)
    return score_multi_turn(category, play_multi_turn(entries, agent, cfg, desc=category), gts)


def score_multi_turn(category: str, episodes: Sequence[_Episode], gts: Mapping[str, Any]) -> CategoryResult:
    """BFCL's multi-turn checker on played episodes (``play_multi_turn``), one row per entry."""
    rows = []
    for ep in episodes:
        res = bfcl.check_multi_turn(ep.trajectory, ep.entry, gts[ep.entry["id"]])
        rows.append(
            EntryResult(
                ep.entry["id"],
                bool(res.get("valid")),
                res.get("error_type"),
                {
                    "termination": ep.termination,
                    "turns": len(ep.trajectory),
                    "gt_turns": len(gts[ep.entry["id"]]),
                    "steps": sum(len(t) for t in ep.trajectory),
                    "calls": ep.calls,
                    "generated_tokens": ep.generated_tokens,
                },
            )
        )
    return _category(category, rows)


def _category(name: str, rows: list[EntryResult]) -> CategoryResult:
    n = max(1, len(rows))
    extra = {
        "calls_mean": sum(r.detail.get("calls", 0) for r in rows) / n,
        "generated_tokens_mean": sum(r.detail.get("generated_tokens", 0) for r in rows) / n,
    }
    return CategoryResult(name, rows, extra)


# ----------------------------------------------------------------------------- single turn


def evaluate_single_turn(category: str, agent: Agent | str, cfg: BfclConfig) -> CategoryResult:
    entries = bfcl.load_entries(category)
    answers = bfcl.load_ground_truth(category)
    if cfg.limit:
        entries = entries[: cfg.limit]
    if agent == "oracle":
        agent = BfclSingleTurnOracle(entries, answers)
    rows = []
    for lo in range(0, len(entries), cfg.batch_size):
        group = entries[lo : lo + cfg.batch_size]
        convs = [
            Conversation(
                key=f"bfcl/{e['id']}",
                messages=[dict(m) for m in e["question"][0]],
                tools=[bfcl.function_doc_to_schema(d) for d in e["function"]],
                info={"entry_id": e["id"]},
            )
            for e in group
        ]
        outs = agent.act(convs)
        agent.release([c.key for c in convs])
        for e, out in zip(group, outs):
            detail = {"generated_tokens": out.generated_tokens, "finish_reason": out.finish_reason}
            if out.finish_reason == LENGTH_BUDGET:
                rows.append(EntryResult(e["id"], False, LENGTH_BUDGET, detail))
                continue
            _, calls, error = parse_turn(out.text)
            detail["calls"] = len(calls)
            if error is not None:
                rows.append(EntryResult(e["id"], False, "parse:" + error["error_tool_call"].split(":", 1)[0], detail))
                continue
            if not calls:
                rows.append(EntryResult(e["id"], False, "no_function_call", detail))
                continue
            res = bfcl.check_single_turn(calls, e, answers[e["id"]])
            rows.append(EntryResult(e["id"], bool(res.get("valid")), res.get("error_type"), detail))
    return _category(category, rows)


def evaluate(agent: Agent | str, cfg: BfclConfig) -> list[CategoryResult]:
    out = []
    for cat in cfg.categories:
        fn = evaluate_multi_turn if cat in bfcl.MULTI_TURN_CATEGORIES else evaluate_single_turn
        with progress.stage(f"bfcl {cat}"):
            out.append(fn(cat, agent, cfg))
    return out
