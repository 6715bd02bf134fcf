"""The tank world's comparison conversations: each recorded answer is the one the levels read from its tool
responses call for, and no tank name occurs in a demo task."""

from __future__ import annotations

import json
import re

from envace_jax.data.tank_tasks import TANKS, tank_tasks


def _levels_read(task):
    return [json.loads(m["content"]) for m in task["reference_messages"] if m["role"] == "tool"]


def test_each_answer_follows_from_the_levels_read():
    tasks = tank_tasks(400, 3)
    kinds = {"if": 0, "which": 0, "pumped": 0}
    for t in tasks:
        user = t["reference_messages"][0]["content"]
        calls = [
            c["function"]
            for m in t["reference_messages"]
            if m["role"] == "assistant"
            for c in m.get("tool_calls") or []
        ]
        reply = t["reference_messages"][-1]["content"]
        reads = _levels_read(t)
        if user.startswith("If"):
            kinds["if"] += 1
            src, need, dst = re.fullmatch(r"If (\w+) holds at least (\d+), pump \d+ from \w+ to (\w+)\..*", user).group(
                1, 2, 3
            )
            level = reads[0]["level"]
            pumps = [c for c in calls if c["name"] == "pump"]
            if level >= int(need):
                kinds["pumped"] += 1
                assert pumps[0]["arguments"] == {"from_tank": src, "to_tank": dst, "amount": int(need)}
            else:
                assert not pumps and str(level) in reply
        else:
            kinds["which"] += 1
            a, b = re.fullmatch(r"Which tank holds more, (\w+) or (\w+)\?", user).groups()
            levels = {r["tank"]: r["level"] for r in reads}
            assert set(levels) == {a, b} and levels[a] != levels[b]
            assert reply.split(" ")[0] == max(levels, key=levels.get)
    # both kinds about equally often, and the condition holds about half the time
    assert 150 < kinds["if"] < 250 and 150 < kinds["which"] < 250
    assert 0.3 < kinds["pumped"] / kinds["if"] < 0.7


def test_a_pure_function_of_its_arguments_and_disjoint_from_the_demo_worlds():
    from envace_jax.data.demo_tasks import generate_tasks

    assert tank_tasks(20, 5) == tank_tasks(20, 5) and tank_tasks(20, 5) != tank_tasks(20, 6)
    demo_text = json.dumps(generate_tasks(500, 0, "train")).lower()
    assert not [w for w in TANKS + ["tank"] if re.search(rf"\b{w}\b", demo_text)]
