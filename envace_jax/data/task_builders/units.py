"""Unit-conversion tasks: one or two conversions, listing units, unknown or mismatched units.

Each builder plays one user turn against the real world through a ``Recorder``; ``TASKS`` lists
(task type, builder, draw weight), error-path types weighing less.
"""

from __future__ import annotations

import random
from typing import Any

from envace_jax.data.task_builders.recorder import ANSWER_STYLE, Reject
from envace_jax.envs.demo_worlds import UNIT_KIND_OF, UNIT_KINDS, draw_conversion


def state(rng: random.Random) -> dict[str, Any]:
    return {}


def system(state: dict[str, Any]) -> str:
    return f"You convert units of length, time and mass. {ANSWER_STYLE}"


def _conversion(rng: random.Random) -> tuple[int, str, str, int]:
    drawn = draw_conversion(rng)
    if drawn is None:
        raise Reject("result would be a tiny fraction")
    return drawn


def convert(rng, rec):
    v, fu, tu, _ = _conversion(rng)
    rec.user(f"Convert {v} {fu} to {tu}.")
    (r,) = rec.call(("convert", {"value": v, "from_unit": fu, "to_unit": tu}))
    rec.reply(f"{v} {fu} is {r['result']} {tu}.", [r["result"]], f"Does the reply give {r['result']} {tu}?")


def two(rng, rec):
    v1, f1, t1, _ = _conversion(rng)
    v2, f2, t2, _ = _conversion(rng)
    if (v1, f1, t1) == (v2, f2, t2):
        raise Reject("same conversion twice")
    rec.user(f"Convert {v1} {f1} to {t1} and {v2} {f2} to {t2}.")
    r1, r2 = rec.call(
        ("convert", {"value": v1, "from_unit": f1, "to_unit": t1}),
        ("convert", {"value": v2, "from_unit": f2, "to_unit": t2}),
    )
    rec.reply(
        f"{v1} {f1} is {r1['result']} {t1} and {v2} {f2} is {r2['result']} {t2}.",
        [r1["result"], r2["result"]],
        "Does the reply give both converted values?",
    )


def list_units(rng, rec):
    kind = rng.choice(sorted(UNIT_KINDS))
    rec.user(f"Which units of {kind} do you know?")
    (r,) = rec.call(("list_units", {"kind": kind}))
    rec.reply(f"Units of {kind}: {', '.join(r['units'])}.", r["units"], f"Does the reply list every {kind} unit?")


def bad(rng, rec):
    v = rng.randint(1, 12)
    if rng.random() < 0.5:
        fu, tu = rng.sample(sorted(UNIT_KIND_OF), 2)
        if UNIT_KIND_OF[fu] == UNIT_KIND_OF[tu]:
            raise Reject("compatible pair")
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


TASKS = [("convert", convert, 4), ("two", two, 3), ("list", list_units, 2), ("bad", bad, 2)]
