"""Test-time private rehearsal: no real tool during rehearsal, the memory template, parallel batching,
sequential memory passing, a scripted policy whose committed run changes because of the memory, and
the sweep table."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest

from envace_jax.data.demo_tasks import generate_tasks
from envace_jax.envs.base import NoToolEnvironment, ToolEnvironment
from envace_jax.envs.demo_worlds import make_env
from envace_jax.eval import rehearsal as R
from envace_jax.eval.results import mean_ci
from envace_jax.rl.judges import RuleJudge
from envace_jax.rl.reward import ChecklistTurnJudge
from envace_jax.rl.rollout import RoleSampling, RolloutConfig
from envace_jax.rl.types import ACT, REHEARSE, State
from tests.helpers_rollout import ScriptedClient, codec

ROLLOUT = RolloutConfig(
    max_steps=20, max_model_len=100000, act=RoleSampling(max_new_tokens=200), rehearse=RoleSampling(max_new_tokens=200)
)


def balance_tasks(k: int) -> list[dict]:
    """Single-turn bank tasks "What is X's balance?" answered by one successful get_balance call."""
    out = []
    for t in generate_tasks(200, 5, "train"):
        calls = [c for m in t["reference_messages"] for c in m.get("tool_calls") or []]
        users = [m for m in t["reference_messages"] if m["role"] == "user"]
        if (
            t["env"]["name"] == "bank"
            and len(users) == 1
            and re.match(r"What is \w+'s balance", users[0]["content"])
            and [c["function"]["name"] for c in calls] == ["get_balance"]
            and '"balance"' in t["reference_messages"][2]["content"]
        ):
            out.append(t)
        if len(out) == k:
            return out
    raise AssertionError("not enough balance tasks")


class RecordingEnv(ToolEnvironment):
    """The real demo world, logging every executed call with the phase it happened in."""

    log: list[tuple[str, str, dict]] = []
    phase = ["?"]

    def __init__(self, task):
        self.inner, self.uid = make_env(task), task["uid"]

    def reset(self, task):
        self.inner.reset(task)

    def execute(self, name, arguments):
        RecordingEnv.log.append((RecordingEnv.phase[0], name, dict(arguments)))
        return self.inner.execute(name, arguments)

    @property
    def tool_schemas(self):
        return self.inner.tool_schemas


def _last(pattern: str, text: str) -> str | None:
    found = re.findall(pattern, text, re.DOTALL)
    return found[-1] if found else None


def _reply_to_tool_response(text: str) -> str | None:
    """The scripted final reply when the last user turn holds a tool response, else None."""
    last_turn = text.rsplit("<|im_start|>user", 1)[-1]
    if "<tool_response>" not in last_turn:
        return None
    resp = json.loads(_last(r"<tool_response>\n(.*?)\n</tool_response>", last_turn))
    answer = f"{resp['account']} has {resp['balance']}." if "balance" in resp else "Sorry, no such account."
    return f"<think>\nanswer\n</think>\n\n{answer}"


def policy_script(c, summary: str = "Call get_balance with the lowercase name."):
    """ACT asks for the Capitalised account unless the memory says that call failed; REHEARSE predicts
    an unknown-account error for a Capitalised name and a balance of 1 otherwise."""
    tok = c.renderer.tokenizer

    def script(req, n):
        text = tok.decode(list(req.prompt_ids), skip_special_tokens=False)
        if "privately rehearsed a tool-use task" in text:
            return summary
        if req.role == REHEARSE:
            args = json.loads(_last(r"- arguments \(JSON, parsed from the assistant's tool_call\):\n(\{.*?\})", text))
            acc = args["account"]
            payload = {"error": f"unknown account '{acc}'"} if acc[:1].isupper() else {"account": acc, "balance": 1}
            return f"<think>\nok\n</think>\n\n<execution_result>\n{json.dumps(payload)}\n</execution_result>"
        reply = _reply_to_tool_response(text)
        if reply is not None:
            return reply
        name = _last(r"What is (\w+)'s balance", text)
        wrong = name.capitalize()
        failed = f'get_balance({{"account":"{wrong}"}})'
        acc = (
            name
            if ("Avoid (calls that failed in rehearsal):" in text and failed in text) or "lowercase name" in text
            else wrong
        )
        call = json.dumps({"name": "get_balance", "arguments": {"account": acc}})
        return f"<think>\ncall\n</think>\n\n\n<tool_call>\n{call}\n</tool_call>"

    return script


def make_runner(cfg: R.RehearsalConfig, client=None):
    c = codec()
    client = client or ScriptedClient(c, policy_script(c))
    return R.TestTimeRehearsal(cfg, ROLLOUT, c, client, ChecklistTurnJudge(RuleJudge()), RecordingEnv), client


@pytest.fixture(autouse=True)
def _clear_log():
    RecordingEnv.log.clear()
    yield


def _run(cfg, tasks, client=None):
    runner, client = make_runner(cfg, client)
    RecordingEnv.phase[0] = "rehearsal"
    reh = runner.rehearse(tasks)
    assert RecordingEnv.log == []
    RecordingEnv.phase[0] = "committed"
    committed = [R.with_memory(t, o.memory, cfg.placement) if o.memory else t for t, o in zip(tasks, reh)]
    from envace_jax.rl.rollout import RolloutEngine

    eps = RolloutEngine(runner.real_cfg, runner.codec, runner.policy, runner.judge, make_env=RecordingEnv).run(
        committed
    )
    return runner, reh, eps, client


# ----------------------------------------------------------------------------- no real tool


@pytest.mark.parametrize("mode", R.MODES)
def test_rehearsal_touches_no_real_tool_and_the_committed_run_does(mode):
    tasks = balance_tasks(2)
    runner, reh, eps, _ = _run(R.RehearsalConfig(n=2, mode=mode), tasks)
    imagined = [e for o in reh for e in o.imagined]
    assert len(imagined) == 4
    for e in imagined:
        assert isinstance(e.env, NoToolEnvironment) and e.env.calls == []
        assert any(g.role == REHEARSE for g in e.generations)  # the tools were played by REHEARSE
    assert {p for p, _, _ in RecordingEnv.log} == {"committed"} and len(RecordingEnv.log) == 2
    assert all(e.env is not None and isinstance(e.env, RecordingEnv) for e in eps)


def test_imagined_engine_refuses_real_mode_and_real_answers():
    c = codec()
    with pytest.raises(ValueError, match="imagined episodes need"):
        R.ImaginedEngine(dataclasses.replace(ROLLOUT, mode="real"), c, ScriptedClient(c))
    engine = R.ImaginedEngine(ROLLOUT, c, ScriptedClient(c))
    ep = engine.start([R.imagined_record(balance_tasks(1)[0], R.RehearsalConfig(n=1))])[0]
    ep.pending_calls = [("x", "get_balance", {"account": "ana"})]
    with pytest.raises(RuntimeError, match="real tool was reached"):
        engine._answer_real(ep)
    with pytest.raises(RuntimeError, match="no real tool may run"):
        ep.env.execute("get_balance", {"account": "ana"})


# ----------------------------------------------------------------------------- real reads (opt-in)


def test_real_reads_run_on_a_copy_of_the_world_and_are_not_counted_as_imagined():
    """With ``real_reads``, a rehearsal's get_balance runs in a fresh real world of the task (logged in the
    rehearsal phase), REHEARSE plays no part in it, the step is marked real and the fidelity split leaves it out;
    the committed run still gets its own world."""
    from envace_jax.eval.imagined_fidelity import replay_trace

    tasks = balance_tasks(2)
    cfg = R.RehearsalConfig(n=2, mode="parallel", real_reads=("get_balance",))
    runner, client = make_runner(cfg)
    RecordingEnv.phase[0] = "rehearsal"
    reh = runner.rehearse(tasks)
    # the script's first call is the Capitalised account: the real world does not know it
    assert [(p, n) for p, n, _ in RecordingEnv.log] == [("rehearsal", "get_balance")] * 4
    for t, o in zip(tasks, reh):
        for e, tr in zip(o.imagined, o.traces):
            assert not any(g.role == REHEARSE for g in e.generations)
            (step,) = tr.steps
            real = make_env(t).execute(step.name, step.arguments)
            assert step.real and step.error and step.response == real.content
            assert replay_trace(t, tr, make_env) == []  # nothing was imagined
    # without real reads the same rehearsals are REHEARSE's, and the steps are not marked
    plain, _ = make_runner(R.RehearsalConfig(n=2, mode="parallel"))
    for o in plain.rehearse(tasks):
        assert all(not s.real for tr in o.traces for s in tr.steps)
        assert all(any(g.role == REHEARSE for g in e.generations) for e in o.imagined)


def test_real_reads_stop_at_the_first_call_of_another_tool():
    c = codec()
    with pytest.raises(ValueError, match="real_reads needs make_env"):
        R.ImaginedEngine(ROLLOUT, c, ScriptedClient(c), real_reads=("get_balance",))
    with pytest.raises(ValueError, match="real_reads must be a tuple of tool names"):
        R.RehearsalConfig(real_reads="get_balance")
    engine = R.ImaginedEngine(ROLLOUT, c, ScriptedClient(c), real_reads=("get_balance",), make_env=make_env)
    task = R.imagined_record(balance_tasks(1)[0], R.RehearsalConfig(n=1))
    read, write = engine.start([task, task])
    account = next(iter(make_env(task).accounts))
    # a read first: answered for real now, the episode back to ACT, the tool message marked
    read.state, read.pending_calls = State.AWAIT_SIMULATOR, [("c0", "get_balance", {"account": account})]
    engine._after_act(read)
    assert read.state == State.AWAIT_CALLER and read.messages[-1][R.REAL_READ_KEY]
    assert json.loads(read.messages[-1]["content"])["balance"] == make_env(task).accounts[account]
    # a transfer first: left to REHEARSE, and from then on reads are imagined too
    write.state = State.AWAIT_SIMULATOR
    write.pending_calls = [("c0", "transfer", {"from_account": account, "to_account": account, "amount": 1})]
    engine._after_act(write)
    assert write.state == State.AWAIT_SIMULATOR and write.pending_results == []
    write.pending_calls = [("c1", "get_balance", {"account": account})]
    engine._after_act(write)
    assert write.state == State.AWAIT_SIMULATOR and write.pending_results == []


def test_imagined_record_hides_the_answer_key_by_default():
    t = balance_tasks(1)[0]
    honest = R.imagined_record(t, R.RehearsalConfig(n=1))
    assert [m["role"] for m in honest["reference_messages"]] == ["user"]
    assert honest["messages"] == t["messages"] and "env" in honest
    grounded = R.imagined_record(t, R.RehearsalConfig(n=1, grounding="reference"))
    assert grounded["reference_messages"] == t["reference_messages"]
    two_turn = next(
        x for x in generate_tasks(80, 1, "train") if sum(m["role"] == "user" for m in x["reference_messages"]) == 2
    )
    first = R.imagined_record(two_turn, R.RehearsalConfig(n=1))
    every = R.imagined_record(two_turn, R.RehearsalConfig(n=1, user_turns="all"))
    assert len(first["reference_messages"]) == 1 and len(every["reference_messages"]) == 2
    assert len(every["checklist"][0]) == 2


# ----------------------------------------------------------------------------- memory


def test_template_memory_content_by_hand():
    traces = [
        R.RehearsalTrace(
            1,
            [R.StepTrace(0, "get_balance", {"account": "Ana"}, '{"error": "unknown account \'Ana\'"}', True)],
            "Sorry.",
            "no_next_user",
            None,
        ),
        R.RehearsalTrace(
            2,
            [R.StepTrace(0, "get_balance", {"account": "ana"}, '{"account": "ana", "balance": 1}', False)],
            "ana has 1.",
            "no_next_user",
            None,
        ),
        R.RehearsalTrace(3, [], None, "parse_error", '{"error_tool_call": "JSON_DECODE_ERROR: x"}'),
    ]
    want = "\n".join(
        [
            "Rehearsal memory: 3 private rehearsals of this task. Their tool responses were imagined, not real.",
            "Avoid (calls that failed in rehearsal):",
            '- get_balance({"account":"Ana"}) -> {"error": "unknown account \'Ana\'"}',
            "A rehearsal wrote a malformed tool call; write each call as "
            '<tool_call>{"name": ..., "arguments": {...}}</tool_call>.',
            "Plan that ran without errors (rehearsal 2):",
            '1. get_balance({"account":"ana"}) -> {"account": "ana", "balance": 1}',
            'Rehearsal 1: get_balance({"account":"Ana"}) -> ERROR {"error": "unknown account \'Ana\'"}; '
            "answered: Sorry.",
            'Rehearsal 2: get_balance({"account":"ana"}) -> {"account": "ana", "balance": 1}; answered: ana has 1.',
            "Rehearsal 3: ended: parse_error",
        ]
    )
    assert R.build_template_memory(traces, 10_000) == want
    capped = R.build_template_memory(traces, 300)
    assert len(capped) <= 300 and want.startswith(capped[:-3]) and capped.endswith("...")
    assert R.build_template_memory([], 100) == ""


def test_memory_placement_keeps_the_caller_context_consistent():
    t = balance_tasks(1)[0]
    c = codec()
    sys_rec = R.with_memory(t, "Rehearsal memory: X", "system")
    assert sys_rec["messages"][0]["content"].endswith("\n\nRehearsal memory: X") and len(sys_rec["messages"]) == 2
    note = R.with_memory(t, "Rehearsal memory: X", "note")
    assert [m["role"] for m in note["messages"]] == ["system", "system", "user"]
    assert t["messages"][0]["content"] == sys_rec["messages"][0]["content"].split("\n\n")[0]  # input untouched
    for rec in (sys_rec, note):
        ids = c.caller_prompt(rec["messages"], rec["tools"])
        assert "Rehearsal memory: X" in c.renderer.tokenizer.decode(ids)


# ----------------------------------------------------------------------------- modes


def test_parallel_runs_all_rehearsals_in_one_batched_engine_run():
    tasks = balance_tasks(3)
    runner, reh, _, client = _run(R.RehearsalConfig(n=2, mode="parallel"), tasks)
    assert len(runner.imagined_engines) == 1
    first = runner.imagined_engines[0].sampler_calls[0]
    assert first[ACT] == 6 and first[REHEARSE] == 0
    for o in reh:
        assert [t.index for t in o.traces] == [1, 2] and len(o.memories) == 1
        assert o.generated_tokens == sum(len(g.gen_ids) for e in o.imagined for g in e.generations) > 0


def test_sequential_passes_memory_forward_and_revises():
    tasks = balance_tasks(2)
    runner, reh, eps, _ = _run(R.RehearsalConfig(n=2, mode="sequential"), tasks)
    assert len(runner.imagined_engines) == 2
    tok = codec().renderer.tokenizer
    for o in reh:
        first_prompts = [tok.decode(e.generations[0].prompt_ids, skip_special_tokens=False) for e in o.imagined]
        assert "Rehearsal memory" not in first_prompts[0]
        assert o.memories[0] in first_prompts[1]
        # rehearsal 1 used the wrong name and failed; rehearsal 2 read that and ran clean
        assert o.traces[0].steps[0].error and not o.traces[1].steps[0].error
        assert "Avoid" in o.memories[1] and "Plan that ran without errors (rehearsal 2)" in o.memories[1]


@pytest.mark.parametrize("mode,memory", [("parallel", "template"), ("sequential", "template"), ("parallel", "model")])
def test_memory_changes_the_committed_execution(mode, memory):
    tasks = balance_tasks(2)
    _, _, base, _ = _run(R.RehearsalConfig(n=0), tasks)
    calls0 = [args["account"] for _, _, args in RecordingEnv.log]
    RecordingEnv.log.clear()
    _, reh, eps, _ = _run(R.RehearsalConfig(n=1, mode=mode, memory=memory), tasks)
    calls1 = [args["account"] for _, _, args in RecordingEnv.log]
    names = [t["reference_messages"][1]["tool_calls"][0]["function"]["arguments"]["account"] for t in tasks]
    assert calls0 == [n.capitalize() for n in names] and calls1 == names
    assert [e.score for e in base] == [0.0, 0.0] and [e.score for e in eps] == [1.0, 1.0]
    if memory == "model":
        assert all(o.memory.endswith("Call get_balance with the lowercase name.") for o in reh)


def test_empty_model_summary_falls_back_to_the_template():
    tasks = balance_tasks(1)
    c = codec()
    client = ScriptedClient(c, policy_script(c, summary=""))
    runner, _ = make_runner(R.RehearsalConfig(n=1, memory="model"), client)
    (o,) = runner.rehearse(tasks)
    assert o.memory == R.build_template_memory(o.traces, 1500)
    assert o.generated_tokens > sum(len(g.gen_ids) for e in o.imagined for g in e.generations)


def test_token_budget_ends_long_rehearsals():
    tasks = balance_tasks(2)
    runner, reh, _, _ = _run(R.RehearsalConfig(n=1, max_tokens_per_rehearsal=40), tasks)
    for o in reh:
        (e,) = o.imagined
        assert all(len(g.gen_ids) <= 40 for g in e.generations)
        assert e.termination in ("length_budget", "simulator_error", "parse_error")
        assert o.generated_tokens < 40 + 40


def test_imagined_episodes_sample_at_their_own_temperature_and_the_committed_run_does_not():
    tasks = balance_tasks(2)
    runner, _, _, client = _run(R.RehearsalConfig(n=2, mode="parallel", temperature=0.7), tasks)
    imagined = [r for call in client.requests[:-2] for r in call]
    committed = [r for call in client.requests[-2:] for r in call]
    assert imagined and {r.sampling.temperature for r in imagined} == {0.7}
    assert {r.sampling.temperature for r in committed} == {ROLLOUT.act.temperature}
    default, _ = make_runner(R.RehearsalConfig(n=1))
    assert default.imagined_cfg.act.temperature == ROLLOUT.act.temperature
    with pytest.raises(ValueError, match="rehearsal.temperature"):
        R.RehearsalConfig(temperature=-1.0)


def test_config_errors_name_the_field():
    for kw, field in [
        ({"mode": "both"}, "mode"),
        ({"memory": "x"}, "memory"),
        ({"n": -1}, "n"),
        ({"max_memory_chars": 0}, "max_memory_chars"),
        ({"placement": "user"}, "placement"),
    ]:
        with pytest.raises(ValueError, match=f"rehearsal.{field}"):
            R.RehearsalConfig(**kw)


# ----------------------------------------------------------------------------- place_memory="on_mistake"


def schema_slip_script(c):
    """ACT passes the account as ``name`` (the schema declares ``account``) unless a memory says the schema
    rejected that call; the imagined tool accepts either (only the schema can tell)."""
    tok = c.renderer.tokenizer

    def script(req, n):
        text = tok.decode(list(req.prompt_ids), skip_special_tokens=False)
        if req.role == REHEARSE:
            args = json.loads(_last(r"- arguments \(JSON, parsed from the assistant's tool_call\):\n(\{.*?\})", text))
            acc = args.get("account") or args.get("name")
            return (
                f"<think>\nok\n</think>\n\n<execution_result>\n{json.dumps({'account': acc, 'balance': 1})}"
                f"\n</execution_result>"
            )
        reply = _reply_to_tool_response(text)
        if reply is not None:
            return reply
        acc = _last(r"What is (\w+)'s balance", text)
        key = "account" if "the tool schema rejects it" in text else "name"
        call = json.dumps({"name": "get_balance", "arguments": {key: acc}})
        return f"<think>\ncall\n</think>\n\n\n<tool_call>\n{call}\n</tool_call>"

    return script


def test_on_mistake_places_no_memory_for_an_imagined_refusal_of_a_valid_call():
    # policy_script's rehearsal fails with "unknown account 'Ana'": the call matches the schema, so the
    # refusal is the imagined world's claim and nothing is placed; the committed run is N = 0's.
    tasks = balance_tasks(2)
    _, reh, eps, _ = _run(R.RehearsalConfig(n=1, place_memory="on_mistake"), tasks)
    assert all(o.traces[0].steps[0].error and o.traces[0].steps[0].problem is None for o in reh)
    assert [o.memory for o in reh] == ["", ""]
    names = [t["reference_messages"][1]["tool_calls"][0]["function"]["arguments"]["account"] for t in tasks]
    assert [args["account"] for _, _, args in RecordingEnv.log] == [n.capitalize() for n in names]
    assert [e.score for e in eps] == [0.0, 0.0]


@pytest.mark.parametrize("mode", R.MODES)
def test_on_mistake_catches_a_call_the_schema_rejects_that_the_imagined_tool_accepted(mode):
    tasks = balance_tasks(2)
    c = codec()
    results = {}
    for gate in ("always", "on_mistake"):
        RecordingEnv.log.clear()
        _, reh, eps, _ = _run(
            R.RehearsalConfig(n=1, mode=mode, place_memory=gate), tasks, ScriptedClient(c, schema_slip_script(c))
        )
        results[gate] = (reh, eps, [sorted(args) for _, _, args in RecordingEnv.log])
    reh, eps, keys = results["on_mistake"]
    for o in reh:
        step = o.traces[0].steps[0]
        assert not step.error and "name" in step.problem and "account" in step.problem  # accepted, but invalid
        assert "Avoid (calls that failed in rehearsal):" in o.memory and "the tool schema rejects it" in o.memory
    assert keys == [["account"], ["account"]] and [e.score for e in eps] == [1.0, 1.0]
    # EnvACE's memory shows the imagined success as the plan to follow: the committed run repeats the slip
    reh, eps, keys = results["always"]
    assert all("Avoid" not in o.memory and "Plan that ran without errors" in o.memory for o in reh)
    assert keys == [["name"], ["name"]] and [e.score for e in eps] == [0.0, 0.0]


# ----------------------------------------------------------------------------- place_memory="on_error"


def clean_script(c):
    """ACT calls get_balance with the right (lowercase) name and REHEARSE imagines its success: a clean rehearsal."""
    tok, inner = c.renderer.tokenizer, policy_script(c)

    def script(req, n):
        text = tok.decode(list(req.prompt_ids), skip_special_tokens=False)
        if req.role == REHEARSE or _reply_to_tool_response(text) is not None:
            return inner(req, n)
        call = json.dumps({"name": "get_balance", "arguments": {"account": _last(r"What is (\w+)'s balance", text)}})
        return f"<think>\ncall\n</think>\n\n\n<tool_call>\n{call}\n</tool_call>"

    return script


@pytest.mark.parametrize("mode", R.MODES)
def test_on_error_places_the_whole_memory_after_an_imagined_refusal_and_none_after_clean_rehearsals(mode):
    tasks = balance_tasks(2)
    # policy_script's rehearsal is refused ("unknown account 'Ana'", a call the schema accepts): on_mistake places
    # nothing, on_error places the whole memory, and the committed run avoids the refused call
    _, reh, eps, _ = _run(R.RehearsalConfig(n=2, mode=mode, place_memory="on_error"), tasks)
    assert all(o.traces[0].steps[0].error and o.traces[0].steps[0].problem is None for o in reh)
    assert all("Avoid (calls that failed in rehearsal):" in o.memory and "Rehearsal 1:" in o.memory for o in reh)
    assert [e.score for e in eps] == [1.0, 1.0]
    # rehearsals that ran clean: on_error places nothing (the committed run is N = 0's), always places the plan
    c = codec()
    for gate, placed in (("on_error", False), ("always", True)):
        RecordingEnv.log.clear()
        _, reh, eps, _ = _run(
            R.RehearsalConfig(n=2, mode=mode, place_memory=gate), tasks, ScriptedClient(c, clean_script(c))
        )
        assert all(not s.error for o in reh for t in o.traces for s in t.steps)
        assert [bool(o.memory) for o in reh] == [placed, placed]
        assert [e.score for e in eps] == [1.0, 1.0]
    assert R.caught_error([]) is False


# ----------------------------------------------------------------------------- place_memory="on_tools"


@pytest.mark.parametrize("mode", R.MODES)
def test_on_tools_places_the_memory_only_when_a_rehearsal_called_a_named_tool(mode):
    tasks = balance_tasks(2)
    # policy_script's rehearsals call get_balance and are refused ("unknown account 'Ana'"); the memory makes the
    # committed run use the lowercase name, which the real tool accepts (score 1); without it the run fails (0)
    cases = ((("get_balance",), True, [1.0, 1.0]), (("transfer", "close_account"), False, [0.0, 0.0]))
    for tools, placed, scores in cases:
        RecordingEnv.log.clear()
        _, reh, eps, _ = _run(R.RehearsalConfig(n=2, mode=mode, place_memory="on_tools", memory_tools=tools), tasks)
        # (sequential: a second rehearsal that read the first one's memory may use the lowercase name)
        assert all(s.name == "get_balance" for o in reh for t in o.traces for s in t.steps)
        assert all(o.traces[0].steps[0].error for o in reh)
        assert [bool(o.memory) for o in reh] == [placed, placed]
        if placed:  # the whole memory, as "always" builds it
            assert all(o.memory == R.build_template_memory(o.traces, 1500) for o in reh)
        assert [e.score for e in eps] == scores
    assert R.called_any([], ("get_balance",)) is False


def test_on_tools_needs_its_tools_and_only_it_takes_them():
    for kw in (
        {"place_memory": "on_tools"},
        {"place_memory": "always", "memory_tools": ("close_account",)},
        {"place_memory": "on_tools", "memory_tools": "close_account"},
        {"place_memory": "on_tools", "memory_tools": ("",)},
    ):
        with pytest.raises(ValueError, match="rehearsal.memory_tools"):
            R.RehearsalConfig(**kw)
    assert R.RehearsalConfig(place_memory="on_tools", memory_tools=["close_account"]).memory_tools == ("close_account",)


# ----------------------------------------------------------------------------- sweep


def test_sweep_table_over_n_and_modes():
    tasks = balance_tasks(2)
    runs = []

    def run(cfg):
        runs.append((cfg.mode, cfg.n))
        return make_runner(cfg)[0].run(tasks)

    res = R.rehearsal_sweep(run, ns=(0, 1, 2))
    assert runs == [("parallel", 0), ("parallel", 1), ("parallel", 2), ("sequential", 1), ("sequential", 2)]
    rows = {(r["mode"], r["n"]): r for r in res.rows}
    assert len(res.rows) == 6 and rows[("sequential", 0)]["score"] == rows[("parallel", 0)]["score"] == 0.0
    assert rows[("parallel", 1)]["score"] == 1.0 and rows[("parallel", 1)]["success_ci95"][1] == 1.0
    assert rows[("parallel", 0)]["extra_generated_tokens"] == 0
    assert rows[("sequential", 2)]["extra_generated_tokens"] > rows[("sequential", 1)]["extra_generated_tokens"] > 0
    data = json.loads(res.to_json())
    assert len(data["rows"]) == 6
    md = res.to_markdown()
    assert md.count("\n") == 8 and "| sequential | 2 | always: 100% | 2 | 1.000" in md
    assert "| parallel | 0 | - | 2 | 0.000" in md


def test_wilson_interval_by_hand():
    lo, hi = R.wilson_ci(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)


def test_score_interval_by_hand_and_clipped_to_unit_range():
    # [0, 1, 0.5, 0.5]: mean 0.5, sample sd 0.408248, half-width 1.96 * 0.408248 / 2
    lo, hi = mean_ci([0.0, 1.0, 0.5, 0.5])
    assert lo == pytest.approx(0.5 - 0.400083, abs=1e-5) and hi == pytest.approx(0.5 + 0.400083, abs=1e-5)
    # one 0.3 among 255 zeros: the normal interval would start below 0
    lo, hi = mean_ci([0.0] * 255 + [0.3])
    assert lo == 0.0 and 0.3 / 256 < hi < 0.01
    # one score has no spread to estimate
    assert all(math.isnan(x) for x in mean_ci([0.4]))
