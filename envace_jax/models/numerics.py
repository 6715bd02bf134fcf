"""Dtype names and the attention mask value, shared by the model and its KV cache."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# Added to masked scores: large enough to zero them after softmax, small enough that sums never overflow.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def as_dtype(name: str | Any) -> Any:
    if isinstance(name, str):
        if name not in DTYPES:
            raise ValueError(f"unsupported dtype {name!r}; choose one of {sorted(DTYPES)}")
        return DTYPES[name]
    return jnp.dtype(name).type


def is_16bit_float(dtype: Any) -> bool:
    """bfloat16 or float16: the dtypes XLA CPU cannot scatter or gather without converting to float32."""
    d = jnp.dtype(dtype)
    return d.itemsize == 2 and jnp.issubdtype(d, jnp.floating)
