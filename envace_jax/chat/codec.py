"""One object that gives the rollout engine everything chat-related (the ``ChatCodec`` protocol of
envace_jax/rl/rollout.py): ACT context pieces as ids, REHEARSE prompts as ids, decoding and both parsers."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from envace_jax.chat.render import ChatRenderer
from envace_jax.chat.simulator import SimulatorPromptOptions, build_simulator_messages, parse_simulator_output
from envace_jax.chat.tool_parser import QWEN3, parse_tool_calls


class Qwen3ChatCodec:
    """ACT renders with ``enable_thinking``; REHEARSE prompts with ``simulator_thinking`` (the reference
    runs both with thinking on)."""

    def __init__(
        self,
        tokenizer,
        *,
        enable_thinking: bool = True,
        simulator_thinking: bool = True,
        simulator_options: SimulatorPromptOptions = SimulatorPromptOptions(),
    ):
        self.renderer = ChatRenderer(tokenizer, enable_thinking=enable_thinking)
        self.simulator_thinking = simulator_thinking
        self.simulator_options = simulator_options

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self.renderer.stop_token_ids

    @property
    def pad_token_id(self) -> int | None:
        """The tokenizer's padding id (what an exported model's generation config pads with)."""
        return self.renderer.tokenizer.pad_token_id

    def caller_prompt(self, messages: list[dict], tools: list[dict]) -> list[int]:
        return self.renderer.render_messages(messages, tools, add_generation_prompt=True)

    def close_assistant(self, gen_ids: list[int]) -> list[int]:
        return self.renderer.close_assistant_ids(gen_ids)

    def tool_block(self, tool_messages: list[dict]) -> list[int]:
        return self.renderer.tool_responses_ids([m["content"] for m in tool_messages])

    def user_block(self, message: dict) -> list[int]:
        return self.renderer.user_ids(message["content"])

    def simulator_messages(
        self,
        record: Mapping[str, Any],
        history: Sequence[Mapping[str, Any]],
        caller_text: str,
        call: tuple[str, str, dict],
    ) -> list[dict[str, str]]:
        _, name, args = call
        return build_simulator_messages(
            tools=record.get("tools", []),
            history=history,
            caller_text=caller_text,
            call_name=name,
            call_arguments=args,
            reference_messages=record.get("reference_messages", []),
            options=self.simulator_options,
        )

    def simulator_prompt(
        self,
        record: Mapping[str, Any],
        history: Sequence[Mapping[str, Any]],
        caller_text: str,
        call: tuple[str, str, dict],
    ) -> list[int]:
        """``call`` is (call_id, tool name, arguments); ``history`` excludes the current assistant message."""
        messages = self.simulator_messages(record, history, caller_text, call)
        return self.renderer.render_messages(
            messages, None, add_generation_prompt=True, enable_thinking=self.simulator_thinking
        )

    def decode(self, ids: list[int]) -> str:
        return self.renderer.decode(ids)

    def parse_tool_calls(
        self, text: str, ignore_think: bool = False, *, syntax: str = QWEN3
    ) -> tuple[list[dict], dict | None]:
        """``chat.parse_tool_calls`` itself (the rollout engine calls ``chat.make_assistant_message``)."""
        return parse_tool_calls(text, ignore_think=ignore_think, syntax=syntax)

    def parse_simulator_output(self, text: str) -> tuple[str | None, dict | None]:
        return parse_simulator_output(text)
