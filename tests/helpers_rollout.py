"""Shared pieces for the rollout tests: a demo tokenizer trained on demo-task conversations, the real
Qwen3ChatCodec, a scripted policy client, texts that replay a task's reference conversation, a one-turn checklist
record, and a Trainer stand-in that records what the RL step asks it to update on."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from typing import Callable, Sequence

from envace_jax.rl.policy_client import GenOutput, GenRequest
from envace_jax.rl.types import ACT, REHEARSE


@functools.lru_cache(maxsize=None)
def demo_tasks(n: int = 16, seed: int = 3) -> tuple[dict, ...]:
    from envace_jax.data.demo_tasks import generate_tasks

    return tuple(generate_tasks(n, seed, "train"))


def _corpus() -> list[str]:
    from envace_jax.chat import render_chat_text

    texts = []
    for t in demo_tasks():
        msgs = list(t["messages"][:1]) + list(t["reference_messages"])
        texts.append(render_chat_text(msgs, t["tools"], enable_thinking=True))
        texts.extend(act_texts(t))
        texts.extend(rehearse_texts(t))
    return texts * 2


@functools.lru_cache(maxsize=None)
def tokenizer_dir() -> str:
    """Builds the demo tokenizer once per test process and returns its directory."""
    from envace_jax.chat import build_demo_tokenizer

    out = os.path.join(tempfile.mkdtemp(prefix="envace_rollout_tok_"), "tok")
    build_demo_tokenizer(_corpus(), out, vocab_size=500)
    return out


@functools.lru_cache(maxsize=None)
def codec():
    from envace_jax.chat import Qwen3ChatCodec, load_tokenizer

    return Qwen3ChatCodec(load_tokenizer(tokenizer_dir()))


def call_block(name: str, arguments: dict) -> str:
    return "\n<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def assistant_text(message: dict, think: str = "ok") -> str:
    """The sampled text that parses back to ``message`` (content, then one block per call)."""
    text = f"<think>\n{think}\n</think>\n\n" + (message.get("content") or "")
    for c in message.get("tool_calls") or []:
        text += call_block(c["function"]["name"], c["function"]["arguments"])
    return text


def result_text(content: str) -> str:
    return "<think>\nsimulate\n</think>\n\n<execution_result>\n" + content + "\n</execution_result>"


def act_texts(record: dict) -> list[str]:
    return [assistant_text(m) for m in record["reference_messages"] if m["role"] == "assistant"]


def rehearse_texts(record: dict) -> list[str]:
    return [result_text(m["content"]) for m in record["reference_messages"] if m["role"] == "tool"]


class ScriptedClient:
    """A policy client that returns given texts, encoded with the real tokenizer plus ``<|im_end|>``.

    ``script(request, n)`` returns the text for the n-th request of that (episode, role); a default
    script plays each episode's ``acts[episode]`` / ``rehearsals[episode]`` lists in order.
    """

    def __init__(
        self,
        codec,
        script: Callable[[GenRequest, int], str] | None = None,
        *,
        acts: dict[int, Sequence[str]] | None = None,
        rehearsals: dict[int, Sequence[str]] | None = None,
        logprob: float = -0.25,
    ):
        self.codec = codec
        self.tok = codec.renderer.tokenizer
        self.im_end = codec.renderer.im_end_id
        self.acts, self.rehearsals = acts or {}, rehearsals or {}
        self.script = script or self._default
        self.logprob = logprob
        self.counts: dict[tuple[int, str], int] = {}
        self.requests: list[list[GenRequest]] = []
        self.released: list[str] = []

    def _default(self, req: GenRequest, n: int) -> str:
        texts = (self.acts if req.role == ACT else self.rehearsals)[req.episode]
        return texts[n]

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False)) + [self.im_end]

    def generate(self, requests: Sequence[GenRequest]) -> list[GenOutput]:
        self.requests.append(list(requests))
        outs = []
        for r in requests:
            n = self.counts.get((r.episode, r.role), 0)
            self.counts[(r.episode, r.role)] = n + 1
            text = self.script(r, n)
            if text is None:  # the script's way to say "the context did not fit"
                outs.append(GenOutput([], [], "cache_full"))
                continue
            ids = self.encode(text)[: r.sampling.max_new_tokens]
            reason = "stop" if ids and ids[-1] == self.im_end else "length"
            outs.append(GenOutput(ids, [self.logprob] * len(ids), reason))
        return outs

    def release(self, cache_keys: Sequence[str]) -> None:
        self.released.extend(cache_keys)


def rows_per_call(requests: Sequence[Sequence[GenRequest]]) -> list[tuple[int, int]]:
    return [(sum(r.role == ACT for r in c), sum(r.role == REHEARSE for r in c)) for c in requests]


@functools.lru_cache(maxsize=None)
def compact_codec():
    """The demo codec with the compact REHEARSE prompt (no few-shot): short prompts keep a tiny model's
    prefill cheap on a CPU box."""
    from envace_jax.chat import Qwen3ChatCodec, SimulatorPromptOptions

    return Qwen3ChatCodec(
        codec().renderer.tokenizer, simulator_options=SimulatorPromptOptions(few_shot=False, compact=True)
    )


def tasks_without_required_items(n: int = 4) -> list[dict]:
    """The first ``n`` demo tasks with no required checklist item, so a random model's answers do not
    end every episode at its first judged turn (follow-up tasks then play a second user turn)."""
    import copy

    out = []
    for t in demo_tasks()[:n]:
        t = copy.deepcopy(t)
        for checklist in t["checklist"]:
            for turn in checklist:
                for item in turn:
                    item["required_for_next_turn"] = False
        out.append(t)
    return out


class FirstActScripted:
    """Odd episodes' first ACT turn is the reference's first assistant text (a valid tool call), so
    REHEARSE rows exist although a random model rarely writes a tool call; every other request goes to
    the real client ``inner`` in one call. ``texts``: the scripted texts; ``scripted``: the
    (episode, ids) pairs actually served from the script."""

    def __init__(self, inner, tasks: Sequence[dict], n_episodes: int):
        self.inner, self.c = inner, codec()
        self.first = {e: act_texts(tasks[e % len(tasks)])[0] for e in range(n_episodes) if e % 2}
        self.texts = set(self.first.values())
        self.scripted: set[tuple[int, tuple[int, ...]]] = set()

    def generate(self, requests: Sequence[GenRequest]) -> list[GenOutput]:
        out, fwd = [None] * len(requests), []
        for i, r in enumerate(requests):
            if r.role == ACT and r.episode in self.first:
                ids = self.c.renderer.encode(self.first.pop(r.episode)) + [self.c.renderer.im_end_id]
                self.scripted.add((r.episode, tuple(ids)))
                out[i] = GenOutput(ids, [0.0] * len(ids), "stop")
            else:
                fwd.append(i)
        if fwd:
            for i, o in zip(fwd, self.inner.generate([requests[i] for i in fwd])):
                out[i] = o
        return out

    def release(self, keys) -> None:
        self.inner.release(keys)


class FirstActScriptedStreaming(FirstActScripted):
    """``FirstActScripted`` for the rolling engine: ``submit``/``step`` over an inner streaming client
    (``RollingSamplerClient``); scripted outputs come back at the next ``step``."""

    def __init__(self, inner, tasks: Sequence[dict], n_episodes: int):
        super().__init__(inner, tasks, n_episodes)
        self._next, self._ready, self._inner_ticket = 0, [], {}

    @property
    def calls(self):
        return self.inner.calls

    def submit(self, requests: Sequence[GenRequest]) -> list[int]:
        tickets = []
        for r in requests:
            t, self._next = self._next, self._next + 1
            if r.role == ACT and r.episode in self.first:
                ids = self.c.renderer.encode(self.first.pop(r.episode)) + [self.c.renderer.im_end_id]
                self.scripted.add((r.episode, tuple(ids)))
                self._ready.append((t, r, GenOutput(ids, [0.0] * len(ids), "stop")))
            else:
                (inner,) = self.inner.submit([r])
                self._inner_ticket[inner] = t
            tickets.append(t)
        return tickets

    def step(self):
        done, self._ready = self._ready, []
        if self.inner.open_requests:
            done += [(self._inner_ticket.pop(t), r, o) for t, r, o in self.inner.step()]
        return done


def one_turn_record(uid: str, user: str = "Hi?", *, question: str = "q", rule: dict | None = None) -> dict:
    """A task of one user turn and one checklist item on the reply (with a rule the rule judge checks it)."""
    item = {
        "question": question,
        "focus_on": "assistant.content.user_visible_reply",
        "pass_condition": "p",
        "failure_examples": [],
        "evidence": [],
        "weight": 1.0,
        "required_for_next_turn": False,
    }
    if rule is not None:
        item["rule"] = rule
    msg = {"role": "user", "content": user}
    return {
        "uid": uid,
        "messages": [{"role": "system", "content": "Be brief."}, msg],
        "tools": [],
        "reference_messages": [msg, {"role": "assistant", "content": "Hello."}],
        "checklist": [[[item]]],
    }


class RecordingTrainer:
    """What RLStep needs of a Trainer; keeps every batch it is asked to update on, trains nothing."""

    step = 0

    def __init__(self):
        from envace_jax.config import LossConfig

        self.loss_cfg = LossConfig()
        self.batches, self.kwargs = [], []

    def compute_logprobs(self, batch):
        import numpy as np

        return np.zeros(batch.tokens.shape, np.float32)

    def update(self, batch, kind="rl", **kw):
        self.batches.append(batch)
        self.kwargs.append(kw)
        return {"loss": 0.0}
