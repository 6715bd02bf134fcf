"""Where a trainer's arrays live: host rows -> mesh-sharded device arrays and back, across processes.

With several JAX processes every process passes ITS OWN rows; a global array is their concatenation in
process order, so every sum the jitted update takes runs over all processes' rows. Each step is a
collective, so every process must feed the same number of micro-batches of the same shape: shapes are
agreed with an all-gather and short parts are filled with zero-weight padding rows (``batch.pad_rows``).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from envace_jax import sharding as shd
from envace_jax.rl.batch import TrainBatch, pad_rows


def replicate_unplaced(tree: Any, mesh: Mesh | None) -> Any:
    """Optimizer leaves that do not depend on the params (step counters, non-finite counts) come out of
    ``tx.init`` or a restore on one local device; with a mesh, replicate them over it so the jitted
    update never sees mixed device sets (across processes too)."""
    if mesh is None:
        return tree
    devices = set(mesh.devices.flat)
    rep = NamedSharding(mesh, PartitionSpec())

    def one(x):
        if not isinstance(x, jax.Array) or set(x.sharding.device_set) == devices:
            return x
        host = np.asarray(x)
        if jax.process_count() > 1:
            return jax.make_array_from_process_local_data(rep, host, host.shape)
        return jax.device_put(host, rep)

    return jax.tree.map(one, tree)


def opt_state_shardings(tx: optax.GradientTransformation, params: Any, mesh: Mesh) -> Any:
    """Shardings of ``tx.init(params)``: every parameter-shaped leaf (Adam's moments) takes its
    parameter's sharding; counters and flags are replicated.

    ``jax.jit(tx.init)`` alone leaves that choice to XLA, which replicates the moments (zeros do not
    depend on the sharded input): for an 8B model, 65 GB of Adam state on every chip.
    """
    state = jax.eval_shape(tx.init, params)
    return optax.tree_map_params(
        tx, lambda _, p: p.sharding, state, params, transform_non_params=lambda _: shd.replicated(mesh)
    )


def process_micro_batch_rows(micro_batch_size: int, local_devices: int, processes: int) -> int:
    """Rows one process feeds per micro-batch: ``micro_batch_size``, except with several processes,
    where it is rounded up to the process's device count (zero-weight rows fill what is missing), so
    every device of the global micro-batch holds whole rows."""
    if processes == 1:
        return micro_batch_size
    return -(-micro_batch_size // local_devices) * local_devices


def device_batch(arrays: dict[str, np.ndarray], mesh: Mesh | None) -> dict[str, jax.Array]:
    """Host rows -> device arrays sharded over the batch axes of the mesh (this process's rows)."""
    if mesh is None:
        return {k: jax.numpy.asarray(v) for k, v in arrays.items()}
    multi = jax.process_count() > 1
    out = {}
    for k, v in arrays.items():
        gshape = (v.shape[0] * jax.process_count(),) + v.shape[1:] if multi else v.shape
        spec = shd.logical_to_spec(("batch",) + (None,) * (v.ndim - 1), shd.TRAIN_RULES, mesh, gshape)
        sharding = NamedSharding(mesh, spec)
        if multi:
            out[k] = jax.make_array_from_process_local_data(sharding, v, gshape)
        else:
            out[k] = jax.device_put(v, sharding)
    return out


def local_micro_batches(
    batch: TrainBatch, micro_batch_size: int, *, pad_last: bool = False
) -> list[dict[str, np.ndarray]]:
    """This process's rows cut into micro-batches of ``micro_batch_size`` rows.

    Single process: plain slices; with ``pad_last`` the last one is filled up to ``micro_batch_size``
    with zero-weight rows, so a varying row count never compiles a program for a short micro-batch.
    Several processes: lengths are padded to the longest row width of any process and every
    micro-batch is filled up to ``micro_batch_size`` (rounded up to this process's device count).
    """
    arrays = batch.arrays()
    mbs = micro_batch_size
    if jax.process_count() == 1:
        parts = [{k: v[s : s + mbs] for k, v in arrays.items()} for s in range(0, batch.size, mbs)]
        if pad_last and parts:
            parts[-1] = pad_rows(parts[-1], mbs)
        return parts
    from jax.experimental import multihost_utils

    shapes = np.asarray(multihost_utils.process_allgather(np.asarray(batch.tokens.shape, np.int64)))
    rows, width = int(shapes[:, 0].max()), int(shapes[:, 1].max())
    mbs = process_micro_batch_rows(mbs, jax.local_device_count(), jax.process_count())
    n_mb = max(1, -(-rows // mbs))
    return [pad_rows({k: v[m * mbs : (m + 1) * mbs] for k, v in arrays.items()}, mbs, width) for m in range(n_mb)]


def host_rows(x: jax.Array, mesh: Mesh | None) -> np.ndarray:
    """This process's rows of a batch-sharded device array (all rows with one process)."""
    if jax.process_count() == 1:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.global_array_to_host_local_array(x, mesh, x.sharding.spec))


def row_groups(mesh: Mesh | None, rows: int, width: int) -> int:
    """How many equal groups of consecutive rows this process's ``[rows, width]`` micro-batch falls into
    once ``device_batch`` places it: one per shard of the rows held by this process (1 without a mesh).
    0 when the sequence itself is split over devices (a micro-batch with fewer rows than the fsdp
    group): gathering positions there would move hidden states between devices."""
    if mesh is None:
        return 1
    gshape = (rows * jax.process_count(), width, 1)
    spec = tuple(shd.logical_to_spec(("batch", "length", None), shd.TRAIN_RULES, mesh, gshape))
    spec = spec + (None,) * (3 - len(spec))
    if spec[1] is not None:
        return 0
    axes = () if spec[0] is None else (spec[0],) if isinstance(spec[0], str) else spec[0]
    shards = int(np.prod([mesh.shape[a] for a in axes]))
    return max(1, shards // jax.process_count())


def trained_positions(loss_weights: np.ndarray, groups: int = 1, *, max_share: float = 0.75) -> np.ndarray | None:
    """Flat positions of the trained tokens (loss weight != 0) of each row group, for
    ``head_logprobs.gathered_token_logprobs``: int32 ``[groups, K]``, padded with ``(rows // groups) *
    width`` (past the end). ``K`` is the largest group's count rounded up to a sixteenth of a group (at
    least 64, at most the group), so a row width compiles a few programs, not one per count; with
    several processes it is agreed over all of them (a collective). None when ``K`` would exceed
    ``max_share`` of the positions (the gather would save little) or the rows do not split into
    ``groups``."""
    rows, width = loss_weights.shape
    if groups < 1 or rows % groups:
        return None
    n = rows // groups * width
    on = loss_weights.reshape(groups, n) != 0
    count = int(on.sum(1).max()) if rows else 0
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        count = int(np.asarray(multihost_utils.process_allgather(np.asarray(count, np.int64))).max())
    step = max(64, -(-n // (16 * 64)) * 64)
    k = min(n, max(step, -(-count // step) * step))
    if k > max_share * n:
        return None
    index = np.full((groups, k), n, np.int32)
    for g in range(groups):
        pos = np.flatnonzero(on[g])
        index[g, : len(pos)] = pos
    return index
