"""Our chat layer against Qwen3's official tokenizer files (tokenizer.json, and the chat template in
tokenizer_config.json), fetched and sha256-checked by ``make qwen3-files`` (tests/qwen3_official.py).

* Token ids: the project's loading path for a checkpoint (``chat.load_tokenizer`` on the directory) against
  the official tokenizer.json read by the ``tokenizers`` library alone and by ``PreTrainedTokenizerFast``.
* Rendering: our ACT context (``ChatRenderer`` / ``Transcript`` on the official tokenizer, what a real run
  uses) and our own template (``render_chat_text``, what the demo tokenizer carries) against the official
  Jinja template rendered by transformers' ``apply_chat_template``. Where they differ on purpose, the test
  states the difference exactly (docs/chat_template.md lists them).
"""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.helpers_chat import SYSTEM, TOOLS, call_text, script

from envace_jax.chat import ChatRenderer, Qwen3ChatCodec, load_tokenizer, make_assistant_message, render_chat_text


@pytest.fixture(scope="module")
def official(qwen3_official):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    path = os.path.join(qwen3_official, "tokenizer.json")
    with open(os.path.join(qwen3_official, "tokenizer_config.json"), encoding="utf-8") as f:
        template = json.load(f)["chat_template"]
    fast = PreTrainedTokenizerFast(tokenizer_file=path)
    return {
        "raw": Tokenizer.from_file(path),
        "fast": fast,
        "template": template,
        "ours": load_tokenizer(qwen3_official),
    }


def official_text(official, messages, tools=TOOLS, **kw) -> str:
    """The official template rendered by transformers, independent of our tokenizer loading."""
    return official["fast"].apply_chat_template(
        messages, tools=tools, tokenize=False, chat_template=official["template"], **kw
    )


def raw_ids(official, text: str) -> list[int]:
    return official["raw"].encode(text, add_special_tokens=False).ids


# ----------------------------------------------------------------------------- token ids

TEXTS = [
    "<think>\nThe user wants two balances.\n</think>\n\n<tool_call>\n"
    '{"name": "get_balance", "arguments": {"account": "A1"}}\n</tool_call>',
    '<tool_call>\n{"name": "transfer", "arguments": {"source": "A1", "target": "Zürich-7", "amount": 20.5}}\n'
    '</tool_call>\n<tool_call>\n{"name": "get_balance", "arguments": {"account": "B2"}}\n</tool_call>',
    "<think>\n让我想想：账户余额是多少？東京の天気は晴れです。\n잔액을 확인하겠습니다.\n</think>\n\n余额为 120 元。",
    "Done ✅ 🎉👍🏽 family 👨\u200d👩\u200d👧 flag 🇨🇭 math ∑∫√ arrows →⇒",
    '<|im_start|>user\n<tool_response>\n{"balance": 120}\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
    "<|endoftext|><|im_start|>system\nx<|im_end|><|vision_start|><|image_pad|><|vision_end|><|fim_prefix|>",
    "not special: <|im_start |> < think> <tool_call > </tool_call\n",
    "  leading spaces\n\n\n\ttabs\r\nand   runs   \n",
    "numbers 1234567890 3.14159 -2e10 0x1F and code `def f(x):\n    return x ** 2`",
    "مرحبا بالعالم — नमस्ते दुनिया — Привет, мир",
    "",
]


@pytest.mark.parametrize("text", TEXTS, ids=[f"text{i}" for i in range(len(TEXTS))])
def test_load_tokenizer_gives_the_official_ids(official, text):
    want = raw_ids(official, text)
    assert official["ours"].encode(text, add_special_tokens=False) == want
    assert official["fast"].encode(text, add_special_tokens=False) == want
    renderer = ChatRenderer(official["ours"])
    assert renderer.encode(text) == want
    # Decoding as the rollout does: control tokens dropped, <think>/<tool_call> kept (not special in Qwen3).
    assert renderer.decode(want) == official["raw"].decode(want, skip_special_tokens=True)
    for markup in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>"):
        assert renderer.decode(want).count(markup) == text.count(markup)
    assert "<|im_end|>" not in renderer.decode(want)


def test_stop_and_markup_tokens_are_the_official_ids(official):
    raw, renderer = official["raw"], ChatRenderer(official["ours"])
    assert (
        renderer.stop_token_ids == (raw.token_to_id("<|im_end|>"), raw.token_to_id("<|endoftext|>")) == (151645, 151643)
    )
    assert renderer.im_start_id == raw.token_to_id("<|im_start|>") == 151644
    for token in ("<think>", "</think>", "<tool_call>", "</tool_call>"):
        assert len(raw_ids(official, token)) == 1 and renderer.encode(token) == raw_ids(official, token)


# ----------------------------------------------------------------------------- the ACT context


def _tool_messages(contents):
    return [
        {"role": "tool", "name": "get_balance", "tool_call_id": f"c{i}", "content": c} for i, c in enumerate(contents)
    ]


def play(official, thinking: bool, steps):
    """Plays scripted turns through a Transcript on the official tokenizer, as the rollout does, and yields
    (transcript text, messages, transcript) after every step."""
    renderer = ChatRenderer(official["ours"], enable_thinking=thinking)
    messages = [SYSTEM, {"role": "user", "content": steps[0][1]}]
    t = renderer.start(messages, TOOLS)
    yield t.text(), messages, t
    for kind, payload in steps[1:]:
        if kind == "assistant":
            t.add_assistant(renderer.encode(payload) + [renderer.im_end_id])
            msg, error = make_assistant_message(payload)
            assert error is None
            messages.append(msg)
        elif kind == "tool":
            messages.extend(_tool_messages(payload))
            t.add_tool_responses(payload)
        else:
            messages.append({"role": "user", "content": payload})
            t.add_user(payload)
        yield t.text(), messages, t


def _split_at_last_query(text: str, messages) -> tuple[str, str]:
    last_user = [m["content"] for m in messages if m["role"] == "user"][-1]
    i = text.rindex("<|im_start|>user\n" + last_user)
    return text[:i], text[i:]


def test_act_context_is_the_official_render_with_thinking_on(official):
    """Thinking on: every context of the first user turn (tool responses included) is byte-identical to the
    official template, and so are the ids. After a new user query the official template drops the thinking
    of earlier turns; the ACT context keeps the sampled turns (as the reference's incremental render does)."""
    for ours, messages, t in play(official, True, script(True)):
        theirs = official_text(official, messages, add_generation_prompt=t.awaiting_generation, enable_thinking=True)
        if sum(m["role"] == "user" for m in messages) == 1:
            assert ours == theirs
            assert t.ids == raw_ids(official, theirs)
        else:
            head, tail = _split_at_last_query(ours, messages)
            assert re.sub(r"<think>\n.*?\n</think>\n\n", "", head, flags=re.DOTALL) + tail == theirs
            assert "Two accounts, two calls." in ours and "Two accounts, two calls." not in theirs


def test_act_context_with_thinking_off_differs_only_by_the_empty_think_blocks(official):
    """Thinking off: the generation prompt puts ``<think>\\n\\n</think>\\n\\n`` before every sampled turn, and
    the ACT context keeps it. The official template writes it only before the last assistant message (and
    in the generation prompt), so removing it from every earlier assistant turn gives the official text."""
    empty = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    steps = [
        ("user", "Balance of A1?"),
        ("assistant", call_text("get_balance", {"account": "A1"})[1:]),
        ("tool", ['{"balance": 120}']),
        ("assistant", "Checking B2 too." + call_text("get_balance", {"account": "B2"})),
        ("tool", ['{"balance": 7}']),
        ("assistant", "A1 holds 120 and B2 holds 7."),
    ]
    for n, (ours, messages, t) in enumerate(play(official, False, steps)):
        theirs = official_text(official, messages, add_generation_prompt=t.awaiting_generation, enable_thinking=False)
        keep_from = ours.rindex(empty)  # the generation prompt or the last sampled turn
        assert ours[:keep_from].replace(empty, "<|im_start|>assistant\n") + ours[keep_from:] == theirs, n
        if n <= 1:
            assert ours == theirs and t.ids == raw_ids(official, theirs)


def test_act_context_keeps_a_sampled_think_block_as_written(official):
    """The official template rewrites the think block of a turn after the last query into its canonical
    layout; the ACT context holds the sampled ids, so a non-canonical block stays as sampled."""
    steps = [("user", "Hi"), ("assistant", "<think>ok</think>Hello.")]
    *_, (ours, messages, t) = play(official, True, steps)
    theirs = official_text(official, messages, enable_thinking=True)
    assert ours.replace("<think>ok</think>Hello.", "<think>\nok\n</think>\n\nHello.") == theirs != ours


def test_simulator_prompt_is_the_official_render(official):
    codec = Qwen3ChatCodec(official["ours"])
    record = {"tools": TOOLS, "reference_messages": [{"role": "user", "content": "Balance of A1?"}]}
    history = [SYSTEM, {"role": "user", "content": "Balance of A1?"}]
    text = call_text("get_balance", {"account": "A1"})[1:]
    messages = codec.simulator_messages(record, history, text, ("c0", "get_balance", {"account": "A1"}))
    assert codec.simulator_prompt(record, history, text, ("c0", "get_balance", {"account": "A1"})) == raw_ids(
        official, official_text(official, messages, tools=None, add_generation_prompt=True)
    )


# ----------------------------------------------------------------------------- our template (demo tokenizer)


def _body(text: str) -> str:
    """The render after the system block (where the tools preamble lives)."""
    return text.split("<|im_end|>\n", 1)[1]


def _episode(thinking: bool) -> list[dict]:
    msgs = [SYSTEM]
    for kind, payload in script(thinking):
        if kind == "user":
            msgs.append({"role": "user", "content": payload})
        elif kind == "assistant":
            msgs.append(make_assistant_message(payload)[0])
        else:
            msgs.extend(_tool_messages(payload))
    return msgs


def test_our_template_matches_official_after_the_system_block(official):
    """With ``drop_past_thinking=True`` our template renders every prefix of a two-user-turn tool episode
    (thinking on) as the official one does, apart from the tools preamble."""
    msgs = _episode(True)
    for n in range(2, len(msgs) + 1):
        ours = render_chat_text(msgs[:n], TOOLS, add_generation_prompt=True, drop_past_thinking=True)
        theirs = official_text(official, msgs[:n], add_generation_prompt=True)
        assert _body(ours) == _body(theirs), n
    # Without tools there is no preamble: the whole text is equal.
    assert render_chat_text(msgs[1:5], None, drop_past_thinking=True) == official_text(official, msgs[1:5], tools=None)


def test_our_template_words_the_tools_preamble_its_own_way(official):
    """Same structure and tool lines; the two instruction sentences are ours (a deliberate difference:
    the demo's shipped tokenizers and bases were trained on this wording)."""
    msgs = [SYSTEM, {"role": "user", "content": "q"}]
    ours = render_chat_text(msgs, TOOLS).split("<|im_end|>\n", 1)[0]
    theirs = official_text(official, msgs).split("<|im_end|>\n", 1)[0]
    prefix = "<|im_start|>system\n" + SYSTEM["content"] + "\n\n# Tools\n\n"
    tool_lines = "<tools>\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in TOOLS) + "\n</tools>\n\n"
    example = '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    for s in (ours, theirs):
        assert s.startswith(prefix) and tool_lines in s and s.endswith(example)
    assert ours != theirs


def test_our_template_keeps_past_thinking_unless_asked(official):
    msgs = _episode(True)
    ours, theirs = render_chat_text(msgs, TOOLS), official_text(official, msgs)
    assert "Two accounts, two calls." in ours and "Two accounts, two calls." not in theirs
    assert _body(render_chat_text(msgs, TOOLS, drop_past_thinking=True)) == _body(theirs)


def test_our_template_with_thinking_off_adds_the_empty_think_block_to_every_current_turn(official):
    """Thinking off: ours writes the empty think block before every assistant turn after the last query
    (each was sampled after it); the official template only before the last message."""
    msgs = _episode(False)
    ours = _body(render_chat_text(msgs, TOOLS, enable_thinking=False, drop_past_thinking=True))
    theirs = _body(official_text(official, msgs, enable_thinking=False))
    head, tail = _split_at_last_query(ours, msgs)
    last = tail.rindex("<|im_start|>assistant\n")
    fixed = (
        head
        + tail[:last].replace("<|im_start|>assistant\n<think>\n\n</think>\n\n", "<|im_start|>assistant\n")
        + tail[last:]
    )
    assert fixed == theirs != ours


CALL = {"id": "a", "type": "function", "function": {"name": "get_balance", "arguments": {"account": "A1"}}}
REASONING = {
    "last_turn": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Answer.", "reasoning_content": "\nThink hard.\n"},
    ],
    "call_then_answer": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "need it", "tool_calls": [CALL]},
        {"role": "tool", "content": '{"b": 1}'},
        {"role": "assistant", "content": "It is 1.", "reasoning_content": "done"},
    ],
    "content_and_two_calls": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "\nLet me see.", "reasoning_content": "r", "tool_calls": [CALL, CALL]},
        {"role": "tool", "content": "1"},
        {"role": "tool", "content": "2"},
        {"role": "assistant", "content": "", "reasoning_content": "done"},
    ],
    "past_turn": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "A", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "B", "reasoning_content": "r2"},
    ],
}


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("case", sorted(REASONING))
def test_reasoning_content_is_rendered_as_the_official_template_does(official, case, thinking):
    msgs = REASONING[case]
    theirs = official_text(official, msgs, tools=None, enable_thinking=thinking)
    assert render_chat_text(msgs, enable_thinking=thinking, drop_past_thinking=True) == theirs
    ours_default = render_chat_text(msgs, enable_thinking=thinking)
    if case == "past_turn":  # our default keeps past thinking, reasoning_content included
        assert "<think>\nr1\n</think>\n\nA" in ours_default and "r1" not in theirs
    else:
        assert ours_default == theirs


def test_our_template_edge_differences(official):
    """The remaining differences, each pinned (docs/chat_template.md)."""
    hello = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Hello"}]
    # 1. Thinking on, a last turn without think block: the official template adds an empty one; ours renders it
    #    as given (with thinking on nothing was in front of the model when it wrote it).
    assert official_text(official, hello, tools=None).endswith("<think>\n\n</think>\n\nHello<|im_end|>\n")
    assert render_chat_text(hello).endswith("<|im_start|>assistant\nHello<|im_end|>\n")
    # 2. A user message that is nothing but a <tool_response> block is not a new query for the official
    #    template; with drop_past_thinking ours counts every user message.
    wrapped = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>\nr\n</think>\n\nX"},
        {"role": "user", "content": "<tool_response>\nX\n</tool_response>"},
        {"role": "assistant", "content": "<think>\ns\n</think>\n\nY"},
    ]
    assert "<think>\nr\n</think>" in official_text(official, wrapped, tools=None)
    assert "<think>\nr\n</think>" not in render_chat_text(wrapped, drop_past_thinking=True)
    assert "<think>\nr\n</think>" in render_chat_text(wrapped)
    # 3. A non-canonical think block after the last query: the official template re-lays it out; ours keeps it.
    odd = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>r</think>Y"}]
    assert official_text(official, odd, tools=None).endswith("<think>\nr\n</think>\n\nY<|im_end|>\n")
    assert render_chat_text(odd).endswith("<think>r</think>Y<|im_end|>\n")
    # 4. The tool name is JSON-escaped by ours (the official template pastes it between quotes).
    bad = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": 'a"b', "arguments": {}}}],
        },
    ]
    assert '{"name": "a"b", ' in official_text(official, bad, tools=None)
    assert '{"name": "a\\"b", ' in render_chat_text(bad)
    # 5. A turn whose content is empty gets "\n" before its first call from ours (the demo's turns are sampled
    #    that way, so a re-render gives their ids back); real Qwen3 with thinking off starts the turn with the
    #    call itself, which the official template reproduces and ours re-renders with one more newline.
    sampled = call_text("get_balance", {"account": "A1"})[1:]
    msgs = [{"role": "user", "content": "q"}, make_assistant_message(sampled)[0]]
    assert msgs[1]["content"] == "" and make_assistant_message("\n" + sampled)[0] == msgs[1]
    assert official_text(official, msgs, tools=None, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n" + sampled + "<|im_end|>\n"
    )
    assert render_chat_text(msgs, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n\n" + sampled + "<|im_end|>\n"
    )


# ----------------------------------------------------------------------------- the rollout on the official tokenizer


@pytest.mark.parametrize("thinking", [True, False])
def test_rollout_on_the_official_tokenizer(official, thinking):
    """A rehearsal-mode episode on the official tokenizer, with the turns real Qwen3 writes (thinking off:
    the turn starts with its first call). Both calls are read, and with thinking on the next ACT prompt is
    the official render of the episode's messages, id for id."""
    from envace_jax.rl.judges import RuleJudge
    from envace_jax.rl.reward import ChecklistTurnJudge
    from envace_jax.rl.rollout import RoleSampling, RolloutConfig, RolloutEngine
    from envace_jax.rl.types import ACT
    from tests.helpers_rollout import ScriptedClient, result_text

    calls = call_text("get_balance", {"account": "A1"})[1:] + call_text("get_balance", {"account": "Zürich-7"})
    first = ("<think>\nTwo accounts, two calls.\n</think>\n\n" if thinking else "") + calls
    final = ("<think>\nBoth known.\n</think>\n\n" if thinking else "") + "A1 holds 120; Zürich-7 holds 75.5 CHF."
    user = {"role": "user", "content": "What are the balances of A1 and Zürich-7?"}
    item = {
        "question": "q",
        "focus_on": "assistant.tool_calls",
        "pass_condition": "p",
        "failure_examples": [],
        "evidence": [],
        "weight": 1.0,
        "required_for_next_turn": False,
        "rule": {"type": "tool_called", "name": "get_balance", "arguments": {"account": "Zürich-7"}},
    }
    record = {
        "uid": "r",
        "data_source": "test",
        "messages": [SYSTEM, user],
        "tools": TOOLS,
        "reference_messages": [user, {"role": "assistant", "content": "fine"}],
        "checklist": [[[item]]],
    }
    codec = Qwen3ChatCodec(official["ours"], enable_thinking=thinking)
    client = ScriptedClient(
        codec,
        acts={0: [first, final]},
        rehearsals={0: [result_text('{"balance": 120}'), result_text('{"balance": 75.5}')]},
    )
    rs = RoleSampling(max_new_tokens=512)
    engine = RolloutEngine(
        RolloutConfig(max_model_len=16384, act=rs, rehearse=rs), codec, client, ChecklistTurnJudge(RuleJudge())
    )
    (ep,) = engine.run([record])
    assert ep.turn_rewards == [1.0]
    assistant = ep.messages[2]
    assert assistant["content"] == ("<think>\nTwo accounts, two calls.\n</think>\n" if thinking else "")
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == [{"account": "A1"}, {"account": "Zürich-7"}]
    second_act = [g for g in ep.generations if g.role == ACT][1]
    theirs = official_text(official, ep.messages[:5], add_generation_prompt=True, enable_thinking=thinking)
    if thinking:
        assert second_act.prompt_ids == raw_ids(official, theirs)
    else:  # the sampled turn keeps the empty think block of its generation prompt (difference 2)
        ours = official["raw"].decode(second_act.prompt_ids, skip_special_tokens=False)
        assert (
            ours.replace(
                "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>", "<|im_start|>assistant\n<tool_call>"
            )
            == theirs
        )
