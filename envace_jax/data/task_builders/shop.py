"""Shop tasks: stock and prices, orders (some conditional on stock), order status and cancelling.

Each builder plays one user turn against the real world through a ``Recorder``; ``TASKS`` lists
(task type, builder, draw weight), error-path types weighing less.
"""

from __future__ import annotations

import random
from typing import Any

from envace_jax.data.task_builders.recorder import ANSWER_STYLE, Reject
from envace_jax.envs.demo_worlds import ITEMS


def state(rng: random.Random) -> dict[str, Any]:
    items = sorted(rng.sample(ITEMS[:8], rng.randint(3, 5)))
    ids = rng.sample(range(10, 100), 2)
    return {
        "items": {i: {"price": rng.randint(1, 20), "stock": rng.randint(0, 9)} for i in items},
        "orders": {
            f"o{k}": {
                "item": rng.choice(items),
                "quantity": rng.randint(1, 3),
                "status": rng.choice(["placed", "shipped"]),
            }
            for k in ids
        },
    }


def system(state: dict[str, Any]) -> str:
    return f"You are a shop assistant. {ANSWER_STYLE}"


def stock(rng, rec):
    item = rng.choice(list(rec.env.items))
    if rng.random() < 0.5:
        rec.user(f"How many {item} are in stock?")
        (r,) = rec.call(("check_stock", {"item": item}))
        rec.reply(
            f"{r['stock']} {item} in stock.", [r["stock"]], f"Does the reply give the {item} stock, {r['stock']}?"
        )
    else:
        rec.user(f"How much is one {item}?")
        (r,) = rec.call(("check_stock", {"item": item}))
        rec.reply(
            f"One {item} costs {r['price']}.", [r["price"]], f"Does the reply give the {item} price, {r['price']}?"
        )


def _ordered(rec, r, q, item):
    rec.reply(
        f"Ordered {q} {item}, order {r['order_id']}.",
        [r["order_id"]],
        f"Does the reply give the new order id, {r['order_id']}?",
    )


def order(rng, rec):
    stocked = [i for i, e in rec.env.items.items() if e["stock"] > 0]
    if not stocked:
        raise Reject("nothing in stock")
    item = rng.choice(stocked)
    q = rng.randint(1, rec.env.items[item]["stock"])
    rec.user(f"Order {q} {item}.")
    (r,) = rec.call(("place_order", {"item": item, "quantity": q}))
    _ordered(rec, r, q, item)


def order_if(rng, rec):
    item = rng.choice(list(rec.env.items))
    q = rng.randint(1, 9)
    rec.user(f"Order {q} {item} if there are enough in stock.")
    (r,) = rec.call(("check_stock", {"item": item}))
    if r["stock"] >= q:
        (o,) = rec.call(("place_order", {"item": item, "quantity": q}))
        _ordered(rec, o, q, item)
    else:
        rec.push_back = True
        rec.reply(
            f"Only {r['stock']} {item} left, so I did not order.",
            [r["stock"]],
            f"Does the reply say only {r['stock']} {item} are left?",
        )


def order_status(rng, rec):
    oid = rng.choice(sorted(rec.env.orders))
    rec.user(f"What is the status of order {oid}?")
    (r,) = rec.call(("get_order", {"order_id": oid}))
    rec.reply(f"Order {oid} is {r['status']}.", [r["status"]], f"Does the reply say order {oid} is {r['status']}?")


def cancel(rng, rec):
    oid = rng.choice(sorted(rec.env.orders))
    rec.user(f"Cancel order {oid}.")
    (r,) = rec.call(("cancel_order", {"order_id": oid}))
    if "error" in r:
        rec.reply(
            f"Order {oid} cannot be cancelled: {r['error']}.",
            ["cannot"],
            f"Does the reply say order {oid} cannot be cancelled?",
        )
    else:
        rec.reply(f"Order {oid} is cancelled.", ["cancelled"], f"Does the reply confirm order {oid} is cancelled?")


def unknown(rng, rec):
    item = rng.choice([i for i in ITEMS if i not in rec.env.items])
    rec.user(f"How many {item} are in stock?")
    rec.call(("check_stock", {"item": item}))
    rec.reply(f"Sorry, we do not sell {item}.", ["not sell", item], f"Does the reply say {item} is not sold?")


TASKS = [
    ("stock", stock, 3),
    ("order", order, 3),
    ("order_if", order_if, 3),
    ("order_status", order_status, 2),
    ("cancel", cancel, 2),
    ("unknown", unknown, 1),
]
