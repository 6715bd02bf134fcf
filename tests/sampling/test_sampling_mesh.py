"""Sampling under an 8-device CPU mesh gives the single-device greedy tokens, also when a prefill runs
as sub-batches of the rows that write (split prefill: 2 of the 8 rows, over a batch split 4 ways), and
when rows still running after an early return carry their logits into the next call."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.helpers_paths import ROOT

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from envace_jax import sharding as shd
    from envace_jax.models import qwen3
    from envace_jax.sampling import Sampler, SamplingParams

    assert len(jax.devices()) == 8
    cfg = qwen3.Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                            num_kv_heads=2, head_dim=16, rope_theta=10000.0)
    rng = np.random.RandomState(0)
    prompts = [rng.randint(3, 256, n).tolist() for n in (5, 12, 9, 3, 17, 8, 4, 10)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    single = Sampler(qwen3.init_model(cfg, seed=1), cache_size=160, split_prefill=False)
    ref = single.generate(prompts, greedy, return_state=True)
    ref2 = single.continue_(ref.state, [[7, 8, 9]] * 8, greedy, return_state=True)
    # six rows write only their pending token, two append 40 tokens: a split prefill on the mesh
    mixed = [[]] * 6 + [rng.randint(3, 256, 40).tolist() for _ in range(2)]
    ref3 = single.continue_(ref2.state, mixed, greedy)
    # an early return (2 of 8 rows done): the six rows still running carry their logits into the next call
    staggered = [SamplingParams(temperature=0.0, max_new_tokens=4 + 2 * i) for i in range(8)]
    e1 = single.generate(prompts, staggered, return_state=True, min_done=2)
    ref4 = single.continue_(e1.state, [[]] * 8, greedy)

    mesh = shd.make_mesh(data=2, fsdp=2, tensor=2)
    # Parameters live in the training layout; the sampler reshards them to SAMPLE_RULES.
    model = qwen3.init_model(cfg, seed=1, mesh=mesh, rules=shd.TRAIN_RULES)
    s = Sampler(model, cache_size=160, split_min_rows=1)
    out = s.generate(prompts, greedy, return_state=True)
    spec = out.state.k[0].sharding.spec
    out2 = s.continue_(out.state, [[7, 8, 9]] * 8, greedy, return_state=True)
    slots = s.stats.prefill_slots
    out3 = s.continue_(out2.state, mixed, greedy)
    split_slots = s.stats.prefill_slots - slots
    e1 = s.generate(prompts, staggered, return_state=True, min_done=2)
    carried = int(e1.state.carried.sum())
    out4 = s.continue_(e1.state, [[]] * 8, greedy)
    print(json.dumps({"same4": out4.tokens == ref4.tokens, "carried": carried,
                      "same": out.tokens == ref.tokens, "same2": out2.tokens == ref2.tokens,
                      "same3": out3.tokens == ref3.tokens, "split_slots": split_slots,
                      "lp": float(np.max(np.abs(np.concatenate(out.logprobs) - np.concatenate(ref.logprobs)))),
                      "spec": str(spec)}))
""")


def test_sharded_greedy_equals_single_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    root = ROOT
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    import json

    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["same"] and res["same2"] and res["same3"] and res["same4"], res
    assert res["carried"] == 6, res
    assert res["split_slots"] == 8 * 16 + 2 * 64, res  # the one-call prefill would compute 8 x 64
    assert res["lp"] < 1e-4, res
    # The cache is split over the batch (data, fsdp) and kv heads (tensor).
    assert "('data', 'fsdp')" in res["spec"] and "tensor" in res["spec"], res
