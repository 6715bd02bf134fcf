"""The engine of imagined episodes: REHEARSE (or a simulator) answers every tool call, and no real tool is
reachable except, opt-in, the ``real_reads`` tools on an environment of the episode's own (``eval.rehearsal``,
module doc: "Real reads"). Test-time rehearsal (``eval.rehearsal.TestTimeRehearsal``) runs it."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from envace_jax.envs.base import NoToolEnvironment
from envace_jax.rl.rollout import RolloutConfig, RolloutEngine
from envace_jax.rl.types import Episode, State


class _Advance:
    """Verdict of the imagined turn judge: no reward, never terminates (the engine moves on)."""

    turn_reward = 0.0
    terminate = False
    api_failed_count = 0
    required_failed = False


def advance_judge(episodes: Sequence[Episode]) -> list[_Advance]:
    return [_Advance() for _ in episodes]


REAL_READ_KEY = "real_read"  # marks a tool message a real read answered (eval.rehearsal doc, "Real reads")


class ImaginedEngine(RolloutEngine):
    """A rollout engine whose tool calls REHEARSE (or the simulator) answers; the only real tool it can reach
    is a ``real_reads`` tool, on a fresh environment of the episode's own (see eval.rehearsal)."""

    def __init__(
        self,
        cfg: RolloutConfig,
        codec,
        policy,
        judge=advance_judge,
        *,
        simulator=None,
        on_step=None,
        real_reads: Sequence[str] = (),
        make_env: Callable[[dict], Any] | None = None,
    ):
        if cfg.mode not in ("rehearsal", "simulator"):
            raise ValueError(f"imagined episodes need rollout.mode 'rehearsal' or 'simulator', got {cfg.mode!r}")
        if real_reads and make_env is None:
            raise ValueError("real_reads needs make_env(record), the environment the reads run against")
        super().__init__(cfg, codec, policy, judge, simulator=simulator, make_env=None, on_step=on_step)
        self.real_reads, self._make_read_env = frozenset(real_reads), make_env
        self._read_envs: dict[int, Any] = {}  # episode id -> its own environment, until it imagines a change

    def start(self, records, uids=None):
        episodes = super().start(records, uids)
        for e in episodes:
            e.env = NoToolEnvironment(e.record.get("tools", []))
            if self.real_reads:
                self._read_envs[e.episode_id] = self._make_read_env(e.record)
        return episodes

    def _after_act(self, e: Episode) -> None:
        if e.state != State.AWAIT_SIMULATOR or e.episode_id not in self._read_envs:
            return
        names = [name for _, name, _ in e.pending_calls]
        if not all(n in self.real_reads for n in names):
            del self._read_envs[e.episode_id]  # it imagines a change: from here on the world is its own
            return
        n_before = len(e.messages)
        self._answer_from(e, self._read_envs[e.episode_id])
        for m in e.messages[n_before:]:
            m[REAL_READ_KEY] = True

    def _answer_real(self, e: Episode) -> None:
        raise RuntimeError(f"episode {e.uid!r}: a real tool was reached during private rehearsal")
