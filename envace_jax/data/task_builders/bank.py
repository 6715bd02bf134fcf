"""Bank tasks: balances, transfers (some overdraw), a conditional transfer, comparing two accounts.

Each builder plays one user turn against the real world through a ``Recorder``; ``TASKS`` lists
(task type, builder, draw weight), error-path types weighing less.
"""

from __future__ import annotations

import random
from typing import Any

from envace_jax.data.task_builders.recorder import ANSWER_STYLE, Recorder, Reject
from envace_jax.envs.demo_worlds import NAMES


def state(rng: random.Random) -> dict[str, Any]:
    names = sorted(rng.sample(NAMES[:8], rng.randint(3, 5)))
    return {"accounts": {n: rng.randint(10, 99) for n in names}}


def system(state: dict[str, Any]) -> str:
    return f"You are a bank assistant. {ANSWER_STYLE}"


def _payer_payee(rng: random.Random, rec: Recorder) -> tuple[str, str]:
    a, b = rng.sample(list(rec.env.accounts), 2)
    if rec.env.accounts[a] < 1:  # a follow-up turn can meet an emptied account
        raise Reject(f"{a} is empty")
    return a, b


def balance(rng, rec):
    a = rng.choice(list(rec.env.accounts))
    rec.user(f"What is {a}'s balance?")
    (r,) = rec.call(("get_balance", {"account": a}))
    rec.reply(f"{a} has {r['balance']}.", [r["balance"]], f"Does the reply give {a}'s balance, {r['balance']}?")


def transfer(rng, rec):
    a, b = _payer_payee(rng, rec)
    x = rng.randint(1, rec.env.accounts[a])
    rec.user(f"Send {x} from {a} to {b}.")
    rec.call(("transfer", {"from_account": a, "to_account": b, "amount": x}))
    rec.reply(f"Sent {x} from {a} to {b}.", [x, b], f"Does the reply confirm that {x} went to {b}?")


def transfer_then_balance(rng, rec):
    a, b = _payer_payee(rng, rec)
    x = rng.randint(1, rec.env.accounts[a])
    rec.user(f"Send {x} from {a} to {b}, then tell me {b}'s balance.")
    rec.call(("transfer", {"from_account": a, "to_account": b, "amount": x}))
    (r,) = rec.call(("get_balance", {"account": b}))
    rec.reply(f"{b} now has {r['balance']}.", [r["balance"]], f"Does the reply give {b}'s new balance, {r['balance']}?")


def conditional(rng, rec):
    a, b = rng.sample(list(rec.env.accounts), 2)
    x = rng.randint(5, 95)
    rec.user(f"If {a} has at least {x}, send {x} from {a} to {b}. Otherwise tell me {a}'s balance.")
    (r,) = rec.call(("get_balance", {"account": a}))
    if r["balance"] >= x:
        rec.call(("transfer", {"from_account": a, "to_account": b, "amount": x}))
        rec.reply(f"Sent {x} from {a} to {b}.", [x, b], f"Does the reply confirm that {x} went to {b}?")
    else:
        rec.push_back = True
        rec.reply(
            f"{a} has only {r['balance']}, so I sent nothing.",
            [r["balance"]],
            f"Does the reply say {a} has only {r['balance']}?",
        )


def compare(rng, rec):
    a, b = rng.sample(list(rec.env.accounts), 2)
    if rec.env.accounts[a] == rec.env.accounts[b]:
        raise Reject("tie")
    rec.user(f"Who has more money, {a} or {b}?")
    ra, rb = rec.call(("get_balance", {"account": a}), ("get_balance", {"account": b}))
    win, lose = (ra, rb) if ra["balance"] > rb["balance"] else (rb, ra)
    rec.reply(
        f"{win['account']} has more: {win['balance']} against {lose['balance']}.",
        [win["account"], win["balance"]],
        f"Does the reply name {win['account']} as richer?",
    )


def overdraw(rng, rec):
    a, b = rng.sample(list(rec.env.accounts), 2)
    x = rec.env.accounts[a] + rng.randint(1, 30)
    rec.user(f"Send {x} from {a} to {b}.")
    rec.call(("transfer", {"from_account": a, "to_account": b, "amount": x}))
    rec.reply(
        f"I could not send it: insufficient funds in {a}.",
        ["insufficient"],
        "Does the reply say the transfer failed for insufficient funds?",
    )


def unknown(rng, rec):
    z = rng.choice([n for n in NAMES if n not in rec.env.accounts])
    rec.user(f"What is {z}'s balance?")
    rec.call(("get_balance", {"account": z}))
    rec.reply(f"There is no account named {z}.", ["no account", z], f"Does the reply say {z} has no account?")


TASKS = [
    ("balance", balance, 3),
    ("transfer", transfer, 3),
    ("transfer_then_balance", transfer_then_balance, 3),
    ("conditional", conditional, 3),
    ("compare", compare, 2),
    ("overdraw", overdraw, 1),
    ("unknown", unknown, 1),
]
