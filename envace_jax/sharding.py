"""Device mesh and logical-axis sharding rules.

Every parameter carries a tuple of *logical* axis names (``("vocab", "embed")``,
``("layers", "embed", "heads", "head_dim")``, ...). A rules table maps each
logical name to zero or more *mesh* axes out of ``("data", "fsdp", "tensor")``.
Two tables exist: training (FSDP over ``embed``, tensor parallel over heads/mlp,
rows over ``data`` x ``fsdp`` or, for micro-batches smaller than the fsdp group, the sequence over
``fsdp``) and sampling (weights replicated over ``fsdp`` so decode does not all-gather
every step). A mesh axis that does not divide a dimension is dropped for that
dimension (e.g. 1 kv head on ``tensor=2``): the array is then replicated along it
rather than failing.

Only public JAX APIs are used (``Mesh``, ``NamedSharding``, ``PartitionSpec``,
``with_sharding_constraint``); nothing here touches global state.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# logical name -> mesh axes (a tuple; empty means replicated)
Rules = Mapping[str, tuple[str, ...]]

TRAIN_RULES: dict[str, tuple[str, ...]] = {
    # parameters
    "layers": (),
    "vocab": ("tensor",),
    "embed": ("fsdp",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": (),
    "mlp": ("tensor",),
    "norm": (),
    # Qwen3-MoE's expert axis (models/qwen3_moe.py): replicated here, so experts are split like dense weights
    # (FSDP over embed, tensor over mlp); EXPERT_PARALLEL_RULES split the experts themselves.
    "expert": (),
    # activations
    "batch": ("data", "fsdp"),
    # A micro-batch with fewer rows than the fsdp group (the reference trains one 20k-token row at a
    # time) splits its sequence over fsdp instead of holding the whole row on every device: a mesh
    # axis is used once per array, so this applies only when "batch" could not take fsdp.
    "length": ("fsdp",),
    "act_embed": (),
    "act_heads": ("tensor",),
    "act_kv_heads": ("tensor",),
    "act_mlp": ("tensor",),
    "act_vocab": ("tensor",),
    "cache_length": (),
}

# Expert parallelism for a Qwen3-MoE (models/qwen3_moe.py): each fsdp group holds its share of every layer's
# experts whole, instead of a slice of every expert's hidden axis (``embed``, then, is not split: a mesh axis is
# used once per array). Merged over TRAIN_RULES or SAMPLE_RULES: ``dict(TRAIN_RULES, **EXPERT_PARALLEL_RULES)``.
EXPERT_PARALLEL_RULES: dict[str, tuple[str, ...]] = {"expert": ("fsdp",)}

SAMPLE_RULES: dict[str, tuple[str, ...]] = {
    **TRAIN_RULES,
    # Decoding is memory-bound on the weights: gather them once (replicate over
    # fsdp) instead of all-gathering every layer at every token.
    "embed": (),
    # Sampler chunks are written into per-row cache slots: keep each row's chunk on one device.
    "length": (),
}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh sizes; at most one may be -1, meaning "all remaining devices"."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1

    def sizes(self, num_devices: int) -> tuple[int, int, int]:
        sizes = [self.data, self.fsdp, self.tensor]
        for name, s in zip(MESH_AXES, sizes):
            if s == 0 or s < -1:
                raise ValueError(f"mesh.{name}={s}: sizes must be positive or -1")
        if sizes.count(-1) > 1:
            raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))}: at most one axis may be -1")
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if num_devices % known:
                raise ValueError(
                    f"mesh {dict(zip(MESH_AXES, sizes))}: {num_devices} devices are not divisible by {known}"
                )
            sizes[sizes.index(-1)] = num_devices // known
        if math.prod(sizes) != num_devices:
            raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, have {num_devices}")
        return tuple(sizes)  # type: ignore[return-value]


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """Builds a ``(data, fsdp, tensor)`` mesh over ``devices`` (default: all devices, all processes)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = MeshConfig(data, fsdp, tensor).sizes(len(devices))
    try:
        # Topology-aware placement on TPU/GPU; falls back to plain order on CPU.
        grid = jax.experimental.mesh_utils.create_device_mesh(shape, devices=devices)  # type: ignore[attr-defined]
    except Exception:
        grid = np.asarray(devices, dtype=object).reshape(shape)
    return Mesh(grid, MESH_AXES)


def mesh_from_config(cfg: Any, devices: Sequence[Any] | None = None) -> Mesh:
    """Accepts a mapping / ConfigDict / dataclass with ``data``, ``fsdp``, ``tensor`` fields."""
    get = (lambda k: cfg[k]) if isinstance(cfg, Mapping) else (lambda k: getattr(cfg, k))
    return make_mesh(int(get("data")), int(get("fsdp")), int(get("tensor")), devices)


def logical_to_spec(
    logical_axes: Iterable[str | None],
    rules: Rules,
    mesh: Mesh | None = None,
    shape: Sequence[int] | None = None,
) -> PartitionSpec:
    """Maps logical axis names to a PartitionSpec.

    With ``mesh`` and ``shape`` given, a mesh axis whose size does not divide the
    dimension is dropped, and a mesh axis already used by an earlier dimension is
    not reused (a PartitionSpec may name each mesh axis once).
    """
    used: set[str] = set()
    out = []
    for i, name in enumerate(logical_axes):
        if name is None:
            out.append(None)
            continue
        if name not in rules:
            raise KeyError(f"logical axis {name!r} has no sharding rule (known: {sorted(rules)})")
        axes = []
        dim = None if shape is None else int(shape[i])
        for ax in rules[name]:
            if ax in used:
                continue
            if mesh is not None:
                size = mesh.shape[ax]
                prod = size * math.prod(mesh.shape[a] for a in axes)
                if dim is not None and dim % prod:
                    continue
            axes.append(ax)
        used.update(axes)
        out.append(None if not axes else (axes[0] if len(axes) == 1 else tuple(axes)))
    return PartitionSpec(*out)


def named_sharding(
    mesh: Mesh, logical_axes: Iterable[str | None], rules: Rules, shape: Sequence[int] | None = None
) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(logical_axes, rules, mesh, shape))


def constrain(x: jax.Array, logical_axes: Sequence[str | None], mesh: Mesh | None, rules: Rules | None):
    """``with_sharding_constraint`` by logical names; a no-op without a mesh."""
    if mesh is None or rules is None:
        return x
    return jax.lax.with_sharding_constraint(x, named_sharding(mesh, logical_axes, rules, x.shape))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
