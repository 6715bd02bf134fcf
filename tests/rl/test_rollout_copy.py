"""The per-process rollout copy of a multi-host run: its mesh splits the weights and the KV cache over a
host's chips, and its compute-dtype weights compute exactly what the float32 master weights compute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json
    import jax, numpy as np
    from flax import nnx
    from envace_jax import sharding as shd
    from envace_jax.models import qwen3
    from envace_jax.rl.train import rollout_config, rollout_mesh
    from envace_jax.sampling import Sampler, SamplingParams

    assert len(jax.devices()) == 8
    out = {}
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_layers=2, head_dim=16,
                rope_theta=10000.0)
    for name, heads, kv, n in (("kv2_on4", 4, 2, 4), ("kv8_on8", 8, 8, 8), ("kv3_on4", 6, 3, 4)):
        m = rollout_mesh(qwen3.Qwen3Config(num_heads=heads, num_kv_heads=kv, **base), jax.devices()[:n])
        out[name] = dict(m.shape)

    rng = np.random.RandomState(0)
    prompts = [rng.randint(3, 256, k).tolist() for k in (5, 12, 9, 3)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    cfg = qwen3.Qwen3Config(num_heads=4, num_kv_heads=2, **base)

    # Float32 on one device vs the rollout copy (float32) on its 4-chip mesh: same greedy tokens, and
    # each chip holds half of every head-split weight.
    single = Sampler(qwen3.init_model(cfg, seed=1), cache_size=96).generate(prompts, greedy)
    mesh = rollout_mesh(cfg, jax.devices()[:4])
    copy = qwen3.init_model(rollout_config(cfg), seed=5, mesh=mesh)
    src = nnx.state(qwen3.init_model(cfg, seed=1), nnx.Param)
    cur = nnx.state(copy, nnx.Param)
    nnx.update(copy, jax.tree.map(lambda h, c: jax.device_put(np.asarray(h).astype(c.dtype), c.sharding), src, cur))
    sharded = Sampler(copy, cache_size=96).generate(prompts, greedy)
    q = copy.layers.q_proj[...]
    out["q_proj_global"] = list(q.shape)
    out["q_proj_shard"] = list(q.addressable_shards[0].data.shape)
    out["mesh_tokens_equal"] = sharded.tokens == single.tokens

    # bfloat16 compute: float32 master weights vs the bfloat16 rollout copy, one device.
    bf = cfg.replace(dtype="bfloat16")
    master = qwen3.init_model(bf, seed=1)
    copy16 = qwen3.init_model(rollout_config(bf), seed=5)
    nnx.update(copy16, jax.tree.map(lambda h, c: np.asarray(h).astype(c.dtype), nnx.state(master, nnx.Param),
                                    nnx.state(copy16, nnx.Param)))
    # (XLA CPU has no bfloat16 x bfloat16 -> float32 dot for the decode loop, so the check is on the
    # forward both sampler programs run: the same layers over the same cast weights.)
    ids = np.asarray([p[:3] for p in prompts], np.int32)
    la, lb = np.asarray(master(ids)), np.asarray(copy16(ids))
    out["copy_dtype"] = str(copy16.layers.q_proj[...].dtype)
    out["bf16_logits_equal"] = bool(np.array_equal(la, lb))
    out["bf16_logits_finite"] = bool(np.isfinite(la).all())
    print("RESULT " + json.dumps(out))
""")


def _run() -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_rollout_copy_mesh_and_dtype():
    r = _run()
    # Tensor takes the largest divisor of the chip count that divides the KV heads; fsdp the rest.
    assert r["kv2_on4"] == {"data": 1, "fsdp": 2, "tensor": 2}
    assert r["kv8_on8"] == {"data": 1, "fsdp": 1, "tensor": 8}
    assert r["kv3_on4"] == {"data": 1, "fsdp": 4, "tensor": 1}
    # q_proj [D, heads, head_dim]: split over its heads on the tensor axis, not replicated.
    assert r["q_proj_shard"][1] * 2 == r["q_proj_global"][1]
    assert r["mesh_tokens_equal"]
    assert r["copy_dtype"] == "bfloat16"
    assert r["bf16_logits_finite"] and r["bf16_logits_equal"]
