"""Qwen3 model (``qwen3``), Hugging Face checkpoint import/export (``hf_io``; the ``config.json`` key
table is ``hf_config``), LoRA adapters (``lora``) and their PEFT files (``peft_io``)."""

from envace_jax.models import hf_io, lora, peft_io, qwen3
from envace_jax.models.hf_io import load_hf, save_hf
from envace_jax.models.lora import add_adapters, merge_into_base
from envace_jax.models.peft_io import load_adapter, save_adapter
from envace_jax.models.qwen3 import Qwen3, Qwen3Config, init_model

__all__ = [
    "Qwen3",
    "Qwen3Config",
    "add_adapters",
    "hf_io",
    "init_model",
    "load_adapter",
    "load_hf",
    "lora",
    "merge_into_base",
    "peft_io",
    "qwen3",
    "save_adapter",
    "save_hf",
]
