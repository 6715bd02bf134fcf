"""Judging that streams (``rollout.judge_streaming="on"``): ended turns go to the judge while other episodes
generate, verdicts take effect at fixed points, so what the engine does never depends on the judge's latency."""

from __future__ import annotations

import random
import threading
import time

import pytest

from envace_jax.rl.judge_stream import JudgeStream
from envace_jax.rl.judges import RuleJudge
from envace_jax.rl.reward import ChecklistTurnJudge
from envace_jax.rl.rollout import RoleSampling, RolloutConfig, RolloutEngine
from envace_jax.rl.types import State
from tests.helpers_rollout import ScriptedClient, act_texts, codec, demo_tasks, rehearse_texts

RS = RoleSampling(temperature=1.0, max_new_tokens=512)


class SlowJudge:
    """The rule judge behind a delay drawn per call (``delays``: a seeded generator of seconds); logs when each
    call ran, so a test can see what the engine did meanwhile."""

    def __init__(self, delays, log):
        self.inner, self.delays, self.log = ChecklistTurnJudge(RuleJudge()), delays, log
        self.lock = threading.Lock()

    def __call__(self, episodes):
        with self.lock:
            delay = next(self.delays)
        t0 = time.perf_counter()
        time.sleep(delay)
        out = self.inner(episodes)
        self.log.append(("judge", t0, time.perf_counter()))
        return out


class LoggedClient(ScriptedClient):
    def __init__(self, *a, log, **kw):
        super().__init__(*a, **kw)
        self.log = log

    def generate(self, requests):
        t0 = time.perf_counter()
        out = super().generate(requests)
        self.log.append(("call", t0, time.perf_counter()))
        return out


def _run(tasks, streaming: str, delays):
    log: list = []
    c = codec()
    client = LoggedClient(
        c,
        acts={i: act_texts(t) for i, t in enumerate(tasks)},
        rehearsals={i: rehearse_texts(t) for i, t in enumerate(tasks)},
        log=log,
    )
    cfg = RolloutConfig(mode="rehearsal", max_model_len=8192, act=RS, rehearse=RS, judge_streaming=streaming)
    eng = RolloutEngine(cfg, c, client, SlowJudge(delays, log))
    eps = eng.run(list(tasks))
    calls = [[(r.episode, r.role, tuple(r.prompt_ids), r.seed) for r in call] for call in client.requests]
    return eps, calls, log, eng


def _delays(seed, scale):
    rng = random.Random(seed)
    while True:
        yield rng.uniform(0, scale)


def _outcome(eps):
    return [(e.termination, e.score, e.messages, [(g.role, g.gen_ids) for g in e.generations]) for e in eps]


def test_streaming_plays_the_same_episodes_and_overlaps_the_judge():
    # tasks of different lengths: multi-call and multi-turn ones beside one-call ones
    tasks = list(demo_tasks()[:8])
    sync, _, _, _ = _run(tasks, "off", _delays(0, 0.0))
    a, calls_a, log_a, eng = _run(tasks, "on", _delays(1, 0.15))
    b, calls_b, _, _ = _run(tasks, "on", _delays(2, 0.02))
    # every episode ends as in the synchronous engine (a verdict only waits, it never changes)
    assert _outcome(a) == _outcome(sync)
    assert all(e.score == 1.0 for e in a)
    # the same sampler calls, row for row and seed for seed, whatever the judge's latency
    assert calls_a == calls_b
    # some sampler call ran while a verdict was being written
    judged = [(t0, t1) for kind, t0, t1 in log_a if kind == "judge"]
    starts = [t0 for kind, t0, _ in log_a if kind == "call"]
    assert any(j0 < c0 < j1 for j0, j1 in judged for c0 in starts)
    assert eng.timing["judge_wait_s"] >= 0.0 and eng.timing["generate_s"] > 0.0


def test_streamed_episode_counts_its_own_micro_steps():
    tasks = list(demo_tasks()[:8])
    sync, calls_sync, _, _ = _run(tasks, "off", _delays(0, 0.0))
    streamed, calls, _, _ = _run(tasks, "on", _delays(3, 0.01))
    assert [e.steps for e in streamed] == [e.steps for e in sync]
    # the seed of each request is that of the same request in the synchronous engine
    seeds = lambda cs: sorted((ep, role, prompt, seed) for c in cs for ep, role, prompt, seed in c)
    assert seeds(calls) == seeds(calls_sync)
    # but the calls are composed differently: an episode with the judge sits out a call
    assert len(calls) > len(calls_sync)


def test_step_cap_with_streaming():
    tasks = list(demo_tasks()[:4])
    c = codec()
    client = ScriptedClient(
        c,
        acts={i: act_texts(t) for i, t in enumerate(tasks)},
        rehearsals={i: rehearse_texts(t) for i, t in enumerate(tasks)},
    )
    cfg = RolloutConfig(mode="rehearsal", max_model_len=8192, act=RS, rehearse=RS, judge_streaming="on", max_steps=2)
    eps = RolloutEngine(cfg, c, client, ChecklistTurnJudge(RuleJudge())).run(tasks)
    assert all(e.steps <= 2 for e in eps)
    assert {e.termination for e in eps} <= {"step_cap", "completed", "required_item_failed", "no_next_user"}
    assert any(e.termination == "step_cap" for e in eps)


def test_judge_stream_hands_verdicts_back_at_the_next_tick():
    class E:
        def __init__(self, i):
            self.episode_id, self.state = i, State.INTERACTING

    gate = threading.Event()

    def judge(eps):
        gate.wait(5)
        return [e.episode_id * 10 for e in eps]

    with JudgeStream(judge, workers=2) as s:
        s.submit([E(1), E(2)], tick=0)
        s.submit([E(3)], tick=1)
        assert s.waiting(1) and s.pending
        with pytest.raises(RuntimeError, match="already waiting"):
            s.submit([E(1)], tick=1)
        assert s.due(0) == []  # nothing submitted before tick 0
        gate.set()
        got = s.due(1)  # waits for tick 0's call only
        assert [(e.episode_id, v) for e, v in got] == [(1, 10), (2, 20)]
        assert not s.waiting(1) and s.waiting(3)
        assert [(e.episode_id, v) for e, v in s.due(2)] == [(3, 30)]
        assert not s.pending


def test_a_judge_that_fails_raises_in_the_engine():
    def broken(eps):
        raise ConnectionError("judge down")

    with JudgeStream(broken) as s:

        class E:
            episode_id = 0

        s.submit([E()], 0)
        with pytest.raises(ConnectionError, match="judge down"):
            s.due(1)
