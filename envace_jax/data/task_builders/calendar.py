"""Calendar tasks: listing a day, booking (some slots taken), moving, first free hour, cancelling.

Each builder plays one user turn against the real world through a ``Recorder``; ``TASKS`` lists
(task type, builder, draw weight), error-path types weighing less.
"""

from __future__ import annotations

import random
from typing import Any

from envace_jax.data.task_builders.recorder import ANSWER_STYLE, Reject
from envace_jax.envs.demo_worlds import DAYS, FIRST_HOUR, LAST_HOUR, TITLES


def state(rng: random.Random) -> dict[str, Any]:
    slots = rng.sample([(d, h) for d in DAYS for h in range(FIRST_HOUR, LAST_HOUR + 1)], rng.randint(3, 7))
    return {"events": [{"day": d, "hour": h, "title": rng.choice(TITLES)} for d, h in sorted(slots)]}


def system(state: dict[str, Any]) -> str:
    return f"You manage a calendar, mon to fri, hours {FIRST_HOUR} to {LAST_HOUR}. {ANSWER_STYLE}"


def _free(rec, day: str) -> list[int]:
    return [h for h in range(FIRST_HOUR, LAST_HOUR + 1) if (day, h) not in rec.env.slots]


def day(rng, rec):
    day = rng.choice(DAYS)
    rec.user(f"What is on my calendar on {day}?")
    (r,) = rec.call(("list_events", {"day": day}))
    if r["events"]:
        parts = ", ".join(f"{e['title']} at {e['hour']}" for e in r["events"])
        rec.reply(
            f"On {day}: {parts}.", [e["title"] for e in r["events"]], f"Does the reply list every event on {day}?"
        )
    else:
        rec.reply(f"Nothing is booked on {day}.", ["nothing"], f"Does the reply say {day} is empty?")


def book(rng, rec):
    day, title = rng.choice(DAYS), rng.choice(TITLES)
    taken = rng.random() < 0.25
    hours = [h for h in range(FIRST_HOUR, LAST_HOUR + 1) if ((day, h) in rec.env.slots) == taken]
    if not hours:
        raise Reject("no slot of the wanted kind")
    hour = rng.choice(hours)
    rec.user(f"Book {title} on {day} at {hour}.")
    (r,) = rec.call(("add_event", {"day": day, "hour": hour, "title": title}))
    if "error" in r:
        rec.reply(f"{day} at {hour} is already booked.", ["already booked"], "Does the reply say the slot is taken?")
    else:
        rec.reply(f"Booked {title} on {day} at {hour}.", [title, hour], f"Does the reply confirm {title} at {hour}?")


def move(rng, rec):
    if not rec.env.slots:
        raise Reject("no event to move")
    (d1, h1), title = rng.choice(sorted(rec.env.slots.items()))
    d2 = rng.choice(DAYS)
    free = [h for h in _free(rec, d2) if (d2, h) != (d1, h1)]
    if not free:
        raise Reject("target day full")
    h2 = rng.choice(free)
    rec.user(f"Move {title} from {d1} {h1} to {d2} {h2}.")
    rec.call(("remove_event", {"day": d1, "hour": h1}))
    rec.call(("add_event", {"day": d2, "hour": h2, "title": title}))
    rec.reply(f"Moved {title} to {d2} at {h2}.", [d2, h2], f"Does the reply confirm {title} is now on {d2} at {h2}?")


def first_free(rng, rec):
    day, title = rng.choice(DAYS), rng.choice(TITLES)
    start = rng.randint(FIRST_HOUR, LAST_HOUR - 3)
    free = [h for h in _free(rec, day) if h >= start]
    if not free:
        raise Reject("no free hour")
    rec.user(f"Book {title} on {day} at the first free hour from {start}.")
    rec.call(("list_events", {"day": day}))
    rec.call(("add_event", {"day": day, "hour": free[0], "title": title}))
    rec.reply(f"Booked {title} on {day} at {free[0]}.", [free[0]], f"Does the reply give the booked hour, {free[0]}?")


def cancel(rng, rec):
    if not rec.env.slots:
        raise Reject("no event to cancel")
    (day, hour), title = rng.choice(sorted(rec.env.slots.items()))
    rec.user(f"Cancel my {title} on {day} at {hour}.")
    rec.call(("remove_event", {"day": day, "hour": hour}))
    rec.reply(f"Cancelled {title} on {day}.", ["cancelled"], f"Does the reply confirm {title} is cancelled?")


TASKS = [("day", day, 3), ("book", book, 3), ("move", move, 3), ("first_free", first_free, 3), ("cancel", cancel, 2)]
