"""The opt-in "irreversible" task family (wire world): seeded like the default tasks, apart from them, and
scored by the checklist so that the naive call, once made, cannot be made good."""

from __future__ import annotations

import json

import pytest

from envace_jax.data import demo_tasks as dt
from envace_jax.data.records import validate_record
from envace_jax.envs.demo_worlds import make_env
from envace_jax.eval.results import is_success
from envace_jax.rl.judges import RuleJudge
from envace_jax.rl.reward import episode_score, score_conversation

FAMILY = "irreversible"


@pytest.fixture(scope="module")
def tasks() -> list[dict]:
    return dt.generate_tasks(120, 5, "test", family=FAMILY)


def _score(task: dict, messages: list[dict]) -> float:
    return episode_score(score_conversation(messages, task["checklist"], RuleJudge()), task["checklist"])


def _play(task: dict, steps: list[tuple]) -> tuple[list[dict], dict]:
    """Runs ``steps`` (("call", name, args) or ("reply", text)) against the task's real world."""
    env = make_env(task)
    msgs = [dict(m) for m in task["messages"]]
    for k, step in enumerate(steps):
        if step[0] == "reply":
            msgs.append({"role": "assistant", "content": step[1]})
            continue
        _, name, args = step
        r = env.execute(name, args)
        call = {"id": f"c{k}", "type": "function", "function": {"name": name, "arguments": args}}
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        msgs.append({"role": "tool", "name": name, "tool_call_id": f"c{k}", "content": r.content})
    return msgs, env.accounts


def _calls(task: dict) -> list[tuple[str, dict]]:
    return [
        (c["function"]["name"], c["function"]["arguments"])
        for m in task["reference_messages"]
        for c in m.get("tool_calls") or []
    ]


def _one_turn(tasks: list[dict], kind: str) -> list[dict]:
    out = [t for t in tasks if t["task_type"] == f"wire/{kind}" and len(t["checklist"][0]) == 1]
    assert out, f"no one-turn {kind} task drawn"
    return out


def test_the_family_is_seeded_and_its_own_stream():
    a = dt.generate_tasks(30, 5, "test", family=FAMILY)
    assert a == dt.generate_tasks(30, 5, "test", family=FAMILY)
    assert a[:10] == dt.generate_tasks(10, 5, "test", family=FAMILY)
    assert [t["uid"] for t in a] != [t["uid"] for t in dt.generate_tasks(30, 6, "test", family=FAMILY)]
    assert all(t["env"]["name"] == "wire" and t["uid"].startswith("demo-irreversible-test-") for t in a)
    default = dt.generate_tasks(30, 5, "test")
    assert default == dt.generate_tasks(30, 5, "test", family="default")
    assert all(t["env"]["name"] != "wire" for t in default)
    with pytest.raises(ValueError, match="task family must be one of"):
        dt.generate_tasks(3, 5, "test", family="wire")


def test_train_and_test_tasks_of_the_family_are_disjoint():
    keys = {s: {dt.task_content_key(t) for t in dt.generate_tasks(150, 5, s, family=FAMILY)} for s in dt.SPLITS}
    assert not keys["train"] & keys["test"] and not keys["train"] & keys["validation"]
    assert all(dt.split_of(t) == "test" for t in dt.generate_tasks(40, 5, "test", family=FAMILY))


def test_every_reference_replays_and_scores_one(tasks):
    kinds = {t["task_type"] for t in tasks}
    assert kinds == {"wire/split_over_limit", "wire/send_all", "wire/close_and_move", "wire/plain"}
    for task in tasks:
        validate_record(task)
        env = make_env(task)
        for m in task["reference_messages"]:
            for c in m.get("tool_calls") or []:
                r = env.execute(c["function"]["name"], c["function"]["arguments"])
                logged = next(t for t in task["reference_messages"] if t.get("tool_call_id") == c["id"])
                assert r.content == logged["content"] and not r.error
        assert is_success(_score(task, task["messages"] + task["reference_messages"][1:]))


def test_over_the_limit_in_one_wire_loses_the_fee_for_good(tasks):
    task = _one_turn(tasks, "split_over_limit")[0]
    (_, w1), (_, w2), (_, gb) = _calls(task)
    a, b, x = w1["from_account"], w1["to_account"], w1["amount"] + w2["amount"]
    start = task["env"]["state"]["accounts"][a]
    oracle = start - x - 4  # two wires, two fees
    assert json.loads(task["reference_messages"][-2]["content"])["balance"] == oracle
    naive = [
        ("call", "transfer", {"from_account": a, "to_account": b, "amount": x}),
        ("call", "transfer", w1),
        ("call", "transfer", w2),
    ]
    msgs, accounts = _play(task, naive + [("call", "get_balance", gb)])
    assert json.loads(msgs[3]["content"])["error"].startswith("over the limit")
    assert accounts[a] == oracle - 2  # the refused attempt's fee is gone
    msgs.append({"role": "assistant", "content": f"Sent {x}; {a} now has {accounts[a]}."})
    assert not is_success(_score(task, msgs))  # every call item passes, the balance item cannot


def test_sending_the_whole_balance_makes_the_right_wire_impossible(tasks):
    task = _one_turn(tasks, "send_all")[0]
    (_, gb), (_, w) = _calls(task)
    a, b = w["from_account"], w["to_account"]
    bal = task["env"]["state"]["accounts"][a]
    assert w["amount"] == bal - 2
    msgs, accounts = _play(
        task,
        [
            ("call", "get_balance", gb),
            ("call", "transfer", {"from_account": a, "to_account": b, "amount": bal}),  # refused, fee kept
            ("call", "transfer", w),  # the oracle's wire: now short by the lost fee
            ("reply", f"Could not send all of {a}'s money to {b}."),
        ],
    )
    assert accounts[a] == bal - 4 and "insufficient" in msgs[-2]["content"]
    assert not is_success(_score(task, msgs))


def test_closing_first_deletes_the_money_the_user_wanted_moved(tasks):
    task = _one_turn(tasks, "close_and_move")[0]
    (_, gb), (_, w), (_, close) = _calls(task)
    a, b = w["from_account"], w["to_account"]
    start = dict(task["env"]["state"]["accounts"])
    msgs, accounts = _play(task, [("call", "close_account", close), ("call", "transfer", w), ("reply", f"Closed {a}.")])
    assert a not in accounts and accounts[b] == start[b]  # nothing reached b, and never will
    assert json.loads(msgs[3]["content"])["lost"] == start[a]
    assert not is_success(_score(task, msgs))
    right, right_accounts = _play(
        task, [("call", "get_balance", gb), ("call", "transfer", w), ("call", "close_account", close)]
    )
    assert right_accounts[b] == start[b] + start[a] - 2
