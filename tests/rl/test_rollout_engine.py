"""Rollout state machine with a scripted policy (real demo tokenizer, real Qwen3ChatCodec, real rule
judge): every termination reason, hand-computed rewards, reference replay in a real demo world, the
no-real-tool guarantee of rehearsal mode, and the consistency of the generation records."""

from __future__ import annotations

import json

import pytest

from envace_jax.envs.base import NoToolEnvironment
from envace_jax.envs.demo_worlds import make_env
from envace_jax.rl.judges import LocalModelJudge, RuleJudge
from envace_jax.rl.reward import ChecklistTurnJudge
from envace_jax.rl.rollout import TRAINED_ROLES, MODES, RoleSampling, RolloutConfig, RolloutEngine, summarize
from envace_jax.rl.types import ACT, REHEARSE, TERMINATION_REASONS, State
from tests.helpers_rollout import (
    ScriptedClient,
    act_texts,
    call_block,
    codec,
    demo_tasks,
    rehearse_texts,
    result_text,
    rows_per_call,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_balance",
            "description": "Balance of an account.",
            "parameters": {"type": "object", "properties": {"account": {"type": "string"}}, "required": ["account"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "transfer",
            "description": "Move money.",
            "parameters": {
                "type": "object",
                "properties": {"to": {"type": "string"}, "amount": {"type": "integer"}},
                "required": ["to", "amount"],
            },
        },
    },
]
RS = RoleSampling(temperature=1.0, max_new_tokens=256)


def item(rule: dict | None, weight: float, *, required: bool = False, focus: str = "assistant.tool_calls") -> dict:
    it = {
        "question": "q",
        "focus_on": focus,
        "pass_condition": "p",
        "failure_examples": [],
        "evidence": [],
        "weight": weight,
        "required_for_next_turn": required,
    }
    if rule is not None:
        it["rule"] = rule
    return it


CALLED_A1 = {"type": "tool_called", "name": "get_balance", "arguments": {"account": "A1"}}


def record(users: list[str], checklist: list, uid: str = "r") -> dict:
    ref = []
    for u in users:
        ref += [{"role": "user", "content": u}, {"role": "assistant", "content": "fine"}]
    return {
        "uid": uid,
        "data_source": "test",
        "messages": [{"role": "system", "content": "Bank."}, ref[0]],
        "tools": TOOLS,
        "reference_messages": ref,
        "checklist": checklist,
    }


def ask(name: str, args: dict, think: str = "call") -> str:
    return f"<think>\n{think}\n</think>\n" + call_block(name, args)


def answer(text: str) -> str:
    return f"<think>\ndone\n</think>\n\n{text}"


def run(rec, acts, rehearsals=(), judge=None, **cfg):
    c = codec()
    client = ScriptedClient(c, acts={0: list(acts)}, rehearsals={0: list(rehearsals)})
    kw = dict(mode="rehearsal", max_model_len=8192, act=RS, rehearse=RS)
    kw.update(cfg)
    eng = RolloutEngine(
        RolloutConfig(**kw),
        c,
        client,
        judge or ChecklistTurnJudge(RuleJudge()),
        make_env=lambda r: NoToolEnvironment(r["tools"]),
    )
    (ep,) = eng.run([rec])
    return ep, eng, client


TWO_TURNS = [
    [
        [item(CALLED_A1, 0.6, required=True), item({"type": "reply_contains", "values": ["5"]}, 0.4)],
        [item({"type": "reply_contains", "values": ["done"]}, 1.0)],
    ]
]


def test_completed_with_hand_computed_reward_two_checklists():
    c1 = [
        [item({"type": "tool_not_called", "name": "transfer"}, 1.0)],
        [
            item({"type": "tool_called", "name": "transfer", "arguments": {"to": "B2", "amount": 3}}, 0.5),
            item({"type": "reply_contains", "values": ["xyz"]}, 0.5),
        ],
    ]
    rec = record(["Balance of A1?", "Send 3 to B2."], TWO_TURNS + [c1])
    ep, eng, client = run(
        rec,
        [
            ask("get_balance", {"account": "A1"}),
            answer("It is 5."),
            ask("transfer", {"to": "B2", "amount": 3}),
            answer("All done."),
        ],
        [result_text('{"balance": 5}'), result_text('{"ok": true}')],
    )
    assert ep.termination == "completed"
    # turn 0: c0 0.6 + 0.4, c1 1.0 -> 2.0; turn 1: c0 1.0, c1 0.5 (transfer called, no "xyz") -> 1.5
    assert ep.turn_rewards == pytest.approx([2.0, 1.5])
    assert ep.score == pytest.approx(3.5 / (2 * 2))
    assert [g.score for g in ep.generations] == pytest.approx([0.875] * 6)
    assert [m["role"] for m in ep.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert ep.messages[5] == rec["reference_messages"][2]  # replayed from the reference
    assert ep.messages[2]["tool_calls"][0]["id"] == "call_r_1_0"
    assert ep.messages[6]["tool_calls"][0]["id"] == "call_r_3_0"
    assert ep.messages[2]["content"] == "<think>\ncall\n</think>\n"  # text before the first "\n<tool_call>\n"
    assert ep.messages[3] == {
        "role": "tool",
        "name": "get_balance",
        "tool_call_id": "call_r_1_0",
        "content": '{"balance": 5}',
    }
    m = ep.metrics()
    assert (m["user_turns"], m["assistant_turns"], m["tool_calls"], m["rows_act"], m["rows_rehearse"]) == (
        2,
        4,
        2,
        4,
        2,
    )
    assert client.released == ["caller/r/0", "caller/r/0"]  # at termination and at the end


def test_partial_reward_and_required_item_failed():
    rec = record(["Balance of A1?", "Send 3."], TWO_TURNS)
    ep, _, _ = run(rec, [answer("It is 5.")])  # no tool call: the required item fails
    assert ep.termination == "required_item_failed"
    assert ep.turn_rewards == pytest.approx([0.4])
    assert ep.score == pytest.approx(0.4 / 2)


def test_judge_api_failure_terminates_and_keeps_rule_credit():
    judge = ChecklistTurnJudge(
        RuleJudge(fallback=LocalModelJudge(lambda ms: ["not a verdict"] * len(ms), max_attempts=2))
    )
    cl = [[[item({"type": "reply_contains", "values": ["5"]}, 0.5), item(None, 0.5)], [item(None, 1.0)]]]
    ep, _, _ = run(record(["a?", "b?"], cl), [answer("5")], judge=judge)
    assert ep.termination == "judge_api_failure"
    assert ep.turn_rewards == pytest.approx([0.5])
    assert ep.score == pytest.approx(0.25)


def test_no_next_user_when_reference_runs_out():
    cl = [[[item({"type": "reply_contains", "values": ["5"]}, 1.0)], [item(None, 1.0)]]]
    ep, _, _ = run(record(["a?"], cl), [answer("5")])
    assert (ep.termination, ep.turn_rewards, ep.score) == ("no_next_user", [1.0], 0.5)


def test_parse_error_appends_error_message_and_terminates():
    ep, eng, _ = run(record(["a?"], TWO_TURNS), ["<think>\nx\n</think>\n\nok <tool_call>{}</tool_call>"])
    assert ep.termination == "parse_error"
    last = ep.messages[-1]
    assert last["role"] == "tool" and last["name"] == "error_tool_call"
    # A block glued to the text parses (Qwen3 writes blocks anywhere); its empty object has no arguments.
    assert "NO_ARGUMENTS" in json.loads(last["content"])["error_tool_call"]
    assert "tool_calls" not in ep.messages[-2]
    ep_ref, _, _ = run(
        record(["a?"], TWO_TURNS),
        ["<think>\nx\n</think>\n\nok <tool_call>{}</tool_call>"],
        tool_call_syntax="reference",
    )
    assert "NO_TOOL_CALL_FOUND" in json.loads(ep_ref.messages[-1]["content"])["error_tool_call"]
    assert len(ep.generations) == 1 and ep.turn_rewards == [] and ep.score == 0.0
    ep2, _, _ = run(record(["a?"], TWO_TURNS), ["\n<tool_call>\n{bad json\n</tool_call>"])
    assert "JSON_DECODE_ERROR" in json.loads(ep2.messages[-1]["content"])["error_tool_call"]


@pytest.mark.parametrize(
    "sim_text, code",
    [
        ("no tags at all", "NO_EXECUTION_RESULT_TAG_FOUND"),
        (
            result_text('{"error_tool_call": {"code": "TOOL_NOT_AVAILABLE", "message": "m", "details": ""}}'),
            "TOOL_NOT_AVAILABLE",
        ),
    ],
)
def test_simulator_error_ends_episode_but_earlier_turns_keep_reward(sim_text, code):
    rec = record(["Balance of A1?", "Again?"], TWO_TURNS)
    ep, _, _ = run(
        rec,
        [ask("get_balance", {"account": "A1"}), answer("It is 5."), ask("get_balance", {"account": "A1"})],
        [result_text('{"balance": 5}'), sim_text],
    )
    assert ep.termination == "simulator_error"
    assert ep.turn_rewards == pytest.approx([1.0])
    assert ep.score == pytest.approx(0.5)
    assert code in ep.messages[-1]["content"] and ep.messages[-1]["role"] == "tool"


def test_length_budget_at_reset_after_tools_and_on_cache_full():
    c = codec()
    rec = record(["Balance of A1?"], TWO_TURNS)
    n0 = len(c.caller_prompt(rec["messages"], rec["tools"]))
    ep, _, client = run(rec, [], max_model_len=n0 + RS.max_new_tokens)  # ctx + new >= max_model_len
    assert (ep.termination, ep.generations, client.requests) == ("length_budget", [], [])
    ep, _, _ = run(
        rec,
        [ask("get_balance", {"account": "A1"})],
        [result_text('{"balance": 5}')],
        max_model_len=n0 + RS.max_new_tokens + 1,
    )
    assert ep.termination == "length_budget" and ep.messages[-1]["role"] == "tool"
    assert [g.role for g in ep.generations] == [ACT, REHEARSE]
    ep, _, _ = run(rec, [None])  # the client could not fit the context
    assert (ep.termination, ep.generations) == ("length_budget", [])


def test_turn_caps_are_checked_only_when_a_user_turn_ends():
    rec = record(["Balance of A1?", "Again?"], TWO_TURNS)
    calls = [ask("get_balance", {"account": "A1"})] * 3
    ep, _, _ = run(rec, calls + [answer("5")], [result_text('{"balance": 5}')] * 3, max_assistant_turns=1)
    assert ep.termination == "turn_cap" and ep.assistant_turns == 4  # three tool turns went on past the cap
    assert ep.turn_rewards == pytest.approx([1.0])
    ep, _, _ = run(rec, [answer("5")] * 2, max_user_turns=1)
    # the required item failed too, and the judge's verdict is checked first (as the reference)
    assert ep.termination == "required_item_failed"
    cl = [[[item({"type": "reply_contains", "values": ["5"]}, 1.0)], [item(None, 1.0)]]]
    ep, _, _ = run(record(["a?", "b?"], cl), [answer("5")], max_user_turns=1)
    assert (ep.termination, ep.score) == ("turn_cap", 0.5)


def test_step_cap_and_empty_checklist():
    loop = [ask("get_balance", {"account": "A1"})] * 10
    ep, eng, _ = run(record(["a?"], TWO_TURNS), loop, [result_text('{"balance": 5}')] * 10, max_steps=5)
    assert (ep.termination, ep.steps, len(ep.generations), ep.score) == ("step_cap", 5, 5, 0.0)
    for cl in ([], [[]], [[[], []]]):
        ep, _, client = run(record(["a?"], cl), [])
        assert (ep.termination, ep.generations, client.requests) == ("empty_checklist", [], [])


def test_every_termination_reason_is_covered_here():
    # The tests above reach each reason; this guards the list against silent additions.
    assert set(TERMINATION_REASONS) == {
        "completed",
        "required_item_failed",
        "judge_api_failure",
        "no_next_user",
        "parse_error",
        "simulator_error",
        "length_budget",
        "turn_cap",
        "step_cap",
        "empty_checklist",
    }
    assert set(TRAINED_ROLES) == set(MODES)


def test_empty_output_is_recorded_with_the_episode_score_and_bad_input():
    # The engine records the empty answer and its score unchanged; the penalty is the RL step's
    # (tests/rl/test_loop_step.py runs the two together).
    ep, _, _ = run(record(["a?"], [[[item({"type": "reply_contains", "values": [""]}, 1.0)]]]), [""])
    assert ep.score == 1.0 and ep.generations[0].text == "" and ep.generations[0].score == 1.0
    with pytest.raises(ValueError, match="rollout.mode"):
        RolloutConfig(mode="bogus")
    with pytest.raises(ValueError, match=r"records\[0\]"):
        RolloutEngine(RolloutConfig(), codec(), ScriptedClient(codec()), ChecklistTurnJudge(RuleJudge())).run([{}])
    with pytest.raises(ValueError, match="simulator client"):
        RolloutEngine(RolloutConfig(mode="noshare"), codec(), ScriptedClient(codec()), ChecklistTurnJudge(RuleJudge()))


def test_sequential_simulation_hides_sibling_results():
    c = codec()
    rec = record(["Two balances?"], [[[item(CALLED_A1, 1.0)]]])
    two = (
        "<think>\ntwo\n</think>"
        + call_block("get_balance", {"account": "A1"})
        + call_block("get_balance", {"account": "B2"})
    )
    for sequential in (True, False):
        ep, eng, client = run(
            rec,
            [two, answer("5 and 7")],
            [result_text('{"balance": 5}'), result_text('{"balance": 7}')],
            sequential_simulation=sequential,
        )
        assert ep.termination == "completed" and ep.score == 1.0
        sims = [g for g in ep.generations if g.role == REHEARSE]
        history = ep.messages[:2]  # before the assistant turn: no sibling result
        for g, (cid, name, args) in zip(
            sims, [("call_r_1_0", "get_balance", {"account": "A1"}), ("call_r_1_1", "get_balance", {"account": "B2"})]
        ):
            assert g.prompt_ids == c.simulator_prompt(rec, history, two, (cid, name, args))
        assert [m.get("content") for m in ep.messages[3:5]] == ['{"balance": 5}', '{"balance": 7}']
        expected = [(1, 0), (0, 1), (0, 1), (1, 0)] if sequential else [(1, 0), (0, 2), (1, 0)]
        assert rows_per_call(client.requests) == expected


def _replay(tasks, mode, make):
    c = codec()
    client = ScriptedClient(
        c,
        acts={i: act_texts(t) for i, t in enumerate(tasks)},
        rehearsals={i: rehearse_texts(t) for i, t in enumerate(tasks)},
    )
    eng = RolloutEngine(
        RolloutConfig(mode=mode, max_model_len=8192, act=RS, rehearse=RS),
        c,
        client,
        ChecklistTurnJudge(RuleJudge()),
        make_env=make,
        simulator=client,
    )
    return eng.run(list(tasks)), eng, client


def test_reference_replay_in_real_demo_worlds_scores_one():
    tasks = demo_tasks()
    eps, eng, _ = _replay(tasks, "real", make_env)
    assert [e.termination for e in eps] == ["completed"] * len(tasks)
    assert [e.score for e in eps] == [1.0] * len(tasks)
    for e, t in zip(eps, tasks):
        # the worlds answered exactly as in the reference conversation
        got = [m["content"] for m in e.messages if m["role"] == "tool"]
        assert got == [m["content"] for m in t["reference_messages"] if m["role"] == "tool"]
        assert all(g.role == ACT for g in e.generations)
    assert all(c[REHEARSE] == 0 for c in eng.sampler_calls)
    assert any(len(t["reference_messages"]) > 4 for t in tasks)  # multi-call or multi-turn tasks included


def test_rehearsal_mode_never_touches_a_real_tool():
    tasks = demo_tasks()[:6]
    built = []

    def guard(rec):
        built.append(NoToolEnvironment(rec["tools"]))
        return built[-1]

    eps, eng, client = _replay(tasks, "rehearsal", guard)
    assert [e.score for e in eps] == [1.0] * len(tasks)
    assert all(env.calls == [] for env in built) and all(e.env is None for e in eps)
    # the guard is live: the same environments fail at once in real mode
    with pytest.raises(RuntimeError, match="no real tool may run"):
        _replay(tasks, "real", guard)
    # rehearsal: one client call per step, and some of them carry both roles
    steps = max(e.steps for e in eps)
    assert len(client.requests) <= steps + 1
    assert any(a and r for a, r in rows_per_call(client.requests))
    s = summarize(eps)
    assert s["score_mean"] == 1.0 and s["termination"] == {"completed": len(tasks)}
    assert s["rows_rehearse"] == sum(len(rehearse_texts(t)) for t in tasks)


def test_generation_records_match_an_independent_render():
    c = codec()
    tasks = demo_tasks()[:8]
    eps, _, _ = _replay(tasks, "rehearsal", None)
    for e, t in zip(eps, tasks):
        tr = c.renderer.start(t["messages"], t["tools"])
        acts = [g for g in e.generations if g.role == ACT]
        users = [m for m in t["reference_messages"] if m["role"] == "user"]
        turn, prev = 0, None
        for g in e.generations:
            assert (g.uid, g.episode) == (t["uid"], e.episode_id)
            assert len(g.logprobs) == len(g.gen_ids) and g.text == c.decode(g.gen_ids)
        msgs = e.messages
        for i, m in enumerate(msgs[2:], start=2):
            if m["role"] == "assistant":
                g = acts.pop(0)
                assert g.prompt_ids == tr.ids, f"episode {e.episode_id}: ACT prompt differs from the render"
                assert g.turn == turn
                if prev is not None:  # the next ACT prompt extends prompt + generated ids
                    assert g.prompt_ids[: len(prev.prompt_ids) + len(prev.gen_ids)] == prev.prompt_ids + prev.gen_ids
                prev = g
                tr.add_assistant(g.gen_ids)
            elif m["role"] == "tool" and msgs[i - 1]["role"] != "tool":
                block = [x["content"] for x in msgs[i:] if x["role"] == "tool"]
                n = next((j for j, x in enumerate(msgs[i:]) if x["role"] != "tool"), len(msgs) - i)
                tr.add_tool_responses(block[:n])
            elif m["role"] == "user":
                turn += 1
                assert m == users[turn]
                tr.add_user(m["content"])
        assert acts == [] and e.state == State.TERMINATED
