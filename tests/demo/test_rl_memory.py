"""Rehearsal memories in RL prompts (demo.rl_memory): the configured share of prompts carries one, and it is
the memory test-time rehearsal builds from the same imagined episodes."""

from __future__ import annotations

import json
import re

import pytest

from envace_jax.data.demo_tasks import generate_tasks
from envace_jax.demo import rl_memory
from envace_jax.demo.config import DemoConfig
from envace_jax.demo.rehearsal_table import demo_rehearsal_config
from envace_jax.eval import rehearsal as R
from envace_jax.rl.rollout import RoleSampling, RolloutConfig
from envace_jax.rl.types import REHEARSE
from tests.helpers_rollout import ScriptedClient, codec

ROLLOUT = RolloutConfig(
    max_steps=8, max_model_len=100000, act=RoleSampling(max_new_tokens=200), rehearse=RoleSampling(max_new_tokens=200)
)


def _last(pattern: str, text: str) -> str:
    return re.findall(pattern, text, re.DOTALL)[-1]


def wire_script(c):
    """ACT sends the whole requested amount in one wire, or in two when its seed is odd (so the memory
    depends on the seed); REHEARSE refuses a wire over 40, as the description says; after a tool response
    ACT answers."""
    tok = c.renderer.tokenizer

    def script(req, n):
        text = tok.decode(list(req.prompt_ids), skip_special_tokens=False)
        if req.role == REHEARSE:
            args = json.loads(_last(r"- arguments \(JSON, parsed from the assistant's tool_call\):\n(\{.*?\})", text))
            ok = args.get("amount", 0) <= 40
            payload = dict(args, status="ok") if ok else {"error": "over the limit of 40; fee of 2 charged"}
            return f"<think>\nok\n</think>\n\n<execution_result>\n{json.dumps(payload)}\n</execution_result>"
        if "<tool_response>" in text.rsplit("<|im_start|>user", 1)[-1]:
            return "<think>\nanswer\n</think>\n\nDone."
        a, x, b = re.search(r"Send (\d+) from (\w+) to (\w+)", text).group(2, 1, 3)
        amount = 40 if req.seed % 2 else int(x)
        call = json.dumps({"name": "transfer", "arguments": {"from_account": a, "to_account": b, "amount": amount}})
        return f"<think>\ncall\n</think>\n\n\n<tool_call>\n{call}\n</tool_call>"

    return script


@pytest.fixture(scope="module")
def prompts() -> list[dict]:
    tasks = [
        t
        for t in generate_tasks(80, 2, "train", family="irreversible")
        if t["task_type"] == "wire/split_over_limit" and len(t["checklist"][0]) == 1
    ]
    assert len(tasks) >= 8
    return tasks[:8]


def _memory_prompts(fraction: float, seed: int, place: str = "always") -> rl_memory.MemoryPrompts:
    c = codec()
    cfg = demo_rehearsal_config(DemoConfig(rehearsal_place_memory=place, rehearsal_temperature=0.6), n=2)
    return rl_memory.MemoryPrompts(fraction, cfg, ROLLOUT, c, ScriptedClient(c, wire_script(c)), seed=seed)


def _has_memory(record: dict) -> bool:
    return R.MEMORY_HEADER in record["messages"][0]["content"]


def test_positions_are_the_configured_share_and_fixed_by_seed_and_step():
    for n, f, k in [(8, 0.25, 2), (8, 0.5, 4), (5, 0.5, 3), (8, 0.0, 0), (8, 1.0, 8), (3, 0.1, 0)]:
        pos = rl_memory.chosen_positions(n, f, seed=4, iteration=7)
        assert len(pos) == k and len(set(pos)) == k and all(0 <= i < n for i in pos)
    assert rl_memory.chosen_positions(16, 0.25, 4, 7) == rl_memory.chosen_positions(16, 0.25, 4, 7)
    draws = {tuple(rl_memory.chosen_positions(16, 0.25, s, it)) for s in range(3) for it in range(3)}
    assert len(draws) > 1
    with pytest.raises(ValueError, match="fraction must be in"):
        rl_memory.chosen_positions(8, 1.5, 0, 0)


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_the_share_of_prompts_with_a_memory_is_the_configured_one(prompts, fraction):
    mp = _memory_prompts(fraction, seed=3)
    out, metrics = mp(prompts, iteration=5)
    with_memory = [i for i, r in enumerate(out) if _has_memory(r)]
    assert with_memory == mp.last.chosen and len(with_memory) == fraction * len(prompts)
    assert metrics["memory/placed_share"] == metrics["memory/rehearsed_share"] == fraction
    for i, (rec, orig) in enumerate(zip(out, prompts)):
        if i not in with_memory:
            assert rec == orig  # the others are the prompts as drawn
        else:
            assert rec["messages"][1:] == orig["messages"][1:] and not _has_memory(orig)


def test_the_memory_is_what_test_time_rehearsal_builds_from_the_same_episodes(prompts):
    mp = _memory_prompts(0.5, seed=3)
    out, _ = mp(prompts, iteration=2)
    chosen = [prompts[i] for i in mp.last.chosen]
    for i, reh in zip(mp.last.chosen, mp.last.rehearsals):
        # from the imagined episodes themselves, with the test-time template
        traces = [R.trace_of(ep, k + 1, len(prompts[i]["messages"])) for k, ep in enumerate(reh.imagined)]
        memory = R.build_template_memory(traces, mp.rehearsal.max_memory_chars)
        assert memory == reh.memory and out[i] == R.with_memory(prompts[i], memory, "system")
        assert "Avoid (calls that failed in rehearsal):" in memory and "over the limit" in memory
    # and the test-time runner itself, on the same records and seed, builds the same memories
    c = codec()
    runner = R.TestTimeRehearsal(
        mp.runner(2).cfg, ROLLOUT, c, ScriptedClient(c, wire_script(c)), judge=None, make_env=None
    )
    assert [o.memory for o in runner.rehearse(chosen)] == [r.memory for r in mp.last.rehearsals]


def test_determinism_by_seed(prompts):
    a, _ = _memory_prompts(0.5, seed=3)(prompts, iteration=1)
    b, _ = _memory_prompts(0.5, seed=3)(prompts, iteration=1)
    assert a == b
    others = [_memory_prompts(0.5, seed=s)(prompts, iteration=1)[0] for s in (4, 5, 6)]
    assert any(o != a for o in others)


def test_on_mistake_gate_leaves_rule_refusals_out_as_at_test_time(prompts):
    # a refused wire is a call the schema accepts: the demo's default gate places no memory for it
    out, metrics = _memory_prompts(0.5, seed=3, place="on_mistake")(prompts, iteration=0)
    assert metrics["memory/rehearsed_share"] == 0.5 and metrics["memory/placed_share"] == 0.0
    assert not any(_has_memory(r) for r in out)


def test_off_by_default():
    assert DemoConfig().rl_memory_fraction == 0.0
    assert rl_memory.from_demo(DemoConfig(), codec(), None, ROLLOUT) is None
    with pytest.raises(ValueError, match="rl_memory_fraction"):
        DemoConfig(rl_memory_fraction=-0.1)
    with pytest.raises(ValueError, match="rl_memory_rehearsals"):
        DemoConfig(rl_memory_rehearsals=0)


def test_rl_stage_puts_memories_in_the_configured_share_of_prompts(tmp_path):
    """The demo's RL stage on the irreversible family with half its prompts rehearsed first: a tiny model
    from scratch, 2 steps of 2 prompts; the step metrics record the share, and a rerun is identical."""
    import jax
    import numpy as np

    from envace_jax.demo import stages
    from envace_jax.demo.config import reduced
    from envace_jax.demo.pipeline import Demo

    cfg = reduced().replace(
        task_family="irreversible",
        rl_memory_fraction=0.5,
        rl_memory_rehearsals=1,
        rehearsal_place_memory="always",
        test_tasks=2,
        fidelity_tasks=2,
    )
    d = Demo(cfg, str(tmp_path / "a"), progress=False)
    d.prepare()
    assert all(t["env"]["name"] == "wire" for t in d.rl_tasks + d.eval_tasks)
    d.sft()
    log = d.rl(cfg.rl_mode, tag="rl")  # starts from the SFT weights, as does the rerun below
    assert [m["memory/rehearsed_share"] for m in log] == [0.5, 0.5]
    assert all(m["memory/placed_share"] == 0.5 and m["memory/generated_tokens"] > 0 for m in log)
    w1 = jax.tree.leaves(stages.host_copy(stages.snapshot(d.model)))
    log2 = d.rl(cfg.rl_mode, tag="rl_again")
    w2 = jax.tree.leaves(stages.host_copy(stages.snapshot(d.model)))
    for key in ("memory/generated_tokens", "memory/placed_share", "episode/score_mean"):
        assert [m.get(key) for m in log] == [m.get(key) for m in log2], key
    for a, b in zip(w1, w2):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_train_len_sets_the_rl_row_limit():
    """Prompts with a memory are longer: the RL update's row limit (longer rows are dropped) is a field."""
    from envace_jax.demo import stages
    from envace_jax.demo.config import reduced

    assert DemoConfig().train_len == stages.TRAIN_LEN  # the default demo is unchanged
    cfg = reduced().replace(train_len=640)
    model = stages.build_model(cfg, 512)
    step, _ = stages.make_rl_step(cfg, "rehearsal", model, codec(), stages.make_trainer(model, cfg, 1e-3, 0))
    assert step.cfg.max_row_length == 640
    with pytest.raises(ValueError, match="train_len"):
        DemoConfig(train_len=10)


def test_the_demo_passes_its_memory_tools_to_the_rehearsal_config():
    cfg = DemoConfig(rehearsal_place_memory="on_tools", rehearsal_memory_tools="close_account, transfer")
    reh = demo_rehearsal_config(cfg, n=2)
    assert (reh.place_memory, reh.memory_tools) == ("on_tools", ("close_account", "transfer"))
    for kw in ({"rehearsal_place_memory": "on_tools"}, {"rehearsal_memory_tools": "close_account"}):
        with pytest.raises(ValueError, match="rehearsal_memory_tools"):
            DemoConfig(**kw)
