"""Chat template and incremental rendering to ids, checked against apply_chat_template and Qwen3's format."""

from __future__ import annotations

import pytest

from tests.helpers_chat import SYSTEM, TOOLS, call_text, demo_tokenizer, real_qwen3_template, script

from envace_jax.chat import ChatRenderer, Qwen3ChatCodec, make_assistant_message, render_chat_text
from envace_jax.chat.render import ENV, MODEL, PROMPT, USER


@pytest.fixture(scope="module")
def tok():
    return demo_tokenizer()


def _tool_messages(contents, start=0):
    return [
        {"role": "tool", "name": "get_balance", "tool_call_id": f"c{start + i}", "content": c}
        for i, c in enumerate(contents)
    ]


def _play(renderer: ChatRenderer, steps, *, sampled_of=None):
    """Plays a scripted episode through a Transcript; after every environment piece checks the ids against
    a full apply_chat_template render of the messages so far. Returns (transcript, messages, sampled turns)."""
    tok = renderer.tokenizer
    first_user = {"role": "user", "content": steps[0][1]}
    messages = [SYSTEM, first_user]
    t = renderer.start(messages, TOOLS)
    full = lambda gp: renderer.encode(
        tok.apply_chat_template(
            messages, tools=TOOLS, tokenize=False, add_generation_prompt=gp, enable_thinking=renderer.enable_thinking
        )
    )
    assert t.ids == full(True)
    sampled_turns = []
    for kind, payload in steps[1:]:
        if kind == "assistant":
            sampled = (sampled_of or renderer.encode)(payload) + [renderer.im_end_id]
            span = t.add_assistant(sampled)
            assert t.ids[span.start : span.end] == sampled and span.kind == MODEL
            text = renderer.decode(sampled)
            assert text == payload
            msg, err = make_assistant_message(text)
            assert err is None
            messages.append(msg)
            sampled_turns.append((span, sampled))
        elif kind == "tool":
            messages.extend(_tool_messages(payload))
            t.add_tool_responses(payload)
            if sampled_of is None:
                assert t.ids == full(True)
        else:
            messages.append({"role": "user", "content": payload})
            t.add_user(payload)
            if sampled_of is None:
                assert t.ids == full(True)
    return t, messages, sampled_turns, full


@pytest.mark.parametrize("thinking", [True, False])
def test_incremental_ids_equal_full_template_tokenisation(tok, thinking):
    renderer = ChatRenderer(tok, enable_thinking=thinking)
    t, messages, turns, full = _play(renderer, script(thinking))
    assert t.ids == full(False)
    assert renderer.decode(t.ids) == renderer.decode(full(False))
    mask = t.loss_mask()
    assert sum(mask) == sum(len(s) for _, s in turns)
    for span, sampled in turns:
        assert [t.ids[i] for i in range(span.start, span.end)] == sampled
        assert mask[span.start : span.end] == [1] * len(sampled)
    # Every id belongs to exactly one span, and spans tile the sequence in order.
    assert t.spans[0].start == 0 and t.spans[-1].end == len(t.ids)
    assert all(a.end == b.start for a, b in zip(t.spans, t.spans[1:]))
    assert {s.kind for s in t.spans} == {PROMPT, MODEL, ENV, USER}


def test_pieces_tokenised_alone_equal_whole_text(tok):
    renderer = ChatRenderer(tok)
    t, messages, _, _ = _play(renderer, script(True))
    whole = renderer.encode(t.text())
    assert whole == t.ids
    # Same for every prefix that ends at a span boundary (the sampler's prompts).
    for s in t.spans:
        assert renderer.encode(renderer.tokenizer.decode(t.ids[: s.end])) == t.ids[: s.end]


def test_non_canonical_sampled_ids_are_kept_verbatim(tok):
    """A model may emit a tokenisation BPE would never produce; the context must keep those exact ids."""
    renderer = ChatRenderer(tok)

    def char_by_char(text):
        ids = []
        for piece in _split_keep_specials(text):
            ids.extend(
                renderer.encode(piece)
                if piece.startswith("<") and piece.endswith(">")
                else [i for ch in piece for i in renderer.encode(ch)]
            )
        return ids

    t, messages, turns, full = _play(renderer, script(True), sampled_of=char_by_char)
    assert t.ids != full(False)  # the ids differ from a re-tokenisation...
    assert t.text() == tok.decode(full(False))  # ...but the text is the template's text
    for span, sampled in turns:
        assert t.ids[span.start : span.end] == sampled


def _split_keep_specials(text):
    import re

    return [p for p in re.split(r"(<think>|</think>|<tool_call>|</tool_call>)", text) if p]


def test_thinking_off_empty_content_keeps_text_and_ids(tok):
    # With thinking off the prompt ends in "\n\n"; a turn that starts with "\n" may tokenise differently as a
    # whole, but the transcript text must still equal the template's and the ids must be the sampled ones.
    renderer = ChatRenderer(tok, enable_thinking=False)
    steps = [
        ("user", "Balance of A1?"),
        ("assistant", call_text("get_balance", {"account": "A1"})),
        ("tool", ['{"balance": 1}']),
        ("assistant", "It is 1."),
    ]
    t, messages, turns, full = _play(renderer, steps, sampled_of=renderer.encode)
    assert t.text() == tok.decode(full(False))
    assert t.text().count("<think>\n\n</think>\n\n") == 2


def test_truncated_turn_is_closed_outside_the_loss_mask(tok):
    renderer = ChatRenderer(tok)
    t = renderer.start([{"role": "user", "content": "hi"}])
    cut = renderer.encode("<think>\nlong thought that hit the length lim")
    span = t.add_assistant(cut)
    assert t.ids[span.end :] == [renderer.im_end_id] + renderer.encode("\n")
    assert t.loss_mask()[span.end] == 0 and sum(t.loss_mask()) == len(cut)
    t.add_user("again")
    assert t.awaiting_generation
    with pytest.raises(ValueError, match="generation prompt"):
        renderer.start([{"role": "user", "content": "x"}], add_generation_prompt=False).add_assistant([5])


def test_template_text_matches_hand_written_qwen3_format(tok):
    msgs = [
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "<think>\nr\n</think>\n",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_balance", "arguments": {"account": "A1"}}}
            ],
        },
        {"role": "tool", "name": "get_balance", "tool_call_id": "a", "content": '{"balance": 3}'},
        {"role": "tool", "name": "get_balance", "tool_call_id": "b", "content": '{"balance": 4}'},
    ]
    expected = (
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr\n</think>\n\n<tool_call>\n"
        '{"name": "get_balance", "arguments": {"account": "A1"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"balance": 3}\n</tool_response>\n'
        '<tool_response>\n{"balance": 4}\n</tool_response><|im_end|>\n'
    )
    assert render_chat_text(msgs) == expected
    assert render_chat_text(msgs, add_generation_prompt=True) == expected + "<|im_start|>assistant\n"
    assert render_chat_text(msgs, add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    sys_tools = render_chat_text([SYSTEM, msgs[0]], TOOLS)
    assert sys_tools.startswith("<|im_start|>system\nYou are a careful bank assistant.\n\n# Tools\n")
    tools_block = sys_tools.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    import json

    assert [json.loads(line) for line in tools_block.strip().split("\n")] == TOOLS
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in sys_tools
    assert tok.apply_chat_template(msgs, tokenize=False) == expected


def test_matches_real_qwen3_template_where_formats_agree():
    real = real_qwen3_template()
    if real is None:
        pytest.skip("bfcl-eval (which ships the Qwen3 template text) is not installed")
    steps = script(True)
    msgs = [SYSTEM]
    for kind, payload in steps:
        if kind == "user":
            msgs.append({"role": "user", "content": payload})
        elif kind == "assistant":
            msgs.append(make_assistant_message(payload)[0])
        else:
            msgs.extend(_tool_messages(payload))
    # Up to the last user query: the real template drops past thinking; ours does with drop_past_thinking.
    # Everything after the system block must then be identical (our tools instruction is worded differently).
    body = lambda s: s.split("<|im_end|>\n", 1)[1]
    for n in range(2, len(msgs) + 1):
        ours = render_chat_text(msgs[:n], TOOLS, add_generation_prompt=True, drop_past_thinking=True)
        theirs = render_chat_text(msgs[:n], TOOLS, add_generation_prompt=True, chat_template=real)
        if msgs[n - 1]["role"] == "assistant" and "<think>" not in msgs[n - 1]["content"]:
            continue
        assert body(ours) == body(theirs), f"prefix of {n} messages differs"
    # Without dropping, ours keeps the first turn's thinking where the real template drops it.
    ours_keep = render_chat_text(msgs, TOOLS)
    assert "Two accounts, two calls." in ours_keep
    assert "Two accounts, two calls." not in render_chat_text(msgs, TOOLS, chat_template=real)


def test_bad_messages_are_named(tok):
    renderer = ChatRenderer(tok)
    with pytest.raises(ValueError, match=r"messages\[1\]"):
        renderer.render_messages([{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}])
    with pytest.raises(ValueError, match="non-empty"):
        renderer.render_messages([])
    with pytest.raises(ValueError, match="tool response 0"):
        renderer.tool_responses_ids([{"not": "a string"}])


def test_codec_pieces_agree_with_transcript(tok):
    codec = Qwen3ChatCodec(tok)
    steps = script(True)
    msgs = [SYSTEM, {"role": "user", "content": steps[0][1]}]
    t = codec.renderer.start(msgs, TOOLS)
    ids = codec.caller_prompt(msgs, TOOLS)
    assert ids == t.ids
    sampled = codec.renderer.encode(steps[1][1]) + [codec.renderer.im_end_id]
    t.add_assistant(sampled)
    ids = ids + sampled + codec.close_assistant(sampled)
    t.add_tool_responses(steps[2][1])
    ids = ids + codec.tool_block(_tool_messages(steps[2][1]))
    t.add_user("more")
    ids = ids + codec.user_block({"role": "user", "content": "more"})
    assert ids == t.ids
    assert codec.decode(sampled) == steps[1][1]
    assert set(codec.stop_token_ids) == {
        tok.convert_tokens_to_ids("<|im_end|>"),
        tok.convert_tokens_to_ids("<|endoftext|>"),
    }
