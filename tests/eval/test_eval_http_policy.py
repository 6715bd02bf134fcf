"""``policy=http``: BFCL through a served model (launch/serve.py's server over a tiny random checkpoint) against
the same checkpoint in process, greedy; the pieces that turn OpenAI messages into Qwen3 text and back."""

from __future__ import annotations

import json
import os

import pytest

from envace_jax.eval import run_eval
from envace_jax.eval.config import BFCL_TINY, EvalConfig, load_eval_config
from envace_jax.eval.harness import parse_turn, save_tiny_checkpoint, tool_call_text
from envace_jax.eval.http_agent import reply_text, wire_message
from envace_jax.serve import build_server


@pytest.fixture(scope="module")
def bfcl_ckpt(tmp_path_factory):
    """A tiny random Qwen3 with a line-level tokenizer trained on BFCL's schemas (eval_bfcl_tiny.py's), as a
    checkpoint folder both the in-process eval and the server load."""
    return save_tiny_checkpoint(BFCL_TINY, str(tmp_path_factory.mktemp("bfcl_ckpt")), seed=3)


def _cfg(out_dir, **kw):
    return {
        "suite": "bfcl",
        "output_dir": str(out_dir),
        "bfcl": {"categories": "multi_turn_base", "limit": 6, "max_steps_per_turn": 2, "batch_size": 6},
        "sampling": {"temperature": 0.0, "max_new_tokens": 16},
        "max_model_len": 2048,
        "enable_thinking": False,
        **kw,
    }


def _entries(out_dir):
    with open(os.path.join(out_dir, "multi_turn_base.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_bfcl_through_the_server_gives_the_in_process_greedy_outcomes(bfcl_ckpt, tmp_path):
    local = run_eval(_cfg(tmp_path / "local", policy="model", model={"model_path": bfcl_ckpt}))
    server = build_server(
        bfcl_ckpt, model_name="tiny", dtype="float32", max_model_len=2048, port=0, enable_thinking=False
    )
    with server:
        served = run_eval(_cfg(tmp_path / "http", policy="http", http={"base_url": server.url, "model": "tiny"}))
        assert server.counts["ok"] > 0 and server.counts["client_errors"] == 0
    a, b = _entries(tmp_path / "local"), _entries(tmp_path / "http")
    assert [e["id"] for e in a] == [e["id"] for e in b] and len(a) == 6
    assert [(e["valid"], e["error_type"]) for e in a] == [(e["valid"], e["error_type"]) for e in b]
    # turns, steps, calls, generated tokens and termination of every entry
    assert [e["detail"] for e in a] == [e["detail"] for e in b]
    row_a, row_b = local["categories"]["multi_turn_base"], served["categories"]["multi_turn_base"]
    assert row_a["valid"] == row_b["valid"] and row_b["generated_tokens_mean"] > 0
    assert served["policy"] == "http"


def test_messages_go_out_as_openai_clients_send_them_and_replies_come_back_as_qwen3_text():
    msg, _, _ = parse_turn('ok\n<tool_call>\n{"name": "cd", "arguments": {"folder": "döc"}}\n</tool_call>')
    wire = wire_message({**msg, "tool_calls": [{**c, "id": f"x{i}"} for i, c in enumerate(msg["tool_calls"])]})
    assert wire["role"] == "assistant" and wire["content"] == "ok"
    assert wire["tool_calls"] == [
        {"id": "x0", "type": "function", "function": {"name": "cd", "arguments": '{"folder": "döc"}'}}
    ]
    reply = {"content": "ok", "tool_calls": wire["tool_calls"]}
    assert reply_text(reply) == tool_call_text([("cd", {"folder": "döc"})], "ok")
    assert parse_turn(reply_text(reply))[1] == [("cd", {"folder": "döc"})]
    assert reply_text({"content": "plain", "tool_calls": []}) == "plain"
    bad = {"content": None, "tool_calls": [{"function": {"name": "cd", "arguments": "{oops"}}]}
    assert parse_turn(reply_text(bad))[2] is not None  # our parser rejects what the server passed on


def test_policy_http_is_checked_when_the_config_is_read():
    with pytest.raises(ValueError, match="base_url"):
        load_eval_config({"suite": "bfcl", "policy": "http"})
    with pytest.raises(ValueError, match="evaluates the suites"):
        EvalConfig(suite="demo", policy="http")
    cfg = load_eval_config({"suite": "tau2", "policy": "http", "http": {"base_url": "http://h:1", "model": "m"}})
    assert cfg.http.max_concurrency == 16


def test_test_time_rehearsal_through_the_server_gives_the_in_process_greedy_rehearsals(bfcl_ckpt, tmp_path):
    """policy=http with a sweep: the rehearsals go to the server's /v1/completions as token ids (rendered with
    http.tokenizer_path), the real run to its chat endpoint; greedy, both equal the in-process run's."""
    rehearsal = {"sweep_ns": "0,1", "sweep_modes": "parallel", "max_tokens_per_rehearsal": 48}
    limit = {"bfcl": {"categories": "multi_turn_base", "limit": 3, "max_steps_per_turn": 2, "batch_size": 3}}
    local = run_eval(
        _cfg(tmp_path / "local", policy="model", model={"model_path": bfcl_ckpt}, rehearsal=rehearsal, **limit)
    )
    server = build_server(
        bfcl_ckpt, model_name="tiny", dtype="float32", max_model_len=2048, port=0, enable_thinking=False
    )
    http = {"base_url": server.url, "model": "tiny", "tokenizer_path": bfcl_ckpt}
    with server:
        served = run_eval(_cfg(tmp_path / "http", policy="http", http=http, rehearsal=rehearsal, **limit))
        assert server.counts["client_errors"] == 0
        assert server.engine.stats.requests > 0
    for name in ("eval_n0_tasks.jsonl", "eval_n1_tasks.jsonl", "eval_n1_rehearsals.jsonl"):
        a = (tmp_path / "local" / name).read_text().splitlines()
        b = (tmp_path / "http" / name).read_text().splitlines()
        assert len(a) == 3 and a == b, name
    traces = [json.loads(line)["rehearsals"][0] for line in (tmp_path / "http" / "eval_n1_rehearsals.jsonl").open()]
    assert all(t["termination"] for t in traces)  # each imagined episode ran to an end
    assert local["categories"].keys() == served["categories"].keys() == {"multi_turn_base_n0", "multi_turn_base_n1"}
    rows = json.loads((tmp_path / "http" / "rehearsal_sweep.json").read_text())["rows"]
    assert rows[1]["rehearsal_generated_tokens"] > 0 and rows[1]["memory_placed"] == 1.0
