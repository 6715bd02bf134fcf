"""Export a trained policy from an Orbax checkpoint to a Hugging Face directory.

    python launch/export_hf.py --config=configs/demo_cpu.py --config.run_dir=/tmp/demo \
        --out_dir=/tmp/demo_hf [--checkpoint_dir=/tmp/demo/checkpoints] [--step=N] [--role=act]

The output (config.json, safetensors, tokenizer files) loads with
``transformers.AutoModelForCausalLM.from_pretrained(out_dir)``. Without ``--step`` the newest good
checkpoint is used (a corrupt newest one falls back, as in training). ``--role`` picks the policy of a
``noshare`` run (act or rehearse); shared runs have one.

A LoRA run (``model.lora_rank`` / ``model.lora_adapter``) writes the merged model to ``out_dir`` and its adapter in
PEFT's format to ``--adapter_dir`` (default ``<out_dir>/adapter``): ``peft.PeftModel.from_pretrained(<base>,
adapter_dir)`` on the base (``model.hf_path``, recorded as ``base_model_name_or_path``), or vLLM's ``--lora-modules``.
"""

from __future__ import annotations

import os
import shutil
import sys

from absl import app, flags
from ml_collections import config_flags

from envace_jax.cli.entrypoint import run

_CONFIG = config_flags.DEFINE_config_file("config", None, "the run's ml-collections config file", lock_config=True)
_CKPT = flags.DEFINE_string("checkpoint_dir", None, "default: <run_dir>/checkpoints")
_OUT = flags.DEFINE_string("out_dir", None, "Hugging Face directory to write", required=True)
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: newest good)")
_ROLE = flags.DEFINE_string("role", None, "noshare runs: act or rehearse")
_SHARD = flags.DEFINE_string("max_shard_size", "5GB", "safetensors shard size")
_ADAPTER = flags.DEFINE_string(
    "adapter_dir", None, "LoRA runs: where the PEFT adapter goes (default <out_dir>/adapter)"
)


def export(
    cfg,
    out_dir: str,
    *,
    checkpoint_dir: str | None = None,
    step: int | None = None,
    role: str | None = None,
    max_shard_size: str = "5GB",
    adapter_dir: str | None = None,
) -> int:
    """Restores ``step`` (or the newest good step) and writes ``out_dir``; returns the step used."""
    from envace_jax.rl import train as rl_train
    from envace_jax.checkpoint import Checkpointer
    from envace_jax.models import hf_io

    ckpt_dir = checkpoint_dir or os.path.join(cfg.run_dir, "checkpoints")
    if not os.path.isdir(ckpt_dir):  # checked first: build_policies writes a demo tokenizer into run_dir
        raise FileNotFoundError(
            f"no checkpoint in {ckpt_dir} (give the training run's --config.run_dir or --checkpoint_dir)"
        )
    tok, codec, trainers, _, _ = rl_train.build_policies(cfg, None)
    distinct = {}
    for r, t in trainers.items():
        if all(t is not o for o in distinct.values()):
            distinct[r] = t
    if role is None:
        if len(distinct) > 1:
            raise ValueError(f"this run trains {sorted(distinct)} separately; pass --role")
        role = next(iter(distinct))
    if role not in trainers:
        raise ValueError(f"--role={role!r}: this run's checkpoint holds {sorted(distinct)}")
    target = {"iteration": 0, "trainers": {r: t.state_dict() for r, t in distinct.items()}}
    ck = Checkpointer(ckpt_dir, async_save=False, read_only=True)  # safe beside a run still training
    try:
        if step is None:
            res = ck.restore_latest_good(target)
            if res is None:
                raise FileNotFoundError(f"no checkpoint in {ck.directory}")
            state, step = res.state, res.step
        else:
            state, _ = ck.restore(step, target)
    finally:
        ck.close()
    trainer = trainers[role]
    trainer.load_state_dict(state["trainers"][[r for r, t in distinct.items() if t is trainer][0]])
    hf_io.save_hf(
        trainer.model,
        out_dir,
        max_shard_size=max_shard_size,
        eos_token_ids=codec.stop_token_ids,
        pad_token_id=tok.pad_token_id,
    )
    if trainer.lora:  # the adapter as PEFT writes it, beside the merged model save_hf wrote
        from envace_jax.models import peft_io

        peft_io.save_adapter(
            trainer.model,
            adapter_dir or os.path.join(out_dir, "adapter"),
            base=cfg.model.hf_path,
            rslora=cfg.model.lora_rslora,
        )
    tok_dir = cfg.tokenizer.path or os.path.join(cfg.run_dir, "tokenizer")
    for name in os.listdir(tok_dir):
        if name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
            shutil.copy(os.path.join(tok_dir, name), os.path.join(out_dir, name))
    return int(step)


def main(argv):
    del argv
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)
    from envace_jax.config import load_config

    if _CONFIG.value is None:
        raise app.UsageError("--config=<the run's config file> is required")
    cfg = load_config(_CONFIG.value)
    step = export(
        cfg,
        _OUT.value,
        checkpoint_dir=_CKPT.value,
        step=_STEP.value,
        role=_ROLE.value,
        max_shard_size=_SHARD.value,
        adapter_dir=_ADAPTER.value,
    )
    print(f"exported step {step} to {_OUT.value}", file=sys.stderr)


def cli() -> None:
    """``envace-export-hf`` and ``launch/export_hf.py``."""
    run(main)
