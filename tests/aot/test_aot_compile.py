"""Ahead-of-time compilation for TPU topologies (launch/aot_compile.py, envace_jax.aot).

The compile tests need libtpu (the `aot` extra; CI installs it) but no TPU: they compile a tiny config
for a v5e 2x2 slice and check the per-chip bytes XLA reports against a hand count, and that an
oversized config is reported as not fitting. The shape and parsing tests need nothing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from envace_jax.aot.analyze import count_collectives, roofline_seconds
from envace_jax.aot.chips import CHIPS, chip_for_topology, topology_chips
from envace_jax.aot.plan import run_shapes
from envace_jax.config import config_from_file, load_config
from tests.helpers_paths import ROOT as REPO

HAVE_LIBTPU = importlib.util.find_spec("libtpu") is not None
# The in-process topology tests load libtpu here; without this, any other process on the machine holding
# libtpu's machine-wide lock (a second test run, a TPU-less JAX program) makes them fail.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
needs_libtpu = pytest.mark.skipif(
    not HAVE_LIBTPU, reason="libtpu is not installed (pip install -e '.[aot]'); TPU compilation cannot run"
)


@dataclasses.dataclass
class FakeChip:
    process_index: int


def test_run_shapes_of_the_8b_config_on_a_v5p_64_layout():
    cfg = load_config(config_from_file(os.path.join(REPO, "configs/envace_qwen3_8b.py")))
    devices = [FakeChip(i // 4) for i in range(64)]  # 16 hosts x 4 chips, as libtpu describes v5p:4x4x4
    s = run_shapes(cfg, devices)
    assert (s.processes, s.chips_per_process) == (16, 4)
    # micro-batch 1 per process, rounded up to the host's 4 chips, times 16 hosts: one row per chip
    assert s.train_rows == 64
    assert s.train_width == 20032  # 20000 rounded up to the 64-token bucket
    episodes = cfg.data.prompts_per_step * cfg.rl.n_rollouts
    assert s.sample_rows == 2 * episodes and s.rows_per_episode == 2  # requests + parked ACT rows
    real = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, mode="real"))
    assert run_shapes(real, devices).rows_per_episode == 1 and run_shapes(real, devices).sample_rows == episodes
    assert s.cache_window == 20480  # 20000 in quarter-octave buckets (step 4096)
    assert s.decode_budget == 8192 and s.prefill_chunk == 512
    assert s.layout.startswith("colocated")
    # disaggregated: one chip of every host samples, the other three train (one row each)
    split = dataclasses.replace(cfg, mesh=dataclasses.replace(cfg.mesh, rollout_chips_per_host=1))
    d = run_shapes(split, devices)
    assert (d.processes, d.chips_per_process, d.train_rows) == (16, 3, 48)
    assert d.layout.startswith("disaggregated: 48 training chips (3 per host), 16 rollout chips (1 per host)")


def test_collective_counts_and_roofline_arithmetic():
    hlo = """
  %all-gather.1 = bf16[8,64]{1,0} all-gather(bf16[2,64]{1,0} %p), dimensions={0}
  %ags = (bf16[2,64], bf16[8,64]) all-gather-start(bf16[2,64]{1,0} %q), dimensions={0}
  %agd = bf16[8,64]{1,0} all-gather-done(%ags)
  %all-reduce.7 = f32[] all-reduce(f32[] %x), to_apply=%add
  %rs = f32[4]{0} reduce-scatter(f32[16]{0} %y), dimensions={0}
  %fusion = f32[4]{0} fusion(f32[4]{0} %rs), calls=%all-reduce-like-name
"""
    assert count_collectives(hlo) == {"all-gather": 2, "all-reduce": 1, "reduce-scatter": 1}
    v5p = CHIPS["v5p"]
    assert roofline_seconds(459e12, 0.0, v5p) == pytest.approx(1.0)  # compute-bound: 1 s of peak
    assert roofline_seconds(1.0, 2765e9 * 2, v5p) == pytest.approx(2.0)  # memory-bound: 2 s of HBM


def test_topology_names():
    assert chip_for_topology("v5p:4x4x4").name == "v5p" and topology_chips("v5p:4x4x4") == 64
    assert chip_for_topology("v5litepod:16x16").name == "v5e" and topology_chips("v5e:16x16") == 256
    with pytest.raises(ValueError, match="unknown TPU generation 'v9'"):
        chip_for_topology("v9:2x2")
    with pytest.raises(ValueError, match="expected <generation>:<AxB"):
        topology_chips("v5p")


# Tiny model with TPU-tile-friendly sizes (multiples of 128), so padding does not blur the hand count.
TINY = [
    "--config.model.vocab_size=1024",
    "--config.model.hidden_size=256",
    "--config.model.intermediate_size=512",
    "--config.model.num_layers=2",
    "--config.model.num_heads=2",
    "--config.model.num_kv_heads=1",
    "--config.model.head_dim=128",
    "--config.rl.micro_batch_size=4",
    "--config.rl.max_row_length=256",
    "--config.rollout.max_model_len=512",
    "--config.rollout.act.max_new_tokens=64",
    "--config.rollout.rehearse.max_new_tokens=64",
    "--config.data.prompts_per_step=2",
    "--config.rl.n_rollouts=2",
    "--config.mesh.fsdp=-1",
]


def _aot(tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "aot.json"
    cmd = [
        sys.executable,
        os.path.join(REPO, "launch/aot_compile.py"),
        "--config=" + os.path.join(REPO, "configs/demo_cpu.py"),
        "--topology=v5e:2x2",
        f"--output={out}",
        *TINY,
        *extra,
    ]
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "JAX_PLATFORMS": "cpu"}
    )
    return proc, (json.loads(out.read_text()) if out.exists() else None)


@needs_libtpu
def test_tiny_config_on_v5e_2x2_argument_bytes_match_a_hand_count(tmp_path):
    proc, rep = _aot(tmp_path, "--programs=train_step,decode")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert set(rep) == {"topology", "chips", "chip", "hbm_bytes_per_chip", "layout", "programs"}
    assert (rep["topology"], rep["chips"], rep["chip"], rep["hbm_bytes_per_chip"]) == ("v5e:2x2", 4, "v5e", 16 * 10**9)
    progs = {p["name"]: p for p in rep["programs"]}
    assert set(progs) == {"train_step", "decode"}
    for p in progs.values():
        assert set(p) == {"name", "per_chip_bytes", "fits", "flops", "bytes_accessed", "collectives", "roofline_s"}
        assert set(p["per_chip_bytes"]) == {"arguments", "outputs", "temps", "code", "total"}
        assert p["fits"] is True and p["flops"] > 0 and p["roofline_s"] > 0

    # Hand count: fsdp = 4 chips split every "embed" (hidden, 256) dimension; norms are replicated.
    V, D, F, L, N, K, H = 1024, 256, 512, 2, 2, 1, 128
    split = 2 * V * D + L * (2 * D * N * H + 2 * D * K * H + 3 * D * F)  # embed, lm_head, q/o, k/v, mlp
    whole = D + L * (2 * D + 2 * H)  # final, input/post, q/k norms
    params = 4 * (split / 4 + whole)  # float32 bytes on one chip
    # train_step's arguments: parameters, Adam's two moments, the running gradient sum (each one
    # parameter-sized), and one micro-batch row per chip (6 [1, 256] arrays of 4 bytes).
    hand = 4 * params + 6 * 256 * 4
    args = progs["train_step"]["per_chip_bytes"]["arguments"]
    assert abs(args - hand) / hand < 0.03, (args, hand)
    # Not a replica: a chip holding everything would need 4x the split part.
    assert args < 0.5 * 4 * 4 * (split + whole)
    assert progs["train_step"]["collectives"], "fsdp needs collectives (weight gathers, gradient reductions)"


@needs_libtpu
def test_oversized_config_is_reported_as_not_fitting(tmp_path):
    # A 4M-token vocabulary at hidden 1024: 2 x 16 GB of float32 embedding and head, 4 copies with the
    # optimizer and the gradient sum, over 4 chips of 16 GB.
    proc, rep = _aot(
        tmp_path, "--programs=train_step", "--config.model.vocab_size=4194304", "--config.model.hidden_size=1024"
    )
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "train_step" in proc.stderr and "does not fit on v5e:2x2" in proc.stderr
    for knob in (
        "--config.mesh.fsdp",
        "--config.rl.micro_batch_size",
        "--config.model.remat_policy",
        "--config.model.param_dtype",
    ):
        assert knob in proc.stderr, knob
    (p,) = rep["programs"]
    assert p["name"] == "train_step" and p["fits"] is False
    assert p["per_chip_bytes"]["total"] > 16 * 10**9
    assert math.isfinite(p["roofline_s"])


def test_sampler_program_specs_match_the_arguments_of_a_real_call():
    # The aot report compiles the sampler's programs from Sampler.program_specs; they must be laid out
    # exactly as Sampler._run calls them (same pytree, shapes and dtypes), or the report compiles a
    # program the run never executes. Checked against a real generate call of a tiny model on CPU.
    import jax
    import numpy as np

    from envace_jax.models import qwen3
    from envace_jax.sampling import Sampler, SamplingParams

    model = qwen3.init_model(qwen3.Qwen3Config.tiny(64, num_layers=3), seed=0)
    sampler = Sampler(model)
    seen = {}

    def record(name, fn):
        def call(*args, **kwargs):
            seen[name] = (jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), args), kwargs)
            return fn(*args, **kwargs)

        return call

    jitted = sampler._prefill, sampler._decode
    sampler._prefill, sampler._decode = record("prefill", jitted[0]), record("decode", jitted[1])
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12], [13]]
    sampler.generate(prompts, SamplingParams(max_new_tokens=6, stop_token_ids=(0,), seed=1))
    sampler._prefill, sampler._decode = jitted
    dec_args, dec_kw = seen["decode"]
    pre_args, pre_kw = seen["prefill"]
    batch, chunk = pre_args[6].shape
    specs = sampler.program_specs(batch, chunk, pre_kw["size"], dec_kw["budget"], stop_width=dec_args[13].shape[1])
    for name, (args, kwargs) in seen.items():
        fn, spec_args, spec_kwargs = specs[name]
        assert jax.tree.structure(spec_args) == jax.tree.structure(args), name
        shapes = lambda tree: [(tuple(x.shape), np.dtype(x.dtype)) for x in jax.tree.leaves(tree)]
        assert shapes(spec_args) == shapes(args), name
        assert {k: v for k, v in spec_kwargs.items() if k != "gather"} == {
            k: v for k, v in kwargs.items() if k != "gather"
        }, name
        fn.lower(*spec_args, **spec_kwargs)  # and the jitted program accepts them


@needs_libtpu
def test_decode_step_bytes_exclude_the_once_per_call_setup(tmp_path):
    # XLA counts the decode loop's body once, and also what decode does once before the loop (preparing
    # the weights it reads). A step must read every weight once and the live cache a few times (attention
    # reads it, the write updates it); counting the setup into every step read the weights ~4x more.
    proc, rep = _aot(tmp_path, "--programs=decode")
    assert proc.returncode == 0, proc.stderr[-4000:]
    (p,) = rep["programs"]
    V, D, F, L, N, K, H = 1024, 256, 512, 2, 2, 1, 128
    # One host: the sampler reads the training mesh's weights under SAMPLE_RULES (replicated, float32).
    weights = 4 * (2 * V * D + L * (2 * D * N * H + 2 * D * K * H + 3 * D * F) + D + L * (2 * D + 2 * H))
    rows, window = 8, 512  # 2 prompts x 2 rollouts x 2 roles; max_model_len 512
    cache = 4 * L * rows * K * H * window * 2  # float32 k and v of every layer
    assert weights <= p["bytes_accessed"] <= weights + 3 * cache, (p["bytes_accessed"], weights, cache)
    assert p["roofline_s"] >= 64 * p["bytes_accessed"] / CHIPS["v5e"].hbm_bytes_per_s


@needs_libtpu
def test_one_host_topology_of_a_slice():
    from envace_jax.aot.report import host_topology, topology_devices

    # v5e / v6e hosts drive 8 chips (2x4), v5p hosts 4 (2x2x1); a one-host slice needs no other topology.
    assert host_topology("v5e:16x16", topology_devices("v5e:16x16")) == "v5e:2x4"
    assert host_topology("v5p:4x4x4", topology_devices("v5p:4x4x4")) == "v5p:2x2x1"
    assert host_topology("v5e:2x4", topology_devices("v5e:2x4")) is None


@needs_libtpu
def test_sampler_of_a_multi_host_v5e_slice_compiles_on_one_host(tmp_path):
    # v5e:4x4 is 2 hosts of 8 chips. libtpu refuses a program placed on one host's chips of a v5e slice
    # ("device assignment should include all slice devices"), which is what the per-host sampler is:
    # its programs are compiled for a one-host v5e:2x4 slice instead.
    proc, rep = _aot(tmp_path, "--topology=v5e:4x4", "--programs=prefill,decode,train_step")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "2 host(s) x 8 chips" in proc.stdout, proc.stdout
    progs = {p["name"]: p for p in rep["programs"]}
    assert rep["chips"] == 16 and set(progs) == {"prefill", "decode", "train_step"}
    assert all(p["fits"] and p["roofline_s"] > 0 for p in progs.values())
    meshes = {}
    for line in proc.stdout.splitlines():
        cells = line.split()
        if cells and cells[0] in progs:
            meshes[cells[0]] = math.prod(int(x) for x in next(c for c in cells if c.count(",") == 2).split(","))
    assert meshes == {"train_step": 16, "prefill": 8, "decode": 8}, proc.stdout


def test_part_topology_of_a_host():
    from envace_jax.aot.report import part_topology

    assert part_topology("v5p:4x4x4", 1) == "v5p:1x1x1"
    assert part_topology("v5p:4x4x4", 2) == "v5p:2x1x1"
    assert part_topology("v5p:4x4x4", 4) == "v5p:4x1x1"
    assert part_topology("v5e:16x16", 8) == "v5e:4x2"
    with pytest.raises(ValueError, match="rollout_chips_per_host=3"):
        part_topology("v5p:4x4x4", 3)


@needs_libtpu
def test_both_layouts_of_an_asynchronous_run_on_a_v5p_slice(tmp_path):
    """rl.max_staleness = 1 on v5p:2x2x2 (2 hosts x 4 chips): colocated, every program on the chips that
    also hold two rollout weight copies; disaggregated, training on 2 chips of each host (a 4-chip mesh) and
    the sampler on the other 2, which hold the copies."""
    common = ("--topology=v5p:2x2x2", "--programs=train_step,decode", "--config.rl.max_staleness=1")
    proc, rep = _aot(tmp_path, *common)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert rep["layout"] == "colocated: rollouts and training share every chip; rl.max_staleness=1"
    colo = {p["name"]: p for p in rep["programs"]}
    assert "rollout weight copy" in proc.stdout and "x 2 (one per rollout in flight)" in proc.stdout, proc.stdout
    proc, rep = _aot(tmp_path, *common, "--config.mesh.rollout_chips_per_host=2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert rep["layout"].startswith("disaggregated: 4 training chips (2 per host), 4 rollout chips (2 per host)")
    dis = {p["name"]: p for p in rep["programs"]}
    assert all(p["fits"] for p in list(colo.values()) + list(dis.values()))
    meshes = {}
    for line in proc.stdout.splitlines():
        cells = line.split()
        if cells and cells[0] in dis:
            meshes[cells[0]] = math.prod(int(x) for x in next(c for c in cells if c.count(",") == 2).split(","))
    assert meshes == {"train_step": 4, "decode": 2}, proc.stdout
    # the training state is split over half the chips: twice the parameter bytes per chip
    assert dis["train_step"]["per_chip_bytes"]["arguments"] > 1.5 * colo["train_step"]["per_chip_bytes"]["arguments"]


@needs_libtpu
def test_lora_train_step_holds_the_frozen_base_once_and_the_adapters_state(tmp_path):
    """With LoRA the train_step's arguments are the frozen base (once: no moments, no gradient) plus the adapters
    with their moments and gradient sum; full training holds four parameter-sized trees (the hand count above)."""
    proc, low = _aot(tmp_path, "--programs=train_step", "--config.model.lora_rank=8")
    assert proc.returncode == 0, proc.stderr[-4000:]
    V, D, F, L, N, K, H, r = 1024, 256, 512, 2, 2, 1, 128, 8
    split = 2 * V * D + L * (2 * D * N * H + 2 * D * K * H + 3 * D * F)
    whole = D + L * (2 * D + 2 * H)
    base = 4 * (split / 4 + whole)  # float32 bytes of the base on one chip (fsdp 4 splits "embed")
    adapters = 4 * L * r * ((D + N * H) + 2 * (D + K * H) + (N * H + D) + 2 * (D + F) + (F + D))  # unsplit bound
    args_lora = low["programs"][0]["per_chip_bytes"]["arguments"]
    assert base < args_lora < base + 4 * adapters + 6 * 256 * 4 + 1024, (args_lora, base, adapters)
