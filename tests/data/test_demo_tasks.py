"""Demo tool worlds and the task generator, checked against real executions, jsonschema and the rule judge."""

from __future__ import annotations

import copy
import json
import re

import jsonschema
import pytest

from envace_jax.data import demo_tasks as dt
from envace_jax.data.records import validate_record
from envace_jax.envs.base import ToolEnvironment
from envace_jax.envs.demo_worlds import WORLDS, canonical_json, make_env, tool_schemas
from envace_jax.rl.judges import RuleJudge
from envace_jax.rl.reward import score_conversation, validate_checklist_list

FOCUS = {"assistant.tool_calls", "assistant.content.thinking", "assistant.content.user_visible_reply", "tool.content"}
N_PER_SPLIT = 150


@pytest.fixture(scope="module")
def pools() -> dict[str, list[dict]]:
    return {s: dt.generate_tasks(N_PER_SPLIT, 11, s) for s in dt.SPLITS}


def _all(pools):
    return [t for s in dt.SPLITS for t in pools[s]]


def _calls(task):
    return [c for m in task["reference_messages"] for c in m.get("tool_calls") or []]


# --------------------------------------------------------------------------- replay and structure
def test_every_reference_conversation_replays_against_the_real_tools(pools):
    for task in _all(pools):
        env = make_env(task)
        assert isinstance(env, ToolEnvironment)
        answers: dict[str, tuple[str, str]] = {}
        for m in task["reference_messages"]:
            if m["role"] == "assistant":
                for c in m.get("tool_calls") or []:
                    fn = c["function"]
                    answers[c["id"]] = (fn["name"], env.execute(fn["name"], fn["arguments"]).content)
            elif m["role"] == "tool":
                name, content = answers.pop(m["tool_call_id"])
                assert (m["name"], m["content"]) == (name, content), task["uid"]
        assert not answers, f"{task['uid']}: calls without a tool message"


def test_records_follow_the_message_and_task_contracts(pools):
    for task in _all(pools):
        ref = task["reference_messages"]
        assert set(task) >= {"uid", "data_source", "messages", "tools", "reference_messages", "checklist", "env"}
        assert [m["role"] for m in task["messages"]] == ["system", "user"]
        assert task["messages"][1] == ref[0]
        assert task["tools"] == make_env(task).tool_schemas
        ids = [c["id"] for c in _calls(task)]
        assert len(ids) == len(set(ids))
        for c in _calls(task):
            assert c["type"] == "function" and isinstance(c["function"]["arguments"], dict)
        for m in ref:
            if m["role"] == "assistant":
                assert "<think>" not in m["content"]
        # every user turn ends with a tool-free answer, and the conversation ends there
        for i, m in enumerate(ref):
            if m["role"] == "user" and i > 0:
                assert ref[i - 1]["role"] == "assistant" and not ref[i - 1].get("tool_calls")
        assert ref[-1]["role"] == "assistant" and not ref[-1].get("tool_calls") and ref[-1]["content"]
        users = sum(m["role"] == "user" for m in ref)
        assert len(task["checklist"]) == 1 and len(task["checklist"][0]) == users


def test_records_pass_the_cm2_record_validator(pools):
    for i, task in enumerate(_all(pools)):
        out = validate_record(task, i, weight_tol=1e-6)
        assert out["env"] == task["env"] and out["checklist"] == task["checklist"]


def test_tasks_need_one_to_four_calls_and_cover_worlds_and_turns(pools):
    tasks = _all(pools)
    counts = [len(_calls(t)) for t in tasks]
    assert min(counts) >= 1 and max(counts) <= 4
    assert {1, 2, 3} <= set(counts)
    assert {t["env"]["name"] for t in tasks} == set(WORLDS)
    turns = [len(t["checklist"][0]) for t in tasks]
    assert 0.15 < turns.count(2) / len(turns) < 0.6 and set(turns) == {1, 2}
    errored = sum(any('"error"' in m["content"] for m in t["reference_messages"] if m["role"] == "tool") for t in tasks)
    assert 0.03 < errored / len(tasks) < 0.35  # some demonstrations show how to handle a failed call


def test_few_shot_block_never_shows_one_call_with_two_responses(pools):
    for task in _all(pools):
        seen: dict[str, str] = {}
        by_id = {
            c["id"]: canonical_json({"arguments": c["function"]["arguments"], "name": c["function"]["name"]})
            for c in _calls(task)
        }
        for m in task["reference_messages"]:
            if m["role"] == "tool":
                assert seen.setdefault(by_id[m["tool_call_id"]], m["content"]) == m["content"], task["uid"]


def test_numbers_in_answers_are_copied_from_the_visible_context(pools):
    """The design claim: ACT never has to compute a number, it copies one from a tool or the user."""
    for task in _all(pools):
        ref = task["reference_messages"]
        turn_text, t = [], -1
        for m in ref:
            if m["role"] == "user":
                t += 1
                turn_text = [m["content"]]
            elif m["role"] == "tool":
                turn_text.append(m["content"])
            elif not m.get("tool_calls"):
                for item in task["checklist"][0][t]:
                    if item["rule"]["type"] != "reply_contains":
                        continue
                    for v in item["rule"]["values"]:
                        if re.fullmatch(r"-?\d+(\.\d+)?", v):
                            assert any(re.search(rf"(?<![\d.]){re.escape(v)}(?![\d.])", s) for s in turn_text), (
                                task["uid"],
                                v,
                            )


# --------------------------------------------------------------------------- determinism and splits
def test_generation_is_deterministic_by_seed_and_prefix_stable():
    a = dt.generate_tasks(30, 5, "train")
    assert a == dt.generate_tasks(30, 5, "train")
    assert a[:12] == dt.generate_tasks(12, 5, "train")
    b = dt.generate_tasks(30, 6, "train")
    assert {t["uid"] for t in a} != {t["uid"] for t in b}


def test_splits_are_disjoint_and_uids_unique(pools):
    keys = {s: {dt.task_content_key(t) for t in pools[s]} for s in dt.SPLITS}
    for s in dt.SPLITS:
        assert len(keys[s]) == N_PER_SPLIT
        assert all(dt.split_of(t) == s for t in pools[s])
    assert not keys["train"] & keys["validation"]
    assert not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]
    # a different seed of another split cannot produce a test task either
    other = {dt.task_content_key(t) for t in dt.generate_tasks(200, 99, "train")}
    assert not other & keys["test"] and not other & keys["validation"]
    uids = [t["uid"] for t in _all(pools)]
    assert len(uids) == len(set(uids))


# --------------------------------------------------------------------------- checklist and rule judge
def test_checklist_items_carry_cm2_fields_and_rules(pools):
    for task in _all(pools):
        validate_checklist_list(task["checklist"])
        for turn in task["checklist"][0]:
            assert turn and abs(sum(it["weight"] for it in turn) - 1.0) < 1e-6
            for it in turn:
                assert it["focus_on"] in FOCUS
                assert isinstance(it["question"], str) and it["question"].endswith("?")
                assert isinstance(it["pass_condition"], str) and it["pass_condition"]
                assert it["failure_examples"] and all(isinstance(f, str) for f in it["failure_examples"])
                assert all({"snippet", "turn", "step", "from"} <= set(e) for e in it["evidence"])
                assert isinstance(it["required_for_next_turn"], bool)
                assert it["rule"]["type"] in {"tool_called", "reply_contains"}


def test_rule_judge_gives_every_reference_conversation_full_marks(pools):
    judge = RuleJudge(missing_rule="raise")
    for task in _all(pools):
        scores = score_conversation(task["reference_messages"], task["checklist"], judge)
        assert scores == [pytest.approx(1.0)] * len(task["checklist"][0]), task["uid"]


def test_rule_judge_marks_down_a_wrong_argument_and_a_wrong_answer(pools):
    judge = RuleJudge(missing_rule="raise")
    for task in pools["test"][:60]:
        bad_call = copy.deepcopy(task["reference_messages"])
        args = next(m for m in bad_call if m.get("tool_calls"))["tool_calls"][0]["function"]["arguments"]
        key = sorted(args)[0]
        args[key] = args[key] + 1000 if isinstance(args[key], (int, float)) else args[key] + "zz"
        assert score_conversation(bad_call, task["checklist"], judge)[0] < 1.0 - 1e-9, task["uid"]
        bad_reply = copy.deepcopy(task["reference_messages"])
        first_answer = next(m for m in bad_reply if m["role"] == "assistant" and not m.get("tool_calls"))
        first_answer["content"] = "Done."
        assert score_conversation(bad_reply, task["checklist"], judge)[0] < 1.0 - 1e-9, task["uid"]


# --------------------------------------------------------------------------- schemas
def _strict(schema: dict) -> dict:
    return {**schema, "additionalProperties": False}


def test_schemas_are_valid_json_schema_and_reference_calls_conform(pools):
    names = set()
    for world in WORLDS:
        for s in tool_schemas(world):
            fn = s["function"]
            assert s["type"] == "function" and fn["description"] and fn["name"] not in names
            names.add(fn["name"])
            jsonschema.Draft202012Validator.check_schema(fn["parameters"])
            assert set(fn["parameters"]["required"]) <= set(fn["parameters"]["properties"])
    validators = {
        s["function"]["name"]: jsonschema.Draft202012Validator(_strict(s["function"]["parameters"]))
        for world in WORLDS
        for s in tool_schemas(world)
    }
    for task in _all(pools):
        assert [t["function"]["parameters"] for t in task["tools"]] == [
            t["function"]["parameters"] for t in tool_schemas(task["env"]["name"])
        ]
        for c in _calls(task):
            validators[c["function"]["name"]].validate(c["function"]["arguments"])


def test_valid_ids_are_named_in_the_schemas_and_unknown_ids_are_not(pools):
    """REHEARSE sees schemas but no system prompt: the id sets must be readable from the schemas."""
    for task in _all(pools):
        text = " ".join(t["function"]["description"] for t in task["tools"])
        state = task["env"]["state"]
        ids = {"bank": lambda: state["accounts"], "shop": lambda: {**state["items"], **state["orders"]}}
        if task["env"]["name"] not in ids:
            continue
        listed = set(re.findall(r"(?:Accounts|Items|Orders): ([a-z0-9, ]+)\.", text))
        named = {x.strip() for group in listed for x in group.split(",")}
        assert named == set(ids[task["env"]["name"]]()), task["uid"]
        for m in task["reference_messages"]:
            hit = re.search(r"unknown (?:account|item|order) '(\w+)'", m["content"]) if m["role"] == "tool" else None
            if hit:
                assert hit.group(1) not in named


def test_world_rejects_exactly_the_calls_jsonschema_rejects():
    """Independent truth for argument validation: jsonschema on the world's own schema."""
    for ex in dt.world_model_examples(300, 4):
        world = ex.task["env"]["name"]
        by_name = {s["function"]["name"]: s["function"]["parameters"] for s in tool_schemas(world)}
        payload = json.loads(ex.response)
        if ex.call["name"] not in by_name:
            assert payload == {"error": f"unknown tool '{ex.call['name']}'"}
            continue
        ok = jsonschema.Draft202012Validator(_strict(by_name[ex.call["name"]])).is_valid(ex.call["arguments"])
        if not ok:
            assert "error" in payload, ex


# --------------------------------------------------------------------------- error payloads
BANK = {"name": "bank", "state": {"accounts": {"ana": 20, "ben": 5}}}
SHOP = {
    "name": "shop",
    "state": {
        "items": {"pen": {"price": 3, "stock": 2}},
        "orders": {
            "o12": {"item": "pen", "quantity": 1, "status": "shipped"},
            "o13": {"item": "pen", "quantity": 1, "status": "placed"},
        },
    },
}
CAL = {"name": "calendar", "state": {"events": [{"day": "mon", "hour": 10, "title": "gym"}]}}
UNITS = {"name": "units", "state": {}}

ERROR_TABLE = [
    (BANK, "get_balance", {"account": "zed"}, "unknown account 'zed'"),
    (BANK, "get_balance", {}, "missing argument 'account'"),
    (BANK, "get_balance", {"account": "ana", "pin": 1}, "unexpected argument 'pin'"),
    (BANK, "get_balance", {"account": 3}, "argument 'account' must be a string"),
    (BANK, "transfer", {"from_account": "ana", "to_account": "ben", "amount": 21}, "insufficient funds in 'ana'"),
    (BANK, "transfer", {"from_account": "ana", "to_account": "ben", "amount": 0}, "amount must be positive"),
    (
        BANK,
        "transfer",
        {"from_account": "ana", "to_account": "ben", "amount": 2.5},
        "argument 'amount' must be an integer",
    ),
    (
        BANK,
        "transfer",
        {"from_account": "ana", "to_account": "ben", "amount": True},
        "argument 'amount' must be an integer",
    ),
    (
        BANK,
        "transfer",
        {"from_account": "ana", "to_account": "ana", "amount": 1},
        "cannot transfer to the same account",
    ),
    (BANK, "transfer", {"from_account": "ana", "to_account": "kim", "amount": 1}, "unknown account 'kim'"),
    (BANK, "check_stock", {"item": "pen"}, "unknown tool 'check_stock'"),
    (SHOP, "check_stock", {"item": "hat"}, "unknown item 'hat'"),
    (SHOP, "place_order", {"item": "pen", "quantity": 3}, "not enough 'pen' in stock"),
    (SHOP, "place_order", {"item": "pen", "quantity": -1}, "quantity must be positive"),
    (SHOP, "cancel_order", {"order_id": "o12"}, "order 'o12' has already shipped"),
    (SHOP, "get_order", {"order_id": "o99"}, "unknown order 'o99'"),
    (CAL, "add_event", {"day": "mon", "hour": 10, "title": "yoga"}, "mon 10 is already booked"),
    (CAL, "add_event", {"day": "mon", "hour": 18, "title": "yoga"}, "hour must be between 9 and 17"),
    (CAL, "add_event", {"day": "mon", "hour": 11, "title": ""}, "title must not be empty"),
    (CAL, "list_events", {"day": "sun"}, "unknown day 'sun'"),
    (CAL, "add_event", {"day": "monday", "hour": 30, "title": "x"}, "unknown day 'monday'"),
    (CAL, "remove_event", {"day": "tue", "hour": 10}, "no event on tue at 10"),
    (UNITS, "convert", {"value": 1, "from_unit": "kg", "to_unit": "h"}, "cannot convert kg to h"),
    (UNITS, "convert", {"value": 1, "from_unit": "mi", "to_unit": "km"}, "unknown unit 'mi'"),
    (UNITS, "convert", {"value": "1", "from_unit": "m", "to_unit": "cm"}, "argument 'value' must be a number"),
    (UNITS, "list_units", {"kind": "volume"}, "invalid kind 'volume'"),
]


@pytest.mark.parametrize("env,name,args,message", ERROR_TABLE)
def test_bad_calls_get_real_error_payloads_and_leave_state_alone(env, name, args, message):
    world = make_env({"env": env})
    before = copy.deepcopy(world.__dict__)
    result = world.execute(name, args)
    assert result.error and result.content == canonical_json({"error": message})
    assert world.__dict__ == before


def test_good_calls_return_echoes_constants_and_lookups():
    bank = make_env({"env": BANK})
    assert (
        bank.execute("transfer", {"from_account": "ana", "to_account": "ben", "amount": 7}).content
        == '{"amount":7,"from":"ana","status":"ok","to":"ben"}'
    )
    assert bank.execute("get_balance", {"account": "ben"}).content == '{"account":"ben","balance":12}'
    shop = make_env({"env": SHOP})
    assert json.loads(shop.execute("place_order", {"item": "pen", "quantity": 2}).content)["order_id"] == "n1"
    assert json.loads(shop.execute("check_stock", {"item": "pen"}).content)["stock"] == 0
    assert shop.execute("cancel_order", {"order_id": "n1"}).content == '{"order_id":"n1","status":"cancelled"}'
    assert json.loads(shop.execute("check_stock", {"item": "pen"}).content)["stock"] == 2
    cal = make_env({"env": CAL})
    cal.execute("add_event", {"day": "mon", "hour": 9, "title": "call"})
    assert (
        cal.execute("list_events", {"day": "mon"}).content
        == '{"day":"mon","events":[{"hour":9,"title":"call"},{"hour":10,"title":"gym"}]}'
    )
    units = make_env({"env": UNITS})
    assert (
        json.loads(units.execute("convert", {"value": 90, "from_unit": "min", "to_unit": "h"}).content)["result"] == 1.5
    )
    assert (
        json.loads(units.execute("convert", {"value": 3, "from_unit": "km", "to_unit": "cm"}).content)["result"]
        == 300000
    )
    # reset restores the pristine state after changes
    bank.reset({"env": BANK})
    assert bank.execute("get_balance", {"account": "ben"}).content == '{"account":"ben","balance":5}'


def test_bad_inputs_name_the_bad_thing():
    with pytest.raises(ValueError, match="dev"):
        dt.generate_tasks(2, 0, "dev")
    with pytest.raises(ValueError, match="n must be"):
        dt.generate_tasks(-1, 0, "train")
    with pytest.raises(ValueError, match="zoo"):
        make_env({"uid": "t1", "env": {"name": "zoo", "state": {}}})
    with pytest.raises(ValueError, match="bank"):
        WORLDS["bank"]().reset({"env": {"name": "shop", "state": {}}})


# --------------------------------------------------------------------------- world-model rows
def test_world_model_examples_are_real_varied_and_consistent_with_the_few_shot_block():
    exs = dt.world_model_examples(240, 2)
    assert exs == dt.world_model_examples(240, 2) and len(exs) == 240
    errors = [json.loads(e.response).get("error", "") for e in exs]
    rate = sum(bool(e) for e in errors) / len(errors)
    assert 0.3 < rate < 0.8
    for fragment in ("unknown tool", "missing argument", "unexpected argument", "must be", "unknown "):
        assert any(fragment in e for e in errors), fragment
    for ex in exs:
        task, call, response = ex
        assert dt.split_of(task) == "train"
        fresh = make_env(task)
        assert fresh.execute(call["name"], call["arguments"]).content == response
        logged = dt.reference_responses(task).get(
            canonical_json({"arguments": call["arguments"], "name": call["name"]})
        )
        assert logged in (None, response)
    assert {e.task["env"]["name"] for e in exs} == set(WORLDS)


# --------------------------------------------------------------------------- branch kinds and mixes
def _pushes_back_in_replay(task) -> bool:
    """Independent of the generator's label: replay the reference against the real world; the branch pushes
    back when a tool errs or the assistant declines what the user asked for because of a returned value."""
    env = make_env(task)
    ref = task["reference_messages"]
    for m in ref:
        for c in m.get("tool_calls") or []:
            if env.execute(c["function"]["name"], c["function"]["arguments"]).error:
                return True
    replies = [m["content"] for m in ref if m["role"] == "assistant" and not m.get("tool_calls")]
    return any(("so I sent nothing" in r) or ("so I did not order" in r) for r in replies)


def test_branch_labels_agree_with_a_replay_against_the_real_tools(pools):
    tasks = _all(pools)
    assert {t["branch"] for t in tasks} == set(dt.BRANCHES)
    for t in tasks:
        assert t["branch"] == (dt.PUSH_BACK if _pushes_back_in_replay(t) else dt.HAPPY), t["uid"]
        world, kind = t["task_type"].split("/")
        assert world == t["env"]["name"] and kind


@pytest.mark.parametrize("share", [0.0, 0.04, 0.5, 1.0])
def test_push_back_share_fixes_the_mix_and_keeps_prefixes(share):
    n = 120
    tasks = dt.generate_tasks(n, 3, "test", push_back_share=share)
    kinds = [t["branch"] for t in tasks]
    assert kinds == dt.branch_plan(n, share)
    assert kinds.count(dt.PUSH_BACK) == int(n * share)
    assert len({t["uid"] for t in tasks}) == n and all(dt.split_of(t) == "test" for t in tasks)
    assert dt.generate_tasks(40, 3, "test", push_back_share=share) == tasks[:40]
    # a natural stream has both kinds; the fixed mix takes them in that stream's order
    natural = dt.generate_tasks(800, 3, "test")
    for b in dt.BRANCHES:
        mine = [t["uid"] for t in tasks if t["branch"] == b]
        theirs = [t["uid"] for t in natural if t["branch"] == b]
        assert mine == theirs[: len(mine)]


def test_push_back_share_rejects_out_of_range():
    with pytest.raises(ValueError, match="push_back_share"):
        dt.generate_tasks(4, 0, "train", push_back_share=1.5)
