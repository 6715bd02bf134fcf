"""What the benchmarks share: the ~40M Qwen3 they all time, Qwen3-0.6B's shape, their analytic FLOPs,
the float32 matmul peak they report against, and building the transformers model and ours from the same
weights."""

from __future__ import annotations

import os
import tempfile
import time

from envace_jax.model_sizes import BENCH, QWEN3_0_6B as _QWEN3_0_6B, QWEN3_VOCAB  # plain Python: no jax

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp

from envace_jax.models import hf_io

# transformers' Qwen3Config fields: hidden 512, 8 layers, 8 heads, 4 kv heads, head_dim 64, vocab 32000,
# mlp 1536, tied embeddings (41.6M parameters).
CONFIG = dict(
    vocab_size=32000, **BENCH.hf_fields(), tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=1e6
)

# transformers' Qwen3Config fields of the released Qwen3-0.6B (its config.json): hidden 1024, 28 layers,
# 16 heads, 8 kv heads, head_dim 128, MLP 3072, vocabulary 151,936, tied embeddings (596.0M parameters,
# 440.5M of them outside the embedding). Benchmarks build it with random weights.
QWEN3_0_6B = dict(
    vocab_size=QWEN3_VOCAB,
    **_QWEN3_0_6B.hf_fields(),
    tie_word_embeddings=True,
    max_position_embeddings=40960,
    rope_theta=1e6,
)


def forward_flops(c: dict, batch: int, length: int, head_positions: int | None = None) -> float:
    """Matmul FLOPs of one forward pass (2 per multiply-add). Attention scores are counted over the
    full T x T square, since both implementations compute it before masking. The vocabulary head runs
    on ``head_positions`` positions (default every one of the ``batch * length``; fewer when a step
    projects only its trained positions)."""
    d, f, n, k, h, v, L = (
        c["hidden_size"],
        c["intermediate_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
        c["vocab_size"],
        c["num_hidden_layers"],
    )
    tokens = batch * length
    head_positions = tokens if head_positions is None else head_positions
    dense = L * (2 * d * n * h + 2 * d * k * h + 3 * d * f)  # q,o + k,v + mlp
    attn = L * 2 * batch * length * length * n * h  # QK^T and PV
    return 2.0 * (tokens * dense + head_positions * d * v + attn)


def train_step_flops(c: dict, batch: int, length: int, head_positions: int | None = None) -> float:
    """Matmul FLOPs of one training step: the forward and a backward of twice its work (the gradients of
    each matmul's input and of its weight), i.e. 6 x matmul weights x tokens plus attention, with the
    head on ``head_positions``. Recomputation under rematerialisation is not counted: this is the work
    a step must do, so a share of peak computed from it is comparable between implementations."""
    return 3 * forward_flops(c, batch, length, head_positions)


def timed(fn, clock=time.perf_counter) -> float:
    """Seconds of one call of ``fn`` on ``clock`` (wall by default; ``time.process_time`` counts the
    CPU time of every thread of the process, which other jobs on a shared machine disturb less)."""
    t0 = clock()
    fn()
    return clock() - t0


_MATMUL = jax.jit(lambda x: x @ x)


def matmul_peak_gflops(reps: int = 5) -> float:
    """Best-of-``reps`` GFLOP/s of a float32 2048 x 2048 jnp matmul (compiled before timing)."""
    a = jnp.ones((2048, 2048), jnp.float32)
    _MATMUL(a).block_until_ready()
    return 2 * 2048**3 / min(timed(lambda: _MATMUL(a).block_until_ready()) for _ in range(reps)) / 1e9


def decode_matmul_floor_s(batch: int, reps: int = 7, clock=time.perf_counter) -> float:
    """Best-of-``reps`` seconds of only the weight matmuls of one decode step of CONFIG at ``batch``
    rows (q, k, v, o, gate, up, down per layer, then the LM head), float32, jitted, in the faster of two
    layouts: the model's ``[in, out]`` matrices, or ``[out, in]`` with rows padded as the sampler's
    prepared weights run them (``qwen3.dot_out_in``; on a Xeon the faster one). Attention, norms and
    sampling are left out, so no decoder (ours or transformers') can take a step faster than this on this
    machine: it bounds the reachable ratio of two decoders' step times."""
    from envace_jax.models.qwen3 import dot_out_in

    c = CONFIG
    d, f, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    qd, kd = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    shapes = [(d, qd), (d, kd), (d, kd), (qd, d), (d, f), (d, f), (f, d)]
    layers = [[jnp.full(s, 1.0 / s[0], jnp.float32) for s in shapes] for _ in range(L)]
    head = jnp.full((d, c["vocab_size"]), 1.0 / d, jnp.float32)

    def chain(mul):
        @jax.jit
        def step(x, layers, head):
            for q, k, v, o, g, u, dn in layers:
                a = mul(x, q) + jnp.pad(mul(x, k) + mul(x, v), ((0, 0), (0, qd - kd)))
                x = x + mul(a, o)
                x = x + mul(mul(x, g) * mul(x, u), dn)
            return mul(x, head)

        return step

    x = jnp.ones((batch, d), jnp.float32)
    best = float("inf")
    for mul, ws, hd in ((jnp.matmul, layers, head), (dot_out_in, [[w.T for w in ly] for ly in layers], head.T)):
        step = chain(mul)
        step(x, ws, hd).block_until_ready()
        best = min(best, *(timed(lambda: step(x, ws, hd).block_until_ready(), clock) for _ in range(reps)))
    return best


def cache_read_floor_s(
    batch: int,
    slots: int,
    reps: int = 7,
    clock=time.perf_counter,
    config: dict | None = None,
    dtype: str = "float32",
) -> float:
    """Best-of-``reps`` seconds of one read of a ``dtype`` k/v cache of ``config`` (default CONFIG; every
    layer, ``batch`` rows, ``slots`` slots), as a jitted sum: what any decode step that attends to that
    cache must at least spend reading it."""
    c = CONFIG if config is None else config
    shape = (c["num_hidden_layers"], batch, c["num_key_value_heads"], c["head_dim"], slots)
    k, v = jnp.ones(shape, dtype), jnp.ones(shape, dtype)
    read = jax.jit(lambda k, v: k.sum() + v.sum())
    read(k, v).block_until_ready()
    return min(timed(lambda: read(k, v).block_until_ready(), clock) for _ in range(reps))


def build_models(threads: int, *, train: bool = False, config: dict | None = None, **config_overrides):
    """A seeded transformers Qwen3ForCausalLM (``.train()`` or ``.eval()``) on ``threads`` torch threads,
    and our Qwen3 loaded from its saved weights. ``config``: transformers Qwen3Config fields (default
    ``CONFIG``). Returns (torch model, our model)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    tm = Qwen3ForCausalLM(Qwen3Config(**(CONFIG if config is None else config), **config_overrides))
    tm = tm.train() if train else tm.eval()
    with tempfile.TemporaryDirectory() as d:
        tm.save_pretrained(d)
        model = hf_io.load_hf(d)
    return tm, model


def add_size_args(ap) -> None:
    """--reps, --batch, --length, --threads, as forward.py and train_step.py take them."""
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
