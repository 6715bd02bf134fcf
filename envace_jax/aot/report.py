"""Compile every program of a config for a TPU topology and report per-chip memory and a roofline.

``compile_report`` is what ``launch/aot_compile.py`` runs. ``aot.json`` holds exactly::

    {"topology", "chips", "chip", "hbm_bytes_per_chip", "layout",
     "programs": [{"name", "per_chip_bytes": {"arguments", "outputs", "temps", "code", "total"},
                   "fits", "flops", "bytes_accessed", "collectives": {op: count}, "roofline_s"}]}

``total`` is the program's own peak on one chip (arguments + outputs + temporaries + code, donated
buffers counted once). ``fits`` also counts what the run keeps on the chip while the program runs
(the ``resident`` column of the table: e.g. the optimizer state during sampling):
``total + resident <= HBM``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from typing import Any, Callable, Iterator, Sequence

from envace_jax.aot.analyze import ProgramReport, analyze, compiled_cost, layer_fit, roofline_seconds
from envace_jax.aot.chips import ChipSpec, chip_for_topology, topology_chips
from envace_jax.aot.plan import RunShapes, hosts, model_config
from envace_jax.config import ExperimentConfig

# The progress lines of a report ("aot: <program> ..."); launch/aot_compile.py shows them on stderr.
logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Report:
    topology: str
    chips: int
    chip: ChipSpec
    shapes: RunShapes
    programs: list[ProgramReport]

    @property
    def all_fit(self) -> bool:
        return all(p.fits for p in self.programs)

    def to_json(self) -> dict[str, Any]:
        return {
            "topology": self.topology,
            "chips": self.chips,
            "chip": self.chip.name,
            "hbm_bytes_per_chip": self.chip.hbm_bytes,
            "layout": self.shapes.layout,
            "programs": [p.to_json() for p in self.programs],
        }

    def write(self, path: str) -> None:
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)


def topology_devices(topology: str, num_slices: int = 1, *, one_host: bool = False) -> list[Any]:
    """Compile-only TPU devices of ``topology`` (libtpu, no TPU needed), with the chip's real host
    layout where libtpu's default differs (v5e / v6e hosts hold 8 chips). ``one_host``: the topology is
    one host's share of chips (``part_topology``), whatever the chip's host size."""
    try:
        from jax.experimental import topologies
    except ImportError as e:  # pragma: no cover - jax always has it
        raise RuntimeError(f"jax.experimental.topologies is unavailable: {e}") from e
    chip = chip_for_topology(topology)
    n = topology_chips(topology)
    kw: dict[str, Any] = {}
    if one_host:
        dims = [int(x) for x in topology.split(":", 1)[1].lower().split("x")]
        kw["chips_per_host_bounds"] = tuple(dims + [1] * (3 - len(dims)))
    elif chip.host_bounds is not None and n >= chip.host_bounds[0] * chip.host_bounds[1] * chip.host_bounds[2]:
        kw["chips_per_host_bounds"] = chip.host_bounds
    if num_slices > 1:
        kw["num_slices"] = num_slices
    try:
        desc = topologies.get_topology_desc(platform="tpu", topology_name=topology, **kw)
    except Exception as e:  # libtpu missing or topology unknown: say which
        raise RuntimeError(
            f"cannot describe TPU topology {topology!r} (is libtpu installed? `pip install -e '.[aot]'`): {e}"
        ) from e
    return list(desc.devices)


def host_topology(topology: str, devices: Sequence[Any]) -> str | None:
    """The topology of ONE host of ``devices``' slice (``"v5e:2x4"`` for a v5e slice's 8-chip host), or
    None for a one-host slice.

    Why: each host samples on its own chips (``rl.train.rollout_copy``), but libtpu refuses a program
    placed on a subset of a v5e / v6e slice ("device assignment should include all slice devices";
    those chips have limited ICI routing), so the sampler's programs are compiled for a slice of one
    host of the same chip, which is what that host's chips are to the sampler."""
    groups = hosts(devices)
    if len(groups) == 1:
        return None
    coords = [tuple(getattr(d, "coords", ())) for d in groups[0]]
    if not all(coords) or len({len(c) for c in coords}) != 1:
        raise RuntimeError(f"{topology}: the devices carry no chip coordinates to size one host by")
    dims = [max(c[i] for c in coords) - min(c[i] for c in coords) + 1 for i in range(len(coords[0]))]
    given = len(topology.split(":", 1)[1].lower().split("x"))  # v5e:16x16 names 2 axes, v5p:4x4x4 three
    while len(dims) > given and dims[-1] == 1:
        dims.pop()
    gen = topology.split(":", 1)[0]
    return f"{gen}:{'x'.join(str(d) for d in dims)}"


def part_topology(topology: str, chips: int) -> str:
    """A topology of ``chips`` chips of ``topology``'s generation (the rollout chips of one host in the
    disaggregated layout), as near square as ``chips`` allows: ``v5p:2x1x1`` for 2 chips of a v5p slice."""
    gen, shape = topology.split(":", 1)
    axes = len(shape.lower().split("x"))
    dims, n = [], chips
    for d in (4, 2):  # largest factors first
        while n % d == 0 and n > 1 and len(dims) < axes:
            dims.append(d)
            n //= d
    if n > 1 or chips < 1:
        raise ValueError(f"mesh.rollout_chips_per_host={chips}: use 1, 2, 4, 8 or 16 chips per host")
    dims += [1] * (axes - len(dims))
    return f"{gen}:{'x'.join(str(d) for d in dims)}"


@contextlib.contextmanager
def _timed(say: Callable[[str], None], what: str) -> Iterator[None]:
    """A line before ``what`` and one after it with the seconds it took: one compile of a large model
    takes minutes on a CPU host, and a whole report can take an hour."""
    say(f"aot: {what} ...")
    t0 = time.perf_counter()
    yield
    say(f"aot: {what}: {time.perf_counter() - t0:.1f} s")


def compile_report(
    cfg: ExperimentConfig,
    topology: str,
    num_slices: int = 1,
    only: Sequence[str] | None = None,
    *,
    say: Callable[[str], None] = logger.info,
) -> Report:
    """Compiles the programs of ``cfg`` (``only``: these names) for ``topology``; ``say`` gets a progress
    line before and after each compilation (default: an INFO record of this module's logger)."""
    from envace_jax.aot.programs import DECODE_SETUP, build_programs

    chip = chip_for_topology(topology)
    devices = topology_devices(topology, num_slices)
    one_host = host_topology(topology, devices)
    c = cfg.mesh.rollout_chips_per_host
    if c:  # disaggregated: the sampler runs on the c chips a host keeps for rollouts
        sampler_devices = topology_devices(part_topology(topology, c), one_host=True)
        want = c
    else:
        sampler_devices = topology_devices(one_host) if one_host else None
        want = len(hosts(devices)[0])
    if sampler_devices is not None and len(sampler_devices) != want:
        raise RuntimeError(f"{one_host}: {len(sampler_devices)} chips, but the sampler of {topology} drives {want}")
    build = lambda **kw: build_programs(cfg, devices, num_slices, sampler_devices=sampler_devices, **kw)
    shapes, programs = build()
    programs = [p for p in programs if p.name != DECODE_SETUP]
    if only:
        unknown = sorted(set(only) - {p.name for p in programs})
        if unknown:
            raise ValueError(f"--programs: unknown {unknown}; choose from {[p.name for p in programs]}")
        programs = [p for p in programs if p.name in only]
    # Costs without loops: the same programs for 1- and 2-layer models, layers and blocks written out.
    small = {n: {p.name: p for p in build(unrolled_layers=n)[1]} for n in (1, 2)}
    num_layers = model_config(cfg).num_layers
    reports = []
    fitted = lambda name: layer_fit(compiled_cost(small[1][name]), compiled_cost(small[2][name]), num_layers)
    for i, p in enumerate(programs, 1):
        with _timed(say, f"[{i}/{len(programs)}] {p.name} ({p.shape}): lowering and compiling for {topology}"):
            rep = analyze(p, chip)
        if rep.fits or not rep.error:
            with _timed(say, f"[{i}/{len(programs)}] {p.name}: compiling 1- and 2-layer copies for its cost"):
                cost = fitted(p.name)
            if cost is not None:
                roofline = roofline_seconds(*cost, chip) * rep.steps
                if p.name == "decode":
                    # The loop body is counted once, the setup before the loop (decode_weights) too:
                    # one step is the difference; the setup runs once per call, not once per step.
                    with _timed(say, f"[{i}/{len(programs)}] decode: compiling its once-per-call setup"):
                        setup = fitted(DECODE_SETUP) or (0.0, 0.0)
                    cost = tuple(max(a - b, 0.0) for a, b in zip(cost, setup))
                    rep = dataclasses.replace(rep, setup_s=roofline_seconds(*setup, chip))
                    roofline = roofline_seconds(*cost, chip) * rep.steps + rep.setup_s
                rep = dataclasses.replace(rep, flops=cost[0], bytes_accessed=cost[1], roofline_s=roofline)
        reports.append(rep)
    return Report(topology if num_slices == 1 else f"{num_slices}x{topology}", len(devices), chip, shapes, reports)


# ----------------------------------------------------------------------------- text


def knobs(cfg: ExperimentConfig, program: str, shapes: RunShapes) -> list[str]:
    """The config fields that change ``program``'s per-chip memory, with their current values."""
    m, r = cfg.mesh, cfg.rl
    mesh = f"--config.mesh.fsdp (now {m.fsdp}) / --config.mesh.tensor (now {m.tensor})"
    dtype = f"--config.model.param_dtype (now {cfg.model.param_dtype}; bfloat16 halves weights and state)"
    if program in ("train_step", "logprobs"):
        out = [
            f"{mesh}: shard parameters{', gradients and optimizer state' if program == 'train_step' else ''} "
            f"over more chips",
            f"--config.rl.micro_batch_size (now {r.micro_batch_size}; {shapes.train_rows} rows per micro-batch "
            f"over {shapes.processes} host(s))",
            f"--config.rl.max_row_length (now {r.max_row_length})",
        ]
        if program == "train_step":
            out.append(
                f"--config.model.remat_policy (now {cfg.model.remat_policy}; 'full' keeps the fewest activations)"
            )
        return out + [dtype]
    return [
        f"--config.data.prompts_per_step (now {cfg.data.prompts_per_step} per process) x "
        f"--config.rl.n_rollouts (now {r.n_rollouts}): {shapes.sample_rows} rows per sampler call",
        f"--config.rollout.max_model_len (now {cfg.rollout.max_model_len}): cache window {shapes.cache_window}",
        (
            f"--config.mesh.rollout_chips_per_host (now {m.rollout_chips_per_host}): the chips each host samples "
            f"on, weights and kv heads split over them (rl.rollout_weights.rollout_mesh)"
            if m.rollout_chips_per_host
            else f"--config.mesh.tensor (now {m.tensor}): splits kv heads and weights of the sampler"
            if shapes.processes == 1
            else f"chips per host (now {shapes.chips_per_process}): each host samples on its own chips, weights "
            f"and kv heads split over them (rl.rollout_weights.rollout_mesh)"
        ),
        dtype,
    ]


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def format_table(rep: Report) -> str:
    head = (
        f"{rep.topology}: {rep.chips} x TPU {rep.chip.name}, HBM {_gb(rep.chip.hbm_bytes)} GB/chip, "
        f"{rep.shapes.processes} host(s) x {rep.shapes.chips_per_process} chips "
        f"(peak {rep.chip.bf16_flops_per_s / 1e12:.0f} TFLOP/s bf16, {rep.chip.hbm_bytes_per_s / 1e9:.0f} GB/s)"
        f"\nlayout: {rep.shapes.layout}"
    )
    cols = [
        "program",
        "shape",
        "mesh (data,fsdp,tensor)",
        "args GB",
        "out GB",
        "temp GB",
        "total GB",
        "resident GB",
        "fits",
        "TFLOP",
        "GB moved",
        "roofline s",
        "collectives",
    ]
    rows = []
    for p in rep.programs:
        mesh = ",".join(str(p.mesh.get(a, 1)) for a in ("data", "fsdp", "tensor"))
        b = p.per_chip_bytes
        coll = " ".join(f"{k}:{v}" for k, v in p.collectives.items()) or "-"
        per = " (1 step)" if p.steps > 1 else ""
        roof = f"{p.roofline_s:.3g}" + (f" ({p.steps} steps)" if p.steps > 1 else "")
        rows.append(
            [
                p.name,
                p.shape,
                mesh,
                _gb(b["arguments"]),
                _gb(b["outputs"]),
                _gb(b["temps"]),
                _gb(b["total"]),
                _gb(p.resident_bytes),
                "yes" if p.fits else "NO",
                f"{p.flops / 1e12:.3g}{per}",
                f"{p.bytes_accessed / 1e9:.3g}{per}",
                roof,
                coll,
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths))
    out = [head, line(cols), line(["-" * w for w in widths])] + [line(r) for r in rows]
    for p in rep.programs:
        if p.resident_bytes:
            out.append(f"  resident during {p.name}: {p.resident_what}")
        for w in p.warnings:
            out.append(f"  WARNING {p.name}: {w}")
    return "\n".join(out)


def not_fitting_message(rep: Report, cfg: ExperimentConfig) -> str:
    lines = []
    for p in rep.programs:
        if p.fits:
            continue
        need = p.per_chip_bytes["total"] + p.resident_bytes
        why = p.error or (
            f"needs {_gb(need)} GB per chip ({_gb(p.per_chip_bytes['total'])} program + "
            f"{_gb(p.resident_bytes)} resident) of {_gb(rep.chip.hbm_bytes)} GB"
        )
        lines.append(f"{p.name} ({p.shape}) does not fit on {rep.topology}: {why}")
        lines.extend(f"    {k}" for k in knobs(cfg, p.name, rep.shapes))
    return "\n".join(lines)
