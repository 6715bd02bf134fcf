"""The disaggregated layout (``mesh.rollout_chips_per_host``) on 8 CPU devices: training on some chips, rollouts
on the others, the weights sent to the rollout chips after each update, synchronous and lagged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests import helpers_loop as h

SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    import jax, numpy as np
    from flax import nnx
    sys.path.insert(0, {root!r})
    from tests import helpers_loop as h
    from envace_jax.rl import train as rl_train
    from envace_jax.rl.async_pipeline import trained_models

    h.use_compile_cache()
    assert len(jax.devices()) == 8
    out = {{}}

    def devices(tree):
        return sorted({{d.id for x in jax.tree.leaves(tree) for d in x.devices()}})

    def params(run):
        return {{k: np.asarray(v) for k, v in run.params().items()}}

    for s in (0, 1):
        finals = []
        for rep in range(2):
            cfg = h.tiny_config(tempfile.mkdtemp(), 3, **{{"rl.max_staleness": s, "mesh.rollout_chips_per_host": 4}})
            run = rl_train.build_run(cfg)
            policy = trained_models(run.step_fn)["policy"]
            try:
                for k in range(3):
                    if run.pipeline is not None:
                        run.pipeline(k)
                    else:
                        run.step_fn(next(run.data), k)
                train_devices = devices(nnx.state(policy, nnx.Param))
                if run.pipeline is not None:
                    copy = run.pipeline.slot_of(3 + s).copies["policy"]  # holds the trainer's newest version
                else:
                    copy = run.step_fn.engine.policy.sampler.model
                sample_devices = devices(nnx.state(copy, nnx.Param))
                same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
                    jax.tree.leaves(nnx.state(copy, nnx.Param)), jax.tree.leaves(nnx.state(policy, nnx.Param))))
                finals.append(params(run))
            finally:
                if run.pipeline is not None:
                    run.pipeline.close()
                run.ckpt.close()
                run.writer.close()
        out[s] = dict(train=train_devices, sample=sample_devices, copy_is_trainer=same,
                      repeat=all(np.array_equal(finals[0][k], finals[1][k]) for k in finals[0]))
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
def test_disaggregated_layout_trains_and_samples_on_separate_chips():
    env = dict(h.env(), XLA_FLAGS="--xla_force_host_platform_device_count=8")
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(root=h.ROOT)], capture_output=True, text=True, env=env, timeout=1500
    )
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT ") :])
    for s in ("0", "1"):
        r = out[s]
        assert r["train"] == [0, 1, 2, 3] and r["sample"] == [4, 5, 6, 7], r
        assert r["copy_is_trainer"], r  # the rollout chips got the trainer's weights, exactly (float32)
        assert r["repeat"], r
    assert os.path.isdir(h.ROOT)
