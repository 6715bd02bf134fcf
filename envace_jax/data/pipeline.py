"""Grain pipeline of prompt batches: seeded shuffle, per-process shards, epochs, resumable state.

The stream is defined by index arithmetic, so it is a pure function of (source length, seed,
shard, epoch) and a saved iterator state (one integer underneath) resumes it exactly:

- every epoch is one global permutation of the source (grain's index shuffle, reseeded per epoch);
- the first ``n - n % shard_count`` positions of that permutation are dealt round-robin to the
  processes, so within an epoch the shards are disjoint and every process gets the same number of
  elements (hosts stay in lockstep for collectives); the few left-over positions change each epoch;
- elements are decoded lazily and grouped into lists of ``batch_size`` prompts (records are
  host-side dicts; tokenization happens later, in the rollout).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Iterator, Sequence

import grain

from envace_jax.data.tfds_builder import decode_example


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """How prompts are drawn. ``shard_index``/``shard_count``: which of the disjoint shards this reader
    takes (a multi-process run passes its process index and count; data code never asks jax)."""

    batch_size: int
    seed: int = 0
    shuffle: bool = True
    num_epochs: int | None = 1  # None repeats forever
    drop_remainder: bool = True  # drop a short last batch (finite epochs only)
    shard_index: int = 0
    shard_count: int = 1
    read_threads: int = 2  # decode threads; the box may be small
    prefetch: int = 16  # elements decoded ahead of the consumer

    def __post_init__(self):
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"PipelineConfig.batch_size must be a positive int, got {self.batch_size!r}")
        if self.num_epochs is not None and (not isinstance(self.num_epochs, int) or self.num_epochs < 1):
            raise ValueError(f"PipelineConfig.num_epochs must be None or a positive int, got {self.num_epochs!r}")
        if not 0 <= self.shard_index < self.shard_count:
            raise ValueError(
                f"PipelineConfig.shard_index={self.shard_index} is outside [0, shard_count={self.shard_count})"
            )
        if self.read_threads < 0 or self.prefetch < 0:
            raise ValueError("PipelineConfig.read_threads and prefetch must be >= 0")


def resolve_shard(cfg: PipelineConfig) -> tuple[int, int]:
    """(shard_index, shard_count) of ``cfg``."""
    return cfg.shard_index, cfg.shard_count


def build_dataset(
    source: Any, cfg: PipelineConfig, decode: Callable[[Any], Any] | None = decode_example
) -> grain.IterDataset:
    """The pipeline as a grain IterDataset yielding lists of ``batch_size`` decoded elements.

    ``source`` is any random-access source (len + int indexing): the raw tfds source from
    ``read_split(..., decode=False)``, a ``RecordSource``, or a plain list. ``decode`` maps one
    stored element to a record (None keeps elements as they are).
    """
    n = len(source)
    shard, count = resolve_shard(cfg)
    per_shard = n // count
    if per_shard == 0:
        raise ValueError(f"build_dataset: source has {n} elements, fewer than shard_count={count}")
    elements = grain.MapDataset.source(source)
    if cfg.shuffle:
        # Indices past len() select the next epoch's permutation (seed folded with the epoch).
        elements = elements.shuffle(seed=cfg.seed)

    def pick(index: int, _: int):
        epoch, k = divmod(index, per_shard)
        return elements[epoch * n + k * count + shard]

    ds = grain.MapDataset.range(per_shard).repeat(cfg.num_epochs).map_with_index(pick)
    if decode is not None:
        ds = ds.map(decode)
    read = grain.ReadOptions(num_threads=cfg.read_threads, prefetch_buffer_size=cfg.prefetch)
    drop = cfg.drop_remainder if cfg.num_epochs is not None else True
    return ds.to_iter_dataset(read).batch(cfg.batch_size, drop_remainder=drop, batch_fn=list)


class PromptIterator:
    """Iterator of prompt batches with a JSON-serialisable, restorable position.

    ``get_state()`` returns a small dict (stored by ``envace_jax.checkpoint`` as JSON) that also
    records the stream's identity; ``set_state`` refuses a state from a different stream rather
    than silently resuming somewhere else.
    """

    def __init__(self, source: Any, cfg: PipelineConfig, decode: Callable[[Any], Any] | None = decode_example):
        self.cfg = cfg
        shard, count = resolve_shard(cfg)
        self._identity = {
            "source_len": len(source),
            "seed": cfg.seed,
            "shuffle": cfg.shuffle,
            "num_epochs": cfg.num_epochs,
            "batch_size": cfg.batch_size,
            "shard_index": shard,
            "shard_count": count,
        }
        self._it = iter(build_dataset(source, cfg, decode))
        self.batches_seen = 0

    def __iter__(self) -> Iterator[list[Any]]:
        return self

    def __next__(self) -> list[Any]:
        batch = next(self._it)
        self.batches_seen += 1
        return batch

    def get_state(self) -> dict[str, Any]:
        return {"grain": self._it.get_state(), "batches_seen": self.batches_seen, "stream": dict(self._identity)}

    def set_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or "grain" not in state or "stream" not in state:
            raise ValueError(f"PromptIterator.set_state: not a pipeline state: {state!r}")
        if state["stream"] != self._identity:
            diff = {k: (state["stream"].get(k), v) for k, v in self._identity.items() if state["stream"].get(k) != v}
            raise ValueError(f"PromptIterator.set_state: state is from a different stream; (saved, now) = {diff}")
        self._it.set_state(state["grain"])
        self.batches_seen = int(state["batches_seen"])

    def state_json(self) -> str:
        return json.dumps(self.get_state(), sort_keys=True)


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """Source indices in the global order of one epoch (all shards interleaved); for inspection."""
    ds = grain.MapDataset.range(n)
    if shuffle:
        ds = ds.shuffle(seed=seed)
    return [int(ds[epoch * n + k]) % n for k in range(n)]


def take(it: Iterator[list[Any]], k: int) -> list[list[Any]]:
    """The next ``k`` batches (fewer if the stream ends)."""
    out: list[list[Any]] = []
    for _ in range(k):
        try:
            out.append(next(it))
        except StopIteration:
            break
    return out


__all__: Sequence[str] = ("PipelineConfig", "PromptIterator", "build_dataset", "epoch_order", "resolve_shard", "take")
