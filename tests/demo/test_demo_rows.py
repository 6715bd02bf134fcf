"""Demo SFT rows: ACT rows are exactly the contexts the rollout engine builds, REHEARSE targets parse
back to the real responses, and a correct rehearsal shows the caller the same text as the real tool."""

from __future__ import annotations

import json

import pytest

from envace_jax.chat import parse_simulator_output
from envace_jax.data.demo_tasks import generate_tasks
from envace_jax.demo import data as demo_data
from envace_jax.eval.fidelity import caller_raw_text, compare
from envace_jax.rl.judges import RuleJudge
from envace_jax.rl.reward import ChecklistTurnJudge
from envace_jax.rl.policy_client import GenOutput
from envace_jax.rl.rollout import RoleSampling, RolloutConfig, RolloutEngine
from envace_jax.rl.types import ACT, REHEARSE


@pytest.fixture(scope="module")
def tasks():
    return [demo_data.normalize_task(t) for t in generate_tasks(12, 3, "train")]


@pytest.fixture(scope="module")
def codec(tasks, tmp_path_factory):
    tok = demo_data.build_tokenizer(tasks, str(tmp_path_factory.mktemp("tok") / "tokenizer"), 512)
    return demo_data.make_codec(tok)


class ReferenceClient:
    """Plays each episode's reference assistant messages in order (ACT only), as sampled ids."""

    def __init__(self, tasks, codec):
        self.codec = codec
        self.script = {i: [m for m in t["reference_messages"] if m["role"] == "assistant"] for i, t in enumerate(tasks)}
        self.pos = {i: 0 for i in self.script}

    def generate(self, requests):
        outs = []
        for r in requests:
            assert r.role == ACT
            msg = self.script[r.episode][self.pos[r.episode]]
            self.pos[r.episode] += 1
            ids = self.codec.renderer.encode(caller_raw_text(msg)) + [self.codec.renderer.im_end_id]
            outs.append(GenOutput(ids, [0.0] * len(ids), "stop"))
        return outs

    def release(self, keys):
        pass


def test_act_rows_equal_rollout_contexts_and_reference_scores_full(tasks, codec):
    cfg = RolloutConfig(
        mode="real", max_steps=30, max_model_len=8192, act=RoleSampling(temperature=0.0, max_new_tokens=64)
    )
    engine = RolloutEngine(
        cfg, codec, ReferenceClient(tasks, codec), ChecklistTurnJudge(RuleJudge()), make_env=demo_data.make_real_env
    )
    episodes = engine.run(tasks)
    for t, e in zip(tasks, episodes):
        rows = demo_data.act_rows(t, codec)
        gens = [g for g in e.generations if g.role == ACT]
        assert e.termination == "completed" and e.score == pytest.approx(1.0), (t["uid"], e.termination)
        assert len(rows) == len(gens)
        for r, g in zip(rows, gens):
            assert r.prompt_ids == g.prompt_ids
            assert r.gen_ids == g.gen_ids


def test_rehearse_targets_parse_to_the_real_responses(tasks, codec):
    n = 0
    for t in tasks:
        tool_msgs = [m for m in t["reference_messages"] if m["role"] == "tool"]
        rows = demo_data.rehearse_rows(t, codec)
        assert len(rows) == len(tool_msgs)
        for r, m in zip(rows, tool_msgs):
            text = codec.decode(r.gen_ids)
            result, err = parse_simulator_output(text)
            assert err is None
            # what the caller reads after a perfect rehearsal is what the (normalised) real tool said
            assert result == m["content"]
            assert compare(text, m["content"], False)["exact"] == 1.0
            assert (
                r.prompt_ids[-len(codec.renderer.generation_prompt_ids()) :] == codec.renderer.generation_prompt_ids()
            )
            n += 1
    assert n >= len(tasks)


def test_world_model_rows_include_errors_and_parse(codec):
    rows = demo_data.world_model_rows(24, 0, codec)
    assert len(rows) == 24 and all(r.role == REHEARSE for r in rows)
    payloads = []
    for r in rows:
        result, err = parse_simulator_output(codec.decode(r.gen_ids))
        assert err is None
        payloads.append(json.loads(result))
    errors = sum(isinstance(p, dict) and "error" in p for p in payloads)
    assert 0 < errors < len(rows)


def test_normalized_env_matches_parser_form(tasks):
    t = next(t for t in tasks if t["env"]["name"] == "bank")
    env = demo_data.make_real_env(t)
    acct = sorted(t["env"]["state"]["accounts"])[0]
    real = env.execute("get_balance", {"account": acct}).content
    parsed, err = parse_simulator_output(demo_data.rehearse_target(real, False))
    assert err is None and parsed == real
    assert json.loads(real) == {"account": acct, "balance": t["env"]["state"]["accounts"][acct]}
    bad = env.execute("get_balance", {"account": "nobody"})
    assert bad.error and "error" in json.loads(bad.content)


def test_world_model_rows_never_show_an_excluded_task(codec):
    pool = generate_tasks(40, 0 + demo_data.WORLD_MODEL_TASK_SEED_OFFSET, "train")
    excluded = {t["uid"] for t in pool[:30]}
    rows = demo_data.world_model_rows(40, 0, codec, exclude_uids=excluded)
    assert len(rows) == 40 and all(r.role == REHEARSE for r in rows)
    assert not {r.uid for r in rows} & excluded
    # The same call without the exclusion does draw from those worlds (the exclusion is what removes them).
    assert {r.uid for r in demo_data.world_model_rows(40, 0, codec)} & excluded


def test_sft_batches_give_each_role_half_of_every_batch(tasks, codec):
    from envace_jax.demo.stages import sft_batches

    rows = demo_data.sft_rows(tasks[:3], codec, 60, 0)
    n_act = sum(r.role == ACT for r in rows)
    assert 0 < n_act < 30  # far fewer ACT rows than REHEARSE rows
    stream = sft_batches(rows, 9, seed=1)
    seen_act = []
    for _ in range(6):
        batch = next(stream)
        roles = [r.role for r in batch]
        assert len(batch) == 9 and roles.count(ACT) == 5 and roles.count(REHEARSE) == 4
        seen_act += [id(r) for r in batch if r.role == ACT]
    # ACT rows cycle through full permutations: the first n_act draws hold every ACT row once.
    assert len(set(seen_act[:n_act])) == n_act
    only = sft_batches([r for r in rows if r.role == REHEARSE], 8, seed=1)
    assert all(r.role == REHEARSE for r in next(only))


def test_rehearse_rows_carry_the_tool_descriptions_when_the_codec_asks(tasks, codec):
    """``make_codec(tok, tool_descriptions=True)`` (a base's ``rehearse_tool_descriptions``): every REHEARSE
    prompt shows each tool's description; the default codec's prompts show none, and the targets are the same."""
    described = demo_data.make_codec(codec.renderer.tokenizer, tool_descriptions=True)
    task = next(t for t in tasks if demo_data.rehearse_rows(t, codec))
    plain_rows, desc_rows = demo_data.rehearse_rows(task, codec), demo_data.rehearse_rows(task, described)
    assert len(plain_rows) == len(desc_rows) and [r.gen_ids for r in plain_rows] == [r.gen_ids for r in desc_rows]
    descriptions = [t["function"]["description"] for t in task["tools"]]
    for p, d in zip(plain_rows, desc_rows):
        plain_text, desc_text = (
            codec.renderer.tokenizer.decode(p.prompt_ids),
            codec.renderer.tokenizer.decode(d.prompt_ids),
        )
        assert not any(x in plain_text for x in descriptions)
        assert all(json.dumps(x)[1:-1] in desc_text for x in descriptions), desc_text[:400]
