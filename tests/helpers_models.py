"""Helpers for the model tests: run transformers' Qwen3 on the same inputs as ours."""

from __future__ import annotations

import numpy as np


def left_padded_batch(rng: np.random.RandomState, vocab: int, lengths: list[int]):
    """Random ids ``[B, T]`` left-padded to ``max(lengths)``; returns (ids, mask) as int arrays."""
    T = max(lengths)
    ids = np.zeros((len(lengths), T), np.int64)
    mask = np.zeros((len(lengths), T), np.int64)
    for b, n in enumerate(lengths):
        ids[b, T - n:] = rng.randint(3, vocab, n)
        mask[b, T - n:] = 1
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
