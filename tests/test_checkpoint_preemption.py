"""SIGTERM -> checkpoint -> clean exit, in a real subprocess; restore into new shardings on 8 CPU devices."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np

from envace_jax.checkpoint import Checkpointer, PreemptionGuard
from envace_jax.data.pipeline import PipelineConfig, PromptIterator, take

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOOP = textwrap.dedent("""
    import json, sys, time
    import jax.numpy as jnp
    from envace_jax.checkpoint import Checkpointer, PreemptionGuard
    from envace_jax.data.pipeline import PipelineConfig, PromptIterator

    ck = Checkpointer(sys.argv[1], save_interval_steps=1000, max_to_keep=2)
    it = PromptIterator(list(range(50)), PipelineConfig(batch_size=2, seed=4, num_epochs=None,
                                                        shard_index=0, shard_count=1), decode=None)
    state = {"w": jnp.zeros(3), "step": 0}
    with PreemptionGuard() as guard:
        for step in range(1, 100000):
            batch = next(it)
            state = {"w": state["w"] * 0.5 + jnp.asarray(batch + [step], jnp.float32), "step": step}
            stop = guard.check()
            ck.maybe_save(step, state, it.get_state(), force=stop)
            if stop:
                ck.close()
                print(json.dumps({"saved_step": step, "signal": guard.signal_received}), flush=True)
                sys.exit(0)
            if step == 3:
                print("READY", flush=True)
            time.sleep(0.01)
    sys.exit(3)
""")


def _env(**extra):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra)
    return env


def test_sigterm_saves_a_checkpoint_and_exits_zero(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    ckdir = tmp_path / "ck"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(ckdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == "READY", (line, proc.stderr.read() if proc.poll() is not None else "")
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["signal"] == signal.SIGTERM
    step = report["saved_step"]
    assert step >= 3

    # Replay the same loop here: the checkpoint must hold exactly the state after `step` steps,
    # and the iterator state must continue with the batch the loop would have drawn next.
    cfg = PipelineConfig(batch_size=2, seed=4, num_epochs=None, shard_index=0, shard_count=1)
    it = PromptIterator(list(range(50)), cfg, decode=None)
    w = np.zeros(3, np.float32)
    for s in range(1, step + 1):
        w = w * np.float32(0.5) + np.asarray(next(it) + [s], np.float32)
    ck = Checkpointer(ckdir)
    assert ck.all_steps() == [step]
    res = ck.restore_latest_good({"w": np.zeros(3, np.float32), "step": 0})
    assert res.step == step and res.state["step"] == step
    np.testing.assert_array_equal(np.asarray(res.state["w"]), w)
    resumed = PromptIterator(list(range(50)), cfg, decode=None)
    resumed.set_state(res.data_state)
    assert take(resumed, 2) == take(it, 2)
    ck.close()


def test_guard_restores_previous_handler():
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionGuard() as guard:
        assert signal.getsignal(signal.SIGTERM) != before
        assert not guard.check()
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.preempted and guard.check() and guard.signal_received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before


SHARDED = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from envace_jax.checkpoint import Checkpointer
    assert jax.device_count() == 8
    src_mesh = jax.make_mesh((8,), ("x",))
    w = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
    state = {"w": jax.device_put(w, NamedSharding(src_mesh, P("x", None))),
             "b": jax.device_put(np.arange(4, dtype=np.int32), NamedSharding(src_mesh, P())), "step": 5}
    with Checkpointer(sys.argv[1]) as ck:
        ck.save(5, state)
    # Restore onto a different mesh and layout, as a resumed job with a new topology would.
    mesh = jax.make_mesh((2, 4), ("data", "fsdp"))
    want_w, want_b = NamedSharding(mesh, P(None, "fsdp")), NamedSharding(mesh, P("data"))
    target = {"w": jax.ShapeDtypeStruct((8, 12), jnp.float32, sharding=want_w),
              "b": jax.ShapeDtypeStruct((4,), jnp.int32, sharding=want_b), "step": 0}
    res = Checkpointer(sys.argv[1]).restore_latest_good(target)
    assert res.state["w"].sharding == want_w, res.state["w"].sharding
    assert res.state["b"].sharding == want_b, res.state["b"].sharding
    assert res.state["w"].addressable_shards[0].data.shape == (8, 3)
    np.testing.assert_array_equal(np.asarray(res.state["w"]), w)
    np.testing.assert_array_equal(np.asarray(res.state["b"]), np.arange(4))
    assert res.state["step"] == 5
    print("OK")
""")


def test_restore_into_target_shardings_on_8_devices(tmp_path):
    script = tmp_path / "sharded.py"
    script.write_text(SHARDED)
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ck")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=8"),
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stderr[-3000:]
