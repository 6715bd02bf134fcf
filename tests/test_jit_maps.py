"""Dropping compiled programs when the process nears vm.max_map_count returns their memory mappings, and a
program in use still runs (compiled again)."""

from __future__ import annotations

import gc
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envace_jax import jit_maps

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")


def _compile_shapes(f, n: int) -> None:
    for k in range(1, n + 1):
        f(jnp.ones((k, 8))).block_until_ready()


def test_release_returns_the_mappings_of_compiled_programs(monkeypatch):
    # Programs left by earlier tests in this process are dropped first: otherwise a garbage collection during
    # the compiles below can free theirs and the count falls while this test's programs are added (seen in CI).
    jax.clear_caches()
    gc.collect()
    f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(0) * 3.0 - 1.0)
    before = jit_maps.map_count()
    _compile_shapes(f, 60)
    grown = jit_maps.map_count()
    assert grown - before > 60  # several mappings per compiled program
    said = []
    monkeypatch.setattr(jit_maps, "_last_check", [float("-inf")])
    # a limit the process is already past 75% of
    monkeypatch.setattr(jit_maps, "map_limit", lambda: int(grown / 0.9))
    assert jit_maps.release_if_near_limit(fraction=0.75, interval_s=0.0, log=said.append)
    after = jit_maps.map_count()
    assert grown - after > (grown - before) // 2, (before, grown, after)
    assert len(said) == 1 and "vm.max_map_count" in said[0]
    # the jitted function still computes (compiled again)
    x = np.arange(24, dtype=np.float32).reshape(3, 8) / 10
    np.testing.assert_allclose(f(jnp.asarray(x)), np.tanh(x @ x.T).sum(0) * 3.0 - 1.0, rtol=1e-5)


def test_nothing_is_dropped_below_the_threshold_or_between_checks(monkeypatch):
    monkeypatch.setattr(jit_maps, "_last_check", [float("-inf")])
    monkeypatch.setattr(jit_maps, "map_limit", lambda: 10 * jit_maps.map_count())
    assert not jit_maps.release_if_near_limit(fraction=0.75, interval_s=0.0, log=pytest.fail)
    # past the threshold, but checked a moment ago: not read again before interval_s
    monkeypatch.setattr(jit_maps, "map_limit", lambda: 1)
    assert not jit_maps.release_if_near_limit(fraction=0.75, interval_s=3600.0, log=pytest.fail)
    assert jit_maps.map_limit() == 1 and jit_maps.map_count() > 0
