"""The batched ACT/REHEARSE episode engine (spec section 2).

Each episode follows the reference's state machine (spec 2.3):

    AWAIT_CALLER --(ACT: tool calls)--> AWAIT_SIMULATOR --(all calls answered)--> AWAIT_CALLER
    AWAIT_CALLER --(ACT: final answer)--> INTERACTING --(judge)--> AWAIT_CALLER (next user turn) | TERMINATED

At every micro-step the engine gathers *all* pending ACT generations and all pending REHEARSE
generations of every live episode into ONE call to the policy client (both roles share the weights,
so they share the batch), then routes the results back. The engine is text/ids only: a ``ChatCodec``
turns messages into token ids (incrementally for the caller, so the next ACT prompt extends the previous
prompt + generated ids and the client can continue its KV cache, see ``policy_client.SamplerClient``),
and a ``PolicyClient`` generates.

Modes (``RolloutConfig.mode``; ``TRAINED_ROLES`` says which rows the trainer updates and with which model):

* ``rehearsal`` (EnvACE): the policy plays ACT and REHEARSE; one client call per step mixes both roles.
  Both roles' rows train the one policy.
* ``caller_frozen``: rollouts exactly as ``rehearsal``; the trainer updates on REHEARSE rows only (the
  ACT rows still exist, for metrics).
* ``simulator``: a separate frozen client plays REHEARSE; each step makes one call per client.
  Only ACT rows train.
* ``noshare``: routed as ``simulator``, but both clients are trained, each on its own role's rows
  (the trainer holds the two policies; the engine only routes).
* ``real``: no REHEARSE; tool calls run against ``make_env(record)`` (a ``ToolEnvironment``) in the same
  step as the ACT turn that made them. Only ACT rows train (the standard-GRPO baseline).

Termination (``types.TERMINATION_REASONS``), as the reference:
parse error (an ``error_tool_call`` tool message is appended); a tool response that is an
``error_tool_call`` JSON dict (a rehearsed format slip or validation verdict; a real tool's ordinary
error reply, e.g. ``{"error": ...}``, is just a response the caller reads); the length budget
``len(caller ids) + act.max_new_tokens >= max_model_len`` at reset and on every return to AWAIT_CALLER;
the judge's terminate (completed / required item failed / judge API failure); turn caps, checked only
when a user turn ends; the micro-step cap; an empty checklist at reset. Our addition: a client that
reports ``finish_reason == "cache_full"`` with no tokens (the context did not fit the sampler's cache)
ends the episode as ``length_budget`` and records no row, instead of reading an empty answer.

Multiple calls of one assistant turn are simulated one per micro-step (``sequential_simulation``,
faithful) or all in one step; either way each REHEARSE prompt sees the history without its siblings'
results, and the tool messages are appended only when every call of the turn is answered.

Judging streams with ``rollout.judge_streaming="on"`` (``rl.judge_stream``): a turn that ends goes to the judge
at once and its verdict is applied after the next sampler call, while the other episodes generate; an episode
then counts its own micro-steps (seeds and the step cap), as the rolling batch does. Off, every ended turn is
judged before the next call, as in the reference.

``cancel`` (a ``threading.Event``): a rollout running on a thread of its own (``rl.async_pipeline``) stops at
its next micro-step once it is set, raising ``RolloutCancelled``. ``timing`` holds the seconds the last ``run``
spent generating and waiting for verdicts; ``on_interval(kind, t0, t1)``, when set, sees each such span.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Any, Callable, Protocol, Sequence

from envace_jax.chat.simulator import is_error_result
from envace_jax.chat.tool_parser import make_assistant_message
from envace_jax.config import MODES, RoleSampling, RolloutConfig  # noqa: F401  (defined with every other knob)
from envace_jax.rl.judge_stream import JudgeStream
from envace_jax.rl.rollout_rolling import run_rolling
from envace_jax.rl.policy_client import GenOutput, GenRequest, PolicyClient  # re-exported
from envace_jax.rl.types import ACT, REHEARSE, ROLES, Episode, Generation, State

# mode -> {role: which client's model the trainer updates with that role's rows}
TRAINED_ROLES: dict[str, dict[str, str]] = {
    "rehearsal": {ACT: "policy", REHEARSE: "policy"},
    "caller_frozen": {REHEARSE: "policy"},
    "simulator": {ACT: "policy"},
    "noshare": {ACT: "policy", REHEARSE: "simulator"},
    "real": {ACT: "policy"},
}


class RolloutCancelled(RuntimeError):
    """A rollout stopped by its engine's ``cancel`` event (its episodes are incomplete and must not train)."""


class ChatCodec(Protocol):
    """Renders chat pieces to token ids (Qwen3 chat format) and parses model text."""

    def caller_prompt(self, messages: list[dict], tools: list[dict]) -> list[int]: ...

    def close_assistant(self, gen_ids: list[int]) -> list[int]:
        """Ids to append after a sampled assistant turn so the context is a closed turn."""

    def tool_block(self, tool_messages: list[dict]) -> list[int]:
        """Tool-response turn plus the next generation prompt."""

    def user_block(self, message: dict) -> list[int]:
        """A user turn plus the next generation prompt."""

    def simulator_prompt(
        self, record: dict, history: list[dict], caller_text: str, call: tuple[str, str, dict]
    ) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def parse_simulator_output(self, text: str) -> tuple[str | None, dict | None]: ...


class TurnJudge(Protocol):
    def __call__(self, episodes: Sequence[Episode]) -> list[Any]:
        """Judges the just-finished user turn of each episode: objects with
        ``turn_reward`` (float), ``terminate`` (bool), ``api_failed_count`` (int),
        ``required_failed`` (bool)."""


def _user_messages(record: dict) -> list[dict]:
    return [m for m in record.get("reference_messages", []) if m.get("role") == "user"]


def _has_checklist_items(checklist: Any) -> bool:
    # The reference tests the first checklist; a list of empty turns is as empty as no list.
    return bool(checklist) and bool(checklist[0]) and any(len(turn) for turn in checklist[0])


def summarize(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Batch-level rollout metrics: mean score, termination counts, turns, calls and rows per role."""
    if not episodes:
        return {"episodes": 0}
    per = [e.metrics() for e in episodes]
    n = len(per)
    out: dict[str, Any] = {
        "episodes": n,
        "score_mean": sum(m["score"] for m in per) / n,
        "termination": dict(collections.Counter(m["termination"] for m in per)),
    }
    for key in ("user_turns", "assistant_turns", "tool_calls", "steps"):
        out[f"{key}_mean"] = sum(m[key] for m in per) / n
    for role in ROLES:
        out[f"rows_{role}"] = sum(m[f"rows_{role}"] for m in per)
        out[f"tokens_{role}"] = sum(m[f"tokens_{role}"] for m in per)
    return out


class RolloutEngine:
    """Runs many episodes at once. ``policy`` plays ACT (and REHEARSE in rehearsal modes)."""

    def __init__(
        self,
        cfg: RolloutConfig,
        codec: ChatCodec,
        policy: PolicyClient,
        judge: TurnJudge,
        *,
        simulator: PolicyClient | None = None,
        make_env: Callable[[dict], Any] | None = None,
        on_step: Callable[[int, list[Episode]], None] | None = None,
    ):
        if cfg.mode in ("simulator", "noshare") and simulator is None:
            raise ValueError(f"rollout.mode={cfg.mode!r} needs a separate simulator client")
        if cfg.mode == "real" and make_env is None:
            raise ValueError("rollout.mode='real' needs make_env(record) -> ToolEnvironment")
        self.cfg, self.codec, self.policy, self.judge = cfg, codec, policy, judge
        self.simulator, self.make_env, self.on_step = simulator, make_env, on_step
        # one entry per client call: {"client": "policy"|"simulator", ACT: rows, REHEARSE: rows}
        self.sampler_calls: list[dict[str, Any]] = []
        self.cancel: threading.Event | None = None
        self.on_interval: Callable[[str, float, float], None] | None = None
        self.timing: dict[str, float] = {}
        self._stream: JudgeStream | None = None

    # ------------------------------------------------------------------ timing, cancelling, streaming
    def _span(self, kind: str, t0: float) -> None:
        t1 = time.perf_counter()
        self.timing[kind] = self.timing.get(kind, 0.0) + t1 - t0
        if self.on_interval is not None:
            self.on_interval(kind, t0, t1)

    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise RolloutCancelled("rollout cancelled")

    def _open_stream(self) -> JudgeStream | None:
        """A ``JudgeStream`` for this run when ``judge_streaming="on"`` (closed by ``run``)."""
        self.timing = {"generate_s": 0.0, "judge_wait_s": 0.0}
        if self.cfg.judge_streaming != "on":
            return None
        return JudgeStream(self.judge, self.cfg.judge_workers, on_wait=lambda t0, t1: self._wait_span(t0, t1))

    def _wait_span(self, t0: float, t1: float) -> None:
        self.timing["judge_wait_s"] = self.timing.get("judge_wait_s", 0.0) + t1 - t0
        if self.on_interval is not None:
            self.on_interval("judge_wait_s", t0, t1)

    # ------------------------------------------------------------------ episode set-up
    def start(self, records: Sequence[dict], uids: Sequence[str] | None = None) -> list[Episode]:
        if uids is not None and len(uids) != len(records):
            raise ValueError(f"uids has {len(uids)} entries for {len(records)} records")
        episodes = []
        for i, rec in enumerate(records):
            if not isinstance(rec, dict) or not isinstance(rec.get("messages"), list) or not rec["messages"]:
                raise ValueError(f"records[{i}] needs a non-empty 'messages' list (system? + first user)")
            uid = str(uids[i] if uids is not None else rec.get("uid", i))
            msgs = [dict(m) for m in rec["messages"]]
            ep = Episode(
                episode_id=i,
                uid=uid,
                record=rec,
                messages=msgs,
                caller_ids=list(self.codec.caller_prompt(msgs, rec.get("tools", []))),
            )
            if self.cfg.mode == "real":
                ep.env = self.make_env(rec)
            if not _has_checklist_items(rec.get("checklist")):
                self._terminate(ep, "empty_checklist")
            else:
                self._check_length(ep)
            episodes.append(ep)
        return episodes

    def run(self, records: Sequence[dict], uids: Sequence[str] | None = None) -> list[Episode]:
        self._stream = self._open_stream()
        try:
            if self.rolling:
                return self._run_rolling(records, uids)
            return self._run_lockstep(records, uids)
        finally:
            if self._stream is not None:
                self._stream.close()
            self._stream = None

    def _run_lockstep(self, records: Sequence[dict], uids: Sequence[str] | None) -> list[Episode]:
        episodes = self.start(records, uids)
        bar = None
        if self.cfg.progress_bar:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.cfg.max_steps, desc=f"rollout[{self.cfg.mode}]", unit="step", leave=False)
        step = 0
        try:
            while not all(e.done for e in episodes):
                self._check_cancel()
                # streaming: each episode counts its own micro-steps (``step`` caps them there)
                if step >= self.cfg.max_steps and self._stream is None:
                    for e in episodes:
                        if not e.done:
                            self._terminate(e, "step_cap")
                    break
                self.step(episodes, step)
                step += 1
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(live=sum(not e.done for e in episodes))
                if self.on_step:
                    self.on_step(step, episodes)
        finally:
            if bar is not None:
                bar.close()
            self.policy.release([self._key(e) for e in episodes])
        for e in episodes:
            self._finalize(e)
        return episodes

    # ------------------------------------------------------------------ one micro-step
    def step(self, episodes: list[Episode], step: int) -> None:
        cfg = self.cfg
        live_before = [e for e in episodes if not e.done]
        if self._stream is not None:  # episodes step on their own count (those with the judge sit out)
            for e in live_before:
                if e.state in (State.AWAIT_CALLER, State.AWAIT_SIMULATOR) and e.steps >= cfg.max_steps:
                    self._terminate(e, "step_cap")
        act_eps = [e for e in episodes if e.state == State.AWAIT_CALLER]
        sim_eps = [e for e in episodes if e.state == State.AWAIT_SIMULATOR]
        for e in act_eps + sim_eps:
            e.steps += 1
        at = (lambda e: e.steps - 1) if self._stream is not None else (lambda e: step)

        act_reqs = [r for e in act_eps for r in self._requests(e, at(e))]
        sim_reqs, sim_slots = [], []
        for e in sim_eps:
            reqs = self._requests(e, at(e))
            sim_reqs += reqs
            sim_slots += [e] * len(reqs)

        if cfg.mode in ("rehearsal", "caller_frozen"):
            outs = self._call(self.policy, "policy", act_reqs + sim_reqs)
            act_outs, sim_outs = outs[: len(act_reqs)], outs[len(act_reqs) :]
        else:
            act_outs = self._call(self.policy, "policy", act_reqs)
            sim_outs = self._call(self.simulator, "simulator", sim_reqs)

        for e, req, out in zip(act_eps, act_reqs, act_outs):
            self._on_act(e, req, out)
            self._after_act(e)
        for e, req, out in zip(sim_slots, sim_reqs, sim_outs):
            if e.state == State.AWAIT_SIMULATOR:  # an earlier sibling's cache_full may have ended it
                self._on_rehearse(e, req, out)
        for e in sim_eps:
            if e.state == State.AWAIT_SIMULATOR and len(e.pending_results) == len(e.pending_calls):
                self._close_tool_turn(e)

        self._judge_tick(episodes, step)

        ended = [self._key(e) for e in live_before if e.done]
        if ended:  # free their cached rows now rather than at the end of the batch
            self.policy.release(ended)

    def _requests(self, e: Episode, step: int) -> list[GenRequest]:
        """The generations episode ``e`` asks for at its micro-step ``step``: its ACT turn, or the
        REHEARSE prompts of its pending tool calls (one at a time with ``sequential_simulation``)."""
        cfg = self.cfg
        if e.state == State.AWAIT_CALLER:
            return [GenRequest(list(e.caller_ids), ACT, cfg.act, self._seed(e, step, 0), self._key(e), e.episode_id)]
        todo = range(len(e.pending_results), len(e.pending_calls))
        if cfg.sequential_simulation:
            todo = todo[:1]
        reqs = []
        for j in todo:
            call = e.pending_calls[j]
            # messages[-1] is the current assistant turn: the simulator sees the history before it
            # (no sibling results: they are appended only when the whole turn is answered).
            prompt = self.codec.simulator_prompt(e.record, e.messages[:-1], e.last_caller_text, call)
            reqs.append(
                GenRequest(list(prompt), REHEARSE, cfg.rehearse, self._seed(e, step, 1 + j), None, e.episode_id)
            )
        return reqs

    # ------------------------------------------------------------------ rolling batch
    @property
    def rolling(self) -> bool:
        """Rolling when configured and every client in use can stream (``submit``/``step``)."""
        clients = [self.policy] + ([self.simulator] if self.cfg.mode in ("simulator", "noshare") else [])
        return self.cfg.rolling and all(hasattr(c, "submit") and hasattr(c, "step") for c in clients)

    def _run_rolling(self, records: Sequence[dict], uids: Sequence[str] | None) -> list[Episode]:
        return run_rolling(self, records, uids)

    # ------------------------------------------------------------------ transitions
    def _on_act(self, e: Episode, req: GenRequest, out: GenOutput) -> None:
        if out.finish_reason == "cache_full" and not out.ids:
            self._terminate(e, "length_budget")
            return
        text = self.codec.decode(out.ids)
        e.generations.append(
            Generation(
                ACT,
                list(req.prompt_ids),
                list(out.ids),
                list(out.logprobs),
                e.uid,
                e.episode_id,
                e.user_turns,
                out.finish_reason,
                text,
                temperature=float(req.sampling.temperature),
                routing=out.routing,
            )
        )
        e.caller_ids = list(req.prompt_ids) + list(out.ids) + list(self.codec.close_assistant(list(out.ids)))
        e.assistant_turns += 1
        e.last_caller_text = text
        # The one parse path of training, evaluation and test-time rehearsal (chat/tool_parser.py).
        msg, error = make_assistant_message(
            text,
            call_id_prefix=f"call_{e.uid}_{e.assistant_turns}",
            ignore_think=self.cfg.ignore_think_tool_calls,
            syntax=self.cfg.tool_call_syntax,
        )
        e.messages.append(msg)
        if error is not None:
            e.messages.append(
                {
                    "role": "tool",
                    "name": "error_tool_call",
                    "tool_call_id": f"call_{e.uid}_{e.assistant_turns}_error",
                    "content": json.dumps(error, ensure_ascii=False),
                }
            )
            self._terminate(e, "parse_error")
        elif msg.get("tool_calls"):
            e.pending_calls = [
                (tc["id"], tc["function"]["name"], tc["function"]["arguments"]) for tc in msg["tool_calls"]
            ]
            e.pending_results = []
            e.state = State.AWAIT_SIMULATOR
        else:
            e.state = State.INTERACTING

    def _on_rehearse(self, e: Episode, req: GenRequest, out: GenOutput) -> None:
        if out.finish_reason == "cache_full" and not out.ids:
            self._terminate(e, "length_budget")
            return
        text = self.codec.decode(out.ids)
        e.generations.append(
            Generation(
                REHEARSE,
                list(req.prompt_ids),
                list(out.ids),
                list(out.logprobs),
                e.uid,
                e.episode_id,
                e.user_turns,
                out.finish_reason,
                text,
                temperature=float(req.sampling.temperature),
                routing=out.routing,
            )
        )
        result, error = self.codec.parse_simulator_output(text)
        e.pending_results.append(json.dumps(error, ensure_ascii=False) if error is not None else result)

    def _after_act(self, e: Episode) -> None:
        """After an ACT turn: in mode ``real`` the calls it made run against the episode's environment now
        (the other modes leave them to REHEARSE or the simulator at the next micro-step)."""
        if self.cfg.mode == "real" and e.state == State.AWAIT_SIMULATOR:
            self._answer_real(e)

    def _answer_real(self, e: Episode) -> None:
        self._answer_from(e, e.env)

    def _answer_from(self, e: Episode, env) -> None:
        """Runs ``e``'s pending calls on ``env`` (a ``ToolEnvironment``) and closes the tool turn."""
        for _, name, args in e.pending_calls[len(e.pending_results) :]:
            res = env.execute(name, args)
            if not isinstance(getattr(res, "content", None), str):
                raise TypeError(
                    f"episode {e.episode_id}: environment returned {type(res).__name__} for "
                    f"{name!r}, expected a ToolResult with string content"
                )
            e.pending_results.append(res.content)
        self._close_tool_turn(e)

    def _close_tool_turn(self, e: Episode) -> None:
        tool_msgs = [
            {"role": "tool", "name": name, "tool_call_id": cid, "content": res}
            for (cid, name, _), res in zip(e.pending_calls, e.pending_results)
        ]
        e.messages.extend(tool_msgs)
        e.caller_ids = e.caller_ids + list(self.codec.tool_block(tool_msgs))
        failed = any(is_error_result(m["content"]) for m in tool_msgs)
        e.pending_calls, e.pending_results = [], []
        if failed:
            self._terminate(e, "simulator_error")
            return
        e.state = State.AWAIT_CALLER
        self._check_length(e)

    def _judge_tick(self, episodes: Sequence[Episode], tick: int) -> list[Episode]:
        """The judging of one engine tick; returns the episodes whose verdict was applied. Synchronous: every
        ended turn, now. Streaming: the verdicts submitted at earlier ticks (waiting for them), then the turns
        that ended at this one go to the judge."""
        if self._stream is None:
            return self._judge_interacting(episodes)
        judged = []
        for e, verdict in self._stream.due(tick):
            self._after_judge(e, verdict)
            judged.append(e)
        ended = [e for e in episodes if e.state == State.INTERACTING and not self._stream.waiting(e.episode_id)]
        self._stream.submit(ended, tick)
        return judged

    def _judge_interacting(self, episodes: Sequence[Episode]) -> list[Episode]:
        """Judges every episode waiting for its turn's verdict, in one judge call; returns them."""
        judging = [e for e in episodes if e.state == State.INTERACTING]
        if judging:
            t0 = time.perf_counter()
            verdicts = self.judge(judging)
            self._span("judge_wait_s", t0)
            if len(verdicts) != len(judging):
                raise RuntimeError(f"judge returned {len(verdicts)} verdicts for {len(judging)} episodes")
            for e, verdict in zip(judging, verdicts):
                self._after_judge(e, verdict)
        return judging

    def _after_judge(self, e: Episode, verdict: Any) -> None:
        e.turn_rewards.append(float(verdict.turn_reward))
        e.user_turns += 1
        users = _user_messages(e.record)
        if verdict.terminate:
            if getattr(verdict, "api_failed_count", 0):
                # The turn's reward counts the failed items False, as the reference does; whether the
                # episode then trains is the RL step's choice (rl.mask_judge_failures). The error text
                # goes to the step's outage warning.
                reason = "judge_api_failure"
                e.info["judge_failed_verdicts"] = int(verdict.api_failed_count)
                e.info["judge_error"] = str(getattr(verdict, "api_error", ""))
            elif getattr(verdict, "required_failed", False):
                reason = "required_item_failed"
            else:
                reason = "completed"
            self._terminate(e, reason)
        elif e.assistant_turns >= self.cfg.max_assistant_turns or e.user_turns >= self.cfg.max_user_turns:
            self._terminate(e, "turn_cap")
        elif e.user_turns >= len(users):
            self._terminate(e, "no_next_user")
        else:
            nxt = dict(users[e.user_turns])
            e.messages.append(nxt)
            e.caller_ids = e.caller_ids + list(self.codec.user_block(nxt))
            e.state = State.AWAIT_CALLER
            self._check_length(e)

    def _check_length(self, e: Episode) -> None:
        if len(e.caller_ids) + self.cfg.act.max_new_tokens >= self.cfg.max_model_len:
            self._terminate(e, "length_budget")

    def _terminate(self, e: Episode, reason: str) -> None:
        e.state = State.TERMINATED
        e.termination = reason
        e.pending_calls, e.pending_results = [], []

    def _finalize(self, e: Episode) -> None:
        checklist = e.record.get("checklist") or [[]]
        denom = max(1, len(checklist)) * max(1, len(checklist[0]))
        e.score = sum(e.turn_rewards) / denom
        for g in e.generations:  # both roles' rows get the episode's score (spec 4.3); penalties are the step's
            g.score = e.score

    # ------------------------------------------------------------------ helpers
    def _call(self, client: PolicyClient | None, name: str, reqs: list[GenRequest]) -> list[GenOutput]:
        if not reqs:
            return []
        if client is None:
            raise RuntimeError(f"rollout.mode={self.cfg.mode!r}: no {name} client for {len(reqs)} requests")
        self.sampler_calls.append(
            {"client": name, ACT: sum(r.role == ACT for r in reqs), REHEARSE: sum(r.role == REHEARSE for r in reqs)}
        )
        t0 = time.perf_counter()
        outs = client.generate(reqs)
        self._span("generate_s", t0)
        if len(outs) != len(reqs):
            raise RuntimeError(f"{name} client returned {len(outs)} outputs for {len(reqs)} requests")
        return outs

    def _key(self, e: Episode) -> str:
        return f"caller/{e.uid}/{e.episode_id}"

    def _seed(self, e: Episode, step: int, slot: int) -> int:
        return (self.cfg.seed * 1_000_003 + e.episode_id * 7919 + step * 131 + slot) % (2**31 - 1)
