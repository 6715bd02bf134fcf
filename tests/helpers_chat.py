"""Shared pieces for the chat tests: tool schemas, scripted episodes, a cached demo tokenizer, and
the real Qwen3 chat template read (not copied) from the installed bfcl-eval package."""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import tempfile
import textwrap

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_balance",
            "description": "Balance of one account.",
            "parameters": {"type": "object", "properties": {"account": {"type": "string"}}, "required": ["account"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "transfer",
            "description": "Move money between accounts.",
            "parameters": {
                "type": "object",
                "properties": {
                    "source": {"type": "string"},
                    "target": {"type": "string"},
                    "amount": {"type": "number"},
                },
                "required": ["source", "target", "amount"],
            },
        },
    },
]
SYSTEM = {"role": "system", "content": "You are a careful bank assistant."}


def call_text(name: str, arguments: dict) -> str:
    """A tool call written the way our template renders it (json.dumps default separators, no ASCII escaping)."""
    return "\n<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def script(thinking: bool) -> list[tuple[str, object]]:
    """A two-user-turn episode: ("user", text) / ("assistant", sampled text) / ("tool", [responses])."""

    def think(t: str) -> str:
        return f"<think>\n{t}\n</think>\n" if thinking else "Let me check."

    return [
        ("user", "What are the balances of A1 and Zürich-7?"),
        (
            "assistant",
            think("Two accounts, two calls.")
            + call_text("get_balance", {"account": "A1"})
            + call_text("get_balance", {"account": "Zürich-7"}),
        ),
        ("tool", ['{"balance": 120}', '{"balance": 75.5, "currency": "CHF"}']),
        (
            "assistant",
            ("<think>\nBoth known.\n</think>\n\n" if thinking else "") + "A1 holds 120 and Zürich-7 holds 75.5 CHF.",
        ),
        ("user", "Move 20 from A1 to Zürich-7, then tell me the new A1 balance."),
        (
            "assistant",
            think("One transfer.") + call_text("transfer", {"source": "A1", "target": "Zürich-7", "amount": 20}),
        ),
        ("tool", ['{"ok": true, "source_balance": 100}']),
        ("assistant", ("<think>\nDone.\n</think>\n\n" if thinking else "") + "Done: A1 now holds 100."),
    ]


def _corpus() -> list[str]:
    from envace_jax.chat import make_assistant_message, render_chat_text

    texts = []
    for thinking in (True, False):
        msgs = [SYSTEM]
        for kind, payload in script(thinking):
            if kind == "user":
                msgs.append({"role": "user", "content": payload})
            elif kind == "assistant":
                msgs.append(make_assistant_message(payload)[0])
            else:
                msgs.extend(
                    {"role": "tool", "name": "t", "tool_call_id": f"c{i}", "content": c} for i, c in enumerate(payload)
                )
        texts.append(render_chat_text(msgs, TOOLS, enable_thinking=thinking))
    texts.append("The quick brown fox jumps over the lazy dog. Accounts, balances, transfers: 0123456789.")
    return texts * 8


@functools.lru_cache(maxsize=None)
def demo_tokenizer_dir() -> str:
    """Builds the demo tokenizer once per test process (a few seconds) and returns its directory."""
    from envace_jax.chat import build_demo_tokenizer

    out = os.path.join(tempfile.mkdtemp(prefix="envace_chat_tok_"), "tok")
    build_demo_tokenizer(_corpus(), out, vocab_size=420)
    return out


def demo_tokenizer():
    from envace_jax.chat import load_tokenizer

    return load_tokenizer(demo_tokenizer_dir())


def real_qwen3_template() -> str | None:
    """The Qwen3 chat template as bfcl-eval ships it in a docstring of its Qwen FC handler, or None.

    Read from the installed file's source (escapes kept as written) so the test compares our template
    against an independent copy of the real one without us reproducing its text.
    """
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "model_handler", "local_inference", "qwen_fc.py")
    if not os.path.exists(path):
        return None
    src = open(path, encoding="utf-8").read()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef) and node.name == "_format_prompt" and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                seg = ast.get_source_segment(src, first.value) or ""
                body = seg.strip()[3:-3]
                if '"chat_template":' in body:
                    return textwrap.dedent(body.split('"chat_template":', 1)[1]).strip()
    return None
