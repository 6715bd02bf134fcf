"""Episodes that lost their judge: which rows they take out of the update, and when a run stops.

An episode *loses its judge* when some verdict of one of its turns had no usable answer after every
attempt (HTTP errors, timeouts, malformed text): the rollout ends it as ``judge_api_failure`` with the
failed items counted False. During a judge outage most episodes end that way, and training on them
would teach the policy that everything it did scored 0. So (``rl.mask_judge_failures``, the default):

* ``judge_mask`` gives their rows zero loss weight and leaves them out of the GRPO baselines; a
  (prompt, role) key that lost episodes and keeps fewer than 2 judged ones has no baseline left to
  compare with, so it contributes nothing either. Keys that lost nothing keep the reference's rules
  (a lone episode's rows are trained with baseline 0).
* ``JudgeOutageMonitor`` warns at every step that had such episodes, naming the judge, and tells the
  training loop to stop (``JudgeOutageError``) once more than ``judge.outage_share`` of a step's
  episodes lost their judge on ``judge.outage_steps`` consecutive steps.

The faithful setting (``rl.mask_judge_failures=False``) trains on those episodes as the reference does
(spec 4.2 and 8.10); the warning and the stop apply in both settings. Host-side only; no jax.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping, Sequence

import numpy as np

JUDGE_FAILURE = "judge_api_failure"  # the termination reason (rl.types.TERMINATION_REASONS)

log = logging.getLogger(__name__)


class JudgeOutageError(RuntimeError):
    """Too many episodes lost their judge for too many consecutive steps; the message is one line."""


def lost_episodes(episodes: Sequence[Any]) -> set[int]:
    """Ids of the episodes that ended without a verdict."""
    return {e.episode_id for e in episodes if e.termination == JUDGE_FAILURE}


def judge_mask(episode_ids: Sequence[int], keys: Sequence[tuple[int, int]], lost: set[int]) -> tuple[np.ndarray, int]:
    """(trained bool ``[rows]``, keys that contribute nothing) for rows of episodes ``episode_ids`` with
    baseline keys ``keys`` ((group, role) per row) when the episodes in ``lost`` lost their judge.

    A row is trained unless its episode lost its judge, or its key lost an episode and keeps rows of
    fewer than 2 judged episodes."""
    if len(episode_ids) != len(keys):
        raise ValueError(f"judge_mask: {len(episode_ids)} episode ids but {len(keys)} keys")
    trained = np.asarray([int(e) not in lost for e in episode_ids], bool)
    by_key: dict[tuple[int, int], list[int]] = {}
    for i, k in enumerate(keys):
        by_key.setdefault(tuple(k), []).append(i)
    dropped = 0
    for rows in by_key.values():
        if all(trained[rows]):
            continue
        judged = {int(episode_ids[i]) for i in rows if trained[i]}
        if len(judged) < 2:
            trained[rows] = False
            dropped += 1
    return trained, dropped


def example_error(episodes: Sequence[Any]) -> str:
    """The error text of the first episode that lost its judge ("" if none did)."""
    for e in episodes:
        if e.termination == JUDGE_FAILURE and e.info.get("judge_error"):
            return " ".join(str(e.info["judge_error"]).split())  # one line
    return ""


@dataclasses.dataclass
class JudgeOutageMonitor:
    """Watches each step's ``judge/lost_episodes`` and ``episode/count`` metrics.

    ``observe`` logs a warning for a step with lost episodes and returns a ``JudgeOutageError`` (not
    raised: the caller closes its checkpointer and writers first) on the ``max_steps``-th consecutive
    step where more than ``max_share`` of the episodes lost their judge."""

    judge: str  # the judge's ``describe()``: its kind and endpoint
    max_share: float = 0.5  # judge.outage_share
    max_steps: int = 2  # judge.outage_steps
    masked: bool = True  # rl.mask_judge_failures (only changes the warning's wording)
    warn: bool = True  # False on every process but the first of a multi-process run
    bad_steps: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # the current streak

    def __post_init__(self):
        if not 0 <= self.max_share <= 1:
            raise ValueError(f"max_share must be in [0, 1], got {self.max_share!r}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps!r}")

    def observe(self, step: int, metrics: Mapping[str, float], error: str = "") -> JudgeOutageError | None:
        lost = int(metrics.get("judge/lost_episodes", 0))
        total = int(metrics.get("episode/count", 0))
        share = lost / total if total else 0.0
        if lost and self.warn:
            what = (
                "their rows are masked out of the loss and the baselines"
                if self.masked
                else "they are trained on with the failed items counted False (rl.mask_judge_failures=False)"
            )
            log.warning(
                "step %d: %d of %d episodes (%.0f%%) got no verdict from the %s; %s%s",
                step,
                lost,
                total,
                100 * share,
                self.judge,
                what,
                f". Last error: {error}" if error else "",
            )
        if share > self.max_share:
            self.bad_steps.append((step, share))
        else:
            self.bad_steps = []
        if len(self.bad_steps) < self.max_steps:
            return None
        shares = ", ".join(f"step {s}: {100 * x:.0f}%" for s, x in self.bad_steps)
        return JudgeOutageError(
            f"judge outage: more than {100 * self.max_share:.0f}% of the episodes got no verdict from the "
            f"{self.judge} on {len(self.bad_steps)} consecutive steps ({shares}); stopped. Check the judge, "
            "or raise config.judge.outage_share / config.judge.outage_steps"
            + (f". Last error: {error}" if error else "")
        )
