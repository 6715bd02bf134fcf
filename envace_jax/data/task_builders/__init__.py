"""The oracle task builders of the demo's four worlds (and the opt-in wire world), one module per world.

``WORLD_TASKS[world]`` gives the world's initial-state sampler, its system prompt and its task types
(name, builder, draw weight). A builder plays one user turn on a ``Recorder``, which executes every call
against the real world; ``envace_jax.data.demo_tasks`` draws worlds and builders and turns the
recording into a task record.
"""

from __future__ import annotations

import random
from typing import Any, Callable, NamedTuple

from envace_jax.data.task_builders import bank, calendar, shop, units, wire
from envace_jax.data.task_builders.recorder import Recorder, Reject, normalise_weights
from envace_jax.envs.demo_worlds import RULE_WORLDS, WORLDS

Builder = Callable[[random.Random, Recorder], None]


class WorldTasks(NamedTuple):
    state: Callable[[random.Random], dict[str, Any]]  # a fresh initial state of the world
    system: Callable[[dict[str, Any]], str]  # the system prompt for that state
    tasks: list[tuple[str, Builder, int]]  # (task type, builder, draw weight)


WORLD_TASKS: dict[str, WorldTasks] = {
    m.__name__.rsplit(".", 1)[1]: WorldTasks(m.state, m.system, m.TASKS) for m in (bank, shop, calendar, units)
}
assert set(WORLD_TASKS) == set(WORLDS)
# The opt-in family of tasks whose wrong calls cannot be undone (``demo_tasks`` family "irreversible");
# apart from WORLD_TASKS, so the default draws never meet it.
RULE_WORLD_TASKS: dict[str, WorldTasks] = {"wire": WorldTasks(wire.state, wire.system, wire.TASKS)}
assert set(RULE_WORLD_TASKS) == set(RULE_WORLDS)

__all__ = ["Builder", "Recorder", "Reject", "RULE_WORLD_TASKS", "WORLD_TASKS", "WorldTasks", "normalise_weights"]
