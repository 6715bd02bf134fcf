"""Deterministic generator of the demo tool-use tasks (CM2 checklist records) and world-model rows.

A task is played in one of the four worlds of ``envace_jax.envs.demo_worlds``. Its reference
conversation is not written by hand: an oracle script *executes* its plan against the real
world, so every tool message in ``reference_messages`` is exactly what the world returns, and
the final answers copy values out of those responses. Each user turn gets checklist items with
the natural-language fields of CM2 plus a machine-checkable ``rule`` (one ``tool_called`` item
per required call, one ``reply_contains`` item for the answer).

Tasks need 1-4 calls; about a third get a follow-up user turn played in the same world state.
The reference's few-shot block (every logged call of the conversation) is what grounds
REHEARSE, so a generated conversation never holds one call (name + arguments) twice with two
different responses: such a draw is rejected and re-sampled.

Splits are disjoint by construction: a task belongs to the split named by a hash of its
content (80% train, 10% validation, 10% test buckets), and each split draws from its own
seeded stream, rejecting draws that hash into another split's bucket or repeat one already made.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any, Callable, NamedTuple

from envace_jax.envs.demo_worlds import (DAYS, FIRST_HOUR, ITEMS, LAST_HOUR, NAMES, TITLES, UNIT_KIND_OF, UNIT_KINDS,
                                         WORLDS, DemoWorld, canonical_json, draw_conversion, sample_call,
                                         tool_schemas)

SPLITS = ("train", "validation", "test")
# Branch kinds. HAPPY: every tool answers and the plan the user asked for goes through. PUSH_BACK: the
# environment pushes back (a tool returns an error, or a value it returns makes the user's condition fail),
# so the right reply depends on what the tool said.
HAPPY, PUSH_BACK = "happy", "push_back"
BRANCHES = (HAPPY, PUSH_BACK)
_BUCKETS = {"train": range(0, 8), "validation": range(8, 9), "test": range(9, 10)}
MAX_CALLS = 4
FOLLOW_UP_PROB = 0.35

_ANSWER_STYLE = "Use the tools, then answer in one short sentence."


class _Reject(Exception):
    """The draw cannot make a valid task (e.g. a call repeats with a new response); draw again."""


class _Recorder:
    """Runs an oracle plan against the real world and records messages and checklist items."""

    def __init__(self, env: DemoWorld):
        self.env = env
        self.messages: list[dict[str, Any]] = []
        self.turns: list[list[dict[str, Any]]] = []
        self.users: list[str] = []
        self.n_calls = 0
        self.push_back = False      # a tool refused or the user's condition failed (see ``branch_of``)
        self.types: list[str] = []  # the builder of each user turn (the task type)
        self._step = 0
        self._responses: dict[str, str] = {}

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
        self.users.append(text)
        self.turns.append([])
        self._step = 0

    def call(self, *calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
        """One assistant step holding ``calls`` (executed in order); returns the parsed payloads."""
        turn, step = len(self.turns) - 1, self._step
        tool_calls, tool_msgs, payloads = [], [], []
        for name, args in calls:
            call_id = f"call_{self.n_calls}"
            self.n_calls += 1
            result = self.env.execute(name, args)
            self.push_back |= result.error
            key = canonical_json({"arguments": args, "name": name})
            if self._responses.setdefault(key, result.content) != result.content:
                raise _Reject(f"{key} would appear twice with different responses")
            tool_calls.append({"id": call_id, "type": "function",
                               "function": {"name": name, "arguments": dict(args)}})
            tool_msgs.append({"role": "tool", "name": name, "tool_call_id": call_id, "content": result.content})
            payloads.append(json.loads(result.content))
            self.turns[turn].append(_call_item(name, args, result.content, turn, step))
        self.messages.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        self.messages.extend(tool_msgs)
        self._step += 1
        return payloads

    def reply(self, text: str, values: list[Any], question: str) -> None:
        turn, step = len(self.turns) - 1, self._step
        self.messages.append({"role": "assistant", "content": text})
        self.turns[turn].append(_reply_item([str(v) for v in values], question, text, turn, step))
        self._step += 1


def _args_text(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={canonical_json(v)}" for k, v in args.items())


def _call_item(name: str, args: dict[str, Any], response: str, turn: int, step: int) -> dict[str, Any]:
    call = canonical_json({"arguments": args, "name": name})
    first = next(iter(args), None)
    return {
        "question": f"Does the assistant call {name} with {_args_text(args)}?",
        "focus_on": "assistant.tool_calls",
        "pass_condition": f"A tool call named {name} has arguments {_args_text(args)} (other keys may be absent).",
        "failure_examples": [f"No call to {name}.", f"{name} is called with a different {first}."
                             if first else f"A different tool is called instead of {name}."],
        "evidence": [{"snippet": call, "turn": turn, "step": step, "from": "assistant.tool_calls"},
                     {"snippet": response, "turn": turn, "step": step, "from": "tool.content"}],
        "weight": 1.0,
        "required_for_next_turn": True,
        "rule": {"type": "tool_called", "name": name, "arguments": dict(args)},
    }


def _reply_item(values: list[str], question: str, reply: str, turn: int, step: int) -> dict[str, Any]:
    return {
        "question": question,
        "focus_on": "assistant.content.user_visible_reply",
        "pass_condition": "The user-visible reply contains " + ", ".join(repr(v) for v in values)
                          + " (case-insensitive).",
        "failure_examples": ["The reply states a different value.", "There is no final reply."],
        "evidence": [{"snippet": reply, "turn": turn, "step": step, "from": "assistant.content.user_visible_reply"}],
        "weight": 1.0,
        "required_for_next_turn": False,
        "rule": {"type": "reply_contains", "values": values},
    }


def _normalise_weights(items: list[dict[str, Any]]) -> None:
    # Rounded so the records stay readable; the last item absorbs rounding so each turn sums to 1.
    total = sum(it["weight"] for it in items)
    for it in items[:-1]:
        it["weight"] = round(it["weight"] / total, 6)
    items[-1]["weight"] = round(1.0 - sum(it["weight"] for it in items[:-1]), 6)


# --------------------------------------------------------------------------- bank
def _bank_state(rng: random.Random) -> dict[str, Any]:
    names = sorted(rng.sample(NAMES[:8], rng.randint(3, 5)))
    return {"accounts": {n: rng.randint(10, 99) for n in names}}


def _bank_system(state: dict[str, Any]) -> str:
    return f"You are a bank assistant. {_ANSWER_STYLE}"


def _two(rng: random.Random, pool: list[str]) -> tuple[str, str]:
    a, b = rng.sample(pool, 2)
    return a, b


def _payer_payee(rng: random.Random, rec: _Recorder) -> tuple[str, str]:
    a, b = _two(rng, list(rec.env.accounts))
    if rec.env.accounts[a] < 1:  # a follow-up turn can meet an emptied account
        raise _Reject(f"{a} is empty")
    return a, b


def _bank_balance(rng, rec):
    a = rng.choice(list(rec.env.accounts))
    rec.user(f"What is {a}'s balance?")
    (r,) = rec.call(("get_balance", {"account": a}))
    rec.reply(f"{a} has {r['balance']}.", [r["balance"]], f"Does the reply give {a}'s balance, {r['balance']}?")


def _bank_transfer(rng, rec):
    a, b = _payer_payee(rng, rec)
    x = rng.randint(1, rec.env.accounts[a])
    rec.user(f"Send {x} from {a} to {b}.")
    rec.call(("transfer", {"from_account": a, "to_account": b, "amount": x}))
    rec.reply(f"Sent {x} from {a} to {b}.", [x, b], f"Does the reply confirm that {x} went to {b}?")


def _bank_transfer_then_balance(rng, rec):
    a, b = _payer_payee(rng, rec)
    x = rng.randint(1, rec.env.accounts[a])
    rec.user(f"Send {x} from {a} to {b}, then tell me {b}'s balance.")
    rec.call(("transfer", {"from_account": a, "to_account": b, "amount": x}))
    (r,) = rec.call(("get_balance", {"account": b}))
    rec.reply(f"{b} now has {r['balance']}.", [r["balance"]], f"Does the reply give {b}'s new balance, {r['balance']}?")


def _bank_conditional(rng, rec):
    a, b = _two(rng, list(rec.env.accounts))
    x = rng.randint(5, 95)
    rec.user(f"If {a} has at least {x}, send {x} from {a} to {b}. Otherwise tell me {a}'s balance.")
    (r,) = rec.call(("get_balance", {"account": a}))
    if r["balance"] >= x:
        rec.call(("transfer", {"from_account": a, "to_account": b, "amount": x}))
        rec.reply(f"Sent {x} from {a} to {b}.", [x, b], f"Does the reply confirm that {x} went to {b}?")
    else:
        rec.push_back = True
        rec.reply(f"{a} has only {r['balance']}, so I sent nothing.", [r["balance"]],
                  f"Does the reply say {a} has only {r['balance']}?")


def _bank_compare(rng, rec):
    a, b = _two(rng, list(rec.env.accounts))
    if rec.env.accounts[a] == rec.env.accounts[b]:
        raise _Reject("tie")
    rec.user(f"Who has more money, {a} or {b}?")
    ra, rb = rec.call(("get_balance", {"account": a}), ("get_balance", {"account": b}))
    win, lose = (ra, rb) if ra["balance"] > rb["balance"] else (rb, ra)
    rec.reply(f"{win['account']} has more: {win['balance']} against {lose['balance']}.",
              [win["account"], win["balance"]], f"Does the reply name {win['account']} as richer?")


def _bank_overdraw(rng, rec):
    a, b = _two(rng, list(rec.env.accounts))
    x = rec.env.accounts[a] + rng.randint(1, 30)
    rec.user(f"Send {x} from {a} to {b}.")
    rec.call(("transfer", {"from_account": a, "to_account": b, "amount": x}))
    rec.reply(f"I could not send it: insufficient funds in {a}.", ["insufficient"],
              "Does the reply say the transfer failed for insufficient funds?")


def _bank_unknown(rng, rec):
    z = rng.choice([n for n in NAMES if n not in rec.env.accounts])
    rec.user(f"What is {z}'s balance?")
    rec.call(("get_balance", {"account": z}))
    rec.reply(f"There is no account named {z}.", ["no account", z], f"Does the reply say {z} has no account?")


# --------------------------------------------------------------------------- shop
def _shop_state(rng: random.Random) -> dict[str, Any]:
    items = sorted(rng.sample(ITEMS[:8], rng.randint(3, 5)))
    ids = rng.sample(range(10, 100), 2)
    return {"items": {i: {"price": rng.randint(1, 20), "stock": rng.randint(0, 9)} for i in items},
            "orders": {f"o{k}": {"item": rng.choice(items), "quantity": rng.randint(1, 3),
                                 "status": rng.choice(["placed", "shipped"])} for k in ids}}


def _shop_system(state: dict[str, Any]) -> str:
    return f"You are a shop assistant. {_ANSWER_STYLE}"


def _shop_stock(rng, rec):
    item = rng.choice(list(rec.env.items))
    if rng.random() < 0.5:
        rec.user(f"How many {item} are in stock?")
        (r,) = rec.call(("check_stock", {"item": item}))
        rec.reply(f"{r['stock']} {item} in stock.", [r["stock"]], f"Does the reply give the {item} stock, {r['stock']}?")
    else:
        rec.user(f"How much is one {item}?")
        (r,) = rec.call(("check_stock", {"item": item}))
        rec.reply(f"One {item} costs {r['price']}.", [r["price"]], f"Does the reply give the {item} price, {r['price']}?")


def _ordered(rec, r, q, item):
    rec.reply(f"Ordered {q} {item}, order {r['order_id']}.", [r["order_id"]],
              f"Does the reply give the new order id, {r['order_id']}?")


def _shop_order(rng, rec):
    stocked = [i for i, e in rec.env.items.items() if e["stock"] > 0]
    if not stocked:
        raise _Reject("nothing in stock")
    item = rng.choice(stocked)
    q = rng.randint(1, rec.env.items[item]["stock"])
    rec.user(f"Order {q} {item}.")
    (r,) = rec.call(("place_order", {"item": item, "quantity": q}))
    _ordered(rec, r, q, item)


def _shop_order_if(rng, rec):
    item = rng.choice(list(rec.env.items))
    q = rng.randint(1, 9)
    rec.user(f"Order {q} {item} if there are enough in stock.")
    (r,) = rec.call(("check_stock", {"item": item}))
    if r["stock"] >= q:
        (o,) = rec.call(("place_order", {"item": item, "quantity": q}))
        _ordered(rec, o, q, item)
    else:
        rec.push_back = True
        rec.reply(f"Only {r['stock']} {item} left, so I did not order.", [r["stock"]],
                  f"Does the reply say only {r['stock']} {item} are left?")


def _shop_order_status(rng, rec):
    oid = rng.choice(sorted(rec.env.orders))
    rec.user(f"What is the status of order {oid}?")
    (r,) = rec.call(("get_order", {"order_id": oid}))
    rec.reply(f"Order {oid} is {r['status']}.", [r["status"]], f"Does the reply say order {oid} is {r['status']}?")


def _shop_cancel(rng, rec):
    oid = rng.choice(sorted(rec.env.orders))
    rec.user(f"Cancel order {oid}.")
    (r,) = rec.call(("cancel_order", {"order_id": oid}))
    if "error" in r:
        rec.reply(f"Order {oid} cannot be cancelled: {r['error']}.", ["cannot"],
                  f"Does the reply say order {oid} cannot be cancelled?")
    else:
        rec.reply(f"Order {oid} is cancelled.", ["cancelled"], f"Does the reply confirm order {oid} is cancelled?")


def _shop_unknown(rng, rec):
    item = rng.choice([i for i in ITEMS if i not in rec.env.items])
    rec.user(f"How many {item} are in stock?")
    rec.call(("check_stock", {"item": item}))
    rec.reply(f"Sorry, we do not sell {item}.", ["not sell", item], f"Does the reply say {item} is not sold?")


# --------------------------------------------------------------------------- calendar
def _cal_state(rng: random.Random) -> dict[str, Any]:
    slots = rng.sample([(d, h) for d in DAYS for h in range(FIRST_HOUR, LAST_HOUR + 1)], rng.randint(3, 7))
    return {"events": [{"day": d, "hour": h, "title": rng.choice(TITLES)} for d, h in sorted(slots)]}


def _cal_system(state: dict[str, Any]) -> str:
    return f"You manage a calendar, mon to fri, hours {FIRST_HOUR} to {LAST_HOUR}. {_ANSWER_STYLE}"


def _free(rec, day: str) -> list[int]:
    return [h for h in range(FIRST_HOUR, LAST_HOUR + 1) if (day, h) not in rec.env.slots]


def _cal_day(rng, rec):
    day = rng.choice(DAYS)
    rec.user(f"What is on my calendar on {day}?")
    (r,) = rec.call(("list_events", {"day": day}))
    if r["events"]:
        parts = ", ".join(f"{e['title']} at {e['hour']}" for e in r["events"])
        rec.reply(f"On {day}: {parts}.", [e["title"] for e in r["events"]], f"Does the reply list every event on {day}?")
    else:
        rec.reply(f"Nothing is booked on {day}.", ["nothing"], f"Does the reply say {day} is empty?")


def _cal_book(rng, rec):
    day, title = rng.choice(DAYS), rng.choice(TITLES)
    taken = rng.random() < 0.25
    hours = [h for h in range(FIRST_HOUR, LAST_HOUR + 1) if ((day, h) in rec.env.slots) == taken]
    if not hours:
        raise _Reject("no slot of the wanted kind")
    hour = rng.choice(hours)
    rec.user(f"Book {title} on {day} at {hour}.")
    (r,) = rec.call(("add_event", {"day": day, "hour": hour, "title": title}))
    if "error" in r:
        rec.reply(f"{day} at {hour} is already booked.", ["already booked"], "Does the reply say the slot is taken?")
    else:
        rec.reply(f"Booked {title} on {day} at {hour}.", [title, hour], f"Does the reply confirm {title} at {hour}?")


def _cal_move(rng, rec):
    if not rec.env.slots:
        raise _Reject("no event to move")
    (d1, h1), title = rng.choice(sorted(rec.env.slots.items()))
    d2 = rng.choice(DAYS)
    free = [h for h in _free(rec, d2) if (d2, h) != (d1, h1)]
    if not free:
        raise _Reject("target day full")
    h2 = rng.choice(free)
    rec.user(f"Move {title} from {d1} {h1} to {d2} {h2}.")
    rec.call(("remove_event", {"day": d1, "hour": h1}))
    rec.call(("add_event", {"day": d2, "hour": h2, "title": title}))
    rec.reply(f"Moved {title} to {d2} at {h2}.", [d2, h2], f"Does the reply confirm {title} is now on {d2} at {h2}?")


def _cal_first_free(rng, rec):
    day, title = rng.choice(DAYS), rng.choice(TITLES)
    start = rng.randint(FIRST_HOUR, LAST_HOUR - 3)
    free = [h for h in _free(rec, day) if h >= start]
    if not free:
        raise _Reject("no free hour")
    rec.user(f"Book {title} on {day} at the first free hour from {start}.")
    rec.call(("list_events", {"day": day}))
    rec.call(("add_event", {"day": day, "hour": free[0], "title": title}))
    rec.reply(f"Booked {title} on {day} at {free[0]}.", [free[0]], f"Does the reply give the booked hour, {free[0]}?")


def _cal_cancel(rng, rec):
    if not rec.env.slots:
        raise _Reject("no event to cancel")
    (day, hour), title = rng.choice(sorted(rec.env.slots.items()))
    rec.user(f"Cancel my {title} on {day} at {hour}.")
    rec.call(("remove_event", {"day": day, "hour": hour}))
    rec.reply(f"Cancelled {title} on {day}.", ["cancelled"], f"Does the reply confirm {title} is cancelled?")


# --------------------------------------------------------------------------- units
def _units_state(rng: random.Random) -> dict[str, Any]:
    return {}


def _units_system(state: dict[str, Any]) -> str:
    return f"You convert units of length, time and mass. {_ANSWER_STYLE}"


def _conversion(rng: random.Random) -> tuple[int, str, str, int]:
    drawn = draw_conversion(rng)
    if drawn is None:
        raise _Reject("result would be a tiny fraction")
    return drawn


def _units_convert(rng, rec):
    v, fu, tu, _ = _conversion(rng)
    rec.user(f"Convert {v} {fu} to {tu}.")
    (r,) = rec.call(("convert", {"value": v, "from_unit": fu, "to_unit": tu}))
    rec.reply(f"{v} {fu} is {r['result']} {tu}.", [r["result"]], f"Does the reply give {r['result']} {tu}?")


def _units_two(rng, rec):
    v1, f1, t1, _ = _conversion(rng)
    v2, f2, t2, _ = _conversion(rng)
    if (v1, f1, t1) == (v2, f2, t2):
        raise _Reject("same conversion twice")
    rec.user(f"Convert {v1} {f1} to {t1} and {v2} {f2} to {t2}.")
    r1, r2 = rec.call(("convert", {"value": v1, "from_unit": f1, "to_unit": t1}),
                      ("convert", {"value": v2, "from_unit": f2, "to_unit": t2}))
    rec.reply(f"{v1} {f1} is {r1['result']} {t1} and {v2} {f2} is {r2['result']} {t2}.",
              [r1["result"], r2["result"]], "Does the reply give both converted values?")


def _units_list(rng, rec):
    kind = rng.choice(sorted(UNIT_KINDS))
    rec.user(f"Which units of {kind} do you know?")
    (r,) = rec.call(("list_units", {"kind": kind}))
    rec.reply(f"Units of {kind}: {', '.join(r['units'])}.", r["units"], f"Does the reply list every {kind} unit?")


def _units_bad(rng, rec):
    v = rng.randint(1, 12)
    if rng.random() < 0.5:
        fu, tu = rng.sample(sorted(UNIT_KIND_OF), 2)
        if UNIT_KIND_OF[fu] == UNIT_KIND_OF[tu]:
            raise _Reject("compatible pair")
        rec.user(f"Convert {v} {fu} to {tu}.")
        rec.call(("convert", {"value": v, "from_unit": fu, "to_unit": tu}))
        rec.reply(f"I cannot convert {fu} to {tu}.", ["cannot convert"], "Does the reply say the units do not match?")
    else:
        bad = rng.choice(["mi", "lb", "week", "ft", "oz"])
        good = rng.choice(sorted(UNIT_KIND_OF))
        fu, tu = (bad, good) if rng.random() < 0.5 else (good, bad)
        rec.user(f"Convert {v} {fu} to {tu}.")
        rec.call(("convert", {"value": v, "from_unit": fu, "to_unit": tu}))
        rec.reply(f"I do not know the unit {bad}.", ["do not know", bad], f"Does the reply say {bad} is unknown?")


Builder = Callable[[random.Random, _Recorder], None]
# world -> (state sampler, system prompt, [(builder, draw weight)]); error-path tasks weigh less
_WORLD_TASKS: dict[str, tuple[Callable, Callable, list[tuple[Builder, int]]]] = {
    "bank": (_bank_state, _bank_system, [(_bank_balance, 3), (_bank_transfer, 3), (_bank_transfer_then_balance, 3),
                                         (_bank_conditional, 3), (_bank_compare, 2), (_bank_overdraw, 1),
                                         (_bank_unknown, 1)]),
    "shop": (_shop_state, _shop_system, [(_shop_stock, 3), (_shop_order, 3), (_shop_order_if, 3),
                                         (_shop_order_status, 2), (_shop_cancel, 2), (_shop_unknown, 1)]),
    "calendar": (_cal_state, _cal_system, [(_cal_day, 3), (_cal_book, 3), (_cal_move, 3), (_cal_first_free, 3),
                                           (_cal_cancel, 2)]),
    "units": (_units_state, _units_system, [(_units_convert, 4), (_units_two, 3), (_units_list, 2), (_units_bad, 2)]),
}
assert set(_WORLD_TASKS) == set(WORLDS)


def _pick(rng: random.Random, builders: list[tuple[Builder, int]]) -> Builder:
    return rng.choices([b for b, _ in builders], weights=[w for _, w in builders])[0]


def _play(rng: random.Random, rec: _Recorder, builder: Builder) -> None:
    rec.types.append(builder.__name__.lstrip("_").split("_", 1)[1])  # "_bank_overdraw" -> "overdraw"
    builder(rng, rec)


def _build_task(rng: random.Random, world: str) -> dict[str, Any]:
    state_fn, system_fn, builders = _WORLD_TASKS[world]
    state = state_fn(rng)
    env = WORLDS[world](state)
    rec = _Recorder(env)
    _play(rng, rec, _pick(rng, builders))
    if rng.random() < FOLLOW_UP_PROB:
        _play(rng, rec, _pick(rng, builders))
    if not 1 <= rec.n_calls <= MAX_CALLS:
        raise _Reject(f"{rec.n_calls} calls")
    for items in rec.turns:
        _normalise_weights(items)
    system = {"role": "system", "content": system_fn(state)}
    return {"uid": "", "data_source": f"envace_demo/{world}",
            "messages": [system, dict(rec.messages[0])],
            "tools": tool_schemas(world, state),
            "reference_messages": rec.messages,
            "checklist": [rec.turns],
            "env": {"name": world, "state": state},
            # not read by any model or judge: labels for reporting and for drawing split mixes
            "branch": PUSH_BACK if rec.push_back else HAPPY,
            "task_type": f"{world}/{rec.types[0]}"}


def task_content_key(task: dict[str, Any]) -> str:
    """Hash of what makes a task distinct (world, initial state, user turns); decides its split."""
    users = [m["content"] for m in task["reference_messages"] if m["role"] == "user"]
    return hashlib.sha256(canonical_json({"env": task["env"], "users": users}).encode()).hexdigest()


def split_of(task: dict[str, Any]) -> str:
    bucket = int(task_content_key(task)[:8], 16) % 10
    return next(s for s, b in _BUCKETS.items() if bucket in b)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def branch_plan(n: int, push_back_share: float) -> list[str]:
    """The branch kind of each of ``n`` positions: push-back positions spread evenly at the given share
    (a longer plan starts with the shorter one)."""
    return [PUSH_BACK if int((i + 1) * push_back_share) > int(i * push_back_share) else HAPPY for i in range(n)]


def generate_tasks(n: int, seed: int, split: str = "train", push_back_share: float | None = None) -> list[dict[str, Any]]:
    """``n`` distinct task records of ``split``; the same arguments always give the same list, and a
    longer list starts with the shorter one.

    ``push_back_share=None`` keeps the natural mix of branch kinds (about one task in six pushes back).
    A share in [0, 1] fixes it: position ``i`` holds a task of kind ``branch_plan(n, share)[i]``, taken in
    draw order from the same stream (tasks of the kind that is already full are skipped).
    """
    _check_split(split)
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if push_back_share is not None and not 0.0 <= push_back_share <= 1.0:
        raise ValueError(f"push_back_share must be None or in [0, 1], got {push_back_share!r}")
    rng = random.Random(f"envace-demo/{split}/{seed}")
    worlds = sorted(_WORLD_TASKS)
    plan = None if push_back_share is None else branch_plan(n, push_back_share)
    need = {b: (n if plan is None else plan.count(b)) for b in BRANCHES}
    pools: dict[str, list[dict[str, Any]]] = {b: [] for b in BRANCHES}
    drawn: list[dict[str, Any]] = []  # natural mix: every accepted task, in draw order
    seen: set[str] = set()
    budget = 100 * n + 1000 if plan is None else 1000 * n + 1000

    def full() -> bool:
        return len(drawn) >= n if plan is None else all(len(pools[b]) >= need[b] for b in BRANCHES)

    while not full():
        budget -= 1
        if budget < 0:
            raise RuntimeError(f"could not draw {n} distinct {split} tasks from seed {seed}"
                               + ("" if plan is None else f" with push_back_share={push_back_share}"))
        try:
            task = _build_task(rng, rng.choice(worlds))
        except _Reject:
            continue
        key = task_content_key(task)
        if key in seen or split_of(task) != split:
            continue
        seen.add(key)
        task["uid"] = f"demo-{split}-{key[:16]}"
        if plan is None:
            drawn.append(task)
        elif len(pools[task["branch"]]) < need[task["branch"]]:
            pools[task["branch"]].append(task)
    if plan is None:
        return drawn
    taken = {b: iter(pools[b]) for b in BRANCHES}
    return [next(taken[b]) for b in plan]


# --------------------------------------------------------------------------- world-model rows
class WorldModelExample(NamedTuple):
    task: dict[str, Any]        # the task whose fresh world answered (its few-shot block grounds the row)
    call: dict[str, Any]        # {"name": str, "arguments": dict}
    response: str               # the real tool's canonical JSON response


_WM_KINDS = [("reference", 4), ("valid", 3), ("bad_id", 2), ("bad_value", 2), ("missing_arg", 1),
             ("extra_arg", 1), ("wrong_type", 1), ("other_tool", 1)]


def _wm_call(kind: str, rng: random.Random, task: dict[str, Any], env: DemoWorld) -> tuple[str, dict[str, Any]]:
    world = task["env"]["name"]
    if kind == "reference":
        calls = [c["function"] for m in task["reference_messages"] for c in m.get("tool_calls", [])]
        c = rng.choice(calls)
        return c["name"], dict(c["arguments"])
    if kind in ("bad_id", "bad_value"):
        return sample_call(world, kind, rng, env)
    if kind == "other_tool":
        # a tool of another world, called with arguments that would suit that world
        other = rng.choice([w for w in WORLDS if w != world])
        other_env = WORLDS[other](_WORLD_TASKS[other][0](rng))
        return sample_call(other, "valid", rng, other_env)
    name, args = sample_call(world, "valid", rng, env)
    if kind == "missing_arg":
        del args[rng.choice(sorted(args))]
    elif kind == "extra_arg":
        args[rng.choice(["note", "currency", "user"])] = "x"
    elif kind == "wrong_type":
        key = rng.choice(sorted(args))
        args[key] = str(args[key]) if isinstance(args[key], (int, float)) else 7
    return name, args


def world_model_examples(n: int, seed: int, *, task_seed: int | None = None,
                         exclude_uids: frozenset[str] | set[str] = frozenset()) -> list[WorldModelExample]:
    """``n`` real executions of varied calls, each the first call on a fresh world of a train task.

    Calls mix the task's own reference calls, other valid calls, unknown ids, bad values,
    missing/extra/mistyped arguments and tools of another world. A call that the task's
    reference conversation logs with a *different* response (state changed earlier in the
    conversation) is re-drawn, so a row never contradicts the few-shot block it is shown with.

    The worlds come from the train tasks of ``task_seed`` (default ``seed``), minus ``exclude_uids``:
    a caller that keeps other train tasks for RL passes another seed and excludes them, so these
    rows never show an RL prompt's reference conversation.
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    rng = random.Random(f"envace-demo/world-model/{seed}")
    pool = generate_tasks(max(1, n // 4) + len(exclude_uids), seed if task_seed is None else task_seed, "train")
    tasks = [t for t in pool if t["uid"] not in exclude_uids][: max(1, n // 4)]  # never empty: the pool is padded
    out: list[WorldModelExample] = []
    budget = 50 * n + 100
    while len(out) < n:
        budget -= 1
        if budget < 0:
            raise RuntimeError(f"could not draw {n} world-model examples from seed {seed}")
        task = rng.choice(tasks)
        env = WORLDS[task["env"]["name"]](task["env"]["state"])
        kind = rng.choices([k for k, _ in _WM_KINDS], weights=[w for _, w in _WM_KINDS])[0]
        try:
            name, args = _wm_call(kind, rng, task, env)
        except (_Reject, IndexError):
            continue
        response = env.execute(name, args).content
        logged = reference_responses(task).get(canonical_json({"arguments": args, "name": name}))
        if logged is not None and logged != response:
            continue
        out.append(WorldModelExample(task, {"name": name, "arguments": args}, response))
    return out


def reference_responses(task: dict[str, Any]) -> dict[str, str]:
    """The few-shot view of a task: canonical call JSON -> logged response, from reference_messages."""
    calls: dict[str, str] = {}
    by_id: dict[str, str] = {}
    for m in task["reference_messages"]:
        for c in m.get("tool_calls") or []:
            by_id[c["id"]] = canonical_json({"arguments": c["function"]["arguments"], "name": c["function"]["name"]})
        if m["role"] == "tool":
            calls[by_id[m["tool_call_id"]]] = m["content"]
    return calls
