"""Qwen3 model (``qwen3``), Qwen3-MoE (``qwen3_moe``, its sparse block ``moe``), Hugging Face checkpoint
import/export (``hf_io``; the ``config.json`` key table is ``hf_config``), LoRA adapters (``lora``) and their PEFT
files (``peft_io``)."""

from envace_jax.models import hf_io, lora, moe, peft_io, qwen3, qwen3_moe
from envace_jax.models.hf_io import load_hf, save_hf
from envace_jax.models.lora import add_adapters, merge_into_base
from envace_jax.models.peft_io import load_adapter, save_adapter
from envace_jax.models.qwen3 import Qwen3, Qwen3Config, init_model
from envace_jax.models.qwen3_moe import Qwen3Moe
from envace_jax.models.qwen3_moe_config import Qwen3MoeConfig

__all__ = [
    "Qwen3",
    "Qwen3Config",
    "Qwen3Moe",
    "Qwen3MoeConfig",
    "add_adapters",
    "hf_io",
    "init_model",
    "load_adapter",
    "load_hf",
    "lora",
    "merge_into_base",
    "moe",
    "peft_io",
    "qwen3",
    "qwen3_moe",
    "save_adapter",
    "save_hf",
]
