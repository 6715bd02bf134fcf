"""Rehearsal memories in RL prompts (issue 36): the policy learns to act on a memory by meeting one.

Test-time rehearsal places a memory of imagined episodes in the system prompt of the one real attempt; a
policy RL never showed such a prompt has no reason to use it (docs/results.md, test-time rehearsal). Here
a configured share of each RL step's prompts (``DemoConfig.rl_memory_fraction``) first goes through the very
code of test-time rehearsal (``eval.rehearsal.TestTimeRehearsal.rehearse``: imagined episodes of the current
policy, REHEARSE playing the tools, no real tool reachable, the same memory template, gate and placement),
and the RL rollouts of that prompt start from the record with the memory placed (``with_memory``). The
memory's format is therefore the one the policy meets at test time, and its N, temperature, size and gate
are the demo's test-time settings (``rehearsal_*`` fields) apart from N (``rl_memory_rehearsals``).

Which prompts: ``round(fraction * prompts)`` positions per step (half up), drawn from (seed, step) only, so
a rerun picks the same ones. A chosen prompt whose memory the gate leaves empty (``on_mistake`` and no
mistake caught) runs without one, as it would at test time. The imagined episodes are played by the policy
in both roles, as at test time, also in RL modes where another model plays REHEARSE in the rollouts
(``simulator``, ``noshare``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping, Sequence

import numpy as np

from envace_jax.eval.rehearsal import RehearsalConfig, TaskRehearsal, TestTimeRehearsal, with_memory
from envace_jax.rl.rollout import RolloutConfig


def chosen_positions(n: int, fraction: float, seed: int, iteration: int) -> list[int]:
    """The positions among ``n`` prompts of step ``iteration`` that get a rehearsal (sorted)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"memory fraction must be in [0, 1], got {fraction!r}")
    k = int(fraction * n + 0.5)
    if k == 0:
        return []
    rng = np.random.default_rng([seed, iteration, 36])
    return sorted(int(i) for i in rng.choice(n, size=k, replace=False))


@dataclasses.dataclass
class MemoryStep:
    """What one step's rehearsals did: the chosen positions and their ``TaskRehearsal`` (traces, memory,
    imagined episodes, tokens)."""

    chosen: list[int]
    rehearsals: list[TaskRehearsal]
    seconds: float


class MemoryPrompts:
    """Gives ``fraction`` of each step's prompts the memory of ``rehearsal.n`` imagined episodes of ``policy``.

    ``rollout_cfg``: the RL rollouts' config (its sampling limits and seed; the imagined episodes use mode
    ``rehearsal`` and ``rehearsal.temperature``, as at test time). ``policy``: the client the RL rollouts
    sample from, so the memory is always the current policy's.
    """

    def __init__(
        self, fraction: float, rehearsal: RehearsalConfig, rollout_cfg: RolloutConfig, codec, policy, *, seed: int
    ):
        chosen_positions(1, fraction, 0, 0)  # validates the fraction
        if rehearsal.n < 1:
            raise ValueError(f"rehearsal memories in RL prompts need rehearsal.n >= 1, got {rehearsal.n}")
        self.fraction, self.rehearsal, self.rollout_cfg = float(fraction), rehearsal, rollout_cfg
        self.codec, self.policy, self.seed = codec, policy, int(seed)
        self.last: MemoryStep | None = None

    def runner(self, iteration: int) -> TestTimeRehearsal:
        """The test-time rehearsal runner of step ``iteration`` (its imagined episodes' seed depends on it)."""
        cfg = dataclasses.replace(self.rehearsal, seed=(self.seed * 1_000_003 + iteration) % (2**31 - 1))
        # rehearse() never scores nor reaches a real tool: no judge, no make_env
        return TestTimeRehearsal(cfg, self.rollout_cfg, self.codec, self.policy, judge=None, make_env=None)

    def __call__(self, records: Sequence[Mapping[str, Any]], iteration: int) -> tuple[list[dict], dict[str, float]]:
        """The step's prompts, ``fraction`` of them with a memory placed, and the step's memory metrics."""
        out = [dict(r) for r in records]
        chosen = chosen_positions(len(out), self.fraction, self.seed, iteration)
        t0 = time.perf_counter()
        rehearsals = self.runner(iteration).rehearse([out[i] for i in chosen]) if chosen else []
        for i, reh in zip(chosen, rehearsals):
            if reh.memory:
                out[i] = with_memory(out[i], reh.memory, self.rehearsal.placement)
        self.last = MemoryStep(chosen, rehearsals, time.perf_counter() - t0)
        n = max(1, len(out))
        return out, {
            "memory/rehearsed_share": len(chosen) / n,
            "memory/placed_share": sum(bool(r.memory) for r in rehearsals) / n,
            "memory/generated_tokens": float(sum(r.generated_tokens for r in rehearsals)),
            "memory/seconds": self.last.seconds,
        }


def from_demo(cfg, codec, policy, rollout_cfg: RolloutConfig) -> MemoryPrompts | None:
    """The demo's ``MemoryPrompts`` (None when ``cfg.rl_memory_fraction`` is 0): the test-time settings of
    ``demo.rehearsal_table.demo_rehearsal_config`` with ``cfg.rl_memory_rehearsals`` parallel rehearsals."""
    from envace_jax.demo.rehearsal_table import demo_rehearsal_config

    if cfg.rl_memory_fraction == 0:
        return None
    # RL in rehearsal mode reaches no real tool, so its memories' rehearsals read none either
    reh = dataclasses.replace(demo_rehearsal_config(cfg, n=cfg.rl_memory_rehearsals), real_reads=())
    return MemoryPrompts(cfg.rl_memory_fraction, reh, rollout_cfg, codec, policy, seed=cfg.rl_stream_seed)
