"""Qwen3-MoE end to end against transformers' Qwen3MoeForCausalLM: logits, routing, the load-balancing loss,
checkpoints both ways, greedy sampling, routing replay."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from envace_jax.models import hf_io, qwen3
from envace_jax.models.qwen3_moe import Qwen3Moe
from envace_jax.models.qwen3_moe_config import Qwen3MoeConfig
from envace_jax.sampling import Sampler, SamplingParams
from tests.helpers_models import left_padded_batch, make_tiny_hf_qwen3_moe, positions_from_mask, torch_forward

V = 256

# (HF config, our overrides): a dense layer among sparse ones, both norm_topk_prob settings, every other
# layer sparse with tied embeddings, a scanned stack, each dispatch
CONFIGS = {
    "dense_layer_between": (dict(num_layers=3, mlp_only_layers=(1,)), {}),
    "unnormalised_top_k": (dict(num_layers=2, norm_topk_prob=False, top_k=3), dict(moe_dispatch="dense")),
    "every_other_sparse_tied": (dict(num_layers=4, decoder_sparse_step=2, tie=True), dict(moe_dispatch="ragged")),
    "scanned_runs": (
        dict(num_layers=5, mlp_only_layers=(0, 3), num_experts=8, top_k=4),
        dict(scan_layers=True, moe_block=2),
    ),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    hf_kw, ours_kw = CONFIGS[request.param]
    d = tmp_path_factory.mktemp(f"moe_{request.param}")
    hf = make_tiny_hf_qwen3_moe(d, vocab_size=V, **hf_kw)
    return hf, hf_io.load_hf(str(d), **ours_kw), d


def _hf_top_k(hf, ids, mask):
    """Each sparse layer's top-k experts and its router logits, from transformers' own router outputs."""
    with torch.no_grad():
        out = hf(
            torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            position_ids=torch.tensor(positions_from_mask(mask)),
            output_router_logits=True,
        )
    logits = [r.float() for r in out.router_logits]
    k = hf.config.num_experts_per_tok
    return np.stack([torch.topk(torch.softmax(r, -1), k, -1).indices.numpy() for r in logits]), tuple(logits)


def test_logits_hidden_states_and_routing_match_transformers(pair):
    hf, model, _ = pair
    ids, mask = left_padded_batch(np.random.RandomState(0), V, [13, 7, 10])
    ref_logits, ref_hidden = torch_forward(hf, ids, mask)
    seg, pos = jnp.asarray(mask, jnp.int32), jnp.asarray(positions_from_mask(mask), jnp.int32)
    logits, hidden = model(jnp.asarray(ids, jnp.int32), pos, seg, return_hidden_states=True)
    valid = mask.astype(bool)
    scale = np.abs(ref_logits[valid]).max()
    assert np.abs(np.asarray(logits)[valid] - ref_logits[valid]).max() / scale < 1e-4
    # every layer's output (the last before the final norm on our side, after it on transformers')
    for i in range(hidden.shape[0] - 1):
        np.testing.assert_allclose(np.asarray(hidden[i])[valid], ref_hidden[i][valid], rtol=1e-4, atol=1e-4)
    # the experts each valid token went to, in each sparse layer, as a set
    _, record = model.final_hidden_routed(jnp.asarray(ids, jnp.int32), pos, seg)
    hf_experts, _ = _hf_top_k(hf, ids, mask)
    ours = np.sort(np.asarray(record.experts).reshape(hf_experts.shape), axis=-1)
    flat_valid = valid.reshape(-1)
    np.testing.assert_array_equal(ours[:, flat_valid], np.sort(hf_experts, axis=-1)[:, flat_valid])


def test_load_balancing_loss_matches_transformers(pair):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    hf, model, _ = pair
    ids, mask = left_padded_batch(np.random.RandomState(1), V, [9, 16, 4, 11])
    _, router_logits = _hf_top_k(hf, ids, mask)
    c = hf.config
    ref = float(load_balancing_loss_func(router_logits, c.num_experts, c.num_experts_per_tok, torch.tensor(mask)))
    seg, pos = jnp.asarray(mask, jnp.int32), jnp.asarray(positions_from_mask(mask), jnp.int32)
    _, record = model.final_hidden_routed(jnp.asarray(ids, jnp.int32), pos, seg)
    assert float(record.aux_loss()) == pytest.approx(ref, rel=1e-5)


def test_export_is_read_back_by_transformers_with_the_same_logits(pair, tmp_path):
    from transformers import AutoModelForCausalLM

    hf, model, src = pair
    hf_io.save_hf(model, tmp_path / "out", max_shard_size="100KB")  # several shards, experts split among them
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    names = set(index["weight_map"])
    c = model.config
    assert set(hf_io.expected_hf_tensors(c)) == names
    first = c.sparse_layers[0]
    assert {f"model.layers.{first}.mlp.experts.{e}.down_proj.weight" for e in range(c.num_experts)} <= names
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert type(back).__name__ == "Qwen3MoeForCausalLM"
    ids, mask = left_padded_batch(np.random.RandomState(2), V, [12, 5])
    np.testing.assert_allclose(torch_forward(back, ids, mask)[0], torch_forward(hf, ids, mask)[0], rtol=0, atol=0)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe" and config["mlp_only_layers"] == list(c.mlp_only_layers)
    # and ours reads its own export back to the same arrays
    again = hf_io.load_hf(str(tmp_path / "out"))
    for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(nnx.state(again, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_greedy_sampling_matches_transformers_generate(pair):
    hf, model, _ = pair
    rng = np.random.RandomState(3)
    prompts = [rng.randint(3, V, n).tolist() for n in (5, 14, 9)]
    new = 12
    out = Sampler(model, cache_size=64).generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=new))
    hf.generation_config.eos_token_id = None
    for b, p in enumerate(prompts):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), do_sample=False, max_new_tokens=new, pad_token_id=0)[0, len(p) :]
        assert out.tokens[b] == ref.tolist(), f"row {b}"


def test_routing_replay_reuses_recorded_experts_and_keeps_the_router_gradient(pair):
    _, model, _ = pair
    c = model.config
    ids = jnp.asarray(np.random.RandomState(4).randint(3, V, (2, 10)), jnp.int32)
    h0, rec = model.final_hidden_routed(ids)
    h1, rec1 = model.final_hidden_routed(ids, recorded=rec.experts, replay=True)
    np.testing.assert_allclose(np.asarray(h1), np.asarray(h0), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(rec1.experts), np.asarray(rec.experts))
    assert float(rec1.recorded_tokens) == 20 and float(rec1.changed_tokens) == 0 == float(rec1.changed_choices)
    # other experts than the router's, recorded for the first row only (-1: nothing recorded for the second)
    other = np.array((rec.experts + 1) % c.num_experts)
    other[:, 1] = -1
    other = jnp.asarray(other)
    h2, rec2 = model.final_hidden_routed(ids, recorded=other, replay=True)
    np.testing.assert_array_equal(np.asarray(rec2.experts[:, 0]), np.asarray(other[:, 0]))
    assert np.abs(np.asarray(h2[0]) - np.asarray(h0[0])).max() > 1e-3
    # the second row routes itself, so it computes what it computed before
    np.testing.assert_allclose(np.asarray(h2[1]), np.asarray(h0[1]), rtol=1e-6, atol=1e-6)
    Ls = len(c.sparse_layers)
    assert float(rec2.recorded_tokens) == 10 and float(rec2.changed_tokens) == 10
    # the first sparse layer's own choice is the record's before the shift; deeper layers see other inputs
    assert 10 <= float(rec2.changed_choices) <= 10 * Ls
    # without replay the record is only compared: the same output as no record
    h3, rec3 = model.final_hidden_routed(ids, recorded=other)
    np.testing.assert_allclose(np.asarray(h3), np.asarray(h0), rtol=1e-6, atol=1e-6)
    assert float(rec3.changed_tokens) == 10
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p):
        return jnp.sum(nnx.merge(graphdef, p, rest).final_hidden_routed(ids, recorded=other, replay=True)[0] ** 2)

    g = jax.grad(loss)(params)
    assert float(jnp.abs(g["experts"]["router"][...]).max()) > 0
    with pytest.raises(ValueError, match="routing replay"):
        model.final_hidden_routed(ids, recorded=other[:, :1], replay=True)


def test_config_reading_and_refusals(tmp_path):
    d = {
        **Qwen3MoeConfig.tiny(64).to_hf(),
    }
    back = qwen3.Qwen3Config.from_hf(d)
    assert isinstance(back, Qwen3MoeConfig) and back.num_experts == 8
    # transformers 5 writes num_local_experts
    d5 = {k: v for k, v in d.items() if k != "num_experts"} | {"num_local_experts": 5}
    assert qwen3.Qwen3Config.from_hf(d5).num_experts == 5
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        Qwen3MoeConfig.tiny(64, num_experts=4, num_experts_per_tok=5)
    with pytest.raises(ValueError, match="mlp_only_layers"):
        Qwen3MoeConfig.tiny(64, num_layers=2, mlp_only_layers=(2,))
    with pytest.raises(ValueError, match="moe_dispatch"):
        Qwen3MoeConfig.tiny(64, moe_dispatch="tokamax")
    auto = Qwen3MoeConfig.tiny(64)
    assert (auto.dispatch("cpu"), auto.dispatch("tpu"), auto.dispatch("gpu")) == ("blocked", "megablox", "ragged")
    with pytest.raises(TypeError, match="Qwen3Moe"):
        qwen3.Qwen3(Qwen3MoeConfig.tiny(64))
    with pytest.raises(ValueError, match="model_type"):
        qwen3.Qwen3Config.from_hf({**d, "model_type": "mixtral"})
    assert type(qwen3.init_model(Qwen3MoeConfig.tiny(64))) is Qwen3Moe


def test_released_sizes():
    # model cards: 30.5B total / 3.3B active, 235B / 22B
    big = Qwen3MoeConfig.qwen3_30b_a3b()
    assert big.num_params() / 1e9 == pytest.approx(30.5, abs=0.1)
    assert big.num_active_params() / 1e9 == pytest.approx(3.35, abs=0.05)
    huge = Qwen3MoeConfig.qwen3_235b_a22b()
    assert huge.num_params() / 1e9 == pytest.approx(235.1, abs=0.2)
    assert huge.num_active_params() / 1e9 == pytest.approx(22.2, abs=0.1)
    assert big.sparse_layers == tuple(range(48)) and big.dense_layers == ()
