"""Orbax checkpoints: bit-exact round trip, keep-N, async completion, corrupt-latest fallback."""

from __future__ import annotations

import functools
import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from envace_jax.checkpoint import MANIFEST, Checkpointer, abstract_target, check_manifest
from envace_jax.data.pipeline import PipelineConfig, PromptIterator, take


def tiny_params(seed: int) -> nnx.State:
    """An nnx.State of Params shaped like a two-layer MLP (float32 and bfloat16 leaves).

    Built from numpy rather than by initialising nnx.Linear: eager initialisers cost seconds
    on a loaded 2-core box, and the checkpoint does not care where the values came from.
    """
    r = np.random.default_rng(seed)
    return nnx.State(
        {
            "a": {
                "kernel": nnx.Param(jnp.asarray(r.normal(size=(6, 5)), jnp.float32)),
                "bias": nnx.Param(jnp.asarray(r.normal(size=(5,)), jnp.float32)),
            },
            "b": {"kernel": nnx.Param(jnp.asarray(r.normal(size=(5, 3)), jnp.bfloat16))},
        }
    )


@functools.lru_cache(maxsize=None)
def _trained(seed: int, updates: int):
    params = tiny_params(seed)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))

    def loss(p):  # any smooth function of every leaf gives non-trivial Adam moments
        return sum(jnp.sum(jnp.sin(3.0 * leaf.astype(jnp.float32)) ** 2) for leaf in jax.tree.leaves(p))

    @jax.jit  # one compile instead of dozens of eager dispatches (the CI box is small and shared)
    def run(params):
        opt = tx.init(params)
        for _ in range(updates):
            upd, opt = tx.update(jax.grad(loss)(params), opt, params)
            params = optax.apply_updates(params, upd)
        return params, opt

    return run(params)


def train_state(seed: int = 0, updates: int = 2):
    """Params, AdamW state after a few real updates, python int step, typed key and raw key data."""
    params, opt = _trained(seed, updates)
    return {
        "params": params,
        "opt_state": opt,
        "step": 17,
        "rng": jax.random.key(seed + 5),
        "rng_data": jax.random.key_data(jax.random.key(seed + 9)),
        "lr": 0.25,
    }


def assert_bit_equal(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            assert jax.dtypes.issubdtype(y.dtype, jax.dtypes.prng_key)
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        assert type(x) is type(y) or (isinstance(x, jax.Array) and isinstance(y, jax.Array))
        xa, ya = np.asarray(x), np.asarray(y)
        assert xa.dtype == ya.dtype and xa.shape == ya.shape
        assert xa.tobytes() == ya.tobytes()


def test_round_trip_bit_exact_with_iterator_state(tmp_path):
    state = train_state()
    it = PromptIterator(
        list(range(30)),
        PipelineConfig(batch_size=4, seed=1, shard_index=0, shard_count=1, num_epochs=None),
        decode=None,
    )
    take(it, 5)
    with Checkpointer(tmp_path / "ck") as ck:
        assert ck.save(17, state, it.get_state())
    want_next = take(it, 3)

    ck = Checkpointer(tmp_path / "ck")  # a fresh manager, as after a restart
    res = ck.restore_latest_good(abstract_target(train_state(seed=3)))  # same structure, other values
    assert res.step == 17 and res.skipped == []
    assert_bit_equal(res.state, state)
    assert isinstance(res.state["step"], int) and isinstance(res.state["lr"], float)
    assert res.state["params"]["b"]["kernel"].dtype == jnp.bfloat16
    fresh = PromptIterator(list(range(30)), it.cfg, decode=None)
    fresh.set_state(json.loads(json.dumps(res.data_state)))
    assert take(fresh, 3) == want_next
    ck.close()


def test_keep_n_and_manifests(tmp_path):
    state = train_state(updates=0)
    with Checkpointer(tmp_path, max_to_keep=2) as ck:
        for step in range(1, 6):
            state["step"] = step
            ck.save(step, state, {"i": step})
        ck.wait()
        assert ck.all_steps() == [4, 5]
    assert sorted(p for p in os.listdir(tmp_path) if p.isdigit()) == ["4", "5"]
    for s in ("4", "5"):
        assert check_manifest(tmp_path / s) is None
    ck = Checkpointer(tmp_path, max_to_keep=2)
    res = ck.restore_latest_good(state)
    assert res.step == 5 and res.state["step"] == 5 and res.data_state == {"i": 5}
    ck.close()


def test_interval_force_and_duplicate_step(tmp_path):
    state = train_state(updates=0)
    with Checkpointer(tmp_path, save_interval_steps=3) as ck:
        saved = [s for s in range(1, 8) if ck.maybe_save(s, state)]
        assert saved == [3, 6]
        assert ck.maybe_save(7, state, force=True)  # preempted mid-interval: save anyway
        assert not ck.maybe_save(7, state, force=True)  # already there: no error, no rewrite
        assert ck.all_steps() == [3, 6, 7]


def test_async_save_completes_and_is_readable_by_a_new_manager(tmp_path):
    state = train_state()
    ck = Checkpointer(tmp_path, async_save=True)
    ck.save(1, state)
    state2 = jax.tree.map(lambda x: x, state)
    state2["step"] = 2
    ck.save(2, state2)  # waits for step 1's write, then writes its manifest
    assert check_manifest(tmp_path / "1") is None
    ck.close()  # waits for step 2 and its manifest
    assert check_manifest(tmp_path / "2") is None
    other = Checkpointer(tmp_path)
    got, _ = other.restore(2, state)
    assert_bit_equal(got, state2)
    other.close()


def _largest_file(step_dir):
    files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs if f != MANIFEST]
    return max(files, key=os.path.getsize)


def _truncate(step_dir):
    p = _largest_file(step_dir)
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) // 2)
    return os.path.relpath(p, step_dir)


def _delete(step_dir):
    p = _largest_file(step_dir)
    os.remove(p)
    return os.path.relpath(p, step_dir)


def _drop_manifest(step_dir):
    os.remove(os.path.join(step_dir, MANIFEST))
    return MANIFEST


@pytest.mark.parametrize(
    "damage,reason",
    [
        (_truncate, r"has \d+ bytes, expected \d+"),
        (_delete, "is missing"),
        (_drop_manifest, "the save never completed"),
    ],
)
def test_corrupt_latest_falls_back_with_clear_message(tmp_path, caplog, damage, reason):
    states = {}
    with Checkpointer(tmp_path) as ck:
        for step in (1, 2, 3):
            states[step] = train_state(seed=step)
            ck.save(step, states[step], {"at": step})
    hurt = damage(str(tmp_path / "3"))
    ck = Checkpointer(tmp_path)
    with caplog.at_level(logging.WARNING, logger="envace_jax.checkpoint"):
        res = ck.restore_latest_good(train_state())
    assert res.step == 2 and res.data_state == {"at": 2}
    assert_bit_equal(res.state, states[2])
    assert res.skipped[0][0] == 3
    msg = caplog.text
    assert "checkpoint step 3" in msg and "corrupt or partial" in msg and "falling back to step 2" in msg
    import re

    assert re.search(reason, msg), msg
    if hurt != MANIFEST:
        assert hurt in msg
    # The bad step is moved aside, so training can save step 3 again.
    assert os.path.isdir(tmp_path / "3.corrupt") and ck.all_steps() == [1, 2]
    assert ck.save(3, states[3])
    ck.close()
    assert Checkpointer(tmp_path).restore_latest_good(train_state()).step == 3


def test_same_size_corruption_caught_by_hashes_and_no_good_step_raises(tmp_path, caplog):
    state = train_state()
    with Checkpointer(tmp_path, hash_files=True) as ck:
        ck.save(1, state)
    p = _largest_file(str(tmp_path / "1"))
    data = bytearray(open(p, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(p, "wb").write(bytes(data))
    ck = Checkpointer(tmp_path)
    with caplog.at_level(logging.WARNING, logger="envace_jax.checkpoint"):
        with pytest.raises(RuntimeError, match=r"no usable checkpoint .*step 1: file .* has the wrong sha256"):
            ck.restore_latest_good(state)
    assert "no earlier step to fall back to" in caplog.text
    assert ck.all_steps() == [1]  # nothing moved aside without a good step to fall back to
    ck.close()


def test_wrong_target_raises_instead_of_discarding_checkpoints(tmp_path):
    with Checkpointer(tmp_path) as ck:
        ck.save(1, train_state())
        ck.save(2, train_state(seed=1))
    wrong = train_state()
    p = wrong["params"]  # a fresh State: the cached one must stay intact for other tests
    wrong["params"] = nnx.State(
        {"a": {"kernel": nnx.Param(jnp.zeros((7, 5), jnp.float32)), "bias": p["a"]["bias"]}, "b": p["b"]}
    )
    ck = Checkpointer(tmp_path)
    with pytest.raises(RuntimeError, match=r"step 2: restore failed.*step 1: restore failed"):
        ck.restore_latest_good(wrong)
    assert ck.all_steps() == [1, 2]
    # The mismatch is found in the step's metadata, before any array is read, and names the array.
    with pytest.raises(ValueError, match=r"Requested shape: \(7, 5\).*stored shape: \((\d+, )*\d+\).*'a'.*'kernel'"):
        ck.restore(2, wrong)
    assert Checkpointer(tmp_path).restore_latest_good(train_state()).step == 2


def test_empty_directory_is_a_fresh_start(tmp_path):
    with Checkpointer(tmp_path / "none") as ck:
        assert ck.restore_latest_good(train_state()) is None and ck.latest_step() is None


def test_bad_options_named():
    with pytest.raises(ValueError, match="max_to_keep"):
        Checkpointer("/tmp/unused_ck_dir_h6", max_to_keep=0)
    with pytest.raises(ValueError, match="save_interval_steps"):
        Checkpointer("/tmp/unused_ck_dir_h6", save_interval_steps=0)
    with pytest.raises(TypeError, match="leaf of type str"):
        abstract_target({"a": "text"})


def test_unfinished_orbax_write_is_cleared_on_start(tmp_path):
    with Checkpointer(tmp_path) as ck:
        ck.save(1, {"a": np.ones(3, np.float32)})
    # What a SIGKILL during the async write of step 2 leaves behind.
    os.makedirs(tmp_path / "2.orbax-checkpoint-tmp-1700000000" / "state")
    with Checkpointer(tmp_path) as ck:
        assert sorted(os.listdir(tmp_path)) == ["1"]
        assert ck.restore_latest_good({"a": np.zeros(3, np.float32)}).step == 1
        assert ck.save(2, {"a": np.ones(3, np.float32)})
