"""DAPO in the RL step: dynamic sampling (flat (prompt, role) groups out, further prompt batches in) and the soft
overlong penalty, against hand-computed cases, with the real rollout engine and rule judge."""

from __future__ import annotations

import re

import numpy as np
import pytest

from envace_jax.config import RLSection, RoleSampling, RolloutConfig
from envace_jax.rl.dynamic_sampling import flat_groups, informative_uids
from envace_jax.rl.judges import RuleJudge
from envace_jax.rl.reward import ChecklistTurnJudge, overlong_penalty
from envace_jax.rl.rollout import RolloutEngine
from envace_jax.rl.step import RLStep, row_scores
from envace_jax.rl.types import ACT, REHEARSE, Generation
from tests.helpers_rollout import RecordingTrainer, ScriptedClient, codec, one_turn_record

# ---- the overlong penalty: DAPO eq. 13 by hand ---------------------------------------------------------------


def test_overlong_penalty_hand_cases():
    # budget L = 20, buffer 4: free up to 16 tokens, then -1/4 per token, -1 at 20
    assert overlong_penalty([0, 16, 17, 18, 20], 20, 4) == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty([21], 20, 4) == [-1.0]  # beyond the budget (a client that overran it)
    assert overlong_penalty([18, 18], [20, 30], 4, penalty=0.5) == [-0.25, 0.0]  # per-row budgets, a factor
    assert overlong_penalty([5, 20], 20, 0) == [0.0, 0.0]  # off
    assert overlong_penalty([20], 20, 20) == [-1.0] and overlong_penalty([10], 20, 20) == [-0.5]  # whole budget
    with pytest.raises(ValueError, match="wider than a generation budget"):
        overlong_penalty([1], 8, 9)
    with pytest.raises(ValueError, match="2 lengths but 1"):
        overlong_penalty([1, 2], [8], 2)


def _gen(role, uid, ep, n_tokens, score, text="x"):
    return Generation(role, [1, 2], list(range(3, 3 + n_tokens)), [-1.0] * n_tokens, uid, ep, 0, score=score, text=text)


def test_row_scores_add_the_overlong_penalty_per_role_budget():
    gens = [_gen(ACT, "a", 0, 9, 1.0), _gen(REHEARSE, "a", 0, 9, 1.0), _gen(ACT, "a", 1, 9, 0.5, text="")]
    out = row_scores(gens, 0.1, overlong_buffer=4, overlong_factor=1.0, budgets={ACT: 10, REHEARSE: 20})
    # ACT budget 10: 9 tokens is 3 into the buffer of 4 -> -0.75; REHEARSE budget 20: free; the empty row -0.1 too
    np.testing.assert_allclose(out, [0.25, 1.0, 0.5 - 0.1 - 0.75], atol=1e-6)
    with pytest.raises(ValueError, match="budgets"):
        row_scores(gens, 0.1, overlong_buffer=4)


def test_flat_groups_by_hand():
    uids = ["a", "a", "a", "b", "b", "c", "c", "d"]
    roles = [ACT, ACT, REHEARSE, ACT, ACT, ACT, ACT, ACT]
    scores = np.array([1.0, 1.0, 0.0, 0.5, 0.0, 0.3, 0.7, 1.0])
    trained = np.array([True, True, True, True, True, True, False, True])
    # a/act all 1 (flat); a/rehearse one row (flat); b/act 0.5 vs 0 (signal); c/act one trained row (flat); d one row
    assert flat_groups(uids, roles, scores, trained, (ACT, REHEARSE)) == {
        ("a", ACT),
        ("a", REHEARSE),
        ("c", ACT),
        ("d", ACT),
    }
    assert informative_uids(uids, roles, scores, trained, (ACT,)) == ["b"]
    # a role that is not trained is not looked at
    assert ("a", REHEARSE) not in flat_groups(uids, roles, scores, trained, (ACT,))


# ---- dynamic sampling in the real step -----------------------------------------------------------------------

N = 2  # rollouts per prompt
# per prompt, the reply of each of its two rollouts: "Hello." passes the checklist (score 1), "Bye." fails (0)
PLAN = {
    0: ("Hello.", "Hello."),  # flat: all pass
    1: ("Hello.", "Bye."),  # signal
    2: ("Bye.", "Bye."),  # flat: all fail
    3: ("Bye.", "Hello."),  # signal
    4: ("Hello.", "Bye."),  # signal
    5: ("Bye.", "Bye."),
}


def _record(k: int) -> dict:
    return one_turn_record(f"p{k}", f"task-p{k} hi?", rule={"type": "reply_contains", "values": ["Hello"]})


def _step(stream, max_rounds=3, **rl):
    c = codec()
    tok = c.renderer.tokenizer

    def script(req, n):
        k = int(re.search(r"task-p(\d+)", tok.decode(req.prompt_ids)).group(1))
        return PLAN[k][req.episode % N]

    sampling = RoleSampling(temperature=1.0, max_new_tokens=64)
    engine = RolloutEngine(
        RolloutConfig(mode="rehearsal", max_model_len=4096, act=sampling, rehearse=sampling),
        c,
        ScriptedClient(c, script),
        ChecklistTurnJudge(RuleJudge()),
    )
    trainer = RecordingTrainer()
    cfg = RLSection(n_rollouts=N, dynamic_sampling=True, dynamic_sampling_max_rounds=max_rounds, **rl)
    batches = iter(stream)
    step = RLStep(cfg, engine, {ACT: trainer, REHEARSE: trainer}, next_records=lambda: next(batches))
    return step, trainer


def test_flat_groups_are_replaced_by_fresh_prompts():
    """Batch [p0, p1]: p0's rollouts all pass (no signal), p1's differ. One more round draws [p1, p2, p3]: p1 is
    already in the step (left out), p2 is flat, p3 has a signal, which fills the batch of two. The update sees
    the rows of p1 and p3 only, with the row-mean advantages +-0.5."""
    step, trainer = _step([[_record(1), _record(2), _record(3)], [_record(4)]])
    res = step([_record(0), _record(1)], 0)
    m = res.metrics
    assert m["dynamic/rounds"] == 2 and m["dynamic/prompts_sampled"] == 4
    assert m["dynamic/prompts_kept"] == 2 and m["dynamic/batch_fill"] == 1.0
    assert sorted({e.uid for e in res.episodes}) == ["p1", "p3"]
    assert len({e.episode_id for e in res.episodes}) == 4  # the second round's ids moved past the first's
    b = trainer.batches[-1]
    assert b.size == 4
    np.testing.assert_allclose(sorted(b.advantages[: b.size]), [-0.5, -0.5, 0.5, 0.5], atol=1e-7)
    # p1's passing rollout is its first, p3's its second
    by_uid = {}
    for e in res.episodes:
        by_uid.setdefault(e.uid, []).append(e.score)
    assert by_uid == {"p1": [1.0, 0.0], "p3": [0.0, 1.0]}


def test_the_rounds_are_bounded_and_a_short_batch_still_trains():
    """Only flat prompts come after p1: after max_rounds extra rounds the step trains on the one prompt it has."""
    step, trainer = _step([[_record(2)], [_record(5)], [_record(0)]], max_rounds=2)
    res = step([_record(0), _record(1)], 0)
    assert res.metrics["dynamic/rounds"] == 3 and res.metrics["dynamic/prompts_sampled"] == 4
    assert res.metrics["dynamic/prompts_kept"] == 1 and res.metrics["dynamic/batch_fill"] == 0.5
    assert trainer.batches[-1].size == 2 and {e.uid for e in res.episodes} == {"p1"}


def test_a_batch_without_any_signal_takes_no_update():
    step, trainer = _step([], max_rounds=1)  # the stream is already empty: one round
    res = step([_record(0), _record(2)], 0)
    assert res.metrics["dynamic/rounds"] == 1 and res.metrics["dynamic/prompts_kept"] == 0
    assert trainer.batches == [] and res.metrics["update/skipped_no_rows"] == 1.0


def test_the_overlong_penalty_can_give_a_flat_group_a_signal():
    """p0's rollouts both pass; with a buffer as wide as the budget, the two replies' lengths differ ("Hello." and
    "Hello. Hello. Hello.") so their penalties, scores and advantages differ, and p0 stays in."""
    plan = dict(PLAN)
    PLAN[0] = ("Hello.", "Hello. Hello. Hello.")
    try:
        step, trainer = _step([], max_rounds=1, overlong_buffer=64)
        res = step([_record(0)], 0)
    finally:
        PLAN.clear()
        PLAN.update(plan)
    assert res.metrics["dynamic/prompts_kept"] == 1
    b = trainer.batches[-1]
    lens = [len(g.gen_ids) for e in res.episodes for g in e.generations]
    pens = [-n / 64 for n in lens]
    np.testing.assert_allclose(b.advantages[:2], np.array(pens) - np.mean(pens), atol=1e-6)


def test_config_errors_name_the_knob():
    with pytest.raises(ValueError, match="dynamic_sampling needs a group baseline"):
        RLSection(dynamic_sampling=True, baseline="none")
    with pytest.raises(ValueError, match="dynamic_sampling needs rl.max_staleness = 0"):
        RLSection(dynamic_sampling=True, max_staleness=1)
    with pytest.raises(ValueError, match="overlong_buffer=65 is wider than rollout.act.max_new_tokens=64"):
        _step([], overlong_buffer=65)
