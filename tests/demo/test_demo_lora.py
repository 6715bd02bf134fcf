"""The demo's RL stage with LoRA (``lora_rank``): adapters on the start, only they train, folded into the weights
when RL ends (the evaluated model is plain), and the report says so."""

from __future__ import annotations

import numpy as np

from envace_jax.demo.config import reduced
from envace_jax.demo.pipeline import Demo
from envace_jax.models import lora


def test_rl_with_lora_trains_adapters_and_ends_with_a_plain_model(tmp_path):
    # a replay batch after each step: a gradient on every adapter even when no rollout carries an advantage
    cfg = reduced().replace(lora_rank=4, rl_lr=3e-3, rl_steps=2, rl_replay_batches=1)
    d = Demo(cfg, str(tmp_path), progress=False)
    d.prepare()
    d.sft()
    start = {k: np.asarray(v) for k, v in d.model.layers.arrays().items()}
    log = d.rl("rehearsal")
    assert len(log) == 2 and d.model.config.lora_scale == 0.0 and not lora.adapter_arrays(d.model)
    after = {k: np.asarray(v) for k, v in d.model.layers.arrays().items()}
    assert set(after) == set(start)
    # the adapted projections moved (their adapters were folded in); the norms, which LoRA does not touch, did not
    for name in lora.DEFAULT_TARGETS:
        assert np.abs(after[name] - start[name]).max() > 0, name
    for name in ("input_norm", "post_norm", "q_norm", "k_norm"):
        np.testing.assert_array_equal(after[name], start[name])
    # a low-rank change: each layer's change of a projection has rank <= 4 (up to float32 rounding of W + delta)
    sv = np.linalg.svd((after["gate_proj"] - start["gate_proj"])[0].astype(np.float64), compute_uv=False)
    assert sv[3] > 1e-2 * sv[0] and sv[4] < 1e-3 * sv[0]
