"""The rolling batch: ``Sampler(min_done=...)`` returns early with rows still running, the
``RollingSamplerClient`` refills finished rows' slots with waiting requests, and the rolling engine
plays the same greedy episodes as lockstep; all on a tiny random Qwen3 with the real sampler."""

from __future__ import annotations

import numpy as np
import pytest

from envace_jax.envs.demo_worlds import make_env
from envace_jax.models import qwen3
from envace_jax.rl.judges import RuleJudge
from envace_jax.rl.policy_client import GenRequest, SamplerClient
from envace_jax.rl.reward import ChecklistTurnJudge
from envace_jax.rl.rolling_client import RollingSamplerClient
from envace_jax.rl.rollout import RoleSampling, RolloutConfig, RolloutEngine
from envace_jax.rl.types import ACT, REHEARSE
from envace_jax.sampling import Sampler, SamplingParams
from tests.helpers_rollout import (
    FirstActScripted,
    FirstActScriptedStreaming,
    codec,
    compact_codec,
    tasks_without_required_items,
)

CACHE = 1024


@pytest.fixture(scope="module")
def model():
    c = codec()
    cfg = qwen3.Qwen3Config(
        vocab_size=len(c.renderer.tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
    )
    return qwen3.init_model(cfg, seed=0)


def _sampler(model, batch=4):
    return Sampler(
        model,
        cache_size=CACHE,
        max_chunk=512,
        batch_buckets=(batch,),
        length_buckets=(64, 512),
        window_buckets=(CACHE + 512,),
    )


def _prompts(model, lengths, seed=0):
    rng = np.random.RandomState(seed)
    return [rng.randint(10, model.config.vocab_size, n).tolist() for n in lengths]


def _req(ids, new, temperature=0.0, seed=0, role=ACT, key=None):
    return GenRequest(
        list(ids), role, RoleSampling(temperature=temperature, max_new_tokens=new), seed=seed, cache_key=key
    )


def test_sampler_returns_early_and_running_rows_continue_their_stream(model):
    # Rows of one call, sampled at T=1: stop after 2 of 4 rows are done, then continue the others with
    # nothing appended. Every row must read exactly what one uninterrupted call gives it.
    s = _sampler(model)
    prompts = _prompts(model, [7, 30, 12, 3])
    news = [3, 20, 6, 14]
    ps = [SamplingParams(temperature=1.0, max_new_tokens=n, seed=40 + i) for i, n in enumerate(news)]
    ref = s.generate(prompts, ps)
    out = s.generate(prompts, ps, return_state=True, min_done=2)
    assert out.finish_reasons[0] == out.finish_reasons[2] == "length"
    assert out.finish_reasons[1] == out.finish_reasons[3] == "running" and out.lengths[1] == 6
    tokens = {i: list(out.tokens[i]) for i in range(4)}
    lps = {i: list(out.logprobs[i]) for i in range(4)}
    state, pos = out.state, {1: 1, 3: 3}  # request -> its row in `state`
    while pos:
        order = list(pos)
        more = [SamplingParams(temperature=1.0, max_new_tokens=news[r] - len(tokens[r]), seed=0) for r in order]
        out = s.continue_(state, [[] for _ in order], more, rows=[pos[r] for r in order], return_state=True, min_done=1)
        state, pos = out.state, {}
        for i, r in enumerate(order):
            tokens[r] += out.tokens[i]
            lps[r] += out.logprobs[i]
            if out.finish_reasons[i] == "running":
                pos[r] = i
    assert [tokens[i] for i in range(4)] == ref.tokens
    np.testing.assert_allclose(np.concatenate([lps[i] for i in range(4)]), np.concatenate(ref.logprobs), atol=1e-5)
    with pytest.raises(ValueError, match="min_done"):
        s.generate(prompts, ps, min_done=0)


def test_rolling_client_greedy_equals_one_generation_per_request(model):
    s = _sampler(model)
    prompts = _prompts(model, [5, 40, 9, 22, 3, 17, 30], seed=1)
    news = [4, 24, 9, 16, 3, 24, 12]
    reqs = [_req(p, n) for p, n in zip(prompts, news)]
    client = RollingSamplerClient(s, codec().stop_token_ids, slots=3, refill=0.34)
    outs = client.generate(reqs)
    rolling_use = s.stats.utilisation
    stops = codec().stop_token_ids
    for p, n, o in zip(prompts, news, outs):
        ref = s.generate([p], SamplingParams(temperature=0.0, max_new_tokens=n, stop_token_ids=stops))
        assert o.ids == ref.tokens[0] and o.finish_reason == ref.finish_reasons[0]
        np.testing.assert_allclose(o.logprobs, ref.logprobs[0], atol=1e-5)
    assert all(c.rows[ACT] <= 3 for c in client.calls)
    assert client.open_requests == 0
    # Slots were refilled while other rows still ran (rows neither fresh nor resumed are running ones
    # carried over), and the slots were better used than by lockstep groups of 3, each decoding to
    # its longest row.
    assert sum(c.rows[ACT] - c.fresh - c.continued for c in client.calls) > 0
    lock = _sampler(model)
    for g in range(0, 7, 3):
        SamplerClient(lock, stops).generate(reqs[g : g + 3])
    assert rolling_use > lock.stats.utilisation


def test_eager_refill_returns_before_the_longest_row_with_nothing_waiting(model):
    # Three requests of 4, 12 and 24 new tokens fill the 3 slots, nothing waits. Without eager refill
    # the call decodes until the 24-token row ends; with it, the call returns once ceil(0.3 x 3) = 1
    # row (the 4-token one) is done, the others report nothing yet and finish in later calls with the
    # tokens one call would have given them. No stop token can be sampled, so rows run to their budget.
    prompts = _prompts(model, [6, 9, 5], seed=3)
    news = [4, 12, 24]
    outs, steps = {}, {}
    for eager in (False, True):
        client = RollingSamplerClient(_sampler(model), [10**6], slots=3, refill=0.3, eager_refill=eager)
        tickets = client.submit([_req(p, n) for p, n in zip(prompts, news)])
        first = client.step()
        steps[eager] = [t for t, _, _ in first]
        got = {t: o for t, _, o in first}
        while client.open_requests:
            got.update({t: o for t, _, o in client.step()})
        outs[eager] = [got[t] for t in tickets]
    assert sorted(steps[False]) == [0, 1, 2] and steps[True] == [0]
    for a, b in zip(outs[False], outs[True]):
        assert a.ids == b.ids and len(a.ids) in news
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_rolling_client_continues_a_finished_row_of_its_key(model):
    s = _sampler(model)
    client = RollingSamplerClient(s, codec().stop_token_ids, slots=4)
    p = _prompts(model, [20], seed=2)[0]
    (o1,) = client.generate([_req(p, 6, key="k")])
    p2 = p + o1.ids + _prompts(model, [9], seed=3)[0]
    (o2,) = client.generate([_req(p2, 8, key="k")])
    assert client.calls[-1].continued == 1 and client.calls[-1].prefill_tokens == 9
    ref = s.generate([p2], SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=codec().stop_token_ids))
    assert o2.ids == ref.tokens[0]
    with pytest.raises(ValueError, match="cache_size"):
        RollingSamplerClient(Sampler(model), codec().stop_token_ids)


def _rollout(model, rolling: bool, temperature: float = 0.0):
    c = compact_codec()
    tasks = tasks_without_required_items()
    rs = RoleSampling(temperature=temperature, max_new_tokens=24)
    cfg = RolloutConfig(mode="rehearsal", max_steps=5, max_model_len=800, act=rs, rehearse=rs, seed=1, rolling=rolling)
    s = _sampler(model, batch=8)
    if rolling:
        policy = FirstActScriptedStreaming(RollingSamplerClient(s, c.stop_token_ids, slots=4), tasks, len(tasks) * 2)
    else:
        policy = FirstActScripted(SamplerClient(s, c.stop_token_ids), tasks, len(tasks) * 2)
    eng = RolloutEngine(cfg, c, policy, ChecklistTurnJudge(RuleJudge()), make_env=make_env)
    assert eng.rolling == rolling
    return eng.run(tasks * 2, uids=[t["uid"] for t in tasks] * 2), eng, s


def test_rolling_engine_plays_the_same_greedy_episodes_as_lockstep(model):
    a, _, _ = _rollout(model, rolling=False)
    b, eng, _ = _rollout(model, rolling=True)
    assert [(e.termination, e.steps, e.score) for e in a] == [(e.termination, e.steps, e.score) for e in b]
    ga = [(g.role, g.prompt_ids, g.gen_ids, g.turn) for e in a for g in e.generations]
    gb = [(g.role, g.prompt_ids, g.gen_ids, g.turn) for e in b for g in e.generations]
    assert ga == gb and any(g[0] == REHEARSE for g in ga)
    assert max(c[ACT] + c[REHEARSE] for c in eng.sampler_calls) <= 4  # never more rows than slots


def test_running_rows_carry_their_logits_and_write_nothing(model):
    # A row still generating when the call returns has fed its last token: the next call decodes on
    # from the logits it carries, writing nothing (no prefill token). It may also sit out a call
    # (max_new_tokens=0) and keep them, or take appended tokens after what it generated. Every path
    # must give the tokens of one uninterrupted greedy generation of the same text.
    s = _sampler(model)
    prompts = _prompts(model, [11, 25], seed=5)
    greedy = lambda n: SamplingParams(temperature=0.0, max_new_tokens=n)
    out = s.generate(prompts, [greedy(2), greedy(12)], return_state=True, min_done=1)
    assert out.finish_reasons == ["length", "running"] and out.lengths == [2, 2]
    st = out.state
    assert st.carried.tolist() == [False, True] and st.pending[1] == -1 and st.pending[0] >= 0
    assert st.ends[1] == 25 + 2  # both generated tokens are in the cache
    before = s.stats.prefill_tokens
    out2 = s.continue_(st, [[]], [greedy(0)], rows=[1], return_state=True)  # sits out
    assert out2.lengths == [0] and out2.state.carried.tolist() == [True]
    out3 = s.continue_(out2.state, [[]], [greedy(10)], rows=[0], return_state=True, min_done=1)
    assert s.stats.prefill_tokens == before  # neither call wrote a token
    ref = s.generate([prompts[1]], greedy(12))
    assert out.tokens[1] + out3.tokens[0] == ref.tokens[0]
    np.testing.assert_allclose(out.logprobs[1] + out3.logprobs[0], ref.logprobs[0], atol=1e-5)
    # Appending to a row that was still running: its tokens so far, then the appended ones.
    out = s.generate(prompts, [greedy(2), greedy(12)], return_state=True, min_done=1)
    extra = _prompts(model, [7], seed=6)[0]
    out4 = s.continue_(out.state, [extra], [greedy(6)], rows=[1])
    ref = s.generate([prompts[1] + out.tokens[1] + extra], greedy(6))
    assert out4.tokens[0] == ref.tokens[0]
    # A row whose last tokens were written without decoding (max_new_tokens=0) holds neither a pending
    # token nor logits: continuing it with nothing appended is refused instead of decoding from zeros.
    out = s.generate([prompts[0]], greedy(3), return_state=True)
    out5 = s.continue_(out.state, [extra], [greedy(0)], return_state=True)
    assert out5.state.pending[0] == -1 and not out5.state.carried[0]
    with pytest.raises(ValueError, match=r"rows \[0\] append nothing"):
        s.continue_(out5.state, [[]], [greedy(4)])


@pytest.mark.parametrize("rolling", [False, True])
def test_client_release_weights_drops_the_prepared_copy_and_keeps_cached_rows(model, rolling):
    s = _sampler(model)
    stops = codec().stop_token_ids
    client = RollingSamplerClient(s, stops, slots=4) if rolling else SamplerClient(s, stops)
    p = _prompts(model, [12], seed=5)[0]
    (o1,) = client.generate([_req(p, 5, key="k")])
    assert s.prepared_weights is not None and s.stats.weight_preparations == 1
    client.release_weights()
    assert s.prepared_weights is None
    # The cached row survives (the call appends 4 tokens to it); the weights are prepared once again.
    p2 = p + o1.ids + _prompts(model, [4], seed=6)[0]
    (o2,) = client.generate([_req(p2, 5, key="k")])
    assert client.calls[-1].continued == 1 and s.stats.weight_preparations == 2
    ref = s.generate([p2], SamplingParams(temperature=0.0, max_new_tokens=5, stop_token_ids=stops))
    assert o2.ids == ref.tokens[0]
