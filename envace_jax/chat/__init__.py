"""Host-side chat layer (no jax): tokenizer loading, Qwen3 chat rendering to ids, tool-call and
simulator-output parsing, the REHEARSE prompt builder and the offline demo tokenizer."""

from envace_jax.chat.codec import Qwen3ChatCodec
from envace_jax.chat.render import MODEL, ChatRenderer, Span, Transcript
from envace_jax.chat.simulator import (
    SIMULATOR_ERROR_CODES,
    SimulatorPromptOptions,
    build_simulator_messages,
    is_error_result,
    logged_tool_calls,
    parse_simulator_output,
    serialize_history,
)
from envace_jax.chat.template import QWEN3_SPECIAL_TOKENS, QWEN3_STYLE_TEMPLATE, render_chat_text
from envace_jax.chat.tokenizer import build_demo_tokenizer, load_tokenizer
from envace_jax.chat.tool_parser import (
    TOOL_CALL_ERROR_CODES,
    make_assistant_message,
    parse_tool_calls,
    split_assistant_text,
    strip_think,
)

__all__ = [
    "ChatRenderer",
    "MODEL",
    "QWEN3_SPECIAL_TOKENS",
    "QWEN3_STYLE_TEMPLATE",
    "Qwen3ChatCodec",
    "SIMULATOR_ERROR_CODES",
    "SimulatorPromptOptions",
    "Span",
    "TOOL_CALL_ERROR_CODES",
    "Transcript",
    "build_demo_tokenizer",
    "build_simulator_messages",
    "is_error_result",
    "load_tokenizer",
    "logged_tool_calls",
    "make_assistant_message",
    "parse_simulator_output",
    "parse_tool_calls",
    "render_chat_text",
    "serialize_history",
    "split_assistant_text",
    "strip_think",
]
