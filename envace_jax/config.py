"""Experiment configuration: ml_collections ConfigDict -> validated frozen dataclasses.

Config files under ``configs/`` build a ``ConfigDict`` (so every field can be overridden from the
command line with ``--config.a.b=v``); ``load_config`` turns it into an ``ExperimentConfig``. Every
field is checked against its dataclass type and range, and an error names the dotted config field
(``config.optim.lr``), so a typo in a launch command fails before any device work starts.

The trainer's ``OptimConfig``/``LossConfig`` and the rollout's ``RolloutConfig`` are used as they are
(one definition of each knob); the remaining sections are defined here.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Mapping

from envace_jax.rl.judges import HttpJudgeConfig
from envace_jax.rl.rollout import MODES, RoleSampling, RolloutConfig
from envace_jax.rl.trainer import LossConfig, OptimConfig
from envace_jax.rl.advantages import BASELINES
from envace_jax.rl.loss import AGG_MODES, KL_TYPES


class ConfigError(ValueError):
    """A config field has the wrong type, an out-of-range value, or is unknown."""


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """Where the policy comes from: a local HF directory (``hf_path``) or a random init of ``preset``."""

    hf_path: str = ""               # local Hugging Face directory; empty = random init (tiny configs)
    preset: str = "tiny"            # used for random init: tiny | qwen3_0_6b | qwen3_8b | ...
    vocab_size: int = 512           # tiny preset only (overridden by the tokenizer's size when larger)
    hidden_size: int = 64
    intermediate_size: int = 96
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    param_dtype: str = "float32"
    dtype: str = "float32"          # compute dtype (reference: bf16 compute, fp32 master params)
    remat_policy: str = "none"
    init_seed: int = 0
    simulator_hf_path: str = ""     # simulator/noshare modes: the frozen or second REHEARSE model


@dataclasses.dataclass(frozen=True)
class TokenizerSection:
    path: str = ""                  # local HF tokenizer directory; empty = build the offline demo tokenizer
    enable_thinking: bool = True    # reference: thinking on for both roles
    simulator_thinking: bool = True
    demo_vocab_size: int = 480


@dataclasses.dataclass(frozen=True)
class DataSection:
    source: str = "demo"            # demo | jsonl | parquet | tfds
    path: str = ""                  # file (jsonl/parquet) or tfds data_dir
    tfds_name: str = "envace_records"
    split: str = "train"
    num_demo_tasks: int = 64
    prompts_per_step: int = 16      # reference train_batch_size
    shuffle: bool = True
    seed: int = 0
    num_epochs: int = 0             # 0 = repeat forever
    max_prompt_length: int = 4000   # reference: filter prompts by this (keeps <= max - margin)


@dataclasses.dataclass(frozen=True)
class JudgeSection:
    kind: str = "rule"              # rule | http | rule_then_http (rules first, HTTP for items without one)
    http: HttpJudgeConfig = dataclasses.field(default_factory=HttpJudgeConfig)


@dataclasses.dataclass(frozen=True)
class RLSection:
    n_rollouts: int = 4             # env.rollout.n
    baseline: str = "row_mean"
    normalize_std: bool = False
    empty_output_penalty: float = 0.1
    recompute_old_logprobs: bool = True
    ppo_epochs: int = 1
    mini_batches: int = 1
    micro_batch_size: int = 1
    max_row_length: int = 20000     # prompt + response tokens of one row (prompts left-truncated)
    length_multiple: int = 64
    adjust_batch_multiple: int = 0  # faithful: duplicate random rows up to a multiple (reference 128); 0 = off
    # rows longer than max_row_length: drop (default; the trainer never scores a context the sampler did
    # not see) or truncate (left-truncate the prompt, as the reference's row padding does)
    overlong_rows: str = "drop"


@dataclasses.dataclass(frozen=True)
class MeshSection:
    data: int = 1
    fsdp: int = -1
    tensor: int = 1


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    every: int = 50                 # reference save_freq
    keep: int = 3
    async_save: bool = True
    hash_files: bool = False


@dataclasses.dataclass(frozen=True)
class LogSection:
    every: int = 1
    tensorboard: bool = True
    plot: bool = True
    progress_bar: bool = True


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    name: str = "envace"
    run_dir: str = "runs/envace"
    seed: int = 0
    total_steps: int = 200
    model: ModelSection = ModelSection()
    tokenizer: TokenizerSection = TokenizerSection()
    data: DataSection = DataSection()
    rollout: RolloutConfig = RolloutConfig()
    val_sampling: RoleSampling = RoleSampling(temperature=0.6, top_p=0.95)
    judge: JudgeSection = JudgeSection()
    rl: RLSection = RLSection()
    optim: OptimConfig = OptimConfig()
    loss: LossConfig = LossConfig()
    mesh: MeshSection = MeshSection()
    checkpoint: CheckpointSection = CheckpointSection()
    log: LogSection = LogSection()


# ----------------------------------------------------------------------------- range rules

_POS = lambda v: v > 0
_NONNEG = lambda v: v >= 0
_PROB = lambda v: 0 < v <= 1

# (dotted field, predicate, what it must be)
_RANGES: list[tuple[str, Any, str]] = [
    ("total_steps", _POS, "> 0"),
    ("model.vocab_size", _POS, "> 0"), ("model.hidden_size", _POS, "> 0"),
    ("model.intermediate_size", _POS, "> 0"), ("model.num_layers", _POS, "> 0"),
    ("model.num_heads", _POS, "> 0"), ("model.num_kv_heads", _POS, "> 0"), ("model.head_dim", _POS, "> 0"),
    ("model.param_dtype", lambda v: v in ("float32", "bfloat16", "float16"), "float32, bfloat16 or float16"),
    ("model.dtype", lambda v: v in ("float32", "bfloat16", "float16"), "float32, bfloat16 or float16"),
    ("model.remat_policy", lambda v: v in ("none", "full", "dots", "dots_no_batch"), "none, full, dots or dots_no_batch"),
    ("tokenizer.demo_vocab_size", lambda v: v >= 300, ">= 300"),
    ("data.source", lambda v: v in ("demo", "jsonl", "parquet", "tfds"), "demo, jsonl, parquet or tfds"),
    ("data.num_demo_tasks", _POS, "> 0"), ("data.prompts_per_step", _POS, "> 0"),
    ("data.num_epochs", _NONNEG, ">= 0"), ("data.max_prompt_length", _POS, "> 0"),
    ("rollout.mode", lambda v: v in MODES, f"one of {MODES}"),
    ("rollout.act.temperature", _NONNEG, ">= 0"), ("rollout.act.top_p", _PROB, "in (0, 1]"),
    ("rollout.act.top_k", _NONNEG, ">= 0"), ("rollout.act.max_new_tokens", _POS, "> 0"),
    ("rollout.rehearse.temperature", _NONNEG, ">= 0"), ("rollout.rehearse.top_p", _PROB, "in (0, 1]"),
    ("rollout.rehearse.top_k", _NONNEG, ">= 0"), ("rollout.rehearse.max_new_tokens", _POS, "> 0"),
    ("val_sampling.temperature", _NONNEG, ">= 0"), ("val_sampling.top_p", _PROB, "in (0, 1]"),
    ("judge.kind", lambda v: v in ("rule", "http", "rule_then_http"), "rule, http or rule_then_http"),
    ("judge.http.max_attempts", _POS, ">= 1"), ("judge.http.max_concurrency", _POS, ">= 1"),
    ("judge.http.timeout_s", _NONNEG, ">= 0"),
    ("rl.n_rollouts", _POS, "> 0"), ("rl.baseline", lambda v: v in BASELINES, f"one of {BASELINES}"),
    ("rl.empty_output_penalty", _NONNEG, ">= 0"), ("rl.ppo_epochs", _POS, "> 0"),
    ("rl.mini_batches", _POS, "> 0"), ("rl.micro_batch_size", _POS, "> 0"),
    ("rl.max_row_length", lambda v: v > 1, "> 1"), ("rl.length_multiple", _POS, "> 0"),
    ("rl.adjust_batch_multiple", _NONNEG, ">= 0"),
    ("rl.overlong_rows", lambda v: v in ("drop", "truncate"), "drop or truncate"),
    ("optim.lr", _POS, "> 0"), ("optim.schedule", lambda v: v in ("constant", "cosine", "linear"),
                                "constant, cosine or linear"),
    ("optim.warmup_steps", _NONNEG, ">= 0"), ("optim.b1", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("optim.b2", lambda v: 0 <= v < 1, "in [0, 1)"), ("optim.eps", _POS, "> 0"),
    ("optim.weight_decay", _NONNEG, ">= 0"), ("optim.grad_clip", _POS, "> 0"),
    ("loss.clip_low", lambda v: 0 <= v < 1, "in [0, 1)"), ("loss.clip_high", _NONNEG, ">= 0"),
    ("loss.dual_clip", lambda v: v is None or v > 1, "> 1 or None"),
    ("loss.agg", lambda v: v in AGG_MODES, f"one of {AGG_MODES}"),
    ("loss.kl_type", lambda v: v in KL_TYPES, f"one of {KL_TYPES}"),
    ("loss.kl_coef", _NONNEG, ">= 0"), ("loss.entropy_coef", _NONNEG, ">= 0"),
    ("checkpoint.every", _POS, "> 0"), ("checkpoint.keep", _POS, "> 0"), ("log.every", _POS, "> 0"),
]


# ----------------------------------------------------------------------------- conversion

def _type_name(t: Any) -> str:
    return getattr(t, "__name__", str(t))


def _convert(value: Any, hint: Any, where: str) -> Any:
    """Checks ``value`` against a type hint (int, float, str, bool, X | None, nested dataclass)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where} must be {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be a bool, got {type(value).__name__} {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an int, got {type(value).__name__} {value!r}")
        return int(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {type(value).__name__} {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where} must be finite, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {type(value).__name__} {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported field type {hint!r}")


def _as_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a section (dict/ConfigDict), got {type(value).__name__}")
    return value


def _build(cls: type, value: Any, where: str) -> Any:
    if isinstance(value, cls):
        return value
    data = _as_mapping(value, where)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where} has unknown field(s) {unknown}; known: {sorted(names)}")
    kwargs = {k: _convert(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    # Range rules run before the section's own __post_init__ so the message names the full field.
    for field, ok, what in _RANGES:
        full = f"config.{field}"
        parent, _, leaf = full.rpartition(".")
        if parent == where and leaf in kwargs and not ok(kwargs[leaf]):
            raise ConfigError(f"{full} must be {what}, got {kwargs[leaf]!r}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:  # the section's own __post_init__ checks
        raise ConfigError(f"{where}: {e}") from e


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def validate(cfg: ExperimentConfig) -> ExperimentConfig:
    for field, ok, what in _RANGES:
        v = _get(cfg, field)
        if not ok(v):
            raise ConfigError(f"config.{field} must be {what}, got {v!r}")
    if cfg.judge.kind != "rule":
        try:
            cfg.judge.http.validate()
        except ValueError as e:
            raise ConfigError(f"config.judge.http: {e}") from e
    return cfg


def check_runnable(cfg: ExperimentConfig) -> None:
    """Checks that a run can start: the paths that the reference configs leave to the command line."""
    if cfg.data.source != "demo" and not cfg.data.path:
        raise ConfigError(f"config.data.path is required for data.source={cfg.data.source!r}")
    if cfg.model.preset != "tiny" and not cfg.model.hf_path:
        raise ConfigError(f"config.model.hf_path is required for model.preset={cfg.model.preset!r} "
                          f"(random init is only for the tiny preset)")
    if cfg.model.hf_path and not cfg.tokenizer.path:
        raise ConfigError("config.tokenizer.path is required with a pretrained model.hf_path")
    if cfg.rollout.mode in ("simulator", "noshare") and cfg.model.hf_path and not cfg.model.simulator_hf_path:
        raise ConfigError(f"config.model.simulator_hf_path is required for rollout.mode={cfg.rollout.mode!r} "
                          f"with a pretrained policy (model.hf_path)")


def load_config(config: Any) -> ExperimentConfig:
    """A ConfigDict / dict (as written in configs/*.py) -> validated ``ExperimentConfig``."""
    return validate(_build(ExperimentConfig, config, "config"))


def to_config_dict(cfg: ExperimentConfig):
    """The inverse of ``load_config`` (for writing the resolved config next to a run)."""
    import ml_collections

    return ml_collections.ConfigDict(dataclasses.asdict(cfg))


def as_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def base_config():
    """A ConfigDict holding every field at its default (reference values); configs/*.py edit it."""
    return to_config_dict(ExperimentConfig())


def config_from_file(path: str, arg: str | None = None):
    """Runs ``get_config()`` of a config file (how ablation configs start from a base config)."""
    import importlib.util
    import os

    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    name = "envace_cfg_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path!r} has no get_config()")
    return module.get_config() if arg is None else module.get_config(arg)
