"""The opt-in wire world: its rules and irreversible effects, against hand-computed balances."""

from __future__ import annotations

import json

import pytest

from envace_jax.chat.call_schema import call_problem
from envace_jax.envs.demo_worlds import WORLDS, WireWorld, make_env, tool_schemas


def _world(**balances: int) -> WireWorld:
    return WireWorld({"accounts": dict(balances)})


def _call(env: WireWorld, name: str, **args):
    r = env.execute(name, args)
    return r.error, json.loads(r.content)


def test_a_wire_within_the_rules_moves_the_amount_and_charges_the_fee():
    env = _world(ana=50, ben=10)
    err, out = _call(env, "transfer", from_account="ana", to_account="ben", amount=30)
    assert not err and out == {"amount": 30, "fee": 2, "from": "ana", "status": "ok", "to": "ben"}
    assert env.accounts == {"ana": 18, "ben": 40}  # 50 - 30 - 2, 10 + 30


def test_over_the_limit_is_refused_and_the_fee_is_kept():
    env = _world(ana=90, ben=0)
    err, out = _call(env, "transfer", from_account="ana", to_account="ben", amount=41)
    assert err and out == {"error": "over the limit of 40; fee of 2 charged"}
    assert env.accounts == {"ana": 88, "ben": 0}
    # the refusal is not undone by anything: splitting afterwards leaves ana 2 below the oracle's 90-41-4=45
    _call(env, "transfer", from_account="ana", to_account="ben", amount=40)
    _call(env, "transfer", from_account="ana", to_account="ben", amount=1)
    assert env.accounts == {"ana": 43, "ben": 41}


def test_funds_short_of_amount_plus_fee_is_refused_and_charged():
    env = _world(ana=20, ben=0)
    err, out = _call(env, "transfer", from_account="ana", to_account="ben", amount=20)
    assert err and out == {"error": "insufficient funds in 'ana'; fee of 2 charged"}
    assert env.accounts["ana"] == 18
    # the right amount before the mistake (20 - 2 = 18) no longer goes through: 18 < 18 + 2
    err, _ = _call(env, "transfer", from_account="ana", to_account="ben", amount=18)
    assert err and env.accounts == {"ana": 16, "ben": 0}


def test_malformed_requests_cost_nothing():
    env = _world(ana=20, ben=5, cal=1)
    for args, text in [
        ({"from_account": "zed", "to_account": "ben", "amount": 3}, "unknown account 'zed'"),
        ({"from_account": "ana", "to_account": "ana", "amount": 3}, "cannot wire to the same account"),
        ({"from_account": "ana", "to_account": "ben", "amount": 0}, "amount must be positive"),
        ({"from_account": "cal", "to_account": "ben", "amount": 1}, "'cal' cannot pay the fee of 2"),
    ]:
        err, out = _call(env, "transfer", **args)
        assert err and out == {"error": text}
    assert env.accounts == {"ana": 20, "ben": 5, "cal": 1}


def test_closing_deletes_the_account_and_its_money():
    env = _world(ana=12, ben=5)
    err, out = _call(env, "close_account", account="ana")
    assert not err and out == {"account": "ana", "lost": 12, "status": "closed"}
    assert env.accounts == {"ben": 5}
    err, out = _call(env, "transfer", from_account="ana", to_account="ben", amount=10)
    assert err and out == {"error": "unknown account 'ana'"}
    err, out = _call(env, "close_account", account="ana")
    assert err and out == {"error": "unknown account 'ana'"}


def test_the_rules_are_written_in_the_descriptions_both_roles_read():
    schemas = {s["function"]["name"]: s for s in tool_schemas("wire", {"accounts": {"ana": 1, "ben": 2}})}
    wire = schemas["transfer"]["function"]["description"]
    assert "fee of 2" in wire and "over 40" in wire and "Irreversible" in wire
    assert "deleted" in schemas["close_account"]["function"]["description"]
    assert "Accounts: ana, ben." in schemas["get_balance"]["function"]["description"]
    # a rule violation is a call the schema accepts: only the world (or a rehearsal of it) knows it fails
    assert (
        call_problem("transfer", {"from_account": "ana", "to_account": "ben", "amount": 99}, list(schemas.values()))
        is None
    )


def test_the_wire_world_is_reachable_but_not_among_the_default_worlds():
    assert "wire" not in WORLDS  # every draw over WORLDS (the default tasks) stays as it was
    env = make_env({"uid": "x", "env": {"name": "wire", "state": {"accounts": {"ana": 3, "ben": 4}}}})
    assert isinstance(env, WireWorld) and env.accounts == {"ana": 3, "ben": 4}
    with pytest.raises(ValueError, match="not a demo world"):
        make_env({"uid": "x", "env": {"name": "wires", "state": {}}})
