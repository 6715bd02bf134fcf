"""benchmarks/peers.py without timing anything: the spec the driver writes, the shared reward, the table
maths against hand-computed numbers, and real worker runs of one GRPO iteration at a tiny size (ours
always; Tunix's and TRL's only where `make bench-peers` has created their venvs under .cache/peers/)."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

from benchmarks import peers
from benchmarks.peer_workers import peer_common as pc


def _args(**kw) -> argparse.Namespace:
    base = dict(
        prompts=2,
        group=2,
        prompt_len=8,
        new_tokens=8,
        temperature=1.0,
        lr=1e-4,
        warmup=1,
        iters=1,
        threads=2,
        micro_batch_rows=0,
        seed=3,
    )
    base.update(kw)
    return argparse.Namespace(**base)


def test_specs_of_the_frameworks_differ_only_in_the_framework():
    specs = {fw: peers.make_spec(fw, "demo", "/some/dir", _args()) for fw in peers.FRAMEWORKS}
    for fw, spec in specs.items():
        assert set(pc.SPEC_KEYS) <= set(spec)
        rest = {k: v for k, v in spec.items() if k != "framework"}
        assert rest == {k: v for k, v in specs["ours"].items() if k != "framework"}
        assert spec["framework"] == fw
    spec = specs["ours"]
    assert len(spec["prompts"]) == 2 and all(len(p) == 8 for p in spec["prompts"])
    assert all(0 <= t < peers.SHAPES["demo"]["vocab_size"] for p in spec["prompts"] for t in p)
    assert spec["model"] == peers.SHAPES["demo"] and spec["model_dir"] == "/some/dir"
    # The prompts follow the seed (the same ids for every framework of a run, new ones for another seed).
    assert peers.make_spec("ours", "demo", "d", _args(seed=4))["prompts"] != spec["prompts"]


def test_bad_framework_or_shape_is_named():
    with pytest.raises(ValueError, match="'jaxrl'"):
        peers.make_spec("jaxrl", "demo", "d", _args())
    with pytest.raises(ValueError, match="'huge'"):
        peers.make_spec("ours", "huge", "d", _args())


def test_arms_set_their_own_thread_count():
    assert peers.parse_arm("trl") == ("trl", None) and peers.parse_arm("trl@1") == ("trl", 1)
    assert peers.make_spec("trl", "demo", "d", _args(threads=2), threads=1)["threads"] == 1
    assert peers.make_spec("trl", "demo", "d", _args(threads=2))["threads"] == 2
    with pytest.raises(ValueError, match="positive integer"):
        peers.parse_arm("trl@0")
    with pytest.raises(ValueError, match="'vllm'"):
        peers.parse_arm("vllm@2")
    # Arms are pooled and compared under their own labels.
    pooled = peers.pool([{"framework": "trl", "arm": "trl@1", "iter_s": [3.0], "sample_s": [1.0], "cpu_s": [3.0]}])
    assert list(pooled) == ["trl@1"]


def test_read_spec_names_missing_keys(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text('{"framework": "ours"}')
    with pytest.raises(ValueError, match="model_dir"):
        pc.read_spec(str(path))


def test_reward_is_the_share_of_even_ids():
    assert pc.reward([2, 3, 4, 5]) == 0.5
    assert pc.reward([1, 3, 5]) == 0.0
    assert pc.reward([0, 10]) == 1.0
    assert pc.reward([]) == 0.0
    assert pc.ids_from_text(pc.text_from_ids([7, 0, 2047])) == [7, 0, 2047]


def test_rounds_alternate_the_order():
    assert peers.round_order(["ours", "tunix", "trl"], 0) == ["ours", "tunix", "trl"]
    assert peers.round_order(["ours", "tunix", "trl"], 1) == ["trl", "tunix", "ours"]


def test_table_maths_by_hand():
    results = [
        {"framework": "ours", "iter_s": [1.0, 3.0], "sample_s": [0.5, 1.0], "cpu_s": [2.0, 3.0]},
        {"framework": "trl", "error": "exit 1"},  # a failed run is left out
        {"framework": "trl", "iter_s": [4.0], "sample_s": [3.0], "cpu_s": [4.0]},
        {"framework": "ours", "iter_s": [2.0], "sample_s": [0.6], "cpu_s": [2.0]},
    ]
    pooled = peers.pool(results)
    assert pooled["ours"]["iter_s"] == [1.0, 3.0, 2.0] and pooled["trl"]["iter_s"] == [4.0]
    table = {r["framework"]: r for r in peers.summarize(pooled, rows=32, new_tokens=64)}
    ours, trl = table["ours"], table["trl"]
    assert ours["iter_s"] == 2.0 and ours["sample_s"] == 0.6 and ours["n"] == 3
    assert ours["update_s"] == pytest.approx(1.4)  # median of 0.5, 2.0, 1.4
    assert ours["tok_s"] == 32 * 64 / 2.0 and ours["sample_tok_s"] == pytest.approx(32 * 64 / 0.6)
    assert ours["cores"] == 1.0  # median of 2.0, 1.0, 1.0
    assert ours["vs_ours"] == 1.0
    assert trl["vs_ours"] == 2.0 and trl["vs_ours_sampling"] == pytest.approx(5.0)
    md = peers.markdown("demo", list(table.values()), 32, 32, 64)
    assert "| trl | 4.000 | 3.000 | 1.000 | 512 | 683 | 2.00x | 5.00x | 1.00 | 1 |" in md
    assert "ours-defaults" not in md and trl["vs_defaults"] is None
    # With the arm of the public classes' defaults, a column against it too.
    pooled["ours-defaults"] = {"iter_s": [0.5], "sample_s": [0.25], "cpu_s": [0.5]}
    table = {r["framework"]: r for r in peers.summarize(pooled, rows=32, new_tokens=64)}
    assert table["trl"]["vs_defaults"] == 8.0 and table["ours"]["vs_defaults"] == 4.0
    md = peers.markdown("demo", list(table.values()), 32, 32, 64)
    assert "| trl | 4.000 | 3.000 | 1.000 | 512 | 683 | 2.00x | 5.00x | 8.00x | 1.00 | 1 |" in md
    assert "| ours-defaults | 0.500 | 0.250 | 0.250 | 4096 | 8192 | 0.25x | 0.42x | 1.00x | 1.00 | 1 |" in md
    # Without our row there is nothing to compare with.
    alone = peers.summarize({"trl": pooled["trl"]}, rows=32, new_tokens=64)
    assert alone[0]["vs_ours"] is None and "| - | - |" in peers.markdown("demo", alone, 32, 32, 64)


@pytest.fixture(scope="module")
def demo_checkpoint(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("peers") / "hf")
    peers.write_checkpoint("demo", out, seed=0)
    return out


def _check_result(res, spec):
    assert "error" not in res, res.get("error")
    assert res["framework"] == spec["framework"] and res["rows"] == 4 and res["new_tokens"] == 8
    assert len(res["iter_s"]) == 1 and len(res["warmup_s"]) == 1
    assert 0 < res["sample_s"][0] < res["iter_s"][0]
    assert len(res["mean_reward"]) == 2 and all(0.0 <= r <= 1.0 for r in res["mean_reward"])


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["ours", "ours-defaults"])
def test_our_worker_runs_one_grpo_iteration(framework, demo_checkpoint):
    spec = peers.make_spec(framework, "demo", demo_checkpoint, _args())
    _check_result(peers.run_worker(framework, sys.executable, spec, timeout=600), spec)


def test_a_failing_worker_reports_its_error(tmp_path):
    spec = peers.make_spec("ours", "demo", str(tmp_path / "no_such_checkpoint"), _args())
    res = peers.run_worker("ours", sys.executable, spec, timeout=600)
    assert res["error"].startswith("exit 1") and "no_such_checkpoint" in res["error"]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["tunix", "trl"])
def test_peer_worker_runs_one_grpo_iteration(framework, demo_checkpoint):
    python = peers.DEFAULT_PYTHON[framework]
    if not os.access(python, os.X_OK):
        pytest.skip(f"{framework}'s venv is absent ({python}); `make bench-peers` creates it")
    spec = peers.make_spec(framework, "demo", demo_checkpoint, _args())
    _check_result(peers.run_worker(framework, python, spec, timeout=900), spec)
