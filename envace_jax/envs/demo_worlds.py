"""Four small executable tool worlds for the CPU demo (bank, shop, calendar, units), and an opt-in fifth
(wire: rules in the tool descriptions, irreversible mistakes; ``WireWorld``).

Each world is a real ``ToolEnvironment``: it keeps state, validates every call against its
own OpenAI schema and answers with a compact canonical JSON string (``canonical_json``:
sorted keys, no spaces). Bad calls are answered, not raised: ``{"error":"..."}`` with
``ToolResult.error=True``.

Why the worlds look like this (the rehearsal-fidelity argument). The demo trains a
2-5M parameter Qwen3 to play the environment (REHEARSE) as well as the agent (ACT). A probe
on this machine (``reference/demo_feasibility.md``) found that rehearsal RL fails when the
tiny model must *compute* a response (a balance after transfers: 1-3% exact), and works as
a learning signal only when rehearsed responses are right. So every response here is one
of the kinds a small model can predict from what its prompt shows:

- an **echo** of the call's own arguments (``{"amount":5,"from":"ana","status":"ok","to":"ben"}``);
- a **constant** payload (``"status":"added"``, the first new order id is always ``"n1"``);
- a **lookup** of a value that the reference conversation's logged calls (the simulator's
  few-shot block) already show for the same call; the task generator guarantees that one
  call never appears twice in a reference with two different responses;
- a **deterministic error** whose text is built only from the call itself
  (``{"error":"unknown account 'zed'"}``, ``{"error":"missing argument 'day'"}``); the valid ids of
  a task (accounts, items, orders, never their values) are named in its tool descriptions, which
  both roles see, so an unknown id is visible as such.

State-changing tools therefore return echoes, never recomputed totals; computed numbers
(a converted value) only ever reach the agent through a logged call it can copy from.
"""

from __future__ import annotations

import copy
import json
import random
from fractions import Fraction
from typing import Any, Callable, Mapping

from envace_jax.envs.base import ToolEnvironment, ToolResult


def canonical_json(obj: Any) -> str:
    """The one serialisation of tool payloads used everywhere in the demo suite."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class ToolError(Exception):
    """Raised inside a tool body; becomes an ``{"error": message}`` response."""


# (description, {param: (json type, description or "", enum or None)}, required params)
_ToolSpec = tuple[str, dict[str, tuple[str, str, list | None]], list[str]]

_TYPE_WORDS = {"string": "a string", "integer": "an integer", "number": "a number"}


def _type_ok(kind: str, value: Any) -> bool:
    if isinstance(value, bool):  # bool is an int subclass; a tool never wants one
        return False
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int)
    if kind == "number":
        return isinstance(value, (int, float))
    raise ValueError(f"unsupported parameter type {kind!r}")


class DemoWorld(ToolEnvironment):
    """Schema-driven validation and dispatch shared by the demo worlds.

    Subclasses set ``NAME``, ``TOOLS`` and implement ``_load(state)`` plus one ``_tool_<name>``
    method per tool that returns a dict or raises ``ToolError``.
    """

    NAME: str = ""
    TOOLS: dict[str, _ToolSpec] = {}

    def __init__(self, state: Mapping[str, Any] | None = None):
        self._initial: dict[str, Any] = {}
        if state is not None:
            self.reset({"env": {"name": self.NAME, "state": state}})

    def reset(self, task: Mapping[str, Any]) -> None:
        env = task.get("env") if isinstance(task, Mapping) else None
        if not isinstance(env, Mapping) or env.get("name") != self.NAME:
            raise ValueError(f"task['env'] must be {{'name': {self.NAME!r}, 'state': ...}}, got {env!r}")
        if not isinstance(env.get("state"), Mapping):
            raise ValueError(f"task['env']['state'] must be a dict for world {self.NAME!r}")
        self._initial = copy.deepcopy(dict(env["state"]))
        self._load(copy.deepcopy(self._initial))

    def _load(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return tool_schemas(self.NAME, self._initial)

    @classmethod
    def catalog(cls, state: Mapping[str, Any]) -> dict[str, str]:
        """Extra description text per tool naming the valid ids of ``state`` (keys, never values)."""
        return {}

    def execute(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        try:
            payload = self._dispatch(name, arguments)
        except ToolError as e:
            return ToolResult(canonical_json({"error": str(e)}), error=True)
        return ToolResult(canonical_json(payload), error=False)

    def _dispatch(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        if name not in self.TOOLS:
            raise ToolError(f"unknown tool '{name}'")
        if not isinstance(arguments, Mapping):
            raise ToolError("arguments must be an object")
        _, params, required = self.TOOLS[name]
        for key in sorted(arguments):
            if key not in params:
                raise ToolError(f"unexpected argument '{key}'")
        for key in required:
            if key not in arguments:
                raise ToolError(f"missing argument '{key}'")
        for key, (kind, _, enum) in params.items():
            if key not in arguments:
                continue
            value = arguments[key]
            if not _type_ok(kind, value):
                raise ToolError(f"argument '{key}' must be {_TYPE_WORDS[kind]}")
            if enum is not None and value not in enum:
                raise ToolError(f"invalid {key} '{value}'")
        body: Callable[..., dict[str, Any]] = getattr(self, f"_tool_{name}")
        return body(**dict(arguments))


def _schema(name: str, spec: _ToolSpec, extra: str = "") -> dict[str, Any]:
    description, params, required = spec
    if extra:
        description = f"{description} {extra}"
    props: dict[str, Any] = {}
    for key, (kind, desc, enum) in params.items():
        props[key] = {"type": kind}
        if desc:  # names like "account" explain themselves; every schema token costs prompt length
            props[key]["description"] = desc
        if enum is not None:
            props[key]["enum"] = list(enum)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(required)},
        },
    }


# --------------------------------------------------------------------------- bank
class BankWorld(DemoWorld):
    """Accounts with integer balances. State: ``{"accounts": {name: balance}}``."""

    NAME = "bank"
    TOOLS = {
        "get_balance": ("Get an account's balance.", {"account": ("string", "", None)}, ["account"]),
        "transfer": (
            "Move money between accounts.",
            {
                "from_account": ("string", "", None),
                "to_account": ("string", "", None),
                "amount": ("integer", "Positive amount.", None),
            },
            ["from_account", "to_account", "amount"],
        ),
    }

    @classmethod
    def catalog(cls, state: Mapping[str, Any]) -> dict[str, str]:
        return {"get_balance": "Accounts: " + ", ".join(state["accounts"]) + "."}

    def _load(self, state: dict[str, Any]) -> None:
        self.accounts: dict[str, int] = dict(state["accounts"])

    def _account(self, name: str) -> str:
        if name not in self.accounts:
            raise ToolError(f"unknown account '{name}'")
        return name

    def _tool_get_balance(self, account: str) -> dict[str, Any]:
        return {"account": account, "balance": self.accounts[self._account(account)]}

    def _tool_transfer(self, from_account: str, to_account: str, amount: int) -> dict[str, Any]:
        self._account(from_account)
        self._account(to_account)
        if from_account == to_account:
            raise ToolError("cannot transfer to the same account")
        if amount <= 0:
            raise ToolError("amount must be positive")
        if self.accounts[from_account] < amount:
            raise ToolError(f"insufficient funds in '{from_account}'")
        self.accounts[from_account] -= amount
        self.accounts[to_account] += amount
        return {"amount": amount, "from": from_account, "status": "ok", "to": to_account}


# --------------------------------------------------------------------------- shop
class ShopWorld(DemoWorld):
    """Inventory plus orders.

    State: ``{"items": {item: {"price": int, "stock": int}},
    "orders": {order_id: {"item", "quantity", "status"}}}``. New orders get ids n1, n2, ...
    in the order they are placed, so the first one is always predictable.
    """

    NAME = "shop"
    TOOLS = {
        "check_stock": ("Get an item's price and stock.", {"item": ("string", "", None)}, ["item"]),
        "place_order": (
            "Order an item.",
            {"item": ("string", "", None), "quantity": ("integer", "", None)},
            ["item", "quantity"],
        ),
        "get_order": ("Get an order's status.", {"order_id": ("string", "", None)}, ["order_id"]),
        "cancel_order": ("Cancel an order that has not shipped.", {"order_id": ("string", "", None)}, ["order_id"]),
    }

    @classmethod
    def catalog(cls, state: Mapping[str, Any]) -> dict[str, str]:
        out = {"check_stock": "Items: " + ", ".join(state["items"]) + "."}
        if state.get("orders"):
            out["get_order"] = "Orders: " + ", ".join(sorted(state["orders"])) + "."
        return out

    def _load(self, state: dict[str, Any]) -> None:
        self.items: dict[str, dict[str, int]] = {k: dict(v) for k, v in state["items"].items()}
        self.orders: dict[str, dict[str, Any]] = {k: dict(v) for k, v in state.get("orders", {}).items()}
        self._placed = 0

    def _item(self, item: str) -> dict[str, int]:
        if item not in self.items:
            raise ToolError(f"unknown item '{item}'")
        return self.items[item]

    def _order(self, order_id: str) -> dict[str, Any]:
        if order_id not in self.orders:
            raise ToolError(f"unknown order '{order_id}'")
        return self.orders[order_id]

    def _tool_check_stock(self, item: str) -> dict[str, Any]:
        entry = self._item(item)
        return {"item": item, "price": entry["price"], "stock": entry["stock"]}

    def _tool_place_order(self, item: str, quantity: int) -> dict[str, Any]:
        entry = self._item(item)
        if quantity <= 0:
            raise ToolError("quantity must be positive")
        if entry["stock"] < quantity:
            raise ToolError(f"not enough '{item}' in stock")
        entry["stock"] -= quantity
        self._placed += 1
        order_id = f"n{self._placed}"
        self.orders[order_id] = {"item": item, "quantity": quantity, "status": "placed"}
        return {"item": item, "order_id": order_id, "quantity": quantity, "status": "placed"}

    def _tool_get_order(self, order_id: str) -> dict[str, Any]:
        order = self._order(order_id)
        return {"item": order["item"], "order_id": order_id, "quantity": order["quantity"], "status": order["status"]}

    def _tool_cancel_order(self, order_id: str) -> dict[str, Any]:
        order = self._order(order_id)
        if order["status"] == "shipped":
            raise ToolError(f"order '{order_id}' has already shipped")
        if order["status"] == "cancelled":
            raise ToolError(f"order '{order_id}' is already cancelled")
        order["status"] = "cancelled"
        self._item(order["item"])["stock"] += order["quantity"]
        return {"order_id": order_id, "status": "cancelled"}


# --------------------------------------------------------------------------- calendar
DAYS = ["mon", "tue", "wed", "thu", "fri"]
FIRST_HOUR, LAST_HOUR = 9, 17


class CalendarWorld(DemoWorld):
    """One work week of hour slots. State: ``{"events": [{"day", "hour", "title"}]}``."""

    NAME = "calendar"
    TOOLS = {
        "list_events": ("List a day's events.", {"day": ("string", "mon to fri.", None)}, ["day"]),
        "add_event": (
            "Book an hour slot.",
            {"day": ("string", "", None), "hour": ("integer", "Hour, 9 to 17.", None), "title": ("string", "", None)},
            ["day", "hour", "title"],
        ),
        "remove_event": (
            "Free an hour slot.",
            {"day": ("string", "", None), "hour": ("integer", "Hour, 9 to 17.", None)},
            ["day", "hour"],
        ),
    }

    def _load(self, state: dict[str, Any]) -> None:
        self.slots: dict[tuple[str, int], str] = {}
        for ev in state["events"]:
            self.slots[(ev["day"], int(ev["hour"]))] = ev["title"]

    @staticmethod
    def _check_day(day: str) -> None:
        # checked here, not as a schema enum: the enum would repeat the week in three schemas
        if day not in DAYS:
            raise ToolError(f"unknown day '{day}'")

    @staticmethod
    def _check_hour(hour: int) -> None:
        if not FIRST_HOUR <= hour <= LAST_HOUR:
            raise ToolError(f"hour must be between {FIRST_HOUR} and {LAST_HOUR}")

    def _tool_list_events(self, day: str) -> dict[str, Any]:
        self._check_day(day)
        events = [{"hour": h, "title": t} for (d, h), t in sorted(self.slots.items()) if d == day]
        return {"day": day, "events": events}

    def _tool_add_event(self, day: str, hour: int, title: str) -> dict[str, Any]:
        self._check_day(day)
        self._check_hour(hour)
        if not title:
            raise ToolError("title must not be empty")
        if (day, hour) in self.slots:
            raise ToolError(f"{day} {hour} is already booked")
        self.slots[(day, hour)] = title
        return {"day": day, "hour": hour, "status": "added", "title": title}

    def _tool_remove_event(self, day: str, hour: int) -> dict[str, Any]:
        self._check_day(day)
        self._check_hour(hour)
        if (day, hour) not in self.slots:
            raise ToolError(f"no event on {day} at {hour}")
        title = self.slots.pop((day, hour))
        return {"day": day, "hour": hour, "status": "removed", "title": title}


# --------------------------------------------------------------------------- units
UNIT_KINDS: dict[str, dict[str, int]] = {
    # factor = size of the unit in the kind's smallest unit, so conversions are exact fractions
    "length": {"km": 1_000_000, "m": 1000, "cm": 10, "mm": 1},
    "time": {"d": 86400, "h": 3600, "min": 60, "s": 1},
    "mass": {"kg": 1000, "g": 1},
}
UNIT_KIND_OF = {u: k for k, units in UNIT_KINDS.items() for u in units}


def convert_value(value: int | float, from_unit: str, to_unit: str) -> int | float:
    """Exact conversion; whole results stay integers, others round to 4 decimals."""
    kind = UNIT_KIND_OF[from_unit]
    exact = Fraction(value) * UNIT_KINDS[kind][from_unit] / UNIT_KINDS[kind][to_unit]
    return int(exact) if exact.denominator == 1 else round(float(exact), 4)


class UnitsWorld(DemoWorld):
    """A stateless converter over a fixed unit table (``UNIT_KINDS``); state is ``{}``."""

    NAME = "units"
    TOOLS = {
        "convert": (
            "Convert a value between units of one kind.",
            {"value": ("number", "", None), "from_unit": ("string", "", None), "to_unit": ("string", "", None)},
            ["value", "from_unit", "to_unit"],
        ),
        "list_units": ("List the units of a kind.", {"kind": ("string", "", sorted(UNIT_KINDS))}, ["kind"]),
    }

    def _load(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"units world takes an empty state, got {state!r}")

    def _tool_convert(self, value: int | float, from_unit: str, to_unit: str) -> dict[str, Any]:
        for unit in (from_unit, to_unit):
            if unit not in UNIT_KIND_OF:
                raise ToolError(f"unknown unit '{unit}'")
        if UNIT_KIND_OF[from_unit] != UNIT_KIND_OF[to_unit]:
            raise ToolError(f"cannot convert {from_unit} to {to_unit}")
        return {
            "from_unit": from_unit,
            "result": convert_value(value, from_unit, to_unit),
            "to_unit": to_unit,
            "value": value,
        }

    def _tool_list_units(self, kind: str) -> dict[str, Any]:
        return {"kind": kind, "units": sorted(UNIT_KINDS[kind])}


# --------------------------------------------------------------------------- wire (opt-in: irreversible calls)
WIRE_FEE, WIRE_LIMIT = 2, 40


class WireWorld(BankWorld):
    """A bank whose rules are written in its tool descriptions and whose mistakes cannot be undone.

    State: ``{"accounts": {name: balance}}``. Every wire attempt that names two distinct known accounts
    and a positive amount costs the sender ``WIRE_FEE``, kept even when the wire is then refused (over
    ``WIRE_LIMIT``, or funds short of amount plus fee); ``close_account`` deletes the account with its
    money. Nothing is ever refunded, so a wrong call leaves a trace the task's checklist sees (a balance
    lower than the oracle's, a right call that can no longer go through). Each rule is stated in the
    description both roles read, so an imagined episode can foresee it. The tools carry the bank world's
    names (``get_balance``, ``transfer``), so a policy that plays the bank plays here the plan that breaks
    the rules, until something (a rehearsal) tells it otherwise. Not in ``WORLDS``: the default
    demo never draws it (``RULE_WORLDS``; ``data.demo_tasks`` family "irreversible").
    """

    NAME = "wire"
    TOOLS = {
        "get_balance": ("Get an account's balance.", {"account": ("string", "", None)}, ["account"]),
        "transfer": (
            f"Send money. Irreversible: never refunded. Each attempt costs the sender a fee of {WIRE_FEE}, "
            f"kept even if the wire is refused. Refused if amount is over {WIRE_LIMIT} ('over the limit') "
            "or the sender cannot pay amount plus fee ('insufficient funds').",
            {
                "from_account": ("string", "", None),
                "to_account": ("string", "", None),
                "amount": ("integer", "Positive amount.", None),
            },
            ["from_account", "to_account", "amount"],
        ),
        "close_account": (
            "Close an account. Irreversible: the account and any money left in it are deleted.",
            {"account": ("string", "", None)},
            ["account"],
        ),
    }

    # the bank's state, catalog, account lookup and get_balance, inherited; only the rules differ

    def _tool_transfer(self, from_account: str, to_account: str, amount: int) -> dict[str, Any]:
        # malformed requests are refused before anything is charged; a well-formed attempt pays the fee
        self._account(from_account)
        self._account(to_account)
        if from_account == to_account:
            raise ToolError("cannot wire to the same account")
        if amount <= 0:
            raise ToolError("amount must be positive")
        if self.accounts[from_account] < WIRE_FEE:
            raise ToolError(f"'{from_account}' cannot pay the fee of {WIRE_FEE}")
        self.accounts[from_account] -= WIRE_FEE
        if amount > WIRE_LIMIT:
            raise ToolError(f"over the limit of {WIRE_LIMIT}; fee of {WIRE_FEE} charged")
        if self.accounts[from_account] < amount:
            raise ToolError(f"insufficient funds in '{from_account}'; fee of {WIRE_FEE} charged")
        self.accounts[from_account] -= amount
        self.accounts[to_account] += amount
        return {"amount": amount, "fee": WIRE_FEE, "from": from_account, "status": "ok", "to": to_account}

    def _tool_close_account(self, account: str) -> dict[str, Any]:
        lost = self.accounts.pop(self._account(account))
        return {"account": account, "lost": lost, "status": "closed"}


WORLDS: dict[str, type[DemoWorld]] = {w.NAME: w for w in (BankWorld, ShopWorld, CalendarWorld, UnitsWorld)}
# Worlds only an opt-in task family draws; kept out of WORLDS so that every draw over WORLDS (the default
# tasks, the world-model rows' "other world" calls) stays what it was.
RULE_WORLDS: dict[str, type[DemoWorld]] = {WireWorld.NAME: WireWorld}
ALL_WORLDS: dict[str, type[DemoWorld]] = {**WORLDS, **RULE_WORLDS}


def tool_schemas(world: str, state: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """OpenAI function schemas of a world's tools, in a fixed order.

    With ``state``, descriptions also name the state's valid ids (accounts, items, orders) so that
    both roles can tell an unknown id from a known one: the REHEARSE prompt shows the schemas but
    not the system prompt, and "unknown account 'eli'" is only predictable if 'eli' is visibly absent.
    """
    if world not in ALL_WORLDS:
        raise ValueError(f"unknown demo world {world!r}; expected one of {sorted(ALL_WORLDS)}")
    extra = ALL_WORLDS[world].catalog(state) if state else {}
    return [_schema(name, spec, extra.get(name, "")) for name, spec in ALL_WORLDS[world].TOOLS.items()]


def make_env(task: Mapping[str, Any]) -> DemoWorld:
    """Builds and resets the world named by ``task["env"]["name"]``."""
    env = task.get("env") if isinstance(task, Mapping) else None
    name = env.get("name") if isinstance(env, Mapping) else None
    if name not in ALL_WORLDS:
        raise ValueError(
            f"task {task.get('uid', '?') if isinstance(task, Mapping) else task!r}: "
            f"env name {name!r} is not a demo world; expected one of {sorted(ALL_WORLDS)}"
        )
    world = ALL_WORLDS[name]()
    world.reset(task)
    return world


# --------------------------------------------------------------------------- vocabularies and call samplers
# Task states draw ids from the first 8 entries; the last 2 never exist in any state, so calls that
# use them are always unknown-id errors.
NAMES = ["ana", "ben", "cal", "dia", "eli", "fay", "gus", "hal", "ivy", "jon"]
ITEMS = ["pen", "cup", "hat", "mug", "book", "lamp", "sock", "tea", "map", "bag"]
TITLES = ["gym", "lunch", "dentist", "call", "review", "yoga", "standup", "piano"]


def draw_conversion(rng: random.Random) -> tuple[int, str, str, int | float] | None:
    """A same-kind (value, from, to, result) with a whole, readable result; None if the draw has none."""
    kind = rng.choice(sorted(UNIT_KINDS))
    fu, tu = rng.sample(sorted(UNIT_KINDS[kind]), 2)
    f = UNIT_KINDS[kind]
    if f[fu] > f[tu]:
        v = rng.randint(1, 12)
    else:
        ratio = f[tu] // f[fu]
        if ratio > 10_000:
            return None
        v = ratio * rng.randint(1, 9)
    return v, fu, tu, convert_value(v, fu, tu)


def sample_call(world: str, kind: str, rng: random.Random, env: Any) -> tuple[str, dict[str, Any]]:
    """A (tool name, arguments) call on ``env``: ``kind`` is "valid" (well-formed, may still fail on
    state), "bad_id" (an id the state lacks) or "bad_value" (a value the tool rejects)."""
    samplers = {"valid": _valid_call, "bad_id": _bad_id_call, "bad_value": _bad_value_call}
    if kind not in samplers:
        raise ValueError(f"call kind must be one of {sorted(samplers)}, got {kind!r}")
    return samplers[kind](world, rng, env)


def _valid_call(world: str, rng: random.Random, env: Any) -> tuple[str, dict[str, Any]]:
    if world == "bank":
        names = list(env.accounts)
        if rng.random() < 0.5:
            return "get_balance", {"account": rng.choice(names)}
        a, b = rng.sample(names, 2)
        return "transfer", {"from_account": a, "to_account": b, "amount": rng.randint(1, env.accounts[a])}
    if world == "shop":
        item, oid = rng.choice(list(env.items)), rng.choice(sorted(env.orders))
        return rng.choice(
            [
                ("check_stock", {"item": item}),
                ("place_order", {"item": item, "quantity": rng.randint(1, 3)}),
                ("get_order", {"order_id": oid}),
                ("cancel_order", {"order_id": oid}),
            ]
        )
    if world == "calendar":
        day = rng.choice(DAYS)
        hour = rng.randint(FIRST_HOUR, LAST_HOUR)
        return rng.choice(
            [
                ("list_events", {"day": day}),
                ("add_event", {"day": day, "hour": hour, "title": rng.choice(TITLES)}),
                ("remove_event", {"day": day, "hour": hour}),
            ]
        )
    drawn = draw_conversion(rng)
    if drawn is None:
        return "list_units", {"kind": rng.choice(sorted(UNIT_KINDS))}
    v, fu, tu, _ = drawn
    return "convert", {"value": v, "from_unit": fu, "to_unit": tu}


def _bad_id_call(world: str, rng: random.Random, env: Any) -> tuple[str, dict[str, Any]]:
    if world == "bank":
        z = rng.choice([n for n in NAMES if n not in env.accounts])
        a = rng.choice(list(env.accounts))
        return rng.choice(
            [
                ("get_balance", {"account": z}),
                ("transfer", {"from_account": z, "to_account": a, "amount": 5}),
                ("transfer", {"from_account": a, "to_account": z, "amount": 5}),
            ]
        )
    if world == "shop":
        item = rng.choice([i for i in ITEMS if i not in env.items])
        oid = f"o{rng.randint(100, 999)}"
        return rng.choice(
            [
                ("check_stock", {"item": item}),
                ("place_order", {"item": item, "quantity": 1}),
                ("get_order", {"order_id": oid}),
                ("cancel_order", {"order_id": oid}),
            ]
        )
    if world == "calendar":
        return rng.choice(
            [
                ("list_events", {"day": rng.choice(["sat", "sun", "monday", "today"])}),
                ("remove_event", {"day": rng.choice(DAYS), "hour": rng.randint(FIRST_HOUR, LAST_HOUR)}),
            ]
        )
    bad = rng.choice(["mi", "lb", "week", "ft", "oz"])
    return rng.choice(
        [
            ("convert", {"value": 3, "from_unit": bad, "to_unit": rng.choice(sorted(UNIT_KIND_OF))}),
            ("list_units", {"kind": rng.choice(["volume", "speed", "money"])}),
        ]
    )


def _bad_value_call(world: str, rng: random.Random, env: Any) -> tuple[str, dict[str, Any]]:
    if world == "bank":
        a, b = rng.sample(list(env.accounts), 2)
        return rng.choice(
            [
                ("transfer", {"from_account": a, "to_account": b, "amount": rng.choice([0, -5])}),
                ("transfer", {"from_account": a, "to_account": a, "amount": 5}),
                ("transfer", {"from_account": a, "to_account": b, "amount": env.accounts[a] + 10}),
            ]
        )
    if world == "shop":
        item = rng.choice(list(env.items))
        return "place_order", {"item": item, "quantity": rng.choice([0, env.items[item]["stock"] + 1])}
    if world == "calendar":
        day = rng.choice(DAYS)
        hour = rng.choice([0, 8, 18, 20])
        return rng.choice(
            [
                ("add_event", {"day": day, "hour": hour, "title": rng.choice(TITLES)}),
                ("remove_event", {"day": day, "hour": hour}),
            ]
        )
    fu, tu = rng.choice([(a, b) for a in UNIT_KIND_OF for b in UNIT_KIND_OF if UNIT_KIND_OF[a] != UNIT_KIND_OF[b]])
    return "convert", {"value": rng.randint(1, 9), "from_unit": fu, "to_unit": tu}
