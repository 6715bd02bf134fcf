"""Tool-shaped comparison conversations in a water-tank world that no demo task uses.

The demo base (2 layers) reads numbers out of tool responses but cannot compare them: it names the richer of
two bank accounts at chance (docs/results.md, "What RL learned"). These conversations teach comparison in the form the
tool tasks need (read a value from a JSON tool response, compare it with a number, act on the result) in a
world of their own, so the pretraining corpus still holds no validation or test task:

* a conditional pump, "If north holds at least 40, pump 40 from north to east. Otherwise tell me north's
  level." (the condition holds or fails about equally often);
* which of two tanks holds more.

Numbers span the bank tasks' ranges. Conversations are recorded by the demo's ``Recorder``, so they have the
demo tasks' message form and turn into ACT rows with ``demo.data.act_rows``. Used by ``make pretrain-deep``
(``demo/pretrain.py``, ``tank_share``) and ``benchmarks/comparison_probe.py --form tool``.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from envace_jax.envs.base import ToolResult

TANKS = ["north", "south", "east", "west", "upper", "lower", "red", "blue"]  # no demo world's names
TANK_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_level",
            "description": "Get a tank's water level. Tanks: {}.",
            "parameters": {"type": "object", "properties": {"tank": {"type": "string"}}, "required": ["tank"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "pump",
            "description": "Pump water from one tank to another.",
            "parameters": {
                "type": "object",
                "properties": {
                    "from_tank": {"type": "string"},
                    "to_tank": {"type": "string"},
                    "amount": {"type": "integer", "description": "Positive amount."},
                },
                "required": ["from_tank", "to_tank", "amount"],
            },
        },
    },
]


class TankWorld:
    """The tank world for ``Recorder``: ``get_level`` reads a level, ``pump`` always succeeds."""

    def __init__(self, levels: dict[str, int]):
        self.levels = levels

    def execute(self, name: str, args: dict) -> ToolResult:
        payload = (
            {"tank": args["tank"], "level": self.levels[args["tank"]]}
            if name == "get_level"
            else {"status": "ok", **args}
        )
        return ToolResult(json.dumps(payload))


def tank_tasks(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` recorded tank conversations (task records with ``messages``, ``tools``, ``reference_messages``):
    a conditional pump or a two-tank comparison, about half each; a pure function of ``(n, seed)``."""
    from envace_jax.data.task_builders.recorder import ANSWER_STYLE, Recorder

    rng = random.Random(seed)
    out = []
    for i in range(n):
        names = sorted(rng.sample(TANKS, rng.randint(3, 5)))
        levels = {t: rng.randint(10, 99) for t in names}
        a, b = rng.sample(names, 2)
        tools = copy.deepcopy(TANK_TOOLS)
        tools[0]["function"]["description"] = TANK_TOOLS[0]["function"]["description"].format(", ".join(names))
        if rng.random() < 0.5:
            x = rng.randint(5, 95)
            rec = Recorder(TankWorld(levels))
            rec.user(f"If {a} holds at least {x}, pump {x} from {a} to {b}. Otherwise tell me {a}'s level.")
            rec.call(("get_level", {"tank": a}))
            if levels[a] >= x:
                rec.call(("pump", {"from_tank": a, "to_tank": b, "amount": x}))
                rec.reply(f"Pumped {x} from {a} to {b}.", [x, b], "")
            else:
                rec.reply(f"{a} holds only {levels[a]}, so I pumped nothing.", [levels[a]], "")
        else:
            while levels[a] == levels[b]:
                levels[b] = rng.randint(10, 99)
            rec = Recorder(TankWorld(levels))
            rec.user(f"Which tank holds more, {a} or {b}?")
            rec.call(("get_level", {"tank": a}), ("get_level", {"tank": b}))
            win, lose = (a, b) if levels[a] > levels[b] else (b, a)
            rec.reply(f"{win} holds more: {levels[win]} against {levels[lose]}.", [win], "")
        msgs = [{"role": "system", "content": f"You are a water-tank assistant. {ANSWER_STYLE}"}, rec.messages[0]]
        out.append({"uid": f"tank-{seed}-{i}", "messages": msgs, "tools": tools, "reference_messages": rec.messages})
    return out
