"""Helpers for the model tests: build tiny random transformers Qwen3 checkpoints and run them on the same inputs
as ours."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from envace_jax.model_sizes import HF_TEST


def left_padded_batch(rng: np.random.RandomState, vocab: int, lengths: list[int]):
    """Random ids ``[B, T]`` left-padded to ``max(lengths)``; returns (ids, mask) as int arrays."""
    T = max(lengths)
    ids = np.zeros((len(lengths), T), np.int64)
    mask = np.zeros((len(lengths), T), np.int64)
    for b, n in enumerate(lengths):
        ids[b, T - n :] = rng.randint(3, vocab, n)
        mask[b, T - n :] = 1
    return ids, mask


def positions_from_mask(mask: np.ndarray) -> np.ndarray:
    """Left padding: valid tokens get 0, 1, 2, ...; padding gets 0."""
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0)


def torch_forward(model, ids: np.ndarray, mask: np.ndarray | None = None):
    """(logits [B,T,V], hidden states [L+1,B,T,D]) from a transformers model, as float32 numpy."""
    import torch

    kw = {}
    if mask is not None:
        kw = dict(attention_mask=torch.tensor(mask), position_ids=torch.tensor(positions_from_mask(mask)))
    with torch.no_grad():
        out = model(torch.tensor(ids), output_hidden_states=True, **kw)
    hidden = np.stack([h.float().numpy() for h in out.hidden_states])
    return out.logits.float().numpy(), hidden


def jit_forward(model, **static_kw):
    """``model(*args, **static_kw)`` as one jitted call (eager NNX dispatch is slow on a busy CPU)."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def f(state, *args):
        return nnx.merge(graphdef, state)(*args, **static_kw)

    return lambda *args: f(state, *args)


def _random_norms(model):
    """Random norm weights, so a q/k-norm or RMSNorm weight mix-up cannot hide behind ones (in place)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model


def make_tiny_hf_qwen3(
    out_dir,
    *,
    seed: int = 0,
    vocab_size: int = 256,
    hidden_size: int = HF_TEST.hidden_size,
    intermediate_size: int = HF_TEST.intermediate_size,
    num_layers: int = HF_TEST.num_layers,
    num_heads: int = HF_TEST.num_heads,
    num_kv_heads: int = HF_TEST.num_kv_heads,
    head_dim: int = HF_TEST.head_dim,
    tie: bool = False,
    rope_theta: float = 10000.0,
    dtype: str = "float32",
    **extra,
):
    """Builds a random transformers Qwen3ForCausalLM (sized ``model_sizes.HF_TEST`` unless told), saves it to
    out_dir, returns the torch model."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        tie_word_embeddings=tie,
        rope_theta=rope_theta,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        **extra,
    )
    model = _random_norms(Qwen3ForCausalLM(cfg).eval())
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(out_dir))
    return model


def make_tiny_hf_qwen3_moe(
    out_dir,
    *,
    seed: int = 0,
    vocab_size: int = 256,
    num_layers: int = 3,
    num_experts: int = 6,
    top_k: int = 2,
    norm_topk_prob: bool = True,
    mlp_only_layers: tuple[int, ...] = (),
    decoder_sparse_step: int = 1,
    tie: bool = False,
    **extra,
):
    """A random transformers Qwen3MoeForCausalLM (HF_TEST's attention, experts of 40), random norms, saved to
    out_dir in the Hub's per-expert layout; returns the torch model."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=HF_TEST.hidden_size,
        intermediate_size=HF_TEST.intermediate_size,
        moe_intermediate_size=40,
        num_hidden_layers=num_layers,
        num_attention_heads=HF_TEST.num_heads,
        num_key_value_heads=HF_TEST.num_kv_heads,
        head_dim=HF_TEST.head_dim,
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=norm_topk_prob,
        mlp_only_layers=list(mlp_only_layers),
        decoder_sparse_step=decoder_sparse_step,
        tie_word_embeddings=tie,
        rope_theta=10000.0,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        **extra,
    )
    model = _random_norms(Qwen3MoeForCausalLM(cfg).eval())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):  # a router spread wide enough that its top k are not near ties
                p.mul_(8.0)
    model.save_pretrained(str(out_dir))
    return model


_ON_TWO_DEVICES = """
import jax, numpy as np
from flax import nnx
from envace_jax.models import qwen3
from envace_jax.rl.trainer import Trainer
from envace_jax.sampling import Sampler
mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
model = qwen3.Qwen3(qwen3.Qwen3Config.tiny(64), rngs=nnx.Rngs(0))
try:
    {build}
except ValueError as e:
    print("REFUSED", e)
"""


def build_on_two_devices(build: str) -> subprocess.CompletedProcess:
    """Runs the statement ``build`` in a fresh process with two CPU devices, where ``mesh`` is a mesh of
    both and ``model`` a tiny Qwen3 (``Trainer`` and ``Sampler`` imported); its stdout holds ``REFUSED
    <message>`` when ``build`` raised a ValueError. For options that refuse a mesh of several devices."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    code = _ON_TWO_DEVICES.format(build=build)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
