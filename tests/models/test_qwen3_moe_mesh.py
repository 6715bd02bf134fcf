"""A Qwen3-MoE on an 8-device CPU mesh (data 2, fsdp 2, tensor 2) computes what it computes on one device: logits,
routing, the update's gradient, greedy sampling with its routing record. Each device routes its own tokens
(``qwen3_moe._local_tokens``); under the expert-parallel rules the experts are split over fsdp."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers_paths import ROOT

SCRIPT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from envace_jax import sharding as shd
    from envace_jax.config import LossConfig, OptimConfig
    from envace_jax.models import qwen3
    from envace_jax.models.qwen3_moe_config import Qwen3MoeConfig
    from envace_jax.rl.batch import build_batch
    from envace_jax.rl.trainer import Trainer
    from envace_jax.rl.types import ACT, Generation
    from envace_jax.sampling import Sampler, SamplingParams

    assert len(jax.devices()) == 8
    rules = dict(shd.TRAIN_RULES, **(shd.EXPERT_PARALLEL_RULES if sys.argv[1] == "expert" else {}))
    cfg = Qwen3MoeConfig.tiny(256, hidden_size=64, num_layers=3, num_experts=8, num_experts_per_tok=2,
                              moe_intermediate_size=32, mlp_only_layers=(1,), moe_dispatch=sys.argv[2])
    mesh = shd.make_mesh(data=2, fsdp=2, tensor=2)
    one = qwen3.init_model(cfg, seed=1)
    sharded = qwen3.place(qwen3.init_model(cfg, seed=1), mesh, rules)  # the same weights, laid out by the rules
    for a, b in zip(jax.tree.leaves(nnx.state(one)), jax.tree.leaves(nnx.state(sharded))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    print("expert_gate spec", tuple(sharded.experts.expert_gate[...].sharding.spec))
    ids = jnp.asarray(np.random.RandomState(0).randint(3, 256, (4, 12)), jnp.int32)
    h1, r1 = one.final_hidden_routed(ids)
    h8, r8 = sharded.final_hidden_routed(ids)
    np.testing.assert_allclose(np.asarray(h8), np.asarray(h1), rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(np.sort(np.asarray(r8.experts), -1), np.sort(np.asarray(r1.experts), -1))
    np.testing.assert_allclose(float(r8.aux_loss()), float(r1.aux_loss()), rtol=1e-5)

    rng = np.random.RandomState(1)
    prompts = [rng.randint(3, 256, n).tolist() for n in (5, 12, 9, 3, 17, 8, 4, 10)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    ref = Sampler(one, cache_size=64).generate(prompts, greedy)
    got = Sampler(sharded, cache_size=64, mesh=mesh).generate(prompts, greedy)
    assert got.tokens == ref.tokens, (got.tokens, ref.tokens)
    for a, b in zip(got.routing, ref.routing):
        np.testing.assert_array_equal(np.sort(a, -1), np.sort(b, -1))

    gens = [Generation(ACT, p, t, lp, "u", i, 0, routing=r)
            for i, (p, t, lp, r) in enumerate(zip(prompts, ref.tokens, ref.logprobs, ref.routing))]
    batch = build_batch(gens, [1.0, -1.0] * 4, [0] * 8, max_len=64)
    loss = LossConfig(routing_replay=True, router_aux_coef=0.01)
    g1 = Trainer(one, OptimConfig(), loss, micro_batch_size=8).gradients(batch)
    g8 = Trainer(sharded, OptimConfig(), loss, micro_batch_size=8, mesh=mesh).gradients(batch)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(g1)[0], jax.tree.leaves(g8)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-4, atol=2e-6, err_msg=str(path))
    print("OK")
""")


@pytest.mark.parametrize("rules,dispatch", [("fsdp", "blocked"), ("expert", "ragged")])
def test_moe_on_an_eight_device_mesh_matches_one_device(rules, dispatch):
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, rules, dispatch], env=env, capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0 and "OK" in r.stdout, (r.stdout + r.stderr)[-4000:]
    expected = "(None, 'fsdp', None, 'tensor')" if rules == "expert" else "(None, None, 'fsdp', 'tensor')"
    assert f"expert_gate spec {expected}" in r.stdout, r.stdout
