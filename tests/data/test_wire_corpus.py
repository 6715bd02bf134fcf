"""The wire corpus (``data.wire_corpus``): plain wire tasks only, and single calls whose real responses follow
the rules the tool descriptions state, checked against those rules written out by hand here."""

from __future__ import annotations

import collections
import json

import pytest

from envace_jax.data import wire_corpus
from envace_jax.data.demo_tasks import generate_tasks
from envace_jax.envs.demo_worlds import WireWorld


def _expected(call, accounts):
    """What the transfer / get_balance / close_account descriptions say a call on ``accounts`` returns: the
    response's JSON, or for a refusal the start of its error message."""
    name, a = call["name"], call["arguments"]
    if name in ("get_balance", "close_account"):
        if a["account"] not in accounts:
            return {"error": "unknown account 'zed'"}
        bal = accounts[a["account"]]
        return (
            {"account": a["account"], "balance": bal}
            if name == "get_balance"
            else {"account": a["account"], "lost": bal, "status": "closed"}
        )
    src, dst, amount = a["from_account"], a["to_account"], a["amount"]
    if dst not in accounts:
        return {"error": "unknown account 'zed'"}
    if amount > 40:  # the fee is taken, then the wire refused
        return {"error": "over the limit of 40; fee of 2 charged"}
    if accounts[src] < amount + 2:
        return {"error": f"insufficient funds in '{src}'; fee of 2 charged"}
    return {"amount": amount, "fee": 2, "from": src, "status": "ok", "to": dst}


def test_plain_demonstrations_are_plain_train_tasks_only():
    demos = wire_corpus.plain_demonstrations(40, seed=3)
    assert len(demos) == 40 and len({t["uid"] for t in demos}) == 40
    assert all(t["task_type"] == "wire/plain" and t["uid"].startswith("demo-irreversible-train-") for t in demos)
    held_out = {t["uid"] for s in ("validation", "test") for t in generate_tasks(200, 3, s, family="irreversible")}
    assert not held_out & {t["uid"] for t in demos}
    for t in demos:  # one turn, one wire within the rules, no balance read, no closing: nothing a trap's way out needs
        calls = [c["function"] for m in t["reference_messages"] for c in m.get("tool_calls") or []]
        assert [c["name"] for c in calls] == ["transfer"] and calls[0]["arguments"]["amount"] <= 40
    assert wire_corpus.plain_demonstrations(10, seed=3) == demos[:10]
    skip = {demos[0]["uid"]}
    assert wire_corpus.plain_demonstrations(5, seed=3, exclude_uids=skip) == demos[1:6]


def test_world_model_examples_follow_the_stated_rules_and_show_every_refusal():
    worlds = wire_corpus.plain_demonstrations(16, seed=0)
    examples = wire_corpus.world_model_examples(300, seed=0, worlds=worlds)
    assert len(examples) == 300
    seen = collections.Counter()
    for ex in examples:
        want = _expected(ex.call, ex.task["env"]["state"]["accounts"])
        assert json.loads(ex.response) == want, (ex.call, ex.task["env"]["state"], ex.response)
        seen[want["error"].split(" '")[0].split(";")[0] if "error" in want else ex.call["name"]] += 1
    # every rule shows up: a wire that goes through, the limit, funds short of the fee, an unknown account
    want = {
        "transfer",
        "get_balance",
        "close_account",
        "over the limit of 40",
        "insufficient funds in",
        "unknown account",
    }
    assert want <= set(seen), seen
    # drawing is reproducible and the worlds are the ones given
    assert wire_corpus.world_model_examples(20, seed=0, worlds=worlds) == examples[:20]
    assert {ex.task["uid"] for ex in examples} <= {t["uid"] for t in worlds}
    # the worlds' states are not changed by the executions
    assert all(WireWorld(t["env"]["state"]).accounts == t["env"]["state"]["accounts"] for t in worlds)


def test_bad_counts_are_errors():
    with pytest.raises(ValueError, match="non-negative"):
        wire_corpus.plain_demonstrations(-1, seed=0)
    with pytest.raises(ValueError, match="at least one world"):
        wire_corpus.world_model_examples(3, seed=0, worlds=[])


def test_rule_blind_attempts_break_the_rule_each_trap_hides():
    """The attempt a rule-blind plan makes, run for real, meets the very refusal (or loss) the trap is built
    on, while the task's reference plan meets none: checked against the rules written out by hand above."""
    traps = wire_corpus.retry_tasks(60, seed=4)
    assert len(traps) == 60 and all(t["uid"].startswith("demo-irreversible-train-") for t in traps)
    assert {t["task_type"] for t in traps} == set(wire_corpus.TRAPS)
    assert all(sum(m["role"] == "user" for m in t["reference_messages"]) == 1 for t in traps)
    for t in traps:
        accounts = dict(t["env"]["state"]["accounts"])
        for variant in (0, 1):
            steps, reply = wire_corpus.rule_blind_attempt(t, variant)
            names = [n for n, _, _ in steps]
            bal = dict(accounts)
            for name, args, response in steps:  # replay the rules by hand, the fee charged before a refusal
                got = json.loads(response)
                if name == "close_account":
                    assert got == {"account": args["account"], "lost": bal.pop(args["account"]), "status": "closed"}
                    continue
                if name == "transfer" and args["from_account"] not in bal:
                    assert got == {"error": f"unknown account '{args['from_account']}'"}
                    continue
                assert got == _expected({"name": name, "arguments": args}, bal), (t["uid"], steps)
                if name == "transfer":
                    bal[args["from_account"]] -= 2
                    if "error" not in got:
                        bal[args["from_account"]] -= args["amount"]
                        bal[args["to_account"]] += args["amount"]
            errors = [json.loads(r)["error"] for _, _, r in steps if "error" in json.loads(r)]
            if t["task_type"] == "wire/split_over_limit":
                assert names == ["transfer", "get_balance"] and errors == ["over the limit of 40; fee of 2 charged"]
                assert str(json.loads(steps[1][2])["balance"]) in reply
            elif t["task_type"] == "wire/send_all":
                # the whole balance (at most 42) is short of the fee, or over the limit as well
                assert names == ["get_balance", "transfer"] and len(errors) == 1
                assert errors[0].startswith(("insufficient funds", "over the limit"))
            else:
                assert names[0] == "get_balance" and sorted(names[1:]) == ["close_account", "transfer"]
                assert len(errors) == 1 and names[1] == ("close_account" if variant == 0 else "transfer")
        # the reference plan, run the same way, is refused nothing
        env = WireWorld(t["env"]["state"])
        for m in t["reference_messages"]:
            for c in m.get("tool_calls") or []:
                assert "error" not in json.loads(env.execute(c["function"]["name"], c["function"]["arguments"]).content)
    with pytest.raises(ValueError, match="not a trap"):
        wire_corpus.rule_blind_attempt(wire_corpus.plain_demonstrations(1, seed=4)[0])
