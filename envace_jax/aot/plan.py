"""What a run of a config executes, as shapes: the model, the meshes and the four programs' sizes.

Pure host arithmetic over an ``ExperimentConfig`` and a device list (no compilation), so the
numbers can be checked without libtpu. Each size follows the code that produces it at run time:

- **train_step / logprobs** rows: the trainer's micro-batch (``rl.micro_batch_size``; with several
  processes every process feeds whole rows to each of its devices, ``process_micro_batch_rows``);
  width: the padded width of a batch holding a ``rl.max_row_length`` row (``batch.row_width``).
- **prefill / decode** batch: one sampler call of one process holds every episode's pending request
  (``data.prompts_per_step`` prompts per process x ``rl.n_rollouts``) plus, when the policy also
  plays REHEARSE, the episodes' parked ACT rows: twice the episodes (``rollout.rolling``: the rolling
  client's ``rollout.rolling_slots`` rows). The cache window is the
  sampler's window for a row that reaches ``rollout.max_model_len``; the prefill chunk is the
  sampler's ``max_chunk``; the decode budget the bucket of the largest ``max_new_tokens``.
- **meshes**: training runs on the config's ``mesh`` over all chips. With several processes (hosts)
  each process samples its own prompts on its own chips (``envace_jax.rl.train.build_run``), so the
  sampler's mesh is one host's chips; with one process it is the training mesh. The disaggregated layout
  (``mesh.rollout_chips_per_host = c``) trains on all but the last ``c`` chips of every host and samples on
  those ``c``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from envace_jax.config import ExperimentConfig
from envace_jax.models import qwen3
from envace_jax.rl.batch import row_width
from envace_jax.rl.placement import process_micro_batch_rows
from envace_jax.sampling.plan import pow2_bucket, quarter_octave_bucket

# Sampler options the training loop (rl.train.make_client) leaves at their defaults (Sampler(model, mesh=...)).
SAMPLER_MAX_CHUNK = 512
# Rollout modes whose policy sampler serves both roles (so ACT rows park while REHEARSE samples).
BOTH_ROLES_MODES = ("rehearsal", "caller_frozen")


def model_config(cfg: ExperimentConfig) -> qwen3.Qwen3Config:
    """The policy's architecture without reading weights: a checkpoint's config.json
    (``model.hf_path``), else what the training loop builds for ``model.preset`` (``rl.train.model_config``;
    a tiny model's vocabulary grows to the demo tokenizer's configured size, a tokenizer directory is
    not read)."""
    from envace_jax.rl.train import model_config as run_model_config

    m = cfg.model
    if m.hf_path:
        return qwen3.Qwen3Config.from_hf(
            m.hf_path, param_dtype=m.param_dtype, dtype=m.dtype, remat_policy=m.remat_policy
        )
    return run_model_config(m, 0 if cfg.tokenizer.path else cfg.tokenizer.demo_vocab_size)


@dataclasses.dataclass(frozen=True)
class RunShapes:
    processes: int  # hosts of the topology (one JAX process each)
    chips_per_process: int
    train_rows: int  # global rows of one micro-batch
    train_width: int  # tokens per row at rl.max_row_length
    sample_batch: int  # rows of one sampler call of one process (bucketed)
    sample_rows: int  # the same before bucketing
    prefill_chunk: int
    cache_window: int
    decode_budget: int
    rows_per_episode: int = 2  # sampler rows an episode holds: its request, plus its parked ACT row when
    # the policy also plays REHEARSE (BOTH_ROLES_MODES)
    rollout_chips_per_host: int = 0  # mesh.rollout_chips_per_host: 0 colocated, else disaggregated
    max_staleness: int = 0  # rl.max_staleness: s + 1 rollouts (and weight copies) in flight when >= 1

    @property
    def layout(self) -> str:
        """The layout in words, with the split of the slice and the rollouts in flight."""
        lag = f"; rl.max_staleness={self.max_staleness}" if self.max_staleness else ""
        if not self.rollout_chips_per_host:
            return f"colocated: rollouts and training share every chip{lag}"
        c = self.rollout_chips_per_host
        return (
            f"disaggregated: {self.processes * self.chips_per_process} training chips "
            f"({self.chips_per_process} per host), {self.processes * c} rollout chips ({c} per host){lag}"
        )


def hosts(devices: Sequence[Any]) -> list[list[Any]]:
    """Devices grouped by ``process_index`` (a topology's hosts), in index order."""
    by: dict[int, list[Any]] = {}
    for d in devices:
        by.setdefault(int(getattr(d, "process_index", 0)), []).append(d)
    return [by[k] for k in sorted(by)]


def training_devices(cfg: ExperimentConfig, devices: Sequence[Any]) -> list[Any]:
    """The chips that train: all of them, or with ``mesh.rollout_chips_per_host = c`` all but the last ``c``
    of every host (``rl.rollout_weights.split_devices``, as a run splits its slice)."""
    c = cfg.mesh.rollout_chips_per_host
    if not c:
        return list(devices)
    groups = hosts(devices)
    if any(len(g) <= c for g in groups):
        raise ValueError(f"mesh.rollout_chips_per_host={c} leaves no chip to train on hosts of {len(groups[0])} chips")
    return [d for g in groups for d in sorted(g, key=lambda d: getattr(d, "id", 0))[: len(g) - c]]


def run_shapes(cfg: ExperimentConfig, devices: Sequence[Any]) -> RunShapes:
    devices = training_devices(cfg, devices)
    groups = hosts(devices)
    processes, local = len(groups), len(groups[0])
    if any(len(g) != local for g in groups):
        raise ValueError(f"hosts hold different chip counts: {[len(g) for g in groups]}")
    r = cfg.rl
    train_rows = process_micro_batch_rows(r.micro_batch_size, local, processes) * processes
    width = row_width(r.max_row_length, r.max_row_length, r.length_multiple)
    episodes = cfg.data.prompts_per_step * r.n_rollouts
    per_episode = 2 if cfg.rollout.mode in BOTH_ROLES_MODES else 1
    rows = episodes * per_episode
    if cfg.rollout.rolling:  # rl.rolling_client: at most rolling_slots rows decode in one call
        rows = cfg.rollout.rolling_slots
    max_new = max(cfg.rollout.act.max_new_tokens, cfg.rollout.rehearse.max_new_tokens)
    # Sampler._run: window = quarter_octave_bucket(need) capped at capacity + headroom, where a row that
    # reaches max_model_len needs max_model_len slots; the budget is pow2_bucket(max_new_tokens, 8).
    window = min(quarter_octave_bucket(cfg.rollout.max_model_len), cfg.rollout.max_model_len + SAMPLER_MAX_CHUNK)
    chunk = min(pow2_bucket(SAMPLER_MAX_CHUNK, 16), SAMPLER_MAX_CHUNK)
    return RunShapes(
        processes=processes,
        chips_per_process=local,
        train_rows=train_rows,
        train_width=width,
        sample_batch=pow2_bucket(rows),
        sample_rows=rows,
        prefill_chunk=chunk,
        cache_window=window,
        decode_budget=pow2_bucket(max_new, 8),
        rows_per_episode=per_episode,
        rollout_chips_per_host=cfg.mesh.rollout_chips_per_host,
        max_staleness=cfg.rl.max_staleness,
    )
