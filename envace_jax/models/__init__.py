"""Qwen3 model (``qwen3``) and Hugging Face checkpoint import/export (``hf_io``; the ``config.json`` key
table is ``hf_config``)."""

from envace_jax.models import hf_io, qwen3
from envace_jax.models.hf_io import load_hf, save_hf
from envace_jax.models.qwen3 import Qwen3, Qwen3Config, init_model

__all__ = ["Qwen3", "Qwen3Config", "hf_io", "init_model", "load_hf", "qwen3", "save_hf"]
