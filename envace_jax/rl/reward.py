"""Checklist reward, exactly as the reference scores it (spec sections 2.3 INTERACTING, 4.2, 4.3).

When a user turn ends (the caller answers without tool calls), every item k of the turn's
checklist c is judged against every assistant step i of the turn; ``passed_ck`` is the OR over
steps, ``turn_reward = sum_c sum_k w_ck * passed_ck``, and the episode score divides the sum of
judged turn rewards by ``num_checklists * U`` with ``U = len(checklist_list[0])``.

The work is split into ``plan_turn`` (build the judge requests) and ``finish_turn`` (aggregate
their verdicts) so that the rollout engine can send the requests of many episodes to a judge in
one ``judge_many`` call (``judge_turns``). Host-side only; no jax.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from envace_jax.chat.simulator import is_error_tool_message
from envace_jax.data.records import validate_checklist_list
from envace_jax.rl.judges import Judge, JudgeRequest, Verdict

SUCCESS_TOLERANCE = 1e-9


def is_success(score: float) -> bool:
    """An episode succeeds when its score (a checklist's or a benchmark's reward) is 1, up to the float
    rounding of a mean of item scores: the one success test of every suite, the demo and its report."""
    return score >= 1.0 - SUCCESS_TOLERANCE


# Items about calls or tool output cannot pass on a step whose call failed (the reference skips
# the judge for them and counts False).
_TOOL_FOCUS = ("assistant.tool_calls", "tool.content")

Message = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class TurnJudgement:
    turn_reward: float  # sum_c sum_k w_ck * passed_ck (0 if a tool failed)
    terminate: bool  # the dialogue ends after this turn
    item_passed: list[list[bool]]  # [checklist][item] of this turn, OR over steps
    api_failed_count: int  # verdicts with api_failed or without a usable answer
    calls: int  # judge requests sent (skipped items excluded)
    tool_failed: bool = False  # a tool message of the turn carried error_tool_call
    checklist_terminate: tuple[bool, ...] = ()  # each checklist's own terminate vote
    required_failed: bool = False  # some checklist has a required_for_next_turn item not passed
    api_error: str = ""  # the first failed verdict's last error text (for the outage warning)


@dataclasses.dataclass(frozen=True)
class TurnPlan:
    """The judge requests of one turn and where each verdict goes: ``slots[r] = (c, k)``."""

    checklist_list: Sequence[Sequence[Sequence[Mapping[str, Any]]]]
    turn_index: int
    requests: list[JudgeRequest]
    slots: list[tuple[int, int]]
    tool_failed: bool


def plan_turn(messages: Sequence[Message], checklist_list: Sequence, turn_index: int, *, tag: str = "") -> TurnPlan:
    """Builds one judge request per (checklist, step, item) of the turn ending at messages[-1]."""
    validate_checklist_list(checklist_list)
    if turn_index < 0:
        raise ValueError(f"turn_index must be >= 0, got {turn_index}")
    user_idx = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not user_idx:
        raise ValueError(f"{tag or 'conversation'}: no user message, so no turn to judge")
    u = user_idx[-1]
    steps = [i for i in range(u + 1, len(messages)) if messages[i].get("role") == "assistant"]
    if not steps:
        raise ValueError(f"{tag or 'conversation'}: no assistant message after the last user message")
    previous = list(messages[:u])
    # The reference zeroes the turn on any tool failure; in agent mode a failure terminates first.
    tool_failed = any(is_error_tool_message(m) for m in messages[u + 1 :])
    requests: list[JudgeRequest] = []
    slots: list[tuple[int, int]] = []
    for i in steps:
        j = i + 1
        while j < len(messages) and messages[j].get("role") == "tool":
            j += 1
        current = list(messages[u:j])
        failed_after = any(is_error_tool_message(m) for m in messages[i + 1 :])
        for c, checklist in enumerate(checklist_list):
            items = checklist[turn_index] if turn_index < len(checklist) else []
            for k, item in enumerate(items):
                if failed_after and item["focus_on"] in _TOOL_FOCUS:
                    continue
                requests.append(
                    JudgeRequest(
                        item=item,
                        previous_messages=previous,
                        current_messages=current,
                        tag=f"{tag}c{c}/t{turn_index}/k{k}/step{i}",
                    )
                )
                slots.append((c, k))
    return TurnPlan(checklist_list, turn_index, requests, slots, tool_failed)


def finish_turn(plan: TurnPlan, verdicts: Sequence[Verdict]) -> TurnJudgement:
    """Aggregates the verdicts of ``plan.requests`` (same order) into the turn's reward."""
    if len(verdicts) != len(plan.requests):
        raise ValueError(f"got {len(verdicts)} verdicts for {len(plan.requests)} judge requests")
    t = plan.turn_index
    items_of = [cl[t] if t < len(cl) else [] for cl in plan.checklist_list]
    passed = [[False] * len(items) for items in items_of]
    failures, api_error = 0, ""
    for (c, k), v in zip(plan.slots, verdicts):
        passed[c][k] = passed[c][k] or bool(v.passed and v.ok)
        failed = v.api_failed or not v.ok
        failures += int(failed)
        if failed and not api_error:
            api_error = str(v.raw)[:300]
    reward = sum(float(item["weight"]) for items, row in zip(items_of, passed) for item, p in zip(items, row) if p)
    if plan.tool_failed:
        reward = 0.0
    missed = [
        any(item.get("required_for_next_turn", False) and not p for item, p in zip(items, row))
        for items, row in zip(items_of, passed)
    ]
    votes = tuple(t >= len(cl) - 1 or m for cl, m in zip(plan.checklist_list, missed))
    n = len(plan.checklist_list)
    # Strict majority; with no checklist at all there is nothing left to play.
    terminate = n == 0 or sum(votes) > n / 2 or failures > 0
    return TurnJudgement(
        turn_reward=reward,
        terminate=terminate,
        item_passed=passed,
        api_failed_count=failures,
        calls=len(plan.requests),
        tool_failed=plan.tool_failed,
        checklist_terminate=votes,
        required_failed=any(missed),
        api_error=api_error,
    )


def judge_turns(turns: Sequence[tuple[Sequence[Message], Sequence, int]], judge: Judge) -> list[TurnJudgement]:
    """Judges many (messages, checklist_list, turn_index) turns with one ``judge_many`` call."""
    plans = [plan_turn(m, cl, t, tag=f"turn{n}/") for n, (m, cl, t) in enumerate(turns)]
    flat = [r for p in plans for r in p.requests]
    verdicts = judge.judge_many(flat) if flat else []
    if len(verdicts) != len(flat):
        raise ValueError(f"judge returned {len(verdicts)} verdicts for {len(flat)} requests")
    out, pos = [], 0
    for p in plans:
        out.append(finish_turn(p, verdicts[pos : pos + len(p.requests)]))
        pos += len(p.requests)
    return out


class ChecklistTurnJudge:
    """Adapter for the rollout engine: judges the just-finished turn of many episodes in one batch.

    Each episode needs ``messages`` (ending at the tool-free answer), ``record["checklist"]`` and
    ``user_turns`` (the index of the turn being judged: the engine counts it after judging).
    """

    def __init__(self, judge: Judge):
        self.judge = judge

    def __call__(self, episodes: Sequence[Any]) -> list[TurnJudgement]:
        return judge_turns([(e.messages, e.record["checklist"], e.user_turns) for e in episodes], self.judge)

    def describe(self) -> str:
        return self.judge.describe()


def judge_turn(messages: Sequence[Message], checklist_list: Sequence, turn_index: int, judge: Judge) -> TurnJudgement:
    """Judges the user turn that ends at ``messages[-1]`` (a tool-free assistant answer)."""
    return judge_turns([(messages, checklist_list, turn_index)], judge)[0]


def episode_score(turn_rewards: Sequence[float], checklist_list: Sequence) -> float:
    """Sum of judged turn rewards / (num_checklists * U), U = len(checklist_list[0]); 0 if empty."""
    if not checklist_list or not checklist_list[0]:
        return 0.0
    return float(sum(turn_rewards)) / (len(checklist_list) * len(checklist_list[0]))


def turn_end_indices(messages: Sequence[Message]) -> list[int]:
    """Indices of the assistant messages that end a user turn (first tool-free answer after a user)."""
    ends, open_turn = [], False
    for i, m in enumerate(messages):
        if m.get("role") == "user":
            open_turn = True
        elif m.get("role") == "assistant" and open_turn and not m.get("tool_calls"):
            ends.append(i)
            open_turn = False
    return ends


def score_conversation(
    messages: Sequence[Message], checklist_list: Sequence, judge: Judge, *, stop_on_terminate: bool = True
) -> list[float]:
    """Per-turn rewards of a finished conversation, judged turn by turn as the rollout would.

    With ``stop_on_terminate`` (the reference's behaviour) turns after a terminating verdict are
    not judged and not returned.
    """
    rewards: list[float] = []
    for t, end in enumerate(turn_end_indices(messages)):
        j = judge_turn(messages[: end + 1], checklist_list, t, judge)
        rewards.append(j.turn_reward)
        if j.terminate and stop_on_terminate:
            break
    return rewards


def empty_output_penalty(
    scores: Sequence[float],
    generated: Sequence[str | Sequence[int] | None],
    *,
    penalty: float = 0.1,
    strip_whitespace: bool = False,
) -> list[float]:
    """Subtracts ``penalty`` from each row whose generated output is empty.

    The reference's ``use_invalid_action_penalty`` (on by default, 0.1), applied by the RL step
    (``rl.step.row_scores``) to each row's decoded text. ``generated`` holds each row's decoded text or
    its generated token ids (then empty means no tokens).
    """
    if len(scores) != len(generated):
        raise ValueError(f"scores has {len(scores)} rows but generated has {len(generated)}")
    out = []
    for s, g in zip(scores, generated):
        if g is None:
            empty = True
        elif isinstance(g, str):
            empty = not (g.strip() if strip_whitespace else g)
        else:
            empty = len(g) == 0
        out.append(float(s) - penalty if empty else float(s))
    return out


def overlong_penalty(lengths: Sequence[int], max_lengths: Sequence[int] | int, buffer: int, penalty: float = 1.0):
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13), per row, in tokens.

    With ``L`` a row's generation budget (its role's ``max_new_tokens``) and ``B = buffer``, a row of ``n``
    generated tokens gets ``0`` when ``n <= L - B``, ``penalty * ((L - B) - n) / B`` inside the buffer (from 0
    down to ``-penalty`` at ``n = L``) and ``-penalty`` beyond ``L``. Returned as float64 numbers to add to the
    rows' scores; ``buffer = 0`` gives zeros. The buffer must fit in every budget (``buffer <= L``).
    """
    lengths = [int(n) for n in lengths]
    limits = [int(max_lengths)] * len(lengths) if isinstance(max_lengths, (int, float)) else list(max_lengths)
    if len(limits) != len(lengths):
        raise ValueError(f"overlong_penalty: {len(lengths)} lengths but {len(limits)} max lengths")
    if buffer < 0 or penalty < 0:
        raise ValueError(f"overlong_penalty: buffer and penalty must be >= 0, got {buffer} and {penalty}")
    if buffer == 0:
        return [0.0] * len(lengths)
    out = []
    for n, cap in zip(lengths, limits):
        if cap < buffer:
            raise ValueError(f"overlong_penalty: buffer {buffer} is wider than a generation budget of {cap} tokens")
        start = cap - buffer
        if n <= start:
            out.append(0.0)
        elif n <= cap:
            out.append(penalty * (start - n) / buffer)
        else:
            out.append(-float(penalty))
    return out
