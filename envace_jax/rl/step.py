"""One RL iteration: prompts -> episodes -> scores -> role-wise advantages -> PPO update -> metrics.

    prompts (k records) --repeat n, shared uid--> RolloutEngine.run --> Generations (ACT + REHEARSE rows)
    --> row score = episode score - empty-output penalty (rows with empty text)
    --> rows of episodes that lost their judge masked (rl.mask_judge_failures, rl.judge_outage) --> role_wise_advantages
    --> build_batch per trainer (rows of the roles it trains) --> [recompute old log-probs]
    --> ppo_update (epochs x mini-batches of Trainer.update) --> metrics per role

Which rows are trained depends on the rollout mode (reference section 5.4 and the ablations):
``rehearsal`` trains ACT and REHEARSE rows together in one update of the shared policy;
``caller_frozen`` trains only REHEARSE; ``simulator`` and ``real`` train only ACT (the world is a
frozen model or real tools); ``noshare`` trains two Trainers, each on its own role's rows.

Advantages are computed over all rows of the step at once; since the baseline key includes the role,
a role's advantages do not depend on the other role's rows, so dropping untrained rows afterwards
changes nothing.

Determinism: everything random in a step is derived from ``(seed, iteration)``: rollout seeds, and
the faithful row duplication. With the data iterator's state and the trainer state restored, step
``i`` of a resumed run repeats step ``i`` of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from envace_jax.config import RLSection
from envace_jax.rl.advantages import advantage_stats, role_wise_advantages
from envace_jax.rl.batch import TrainBatch, build_batch
from envace_jax.rl.judge_outage import judge_mask, lost_episodes
from envace_jax.rl.loss import loss_count
from envace_jax.rl import dynamic_sampling
from envace_jax.rl.reward import empty_output_penalty, is_success, overlong_penalty
from envace_jax.rl.rollout import TRAINED_ROLES, RolloutConfig, RolloutEngine
from envace_jax.rl.trainer import Trainer
from envace_jax.rl.types import ACT, REHEARSE, ROLE_ID, ROLES, Episode, Generation

ROLE_NAMES = {v: k for k, v in ROLE_ID.items()}


# The step's knobs are the run config's ``rl`` section (one definition, validated there).
StepConfig = RLSection


def repeat_prompts(records: Sequence[Mapping[str, Any]], n: int) -> tuple[list[Mapping[str, Any]], list[str]]:
    """Each record ``n`` times in a row; the copies share the record's uid (its GRPO group)."""
    out, uids = [], []
    for i, rec in enumerate(records):
        uid = str(rec.get("uid", f"prompt{i}"))
        for _ in range(n):
            out.append(rec)
            uids.append(uid)
    if len(set(uids)) != len(records):
        raise ValueError(f"prompt uids in one step must be distinct, got {[str(r.get('uid')) for r in records]}")
    return out, uids


def adjust_batch_copy(gens: list[Generation], multiple: int, rng: np.random.Generator) -> list[Generation]:
    """The reference's ``adjust_batch`` (mode "copy"): appends randomly chosen rows (duplicates) until
    the row count is a multiple of ``multiple``. Duplicates enter the baselines and the loss."""
    if multiple <= 1 or not gens or len(gens) % multiple == 0:
        return list(gens)
    extra = multiple - len(gens) % multiple
    picks = rng.choice(len(gens), size=extra, replace=extra > len(gens))
    return list(gens) + [gens[int(i)] for i in picks]


def row_scores(
    gens: Sequence[Generation],
    penalty: float,
    *,
    overlong_buffer: int = 0,
    overlong_factor: float = 1.0,
    budgets: Mapping[str, int] | None = None,
) -> np.ndarray:
    """Episode score on every row, minus ``penalty`` (``rl.empty_output_penalty``, reference 0.1) for rows
    whose decoded output is empty text, the reference's invalid action (spec 4.3: ``is_action_valid`` is
    "the text decoded without special tokens is non-empty", so a row of only ``<|im_end|>`` is empty), plus
    DAPO's soft overlong penalty (``rl.overlong_buffer`` > 0: ``reward.overlong_penalty`` of the row's
    generated tokens against ``budgets[role]``, its role's ``max_new_tokens``). This is the one place the
    penalties are applied."""
    base = [g.score for g in gens]
    out = np.asarray(empty_output_penalty(base, [g.text for g in gens], penalty=penalty), np.float64)
    if overlong_buffer:
        if budgets is None:
            raise ValueError("row_scores: overlong_buffer > 0 needs each role's generation budget (budgets)")
        out += overlong_penalty(
            [len(g.gen_ids) for g in gens], [budgets[g.role] for g in gens], overlong_buffer, overlong_factor
        )
    return out.astype(np.float32)


def _group_ids(uids: Sequence[str]) -> np.ndarray:
    index: dict[str, int] = {}
    return np.asarray([index.setdefault(u, len(index)) for u in uids], np.int32)


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else 0.0


def _tool_calls(e: Episode) -> int:
    return sum(len(m.get("tool_calls") or []) for m in e.messages if m.get("role") == "assistant")


def rollout_metrics(
    episodes: Sequence[Episode], gens: Sequence[Generation], scores: np.ndarray, unscored: set[int] = frozenset()
) -> dict[str, float]:
    """Episode- and role-level metrics of one step (before the update). Episodes in ``unscored`` (ids of
    episodes masked for losing their judge) are left out of the score and reward means: an outage
    does not read as a policy that scores 0."""
    m: dict[str, float] = {}
    ep_scores = [e.score for e in episodes if e.episode_id not in unscored]
    m["episode/score_mean"] = _mean(ep_scores)
    m["episode/score_max"] = float(np.max(ep_scores)) if ep_scores else 0.0
    # a success is a full score (``is_success``, as every evaluation counts it); a partial
    # checklist is a score above 0 that is not a success
    m["episode/success_frac"] = _mean([float(is_success(s)) for s in ep_scores])
    m["episode/any_credit_frac"] = _mean([float(s > 0) for s in ep_scores])
    m["episode/count"] = float(len(episodes))
    m["episode/tool_calls_mean"] = _mean([_tool_calls(e) for e in episodes])
    m["episode/assistant_turns_mean"] = _mean([e.assistant_turns for e in episodes])
    m["episode/user_turns_mean"] = _mean([e.user_turns for e in episodes])
    m["episode/micro_steps_mean"] = _mean([e.steps for e in episodes])
    reasons = Counter(e.termination or "unknown" for e in episodes)
    for r, c in reasons.items():
        m[f"termination/{r}"] = c / max(1, len(episodes))
    for role in ROLES:
        idx = [i for i, g in enumerate(gens) if g.role == role]
        p = f"{role}/"
        m[p + "rows"] = float(len(idx))
        if not idx:
            continue
        rg = [gens[i] for i in idx]
        m[p + "reward_mean"] = _mean([float(scores[i]) for i in idx if gens[i].episode not in unscored])
        m[p + "response_len_mean"] = _mean([len(g.gen_ids) for g in rg])
        m[p + "response_len_max"] = float(max(len(g.gen_ids) for g in rg))
        m[p + "prompt_len_mean"] = _mean([len(g.prompt_ids) for g in rg])
        m[p + "empty_frac"] = _mean([float(len(g.gen_ids) == 0) for g in rg])
        m[p + "truncated_frac"] = _mean([float(g.finish_reason != "stop") for g in rg])
    return m


def logprob_mismatch(batch: TrainBatch, recomputed: np.ndarray) -> dict[str, float]:
    """Mean |sampler log-prob - trainer log-prob| over generated tokens, per role."""
    out = {}
    diff = np.abs(batch.old_logprobs - recomputed) * batch.loss_weights
    for role, rid in ROLE_ID.items():
        w = batch.loss_weights * (batch.role_ids[:, None] == rid)
        n = float(w.sum())
        if n > 0:
            out[f"{role}/logp_mismatch_sampler"] = float((diff * w).sum() / n)
            out[f"{role}/logp_mismatch_sampler_max"] = float((diff * (w > 0)).max())
    return out


def ppo_update(
    trainer: Trainer, batch: TrainBatch, *, epochs: int = 1, mini_batches: int = 1, shuffle: bool = True, **update_kw
) -> list[dict[str, float]]:
    """``epochs`` passes of ``mini_batches`` optimizer steps over ``batch`` (reference: 1 x 1); the
    metrics of each step. Mini-batch order is reshuffled per epoch from the trainer's step count.
    ``update_kw`` go to every ``Trainer.update`` (only given when set, so a Trainer-like object without
    them still works)."""
    out = []
    n = batch.size
    for ep in range(epochs):
        order = np.arange(n)
        if shuffle and mini_batches > 1:
            order = np.random.default_rng(trainer.step * 7919 + ep).permutation(n)
        for part in np.array_split(order, mini_batches):
            # Every process must take the same number of steps (each is a collective); a process
            # with no rows in this part contributes zero-weight padding rows.
            if len(part) or _process_count() > 1:
                out.append(trainer.update(batch.take(np.sort(part)), **update_kw))
    return out


def _process_count() -> int:
    import jax

    return jax.process_count()


def _sum_all_processes(x):
    """``x`` (a number or array) summed over JAX processes."""
    import jax

    if jax.process_count() == 1:
        return x
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(np.asarray(x))).sum(0)


def _rows_all_processes(n: int) -> int:
    """``n`` summed over JAX processes (the update is a collective: all take it or none)."""
    return int(_sum_all_processes(np.asarray(n, np.int64)))


def judge_metrics(
    episodes: Sequence[Episode], trained: np.ndarray, dropped_keys: int, masked: bool
) -> dict[str, float]:
    """``judge/*``: episodes that lost their judge (``lost_episodes``: counted in both settings), those
    masked out of the update, the rows given zero loss weight for it, and the (prompt, role) keys left
    with fewer than 2 judged episodes."""
    lost = lost_episodes(episodes)
    n = max(1, len(episodes))
    masked_eps = len(lost) if masked else 0
    return {
        "judge/lost_episodes": float(len(lost)),
        "judge/lost_share": len(lost) / n,
        "judge/masked_episodes": float(masked_eps),
        "judge/masked_share": masked_eps / n,
        "judge/masked_rows": float(np.sum(~trained)),
        "judge/dropped_groups": float(dropped_keys),
        "judge/failed_verdicts": float(sum(e.info.get("judge_failed_verdicts", 0) for e in episodes)),
    }


def _flat_key_rows(
    gens: Sequence[Generation],
    scores: np.ndarray,
    group_ids: np.ndarray,
    cfg: RLSection,
    trained: np.ndarray | None = None,
) -> np.ndarray:
    """Rows whose advantage is 0 in exact arithmetic although its float value may not be: their
    (prompt, role) key scored the same on every row and holds at least two units (rows; episodes for
    ``trajectory_mean``), so a mean baseline equals each score up to rounding (three 0.3s average to
    0.3 + 1e-8 in float32). Not for ``baseline="none"`` (the advantage is the score) or std-normalised
    advantages (rounding / (0 + eps) is what the faithful step trains on). Only ``trained`` rows count
    (the others are out of the baselines)."""
    flat = np.zeros((len(gens),), bool)
    if cfg.baseline == "none" or cfg.normalize_std:
        return flat
    keys: dict[tuple[int, int], list[int]] = {}
    for i, g in enumerate(gens):
        if trained is None or trained[i]:
            keys.setdefault((int(group_ids[i]), g.role_id), []).append(i)
    for rows in keys.values():
        units = len({gens[i].episode for i in rows}) if cfg.baseline == "trajectory_mean" else len(rows)
        if units >= 2 and np.ptp(scores[rows]) == 0:
            flat[rows] = True
    return flat


@dataclasses.dataclass
class StepResult:
    metrics: dict[str, float]
    episodes: list[Episode]
    rows: int


class RLStep:
    """Runs RL iterations with a rollout engine and one Trainer per trained role.

    ``trainers`` maps a role to the Trainer that learns from its rows; in shared modes both roles map
    to the same object (one optimizer step on the combined rows).
    """

    def __init__(
        self,
        cfg: RLSection,
        engine: RolloutEngine,
        trainers: Mapping[str, Trainer],
        *,
        pad_id: int = 0,
        seed: int = 0,
        after_update: Callable[[], None] | None = None,
        next_records: Callable[[], Sequence[Mapping[str, Any]]] | None = None,
    ):
        mode = engine.cfg.mode
        roles = tuple(TRAINED_ROLES[mode])
        missing = [r for r in roles if r not in trainers]
        if missing:
            raise ValueError(f"rollout.mode={mode!r} trains {roles} but no Trainer was given for {missing}")
        if mode != "noshare" and len({id(trainers[r]) for r in roles}) != 1:
            raise ValueError(f"rollout.mode={mode!r} shares one policy: give the same Trainer for {roles}")
        if mode == "noshare" and trainers[ACT] is trainers[REHEARSE]:
            raise ValueError("rollout.mode='noshare' needs two different Trainers for act and rehearse")
        if cfg.skip_zero_advantage_rows:
            for t in trainers.values():
                c = t.loss_cfg
                if c.kl_coef or c.entropy_coef:
                    raise ValueError(
                        "rl.skip_zero_advantage_rows needs loss.kl_coef = loss.entropy_coef = 0: rows "
                        f"without advantage still carry those terms (got {c.kl_coef}, {c.entropy_coef})"
                    )
        self.budgets = {ACT: engine.cfg.act.max_new_tokens, REHEARSE: engine.cfg.rehearse.max_new_tokens}
        if cfg.overlong_buffer:
            for role in roles:
                if cfg.overlong_buffer > self.budgets[role]:
                    raise ValueError(
                        f"rl.overlong_buffer={cfg.overlong_buffer} is wider than rollout.{role}.max_new_tokens="
                        f"{self.budgets[role]}: the penalty's slope must start inside the generation budget"
                    )
        self.cfg, self.engine = cfg, engine
        # rl.dynamic_sampling: where the step's extra batches of prompts come from (the run's data stream)
        self.next_records = next_records
        self.pad_id, self.seed = int(pad_id), int(seed)
        self.roles = roles
        self.trainers = {r: trainers[r] for r in roles}
        self._base_rollout = engine.cfg
        self.after_update = after_update

    def _release_sampler_weights(self) -> None:
        """Drops the samplers' prepared copies of the weights once the rollouts are done: the update is
        about to replace the weights, so the copy is stale anyway, and dropped here it stays out of the
        update's memory peak (one more copy of the layer weights: 2.4 GB at Qwen3-0.6B). The next rollout
        prepares the new weights once (``Sampler.prepare_weights``). A client without prepared weights
        (an HTTP judge, a test double) has no ``release_weights``."""
        for client in (self.engine.policy, getattr(self.engine, "simulator", None)):
            release = getattr(client, "release_weights", None)
            if release is not None:
                release()

    def _client_metrics(self) -> dict[str, float]:
        """What the clients report of themselves since the last step (``step_metrics``: a vLLM client's weight
        syncs); the simulator's under ``simulator/``."""
        out: dict[str, float] = {}
        for prefix, client in (("", self.engine.policy), ("simulator/", getattr(self.engine, "simulator", None))):
            take = getattr(client, "step_metrics", None)
            if take is not None:
                out.update({prefix + k: v for k, v in take().items()})
        return out

    def weights_changed(self) -> None:
        """Called after every update (and by the launcher after a restore): KV rows a client cached
        were computed with the old weights, so clients forget them; then ``after_update`` (e.g. the
        multi-process launcher's refresh of the sampler's parameter copy)."""
        if self.after_update is not None:
            self.after_update()
        for client in (self.engine.policy, getattr(self.engine, "simulator", None)):
            if client is not None and hasattr(client, "reset"):
                client.reset()

    def _nonzero_advantage_rows(
        self,
        trainer: Trainer,
        gens: Sequence[Generation],
        idx: list[int],
        adv: np.ndarray,
        scores: np.ndarray,
        group_ids: np.ndarray,
        trained: np.ndarray,
    ) -> tuple[list[int], dict[str, Any]]:
        """``rl.skip_zero_advantage_rows``: the rows of ``idx`` with an advantage (not 0, and not in a key
        that scored alike: ``_flat_key_rows``), and the update arguments that keep the optimizer step that
        of all of ``idx``: the loss count (and role-balanced unit counts) of all its rows, summed over
        processes. The step is still taken when no row is left (Adam's moments move the weights even at a
        zero gradient)."""
        c = trainer.loss_cfg
        flat = _flat_key_rows(gens, scores, group_ids, self.cfg, trained)
        count, role_counts = 0.0, np.zeros((len(ROLES),), np.float32)
        if idx:
            full = build_batch(
                [gens[i] for i in idx],
                adv[idx],
                group_ids[idx],
                max_len=self.cfg.max_row_length,
                pad_id=self.pad_id,
                length_multiple=self.cfg.length_multiple,
                trained=trained[idx],
            )
            count, role_counts = loss_count(full.loss_weights, c.agg, full.role_ids, c.role_balanced, len(ROLES))
        keep = [i for i in idx if trained[i] and adv[i] != 0.0 and not flat[i]]
        kw: dict[str, Any] = {
            "loss_count": float(_sum_all_processes(np.asarray(count, np.float64))),
            "skipped": len(idx) - len(keep),
        }
        if c.role_balanced:
            kw["role_counts"] = np.asarray(_sum_all_processes(role_counts), np.float32)
        return keep, kw

    def rollout(
        self,
        records: Sequence[Mapping[str, Any]],
        iteration: int,
        engine: RolloutEngine | None = None,
        round_index: int = 0,
    ) -> list[Episode]:
        """The step's episodes, played by ``engine`` (default: this step's own); rollout seeds depend on
        (seed, iteration, round_index) only (``round_index``: a dynamically sampled step's extra batches)."""
        engine = self.engine if engine is None else engine
        seed = (self.seed * 1_000_003 + iteration + round_index * 7_919_993) % (2**31 - 1)
        engine.cfg = dataclasses.replace(self._base_rollout, seed=seed)
        recs, uids = repeat_prompts(records, self.cfg.n_rollouts)
        return engine.run(recs, uids)

    def scored_rows(self, episodes: Sequence[Episode]) -> tuple[list[Generation], np.ndarray, np.ndarray]:
        """The rows of ``episodes``, their scores and which of them are trained, as the update computes them
        (before its faithful row duplication)."""
        gens = [g for e in episodes for g in e.generations]
        scores, trained, _, _ = self._scores_and_mask(episodes, gens)
        return gens, scores, trained

    def _scores_and_mask(self, episodes: Sequence[Episode], gens: Sequence[Generation]):
        """(scores, trained, keys dropped, lost episode ids) of ``gens``, rows of ``episodes``: ``row_scores``
        with this step's penalties, and the rows of episodes that lost their judge out of the loss and the
        baselines (``rl.mask_judge_failures``; faithful: trained)."""
        c = self.cfg
        scores = row_scores(
            gens,
            c.empty_output_penalty,
            overlong_buffer=c.overlong_buffer,
            overlong_factor=c.overlong_penalty,
            budgets=self.budgets,
        )
        lost = lost_episodes(episodes) if c.mask_judge_failures else set()
        trained, dropped_keys = np.ones((len(gens),), bool), 0
        if lost:
            keys = list(zip(_group_ids([g.uid for g in gens]).tolist(), [g.role_id for g in gens]))
            trained, dropped_keys = judge_mask([g.episode for g in gens], keys, lost)
        return scores, np.asarray(trained, bool), dropped_keys, lost

    def __call__(self, records: Sequence[Mapping[str, Any]], iteration: int) -> StepResult:
        if not self.cfg.dynamic_sampling:
            episodes = self.rollout(records, iteration)
            self._release_sampler_weights()
            return self.update(episodes, iteration)
        got = dynamic_sampling.collect(
            records,
            lambda recs, r: self.rollout(recs, iteration, round_index=r),
            self.scored_rows,
            self.next_records,
            self.roles,
            self.cfg.dynamic_sampling_max_rounds,
            count_all=lambda n: int(_sum_all_processes(np.asarray(n, np.int64))),
        )
        self._release_sampler_weights()
        result = self.update(got.episodes, iteration)
        result.metrics.update(got.metrics)
        return result

    def update(self, episodes: list[Episode], iteration: int, *, notify: bool = True) -> StepResult:
        """Everything of one iteration after its rollouts: scores, baselines, advantages and the update of each
        Trainer on ``episodes`` (the synchronous step runs it on its own rollouts; ``rl.async_pipeline`` on
        rollouts an earlier weights version sampled). ``notify``: then ``weights_changed`` (the pipeline, which
        refreshes its own rollout weights, passes False)."""
        cfg = self.cfg
        behaviour = cfg.behaviour_correction()
        gens = [g for e in episodes for g in e.generations]
        rng = np.random.default_rng([self.seed, iteration, 17])
        gens = adjust_batch_copy(gens, cfg.adjust_batch_multiple, rng)
        scores, trained, dropped_keys, lost = self._scores_and_mask(episodes, gens)
        # Advantages are per process: the n rollouts of a prompt (its GRPO group) never leave the
        # process that sampled them.
        group_ids = _group_ids([g.uid for g in gens])
        role_ids = np.asarray([g.role_id for g in gens], np.int32)
        episode_ids = np.asarray([g.episode for g in gens], np.int32)
        metrics = rollout_metrics(episodes, gens, scores, unscored=lost)
        metrics.update(judge_metrics(episodes, trained, dropped_keys, cfg.mask_judge_failures))
        metrics.update(self._client_metrics())
        if _rows_all_processes(len(gens)) == 0:
            metrics["update/skipped_no_rows"] = 1.0
            return StepResult(metrics, episodes, 0)

        adv = np.zeros((0,), np.float32)
        if gens:
            adv = np.asarray(
                role_wise_advantages(
                    scores,
                    group_ids,
                    role_ids,
                    baseline=cfg.baseline,
                    normalize_std=cfg.normalize_std,
                    episode_ids=episode_ids,
                    valid=trained,
                )
            )
            if trained.any():
                metrics.update(
                    advantage_stats(
                        adv[trained], scores[trained], group_ids[trained], role_ids[trained], role_names=ROLE_NAMES
                    )
                )

        # One update per distinct Trainer, on the rows of the roles it trains.
        by_trainer: dict[int, tuple[Trainer, list[str]]] = {}
        for role in self.roles:
            t = self.trainers[role]
            by_trainer.setdefault(id(t), (t, []))[1].append(role)
        rows = 0
        for trainer, roles in by_trainer.values():
            idx = [i for i, g in enumerate(gens) if g.role in roles]
            tag = "update" if len(by_trainer) == 1 else f"update_{'+'.join(roles)}"
            if cfg.dynamic_sampling:
                # DAPO: the rows of groups without a signal leave the update (and its normaliser)
                flat = dynamic_sampling.flat_groups(
                    [g.uid for g in gens], [g.role for g in gens], scores, trained, roles
                )
                keep = [i for i in idx if (gens[i].uid, gens[i].role) not in flat]
                metrics[f"{tag}/flat_group_rows_dropped"] = float(len(idx) - len(keep))
                idx = keep
            if cfg.overlong_rows == "drop":
                keep = [i for i in idx if len(gens[i].prompt_ids) + len(gens[i].gen_ids) <= cfg.max_row_length]
                metrics[f"{tag}/overlong_rows_dropped"] = float(len(idx) - len(keep))
                idx = keep
            if _rows_all_processes(len(idx)) == 0:
                metrics[f"{tag}/skipped_no_rows"] = 1.0
                continue
            # Every row masked (a judge outage): no update at all, rather than an Adam step on zero gradients.
            if cfg.mask_judge_failures and _rows_all_processes(int(trained[idx].sum())) == 0:
                metrics[f"{tag}/skipped_no_judged_rows"] = 1.0
                continue
            update_kw: dict[str, Any] = {}
            if cfg.skip_zero_advantage_rows:
                idx, update_kw = self._nonzero_advantage_rows(trainer, gens, idx, adv, scores, group_ids, trained)
                metrics[f"{tag}/zero_advantage_rows_skipped"] = float(update_kw.pop("skipped"))
            if cfg.old_logprobs_from_update:
                update_kw["old_from_update"] = True
            rows += len(idx)
            if idx:
                batch = build_batch(
                    [gens[i] for i in idx],
                    adv[idx],
                    group_ids[idx],
                    max_len=cfg.max_row_length,
                    pad_id=self.pad_id,
                    length_multiple=cfg.length_multiple,
                    trained=trained[idx],
                )
            else:  # other processes have rows: take part in the collective update with a zero-weight row
                batch = build_batch(
                    [Generation(roles[0], [self.pad_id], [], [], "", -1, 0)],
                    [0.0],
                    [0],
                    max_len=cfg.max_row_length,
                    pad_id=self.pad_id,
                    length_multiple=cfg.length_multiple,
                )
            metrics[f"{tag}/rows"] = float(len(idx))
            metrics[f"{tag}/truncated_prompt_rows"] = float(batch.truncated_rows)
            metrics[f"{tag}/seq_len"] = float(batch.tokens.shape[1])
            if behaviour != "none":
                # the sampler's log-probs are the behaviour policy's: kept beside the proximal ones below
                batch.behaviour_logprobs = batch.old_logprobs.copy()
                update_kw["behaviour"] = (behaviour, cfg.behaviour_is_cap)
            if cfg.recompute_old_logprobs and not cfg.old_logprobs_from_update:
                # The reference scores the batch with the pre-update policy and uses that as pi_old, so
                # the first PPO step starts at ratio 1 whatever the sampler's numerics were.
                fresh = trainer.compute_logprobs(batch)
                metrics.update(logprob_mismatch(batch, fresh))
                batch.old_logprobs = fresh.astype(np.float32)
            outs = ppo_update(trainer, batch, epochs=cfg.ppo_epochs, mini_batches=cfg.mini_batches, **update_kw)
            for k in sorted({k for o in outs for k in o}):
                vals = [o[k] for o in outs if k in o]
                metrics[f"{tag}/{k}"] = float(np.mean(vals))
            metrics[f"{tag}/optimizer_steps"] = float(len(outs))
        if notify:
            self.weights_changed()
        return StepResult(metrics, episodes, rows)


def build_rl_step(
    rl: RLSection,
    rollout: RolloutConfig,
    codec,
    policy,
    judge,
    trainers: Trainer | Mapping[str, Trainer],
    *,
    simulator=None,
    make_env: Callable[[dict], Any] | None = None,
    pad_id: int = 0,
    seed: int = 0,
    after_update: Callable[[], None] | None = None,
    next_records: Callable[[], Sequence[Mapping[str, Any]]] | None = None,
) -> RLStep:
    """An ``RLStep`` wired the one way the training loop (``rl.train``) and the demo both use it.

    ``policy`` / ``simulator`` are ``PolicyClient``s, ``judge`` the rollout's ``TurnJudge``. ``trainers``
    is one Trainer (the shared policy: it trains every role the mode trains) or a Trainer per trained
    role (``noshare``: two). ``next_records``: the data stream ``rl.dynamic_sampling`` draws extra prompts from.
    """
    engine = RolloutEngine(rollout, codec, policy, judge, simulator=simulator, make_env=make_env)
    if not isinstance(trainers, Mapping):
        trainers = {role: trainers for role in TRAINED_ROLES[rollout.mode]}
    return RLStep(rl, engine, trainers, pad_id=pad_id, seed=seed, after_update=after_update, next_records=next_records)
