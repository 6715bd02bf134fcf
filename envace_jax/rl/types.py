"""Core host-side records shared by rollout, reward and the trainer, and the names of the two roles.

Vocabulary (one meaning per word):

* **ACT** (``ACT = "act"``) is the role that talks to the user and calls tools; **REHEARSE**
  (``REHEARSE = "rehearse"``) is the role that plays the tools, writing each call's response. Our code,
  metrics and configs name the roles this way.
* **caller** / **simulator** are the reference's names for the same two roles. We keep them only where we
  mirror the reference: the episode states ``AWAIT_CALLER`` / ``AWAIT_SIMULATOR``, the chat layer's
  ``caller_prompt`` / ``simulator_prompt`` and ``parse_simulator_output`` (the REHEARSE prompt and its
  ``<execution_result>`` parser), and ``tokenizer.simulator_thinking``.
* **the simulator model** is a *separate* model that plays REHEARSE: rollout mode ``simulator`` (a frozen
  copy; only ACT trains) and ``noshare`` (a second trained policy), the engine's ``simulator=`` client and
  ``model.simulator_hf_path``. In modes ``rehearsal`` and ``caller_frozen`` the one policy plays both roles
  and there is no simulator model.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

ACT = "act"
REHEARSE = "rehearse"
ROLES = (ACT, REHEARSE)
ROLE_ID = {ACT: 0, REHEARSE: 1}


class State(str, enum.Enum):
    AWAIT_CALLER = "AWAIT_CALLER"
    AWAIT_SIMULATOR = "AWAIT_SIMULATOR"
    INTERACTING = "INTERACTING"
    TERMINATED = "TERMINATED"


# Why an episode ended (spec 2.3, "Termination summary"), one name per cause.
TERMINATION_REASONS = (
    "completed",  # judge: the last checklist turn was judged
    "required_item_failed",  # judge: a required_for_next_turn item never passed (majority of checklists)
    "judge_api_failure",  # judge: an API failure or malformed verdict
    "no_next_user",  # the reference conversation has no further user message
    "parse_error",  # ACT emitted a malformed tool call
    "simulator_error",  # a rehearsed response was an error_tool_call (format slip or validation verdict)
    "length_budget",  # caller context + max_response_length >= max_model_len
    "turn_cap",  # assistant or user turn cap reached
    "step_cap",  # micro-step cap reached
    "empty_checklist",  # the task has no checklist items
)


@dataclasses.dataclass
class Generation:
    """One LLM call = one training row."""

    role: str  # ACT or REHEARSE
    prompt_ids: list[int]
    gen_ids: list[int]
    logprobs: list[float]  # sampler log-probs of gen_ids (at ``temperature``, before top-k/top-p)
    uid: str  # prompt uid, shared by the n rollouts of one task
    episode: int  # episode id, unique in a batch
    turn: int  # user-turn index at the time of the call
    finish_reason: str = "stop"
    text: str = ""  # decoded gen_ids, special tokens skipped ("" = an empty output, penalised)
    score: float = 0.0  # filled in after the episode: the episode's score, the same on every row
    temperature: float = 1.0  # the sampling temperature of gen_ids: the trainer scores the row at it
    # A Qwen3-MoE sampler's experts of each of gen_ids as it was fed back, [len(gen_ids), sparse layers, k]
    # (routing replay, models/qwen3_moe.py); None: not recorded
    routing: Any = None

    @property
    def role_id(self) -> int:
        return ROLE_ID[self.role]


@dataclasses.dataclass
class Episode:
    episode_id: int
    uid: str
    record: dict[str, Any]
    messages: list[dict[str, Any]]
    caller_ids: list[int]
    state: State = State.AWAIT_CALLER
    generations: list[Generation] = dataclasses.field(default_factory=list)
    turn_rewards: list[float] = dataclasses.field(default_factory=list)
    user_turns: int = 0
    assistant_turns: int = 0
    steps: int = 0
    termination: str | None = None
    score: float = 0.0
    # calls of the current assistant turn waiting for responses: (call_id, name, arguments)
    pending_calls: list[tuple[str, str, dict]] = dataclasses.field(default_factory=list)
    pending_results: list[str] = dataclasses.field(default_factory=list)
    last_caller_text: str = ""
    env: Any = None  # a ToolEnvironment in real mode
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.state == State.TERMINATED

    def tool_calls(self) -> int:
        """Tool calls the policy made (parsed calls of its assistant messages, error turns excluded)."""
        return sum(len(m.get("tool_calls") or []) for m in self.messages if m.get("role") == "assistant")

    def metrics(self) -> dict[str, Any]:
        """Per-episode numbers for logs: why it ended, how far it got, what it cost per role."""
        out: dict[str, Any] = {
            "termination": self.termination,
            "score": self.score,
            "user_turns": self.user_turns,
            "judged_turns": len(self.turn_rewards),
            "assistant_turns": self.assistant_turns,
            "tool_calls": self.tool_calls(),
            "steps": self.steps,
        }
        for role in ROLES:
            rows = [g for g in self.generations if g.role == role]
            out[f"rows_{role}"] = len(rows)
            out[f"tokens_{role}"] = sum(len(g.gen_ids) for g in rows)
            # rows cut by max_new_tokens or the cache: their text may be incomplete
            out[f"cut_{role}"] = sum(g.finish_reason != "stop" for g in rows)
        return out
