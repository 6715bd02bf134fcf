"""Our sampler against transformers' ``generate`` at a real Qwen3 shape (``benchmarks/sampler.py --preset``).

Random weights, made by us and exported with ``hf_io.save_hf`` for transformers to load, so both decode
the same model, in the same dtype (``--dtype``: float32, or bfloat16 as Qwen3's released checkpoints are
stored; then both keep bfloat16 weights and activations and accumulate products in float32). Greedy, a
64-token prompt per row, no early stop. Per batch size, alternating ours
and HF in one process so both see the same machine load:
  - tokens/s at 32 new tokens (median of ``reps`` alternating calls) and how many rows' greedy tokens are
    equal;
  - the fixed cost per call and the decode step, by the difference method: calls with 40 and 8 new tokens
    (medians), step = (t40 - t8) / 32, fixed = t8 - 8 * step (prefill and per-call work);
  - the decode step against its floor, measured in the same run: the step's weight matmuls (the head
    included; on the sampler's own prepared weights, so the floor needs no third copy of them in memory)
    and one read of the live k/v cache (the window a 40-token call decodes over, ``common.cache_read_floor_s``),
    each timed alone as jitted code at the same batch;
  - where one 32-token call of ours spends its time (``Sampler.timed``: prefill, then decode) beside one
    HF forward over the prompts (HF's prefill).
"""

from __future__ import annotations

import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from common import QWEN3_0_6B, cache_read_floor_s, timed

from envace_jax.model_sizes import DEMO
from envace_jax.models import hf_io, qwen3
from envace_jax.sampling import Sampler, SamplingParams

PROMPT, NEW, LONG, SHORT = 64, 32, 40, 8
# transformers' Qwen3Config fields; float32, tied embeddings, Qwen3's vocabulary.
PRESETS = {
    "qwen3_0_6b": QWEN3_0_6B,
    # the same path in a minute: Qwen3's vocabulary over the demo's 2-layer body (a smoke run of the script)
    "smoke": dict(QWEN3_0_6B, **DEMO.hf_fields()),
}


def build(preset: str, threads: int, dtype: str = "float32"):
    """(our model, transformers' model) with the same random weights, both in ``dtype``."""
    from transformers import Qwen3ForCausalLM

    # the same reader as for a real config.json
    cfg = qwen3.Qwen3Config.from_hf(PRESETS[preset], dtype=dtype, param_dtype=dtype)
    model = qwen3.init_model(cfg, seed=0)
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as d:
        hf_io.save_hf(model, d)
        hf = Qwen3ForCausalLM.from_pretrained(d, dtype=getattr(torch, dtype)).eval()
    hf.generation_config.eos_token_id = None  # every row generates exactly the tokens asked for
    hf.generation_config.pad_token_id = 0
    return model, hf


def ours(sampler: Sampler, prompts, new: int) -> tuple[float, list[list[int]]]:
    t = time.perf_counter()
    out = sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=new))
    dt = time.perf_counter() - t
    assert all(n == new for n in out.lengths), out.finish_reasons
    return dt, out.tokens


def hf_generate(hf, prompts, new: int) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts)
    t = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new, min_new_tokens=new
        )
    dt = time.perf_counter() - t
    assert out.shape[1] == PROMPT + new
    return dt, out[:, PROMPT:].tolist()


def _mm(x, w, out_in: bool):
    """``x @ w`` (``x @ w.T`` for an ``[out, in]`` w, rows padded as the step pads them), accumulated in
    float32 and rounded to x's dtype, as the sampler's products are."""
    if out_in:
        return qwen3.dot_out_in(x, w, preferred_element_type=jnp.float32).astype(x.dtype)
    return jnp.matmul(x, w, preferred_element_type=jnp.float32).astype(x.dtype)


@jax.jit
def _weight_matmuls(x, weights):
    """The weight matmuls of one decode step (q, k, v, o, gate, up, down per layer, then the head) on
    ``x`` ``[B, D]``, in the layout the sampler's step reads (``qwen3.DecodeWeights``): what no decoder's
    step can undercut; attention, norms and sampling left out."""
    D = x.shape[-1]
    for p in weights.layers:
        if weights.out_in:  # qwen3.fuse_projections: [out, in] matrices
            qkv = _mm(x, p[qwen3.FUSED_QKV], True)
            n = p[qwen3.O_OUT_IN].shape[1]
            x = x + _mm(qkv[:, :n] + qkv[:, n:].sum(-1, keepdims=True), p[qwen3.O_OUT_IN], True)
            g, u = jnp.split(_mm(x, p[qwen3.FUSED_GATE_UP], True), 2, axis=1)
            x = x + _mm(g * u, p[qwen3.DOWN_OUT_IN], True)
            continue
        o = p["o_proj"].reshape(-1, D)
        q = _mm(x, p["q_proj"].reshape(D, -1), False)
        kv = _mm(x, p["k_proj"].reshape(D, -1), False) + _mm(x, p["v_proj"].reshape(D, -1), False)
        x = x + _mm(q + jnp.pad(kv, ((0, 0), (0, q.shape[1] - kv.shape[1]))), o, False)
        x = x + _mm(_mm(x, p["gate_proj"], False) * _mm(x, p["up_proj"], False), p["down_proj"], False)
    head = weights.head
    x = x.astype(head.dtype)
    if head.shape[0] == D:
        return jnp.matmul(x, head, preferred_element_type=jnp.float32)
    return qwen3.dot_out_in(x, head, preferred_element_type=jnp.float32)


def weight_matmul_floor_s(sampler: Sampler, batch: int, reps: int = 5) -> float:
    """Best-of-``reps`` seconds of ``_weight_matmuls`` at ``batch`` rows, on the weights the sampler reads."""
    prepared = sampler.prepared_weights
    if prepared is None:
        prepared = sampler.model.decode_weights()
    if prepared.head is None:  # the step reads the model's own head: a tied embedding, [V, D]
        prepared = qwen3.DecodeWeights(prepared.layers, sampler.model.head_weight()[0])
    x = jnp.full((batch, sampler.cfg.hidden_size), 0.01, qwen3.as_dtype(sampler.cfg.dtype))
    _weight_matmuls(x, prepared).block_until_ready()
    return min(timed(lambda: _weight_matmuls(x, prepared).block_until_ready()) for _ in range(reps))


def floor_and_split(sampler: Sampler, prompts, cfg: dict) -> dict:
    """Our decode step's floor at this batch and where one NEW-token call of ours goes: ``window`` (the cache a
    LONG-token call decodes over; the sampler sizes it per call), ``floor_matmul_s`` and ``floor_cache_s``, then
    ``ours_prefill_s`` and ``ours_decode_s`` (``Sampler.timed``; it stays on afterwards)."""
    batch = len(prompts)
    res = {}
    state = sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=LONG), return_state=True).state
    res["window"] = int(state.k[0].shape[qwen3.CACHE_K_SLOT_AXIS])
    del state
    res["floor_matmul_s"] = weight_matmul_floor_s(sampler, batch)
    res["floor_cache_s"] = cache_read_floor_s(batch, res["window"], reps=5, config=cfg, dtype=sampler.cfg.dtype)
    sampler.timed = True
    before = (sampler.stats.prefill_s, sampler.stats.decode_s)
    ours(sampler, prompts, NEW)
    res["ours_prefill_s"] = sampler.stats.prefill_s - before[0]
    res["ours_decode_s"] = sampler.stats.decode_s - before[1]
    return res


def split(t_long: float, t_short: float) -> tuple[float, float]:
    """(fixed cost per call, decode step) from the medians of LONG- and SHORT-token calls."""
    step = (t_long - t_short) / (LONG - SHORT)
    return t_short - SHORT * step, step


def one_batch(preset: str, model, hf, batch: int, reps: int, rng) -> dict:
    cfg = PRESETS[preset]
    sampler = Sampler(model)
    prompts = [rng.randint(3, cfg["vocab_size"], PROMPT).tolist() for _ in range(batch)]
    for n in (NEW, LONG, SHORT):  # compile every budget before timing
        ours(sampler, prompts, n)
    hf_generate(hf, prompts, SHORT)
    res = {"batch": batch, "compiles_while_timed": sampler.num_compilations}

    t_o, t_h = [], []
    for _ in range(reps):
        dt, tok_o = ours(sampler, prompts, NEW)
        t_o.append(dt)
        dt, tok_h = hf_generate(hf, prompts, NEW)
        t_h.append(dt)
    res["ours_s"], res["hf_s"] = statistics.median(t_o), statistics.median(t_h)
    res["equal_rows"] = sum(a == b for a, b in zip(tok_o, tok_h))

    runs = {k: [] for k in ("ours_long", "ours_short", "hf_long", "hf_short")}
    for _ in range(reps):
        runs["ours_long"].append(ours(sampler, prompts, LONG)[0])
        runs["ours_short"].append(ours(sampler, prompts, SHORT)[0])
        runs["hf_long"].append(hf_generate(hf, prompts, LONG)[0])
        runs["hf_short"].append(hf_generate(hf, prompts, SHORT)[0])
    med = {k: statistics.median(v) for k, v in runs.items()}
    res["ours_fixed_s"], res["ours_step_s"] = split(med["ours_long"], med["ours_short"])
    res["hf_fixed_s"], res["hf_step_s"] = split(med["hf_long"], med["hf_short"])
    res["compiles_while_timed"] = sampler.num_compilations - res["compiles_while_timed"]

    res.update(floor_and_split(sampler, prompts, cfg))
    # HF's forward over the prompts, beside our prefill
    ids = torch.tensor(prompts)
    with torch.no_grad():
        t = time.perf_counter()
        hf(ids, attention_mask=torch.ones_like(ids), logits_to_keep=1)
        res["hf_prefill_s"] = time.perf_counter() - t
    return res


def report(res: dict) -> list[str]:
    b, new = res["batch"], NEW
    tps_o, tps_h = b * new / res["ours_s"], b * new / res["hf_s"]
    floor = res["floor_matmul_s"] + res["floor_cache_s"]
    return [
        f"batch {b:2d}: ours {tps_o:7.2f} tok/s ({res['ours_s']:.2f} s)  HF {tps_h:7.2f} tok/s ({res['hf_s']:.2f} s)  "
        f"ours/HF {tps_o / tps_h:.2f}x  greedy tokens equal {res['equal_rows']}/{b} rows",
        f"batch {b:2d}: fixed cost per call ours {res['ours_fixed_s']:.2f} s, HF {res['hf_fixed_s']:.2f} s; "
        f"decode step ours {1e3 * res['ours_step_s']:.1f} ms, HF {1e3 * res['hf_step_s']:.1f} ms",
        f"batch {b:2d}: decode step floor {1e3 * floor:.1f} ms (weight matmuls incl. head "
        f"{1e3 * res['floor_matmul_s']:.1f} + one read of the {res['window']}-slot k/v cache "
        f"{1e3 * res['floor_cache_s']:.1f}); ours step / floor {res['ours_step_s'] / floor:.2f}x",
        f"batch {b:2d}: one {new}-token call of ours: prefill {res['ours_prefill_s']:.2f} s + decode "
        f"{res['ours_decode_s']:.2f} s; HF forward over the prompts {res['hf_prefill_s']:.2f} s; "
        f"XLA compiles during the timed calls: {res['compiles_while_timed']}",
    ]


def markdown(results: list[dict]) -> str:
    rows = [
        "| batch | ours tok/s | HF tok/s | ours vs HF | greedy equal | fixed/call ours | fixed/call HF "
        "| step ours | step HF | step floor | ours step / floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        b = r["batch"]
        tps_o, tps_h = b * NEW / r["ours_s"], b * NEW / r["hf_s"]
        floor = r["floor_matmul_s"] + r["floor_cache_s"]
        rows.append(
            f"| {b} | {tps_o:.2f} | {tps_h:.2f} | {tps_o / tps_h:.2f}x | {r['equal_rows']}/{b} | "
            f"{r['ours_fixed_s']:.2f} s | {r['hf_fixed_s']:.2f} s | {1e3 * r['ours_step_s']:.0f} ms | "
            f"{1e3 * r['hf_step_s']:.0f} ms | {1e3 * floor:.0f} ms | {r['ours_step_s'] / floor:.2f}x |"
        )
    return "\n".join(rows)


def run(preset: str, batches: list[int], reps: int, threads: int, dtype: str = "float32") -> None:
    rng = np.random.RandomState(0)
    t = time.perf_counter()
    model, hf = build(preset, threads, dtype)
    c = PRESETS[preset]
    print(
        f"preset {preset}: {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, vocab {c['vocab_size']}, "
        f"{dtype}, random weights ({model.config.num_params() / 1e6:.0f}M parameters; built in "
        f"{time.perf_counter() - t:.0f} s); prompt {PROMPT}, {NEW} new tokens, greedy, median of {reps}; "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )
    results = []
    for b in batches:
        res = one_batch(preset, model, hf, b, reps, rng)
        results.append(res)
        print("\n".join(report(res)), flush=True)
    print(markdown(results))
