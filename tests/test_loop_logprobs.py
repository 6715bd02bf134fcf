"""Sampler log-probs of a real rollout equal the trainer's recomputation on the built batch.

A tiny random Qwen3 plays a batched rehearsal rollout through the real Sampler + SamplerClient (KV-cache
continuation across user turns), ACT and REHEARSE rows at different temperatures and truncations. The
Trainer then scores the rows ``build_batch`` made from those Generations with a plain full forward: every
generated token's log-prob must agree to float32 precision. The loop's row-length policy is checked too:
a row longer than ``max_row_length`` is dropped by default, because its left-truncated prompt is a context
the sampler never saw (that was the source of a ~2e-3 mean mismatch in an earlier version of the loop).
"""

from __future__ import annotations

import copy
import functools

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
from helpers_rollout import act_texts, codec, demo_tasks

ACT_SAMPLING = RoleSampling(temperature=1.3, top_p=0.9, max_new_tokens=16)
REHEARSE_SAMPLING = RoleSampling(temperature=0.7, top_k=20, max_new_tokens=16)


@functools.lru_cache(maxsize=None)
def small_codec():
    """Compact REHEARSE prompts (no few-shot) keep the prefill cheap."""
    from envace_jax.chat import Qwen3ChatCodec, SimulatorPromptOptions

    return Qwen3ChatCodec(codec().renderer.tokenizer,
                          simulator_options=SimulatorPromptOptions(few_shot=False, compact=True))


def _tasks() -> list[dict]:
    """4 demo tasks with nothing required, so random final answers lead to a second user turn (a
    continued ACT row)."""
    out = []
    for t in demo_tasks()[:4]:
        t = copy.deepcopy(t)
        for checklist in t["checklist"]:
            for turn in checklist:
                for item in turn:
                    item["required_for_next_turn"] = False
        out.append(t)
    return out


class _FirstCallScripted:
    """Odd episodes' first ACT turn is the reference's tool call (a random model rarely writes one), so
    REHEARSE rows exist; everything else goes to the real client in one call. Scripted rows are marked."""

    def __init__(self, inner: SamplerClient, tasks: list[dict], n_episodes: int):
        self.inner, self.c = inner, small_codec()
        self.first = {e: act_texts(tasks[e % len(tasks)])[0] for e in range(n_episodes) if e % 2}
        self.scripted: set[tuple[int, tuple[int, ...]]] = set()

    def generate(self, requests):
        from envace_jax.rl.rollout import GenOutput

        out, fwd = [None] * len(requests), []
        for i, r in enumerate(requests):
            if r.role == ACT and r.episode in self.first:
                ids = self.c.renderer.encode(self.first.pop(r.episode)) + [self.c.renderer.im_end_id]
                self.scripted.add((r.episode, tuple(ids)))
                out[i] = GenOutput(ids, [0.0] * len(ids), "stop")
            else:
                fwd.append(i)
        if fwd:
            for i, o in zip(fwd, self.inner.generate([requests[i] for i in fwd])):
                out[i] = o
        return out

    def release(self, keys):
        self.inner.release(keys)


@pytest.fixture(scope="module")
def rollout_rows():
    c = small_codec()
    cfg = qwen3.Qwen3Config(vocab_size=len(c.renderer.tokenizer), hidden_size=32, intermediate_size=64,
                            num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16)
    model = qwen3.init_model(cfg, seed=0)
    client = SamplerClient(Sampler(model, max_chunk=512, batch_buckets=(16,), length_buckets=(512,)),
                           c.stop_token_ids)
    tasks = _tasks()
    policy = _FirstCallScripted(client, tasks, 8)
    rcfg = RolloutConfig(mode="rehearsal", max_steps=5, max_model_len=800, act=ACT_SAMPLING,
                         rehearse=REHEARSE_SAMPLING, seed=1)
    eps = RolloutEngine(rcfg, c, policy, ChecklistTurnJudge(RuleJudge())).run(tasks * 2, [t["uid"] for t in tasks] * 2)
    gens = [g for e in eps for g in e.generations if (g.episode, tuple(g.gen_ids)) not in policy.scripted]
    return model, client, gens


def test_sampler_logprobs_equal_trainer_recomputation(rollout_rows):
    model, client, gens = rollout_rows
    roles = [g.role for g in gens]
    assert roles.count(ACT) >= 4 and roles.count(REHEARSE) >= 2, roles
    assert sum(c.continued for c in client.calls) > 0, "no ACT row continued a cached context"
    assert sum(len(g.gen_ids) for g in gens) > 50

    temps = [(ACT_SAMPLING if g.role == ACT else REHEARSE_SAMPLING).temperature for g in gens]
    batch = build_batch(gens, np.zeros(len(gens)), np.arange(len(gens)), max_len=2048, temperatures=temps)
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
    from envace_jax.rl.loop import RLStep, StepConfig

    model, _, gens = rollout_rows
    lengths = sorted(len(g.prompt_ids) + len(g.gen_ids) for g in gens)
    limit = lengths[len(lengths) // 2]
    short = sum(n <= limit for n in lengths)

    class Engine:  # what RLStep reads of an engine; the rollout itself is replayed below
        cfg = RolloutConfig(mode="rehearsal", act=ACT_SAMPLING, rehearse=REHEARSE_SAMPLING)
        policy = simulator = None

    seen = {}

    class Spy(Trainer):
        def ppo_update(self, batch, **kw):
            seen.setdefault("rows", []).append(batch.size)
            seen.setdefault("trunc", []).append(batch.truncated_rows)
            return [{"loss": 0.0}]

    trainer = Spy(model, micro_batch_size=8)
    for policy, want_rows, want_trunc in (("drop", short, 0), ("truncate", len(gens), len(gens) - short)):
        step = RLStep(StepConfig(n_rollouts=1, max_row_length=limit, overlong_rows=policy), Engine(),
                      {ACT: trainer, REHEARSE: trainer})
        step.rollout = lambda records, iteration: _episodes_of(gens)
        res = step([{"uid": "x"}], 0)
        assert seen["rows"][-1] == want_rows and seen["trunc"][-1] == want_trunc
        assert res.metrics.get("update/overlong_rows_dropped", 0.0) == (len(gens) - short if policy == "drop" else 0.0)
    with pytest.raises(ValueError, match="rl.overlong_rows"):
        StepConfig(overlong_rows="cut")


def _episodes_of(gens):
    """One episode per generation (RLStep only reads generations and metrics fields)."""
    from envace_jax.rl.types import Episode

    return [Episode(g.episode, g.uid, {}, [], [], generations=[g], termination="completed") for g in gens]
