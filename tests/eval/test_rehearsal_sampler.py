"""End to end through the real Sampler: a tiny random Qwen3 rehearses (N = 0, 1, 2, both modes) and
then executes demo tasks against the real tool worlds. Scores near zero are expected; the run must
complete, count its extra tokens, and leave every imagined episode's no-tool guard untouched."""

from __future__ import annotations

from envace_jax.data.demo_tasks import generate_tasks
from envace_jax.envs.base import NoToolEnvironment
from envace_jax.envs.demo_worlds import make_env
from envace_jax.models import qwen3
from envace_jax.eval import rehearsal as R
from envace_jax.rl.judges import RuleJudge
from envace_jax.rl.policy_client import SamplerClient
from envace_jax.rl.reward import ChecklistTurnJudge
from envace_jax.rl.rollout import RoleSampling, RolloutConfig
from envace_jax.sampling import Sampler
from tests.helpers_rollout import codec


def test_tiny_random_model_rehearses_and_executes():
    c = codec()
    vocab = len(c.renderer.tokenizer)
    cfg = qwen3.Qwen3Config(
        vocab_size=max(vocab, 512),
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
    )
    model = qwen3.init_model(cfg, seed=0)
    # Fixed buckets keep the number of compiled programs (the cost of this test) small.
    sampler = Sampler(model, cache_size=1024, length_buckets=(512, 1024), batch_buckets=(4,), window_buckets=(1536,))
    client = SamplerClient(sampler, c.stop_token_ids)
    rollout = RolloutConfig(
        max_steps=6,
        max_model_len=100000,
        act=RoleSampling(max_new_tokens=12),
        rehearse=RoleSampling(max_new_tokens=12),
        seed=1,
    )
    tasks = generate_tasks(2, 11, "test")
    built = []

    def env(task):
        built.append(task["uid"])
        return make_env(task)

    def run(rcfg):
        runner = R.TestTimeRehearsal(rcfg, rollout, c, client, ChecklistTurnJudge(RuleJudge()), env)
        out = runner.run(tasks)
        for o in out.rehearsals:
            assert len(o.imagined) == rcfg.n and len(o.traces) == rcfg.n
            assert all(isinstance(e.env, NoToolEnvironment) and not e.env.calls for e in o.imagined)
            assert o.generated_tokens == sum(len(g.gen_ids) for e in o.imagined for g in e.generations)
            assert len(o.memory) <= rcfg.max_memory_chars and (o.memory != "") == (rcfg.n > 0)
        assert len(out.committed) == len(tasks) and all(e.done for e in out.committed)
        return out

    res = R.rehearsal_sweep(run, R.RehearsalConfig(max_memory_chars=400), ns=(0, 1, 2))
    assert len(res.rows) == 6 and len(built) == 5 * len(tasks)  # N=0 ran once, committed runs only
    for row in res.rows:
        assert 0.0 <= row["score"] <= 1.0 and row["tasks"] == 2
        assert (row["extra_generated_tokens"] > 0) == (row["n"] > 0)
    print(res.to_markdown(), "compilations:", sampler.num_compilations)
