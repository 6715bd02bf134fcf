"""Incremental rendering of a Qwen3-format episode to token ids.

The ACT context grows turn by turn: the initial prompt (system + tools + user + generation prompt) comes
from the tokenizer's chat template; each sampled assistant turn is appended as the exact ids the sampler
produced; tool responses, user turns and generation prompts are appended as text pieces tokenised on their
own. The trainer therefore scores exactly the ids the sampler emitted (no re-tokenisation drift; the
reference instead re-renders each assistant message through the template, spec 8.11).

BPE boundaries: every piece we tokenise ourselves starts with ``<|im_start|>`` or is the lone "\\n"
after ``<|im_end|>``, and ends with ``<|im_end|>\\n`` or a generation prompt. Special tokens are split
out before BPE runs, so tokenising the pieces one by one equals tokenising the whole text, except where
a sampled turn itself begins with whitespace that BPE would have merged with the generation prompt's
trailing "\\n" (only possible with ``enable_thinking=False``, whose prompt ends in "\\n\\n"). The text is
always equal; the ids are then the sampled ones, which is what training needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from envace_jax.chat.template import ENDOFTEXT, IM_END, IM_START, generation_prompt, tool_responses_turn, user_turn

PROMPT, MODEL, ENV, USER = "prompt", "model", "env", "user"
SPAN_KINDS = (PROMPT, MODEL, ENV, USER)


@dataclasses.dataclass(frozen=True)
class Span:
    kind: str  # PROMPT (initial render), MODEL (sampled ids), ENV (tool responses, separators, gen prompts), USER
    start: int
    end: int  # exclusive


def _single_id(tokenizer, token: str) -> int:
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"tokenizer encodes {token!r} as {ids}; the Qwen3 chat format needs it as one token")
    return ids[0]


class ChatRenderer:
    """Qwen3-format pieces as token ids for one tokenizer (thinking on or off)."""

    def __init__(self, tokenizer, *, enable_thinking: bool = True):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("tokenizer has no chat_template; load it with envace_jax.chat.load_tokenizer")
        self.tokenizer = tokenizer
        self.enable_thinking = enable_thinking
        self.im_start_id = _single_id(tokenizer, IM_START)
        self.im_end_id = _single_id(tokenizer, IM_END)
        self.endoftext_id = _single_id(tokenizer, ENDOFTEXT)
        # The reference stops a turn at the first EOS of either kind (spec 2.4).
        self.stop_token_ids = (self.im_end_id, self.endoftext_id)
        self._newline_ids = self.encode("\n")
        self._gen_prompt_ids = self.encode(generation_prompt(enable_thinking))

    # ------------------------------------------------------------------ text <-> ids
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Model text as the reference sees it: control tokens dropped, ``<think>``/``<tool_call>`` kept."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def chat_text(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        add_generation_prompt: bool = False,
        **template_kwargs: Any,
    ) -> str:
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of chat message dicts")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
                raise ValueError(
                    f"messages[{i}] is not a chat message with a system/user/assistant/tool role: {str(m)[:120]}"
                )
        template_kwargs.setdefault("enable_thinking", self.enable_thinking)
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **template_kwargs,
        )

    def render_messages(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        add_generation_prompt: bool = False,
        **template_kwargs: Any,
    ) -> list[int]:
        """Full (non-incremental) render through the chat template: SFT rows, simulator prompts."""
        return self.encode(
            self.chat_text(messages, tools, add_generation_prompt=add_generation_prompt, **template_kwargs)
        )

    # ------------------------------------------------------------------ pieces
    def generation_prompt_ids(self) -> list[int]:
        return list(self._gen_prompt_ids)

    def close_assistant_ids(self, sampled_ids: Sequence[int]) -> list[int]:
        """Ids that follow a sampled assistant turn so it is a closed turn: "\\n" after ``<|im_end|>``;
        for a turn cut short (length limit, ``<|endoftext|>``) also the missing ``<|im_end|>``."""
        if sampled_ids and sampled_ids[-1] == self.im_end_id:
            return list(self._newline_ids)
        return [self.im_end_id] + list(self._newline_ids)

    def tool_responses_ids(self, contents: Sequence[str], *, add_generation_prompt: bool = True) -> list[int]:
        if not contents:
            raise ValueError("tool_responses_ids needs at least one tool response")
        for i, c in enumerate(contents):
            if not isinstance(c, str):
                raise ValueError(f"tool response {i} must be a string, got {type(c).__name__}")
        ids = self.encode(tool_responses_turn(list(contents)))
        return ids + (self.generation_prompt_ids() if add_generation_prompt else [])

    def user_ids(self, content: str, *, add_generation_prompt: bool = True) -> list[int]:
        if not isinstance(content, str):
            raise ValueError(f"user content must be a string, got {type(content).__name__}")
        return self.encode(user_turn(content)) + (self.generation_prompt_ids() if add_generation_prompt else [])

    def start(
        self, messages: list[dict], tools: list[dict] | None = None, *, add_generation_prompt: bool = True
    ) -> "Transcript":
        """A transcript holding the initial prompt (usually system + first user message)."""
        ids = self.render_messages(messages, tools, add_generation_prompt=add_generation_prompt)
        t = Transcript(self)
        t._append(PROMPT, ids)
        return t


class Transcript:
    """The growing ACT context of one episode, with the span of every piece (for loss masks)."""

    def __init__(self, renderer: ChatRenderer):
        self.renderer = renderer
        self.ids: list[int] = []
        self.spans: list[Span] = []

    def _append(self, kind: str, ids: Sequence[int]) -> Span:
        span = Span(kind, len(self.ids), len(self.ids) + len(ids))
        self.ids.extend(int(i) for i in ids)
        if span.end > span.start:
            self.spans.append(span)
        return span

    @property
    def awaiting_generation(self) -> bool:
        gp = self.renderer._gen_prompt_ids
        return len(self.ids) >= len(gp) and self.ids[len(self.ids) - len(gp) :] == gp

    def add_assistant(self, sampled_ids: Sequence[int]) -> Span:
        """Appends a sampled turn verbatim (``<|im_end|>`` included) and the separator after it.

        Returns the MODEL span: ``ids[span.start:span.end] == sampled_ids``.
        """
        if not self.awaiting_generation:
            raise ValueError("add_assistant: the transcript does not end with a generation prompt")
        sampled = [int(i) for i in sampled_ids]
        if not sampled:
            raise ValueError("add_assistant: sampled_ids is empty")
        span = self._append(MODEL, sampled)
        self._append(ENV, self.renderer.close_assistant_ids(sampled))
        return span

    def add_tool_responses(self, contents: Sequence[str], *, add_generation_prompt: bool = True) -> Span:
        return self._append(
            ENV, self.renderer.tool_responses_ids(contents, add_generation_prompt=add_generation_prompt)
        )

    def add_user(self, content: str, *, add_generation_prompt: bool = True) -> Span:
        span = self._append(USER, self.renderer.user_ids(content, add_generation_prompt=False))
        if add_generation_prompt:
            self.add_generation_prompt()
        return span

    def add_generation_prompt(self) -> Span:
        """Appends the generation prompt unless the transcript already ends with it."""
        if self.awaiting_generation:
            return Span(ENV, len(self.ids), len(self.ids))
        return self._append(ENV, self.renderer.generation_prompt_ids())

    def loss_mask(self) -> list[int]:
        """1 on model-sampled ids, 0 on prompt, environment and user ids."""
        mask = [0] * len(self.ids)
        for s in self.spans:
            if s.kind == MODEL:
                mask[s.start : s.end] = [1] * (s.end - s.start)
        return mask

    def text(self) -> str:
        return self.renderer.tokenizer.decode(self.ids, skip_special_tokens=False)
