"""Qwen3 model (``qwen3``) and Hugging Face checkpoint import/export (``hf_io``)."""

from envace_jax.models import hf_io, qwen3

__all__ = ["hf_io", "qwen3"]
