"""The fixed-lag pipeline (``rl.max_staleness``) on a real tiny Qwen3: each step samples from the weights it
should, a run repeats bit for bit whatever the judge's latency, every rollout mode runs, the correction is
applied, and a checkpoint resumes only with its own lag."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from envace_jax.rl import train as rl_train
from envace_jax.rl.async_pipeline import trained_models
from envace_jax.rl.batch import build_batch
from envace_jax.rl.loopback_judge import LoopbackJudge
from tests import helpers_loop as h


@pytest.fixture(scope="module", autouse=True)
def _compile_cache():
    h.use_compile_cache()


def _snapshot(model):
    return jax.tree.map(np.array, nnx.state(model, nnx.Param))


def _flat(snapshot) -> list[np.ndarray]:
    return jax.tree.leaves(snapshot)


def _drive(cfg, steps: int):
    """Runs ``steps`` steps of ``cfg`` through its pipeline; returns (results, the policy's parameters after
    each update, run)."""
    run = rl_train.build_run(cfg)
    policy = trained_models(run.step_fn)["policy"]
    versions = [_snapshot(policy)]
    results = []
    try:
        for k in range(steps):
            results.append(run.pipeline(k))
            versions.append(_snapshot(policy))
    finally:
        run.pipeline.close()
        run.ckpt.close()
        run.writer.close()
    return results, versions, run


def _sampler_vs_version(run, result, params) -> float:
    """Largest |sampler log-prob - trainer log-prob| over a step's generated tokens, the trainer holding
    ``params`` (one weights version)."""
    trainer = next(iter(run.distinct_trainers().values()))
    state = nnx.state(trainer.model, nnx.Param)
    nnx.update(trainer.model, jax.tree.map(jnp.asarray, params))
    gens = [g for e in result.episodes for g in e.generations]
    batch = build_batch(gens, np.zeros(len(gens)), np.zeros(len(gens)), max_len=320, length_multiple=64)
    got = trainer.compute_logprobs(batch)
    nnx.update(trainer.model, state)
    return float(np.max(np.abs(got - batch.old_logprobs) * batch.loss_weights))


def test_steps_sample_from_the_lagged_weights_and_repeat_under_any_judge_latency(tmp_path):
    s, steps = 2, 5
    # the slow judge's answers come back out of order (a random delay per request)
    with LoopbackJudge(latency_s=0.0) as fast, LoopbackJudge(latency_s=0.02, jitter_s=0.1, seed=7) as slow:
        kw = {"rl.max_staleness": s, "judge.kind": "http", "rollout.act.max_new_tokens": 12}
        a, versions, run = _drive(
            h.tiny_config(str(tmp_path / "a"), steps, **kw, **{"judge.http.base_url": fast.url}), steps
        )
        b, _, _ = _drive(h.tiny_config(str(tmp_path / "b"), steps, **kw, **{"judge.http.base_url": slow.url}), steps)
        assert fast.requests > 0 and fast.requests == slow.requests
    assert run.step_fn.engine.cfg.judge_streaming == "on"  # "auto": an HTTP judge in an asynchronous run
    for k, res in enumerate(a):
        m = res.metrics
        assert m["async/staleness_max"] == min(k, s) and m["async/weights_version"] == max(0, k - s)
        assert 0.0 <= m["update/is_truncated"] <= 1.0 and m["update/is_weight"] > 0
    # the judge's latency changes nothing: same episodes, same log-probs, same parameters
    for ra, rb in zip(a, b):
        ga = [(g.gen_ids, g.logprobs) for e in ra.episodes for g in e.generations]
        gb = [(g.gen_ids, g.logprobs) for e in rb.episodes for g in e.generations]
        assert ga == gb
    # step k's rows were sampled by version max(0, k - s): the trainer reproduces their log-probs there
    # (float32, the same model code: to rounding), and not at the version of its own update
    for k in range(s, steps):
        exact = _sampler_vs_version(run, a[k], versions[k - s])
        wrong = _sampler_vs_version(run, a[k], versions[k])
        assert exact < 1e-4 < wrong, (k, exact, wrong)


def test_a_run_repeats_bit_for_bit_through_train(tmp_path):
    outs = []
    for name in ("a", "b"):
        cfg = h.tiny_config(str(tmp_path / name), 4, **{"rl.max_staleness": 1, "rollout.rolling": True})
        rl_train.train(cfg, dump_params=str(tmp_path / f"{name}.npz"))
        outs.append(dict(np.load(tmp_path / f"{name}.npz")))
    assert outs[0].keys() == outs[1].keys()
    assert all(np.array_equal(outs[0][k], outs[1][k]) for k in outs[0])


@pytest.mark.parametrize("mode", ["noshare", "simulator", "real"])
def test_every_rollout_mode_runs_lagged(tmp_path, mode):
    kw = {"rl.max_staleness": 1, "rollout.mode": mode}
    if mode == "real":  # real tools: the demo tasks and their worlds
        kw.update({"data.source": "demo", "data.path": "", "rollout.max_model_len": 1024, "rl.max_row_length": 1024})
    cfg = h.tiny_config(str(tmp_path), 3, **kw)
    results, versions, run = _drive(cfg, 3)
    assert [r.metrics["async/staleness_max"] for r in results] == [0.0, 1.0, 1.0]
    assert all(r.rows > 0 for r in results)
    if mode == "noshare":  # both policies train, each copied to every slot
        assert set(run.pipeline.slots[0].copies) == {"policy", "simulator"}
        assert any(k.startswith("rehearse") for k in run.params())
    else:
        assert set(run.pipeline.slots[0].copies) == {"policy"}
    assert any(not np.array_equal(a, b) for a, b in zip(_flat(versions[0]), _flat(versions[-1])))


def test_synchronous_run_has_no_pipeline_and_a_checkpoint_keeps_its_lag(tmp_path):
    sync = rl_train.build_run(h.tiny_config(str(tmp_path / "sync"), 2))
    assert sync.pipeline is None and "async" not in sync.state()
    sync.ckpt.close()
    sync.writer.close()
    d = str(tmp_path / "lagged")
    rl_train.train(h.tiny_config(d, 2, **{"rl.max_staleness": 1}))
    with pytest.raises(RuntimeError, match="no usable checkpoint"):
        rl_train.train(h.tiny_config(d, 3, **{"rl.max_staleness": 2}))
