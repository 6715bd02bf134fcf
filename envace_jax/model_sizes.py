"""The sizes of the small random Qwen3 models (tests, CI runs, the demo, benchmarks): one table.

Real checkpoints carry their own sizes (``config.json``, or the ``qwen3.Qwen3Config`` presets of the
released models); everything that builds a model from scratch picks one of these by name, so a size is
written down once. Plain Python (no jax), so the host-side config sections can use it for their defaults.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """The architecture numbers of a Qwen3 besides its vocabulary (which follows the tokenizer)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def fields(self) -> dict[str, int]:
        """As ``qwen3.Qwen3Config`` keyword arguments (also the names of the config sections' fields)."""
        return dataclasses.asdict(self)

    def hf_fields(self) -> dict[str, int]:
        """As transformers' ``Qwen3Config`` keyword arguments (its names for layers and heads differ)."""
        return {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
        }


# The default tiny model: ``Qwen3Config.tiny``, the training config's ``model.preset = "tiny"`` section,
# ``configs/demo_cpu.py`` and the eval harness's ``model.random_tiny``.
TINY = ModelSize(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
# Seconds-long CI runs of the demo pipeline and of pretraining (``demo.config.reduced``, ``demo.pretrain.tiny``).
MICRO = ModelSize(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16)
# The embedded demo's model (``make demo``, ``make pretrain``; ``benchmarks/train_step.py --demo``).
DEMO = ModelSize(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32)
# The transformers-built checkpoint of the model tests (``tests/helpers_models.make_tiny_hf_qwen3``): head_dim 24 is not
# hidden/heads and the MLP width 96 is no multiple of the hidden size, so a transposed or mis-split
# tensor cannot pass on its shape.
HF_TEST = ModelSize(hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=24)
# The side-by-side performance scripts' model (``benchmarks/common.py``; 41.6M parameters with its vocabulary).
BENCH = ModelSize(hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64)

SIZES: dict[str, ModelSize] = {"tiny": TINY, "micro": MICRO, "demo": DEMO, "hf_test": HF_TEST, "bench": BENCH}

# Qwen3-0.6B's architecture (its released config.json), which the benchmarks build with random weights at
# the real vocabulary (``benchmarks/common.QWEN3_0_6B``, ``peers.py``, ``sampler_real_shape.py``,
# ``real_shape_step.py``). Not in SIZES: those name the small models a config's ``model.preset`` may build,
# and a real Qwen3-0.6B is ``qwen3.Qwen3Config.qwen3_0_6b`` (written from the release on its own, so that
# tests can hold the two against each other).
QWEN3_0_6B = ModelSize(
    hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128
)
# The vocabulary (embedding rows) of every released Qwen3: its tokenizer's tokens, padded.
QWEN3_VOCAB = 151936
