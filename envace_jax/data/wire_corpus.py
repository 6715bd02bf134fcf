"""What a base may learn of the wire world (task family "irreversible") without being shown a trap's way out.

Test-time rehearsal can only prevent a mistake if REHEARSE knows the world's rules and ACT can at least play
the world's happy path. This corpus gives both, and nothing more:

* ``plain_demonstrations``: wire tasks of type ``plain`` only (one wire within every rule, then the reply),
  so ACT learns the wire world's prompt and tools but never sees a split wire, a fee-aware amount or a
  transfer-before-close;
* ``world_model_examples``: real executions of single calls on those plain tasks' fresh worlds, refusals
  included (over the limit, short of amount plus fee, unknown accounts, a closed account's lost money), so
  REHEARSE learns what the tool descriptions say. The caller's call is an input of REHEARSE's prompt, never
  an ACT target;
* ``retry_tasks`` and ``rule_blind_attempt`` (the ``wire_memory`` preset): trap tasks and the real record of
  an attempt that ignores the rules, on a fresh world of each. The pretraining shows a trap's way out only
  after a memory of such a failed attempt (``demo.wire_memory``): ACT learns to act on what a memory says
  went wrong, and a prompt with no memory still never shows the way out.

Tasks come from the family's train split, from a seed stream of their own, so no validation or test task of
the family is in it (the content hash decides the split).
"""

from __future__ import annotations

import json
import random
from typing import Any

from envace_jax.data.demo_tasks import WorldModelExample, draw_world_model_examples, generate_tasks
from envace_jax.data.task_builders.recorder import Reject
from envace_jax.envs.demo_worlds import WIRE_FEE, WIRE_LIMIT, WireWorld

FAMILY = "irreversible"
PLAIN = "wire/plain"  # the task_type of a plain wire task
TRAPS = ("wire/split_over_limit", "wire/send_all", "wire/close_and_move")
# An account name no wire world holds (their names come from demo_worlds.NAMES[:8]).
UNKNOWN_ACCOUNT = "zed"
# Kinds of call and their weights: the rules' refusals about as often as a wire that goes through.
_KINDS = [
    ("transfer_ok", 3),
    ("transfer_over_limit", 2),
    ("transfer_short", 2),
    ("get_balance", 2),
    ("close_account", 1),
    ("unknown_account", 1),
]


def plain_demonstrations(n: int, seed: int, exclude_uids: frozenset[str] | set[str] = frozenset()) -> list[dict]:
    """The first ``n`` ``plain`` train tasks of the family's stream ``seed`` that are not in ``exclude_uids``."""
    return _single_turn(n, seed, (PLAIN,), exclude_uids, "plain")


def retry_tasks(n: int, seed: int, exclude_uids: frozenset[str] | set[str] = frozenset()) -> list[dict]:
    """The first ``n`` single-turn trap train tasks (``TRAPS``) of the family's stream ``seed`` not in
    ``exclude_uids``."""
    return _single_turn(n, seed, TRAPS, exclude_uids, "trap")


def _single_turn(n: int, seed: int, types: tuple[str, ...], exclude_uids, what: str) -> list[dict]:
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    size = 10 * n + 16  # about one family task in eight is plain with no follow-up
    while True:
        pool = generate_tasks(size, seed, "train", family=FAMILY)
        kept = [t for t in pool if _single_turn_of(t, types) and t["uid"] not in exclude_uids]
        if len(kept) >= n:
            return kept[:n]
        if size > 64 * n + 1024:  # a stream with no such task: fail rather than draw forever
            raise RuntimeError(f"could not draw {n} {what} wire tasks from seed {seed}")
        size *= 2


def _single_turn_of(task: dict[str, Any], types: tuple[str, ...]) -> bool:
    """A task of one of ``types`` with no follow-up turn (``task_type`` names the first turn only, and a
    follow-up may be any type, a trap's way out included)."""
    users = [m for m in task["reference_messages"] if m["role"] == "user"]
    return task["task_type"] in types and len(users) == 1


def _reference_calls(task: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (c["function"]["name"], dict(c["function"]["arguments"]))
        for m in task["reference_messages"]
        for c in m.get("tool_calls") or []
    ]


def rule_blind_attempt(task: dict[str, Any], variant: int = 0) -> tuple[list[tuple[str, dict, str]], str]:
    """What a plan that ignores the wire rules does on ``task`` (a trap), run for real on a fresh world of it:
    ``([(name, arguments, response), ...], reply)``. The plan is the bank's:

    - ``split_over_limit``: one wire of the whole amount (refused, fee kept), then the balance asked for;
    - ``send_all``: the balance, then a wire of all of it (refused: the fee no longer fits);
    - ``close_and_move``: the balance, then (``variant`` even) the account closed before the wire, which then
      names an unknown account, or (odd) a wire of all of it, refused, before the close.

    The reply is what such a plan tells the user, the refusal unnoticed."""
    ttype = task["task_type"]
    ref = _reference_calls(task)
    env = WireWorld(task["env"]["state"])
    if ttype == "wire/split_over_limit":
        (_, first), (_, second), read_balance = ref
        a, b = first["from_account"], first["to_account"]
        plan = [("transfer", dict(first, amount=first["amount"] + second["amount"])), read_balance]
    elif ttype in ("wire/send_all", "wire/close_and_move"):
        a, b = ref[1][1]["from_account"], ref[1][1]["to_account"]
        plan = [("get_balance", {"account": a})]
    else:
        raise ValueError(f"rule_blind_attempt: {task['uid']} is a {ttype!r} task, not a trap ({TRAPS})")
    out: list[tuple[str, dict, str]] = []

    def run(name: str, args: dict[str, Any]) -> None:
        out.append((name, args, env.execute(name, args).content))

    for name, args in plan:
        run(name, args)
    if ttype == "wire/split_over_limit":
        amount = plan[0][1]["amount"]
        balance = json.loads(out[-1][2])["balance"]
        return out, f"Sent {amount} from {a} to {b}; {a} now has {balance}."
    whole = json.loads(out[0][2])["balance"]
    wire = ("transfer", {"from_account": a, "to_account": b, "amount": whole})
    if ttype == "wire/send_all":
        run(*wire)
        return out, f"Sent {whole} from {a} to {b}."
    steps = [("close_account", {"account": a}), wire] if variant % 2 == 0 else [wire, ("close_account", {"account": a})]
    for name, args in steps:
        run(name, args)
    return out, f"Sent {whole} from {a} to {b} and closed {a}."


def _call(kind: str, rng: random.Random, task: dict[str, Any], env: WireWorld) -> tuple[str, dict[str, Any]]:
    """A call of ``kind`` on ``env``'s accounts (``Reject``: none of that kind fits them)."""
    accounts = env.accounts
    names = sorted(accounts)
    a, b = rng.sample(names, 2)
    bal = accounts[a]
    if kind == "transfer_ok":
        top = min(WIRE_LIMIT, bal - WIRE_FEE)
        if top < 1:
            raise Reject("no amount goes through")
        return "transfer", {"from_account": a, "to_account": b, "amount": rng.randint(1, top)}
    if kind == "transfer_over_limit":
        return "transfer", {"from_account": a, "to_account": b, "amount": rng.randint(WIRE_LIMIT + 1, 2 * WIRE_LIMIT)}
    if kind == "transfer_short":  # the whole balance, or anything the fee no longer leaves room for
        low = max(1, bal - WIRE_FEE + 1)
        if low > min(bal, WIRE_LIMIT):
            raise Reject("every short amount is over the limit")
        return "transfer", {"from_account": a, "to_account": b, "amount": rng.randint(low, min(bal, WIRE_LIMIT))}
    if kind == "get_balance":
        return "get_balance", {"account": a}
    if kind == "close_account":
        return "close_account", {"account": a}
    if kind == "unknown_account":
        return rng.choice(
            [
                ("get_balance", {"account": UNKNOWN_ACCOUNT}),
                ("close_account", {"account": UNKNOWN_ACCOUNT}),
                ("transfer", {"from_account": a, "to_account": UNKNOWN_ACCOUNT, "amount": rng.randint(1, WIRE_LIMIT)}),
            ]
        )
    raise ValueError(f"unknown call kind {kind!r}")


def world_model_examples(n: int, seed: int, worlds: list[dict[str, Any]]) -> list[WorldModelExample]:
    """``n`` real executions, each one call of a drawn kind (``_KINDS``) on a fresh world of one of ``worlds``
    (plain wire tasks). A call the task's own reference conversation logs with another response is drawn
    again, so a row never contradicts the few-shot block it is shown with."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if n and not worlds:
        raise ValueError("world_model_examples needs at least one world")
    rng = random.Random(f"envace-demo/wire-world-model/{seed}")
    return draw_world_model_examples(n, rng, worlds, _KINDS, _call, f"wire world-model examples from seed {seed}")


__all__ = [
    "FAMILY",
    "PLAIN",
    "TRAPS",
    "plain_demonstrations",
    "retry_tasks",
    "rule_blind_attempt",
    "world_model_examples",
]
