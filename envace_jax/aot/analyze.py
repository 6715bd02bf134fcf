"""Compile one program for the target chips and read back what XLA knows about it.

Per chip: memory (``memory_analysis``: arguments, outputs, temporaries, generated code; donated
arguments that outputs reuse counted once), cost (``cost_analysis``: flops, bytes accessed), and the
collectives in the partitioned HLO. An out-of-memory compile error is a result (the program does not
fit), not a crash: libtpu raises the same error the pod would.

XLA's cost analysis counts a ``while`` loop's body once (it does not know the trip count). The layer
scan (and the attention blocks inside a layer) would make a 36-layer model look like a 1-layer one,
so flops and bytes come from two more compiles of the same program for 1- and 2-layer models with
every layer and block written out: ``cost(L) = c1 + (L - 1) * (c2 - c1)``, per chip, with the real
shardings. The decode loop itself is left counted once, and so is what decode does before its loop
(preparing the weights it reads): ``report.compile_report`` compiles that setup alone and subtracts
it, so decode's flops and bytes are one decode step, and its roofline is the setup plus the whole
budget of steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
from typing import Any

from envace_jax.aot.chips import ChipSpec
from envace_jax.aot.programs import Program

_COLLECTIVES = (
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "ragged-all-to-all",
)
# `%x = f32[..] all-gather(` or the async `all-gather-start(`; `-done` halves are not counted twice.
_OP = re.compile(r"=\s*[^=]*?\s(" + "|".join(_COLLECTIVES) + r")(-start)?\(")
REMAT_WARNING = "involuntary full rematerialization"


@dataclasses.dataclass
class ProgramReport:
    name: str
    shape: str
    mesh: dict[str, int]
    per_chip_bytes: dict[str, int]  # arguments, outputs, temps, code, total
    resident_bytes: int
    resident_what: str
    fits: bool
    flops: float
    bytes_accessed: float
    collectives: dict[str, int]
    roofline_s: float
    steps: int = 1  # decode: loop steps the roofline covers
    setup_s: float = 0.0  # decode: the once-per-call part of the roofline (before the loop)
    error: str = ""  # the compiler's out-of-memory message, if any
    warnings: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "per_chip_bytes": dict(self.per_chip_bytes),
            "fits": self.fits,
            "flops": self.flops,
            "bytes_accessed": self.bytes_accessed,
            "collectives": dict(self.collectives),
            "roofline_s": self.roofline_s,
        }


@contextlib.contextmanager
def captured_stderr():
    """Collects what native code (XLA's C++ logging) writes to file descriptor 2, and echoes it.

    Yields a list that holds the captured text once the block exits.
    """
    out: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
            out.append(text)
            sys.stderr.write(text)


def count_collectives(hlo_text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in _OP.finditer(hlo_text):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return dict(sorted(counts.items()))


def roofline_seconds(flops: float, bytes_accessed: float, chip: ChipSpec) -> float:
    """max(compute time at the bf16 peak, HBM time at full bandwidth), per chip."""
    return max(flops / chip.bf16_flops_per_s, bytes_accessed / chip.hbm_bytes_per_s)


def _is_oom(msg: str) -> bool:
    return "RESOURCE_EXHAUSTED" in msg or "Ran out of memory" in msg or "out of memory" in msg.lower()


def _first(cost: Any) -> dict[str, float]:
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return dict(cost or {})


def compiled_cost(p: Program) -> tuple[float, float] | None:
    """(flops, bytes accessed) per chip of ``p`` compiled for its chips; None if it runs out of memory."""
    try:
        with captured_stderr():
            compiled = p.fn.lower(*p.args, **p.kwargs).compile()
    except Exception as e:  # any compile failure: an out-of-memory is a result, the rest re-raise
        if _is_oom(str(e)):
            return None
        raise
    cost = _first(compiled.cost_analysis())
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def layer_fit(
    one: tuple[float, float] | None, two: tuple[float, float] | None, num_layers: int
) -> tuple[float, float] | None:
    """Costs of an ``num_layers`` model from those of 1- and 2-layer ones (everything else is fixed)."""
    if one is None or two is None:
        return None
    return tuple(a + (num_layers - 1) * (b - a) for a, b in zip(one, two))  # type: ignore[return-value]


def analyze(p: Program, chip: ChipSpec, cost: tuple[float, float] | None = None) -> ProgramReport:
    """Lowers and compiles ``p`` for the target chips; never raises for an out-of-memory program.
    ``cost``: (flops, bytes) per chip counted without loops (``layer_fit``); default: XLA's own count
    of ``p``, in which every loop body counts once."""
    mesh = {k: int(v) for k, v in p.mesh.shape.items()}
    steps = int(p.kwargs.get("budget", 1))
    lowered = p.fn.lower(*p.args, **p.kwargs)
    with captured_stderr() as log:
        try:
            compiled = lowered.compile()
            error = ""
        except Exception as e:  # only memory errors are a result; others re-raise
            if not _is_oom(str(e)):
                raise
            compiled, error = None, str(e).strip()
    warnings = [line.strip() for line in "".join(log).splitlines() if REMAT_WARNING in line.lower()]
    if compiled is None:
        used = _parse_oom_bytes(error)
        error = " ".join(error.split())[:600]
        sizes = {"arguments": 0, "outputs": 0, "temps": 0, "code": 0, "total": used}
        return ProgramReport(
            p.name,
            p.shape,
            mesh,
            sizes,
            p.resident_bytes,
            p.resident_what,
            False,
            0.0,
            0.0,
            {},
            0.0,
            steps,
            error,
            warnings,
        )
    m = compiled.memory_analysis()
    args, outs = int(m.argument_size_in_bytes), int(m.output_size_in_bytes)
    alias, temps, code = int(m.alias_size_in_bytes), int(m.temp_size_in_bytes), int(m.generated_code_size_in_bytes)
    total = args + outs - alias + temps + code
    sizes = {"arguments": args, "outputs": outs, "temps": temps, "code": code, "total": total}
    if cost is None:
        own = _first(compiled.cost_analysis())
        cost = (float(own.get("flops", 0.0)), float(own.get("bytes accessed", 0.0)))
    flops, nbytes = cost
    fits = total + p.resident_bytes <= chip.hbm_bytes
    return ProgramReport(
        p.name,
        p.shape,
        mesh,
        sizes,
        p.resident_bytes,
        p.resident_what,
        fits,
        flops,
        nbytes,
        count_collectives(compiled.as_text()),
        roofline_seconds(flops, nbytes, chip) * steps,
        steps,
        "",
        warnings,
    )


def _parse_oom_bytes(msg: str) -> int:
    """The bytes an out-of-memory message says were needed (0 when it names no figure): libtpu writes
    ``... required for HLO temporaries (402.92G) exceeds available HBM (95.74G)`` or
    ``Used 97.51G of 95.74G hbm``, in binary units."""
    m = re.search(r"required for [^(]*\(([\d.]+)([KMGT])\)", msg) or re.search(r"Used\s+([\d.]+)([KMGT])\s+of", msg)
    if not m:
        return 0
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2)))
