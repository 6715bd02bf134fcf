"""Sharded parameters and forward passes: 8 fake CPU devices, and 2 processes on localhost."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from envace_jax.models import hf_io
from tests.helpers_models import jit_forward, torch_forward

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script: str, *args: str, devices: int, timeout: int = 600) -> subprocess.Popen:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
    }
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen, timeout: int = 600) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"subprocess timed out:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-6000:]
    return out


# Hand-written expectations for the tiny config below (vocab 256, hidden 64, 4 heads, 2 kv heads,
# head_dim 24, mlp 96) on a (data=2, fsdp=2, tensor=2) mesh: every dimension divides its mesh axes,
# so nothing is dropped. SAMPLE_RULES replicate the `embed` dimension over fsdp.
EIGHT_DEVICE_SCRIPT = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from envace_jax import sharding as shd
from envace_jax.models import hf_io, qwen3

path, out_dir = sys.argv[1], sys.argv[2]
assert jax.device_count() == 8, jax.devices()
T, F = "tensor", "fsdp"
TRAIN = {
    "embed/embedding": P(T, F), "norm/scale": P(), "lm_head": P(F, T),
    "layers/q_proj": P(None, F, T, None), "layers/k_proj": P(None, F, T, None),
    "layers/v_proj": P(None, F, T, None), "layers/o_proj": P(None, T, None, F),
    "layers/gate_proj": P(None, F, T), "layers/up_proj": P(None, F, T), "layers/down_proj": P(None, T, F),
    "layers/input_norm": P(), "layers/post_norm": P(), "layers/q_norm": P(), "layers/k_norm": P(),
}
SAMPLE = {k: P(*[None if a == F else a for a in spec]) for k, spec in TRAIN.items()}

def params(model):
    from flax import nnx
    return {"/".join(map(str, p)): v[...] for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}

def check_specs(model, mesh, expected, what):
    got = params(model)
    assert set(got) == set(expected), (what, sorted(got))
    for name, spec in expected.items():
        arr = got[name]
        want = NamedSharding(mesh, spec)
        assert arr.sharding.is_equivalent_to(want, arr.ndim), (what, name, arr.sharding.spec, spec)
        # Really split: each device holds shape / (product of the mesh axes named per dimension).
        div = [1 if s is None else mesh.shape[s] for s in tuple(spec) + (None,) * (arr.ndim - len(spec))]
        shard = tuple(d // k for d, k in zip(arr.shape, div))
        assert all(s.data.shape == shard for s in arr.addressable_shards), (what, name, shard)

def forward(model, ids):
    from flax import nnx
    g, st = nnx.split(model)
    return jax.jit(lambda st, x: nnx.merge(g, st)(x))(st, ids)

ids_host = np.random.RandomState(0).randint(3, 256, (4, 8)).astype(np.int32)
ref = np.asarray(forward(hf_io.load_hf(path), jnp.asarray(ids_host)))
mesh = shd.make_mesh(data=2, fsdp=2, tensor=2)
ids = jax.device_put(ids_host, NamedSharding(mesh, P(("data", "fsdp"))))
for what, rules, expected in (("train", shd.TRAIN_RULES, TRAIN), ("sample", shd.SAMPLE_RULES, SAMPLE)):
    model = hf_io.load_hf(path, mesh=mesh, rules=rules)
    check_specs(model, mesh, expected, what)
    logits = forward(model, ids)
    diff = float(np.abs(np.asarray(logits) - ref).max())
    assert diff <= 1e-5, (what, diff)
    print(what, "max diff", diff)
    # qwen3.place reshards a single-device model to the same layout.
    placed = qwen3.place(hf_io.load_hf(path), mesh, rules)
    check_specs(placed, mesh, expected, what + "/place")
# Random init straight into the shardings gives the same layout.
check_specs(qwen3.init_model(model.config, mesh=mesh), mesh, TRAIN, "init_model")
# A dimension the mesh axis does not divide is replicated instead (1 kv head on tensor=2).
one_kv = qwen3.Qwen3Config.from_hf(path, num_heads=4, num_kv_heads=1)
from flax import nnx
abstract = nnx.eval_shape(lambda: qwen3.Qwen3(one_kv))
sh = qwen3.param_shardings(abstract, mesh, shd.TRAIN_RULES)
assert sh["layers"]["k_proj"].spec == P(None, F, None, None), sh["layers"]["k_proj"].spec
# Export from the sharded model gathers each param back.
hf_io.save_hf(model, out_dir)
print("ok")
"""


def test_sharded_forward_on_8_devices_matches_single_device(tiny_hf_qwen3, tmp_path):
    path, _ = tiny_hf_qwen3(num_heads=4, num_kv_heads=2, head_dim=24)
    out = _finish(_run(EIGHT_DEVICE_SCRIPT, path, str(tmp_path / "export"), devices=8))
    assert "train max diff" in out and "sample max diff" in out and out.rstrip().endswith("ok")
    orig = load_file(os.path.join(path, "model.safetensors"))
    exported = load_file(tmp_path / "export" / "model.safetensors")
    assert set(orig) == set(exported)
    for k in orig:
        np.testing.assert_array_equal(exported[k], orig[k], err_msg=k)


TWO_PROCESS_SCRIPT = r"""
import sys
import jax, numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

pid, port, path, out_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                           initialization_timeout=120)
from envace_jax import sharding as shd
from envace_jax.models import hf_io
from flax import nnx

assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
mesh = shd.make_mesh(data=1, fsdp=2, tensor=2)
model = hf_io.load_hf(path, mesh=mesh)
q = model.layers.q_proj[...]
assert not q.is_fully_addressable  # spans both processes
assert q.sharding.spec == P(None, "fsdp", "tensor", None), q.sharding.spec
assert len(q.addressable_shards) == 2 and q.addressable_shards[0].data.shape == (2, 32, 2, 24)
ids_host = np.random.RandomState(0).randint(3, 256, (4, 8)).astype(np.int32)
ids = jax.make_array_from_callback(ids_host.shape, NamedSharding(mesh, P(("data", "fsdp"))),
                                   lambda idx: ids_host[idx])
g, st = nnx.split(model)
logits = jax.jit(lambda st, x: nnx.merge(g, st)(x))(st, ids)
full = np.asarray(multihost_utils.process_allgather(logits, tiled=True))
assert full.shape == (4, 8, 256), full.shape
hf_io.save_hf(model, out_dir)  # collective gather; process 0 writes
if pid == 0:
    np.save(out_dir + "_logits.npy", full)
multihost_utils.sync_global_devices("done")
print("process", pid, "ok")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_localhost_load_and_forward(tiny_hf_qwen3, tmp_path):
    path, tm = tiny_hf_qwen3(num_heads=4, num_kv_heads=2, head_dim=24)
    port, out_dir = str(_free_port()), str(tmp_path / "export")
    procs = [_run(TWO_PROCESS_SCRIPT, str(i), port, path, out_dir, devices=2) for i in range(2)]
    outs = [_finish(p) for p in procs]
    assert "process 0 ok" in outs[0] and "process 1 ok" in outs[1]
    got = np.load(out_dir + "_logits.npy")
    ids = np.random.RandomState(0).randint(3, 256, (4, 8)).astype(np.int32)
    ref = np.asarray(jit_forward(hf_io.load_hf(path))(jnp.asarray(ids)))
    assert np.abs(got - ref).max() <= 1e-5
    assert np.abs(got - torch_forward(tm, ids.astype(np.int64))[0]).max() <= 1e-4
    orig = load_file(os.path.join(path, "model.safetensors"))
    exported = load_file(os.path.join(out_dir, "model.safetensors"))
    assert set(orig) == set(exported)
    for k in orig:
        np.testing.assert_array_equal(exported[k], orig[k], err_msg=k)
