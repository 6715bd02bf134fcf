"""Qwen3-MoE's sparse MLP block (models/moe.py) against transformers' ``Qwen3MoeSparseMoeBlock`` on CPU.

    python benchmarks/moe_block.py              # Qwen3-30B-A3B's block: hidden 2048, 128 experts of 768, top 8
    python benchmarks/moe_block.py --tokens 64,512 --experts 16 --reps 3 --dispatches blocked,dense

One block (router + experts), float32, the same random weights and tokens in both, at the widths of
Qwen3-30B-A3B. transformers runs its ``grouped_mm`` experts implementation (``torch._grouped_mm``, its
fastest on CPU); its default ``eager`` one (a Python loop over the experts) is timed for the forward alone,
since its backward indexes the stacked expert tensors once per expert (about 100 s a call at 64 tokens
here). Per token count: the forward, and the forward plus the gradient of a sum of the output with respect
to the input and every weight (``jax.grad`` / ``torch.autograd``). Repetitions alternate between ours and
transformers after a first, untimed call each; the table gives medians and HF seconds / ours against
``grouped_mm`` (above 1: ours is faster). Our dispatches: ``blocked`` (the CPU path), ``dense`` (every
expert on every token) and ``ragged`` (``lax.ragged_dot``, which XLA CPU expands into a dense masked
product).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

from envace_jax.models import moe


def hf_block(weights, top_k: int, norm_topk_prob: bool = True, impl: str = "grouped_mm"):
    """transformers' ``Qwen3MoeSparseMoeBlock`` (float32) holding our ``weights``: router ``[D, E]``, gate/up
    ``[E, D, F]``, down ``[E, F, D]`` as numpy arrays; transformers holds router ``[E, D]``, ``gate_up_proj``
    ``[E, 2F, D]`` and ``down_proj`` ``[E, D, F]``. ``norm_topk_prob`` defaults to the released checkpoints'
    True (the config class defaults to False)."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    router, gate, up, down = weights
    E, D, F = gate.shape
    cfg = Qwen3MoeConfig(
        hidden_size=D, moe_intermediate_size=F, num_experts=E, num_experts_per_tok=top_k, norm_topk_prob=norm_topk_prob
    )
    cfg._experts_implementation = impl  # transformers' experts interface: "eager" (a loop over experts), "grouped_mm"
    block = Qwen3MoeSparseMoeBlock(cfg).float()
    with torch.no_grad():
        block.gate.weight.copy_(torch.from_numpy(router.T.copy()))
        block.experts.gate_up_proj.copy_(
            torch.from_numpy(np.concatenate([gate.transpose(0, 2, 1), up.transpose(0, 2, 1)], axis=1))
        )
        block.experts.down_proj.copy_(torch.from_numpy(down.transpose(0, 2, 1).copy()))
    return block


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="64,512")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--moe_intermediate", type=int, default=768)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top_k", type=int, default=8)
    ap.add_argument("--block", type=int, default=None, help="blocked dispatch's rows per block (default: auto)")
    ap.add_argument("--dispatches", default="blocked")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    D, F, E, k = args.hidden, args.moe_intermediate, args.experts, args.top_k
    weights = (
        (rng.normal(size=(D, E)) * 0.02).astype(np.float32),
        (rng.normal(size=(E, D, F)) * 0.02).astype(np.float32),
        (rng.normal(size=(E, D, F)) * 0.02).astype(np.float32),
        (rng.normal(size=(E, F, D)) * 0.02).astype(np.float32),
    )
    hf = hf_block(weights, k, impl="grouped_mm")
    hf_eager = hf_block(weights, k, impl="eager")
    ours_w = tuple(jnp.asarray(w) for w in weights)
    rows = []
    for T in [int(t) for t in args.tokens.split(",") if t]:
        h = rng.normal(size=(T, D)).astype(np.float32)
        th = torch.from_numpy(h)
        jh = jnp.asarray(h)
        with torch.no_grad():
            want = hf(th[None]).numpy()[0]

        def hf_fwd():
            with torch.no_grad():
                hf(th[None])

        def hf_eager_fwd():
            with torch.no_grad():
                hf_eager(th[None])

        def hf_grad():
            x = th[None].clone().requires_grad_(True)
            hf.zero_grad(set_to_none=True)
            hf(x).sum().backward()

        for dispatch in [d for d in args.dispatches.split(",") if d]:
            fwd = jax.jit(
                lambda x, w, d=dispatch: moe.sparse_block(
                    x, *w, top_k=k, norm_topk_prob=True, dispatch=d, block=args.block
                )[0]
            )
            grad = jax.jit(
                jax.grad(
                    lambda x, w, d=dispatch: jnp.sum(
                        moe.sparse_block(x, *w, top_k=k, norm_topk_prob=True, dispatch=d, block=args.block)[0]
                    ),
                    argnums=(0, 1),
                )
            )
            got = np.asarray(fwd(jh, ours_w))
            err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
            jax.block_until_ready(grad(jh, ours_w))
            hf_fwd()
            hf_grad()
            hf_eager_fwd()
            t = {"ours_fwd": [], "hf_fwd": [], "eager_fwd": [], "ours_grad": [], "hf_grad": []}
            for _ in range(args.reps):
                t["ours_fwd"].append(_timed(lambda: jax.block_until_ready(fwd(jh, ours_w))))
                t["hf_fwd"].append(_timed(hf_fwd))
                t["eager_fwd"].append(_timed(hf_eager_fwd))
                t["ours_grad"].append(_timed(lambda: jax.block_until_ready(grad(jh, ours_w))))
                t["hf_grad"].append(_timed(hf_grad))
            m = {key: statistics.median(v) for key, v in t.items()}
            rows.append((T, dispatch, m, err))
            print(
                f"T={T} {dispatch}: forward ours {m['ours_fwd']:.3f} s, HF {m['hf_fwd']:.3f} s "
                f"({m['hf_fwd'] / m['ours_fwd']:.2f}x; eager {m['eager_fwd']:.3f} s); forward+grad ours "
                f"{m['ours_grad']:.3f} s, "
                f"HF {m['hf_grad']:.3f} s ({m['hf_grad'] / m['ours_grad']:.2f}x); max rel. diff {err:.1e}",
                flush=True,
            )
    print(
        f"\nblock: hidden {D}, {E} experts of {F}, top {k}, float32; medians of {args.reps}\n\n"
        "| tokens | dispatch | forward ours s | forward HF s | HF / ours | forward HF eager s | fwd+grad ours s "
        "| fwd+grad HF s | HF / ours | max rel. diff |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for T, dispatch, m, err in rows:
        print(
            f"| {T} | {dispatch} | {m['ours_fwd']:.3f} | {m['hf_fwd']:.3f} | {m['hf_fwd'] / m['ours_fwd']:.2f}x "
            f"| {m['eager_fwd']:.3f} "
            f"| {m['ours_grad']:.3f} | {m['hf_grad']:.3f} | {m['hf_grad'] / m['ours_grad']:.2f}x | {err:.1e} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
