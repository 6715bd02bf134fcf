"""Per-chip specifications of the TPU generations the ahead-of-time report knows.

Only the three numbers a roofline needs, per chip: HBM capacity, HBM bandwidth and the bf16 peak.
Decimal units (GB = 1e9 bytes) where the vendor page says GB, binary (GiB) where it says GiB.
"""

from __future__ import annotations

import dataclasses

GB = 10**9
GiB = 2**30


@dataclasses.dataclass(frozen=True)
class ChipSpec:
    name: str
    hbm_bytes: int  # HBM capacity per chip
    hbm_bytes_per_s: float  # HBM bandwidth per chip
    bf16_flops_per_s: float  # peak dense bf16 matmul rate per chip
    host_bounds: tuple[int, int, int] | None  # chips per host VM (None: libtpu's default)


CHIPS: dict[str, ChipSpec] = {
    # https://cloud.google.com/tpu/docs/v4 (key specifications): "Peak compute per chip 275 teraflops
    # (bf16 or int8)", "HBM2 capacity and bandwidth 32 GiB, 1200 GBps". 4 chips per host.
    "v4": ChipSpec("v4", 32 * GiB, 1200 * GB, 275e12, None),
    # https://cloud.google.com/tpu/docs/v5e (key chip specifications): "Peak compute per chip (bf16)
    # 197 TFLOPs", "HBM2 capacity and bandwidth 16 GB, 819 GBps". Full-host VMs hold 8 chips (2x4),
    # e.g. v5litepod-256 is 32 hosts; libtpu's compile-only topology defaults to 4 chips per host.
    "v5e": ChipSpec("v5e", 16 * GB, 819 * GB, 197e12, (2, 4, 1)),
    # https://cloud.google.com/tpu/docs/v5p (key specifications): "Peak compute per chip (bf16)
    # 459 TFLOPs", "HBM2e capacity and bandwidth 95GB, 2765 GBps". 4 chips per host.
    "v5p": ChipSpec("v5p", 95 * GB, 2765 * GB, 459e12, None),
    # https://cloud.google.com/tpu/docs/v6e (specifications): "Peak compute per chip (bf16) 918 TFLOPs",
    # "HBM capacity per chip 32 GB", "HBM bandwidth per chip 1638 GBps", "Chips per host 8".
    "v6e": ChipSpec("v6e", 32 * GB, 1638 * GB, 918e12, (2, 4, 1)),
}


def chip_for_topology(topology: str) -> ChipSpec:
    """``"v5p:4x4x4"`` -> the v5p spec; an unknown generation is an error naming the known ones."""
    gen = topology.split(":", 1)[0].strip().lower()
    gen = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e"}.get(gen, gen)
    if gen not in CHIPS:
        raise ValueError(f"--topology={topology!r}: unknown TPU generation {gen!r}; known: {sorted(CHIPS)}")
    return CHIPS[gen]


def topology_chips(topology: str) -> int:
    """Chips named by a topology string: ``"v5p:4x4x4"`` -> 64."""
    try:
        dims = [int(d) for d in topology.split(":", 1)[1].lower().split("x")]
    except (IndexError, ValueError):
        raise ValueError(f"--topology={topology!r}: expected <generation>:<AxB[xC]>, e.g. v5p:4x4x4") from None
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"--topology={topology!r}: dimensions must be positive")
    n = 1
    for d in dims:
        n *= d
    return n
