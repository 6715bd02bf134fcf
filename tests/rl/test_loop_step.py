"""The RL step: prompt repetition, row scores, faithful row duplication, trained-role routing, and one
real iteration on a tiny random Qwen3 whose advantages match a hand computation."""

from __future__ import annotations


import numpy as np
import pytest

from tests import helpers_loop as h
from envace_jax.rl.step import RLStep, StepConfig, adjust_batch_copy, repeat_prompts, row_scores
from envace_jax.rl.types import ACT, REHEARSE, Generation


def _gen(role, uid, ep, n_tokens, score, text="x"):
    return Generation(role, [1, 2], list(range(3, 3 + n_tokens)), [-1.0] * n_tokens, uid, ep, 0, score=score, text=text)


def test_repeat_prompts_shares_uid_and_rejects_duplicates():
    recs, uids = repeat_prompts([{"uid": "a"}, {"uid": "b"}], 3)
    assert uids == ["a"] * 3 + ["b"] * 3 and recs[3]["uid"] == "b"
    with pytest.raises(ValueError, match="distinct"):
        repeat_prompts([{"uid": "a"}, {"uid": "a"}], 2)


def test_row_scores_penalise_only_empty_text():
    # empty means the decoded text: a row of only <|im_end|> (one id, no text) is empty; whitespace is not
    gens = [_gen(ACT, "u", 0, 3, 0.5), _gen(REHEARSE, "u", 0, 1, 0.5, text=""), _gen(ACT, "u", 1, 1, 0.0, text=" ")]
    np.testing.assert_allclose(row_scores(gens, 0.1), [0.5, 0.4, 0.0])


def test_adjust_batch_copy_pads_to_multiple_with_existing_rows():
    gens = [_gen(ACT, "u", i, 2, float(i)) for i in range(5)]
    out = adjust_batch_copy(gens, 8, np.random.default_rng(0))
    assert len(out) == 8 and out[:5] == gens and all(any(g is o for o in gens) for g in out[5:])
    assert adjust_batch_copy(gens, 5, np.random.default_rng(0)) == gens
    assert len(adjust_batch_copy(gens[:1], 4, np.random.default_rng(0))) == 4  # more copies than rows


class _Engine:
    """Only the attributes RLStep reads at construction."""

    def __init__(self, mode):
        from envace_jax.rl.rollout import RolloutConfig

        self.cfg = RolloutConfig(mode=mode)


def test_trainer_routing_is_checked_per_mode():
    a, b = object(), object()
    RLStep(StepConfig(), _Engine("rehearsal"), {ACT: a, REHEARSE: a})
    with pytest.raises(ValueError, match="same Trainer"):
        RLStep(StepConfig(), _Engine("rehearsal"), {ACT: a, REHEARSE: b})
    with pytest.raises(ValueError, match="two different Trainers"):
        RLStep(StepConfig(), _Engine("noshare"), {ACT: a, REHEARSE: a})
    with pytest.raises(ValueError, match=r"no Trainer was given for \['rehearse'\]"):
        RLStep(StepConfig(), _Engine("caller_frozen"), {ACT: a})
    assert RLStep(StepConfig(), _Engine("caller_frozen"), {REHEARSE: a}).roles == (REHEARSE,)


def test_one_iteration_advantages_match_hand_computation(tmp_path):
    from envace_jax.rl import train as rl_train

    # The resume and multi-host tests' config and shapes: their subprocesses reuse these programs.
    h.use_compile_cache()
    cfg = h.tiny_config(str(tmp_path), 1)
    run = rl_train.build_run(cfg)
    seen = {}
    real_update = run.trainers[ACT].update

    def spy(batch, kind="rl"):
        seen["batch"] = batch
        return real_update(batch, kind)

    run.trainers[ACT].update = spy
    sampler = run.step_fn.engine.policy.sampler
    res = run.step_fn(next(run.data), 0)
    run.ckpt.close()
    # The rollouts prepared the weights once; the step dropped that copy before the update replaced them.
    assert sampler.prepare_weights and sampler.stats.weight_preparations == 1 and sampler.prepared_weights is None
    gens = [g for e in res.episodes for g in e.generations]
    assert len(res.episodes) == 8 and all(g.role == ACT for g in gens) and len(gens) == 8
    scores = np.asarray([g.score - (0.1 if not g.text else 0.0) for g in gens])
    uids = [g.uid for g in gens]
    want = np.asarray([s - scores[[u == v for v in uids]].mean() for s, u in zip(scores, uids)])
    np.testing.assert_allclose(seen["batch"].advantages, want, atol=1e-6)
    # old log-probs were recomputed by the trainer: the first PPO step starts at ratio 1
    assert res.metrics["update/ratio"] == pytest.approx(1.0, abs=1e-5)
    # Rows fit max_row_length (none dropped or truncated): the sampler's log-probs are the trainer's.
    assert res.metrics["update/overlong_rows_dropped"] == 0 and res.metrics["update/truncated_prompt_rows"] == 0
    assert res.metrics["act/logp_mismatch_sampler_max"] < 1e-5
    assert res.metrics["act/rows"] == 8 and res.metrics["rehearse/rows"] == 0
    assert sum(v for k, v in res.metrics.items() if k.startswith("termination/")) == pytest.approx(1.0)


def test_shared_prompts_in_the_rollouts_and_the_update_score_what_the_sampler_drew(tmp_path):
    """rl.share_prompt_prefixes: the rollouts write each prompt once and the update runs it once per group,
    and the trainer's log-probs of the sampled tokens are still the sampler's."""
    from envace_jax.rl import train as rl_train

    cfg = h.tiny_config(str(tmp_path), 1, **{"rl.share_prompt_prefixes": True})
    run = rl_train.build_run(cfg)
    sampler = run.step_fn.engine.policy.sampler
    assert sampler.share_prompts and run.trainers[ACT].share_prefixes
    seen = {}
    real_update = run.trainers[ACT].update

    def spy(batch, kind="rl"):
        seen["plans"] = [("full_index" in mb) for mb in run.trainers[ACT]._local_micro_batches(batch)]
        return real_update(batch, kind)

    run.trainers[ACT].update = spy
    res = run.step_fn(next(run.data), 0)
    run.ckpt.close()
    gens = [g for e in res.episodes for g in e.generations]
    # 2 prompts x 4 rollouts: only the 2 distinct prompts were written, and the update shared them.
    assert sampler.stats.prefill_tokens == sum(len(p) for p in {tuple(g.prompt_ids) for g in gens})
    assert seen["plans"] and all(seen["plans"])
    assert res.metrics["act/logp_mismatch_sampler_max"] < 1e-5


@pytest.mark.parametrize("penalty", [0.25, 0.0])
def test_empty_output_penalty_rollout_and_step_together(penalty):
    """Reference spec 4.3: every row of an episode gets the episode's score, and a row whose decoded output
    is empty (the sampler emitted only <|im_end|>) loses ``rl.empty_output_penalty``, once; 0 turns it off.

    Two rollouts of one prompt both pass the checklist (score 1); the first answers with empty text. The
    ACT rows' scores are (1 - penalty, 1), so the row-mean baseline gives advantages (-penalty/2, +penalty/2)."""
    from envace_jax.config import RLSection, RoleSampling, RolloutConfig
    from envace_jax.rl.judges import RuleJudge
    from envace_jax.rl.reward import ChecklistTurnJudge
    from envace_jax.rl.rollout import RolloutEngine
    from tests.helpers_rollout import RecordingTrainer, ScriptedClient, codec, one_turn_record

    c = codec()
    rec = one_turn_record("p0", rule={"type": "reply_contains", "values": [""]})
    client = ScriptedClient(c, acts={0: [""], 1: ["<think>\nhi\n</think>\n\nHello."]})
    sampling = RoleSampling(temperature=1.0, max_new_tokens=64)
    engine = RolloutEngine(
        RolloutConfig(mode="rehearsal", max_model_len=4096, act=sampling, rehearse=sampling),
        c,
        client,
        ChecklistTurnJudge(RuleJudge()),
    )
    trainer = RecordingTrainer()
    step = RLStep(RLSection(n_rollouts=2, empty_output_penalty=penalty), engine, {ACT: trainer, REHEARSE: trainer})
    res = step([rec], 0)
    gens = [g for e in res.episodes for g in e.generations]
    assert [e.score for e in res.episodes] == [1.0, 1.0]
    assert gens[0].text == "" and gens[0].gen_ids == [c.renderer.im_end_id] and gens[1].text.endswith("Hello.")
    b = trainer.batches[-1]
    np.testing.assert_allclose(b.advantages[: b.size], [-penalty / 2, penalty / 2], atol=1e-7)
    assert res.metrics["act/reward_mean"] == pytest.approx(1.0 - penalty / 2)
