"""A Qwen3-MoE policy through sampling, batching and the update: the sampler's routing record, where build_batch
puts it, routing replay, the load-balancing loss in the update, and the refusals around them."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from envace_jax.config import LossConfig, OptimConfig, RoleSampling
from envace_jax.models import hf_io, qwen3
from envace_jax.models.qwen3_moe_config import Qwen3MoeConfig
from envace_jax.rl.batch import build_batch, pad_rows
from envace_jax.rl.policy_client import GenRequest, SamplerClient
from envace_jax.rl.rolling_client import RollingSamplerClient
from envace_jax.rl.trainer import Trainer
from envace_jax.rl.types import ACT, Generation
from envace_jax.sampling import Sampler, SamplingParams
from tests.helpers_models import make_tiny_hf_qwen3_moe

V = 256


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe_rl")
    make_tiny_hf_qwen3_moe(d, vocab_size=V, num_layers=3, mlp_only_layers=(1,))
    return hf_io.load_hf(str(d))


def _prompts(seed, lengths):
    rng = np.random.RandomState(seed)
    return [rng.randint(3, V, n).tolist() for n in lengths]


def _full_pass_experts(model, prompt, gen):
    """Each generated token's expert set, from one cache-free pass over the whole row: [n, Ls, k] sorted."""
    _, rec = model.final_hidden_routed(jnp.asarray([prompt + gen], jnp.int32))
    return np.sort(np.moveaxis(np.asarray(rec.experts)[:, 0, len(prompt) : len(prompt) + len(gen)], 0, 1), -1)


def test_sampler_records_each_generated_tokens_experts(model):
    prompts = _prompts(0, [5, 14, 9])
    out = Sampler(model, cache_size=64).generate(
        prompts, SamplingParams(temperature=1.0, max_new_tokens=10, seed=3, stop_token_ids=(7, 11, 13))
    )
    c = model.config
    for b, p in enumerate(prompts):
        r = out.routing[b]
        assert r.shape == (out.lengths[b], len(c.sparse_layers), c.num_experts_per_tok) and r.dtype == np.uint8
        np.testing.assert_array_equal(np.sort(r, -1), _full_pass_experts(model, p, out.tokens[b]))
    assert Sampler(model, cache_size=64, record_routing=False).generate(prompts, SamplingParams()).routing is None


def test_clients_hand_each_rows_record_on_over_calls(model):
    # a rolling batch that refills after a quarter of its rows: long rows span several sampler calls
    prompts = _prompts(1, [6, 9, 12, 4, 7, 5])
    sampling = RoleSampling(temperature=1.0, max_new_tokens=16)
    reqs = [GenRequest(p, ACT, sampling, seed=i) for i, p in enumerate(prompts)]
    rolling = RollingSamplerClient(Sampler(model, cache_size=64), stop_token_ids=(7, 11), slots=4, refill=0.25)
    for client in (rolling, SamplerClient(Sampler(model, cache_size=64), stop_token_ids=(7, 11))):
        for p, o in zip(prompts, client.generate(reqs)):
            assert len(o.routing) == len(o.ids)
            np.testing.assert_array_equal(np.sort(o.routing, -1), _full_pass_experts(model, p, o.ids))
    assert len(rolling.calls) > 1


def test_build_batch_puts_each_tokens_record_at_its_own_position():
    r0 = np.arange(3 * 2 * 2).reshape(3, 2, 2).astype(np.uint8)
    gens = [
        Generation(ACT, [5, 6, 7, 8], [1, 2, 3], [0.0] * 3, "u", 0, 0, routing=r0),
        Generation(ACT, [9], [4], [0.0], "u", 1, 0),  # nothing recorded (another policy client)
    ]
    b = build_batch(gens, [1.0, 1.0], [0, 0], max_len=6, length_multiple=8)
    assert b.routing.shape == (2, 16, 2, 2) and b.routing.dtype == np.int16
    # the prompt is left-truncated to 3 tokens (max_len 6 - 3 generated): the generated ones sit at 3, 4, 5
    np.testing.assert_array_equal(b.tokens[0, :6], [6, 7, 8, 1, 2, 3])
    np.testing.assert_array_equal(b.routing[0, 3:6], r0)
    assert (b.routing[0, :3] == -1).all() and (b.routing[0, 6:] == -1).all() and (b.routing[1] == -1).all()
    padded = pad_rows(b.arrays(), 4, width=20)
    assert padded["routing"].shape == (4, 20, 2, 2) and (padded["routing"][2:] == -1).all()
    with pytest.raises(ValueError, match="routing of shape"):
        build_batch([Generation(ACT, [5], [1, 2], [0.0] * 2, "u", 0, 0, routing=r0)], [1.0], [0], max_len=8)


def _batch(model, dtype_seed=0):
    prompts = _prompts(2 + dtype_seed, [5, 14, 9, 7])
    out = Sampler(model, cache_size=64).generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=12, seed=1))
    gens = [
        Generation(ACT, p, t, lp, "u", i, 0, routing=r)
        for i, (p, t, lp, r) in enumerate(zip(prompts, out.tokens, out.logprobs, out.routing))
    ]
    return build_batch(gens, [1.0, -1.0, 0.5, -0.5], [0, 0, 0, 0], max_len=64)


@pytest.mark.parametrize("replay", [False, True])
def test_update_compares_or_replays_the_sampled_routing(model, replay):
    b = _batch(model)
    tr = Trainer(model, OptimConfig(lr=1e-9), LossConfig(routing_replay=replay), micro_batch_size=2)
    lp = tr.compute_logprobs(b)
    w = b.loss_weights > 0
    assert np.abs(lp[w] - b.old_logprobs[w]).max() < 1e-5  # float32: the same weights, the same routing
    m = tr.update(b)
    assert m["routing/changed_tokens"] == 0.0 and m["routing/changed_choices"] == 0.0
    assert m["router_aux_loss"] > 0


def test_replay_routes_to_the_record_even_where_the_router_now_disagrees(model):
    b = _batch(model, 1)
    c = model.config
    # a record that disagrees with the router on every generated token (every expert shifted by one)
    moved = np.where(b.routing >= 0, (b.routing + 1) % c.num_experts, -1).astype(np.int16)
    shifted = type(b)(**{**b.arrays(), "routing": moved})
    free = Trainer(model, OptimConfig(lr=1e-9), LossConfig(), micro_batch_size=4)
    replayed = Trainer(model, OptimConfig(lr=1e-9), LossConfig(routing_replay=True), micro_batch_size=4)
    w = b.loss_weights > 0
    assert np.abs(free.compute_logprobs(shifted)[w] - b.old_logprobs[w]).max() < 1e-5  # compared only
    assert np.abs(replayed.compute_logprobs(shifted)[w] - b.old_logprobs[w]).max() > 1e-3  # used
    m = free.update(shifted)
    recorded = int((b.routing[..., 0, 0] >= 0).sum())
    assert m["routing/changed_tokens"] == 1.0 and recorded == int(w.sum())


def test_load_balancing_loss_enters_the_update_with_its_coefficient(model):
    b = _batch(model, 2)
    coef = 0.25
    plain = Trainer(model, OptimConfig(lr=1e-9), LossConfig(), micro_batch_size=8).gradients(b)
    aux = Trainer(model, OptimConfig(lr=1e-9), LossConfig(router_aux_coef=coef), micro_batch_size=8)
    m = aux.update(b)
    base = Trainer(model, OptimConfig(lr=1e-9), LossConfig(), micro_batch_size=8).update(b)
    assert m["loss"] - base["loss"] == pytest.approx(coef * m["router_aux_loss"], rel=1e-4)
    g = aux.gradients(b)
    # the routers (and what feeds them) see the extra term; the last sparse layer's experts feed no router, so
    # their gradient is the policy loss's alone
    assert float(jnp.abs(g["experts"]["router"][...] - plain["experts"]["router"][...]).max()) > 0
    np.testing.assert_allclose(
        np.asarray(g["experts"]["expert_down"][-1]), np.asarray(plain["experts"]["expert_down"][-1]), atol=1e-7
    )


def test_refusals():
    dense = qwen3.Qwen3(qwen3.Qwen3Config.tiny(64))
    with pytest.raises(ValueError, match="dense"):
        Trainer(dense, OptimConfig(), LossConfig(routing_replay=True))
    with pytest.raises(ValueError, match="no experts"):
        Sampler(dense, record_routing=True)
    moe = qwen3.init_model(Qwen3MoeConfig.tiny(64))
    with pytest.raises(ValueError, match="share_prefixes"):
        Trainer(moe, OptimConfig(), LossConfig(), share_prefixes=True)
    assert Trainer(moe, OptimConfig(), LossConfig()).share_prefixes is False
