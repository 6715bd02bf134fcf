"""Sampler log-probs of a real rollout equal the trainer's recomputation on the built batch.

A tiny random Qwen3 plays a batched rehearsal rollout through the real Sampler + SamplerClient (KV-cache
continuation across user turns), ACT and REHEARSE rows at different temperatures and truncations. The
Trainer then scores the rows ``build_batch`` made from those Generations with a plain full forward: every
generated token's log-prob must agree to float32 precision. The loop's row-length policy is checked too:
a row longer than ``max_row_length`` is dropped by default, because its left-truncated prompt is a context
the sampler never saw (that was the source of a ~2e-3 mean mismatch in an earlier version of the loop).
"""

from __future__ import annotations

import numpy as np
import pytest

from envace_jax.models import qwen3
from envace_jax.rl.batch import build_batch
from envace_jax.rl.judges import RuleJudge
from envace_jax.rl.policy_client import SamplerClient
from envace_jax.rl.reward import ChecklistTurnJudge
from envace_jax.rl.rollout import RoleSampling, RolloutConfig, RolloutEngine
from envace_jax.rl.trainer import Trainer
from envace_jax.rl.types import ACT, REHEARSE
from envace_jax.sampling import Sampler
from tests.helpers_rollout import FirstActScripted, compact_codec, tasks_without_required_items

ACT_SAMPLING = RoleSampling(temperature=1.3, top_p=0.9, max_new_tokens=16)
REHEARSE_SAMPLING = RoleSampling(temperature=0.7, top_k=20, max_new_tokens=16)


@pytest.fixture(scope="module")
def rollout_rows():
    c = compact_codec()
    cfg = qwen3.Qwen3Config(
        vocab_size=len(c.renderer.tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
    )
    model = qwen3.init_model(cfg, seed=0)
    client = SamplerClient(Sampler(model, max_chunk=512, batch_buckets=(16,), length_buckets=(512,)), c.stop_token_ids)
    tasks = tasks_without_required_items()
    policy = FirstActScripted(client, tasks, 8)
    rcfg = RolloutConfig(
        mode="rehearsal", max_steps=5, max_model_len=800, act=ACT_SAMPLING, rehearse=REHEARSE_SAMPLING, seed=1
    )
    eps = RolloutEngine(rcfg, c, policy, ChecklistTurnJudge(RuleJudge())).run(tasks * 2, [t["uid"] for t in tasks] * 2)
    gens = [g for e in eps for g in e.generations if (g.episode, tuple(g.gen_ids)) not in policy.scripted]
    return model, client, gens


def test_sampler_logprobs_equal_trainer_recomputation(rollout_rows):
    model, client, gens = rollout_rows
    roles = [g.role for g in gens]
    assert roles.count(ACT) >= 4 and roles.count(REHEARSE) >= 2, roles
    assert sum(c.continued for c in client.calls) > 0, "no ACT row continued a cached context"
    assert sum(len(g.gen_ids) for g in gens) > 50

    # each row carries the temperature it was sampled at, and the batch scores it at that temperature
    temps = [(ACT_SAMPLING if g.role == ACT else REHEARSE_SAMPLING).temperature for g in gens]
    assert [g.temperature for g in gens] == temps
    batch = build_batch(gens, np.zeros(len(gens)), np.arange(len(gens)), max_len=2048)
    assert batch.truncated_rows == 0
    np.testing.assert_allclose(batch.temperature, temps)
    got = Trainer(model, micro_batch_size=8).compute_logprobs(batch)
    w = batch.loss_weights > 0
    assert int(w.sum()) == sum(len(g.gen_ids) for g in gens)
    diff = np.abs(got - batch.old_logprobs)[w]
    assert diff.max() < 1e-5, (diff.max(), diff.mean())
    # Temperature matters at this precision: scoring every row at T=1 is far off.
    batch.temperature[:] = 1.0
    assert np.abs(Trainer(model, micro_batch_size=8).compute_logprobs(batch) - batch.old_logprobs)[w].max() > 1e-2


def test_overlong_rows_are_dropped_not_truncated(rollout_rows):
    """RLStep's default leaves rows longer than max_row_length out; 'truncate' keeps them (reference)."""
    from envace_jax.rl.step import RLStep, StepConfig

    model, _, gens = rollout_rows
    lengths = sorted(len(g.prompt_ids) + len(g.gen_ids) for g in gens)
    limit = lengths[len(lengths) // 2]
    short = sum(n <= limit for n in lengths)

    class Engine:  # what RLStep reads of an engine; the rollout itself is replayed below
        cfg = RolloutConfig(mode="rehearsal", act=ACT_SAMPLING, rehearse=REHEARSE_SAMPLING)
        policy = simulator = None

    seen = {}

    class Spy(Trainer):  # sees the step's whole batch (old log-probs are recomputed on it), trains nothing
        def compute_logprobs(self, batch):
            seen.setdefault("rows", []).append(batch.size)
            seen.setdefault("trunc", []).append(batch.truncated_rows)
            return np.zeros(batch.tokens.shape, np.float32)

        def update(self, batch, kind="rl"):
            return {"loss": 0.0}

    trainer = Spy(model, micro_batch_size=8)
    for policy, want_rows, want_trunc in (("drop", short, 0), ("truncate", len(gens), len(gens) - short)):
        step = RLStep(
            StepConfig(n_rollouts=1, max_row_length=limit, overlong_rows=policy),
            Engine(),
            {ACT: trainer, REHEARSE: trainer},
        )
        step.rollout = lambda records, iteration: _episodes_of(gens)
        res = step([{"uid": "x"}], 0)
        assert seen["rows"][-1] == want_rows and seen["trunc"][-1] == want_trunc
        assert res.metrics.get("update/overlong_rows_dropped", 0.0) == (len(gens) - short if policy == "drop" else 0.0)
    with pytest.raises(ValueError, match="rl.overlong_rows"):
        StepConfig(overlong_rows="cut")


def test_the_step_trains_rows_at_the_temperature_they_were_sampled_at(rollout_rows):
    """Rows sampled at 1.3 (ACT) and 0.7 (REHEARSE) are scored at those temperatures even when the
    engine's config now says otherwise (e.g. a run resumed with another sampling temperature)."""
    from envace_jax.rl.step import RLStep, StepConfig

    model, _, gens = rollout_rows

    class Engine:
        cfg = RolloutConfig(mode="rehearsal", act=RoleSampling(temperature=1.0), rehearse=RoleSampling(temperature=1.0))
        policy = simulator = None

    seen = {}

    class Spy(Trainer):
        def compute_logprobs(self, batch):
            seen["temperature"] = batch.temperature[: batch.size].copy()
            return np.zeros(batch.tokens.shape, np.float32)

        def update(self, batch, kind="rl"):
            return {"loss": 0.0}

    trainer = Spy(model, micro_batch_size=8)
    step = RLStep(StepConfig(n_rollouts=1), Engine(), {ACT: trainer, REHEARSE: trainer})
    step.rollout = lambda records, iteration: _episodes_of(gens)
    step([{"uid": "x"}], 0)
    want = [(ACT_SAMPLING if g.role == ACT else REHEARSE_SAMPLING).temperature for g in gens]
    np.testing.assert_allclose(seen["temperature"], want)


def _episodes_of(gens):
    """One episode per generation (RLStep only reads generations and metrics fields)."""
    from envace_jax.rl.types import Episode

    return [Episode(g.episode, g.uid, {}, [], [], generations=[g], termination="completed") for g in gens]
