"""A repeated sampler call with the same shape buckets compiles nothing, and ``num_compilations``
counts what was compiled. The independent witness is jax's own compile log (``jax.log_compiles``):
one "Finished XLA compilation" record per backend compilation, whatever the cause (a new shape, or
the same shape with arguments placed differently, which jit compiles again without tracing)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from envace_jax.models import hf_io, qwen3
from envace_jax.sampling import Sampler, SamplingParams
from tests.helpers_models import make_tiny_hf_qwen3
from tests.helpers_paths import ROOT

V = 256


class _CompileLog(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.names: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("Finished XLA compilation of "):
            self.names.append(msg.split(" of ", 1)[1].rsplit(" in ", 1)[0])


@contextlib.contextmanager
def logged_compiles():
    """The names of the programs XLA compiled inside the block, from jax's compile log."""
    handler, logger = _CompileLog(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            yield handler.names
    finally:
        logger.removeHandler(handler)


def _prompts(seed, lengths):
    rng = np.random.RandomState(seed)
    return [rng.randint(3, V, n).tolist() for n in lengths]


def _loaded(tmp_path):
    # hf_io.load_hf places the parameters with device_put (committed), as every real checkpoint is.
    make_tiny_hf_qwen3(tmp_path, vocab_size=V)
    return hf_io.load_hf(str(tmp_path))


def _eager(tmp_path):
    return qwen3.init_model(qwen3.Qwen3Config.tiny(V), seed=1)  # parameters left uncommitted


@pytest.mark.parametrize("build", [_loaded, _eager], ids=["committed_params", "uncommitted_params"])
def test_second_generate_compiles_nothing(tmp_path, build):
    model = build(tmp_path)
    sampler = Sampler(model)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    with logged_compiles() as first:
        a = sampler.generate(_prompts(0, [5, 9, 12]), greedy)
    assert first, "the first call must compile its programs"
    assert sampler.num_compilations == len(first), first
    # Same buckets (3 rows -> 4, prompts <= 16 tokens): the cache the first call left is reused.
    with logged_compiles() as second:
        b = sampler.generate(_prompts(1, [7, 3, 14]), greedy)
    assert second == [], second
    assert sampler.num_compilations == len(first)
    assert a.tokens != b.tokens  # different prompts really ran
    # A continuation episode repeated with the same shapes compiles nothing the second time either.
    for episode in range(2):
        with logged_compiles() as names:
            out = sampler.generate(_prompts(2 + episode, [6, 4, 10]), greedy, return_state=True)
            sampler.continue_(out.state, _prompts(4 + episode, [3, 5, 2]), greedy)
        if episode == 1:
            assert names == [], names


def test_counter_sees_a_recompile_for_another_placement(tmp_path):
    # num_compilations counts XLA compilations, not traces: a call whose cache arrives placed
    # differently compiles the prefill again without tracing it, and the counter must see it.
    model = _loaded(tmp_path)
    sampler = Sampler(model)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
    sampler.generate(_prompts(0, [5, 9]), greedy)
    before = sampler.num_compilations
    k, v = sampler._spare
    sampler._spare = (
        tuple(jax.numpy.asarray(np.asarray(a)) for a in k),
        tuple(jax.numpy.asarray(np.asarray(a)) for a in v),
    )
    with logged_compiles() as names:
        sampler.generate(_prompts(1, [5, 9]), greedy)
    assert names, "an uncommitted cache should make jit compile again"
    assert sampler.num_compilations - before == len(names), names


SCRIPT = textwrap.dedent("""
    import json, logging
    import jax, numpy as np
    from envace_jax import sharding as shd
    from envace_jax.models import qwen3
    from envace_jax.sampling import Sampler, SamplingParams

    names = []
    class H(logging.Handler):
        def emit(self, r):
            if r.getMessage().startswith("Finished XLA compilation of "):
                names.append(r.getMessage())
    logging.getLogger("jax").addHandler(H())
    mesh = shd.make_mesh(data=2, fsdp=2, tensor=2)
    cfg = qwen3.Qwen3Config.tiny(256)
    s = Sampler(qwen3.init_model(cfg, seed=1, mesh=mesh, rules=shd.TRAIN_RULES))
    rng = np.random.RandomState(0)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    counts = []
    for call in range(3):
        prompts = [rng.randint(3, 256, n).tolist() for n in (5, 12, 9, 3, 7, 8, 4, 10)]
        with jax.log_compiles(True):
            before, c0 = len(names), s.num_compilations
            s.generate(prompts, greedy)
        counts.append([len(names) - before, s.num_compilations - c0])
    print(json.dumps(counts))
""")


def test_second_generate_on_a_mesh_compiles_nothing():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (first, _), *later = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first > 0
    assert later == [[0, 0], [0, 0]], later


def test_calls_alternating_between_two_windows_compile_nothing_new(tmp_path):
    # The cache left by a call is reused only by a call of the same window; a resized spare made one
    # prefill program per (previous window, new window) pair, so an alternation compiled again.
    sampler = Sampler(_loaded(tmp_path))
    prompts = _prompts(0, [5, 9, 12])
    budgets = (4, 60)  # windows of 16 + 4 and 16 + 60 slots fall in different buckets
    for n in budgets:
        sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=n))
    with logged_compiles() as names:
        for n in budgets * 2:
            sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=n))
    assert names == [], names
