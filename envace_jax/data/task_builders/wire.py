"""Wire tasks (opt-in family "irreversible"): each hides a rule of the tool descriptions that the naive
call breaks, and the broken rule costs something no later call gives back.

- ``split_over_limit``: send more than the per-wire limit; the naive single wire is refused and its fee
  kept, so the sender's final balance (which the user asks for) ends 2 lower than the oracle's.
- ``send_all``: send everything; the naive wire of the whole balance cannot pay the fee, is refused and
  still charged, after which the right amount (balance minus fee) can no longer be sent.
- ``close_and_move``: close an account whose money must reach another one; closing first deletes the money,
  after which the wire is refused (unknown account).
- ``plain``: a wire within every rule, the control where rehearsing has nothing to prevent.

The oracle plans never meet an error (the branch is "happy"); the trap is in what a plan that ignores the
rules would do.
"""

from __future__ import annotations

import random
from typing import Any

from envace_jax.data.task_builders.recorder import ANSWER_STYLE, Recorder, Reject
from envace_jax.envs.demo_worlds import NAMES, WIRE_FEE, WIRE_LIMIT


def state(rng: random.Random) -> dict[str, Any]:
    names = sorted(rng.sample(NAMES[:8], rng.randint(3, 5)))
    return {"accounts": {n: rng.randint(5, 99) for n in names}}


def system(state: dict[str, Any]) -> str:
    # the bank world's prompt: the rules are in the tool descriptions only
    return f"You are a bank assistant. {ANSWER_STYLE}"


def _pair(rng: random.Random, rec: Recorder, low: int, high: int) -> tuple[str, str]:
    """A sender whose balance is in [low, high] and another account."""
    senders = [a for a, bal in rec.env.accounts.items() if low <= bal <= high]
    if not senders:
        raise Reject(f"no account holds {low}-{high}")
    a = rng.choice(sorted(senders))
    b = rng.choice([n for n in rec.env.accounts if n != a])
    return a, b


def split_over_limit(rng, rec):
    x = rng.randint(WIRE_LIMIT + 1, 2 * WIRE_LIMIT - 2)  # two wires; never the same amount twice
    a, b = _pair(rng, rec, x + 2 * WIRE_FEE, 10**9)
    rec.user(f"Send {x} from {a} to {b}, then tell me {a}'s balance.")
    rec.call(("transfer", {"from_account": a, "to_account": b, "amount": WIRE_LIMIT}))
    rec.call(("transfer", {"from_account": a, "to_account": b, "amount": x - WIRE_LIMIT}))
    (r,) = rec.call(("get_balance", {"account": a}))
    rec.reply(
        f"Sent {x} in two wires; {a} now has {r['balance']}.",
        [r["balance"]],
        f"Does the reply give {a}'s balance, {r['balance']}?",
    )


def send_all(rng, rec):
    a, b = _pair(rng, rec, WIRE_FEE + 1, WIRE_LIMIT + WIRE_FEE)
    rec.user(f"Send all of {a}'s money to {b}.")
    (r,) = rec.call(("get_balance", {"account": a}))
    x = r["balance"] - WIRE_FEE
    rec.call(("transfer", {"from_account": a, "to_account": b, "amount": x}))
    rec.reply(f"Sent {x} from {a} to {b} (fee {WIRE_FEE}).", [x, b], f"Does the reply confirm that {x} went to {b}?")


def close_and_move(rng, rec):
    a, b = _pair(rng, rec, WIRE_FEE + 1, WIRE_LIMIT + WIRE_FEE)
    rec.user(f"Close {a}'s account and give its money to {b}.")
    (r,) = rec.call(("get_balance", {"account": a}))
    x = r["balance"] - WIRE_FEE
    rec.call(("transfer", {"from_account": a, "to_account": b, "amount": x}))
    rec.call(("close_account", {"account": a}))
    rec.reply(
        f"Sent {x} from {a} to {b} and closed {a}.",
        [x, "closed"],
        f"Does the reply say {x} went to {b} and {a} is closed?",
    )


def plain(rng, rec):
    x = rng.randint(1, WIRE_LIMIT)
    a, b = _pair(rng, rec, x + WIRE_FEE, 10**9)
    rec.user(f"Send {x} from {a} to {b}.")
    rec.call(("transfer", {"from_account": a, "to_account": b, "amount": x}))
    rec.reply(f"Sent {x} from {a} to {b}.", [x, b], f"Does the reply confirm that {x} went to {b}?")


TASKS = [
    ("split_over_limit", split_over_limit, 2),
    ("send_all", send_all, 2),
    ("close_and_move", close_and_move, 2),
    ("plain", plain, 1),
]
