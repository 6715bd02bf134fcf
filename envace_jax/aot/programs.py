"""The four programs of a run, as (jitted callable, abstract arguments) ready to lower.

No weights are read and nothing is allocated: the model is built with ``nnx.eval_shape`` and every
parameter becomes a ``ShapeDtypeStruct`` carrying the ``NamedSharding`` the run would give it. The
callables are the run's own: the trainer's jitted gradient, optimizer and log-prob functions
(``Trainer.program``) and the sampler's jitted prefill and decode (``Sampler.program_specs``).

``train_step`` is the last micro-batch of an update as one program: the gradient of one micro-batch
added to the running gradient sum, then the optimizer step. The trainer runs these as separate
dispatches, so this program's peak is the update's peak: parameters, optimizer state, the gradient
sum, one micro-batch's gradient and its activations are all live at once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from envace_jax import sharding as shd
from envace_jax.aot.plan import RunShapes, hosts, model_config, run_shapes, training_devices
from envace_jax.config import ExperimentConfig
from envace_jax.models import lora, qwen3
from envace_jax.rl.batch import TrainBatch
from envace_jax.rl.train import rollout_config, rollout_mesh
from envace_jax.rl.trainer import Trainer
from envace_jax.rl.types import ROLE_ID
from envace_jax.sampling import Sampler


DECODE_SETUP = "decode_setup"


@dataclasses.dataclass
class Program:
    name: str
    fn: Callable
    args: tuple
    kwargs: dict
    mesh: Mesh
    shape: str  # the sizes it was built at, for the report
    resident_bytes: int = 0  # per chip: what the run keeps on the chip outside this program
    resident_what: str = ""


def abstract_model(cfg: qwen3.Qwen3Config, mesh: Mesh, rules: shd.Rules, lora_spec: dict | None = None) -> qwen3.Qwen3:
    """A Qwen3 whose parameters are ShapeDtypeStructs laid out by ``rules`` over ``mesh``; with ``lora_spec``
    (``lora.add_adapters``' keyword arguments) it carries LoRA adapters."""

    def build():
        m = qwen3.model_class(cfg)(cfg, rngs=nnx.Rngs(0))
        return lora.add_adapters(m, **lora_spec) if lora_spec else m

    model = nnx.eval_shape(build)
    state = nnx.state(model)
    leaves, treedef = jax.tree.flatten(state)
    shardings = jax.tree.leaves(qwen3.param_shardings(model, mesh, rules))
    nnx.update(
        model,
        treedef.unflatten([jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s) for x, s in zip(leaves, shardings)]),
    )
    model.set_sharding(mesh, rules)
    return model


def lora_spec(cfg: ExperimentConfig) -> dict | None:
    """The adapters a run trains (``model.lora_*``, or the PEFT adapter ``model.lora_adapter`` names), as
    ``lora.add_adapters``' keyword arguments; None without LoRA."""
    m = cfg.model
    if not m.lora:
        return None
    if m.lora_adapter:
        from envace_jax.models import peft_io

        a = peft_io.read_adapter_config(m.lora_adapter)
        return dict(
            rank=int(a["r"]),
            alpha=float(a["lora_alpha"]),
            targets=a["target_modules"],
            rslora=bool(a.get("use_rslora")),
        )
    return dict(rank=m.lora_rank, alpha=m.lora_alpha, targets=m.lora_targets, rslora=m.lora_rslora)


def per_chip_bytes(tree: Any) -> int:
    """Bytes one chip holds of a tree of sharded arrays or ShapeDtypeStructs (the largest shard)."""
    total = 0
    for x in jax.tree.leaves(tree):
        if x is None:
            continue
        shape = x.sharding.shard_shape(x.shape) if isinstance(getattr(x, "sharding", None), NamedSharding) else x.shape
        total += math.prod(shape) * np.dtype(x.dtype).itemsize
    return total


def _abstract_like(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def micro_batch_spec(
    rows: int, width: int, mesh: Mesh, role_balanced: bool, routing: tuple[int, int] | None = None
) -> dict[str, jax.ShapeDtypeStruct]:
    """A micro-batch as ``Trainer._device_batch`` places it: rows over the batch axes of the mesh. ``routing``:
    (sparse layers, experts per token) of a Qwen3-MoE's routing record, which the batch then carries."""
    out = {}
    arrays = TrainBatch.padding(rows, width).arrays()
    if routing is not None:
        arrays["routing"] = np.zeros((rows, width, *routing), np.int16)
    for k, v in arrays.items():
        spec = shd.logical_to_spec(("batch",) + (None,) * (v.ndim - 1), shd.TRAIN_RULES, mesh, v.shape)
        out[k] = jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, spec))
    if role_balanced:
        out["role_counts"] = jax.ShapeDtypeStruct((len(ROLE_ID),), jnp.float32, sharding=shd.replicated(mesh))
    return out


def mesh_over(cfg: ExperimentConfig, devices: Sequence[Any], num_slices: int = 1) -> Mesh:
    """The config's ``(data, fsdp, tensor)`` mesh over ``devices``; with several slices the slice
    dimension (DCN) is folded into the first of ``data``/``fsdp`` that it divides."""
    shape = shd.MeshConfig(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor).sizes(len(devices))
    if num_slices <= 1:
        return shd.make_mesh(*shape, devices=devices)
    from jax.experimental import mesh_utils

    for axis in (0, 1):
        if shape[axis] % num_slices == 0:
            ici = list(shape)
            ici[axis] //= num_slices
            dcn = [1, 1, 1]
            dcn[axis] = num_slices
            grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices)
            return Mesh(grid, shd.MESH_AXES)
    raise ValueError(
        f"--num_slices={num_slices}: neither mesh.data={shape[0]} nor mesh.fsdp={shape[1]} "
        f"is a multiple of it; set --config.mesh.data={num_slices} (data parallel across slices)"
    )


def build_programs(
    cfg: ExperimentConfig,
    devices: Sequence[Any],
    num_slices: int = 1,
    *,
    unrolled_layers: int | None = None,
    sampler_devices: Sequence[Any] | None = None,
) -> tuple[RunShapes, list[Program]]:
    """The run's train_step, logprobs, prefill and decode over ``devices`` (one topology's chips).

    With several hosts the sampler's programs run on one host's chips: ``sampler_devices`` (a one-host
    topology of the same chip, ``report.host_topology``), else the first host's devices of ``devices``.

    ``unrolled_layers=n``: the same programs for an ``n``-layer model with every layer and attention
    block written out instead of looped (no ``while`` loop hides work from XLA's cost analysis; the
    report fits per-layer costs from n = 1 and 2)."""
    shapes = run_shapes(cfg, devices)
    mcfg = model_config(cfg)
    if unrolled_layers is not None:
        mcfg = mcfg.replace(num_layers=unrolled_layers, scan_layers=False)
    c = cfg.mesh.rollout_chips_per_host
    mesh = mesh_over(cfg, training_devices(cfg, devices), num_slices)
    model = abstract_model(mcfg, mesh, shd.TRAIN_RULES, lora_spec(cfg))
    trainer = Trainer(model, cfg.run_optim(), cfg.loss, micro_batch_size=cfg.rl.micro_batch_size, mesh=mesh)
    params = trainer.params
    ref = trainer.ref_params
    frozen = trainer.frozen  # LoRA: the base weights, an argument of train_step and logprobs (None without)
    # a Qwen3-MoE's batch carries the sampler's routing record (compared with the update's, or replayed)
    routing = (len(mcfg.sparse_layers), mcfg.num_experts_per_tok) if hasattr(mcfg, "num_experts") else None
    mb = micro_batch_spec(shapes.train_rows, shapes.train_width, mesh, cfg.loss.role_balanced, routing)

    # Sampling mesh and model: the training model itself with one process, colocated and synchronous; else
    # each process samples from a copy on its own chips (rl.rollout_weights): a host's chips (several
    # processes), the chips kept for rollouts (disaggregated), and one copy per rollout in flight (async).
    s = cfg.rl.max_staleness
    copies = s + 1 if s else (1 if shapes.processes > 1 or c else 0)
    if copies:
        if sampler_devices is not None:
            local = list(sampler_devices)
        else:
            first = sorted(hosts(devices)[0], key=lambda d: getattr(d, "id", 0))
            local = first[len(first) - c :] if c else first
        local_mesh = rollout_mesh(mcfg, local)
        sample_model = abstract_model(rollout_config(mcfg), local_mesh, shd.TRAIN_RULES)
        rollout_copy = per_chip_bytes(nnx.state(sample_model, nnx.Param))
    else:
        local_mesh, sample_model, rollout_copy = mesh, model, 0
    # Several processes, asynchronous: the s versions in flight also as global arrays over the training chips,
    # in the compute dtype (what a checkpoint saves: rl.async_pipeline)
    snapshots = 0
    if s and shapes.processes > 1:
        snapshots = s * per_chip_bytes(
            nnx.state(abstract_model(rollout_config(mcfg), mesh, shd.TRAIN_RULES), nnx.Param)
        )
    sampler = Sampler(sample_model, mesh=local_mesh)
    specs = sampler.program_specs(shapes.sample_batch, shapes.prefill_chunk, shapes.cache_window, shapes.decode_budget)
    sample_params = specs["decode"][1][0]

    grad, apply = trainer.program("grad"), trainer.program("apply")

    def train_step(params, opt_state, grad_sum, mb, ref_params, frozen=None):
        g, sums = grad(params, mb, ref_params, frozen)
        total = jax.tree.map(jnp.add, grad_sum, g)
        params, opt_state, gnorm = apply(params, opt_state, total, sums["loss"][1])
        return params, opt_state, gnorm, sums

    grad_sum = _abstract_like(params, jax.tree.map(lambda x: x.sharding, params))
    params_b, opt_b, ref_b = per_chip_bytes(params), per_chip_bytes(trainer.opt_state), per_chip_bytes(ref)
    frozen_b = per_chip_bytes(frozen) if frozen is not None else 0
    rows = f"{shapes.train_rows} rows x {shapes.train_width} tokens"
    train_state = f"params {_gb(params_b)} + optimizer {_gb(opt_b)}" + (f" + reference {_gb(ref_b)}" if ref_b else "")
    if frozen_b:
        train_state = f"frozen base {_gb(frozen_b)} + LoRA " + train_state
    copy_note = ""
    if rollout_copy:
        copy_note = f"rollout weight copy {_gb(rollout_copy)}" + (
            f" x {copies} (one per rollout in flight)" if copies > 1 else ""
        )
    snap_note = f"{s} in-flight versions (global, for checkpoints) {_gb(snapshots)}" if snapshots else ""
    if c:  # disaggregated: the training chips hold no rollout copy, the rollout chips no training state
        train_extra, train_note = snapshots, snap_note
        sample_resident, sample_note = copies * rollout_copy, copy_note
    else:
        train_extra = copies * rollout_copy + snapshots
        train_note = ", ".join(x for x in (copy_note, snap_note) if x)
        sample_resident = params_b + frozen_b + opt_b + ref_b + train_extra
        sample_note = ", ".join(x for x in (train_state, copy_note, snap_note) if x)
    # (with LoRA adapters on the model it samples from, the sampler reads merged weights: always a copy)
    reads_source = not sample_model.config.lora_scale and not any(
        a.sharding != b.sharding
        for a, b in zip(jax.tree.leaves(sample_params), jax.tree.leaves(nnx.state(sample_model)))
    )
    if reads_source:  # the sampler reads its source weights in place: they are its argument
        sample_resident -= rollout_copy if copies else params_b
    cache = f"window {shapes.cache_window}"
    programs = [
        Program(
            "train_step",
            jax.jit(train_step, donate_argnums=(0, 1, 2)),
            (params, trainer.opt_state, grad_sum, mb, ref, frozen),
            {},
            mesh,
            rows,
            train_extra,
            train_note,
        ),
        Program(
            "logprobs",
            trainer.program("logprobs"),
            (params, mb, frozen),
            {},
            mesh,
            rows,
            opt_b + ref_b + train_extra,
            ", ".join(x for x in (f"optimizer {_gb(opt_b)}", train_note) if x),
        ),
        Program(
            "prefill",
            specs["prefill"][0],
            specs["prefill"][1],
            specs["prefill"][2],
            local_mesh,
            f"{shapes.sample_batch} rows x {shapes.prefill_chunk} tokens, {cache}",
            sample_resident,
            sample_note,
        ),
        Program(
            "decode",
            specs["decode"][0],
            specs["decode"][1],
            specs["decode"][2],
            local_mesh,
            f"{shapes.sample_batch} rows, {cache}, {shapes.decode_budget} steps",
            sample_resident,
            sample_note,
        ),
        # Not reported: decode's once-per-call work before its loop, subtracted from decode's cost.
        Program(DECODE_SETUP, specs["decode_setup"][0], specs["decode_setup"][1], {}, local_mesh, ""),
    ]
    return shapes, programs


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"
