"""Test-time private rehearsal: imagine N episodes, condense them into a memory, then act once for real.

Before the ONE committed execution of a task, the policy plays N imagined episodes in which REHEARSE
answers every tool call (``rollout.mode="rehearsal"``, or ``"simulator"`` with a separate simulator
client). No real tool is reachable from an imagined episode: ``ImaginedEngine`` refuses the ``real``
mode, gives every episode a ``NoToolEnvironment`` (which raises on any call) and raises if the real-tool
path is ever entered; it receives ``make_env`` only for the opt-in real reads below.

Modes. ``parallel``: the N rehearsals of every task are independent and run as ONE batched engine run
(N x tasks episodes). ``sequential``: rehearsal k runs with the memory of rehearsals 0..k-1 in its
context, so it can revise the plan; one engine run per k, batched over tasks.

What an imagined episode sees (honest by default). ``grounding="none"``: the imagined record keeps only
the user messages of the reference conversation, so REHEARSE's few-shot block holds no logged real
result (at test time the reference conversation is the answer key). ``grounding="reference"`` keeps the
reference's grounding (the training-time prompt; privileged, for ablations). ``user_turns="first"``
rehearses the first user turn only (later user messages are not known before they arrive);
``"all"`` replays every scripted user turn. The imagined turn judge only advances to the next user
turn: it reads no checklist and gives no reward, so nothing privileged reaches the memory.

Rehearsal memory (``memory="template"``, deterministic; ``build_template_memory``)::

    Rehearsal memory: 2 private rehearsals of this task. Their tool responses were imagined, not real.
    Avoid (calls that failed in rehearsal):
    - transfer({"amount":900,"from_account":"ana","to_account":"ben"}) -> {"error":"insufficient funds"}
    Plan that ran without errors (rehearsal 2):
    1. get_balance({"account":"ana"}) -> {"balance":40}
    Rehearsal 1: transfer(...) -> ERROR {...} | ended: simulator_error
    Rehearsal 2: get_balance(...) -> {...} | answered: Ana has 40.

Lines are added in that priority order (lessons first, then the per-rehearsal traces) until
``max_memory_chars`` would be exceeded.

When the memory is placed (``place_memory``). ``"always"`` (EnvACE): every committed run gets it.
``"on_mistake"``: only when a rehearsal caught a mistake of the policy's own, a call the tool schema
in the prompt rejects (``chat.call_schema``) or a malformed call; its "Avoid" list then holds those
calls only. Why: an imagined tool that refuses a call the schema accepts ("insufficient funds",
"slot taken") makes a claim about the world's state, which the one real call settles anyway, and an
imagined success is no evidence either; on the demo a memory in the prompt costs the small model
more in distraction than such claims are worth (docs/results.md, test-time rehearsal).

``"on_error"``: only when a rehearsal met a failure of any kind, an imagined refusal included, and then
the whole memory (as ``"always"``). Why: a policy trained to act on memories does what a memory suggests,
noise included, so where every rehearsal ran clean (nothing to avoid) its one real attempt is better left
as at N = 0, while an imagined refusal is exactly what a policy that has learned the rule from memories can
act on (docs/results.md, "A policy that can act on a memory").

``"on_tools"``: only when a rehearsal called one of ``memory_tools``, and then the whole memory. Why: an imagined
outcome that hangs on a number REHEARSE must guess (a balance, a limit compared with an amount) is a coin flip
the memory passes on, while a call whose effect is categorical and cannot be undone (closing an account: the
account and its money are gone) has consequences an imagined episode shows without knowing any number
(docs/results.md, "A third seed, and a gate on the irreversible call").

``memory="model"``: the policy itself condenses the template
text of all rehearsals so far with a summarisation prompt (``summary_messages``); an empty summary
falls back to the template. The memory is placed once, in the committed episode's initial messages
(``placement="system"``: appended to the system prompt; ``"note"``: an extra system message before the
first user message), so every later ACT prompt is the same incremental continuation as without it.

Real reads (``real_reads``, opt-in; empty by default, and then nothing above changes). REHEARSE cannot know
the world's state: it guesses a balance, and every outcome that depends on the guess is a coin flip, which
the memory then passes on (docs/results.md, "Test-time rehearsal checked on fresh test tasks and a second
seed"). ``real_reads`` names
tools that change nothing (a balance or a record looked up); an imagined episode's calls of those tools, made
before it first calls any other tool, run against its own fresh copy of the real environment
(``make_env(record)``, never the committed run's), so the rehearsal starts from the world as it is. From its
first call of another tool on, the world is the rehearsal's own and REHEARSE answers everything. Steps
answered for real are marked (``StepTrace.real``) and left out of the fidelity counts. This is no longer a
purely private rehearsal: it reads the real world, as the committed run would at its first step.

An upper bound (``rehearser="real"``). The rehearsals run in the real rollout engine, each against its own fresh
copy of the real environment (``make_env(record)``), and the memory says where its responses came from. Nothing
is imagined, so the gap between this and the imagined rehearsal at the same N is what imagination costs, and the
gap between this and N = 0 what a memory of the task can be worth at best. Its steps are marked real and left out
of the fidelity counts.

Budget knobs: ``n``, ``max_tokens_per_rehearsal`` (generated tokens of one imagined episode, ACT +
REHEARSE; each generation is capped at it and an episode that reaches it is ended as
``length_budget`` after the step that crossed it), ``max_memory_chars``. Extra tokens spent (prompt
and generated, rehearsals plus summaries) are counted per task.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any, Callable, Mapping, Sequence

from envace_jax.chat.call_schema import call_problem
from envace_jax.chat.simulator import is_failed_result
from envace_jax.chat.tool_parser import split_assistant_text, strip_think
from envace_jax.eval import progress
from envace_jax.eval.config import MEMORY_GATES, MEMORY_KINDS, PLACEMENTS, RehearsalConfig  # noqa: F401 (re-exported)
from envace_jax.eval.config import REHEARSAL_MODES as MODES  # noqa: F401 (re-exported)
from envace_jax.eval.imagined_engine import REAL_READ_KEY, ImaginedEngine, advance_judge
from envace_jax.eval.rehearsal_grid import SweepResult, rehearsal_sweep, summarize_run  # noqa: F401 (re-exported)
from envace_jax.eval.results import wilson_ci  # noqa: F401 (re-exported: eval.rehearsal has always given it)
from envace_jax.rl.policy_client import GenRequest
from envace_jax.rl.rollout import RolloutConfig, RolloutEngine
from envace_jax.rl.types import ACT, Episode, State

MEMORY_HEADER = "Rehearsal memory"
_RESPONSE_CHARS = 160


# ----------------------------------------------------------------------------- imagined episodes


def imagined_record(record: Mapping[str, Any], cfg: RehearsalConfig, memory: str = "") -> dict[str, Any]:
    """The record an imagined episode plays: grounding and user turns per ``cfg``, memory placed."""
    ref = list(record.get("reference_messages") or [])
    if cfg.user_turns == "first":
        users = [i for i, m in enumerate(ref) if m.get("role") == "user"]
        if len(users) > 1:
            ref = ref[: users[1]]
    if cfg.grounding == "none":
        ref = [dict(m) for m in ref if m.get("role") == "user"]
    if not ref:  # a record without a reference conversation still plays its first user message
        ref = [dict(m) for m in record["messages"] if m.get("role") == "user"][:1]
    out = dict(record, reference_messages=ref)
    n_turns = max(1, sum(m.get("role") == "user" for m in ref))
    # the imagined judge ignores the checklist, but the engine ends an episode that has none
    out["checklist"] = [[[{"imagined": True}] for _ in range(n_turns)]]
    return with_memory(out, memory, cfg.placement) if memory else out


def with_memory(record: Mapping[str, Any], memory: str, placement: str = "system") -> dict[str, Any]:
    """A copy of ``record`` whose initial ``messages`` carry ``memory``."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    msgs = [dict(m) for m in record["messages"]]
    if placement == "system" and msgs and msgs[0].get("role") == "system":
        msgs[0]["content"] = (msgs[0].get("content") or "") + "\n\n" + memory
    else:
        at = next((i for i, m in enumerate(msgs) if m.get("role") == "user"), len(msgs))
        msgs.insert(at, {"role": "system", "content": memory})
    return dict(record, messages=msgs)


# ----------------------------------------------------------------------------- traces and memory


@dataclasses.dataclass
class StepTrace:
    turn: int
    name: str
    arguments: Any
    response: str
    error: bool
    problem: str | None = None  # why the tool schema rejects the call (None: it matches)
    real: bool = False  # answered by a real read (``real_reads``), not imagined


@dataclasses.dataclass
class RehearsalTrace:
    """What one imagined episode did, in the memory's terms."""

    index: int  # 1-based rehearsal number
    steps: list[StepTrace]
    final_answer: str | None  # the last tool-free reply (think stripped)
    termination: str
    malformed_call: str | None  # the parse error text when ACT wrote a broken call


def trace_of(ep: Episode, index: int, start: int) -> RehearsalTrace:
    """``start``: number of initial messages (before anything the episode generated)."""
    steps: list[StepTrace] = []
    tools = (ep.record or {}).get("tools") or []
    final, malformed, turn = None, None, 0
    msgs = ep.messages
    for i in range(start, len(msgs)):
        m = msgs[i]
        if m.get("role") == "user":
            turn += 1
        elif m.get("role") == "assistant":
            calls = m.get("tool_calls") or []
            if not calls:
                final = strip_think(m.get("content") or "").strip()
            answers = {t.get("tool_call_id"): t for t in msgs[i + 1 : i + 1 + len(calls)] if t.get("role") == "tool"}
            for c in calls:
                fn = c["function"]
                if c["id"] in answers:
                    resp = answers[c["id"]].get("content", "")
                    steps.append(
                        StepTrace(
                            turn,
                            fn["name"],
                            fn["arguments"],
                            resp,
                            is_failed_result(resp),
                            call_problem(fn["name"], fn["arguments"], tools),
                            bool(answers[c["id"]].get(REAL_READ_KEY)),
                        )
                    )
        elif m.get("role") == "tool" and m.get("name") == "error_tool_call" and "tool_call_id" not in m:
            malformed = str(m.get("content", ""))
    return RehearsalTrace(index, steps, final, ep.termination or "", malformed)


def call_text(name: str, args: Any) -> str:
    """A call as the memory writes it, ``name({...})`` with sorted keys: also the identity of a call (the same
    call twice is the same text)."""
    return f"{name}({json.dumps(args, sort_keys=True, separators=(',', ':'), ensure_ascii=False)})"


def _short(text: str, n: int = _RESPONSE_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _best(traces: Sequence[RehearsalTrace]) -> RehearsalTrace | None:
    clean = [t for t in traces if t.steps and not any(s.error for s in t.steps) and not t.malformed_call]
    if not clean:
        return None
    return min(clean, key=lambda t: (t.final_answer is None, len(t.steps), -t.index))


def caught_mistake(traces: Sequence[RehearsalTrace]) -> bool:
    """Did a rehearsal write a call the tool schema rejects, or a malformed call?"""
    return any(t.malformed_call for t in traces) or any(s.problem for t in traces for s in t.steps)


def caught_error(traces: Sequence[RehearsalTrace]) -> bool:
    """Did a rehearsal meet any failure: an imagined error or refusal, or a mistake ``caught_mistake`` sees?"""
    return caught_mistake(traces) or any(s.error for t in traces for s in t.steps)


def called_any(traces: Sequence[RehearsalTrace], tools: Sequence[str]) -> bool:
    """Did a rehearsal call one of ``tools`` (whatever the imagined response)?"""
    return any(s.name in tools for t in traces for s in t.steps)


def memory_wanted(gate: str, traces: Sequence[RehearsalTrace], memory_tools: Sequence[str] = ()) -> bool:
    """Does the memory reach the committed run under ``place_memory=gate`` (the module doc says why each)?"""
    if gate == "on_mistake":
        return caught_mistake(traces)
    if gate == "on_error":
        return caught_error(traces)
    if gate == "on_tools":
        return called_any(traces, memory_tools)
    return True  # "always"


def build_template_memory(
    traces: Sequence[RehearsalTrace], max_chars: int, *, mistakes_only: bool = False, real: bool = False
) -> str:
    """The deterministic rehearsal memory (format in the module doc), at most ``max_chars`` long.
    ``mistakes_only``: "Avoid" lists the calls the tool schema rejects, not every imagined failure. ``real``: the
    rehearsals ran against a private copy of the real environment (``rehearser="real"``), and the memory says so."""
    if not traces:
        return ""
    where = (
        "Their tool responses came from a private copy of the real environment, which the real attempt starts afresh."
        if real
        else "Their tool responses were imagined, not real."
    )
    lines = [f"{MEMORY_HEADER}: {len(traces)} private rehearsal{'s' if len(traces) != 1 else ''} of this task. {where}"]
    seen: set[str] = set()
    avoid = []
    for t in traces:
        for s in t.steps:
            key = call_text(s.name, s.arguments)
            if (s.problem if mistakes_only else s.error) and key not in seen:
                seen.add(key)
                why = f"the tool schema rejects it: {s.problem}" if mistakes_only else _short(s.response)
                avoid.append(f"- {key} -> {_short(why)}")
    if avoid:
        lines += ["Avoid (calls that failed in rehearsal):"] + avoid
    if any(t.malformed_call for t in traces):
        lines.append(
            'A rehearsal wrote a malformed tool call; write each call as <tool_call>{"name": ..., '
            '"arguments": {...}}</tool_call>.'
        )
    best = _best(traces)
    if best is not None:
        lines.append(f"Plan that ran without errors (rehearsal {best.index}):")
        lines += [f"{k}. {call_text(s.name, s.arguments)} -> {_short(s.response)}" for k, s in enumerate(best.steps, 1)]
    elif not avoid:
        lines.append("No rehearsal made a tool call.")
    for t in traces:
        parts = [
            f"{call_text(s.name, s.arguments)} -> {'ERROR ' if s.error else ''}{_short(s.response, 80)}"
            for s in t.steps
        ]
        if t.final_answer is not None and t.final_answer:
            ending = f"answered: {_short(t.final_answer, 120)}"
        else:
            ending = f"ended: {t.termination}"
        lines.append(f"Rehearsal {t.index}: " + "; ".join(parts + [ending]))
    out = ""
    for line in lines:
        nxt = line if not out else out + "\n" + line
        if len(nxt) > max_chars:
            room = max_chars - len(out) - (1 if out else 0)
            if room > 20:
                out = (out + "\n" if out else "") + line[: room - 3] + "..."
            break
        out = nxt
    return out


SUMMARY_SYSTEM = (
    "You privately rehearsed a tool-use task; the tool responses in those rehearsals were imagined "
    "by you, not real. Write a short memory for your one real attempt: the calls to make, in "
    "order, with their arguments; which calls failed and why; what to do differently. "
    "Plain text, no tool calls, at most {chars} characters."
)


def summary_messages(record: Mapping[str, Any], traces: Sequence[RehearsalTrace], max_chars: int) -> list[dict]:
    """The summarisation prompt of ``memory="model"``: the task's first user message and the template
    text of every rehearsal so far (given four times the memory budget)."""
    user = next((m.get("content", "") for m in record["messages"] if m.get("role") == "user"), "")
    trace_text = build_template_memory(traces, 4 * max_chars)
    return [
        {"role": "system", "content": SUMMARY_SYSTEM.format(chars=max_chars)},
        {"role": "user", "content": f"Task:\n{user}\n\nRehearsals:\n{trace_text}"},
    ]


def _clean_summary(text: str, max_chars: int) -> str:
    body = split_assistant_text(strip_think(text)).strip()
    if not body:
        return ""
    body = f"{MEMORY_HEADER} (condensed by the policy; rehearsed tool responses were imagined):\n{body}"
    return body if len(body) <= max_chars else body[: max_chars - 3] + "..."


# ----------------------------------------------------------------------------- runner


@dataclasses.dataclass
class TaskRehearsal:
    uid: str
    memory: str
    traces: list[RehearsalTrace]
    memories: list[str]  # memory after each rehearsal round (sequential) or once (parallel)
    generated_tokens: int = 0  # extra tokens generated (imagined ACT + REHEARSE + summaries)
    prompt_tokens: int = 0  # extra prompt tokens fed to the policy for them
    imagined: list[Episode] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class RehearsalRun:
    config: RehearsalConfig
    committed: list[Episode]
    rehearsals: list[TaskRehearsal]

    @property
    def scores(self) -> list[float]:
        return [e.score for e in self.committed]


class TestTimeRehearsal:
    """Rehearse (imagined, no real tool), condense into memory, then the committed real run.

    ``rollout_cfg`` is the committed run's config (its mode is forced to ``real``); imagined runs use
    the same sampling with mode ``rehearsal`` (``simulator`` when a simulator client is given).
    ``judge`` scores the committed run only; ``make_env`` is used for the committed run only.
    """

    __test__ = False  # not a pytest class, despite the name

    def __init__(
        self,
        cfg: RehearsalConfig,
        rollout_cfg: RolloutConfig,
        codec,
        policy,
        judge,
        make_env: Callable[[dict], Any],
        *,
        simulator=None,
        imagined_judge=advance_judge,
        episode_bar: progress.EpisodeBar | None = None,
        stage_lines: bool = False,
    ):
        self.cfg, self.codec, self.policy, self.judge, self.make_env = cfg, codec, policy, judge, make_env
        self.simulator, self.imagined_judge = simulator, imagined_judge
        self.episode_bar = episode_bar  # advanced as the committed run's episodes end
        self.stage_lines = stage_lines  # a line with seconds per imagined round (eval.progress.stage)
        self.real_cfg = dataclasses.replace(rollout_cfg, mode="real")
        cap = cfg.max_tokens_per_rehearsal
        temp = {} if cfg.temperature is None else {"temperature": float(cfg.temperature)}
        self.imagined_cfg = dataclasses.replace(
            rollout_cfg,
            mode="simulator" if simulator is not None else "rehearsal",
            act=dataclasses.replace(rollout_cfg.act, max_new_tokens=min(rollout_cfg.act.max_new_tokens, cap), **temp),
            rehearse=dataclasses.replace(
                rollout_cfg.rehearse, max_new_tokens=min(rollout_cfg.rehearse.max_new_tokens, cap), **temp
            ),
        )
        self.imagined_engines: list[ImaginedEngine] = []

    # ---------------------------------------------------------------- imagined runs
    def _budget_hook(self, step: int, episodes: list[Episode]) -> None:
        for e in episodes:
            if not e.done and sum(len(g.gen_ids) for g in e.generations) >= self.cfg.max_tokens_per_rehearsal:
                e.state, e.termination = State.TERMINATED, "length_budget"

    def _engine(self, cfg: RolloutConfig, on_step) -> RolloutEngine:
        """The engine of one rehearsal round: imagined (REHEARSE answers), or, with ``rehearser="real"``, the real
        rollout engine on a private environment per episode (``make_env``, never the committed run's)."""
        if self.cfg.rehearser == "real":
            return RolloutEngine(
                dataclasses.replace(cfg, mode="real"),
                self.codec,
                self.policy,
                self.imagined_judge,
                make_env=self.make_env,
                on_step=on_step,
            )
        return ImaginedEngine(
            cfg,
            self.codec,
            self.policy,
            self.imagined_judge,
            simulator=self.simulator,
            on_step=on_step,
            real_reads=self.cfg.real_reads,
            make_env=self.make_env if self.cfg.real_reads else None,
        )

    def _imagine(self, records: list[dict], uids: list[str], round_: int) -> list[Episode]:
        cfg = dataclasses.replace(self.imagined_cfg, seed=self.imagined_cfg.seed + 7919 * (round_ + 1) + self.cfg.seed)
        rounds = 1 if self.cfg.mode == "parallel" else self.cfg.n
        kind = "real-environment" if self.cfg.rehearser == "real" else "imagined"
        what = f"rehearsal round {round_ + 1}/{rounds}: {len(records)} {kind} episodes"
        # a round of thousands of imagined episodes takes minutes: with stage lines, a bar over its episodes
        bar = progress.EpisodeBar(len(records), f"rehearsal round {round_ + 1}/{rounds}") if self.stage_lines else None

        def on_step(step: int, episodes: list[Episode]) -> None:
            self._budget_hook(step, episodes)
            if bar is not None:
                bar.on_step(step, episodes)

        engine = self._engine(cfg, on_step)
        self.imagined_engines.append(engine)
        with progress.stage(what) if self.stage_lines else contextlib.nullcontext(), bar or contextlib.nullcontext():
            if bar is not None:
                bar.start()  # shown from the round's start, so its rate counts the round
            episodes = engine.run(records, uids)
            if bar is not None:
                bar.on_step(-1, episodes)  # episodes cut at the step cap end after the engine's last hook
            return episodes

    def _memory(self, record: Mapping[str, Any], traces: list[RehearsalTrace], out: TaskRehearsal) -> str:
        if not memory_wanted(self.cfg.place_memory, traces, self.cfg.memory_tools):
            return ""
        mistakes_only = self.cfg.place_memory == "on_mistake"
        real = self.cfg.rehearser == "real"
        template = build_template_memory(traces, self.cfg.max_memory_chars, mistakes_only=mistakes_only, real=real)
        if self.cfg.memory == "template":
            return template
        prompt = self.codec.caller_prompt(summary_messages(record, traces, self.cfg.max_memory_chars), [])
        gen = self.policy.generate([GenRequest(prompt, ACT, self.cfg.summary, self.cfg.seed)])[0]
        out.prompt_tokens += len(prompt)
        out.generated_tokens += len(gen.ids)
        return _clean_summary(self.codec.decode(list(gen.ids)), self.cfg.max_memory_chars) or template

    def _trace(self, ep: Episode, index: int, start: int) -> RehearsalTrace:
        trace = trace_of(ep, index, start)
        if self.cfg.rehearser == "real":  # every step ran on the private environment: nothing was imagined
            for s in trace.steps:
                s.real = True
        return trace

    @staticmethod
    def _account(out: TaskRehearsal, ep: Episode) -> None:
        out.imagined.append(ep)
        for g in ep.generations:
            out.generated_tokens += len(g.gen_ids)
            out.prompt_tokens += len(g.prompt_ids)

    def rehearse(self, records: Sequence[dict]) -> list[TaskRehearsal]:
        """N imagined episodes per record and the resulting memory (empty when ``n == 0``)."""
        cfg, n = self.cfg, self.cfg.n
        outs = [TaskRehearsal(str(r.get("uid", i)), "", [], []) for i, r in enumerate(records)]
        if n == 0 or not records:
            return outs
        starts = [len(r["messages"]) for r in records]
        if cfg.mode == "parallel":
            base = [imagined_record(r, cfg) for r in records]
            eps = self._imagine(
                [b for b in base for _ in range(n)], [f"{o.uid}#rehearsal{k + 1}" for o in outs for k in range(n)], 0
            )
            for t, out in enumerate(outs):
                for k in range(n):
                    ep = eps[t * n + k]
                    self._account(out, ep)
                    out.traces.append(self._trace(ep, k + 1, starts[t]))
                out.memory = self._memory(records[t], out.traces, out)
                out.memories.append(out.memory)
            return outs
        for k in range(n):
            recs = [imagined_record(r, cfg, o.memory) for r, o in zip(records, outs)]
            eps = self._imagine(recs, [f"{o.uid}#rehearsal{k + 1}" for o in outs], k)
            for t, (out, ep) in enumerate(zip(outs, eps)):
                self._account(out, ep)
                out.traces.append(self._trace(ep, k + 1, len(recs[t]["messages"])))
                out.memory = self._memory(records[t], out.traces, out)
                out.memories.append(out.memory)
        return outs

    # ---------------------------------------------------------------- committed run
    def run(self, records: Sequence[dict]) -> RehearsalRun:
        records = list(records)
        rehearsals = self.rehearse(records)
        committed = [
            with_memory(r, o.memory, self.cfg.placement) if o.memory else r for r, o in zip(records, rehearsals)
        ]
        bar = self.episode_bar
        engine = RolloutEngine(
            self.real_cfg,
            self.codec,
            self.policy,
            self.judge,
            make_env=self.make_env,
            on_step=None if bar is None else bar.on_step,
        )
        if bar is not None:
            bar.start()
        episodes = engine.run(committed, [o.uid for o in rehearsals])
        if bar is not None:
            bar.on_step(-1, episodes)  # episodes cut at the step cap end after the engine's last hook
        return RehearsalRun(self.cfg, episodes, rehearsals)


def rehearsal_record(t: TaskRehearsal) -> dict[str, Any]:
    """One task's rehearsals as a JSON-ready record: the memory placed ("" when none) and every trace whole
    (``RehearsalTrace`` and its ``StepTrace`` fields: each call with the imagined response, whether it failed
    and why the schema rejects it, whether a real read answered it, and how the episode ended)."""
    return {
        "uid": t.uid,
        "memory_placed": bool(t.memory),
        "memory": t.memory,
        "rehearsals": [dataclasses.asdict(tr) for tr in t.traces],
    }


def rehearsal_from_record(record: Mapping[str, Any]) -> TaskRehearsal:
    """The ``TaskRehearsal`` a ``rehearsal_record`` was written from (its memory and traces; the token counts
    and imagined episodes are not in the record). Records written before the traces carried their ``index``
    and each step its ``turn`` read them as the trace's position and 0."""
    traces = []
    for i, tr in enumerate(record["rehearsals"], start=1):
        steps = [StepTrace(**{"turn": 0, **st}) for st in tr["steps"]]
        traces.append(RehearsalTrace(**{"index": i, **tr, "steps": steps}))
    return TaskRehearsal(str(record["uid"]), record["memory"] if record.get("memory_placed", True) else "", traces, [])
