"""Batched rollouts through the real Sampler + SamplerClient on a tiny random Qwen3 (our model, vocab =
the demo tokenizer): every mode completes, one sampler call per step mixes ACT and REHEARSE rows, and
KV-cache continuation gives the same greedy tokens as fresh prefill of the whole context."""

from __future__ import annotations

import numpy as np
import pytest

from envace_jax.envs.demo_worlds import make_env
from envace_jax.models import qwen3
from envace_jax.rl.judges import RuleJudge
from envace_jax.rl.policy_client import GenRequest, SamplerClient, role_mix, summary
from envace_jax.rl.reward import ChecklistTurnJudge
from envace_jax.rl.rollout import MODES, RoleSampling, RolloutConfig, RolloutEngine
from envace_jax.rl.types import ACT, REHEARSE, TERMINATION_REASONS
from envace_jax.sampling import Sampler, SamplingParams
from tests.helpers_rollout import FirstActScripted, codec, compact_codec, tasks_without_required_items

NEW = 24
CACHE = 1024


@pytest.fixture(scope="module")
def sampler():
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
    # One bucket per shape keeps the whole module on a handful of compiled programs.
    return Sampler(
        qwen3.init_model(cfg, seed=0),
        cache_size=CACHE,
        max_chunk=512,
        batch_buckets=(16,),
        length_buckets=(512,),
        window_buckets=(CACHE + 512,),
    )


def tasks_for_batch() -> list[dict]:
    out = tasks_without_required_items()
    assert sum(sum(m["role"] == "user" for m in t["reference_messages"]) > 1 for t in out) >= 1
    return out


def rollout(sampler, mode: str, *, temperature: float = 1.0, continuation: bool = True, max_steps: int = 5):
    c = compact_codec()
    tasks = tasks_for_batch()
    rs = RoleSampling(temperature=temperature, max_new_tokens=NEW)
    cfg = RolloutConfig(mode=mode, max_steps=max_steps, max_model_len=800, act=rs, rehearse=rs, seed=1)
    policy_client = SamplerClient(sampler, c.stop_token_ids, continuation=continuation)
    sim_client = SamplerClient(sampler, c.stop_token_ids, continuation=continuation)
    policy = FirstActScripted(policy_client, tasks, len(tasks) * 2)
    eng = RolloutEngine(
        cfg,
        c,
        policy,
        ChecklistTurnJudge(RuleJudge()),
        make_env=make_env,
        simulator=sim_client if mode in ("simulator", "noshare") else None,
    )
    eps = eng.run(tasks * 2, uids=[t["uid"] for t in tasks] * 2)
    eng.scripted_texts = policy.texts
    return eps, eng, policy_client, sim_client


@pytest.mark.parametrize("mode", MODES)
def test_batched_rollout_completes_in_every_mode(sampler, mode):
    eps, eng, pc, sc = rollout(sampler, mode)
    assert len(eps) == 8 and all(e.done and e.termination in TERMINATION_REASONS for e in eps)
    for e in eps:
        for g in e.generations:
            assert len(g.gen_ids) == len(g.logprobs) and all(lp <= 0.0 for lp in g.logprobs)
            assert len(g.gen_ids) <= NEW or g.text in eng.scripted_texts
            assert g.uid == e.uid and g.episode == e.episode_id
        assert -0.1 <= e.score <= 1.0
    rehearse_rows = sum(g.role == REHEARSE for e in eps for g in e.generations)
    steps = max(e.steps for e in eps)
    if mode == "real":
        assert rehearse_rows == 0
        assert any(m["role"] == "tool" for e in eps for m in e.messages)
    else:
        assert rehearse_rows > 0
    if mode in ("rehearsal", "caller_frozen"):
        # one client call per step, and the real sampler client saw both roles in one call
        assert len(eng.sampler_calls) <= steps
        assert any(a and r for a, r in role_mix(pc.calls)), role_mix(pc.calls)
        assert sc.calls == []
    elif mode in ("simulator", "noshare"):
        assert all(r == 0 for _, r in role_mix(pc.calls)) and all(a == 0 for a, _ in role_mix(sc.calls))
        assert sum(r for _, r in role_mix(sc.calls)) == rehearse_rows
    # the caller's cache was continued across turns, not re-prefilled
    assert summary(pc.calls)["continued"] > 0
    assert pc.cached_keys == []  # every episode released its row


def test_continuation_gives_the_same_greedy_rollout_as_fresh_prefill(sampler):
    a, _, pa, _ = rollout(sampler, "rehearsal", temperature=0.0, continuation=True)
    b, _, pb, _ = rollout(sampler, "rehearsal", temperature=0.0, continuation=False)
    ga = [(g.role, g.prompt_ids, g.gen_ids) for e in a for g in e.generations]
    gb = [(g.role, g.prompt_ids, g.gen_ids) for e in b for g in e.generations]
    assert ga == gb
    np.testing.assert_allclose(
        np.concatenate([g.logprobs for e in a for g in e.generations]),
        np.concatenate([g.logprobs for e in b for g in e.generations]),
        atol=1e-4,
    )
    sa, sb = summary(pa.calls), summary(pb.calls)
    assert sa["continued"] > 0 and sb["continued"] == 0
    assert sa["prefill_tokens"] < sb["prefill_tokens"]
    assert [e.termination for e in a] == [e.termination for e in b]


def _req(ids, role=ACT, key=None, new=NEW, episode=-1):
    return GenRequest(
        list(ids), role, RoleSampling(temperature=0.0, max_new_tokens=new), seed=0, cache_key=key, episode=episode
    )


def _fresh(sampler, contexts, new=NEW):
    stops = codec().stop_token_ids
    return sampler.generate(
        [list(c) for c in contexts], SamplingParams(temperature=0.0, max_new_tokens=new, stop_token_ids=stops)
    ).tokens


def test_client_rows_appear_park_and_disappear(sampler):
    rng = np.random.RandomState(0)
    V = sampler.cfg.vocab_size
    tok = lambda n: rng.randint(10, V, n).tolist()
    client = SamplerClient(sampler, codec().stop_token_ids)
    p = {k: tok(n) for k, n in [("a", 30), ("b", 12), ("c", 50)]}
    sim = tok(40)
    out1 = client.generate([_req(p["a"], key="a"), _req(sim, REHEARSE), _req(p["b"], key="b"), _req(p["c"], key="c")])
    assert [o.ids for o in out1] == _fresh(sampler, [p["a"], sim, p["b"], p["c"]])
    seen = {k: p[k] + o.ids for k, o in zip("abc", [out1[0], out1[2], out1[3]])}
    # call 2: c continues, d is new; a and b are parked (not asked for)
    c2, d = seen["c"] + tok(7), tok(20)
    out2 = client.generate([_req(d, key="d"), _req(c2, key="c"), _req(tok(5), REHEARSE)])
    assert [o.ids for o in out2[:2]] == _fresh(sampler, [d, c2])
    assert (client.calls[-1].continued, client.calls[-1].fresh, client.calls[-1].parked) == (1, 2, 2)
    # call 3: a continues after being parked; b was released and comes back with a prompt that is not an
    # extension (a fresh prefill); c's prompt diverges from what it holds (fresh too)
    client.release(["b"])
    a3 = seen["a"] + tok(4)
    b3 = p["b"] + tok(3)
    c3 = p["c"] + tok(9)
    out3 = client.generate([_req(b3, key="b"), _req(a3, key="a"), _req(c3, key="c")])
    assert [o.ids for o in out3] == _fresh(sampler, [b3, a3, c3])
    assert (client.calls[-1].continued, client.calls[-1].fresh, client.calls[-1].parked) == (1, 2, 1)
    client.release(["a", "b", "c", "d"])
    assert client.cached_keys == []
    with pytest.raises(ValueError, match="appears twice"):
        client.generate([_req(a3, key="x"), _req(b3, key="x")])
    with pytest.raises(ValueError, match="empty prompt"):
        client.generate([_req([], key="y")])


def test_client_falls_back_to_full_prefill_when_a_per_call_cache_is_outgrown(sampler):
    small = Sampler(sampler.model, batch_buckets=(1,), length_buckets=(64,), window_buckets=(192,))
    rng = np.random.RandomState(1)
    V = sampler.cfg.vocab_size
    client = SamplerClient(small, codec().stop_token_ids)
    p1 = rng.randint(10, V, 20).tolist()
    o1 = client.generate([_req(p1, key="k")])
    cap = client._state.capacity
    p2 = p1 + o1[0].ids + rng.randint(10, V, cap).tolist()  # no longer fits the first call's cache
    o2 = client.generate([_req(p2, key="k")])
    assert client.calls[-1].full_prefill and client.calls[-1].continued == 0
    assert o2[0].ids == _fresh(small, [p2])[0] and len(o2[0].ids) > 0
