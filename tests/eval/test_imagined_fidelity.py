"""Imagined responses against the real tool's, the calls replayed in order on a fresh world (hand-made
rehearsals of a wire task, classes computed by hand)."""

from __future__ import annotations

from envace_jax.envs.demo_worlds import make_env
from envace_jax.eval import imagined_fidelity as F
from envace_jax.eval.rehearsal import RehearsalConfig, RehearsalRun, RehearsalTrace, StepTrace, TaskRehearsal

TASK = {"uid": "t1", "env": {"name": "wire", "state": {"accounts": {"ana": 50, "ben": 0}}}}


def _step(name, args, response):
    return StepTrace(1, name, args, response, '"error"' in response)


def _trace(index, *steps):
    return RehearsalTrace(index, list(steps), "done", "answered", None)


W60 = {"from_account": "ana", "to_account": "ben", "amount": 60}
W40 = {"from_account": "ana", "to_account": "ben", "amount": 40}


def test_each_imagined_step_is_classed_against_the_replayed_real_one():
    trace = _trace(
        1,
        # real: over the limit (fee charged, ana 48): the imagined text differs, the outcome agrees
        _step("transfer", W60, '{"error": "over the limit"}'),
        # real: ana 48 - 2 = 46 >= 40, so it goes through; the imagined payload is the real one
        _step("transfer", W40, '{"amount": 40, "fee": 2, "from": "ana", "status": "ok", "to": "ben"}'),
        # real: ana has 6 now; an imagined 50 is another payload of the same (successful) outcome
        _step("get_balance", {"account": "ana"}, '{"account": "ana", "balance": 50}'),
        # real: 6 - 2 = 4 < 5, refused; imagined as a success: the wrong outcome
        _step("transfer", {"from_account": "ana", "to_account": "ben", "amount": 5}, '{"status": "ok"}'),
    )
    assert F.replay_trace(TASK, trace, make_env) == ["same_outcome", "exact", "same_outcome", "wrong_outcome"]
    # the replay had its own world: a second replay gives the same classes
    assert F.replay_trace(TASK, trace, make_env) == ["same_outcome", "exact", "same_outcome", "wrong_outcome"]


def test_split_counts_used_rehearsals_apart_from_all():
    exact = _trace(1, _step("get_balance", {"account": "ana"}, '{"account":"ana","balance":50}'))
    wrong = _trace(1, _step("transfer", W60, '{"amount": 60, "status": "ok"}'))
    task2 = dict(TASK, uid="t2")
    run = RehearsalRun(
        RehearsalConfig(n=1),
        [],
        [TaskRehearsal("t1", "Rehearsal memory: ...", [exact], []), TaskRehearsal("t2", "", [wrong], [])],
    )
    split = F.fidelity_split(run, [TASK, task2], make_env)
    assert split["used"] == {"exact": 1, "same_outcome": 0, "wrong_outcome": 0}
    assert split["all"] == {"exact": 1, "same_outcome": 0, "wrong_outcome": 1}
    assert split["used_share"]["exact"] == 1.0 and split["tasks_used"] == 1
