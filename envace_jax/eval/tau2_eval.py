"""tau2-bench evaluation (airline, retail, telecom) with tau2's own offline evaluator.

``policy=oracle``: each task's golden actions run for real and a closing reply states the
``communicate_info`` strings (``envs.tau2.golden_messages``); tau2's ``evaluate_simulation`` scores it.

``policy=model``: our policy is the agent (system prompt = the domain policy, tools = the domain's
agent tools, every call executed in ``Tau2Env``). The user is either

* ``user="model"``: a local model through our sampler, prompted with tau2's own user-simulator system
  prompt (tau2's guidelines + the task's scenario, built by ``tau2.user.user_simulator.UserSimulator``);
  it sees the dialogue with roles flipped, and ends it by writing one of tau2's stop tokens; or
* ``user="scripted"`` (CI): an opening message made of the scenario's reason for call and known info, then the
  task's known user actions as the agent's own actions allow them, then tau2's stop token
  (``eval.tau2_user_side.ScriptedUser``). It cannot answer follow-up questions, so it understates what a model
  could do; it exists to run the agent side offline.

Telecom users act on their own phone through user-side tools: both user kinds call them (the model user is given
their schemas), routed as tau2's orchestrator routes them (``eval.tau2_user_side``): the user sees the results,
the agent does not, and tau2's evaluator grades the whole trajectory. Termination follows tau2: a user stop token
ends the run as ``user_stop``; the step cap as ``max_steps`` (which tau2 scores 0).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Sequence

from envace_jax.chat.tool_parser import strip_think
from envace_jax.envs import tau2 as T
from envace_jax.eval import progress
from envace_jax.eval.config import Tau2Config  # the suite's knobs live with every eval knob
from envace_jax.eval.harness import LENGTH_BUDGET, Agent, AgentTurn, Conversation, number_calls, parse_turn
from envace_jax.eval.results import CategoryResult, EntryResult, is_success
from envace_jax.eval.tau2_user_side import ScriptedUser, run_user_calls

GREETING = "Hi! How can I help you today?"  # tau2's orchestrator opens with the agent's greeting too


def _stop_tokens() -> tuple[str, ...]:
    from tau2.user.base import OUT_OF_SCOPE, STOP, TRANSFER

    return (STOP, TRANSFER, OUT_OF_SCOPE)


def user_system_prompt(task: Any, user_tools: Sequence[Any] | None = None) -> str:
    """tau2's own user-simulator system prompt for ``task`` (its guidelines plus the scenario); with the user's
    tools (telecom's phone), tau2's guidelines for a user who acts through tools."""
    from tau2.user.user_simulator import UserSimulator

    tools = list(user_tools) if user_tools else None
    return UserSimulator(tools=tools, instructions=task.user_scenario.instructions, llm=None).system_prompt


def scripted_opening(task: Any) -> str:
    ins = task.user_scenario.instructions
    if isinstance(ins, str):
        return ins
    parts = [getattr(ins, "reason_for_call", None), getattr(ins, "known_info", None)]
    return "\n".join(p.strip() for p in parts if p and p.strip()) or "I need help."


# ----------------------------------------------------------------------------- oracle


def evaluate_oracle(domain: str, tasks: Sequence[Any]) -> CategoryResult:
    env = T.Tau2Env(domain)
    rows = []
    for task in tasks:
        msgs = T.golden_messages(domain, task, env=env)
        res = T.evaluate(domain, task, msgs)
        rows.append(
            _row(task, res, {"calls": sum(len(m.get("tool_calls") or []) for m in msgs if m["role"] == "assistant")})
        )
    return CategoryResult(domain, rows, _means(rows))


def _row(task: Any, res: dict[str, Any], detail: dict[str, Any]) -> EntryResult:
    reward = float(res["reward"])
    info = res.get("reward_info") or {}
    detail = dict(detail, reward=reward, reward_breakdown=info.get("reward_breakdown"))
    ok = is_success(reward)
    return EntryResult(str(task.id), ok, None if ok else "reward_below_1", detail)


def _means(rows: Sequence[EntryResult]) -> dict[str, Any]:
    n = max(1, len(rows))
    return {
        "reward_mean": sum(r.detail.get("reward", 0.0) for r in rows) / n,
        "calls_mean": sum(r.detail.get("calls", 0) for r in rows) / n,
    }


# ----------------------------------------------------------------------------- live episodes


@dataclasses.dataclass
class _Episode:
    task: Any
    env: T.Tau2Env
    agent: Conversation  # the agent's view
    user: Conversation  # the user's view (roles flipped)
    graded: list  # the trajectory tau2 grades: the agent's view plus the user's own tool calls
    scripted: ScriptedUser | None = None
    user_results: list = dataclasses.field(default_factory=list)  # tool results the scripted user has not seen
    phase: str = "user"
    steps: int = 0
    calls: int = 0
    done: bool = False
    termination: str = ""
    agent_turns: int = 0
    generated_tokens: int = 0  # the agent's
    prompt_tokens: int = 0
    # every agent call that ran: (name, arguments, response, failed), for comparing rehearsals with the real run
    real_calls: list = dataclasses.field(default_factory=list)


def _start(domain: str, task: Any, k: int, scripted_user: bool = False) -> _Episode:
    env = T.Tau2Env(domain, task)
    phone = env.environment.get_user_tools() if env.user_tool_schemas else None
    agent = Conversation(
        key=f"tau2/{domain}/{task.id}/agent/{k}",
        messages=[{"role": "system", "content": env.policy}, {"role": "assistant", "content": GREETING}],
        tools=env.tool_schemas,
    )
    user = Conversation(
        key=f"tau2/{domain}/{task.id}/user/{k}",
        messages=[
            {"role": "system", "content": user_system_prompt(task, phone)},
            {"role": "user", "content": GREETING},
        ],
        tools=env.user_tool_schemas,  # telecom's phone; none in airline and retail
    )
    scripted = ScriptedUser(task, scripted_opening(task), _stop_tokens()[0]) if scripted_user else None
    return _Episode(task, env, agent, user, copy.deepcopy(agent.messages), scripted)


def _on_agent(ep: _Episode, out: AgentTurn) -> None:
    ep.steps += 1
    ep.agent_turns += 1
    ep.generated_tokens += out.generated_tokens
    ep.prompt_tokens += out.prompt_tokens
    if out.finish_reason == LENGTH_BUDGET:
        ep.done, ep.termination = True, "max_steps"
        return
    msg, calls, error = parse_turn(out.text)
    number_calls(msg, f"call_{ep.steps}")
    _log(ep, msg)
    if calls and error is None:
        for (name, args), tc in zip(calls, msg["tool_calls"]):
            res = ep.env.execute(name, copy.deepcopy(args))  # the env must not alias our record
            ep.real_calls.append((name, copy.deepcopy(args), res.content, bool(res.error)))
            _log(
                ep, {"role": "tool", "name": name, "tool_call_id": tc["id"], "content": res.content, "error": res.error}
            )
        ep.calls += len(calls)
        return
    # A reply (or an unparsable call, which tau2 would also show the user as text) goes to the user.
    ep.user.messages.append({"role": "user", "content": strip_think(msg["content"]).strip()})
    ep.phase = "user"


def _log(ep: _Episode, msg: dict[str, Any]) -> None:
    """A message of the agent's view, which the graded trajectory holds too."""
    ep.agent.messages.append(msg)
    ep.graded.append(copy.deepcopy(msg))


def _on_user(ep: _Episode, text: str) -> None:
    ep.steps += 1
    if ep.user.tools:  # the user may act on its phone: a turn of tool calls stays with the user
        msg, calls, error = parse_turn(text)
        if calls and error is None:
            number_calls(msg, f"user_call_{ep.steps}")
            ep.user_results = run_user_calls(ep.env, ep.user.messages, ep.graded, msg, calls)
            return
    text = strip_think(text).strip()
    if any(s in text for s in _stop_tokens()):
        ep.done, ep.termination = True, "user_stop"
        return
    _log(ep, {"role": "user", "content": text})
    ep.user.messages.append({"role": "assistant", "content": text})
    ep.phase = "agent"


def _scripted_user(ep: _Episode) -> str:
    results, ep.user_results = ep.user_results, []
    return ep.scripted.turn(ep.graded, results)


def play(
    domain: str,
    tasks: Sequence[Any],
    agent: Agent,
    cfg: Tau2Config,
    user_agent: Agent | None = None,
    before_first_act: Callable[[list[_Episode]], None] | None = None,
) -> list[_Episode]:
    """Plays ``tasks`` in groups of ``cfg.batch_size``. ``before_first_act(episodes)`` is called with the episodes
    whose agent is about to write its first turn (the user has stated the task), and may change their
    ``agent.messages`` (test-time rehearsal places its memory there: ``eval.benchmark_rehearsal``)."""
    if cfg.user == "model" and user_agent is None:
        raise ValueError("config.tau2.user='model' needs a user model (config.tau2.user_model_path or the policy)")
    out: list[_Episode] = []
    bar = progress.EpisodeBar(len(tasks), f"tau2 {domain}")  # counts the tasks played to their end
    bar.start()
    for lo in range(0, len(tasks), cfg.batch_size):
        group = [
            _start(domain, t, lo + i, cfg.user == "scripted") for i, t in enumerate(tasks[lo : lo + cfg.batch_size])
        ]
        while True:
            for ep in group:
                if not ep.done and ep.steps >= cfg.max_steps:
                    ep.done, ep.termination = True, "max_steps"
            live = [ep for ep in group if not ep.done]
            if not live:
                break
            acting = [ep for ep in live if ep.phase == "agent"]
            talking = [ep for ep in live if ep.phase == "user"]
            if acting:
                first = [ep for ep in acting if ep.agent_turns == 0]
                if first and before_first_act is not None:
                    before_first_act(first)
                for ep, o in zip(acting, agent.act([ep.agent for ep in acting])):
                    _on_agent(ep, o)
            if talking:
                if cfg.user == "scripted":
                    texts = [_scripted_user(ep) for ep in talking]
                else:
                    outs = user_agent.act([ep.user for ep in talking])
                    texts = [o.text if o.finish_reason != LENGTH_BUDGET else _stop_tokens()[0] for o in outs]
                for ep, text in zip(talking, texts):
                    _on_user(ep, text)
            ended = [ep for ep in live if ep.done]
            if ended:
                agent.release([ep.agent.key for ep in ended])
                if user_agent is not None:
                    user_agent.release([ep.user.key for ep in ended])
            bar.on_step(0, out + group)
        out.extend(group)
        bar.on_step(0, out)  # the group's last episodes may have been cut at max_steps just above
    bar.close()
    return out


def evaluate_model(
    domain: str, tasks: Sequence[Any], agent: Agent, cfg: Tau2Config, user_agent: Agent | None = None
) -> CategoryResult:
    return score_episodes(domain, play(domain, tasks, agent, cfg, user_agent))


def score_episodes(domain: str, episodes: Sequence[_Episode]) -> CategoryResult:
    """tau2's evaluator on played episodes (``play``), one row per task."""
    rows = []
    for ep in episodes:
        user_calls = sum(len(m.get("tool_calls") or []) for m in ep.graded if m.get("role") == "user")
        detail = {"termination": ep.termination, "steps": ep.steps, "calls": ep.calls, "user_calls": user_calls}
        try:
            res = T.evaluate(domain, ep.task, ep.graded, termination=ep.termination)
        except Exception as e:  # tau2 rejects trajectories it cannot replay; that is a failed run, not a crash
            rows.append(
                EntryResult(
                    str(ep.task.id),
                    False,
                    "evaluation_error",
                    dict(detail, reward=0.0, error=f"{type(e).__name__}: {e}"[:500]),
                )
            )
            continue
        rows.append(_row(ep.task, res, detail))
    return CategoryResult(domain, rows, _means(rows))


def evaluate(agent: Agent | str, cfg: Tau2Config, user_agent: Agent | None = None) -> list[CategoryResult]:
    out = []
    for domain in cfg.domains:
        with progress.stage(f"tau2 {domain}"):
            tasks = T.load_tasks(domain, cfg.split)
            if cfg.limit:
                tasks = tasks[: cfg.limit]
            if agent == "oracle":
                out.append(evaluate_oracle(domain, tasks))
            else:
                out.append(evaluate_model(domain, tasks, agent, cfg, user_agent))
    return out
