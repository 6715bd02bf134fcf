"""Eval configs are read into typed dataclasses: the files and a partial dict get the same defaults, and a
misspelt or mistyped field is an error that names it (it used to be read with an untyped lookup whose
fallbacks disagreed with configs/eval_common.py, e.g. 512 vs 1024 new tokens)."""

from __future__ import annotations

import dataclasses

import pytest

from envace_jax.config import ConfigError
from envace_jax.eval.config import EvalConfig, load_eval_config
from tests.helpers_eval import load_config

FILES = [
    "eval_bfcl.py",
    "eval_bfcl_tiny.py",
    "eval_demo.py",
    "eval_fidelity.py",
    "eval_rehearsal_sweep.py",
    "eval_tau2.py",
    "eval_tau2_tiny.py",
]


@pytest.mark.parametrize("name", FILES)
def test_every_eval_config_file_loads_with_its_values(name):
    written = load_config(name)
    cfg = load_eval_config(written)
    assert (cfg.suite, cfg.policy, cfg.max_model_len) == (written.suite, written.policy, written.max_model_len)
    assert cfg.sampling.max_new_tokens == written.sampling.max_new_tokens
    assert ",".join(cfg.bfcl.categories) == written.bfcl.categories
    assert ",".join(str(n) for n in cfg.rehearsal.sweep_ns) == written.rehearsal.sweep_ns


def test_a_partial_config_gets_the_files_defaults():
    common = load_config("eval_demo.py")
    partial = load_eval_config(
        {"suite": "demo", "sampling": {"max_new_tokens": 256}, "max_model_len": 4096, "demo": dict(common.demo)}
    )
    assert partial == load_eval_config(common)
    assert load_eval_config({"suite": "bfcl"}).sampling == dataclasses.replace(EvalConfig().sampling)
    assert (
        load_eval_config({"suite": "bfcl"}).sampling.max_new_tokens
        == load_config("eval_bfcl.py").sampling.max_new_tokens
    )


@pytest.mark.parametrize(
    "override,needle",
    [
        ({"sampling": {"temprature": 1.0}}, r"config\.sampling has unknown field\(s\) \['temprature'\]"),
        ({"sampling": {"temperature": "hot"}}, r"config\.sampling\.temperature must be a number"),
        ({"sampling": {"top_p": 0.0}}, r"config\.sampling\.top_p must be in \(0, 1\], got 0\.0"),
        ({"sampler": {"batch_buckets": "8,x"}}, r"config\.sampler\.batch_buckets must be comma-separated ints"),
        ({"bfcl": {"categories": "multi_turn_nope"}}, r"config\.bfcl\.categories: unsupported category"),
        ({"rehearsal": {"mode": "dreamy"}}, r"config\.rehearsal: rehearsal\.mode='dreamy'"),
        ({"suite": "mmlu"}, r"config\.suite='mmlu'"),
    ],
)
def test_bad_fields_are_named(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_eval_config(dict({"suite": "bfcl"}, **override))
