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
