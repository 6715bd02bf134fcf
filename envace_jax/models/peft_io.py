"""LoRA adapters as PEFT writes them: ``adapter_config.json`` and ``adapter_model.safetensors``.

The files load with ``peft.PeftModel.from_pretrained(<the HF base>, <dir>)`` and are what vLLM's ``--lora-modules``
serves. Tensor names are PEFT's for ``Qwen3ForCausalLM`` with the adapter name stripped::

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, in_features]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [out_features, r]

PEFT only warns about adapter tensors it cannot place and leaves those projections un-adapted, so reading here is
strict: every tensor the config's targets call for must be present with its shape, and nothing else may be.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import jax
import numpy as np

from envace_jax.models import lora

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model.model.layers"


def tensor_name(layer: int, target: str, which: str) -> str:
    """PEFT's name of layer ``layer``'s ``target`` adapter matrix ``which`` ("A" or "B")."""
    return f"{PREFIX}.{layer}.{lora.TARGETS[target][1]}.lora_{which}.weight"


def _alpha(scale: float, rank: int, rslora: bool) -> float | int:
    alpha = scale * (math.sqrt(rank) if rslora else rank)
    return int(round(alpha)) if abs(alpha - round(alpha)) < 1e-6 else float(alpha)  # PEFT and vLLM type it as int


def adapter_config(rank: int, alpha: float | int, targets, *, base: str = "", rslora: bool = False) -> dict[str, Any]:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": int(rank),
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": list(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": bool(rslora),
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
        "init_lora_weights": True,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def peft_tensors(model) -> tuple[dict[str, np.ndarray], int, tuple[str, ...]]:
    """The model's adapters as PEFT tensors (float32), with the rank and the adapted projections."""
    arrays = lora.adapter_arrays(model)
    targets = lora.adapted(arrays)
    if not targets:
        raise ValueError("the model has no LoRA adapters to write")
    out: dict[str, np.ndarray] = {}
    rank = 0
    for t in targets:
        a = np.asarray(jax.device_get(arrays[t + lora.A_SUFFIX]), np.float32)  # [L, *in, r]
        b = np.asarray(jax.device_get(arrays[t + lora.B_SUFFIX]), np.float32)  # [L, r, *out]
        rank = a.shape[-1]
        for i in range(a.shape[0]):
            out[tensor_name(i, t, "A")] = np.ascontiguousarray(a[i].reshape(-1, rank).T)
            out[tensor_name(i, t, "B")] = np.ascontiguousarray(b[i].reshape(rank, -1).T)
    return out, rank, targets


def save_adapter(model, out_dir: str, *, base: str = "", rslora: bool = False) -> dict[str, Any]:
    """Writes the model's adapters to ``out_dir`` in PEFT's format (process 0 writes; every process calls this
    when the adapters are sharded over several). Returns the adapter config."""
    from safetensors.numpy import save_file

    tensors, rank, targets = peft_tensors(model)
    config = adapter_config(rank, _alpha(model.config.lora_scale, rank, rslora), targets, base=base, rslora=rslora)
    if jax.process_index() == 0:
        os.makedirs(out_dir, exist_ok=True)
        tmp = os.path.join(out_dir, WEIGHTS_FILE + ".tmp")
        save_file(tensors, tmp, metadata={"format": "pt"})
        os.replace(tmp, os.path.join(out_dir, WEIGHTS_FILE))
        with open(os.path.join(out_dir, CONFIG_FILE + ".tmp"), "w") as f:
            json.dump(config, f, indent=2)
        os.replace(os.path.join(out_dir, CONFIG_FILE + ".tmp"), os.path.join(out_dir, CONFIG_FILE))
    return config


def read_adapter_config(adapter_dir: str) -> dict[str, Any]:
    path = os.path.join(adapter_dir, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {CONFIG_FILE} in {adapter_dir!r}: not a PEFT adapter directory")
    with open(path) as f:
        cfg = json.load(f)
    problems = []
    if cfg.get("peft_type", "LORA") != "LORA":
        problems.append(f"peft_type {cfg.get('peft_type')!r} (only LORA)")
    for key, ok in (("use_dora", False), ("fan_in_fan_out", False)):
        if cfg.get(key, ok) != ok:
            problems.append(f"{key}={cfg.get(key)!r}")
    if cfg.get("bias", "none") != "none":
        problems.append(f"bias={cfg.get('bias')!r} (only 'none')")
    if cfg.get("modules_to_save"):
        problems.append(f"modules_to_save={cfg.get('modules_to_save')!r}")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        problems.append("per-module rank_pattern/alpha_pattern")
    targets = cfg.get("target_modules")
    if isinstance(targets, str) or not targets:
        problems.append(f"target_modules={targets!r} (a list of projection names)")
    elif set(targets) - set(lora.TARGETS):
        problems.append(
            f"target_modules {sorted(set(targets) - set(lora.TARGETS))} (a Qwen3 adapts {lora.DEFAULT_TARGETS})"
        )
    if problems:
        raise ValueError(f"adapter {adapter_dir!r} is not one this model can load: " + "; ".join(problems))
    return cfg


def load_adapter(model, adapter_dir: str, *, seed: int = 0):
    """Adds the PEFT adapter in ``adapter_dir`` to ``model`` (which must have none yet; in place, returns it).
    Every tensor must be there with its shape, and no other: a name PEFT would silently skip is an error here."""
    from safetensors.numpy import load_file

    cfg = read_adapter_config(adapter_dir)
    path = os.path.join(adapter_dir, WEIGHTS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {WEIGHTS_FILE} in {adapter_dir!r}")
    tensors = load_file(path)
    rank, targets, rslora = int(cfg["r"]), lora.parse_targets(cfg["target_modules"]), bool(cfg.get("use_rslora"))
    lora.add_adapters(model, rank, float(cfg["lora_alpha"]), targets, seed=seed, rslora=rslora)
    want = {}
    layers = model.layers
    L = model.config.num_layers
    for t in targets:
        a_var, b_var = getattr(layers, t + lora.A_SUFFIX), getattr(layers, t + lora.B_SUFFIX)
        ins, outs = a_var.shape[1:-1], b_var.shape[2:]
        for i in range(L):
            want[tensor_name(i, t, "A")] = (rank, int(np.prod(ins)))
            want[tensor_name(i, t, "B")] = (int(np.prod(outs)), rank)
    missing = sorted(set(want) - set(tensors))
    extra = sorted(set(tensors) - set(want))
    bad = sorted(n for n in set(want) & set(tensors) if tuple(tensors[n].shape) != want[n])
    if missing or extra or bad:
        details = []
        if missing:
            details.append(f"{len(missing)} missing (e.g. {missing[0]})")
        if extra:
            details.append(f"{len(extra)} unexpected (e.g. {extra[0]})")
        if bad:
            details.append(
                f"{len(bad)} of the wrong shape (e.g. {bad[0]}: {tensors[bad[0]].shape}, want {want[bad[0]]})"
            )
        raise ValueError(f"adapter {adapter_dir!r} does not fit this model: " + "; ".join(details))
    for t in targets:
        a_var, b_var = getattr(layers, t + lora.A_SUFFIX), getattr(layers, t + lora.B_SUFFIX)
        ins, outs = a_var.shape[1:-1], b_var.shape[2:]
        a = np.stack([tensors[tensor_name(i, t, "A")].T.reshape(*ins, rank) for i in range(L)])
        b = np.stack([tensors[tensor_name(i, t, "B")].T.reshape(rank, *outs) for i in range(L)])
        a_var.set_value(jax.device_put(a.astype(a_var.get_value().dtype), a_var.get_value().sharding))
        b_var.set_value(jax.device_put(b.astype(b_var.get_value().dtype), b_var.get_value().sharding))
    return model
