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


def test_per_tool_outcomes_of_the_used_steps():
    """Per tool, what each used imagined step predicted against what the replayed tool did (the four steps of
    the first test, classed there by hand), and nothing from a rehearsal whose memory was not placed."""
    four = _trace(
        1,
        _step("transfer", W60, '{"error": "over the limit"}'),  # refused, refused
        _step("transfer", W40, '{"amount": 40, "fee": 2, "from": "ana", "status": "ok", "to": "ben"}'),  # exact
        _step("get_balance", {"account": "ana"}, '{"account": "ana", "balance": 50}'),  # ok, ok (real: 6)
        _step("transfer", {"from_account": "ana", "to_account": "ben", "amount": 5}, '{"status": "ok"}'),  # ok, refused
    )
    unused = _trace(1, _step("close_account", {"account": "ana"}, '{"error": "no such account"}'))
    task2 = dict(TASK, uid="t2")
    run = RehearsalRun(
        RehearsalConfig(n=1), [], [TaskRehearsal("t1", "memory", [four], []), TaskRehearsal("t2", "", [unused], [])]
    )
    split = F.fidelity_split(run, [TASK, task2], make_env)
    assert split["by_tool"] == {
        "get_balance": {"ok->ok": 1, "ok->refused": 0, "refused->ok": 0, "refused->refused": 0, "exact": 0},
        "transfer": {"ok->ok": 1, "ok->refused": 1, "refused->ok": 0, "refused->refused": 1, "exact": 1},
    }
    assert sum(sum(c[k] for k in F.OUTCOMES) for c in split["by_tool"].values()) == sum(split["used"].values())
    # the steps where either side failed, by their masked reasons (most frequent first, then by name)
    assert split["reasons"] == [
        ["transfer", "ok", "insufficient funds in '…'; fee of # charged", 1],
        ["transfer", "over the limit", "over the limit of #; fee of # charged", 1],
    ]
    assert F.reason_table(split["reasons"]).splitlines()[2] == (
        "| transfer | ok | insufficient funds in '…'; fee of # charged | 1 |"
    )
    lines = F.outcome_table(split["by_tool"]).splitlines()
    assert lines[2:] == ["| get_balance | 1 | 1 | 0 | 0 | 0 | 0 |", "| transfer | 3 | 1 | 1 | 0 | 1 | 1 |"]


def test_reasons_mask_names_and_numbers_and_name_simulator_verdicts():
    assert F.reason('{"amount": 3}', False) == "ok"
    assert F.reason('{"error": "unknown account \'zed\' after 12.5 s"}', True) == "unknown account '…' after # s"
    verdict = '{"error_tool_call": {"code": "SIMULATOR_FORMAT", "message": "no JSON"}}'
    assert F.reason(verdict, True) == "error_tool_call: SIMULATOR_FORMAT"
    assert F.reason("x" * 80, True) == "x" * 59 + "…"
