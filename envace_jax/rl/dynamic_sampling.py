"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, section 3.2) for role-wise GRPO.

A (prompt, role) group whose trained rows all score the same has advantage 0 on every row under a group
baseline: it adds nothing to the gradient but still counts in the loss's normaliser, so a batch where most
groups are flat takes a small step. With ``rl.dynamic_sampling`` the step

1. rolls out its batch of prompts and scores the rows;
2. calls a prompt *informative* when at least one of its groups in a trained role has two trained rows with
   different scores;
3. while fewer informative prompts than the batch holds are in, and at most ``rl.dynamic_sampling_max_rounds``
   times, rolls out the next batch of prompts from the data stream (DAPO's verl recipe also draws whole
   generation batches) and adds its informative prompts, skipping prompts already in the step;
4. keeps the first ``target`` informative prompts in draw order (the surplus of the last round is dropped,
   as in DAPO) and, of their rows, only those of informative groups: the flat groups' rows leave the update
   and its normaliser.

If the rounds run out first the step trains on the informative prompts it has (fewer than the batch);
``dynamic/*`` metrics say how many rounds, prompts and rows it took. What is informative depends on the
rows' scores after the step's penalties (empty output, overlong) and on the judge mask (rows of episodes that
lost their judge are out of their groups), the same numbers the advantages are computed from.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from envace_jax.rl.types import Episode, Generation

Records = Sequence[Mapping[str, Any]]


def flat_groups(
    uids: Sequence[str], roles: Sequence[str], scores: np.ndarray, trained: np.ndarray, trained_roles: Sequence[str]
) -> set[tuple[str, str]]:
    """The ``(uid, role)`` groups of ``trained_roles`` without a signal: fewer than two trained rows, or all of
    their trained rows scoring the same."""
    groups: dict[tuple[str, str], list[float]] = {}
    for uid, role, s, t in zip(uids, roles, np.asarray(scores, np.float64), trained):
        if role in trained_roles:
            vals = groups.setdefault((uid, role), [])
            if t:
                vals.append(float(s))
    return {key for key, vals in groups.items() if len(vals) < 2 or max(vals) == min(vals)}


def informative_uids(
    uids: Sequence[str], roles: Sequence[str], scores: np.ndarray, trained: np.ndarray, trained_roles: Sequence[str]
) -> list[str]:
    """The prompts (uids, in first-row order) with at least one group of ``trained_roles`` that has a signal."""
    flat = flat_groups(uids, roles, scores, trained, trained_roles)
    out: list[str] = []
    for uid, role in zip(uids, roles):
        if role in trained_roles and (uid, role) not in flat and uid not in out:
            out.append(uid)
    return out


@dataclasses.dataclass
class Collected:
    """The episodes a dynamically sampled step trains on, and what collecting them took."""

    episodes: list[Episode]
    metrics: dict[str, float]


def collect(
    first: Records,
    rollout: Callable[[Records, int], list[Episode]],
    score: Callable[[list[Episode]], tuple[list[Generation], np.ndarray, np.ndarray]],
    next_records: Callable[[], Records] | None,
    trained_roles: Sequence[str],
    max_rounds: int,
    count_all: Callable[[int], int] = lambda n: n,
) -> Collected:
    """Rolls out ``first`` and, while informative prompts are short of ``len(first)``, up to ``max_rounds``
    further batches from ``next_records``; returns the episodes of the first ``len(first)`` informative
    prompts (all their episodes: the flat groups' rows are dropped later, by the update).

    ``rollout(records, round)`` plays a batch (round 0 is the step's own); ``score(episodes)`` gives the rows,
    their scores and their trained mask, as the update will compute them. ``count_all``: a count summed over
    processes (several processes decide on the same rounds: each rolls out its own prompts)."""
    target = len(first)
    kept: list[str] = []
    by_uid: dict[str, list[Episode]] = {}
    sampled = rounds = 0
    records = list(first)
    seen: set[str] = set()
    next_id = 0
    while True:
        episodes = rollout(records, rounds)
        # a batch numbers its episodes from 0: later rounds' ids move past the earlier ones', so episode ids
        # stay unique in the step (baselines and the judge mask key on them)
        offset, next_id = next_id, next_id + len(episodes)
        for e in episodes:
            e.episode_id += offset
            for g in e.generations:
                g.episode += offset
        sampled += len(records)
        seen.update(str(r.get("uid")) for r in records)
        gens, scores, trained = score(episodes)
        good = informative_uids([g.uid for g in gens], [g.role for g in gens], scores, trained, trained_roles)
        for e in episodes:
            if e.uid in good:
                by_uid.setdefault(e.uid, []).append(e)
        kept.extend(u for u in good if u not in kept)
        rounds += 1
        if count_all(min(len(kept), target)) >= count_all(target) or rounds > max_rounds or next_records is None:
            break
        # a prompt already in this step would merge its groups with the new rollouts': leave it out
        try:
            drawn = next_records()
        except StopIteration:  # a finite stream ran out: train on what is in
            drawn = []
        records = [r for r in drawn if str(r.get("uid")) not in seen]
        if count_all(len(records)) == 0:
            break
    chosen = kept[:target]
    return Collected(
        [e for uid in chosen for e in by_uid[uid]],
        {
            "dynamic/rounds": float(rounds),
            "dynamic/prompts_sampled": float(sampled),
            "dynamic/prompts_informative": float(len(kept)),
            "dynamic/prompts_kept": float(len(chosen)),
            "dynamic/batch_fill": len(chosen) / max(1, target),
        },
    )
