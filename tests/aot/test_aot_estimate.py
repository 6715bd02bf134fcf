"""The RL step estimate from compiled rooflines (envace_jax.aot.estimate), on a hand-made report."""

from __future__ import annotations

import dataclasses

import pytest

from envace_jax.aot.analyze import ProgramReport
from envace_jax.aot.chips import CHIPS
from envace_jax.aot.estimate import StepAssumptions, estimate_step, format_estimate
from envace_jax.aot.plan import RunShapes
from envace_jax.aot.report import Report


def _prog(name: str, roofline: float, steps: int = 1, setup: float = 0.0, fits: bool = True) -> ProgramReport:
    return ProgramReport(name, "", {}, {}, 0, "", fits, 0.0, 0.0, {}, roofline, steps, setup)


def _report(**over) -> Report:
    progs = {
        "train_step": _prog("train_step", 10.0),
        "logprobs": _prog("logprobs", 2.0),
        "prefill": _prog("prefill", 0.5),
        "decode": _prog("decode", 0.01 + 1000 * 0.002, steps=1000, setup=0.01),
    }
    progs.update(over)
    shapes = RunShapes(
        processes=16,
        chips_per_process=4,
        train_rows=64,
        train_width=20000,
        sample_batch=8,
        sample_rows=8,
        prefill_chunk=512,
        cache_window=20480,
        decode_budget=1000,
    )
    return Report("v5p:4x4x4", 64, CHIPS["v5p"], shapes, list(progs.values()))


def test_estimate_by_hand():
    a = StepAssumptions(
        prompts=16, rollouts=4, generations=10, generated_tokens=800, prompt_tokens=1500, row_tokens=8000
    )
    est = estimate_step(_report(), a)
    # decode: 10 calls x (setup 0.01 s + 800 steps x 0.002 s); prefill: 10 calls x ceil(1500 / 512) = 3 chunks x 0.5 s
    assert est["decode"] == pytest.approx(10 * (0.01 + 800 * 0.002))
    assert est["prefill"] == pytest.approx(10 * 3 * 0.5)
    # 640 rows x 8000 tokens = 4 compiled micro-batches of 64 x 20000 tokens
    assert est["old_logprobs"] == pytest.approx(4 * 2.0) and est["update"] == pytest.approx(4 * 10.0)
    assert est["total"] == pytest.approx(16.1 + 15.0 + 8.0 + 40.0)
    text = format_estimate(est, a, "v5p:4x4x4")
    assert "79 s" in text and "640 training rows of 8000 tokens" in text


def test_estimate_refuses_what_it_cannot_estimate():
    with pytest.raises(ValueError, match="do not fit"):
        estimate_step(_report(decode=_prog("decode", 1.0, fits=False)))
    r = _report()
    with pytest.raises(ValueError, match="lacks"):
        estimate_step(dataclasses.replace(r, programs=r.programs[:2]))
    with pytest.raises(ValueError, match="exceed the compiled batch"):
        estimate_step(r, StepAssumptions(prompts=64))
    # 64 x 4 episodes over 16 hosts: 16 rows per host with REHEARSE sharing the policy (parked ACT rows
    # too) exceed the 8 compiled; 16 without it (a separate simulator: one row per episode) do too, 8 fit
    with pytest.raises(ValueError, match="16 sampler rows per host"):
        estimate_step(r, StepAssumptions(prompts=32))
    one_role = dataclasses.replace(r, shapes=dataclasses.replace(r.shapes, rows_per_episode=1))
    assert estimate_step(one_role, StepAssumptions(prompts=32))["total"] > 0
