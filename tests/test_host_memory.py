"""envace_jax.host_memory: the re-executed process gets glibc's keep-freed-memory settings exactly once,
keeps its interpreter options and arguments, and then stops faulting a repeated step's buffer in afresh
(the kernel's own page-fault counter is the truth), with the same computed values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from envace_jax import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(not host_memory.applies(), reason="glibc settings: Linux with glibc only")

_REPORT = textwrap.dedent("""
    import json, os, sys
    from envace_jax import host_memory
    print("start", flush=True)
    host_memory.retain_freed_memory()
    print(json.dumps({"env": {k: os.environ.get(k) for k in [*host_memory.RETAIN_ENV, "ENVACE_GLIBC_HEAP"]},
                      "argv": sys.argv[1:], "optimize": sys.flags.optimize,
                      "retaining": host_memory.retaining()}))
""")


def _run(script: str, *args: str, env: dict | None = None) -> tuple[list[str], dict]:
    base = {k: v for k, v in os.environ.items() if k not in host_memory.RETAIN_ENV and k != "ENVACE_GLIBC_HEAP"}
    # This checkout's package first (the re-executed process inherits the environment, so it imports the same).
    base["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-O", "-c", script, *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    return out, json.loads(out[-1])


def test_reexecutes_once_with_the_settings_and_the_same_command_line():
    lines, rep = _run(_REPORT, "a", "--b=1")
    assert lines.count("start") == 2  # the original process, then the re-executed one, which does not loop
    assert rep["env"] == {**host_memory.RETAIN_ENV, "ENVACE_GLIBC_HEAP": "retained"}
    assert rep["argv"] == ["a", "--b=1"] and rep["optimize"] == 1 and rep["retaining"]


def test_opt_out_and_user_values_are_respected():
    lines, rep = _run(_REPORT, env={"ENVACE_GLIBC_HEAP": "default"})
    assert lines.count("start") == 1 and not rep["retaining"]
    assert all(rep["env"][k] is None for k in host_memory.RETAIN_ENV)
    # A value the user chose stays; the missing ones are added.
    _, rep = _run(_REPORT, env={"MALLOC_ARENA_MAX": "4"})
    assert rep["env"]["MALLOC_ARENA_MAX"] == "4"
    assert rep["env"]["MALLOC_MMAP_THRESHOLD_"] == host_memory.RETAIN_ENV["MALLOC_MMAP_THRESHOLD_"]


_FAULTS = textwrap.dedent("""
    import hashlib, json, os, sys
    from envace_jax import host_memory
    if sys.argv[1] == "retain":
        host_memory.retain_freed_memory()
    import jax, jax.numpy as jnp
    import numpy as np

    @jax.jit
    def step(x):  # an [N, N] product that must be materialised: a {mb} MB temporary per call
        a = x @ x.T
        return jnp.tanh(a) @ x

    x = jnp.asarray(np.random.RandomState(0).standard_normal(({n}, 64)).astype(np.float32) / 8)
    for _ in range(5):
        y = step(x).block_until_ready()
    def minflt():
        return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])
    faults = []
    for _ in range(15):  # the heap may still grow once or twice; the median call shows the steady state
        f0 = minflt()
        y = step(x).block_until_ready()
        faults.append(minflt() - f0)
    print(json.dumps({{"faults": sorted(faults)[7], "retaining": host_memory.retaining(),
                      "digest": hashlib.sha256(np.asarray(y).tobytes()).hexdigest()}}))
""")


def test_a_repeated_step_stops_faulting_its_buffer_in_and_computes_the_same():
    n = 4096
    mb = n * n * 4 // 2**20
    script = _FAULTS.format(n=n, mb=mb)
    _, plain = _run(script, "plain")
    _, kept = _run(script, "retain")
    assert kept["retaining"] and not plain["retaining"]
    pages = n * n * 4 // 4096  # one [N, N] float32 temporary per call; "faults": the median call's
    if plain["faults"] < pages // 4:
        pytest.skip(
            f"glibc defaults faulted only {plain['faults']} pages for {pages} of buffers "
            "per call (huge pages or a larger default threshold here): nothing to compare"
        )
    assert kept["faults"] < plain["faults"] // 8, (plain, kept)
    assert kept["digest"] == plain["digest"]
