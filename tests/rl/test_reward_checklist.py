"""Checklist scoring against hand-computed rewards (spec sections 2.3 and 4.2-4.3)."""

from __future__ import annotations

import json

import pytest

from envace_jax.rl.judges import Judge, LocalModelJudge, RuleJudge
from envace_jax.rl.reward import (
    ChecklistTurnJudge,
    empty_output_penalty,
    episode_score,
    judge_turn,
    judge_turns,
    score_conversation,
    turn_end_indices,
    validate_checklist_list,
)


def item(q, focus, weight, rule=None, required=False):
    d = {
        "question": q,
        "focus_on": focus,
        "pass_condition": q,
        "failure_examples": [],
        "evidence": [],
        "weight": weight,
        "required_for_next_turn": required,
    }
    if rule is not None:
        d["rule"] = rule
    return d


def call(name, **args):
    return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": args}}


def weather_turn():
    """One user turn with two assistant steps: a tool call, then a final answer."""
    return [
        {"role": "system", "content": "You help with weather."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "<think>look it up</think>",
            "tool_calls": [call("get_weather", city="Paris")],
        },
        {"role": "tool", "name": "get_weather", "tool_call_id": "call_get_weather", "content": '{"sky": "sunny"}'},
        {"role": "assistant", "content": "<think>done</think>It is Sunny in Paris."},
    ]


CALLED = item(
    "called weather for Paris",
    "assistant.tool_calls",
    0.5,
    {"type": "tool_called", "name": "get_weather", "arguments": {"city": "Paris"}},
    required=True,
)
REPLIED = item(
    "says sunny", "assistant.content.user_visible_reply", 0.3, {"type": "reply_contains", "values": ["sunny"]}
)
NEVER = item("booked a flight", "assistant.tool_calls", 0.2, {"type": "tool_called", "name": "book_flight"})


class CountingJudge(Judge):
    """Forwards to a real judge and records the size of every judge_many batch."""

    def __init__(self, inner: Judge):
        self.inner, self.batches = inner, []

    def judge_many(self, requests):
        self.batches.append(len(requests))
        return self.inner.judge_many(requests)


def test_or_over_steps_and_weights():
    # CALLED passes only at step 1, REPLIED only at step 2: both count (OR over steps).
    checklist = [[[CALLED, REPLIED, NEVER], [REPLIED]]]
    j = judge_turn(weather_turn(), checklist, 0, RuleJudge())
    assert j.item_passed == [[True, True, False]]
    assert j.turn_reward == pytest.approx(0.8)
    assert j.calls == 6  # 2 steps x 3 items, each judged
    assert not j.terminate  # required item passed, one checklist turn left
    assert not j.required_failed
    assert j.api_failed_count == 0 and not j.tool_failed


def test_required_item_not_passed_terminates():
    msgs = weather_turn()
    msgs[2]["tool_calls"] = [call("get_weather", city="Lyon")]
    j = judge_turn(msgs, [[[CALLED, REPLIED], [REPLIED]]], 0, RuleJudge())
    assert j.item_passed == [[False, True]]
    assert j.turn_reward == pytest.approx(0.3)
    assert j.terminate and j.checklist_terminate == (True,) and j.required_failed


def test_last_checklist_turn_terminates():
    j = judge_turn(weather_turn(), [[[REPLIED], [CALLED, REPLIED]]], 1, RuleJudge())
    assert j.turn_reward == pytest.approx(0.8) and j.terminate and not j.required_failed


def test_majority_over_checklists():
    ok = [[CALLED, REPLIED], [REPLIED]]  # votes continue at turn 0
    failing = [
        [item("x", "assistant.tool_calls", 1.0, {"type": "tool_called", "name": "nope"}, required=True)],
        [REPLIED],
    ]  # votes terminate at turn 0
    three_two_fail = judge_turn(weather_turn(), [ok, failing, failing], 0, RuleJudge())
    assert three_two_fail.checklist_terminate == (False, True, True) and three_two_fail.terminate
    # Rewards add up across checklists: 0.8 + 0 + 0.
    assert three_two_fail.turn_reward == pytest.approx(0.8)
    three_one_fail = judge_turn(weather_turn(), [ok, failing, ok], 0, RuleJudge())
    assert not three_one_fail.terminate and three_one_fail.turn_reward == pytest.approx(1.6)
    # Exactly half is not more than half.
    assert not judge_turn(weather_turn(), [ok, failing], 0, RuleJudge()).terminate


def test_error_tool_call_skips_tool_items_and_zeroes_turn():
    msgs = weather_turn()
    msgs[3] = {
        "role": "tool",
        "name": "get_weather",
        "tool_call_id": "call_get_weather",
        "content": json.dumps({"error_tool_call": {"code": "INVALID_ARGS"}}),
    }
    judge = CountingJudge(RuleJudge())
    j = judge_turn(msgs, [[[CALLED, REPLIED, NEVER], [REPLIED]]], 0, judge)
    # Step 1 is followed by the error: its two tool_calls items are skipped (counted False)
    # and only REPLIED is judged; step 2 has no error after it, so all three are judged.
    assert j.calls == 1 + 3 and judge.batches == [4]
    assert j.item_passed == [[False, True, False]]
    assert j.tool_failed and j.turn_reward == 0.0


def test_api_failure_terminates_and_counts_false():
    def generate(prompts):
        out = []
        for p in prompts:
            text = p[0]["content"]
            # The judge model breaks on the REPLIED item and says "pass" to everything else.
            out.append("<think>hmm</think> I cannot decide" if "says sunny" in text else '{"answer": true}')
        return out

    j = judge_turn(weather_turn(), [[[CALLED, REPLIED], [REPLIED]]], 0, LocalModelJudge(generate, max_attempts=2))
    assert j.item_passed == [[True, False]]
    assert j.turn_reward == pytest.approx(0.5)
    assert j.api_failed_count == 2  # REPLIED at both steps
    assert j.terminate  # though the checklist itself would continue


def test_empty_checklist_and_turn_beyond_checklist():
    j = judge_turn(weather_turn(), [], 0, RuleJudge())
    assert j.turn_reward == 0.0 and j.terminate and j.calls == 0 and j.item_passed == []
    assert episode_score([], []) == 0.0
    assert episode_score([0.0], [[]]) == 0.0
    j = judge_turn(weather_turn(), [[[REPLIED]]], 3, RuleJudge())
    assert j.turn_reward == 0.0 and j.terminate and j.item_passed == [[]]


def test_episode_score_normaliser():
    checklists = [[[REPLIED]] * 3, [[REPLIED]] * 3]  # 2 checklists, U = 3
    assert episode_score([1.5, 0.7], checklists) == pytest.approx(2.2 / 6)
    assert episode_score([1.0], [[[REPLIED], [REPLIED]]]) == pytest.approx(0.5)


def two_turn_conversation():
    return weather_turn() + [
        {"role": "user", "content": "And tomorrow in Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", city="Rome", day=1)]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "call_get_weather", "content": '{"sky": "rain"}'},
        {"role": "assistant", "content": "Rain in Rome tomorrow."},
    ]


def test_score_conversation_reference_full_marks_and_early_stop():
    turn1 = [
        item(
            "rome tomorrow",
            "assistant.tool_calls",
            0.6,
            {"type": "tool_called", "name": "get_weather", "arguments": {"city": "Rome", "day": 1}},
        ),
        item(
            "says rain",
            "assistant.content.user_visible_reply",
            0.4,
            {"type": "reply_contains", "values": ["RAIN", "rome"]},
        ),
    ]
    msgs = two_turn_conversation()
    assert turn_end_indices(msgs) == [4, 8]
    rewards = score_conversation(msgs, [[[CALLED, REPLIED, NEVER], turn1]], RuleJudge())
    assert rewards == pytest.approx([0.8, 1.0])
    perfect = [
        [
            [
                CALLED,
                item(
                    "sunny",
                    "assistant.content.user_visible_reply",
                    0.5,
                    {"type": "reply_contains", "values": ["sunny"]},
                ),
            ],
            turn1,
        ]
    ]
    assert score_conversation(msgs, perfect, RuleJudge()) == pytest.approx([1.0, 1.0])
    assert episode_score([1.0, 1.0], perfect) == pytest.approx(1.0)
    # A required item that fails in turn 0 ends the dialogue: turn 1 is never judged.
    strict = [
        [
            [
                item(
                    "paris day 2",
                    "assistant.tool_calls",
                    1.0,
                    {"type": "tool_called", "name": "get_weather", "arguments": {"day": 2}},
                    required=True,
                )
            ],
            turn1,
        ]
    ]
    assert score_conversation(msgs, strict, RuleJudge()) == [0.0]
    assert score_conversation(msgs, strict, RuleJudge(), stop_on_terminate=False) == pytest.approx([0.0, 1.0])


def test_judge_turns_batches_many_episodes_in_one_call():
    judge = CountingJudge(RuleJudge())
    checklist = [[[CALLED, REPLIED, NEVER], [REPLIED]]]
    msgs = two_turn_conversation()
    batch = [(weather_turn(), checklist, 0), (msgs, checklist, 1), (msgs[:5], checklist, 0)]
    results = judge_turns(batch, judge)
    assert judge.batches == [6 + 2 + 6]
    singles = [judge_turn(m, cl, t, RuleJudge()) for m, cl, t in batch]
    assert results == singles
    assert [r.turn_reward for r in results] == pytest.approx([0.8, 0.0, 0.8])

    class Ep:  # the attributes the rollout engine's episodes carry
        def __init__(self, messages, checklist, user_turns):
            self.messages, self.record, self.user_turns = messages, {"checklist": checklist}, user_turns

    judge.batches.clear()
    adapted = ChecklistTurnJudge(judge)([Ep(m, cl, t) for m, cl, t in batch])
    assert adapted == singles and judge.batches == [14]


def test_empty_output_penalty():
    scores = [0.5, 0.5, 0.5, 0.5, 0.5]
    got = empty_output_penalty(scores, ["", "x", [], [7, 2], "  "])
    assert got == pytest.approx([0.4, 0.5, 0.4, 0.5, 0.5])
    assert empty_output_penalty(scores[:1], ["  \n"], strip_whitespace=True, penalty=0.25) == pytest.approx([0.25])
    with pytest.raises(ValueError, match="rows"):
        empty_output_penalty([0.1], ["a", "b"])


@pytest.mark.parametrize(
    "bad, msg",
    [
        ([[[{**REPLIED, "weight": "0.5"}]]], r"checklist_list\[0\]\[0\]\[0\]\.weight: must be a finite"),
        ([[[{**REPLIED, "weight": -0.5}]]], r"checklist_list\[0\]\[0\]\[0\]\.weight: must be a finite non-negative"),
        ([[[{**REPLIED, "focus_on": "assistant.vibes"}]]], r"\[0\]\[0\]\[0\]\.focus_on: must be one of"),
        ([[[REPLIED], "turn"]], r"checklist_list\[0\]\[1\] must be a list"),
        ({"c": 1}, "checklist_list must be a list"),
    ],
)
def test_bad_checklists_are_named(bad, msg):
    with pytest.raises(ValueError, match=msg):
        validate_checklist_list(bad)


def test_turn_without_user_or_answer_is_an_error():
    with pytest.raises(ValueError, match="no user message"):
        judge_turn([{"role": "assistant", "content": "hi"}], [[[REPLIED]]], 0, RuleJudge())
    with pytest.raises(ValueError, match="no assistant message"):
        judge_turn([{"role": "user", "content": "hi"}], [[[REPLIED]]], 0, RuleJudge())
