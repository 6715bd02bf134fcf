"""parse_tool_calls and parse_simulator_output: a table of malformed and adversarial outputs, plus fuzzing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from envace_jax.chat import (
    SIMULATOR_ERROR_CODES,
    TOOL_CALL_ERROR_CODES,
    is_error_result,
    make_assistant_message,
    parse_simulator_output,
    parse_tool_calls,
    split_assistant_text,
    strip_think,
)


def block(body: str) -> str:
    return f"\n<tool_call>\n{body}\n</tool_call>"


def code_of(error) -> str:
    assert set(error) == {"error_tool_call"} and isinstance(error["error_tool_call"], str)
    return error["error_tool_call"].split(":", 1)[0]


GOOD = '{"name": "get_balance", "arguments": {"account": "A1"}}'

TOOL_CALL_CASES = [
    # (id, text, expected calls or None, expected error code or None)
    ("final_answer", "<think>\nplan\n</think>\n\nThe balance is 3.", [], None),
    ("empty_text", "", [], None),
    (
        "one_call",
        "<think>\nx\n</think>\n" + block(GOOD),
        [{"name": "get_balance", "arguments": {"account": "A1"}}],
        None,
    ),
    (
        "parameters_first",
        block('{"name": "f", "parameters": {"a": 1}, "arguments": {"a": 2}}'),
        [{"name": "f", "arguments": {"a": 1}}],
        None,
    ),
    (
        "list_block",
        block('[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"b": [1, 2]}}]'),
        [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"b": [1, 2]}}],
        None,
    ),
    (
        "two_blocks",
        block(GOOD) + block('{"name": "transfer", "arguments": {"amount": 2.5}}'),
        [{"name": "get_balance", "arguments": {"account": "A1"}}, {"name": "transfer", "arguments": {"amount": 2.5}}],
        None,
    ),
    (
        "unicode_args",
        block('{"name": "f", "arguments": {"city": "Z\\u00fcrich", "s": "中文"}}'),
        [{"name": "f", "arguments": {"city": "Zürich", "s": "中文"}}],
        None,
    ),
    ("unclosed", "\n<tool_call>\n" + GOOD, [], "NO_TOOL_CALL_FOUND"),
    ("mention_only", "I could use <tool_call> here.", [], "NO_TOOL_CALL_FOUND"),
    ("bad_json", block('{"name": "f", "arguments": {'), [], "JSON_DECODE_ERROR"),
    ("trailing_garbage", block(GOOD + " extra"), [], "JSON_DECODE_ERROR"),
    ("python_dict", block("{'name': 'f', 'arguments': {}}"), [], "JSON_DECODE_ERROR"),
    ("scalar_block", block("42"), [], "JSON_DECODE_ERROR"),
    ("list_with_scalar", block('[{"name": "f", "arguments": {}}, 3]'), [], "JSON_DECODE_ERROR"),
    ("deep_nesting", block("[" * 100000 + "]" * 100000), [], "JSON_DECODE_ERROR"),
    ("empty_list", block("[]"), [], "NO_TOOL_CALL_FOUND"),
    ("no_arguments", block('{"name": "f"}'), [], "NO_ARGUMENTS"),
    ("null_arguments", block('{"name": "f", "arguments": null}'), [], "NO_ARGUMENTS"),
    ("string_arguments", block('{"name": "f", "arguments": "{\\"a\\": 1}"}'), [], "NO_ARGUMENTS"),
    ("nan_arguments", block('{"name": "f", "arguments": {"x": NaN}}'), [], "NON_SERIALIZABLE_ARGUMENTS"),
    ("inf_arguments", block('{"name": "f", "arguments": {"x": -Infinity}}'), [], "NON_SERIALIZABLE_ARGUMENTS"),
    ("missing_name", block('{"arguments": {}}'), [], "INVALID_TOOL_NAME"),
    ("empty_name", block('{"name": "", "arguments": {}}'), [], "INVALID_TOOL_NAME"),
    ("blank_name", block('{"name": "  ", "arguments": {}}'), [], "INVALID_TOOL_NAME"),
    ("numeric_name", block('{"name": 7, "arguments": {}}'), [], "INVALID_TOOL_NAME"),
    # Break-then-clear: one bad block discards the good ones before and after it.
    ("bad_block_clears_all", block(GOOD) + block('{"name": "f"}') + block(GOOD), [], "NO_ARGUMENTS"),
    # Faithful: the scan includes thinking, so a call written while reasoning counts.
    (
        "call_inside_think",
        "<think>\nmaybe" + block(GOOD) + "\n</think>\n\nNo call needed.",
        [{"name": "get_balance", "arguments": {"account": "A1"}}],
        None,
    ),
    ("bad_call_inside_think", "<think>\nlike" + block("{oops") + "\n</think>\n\nAnswer.", [], "JSON_DECODE_ERROR"),
]


# Where the two syntaxes differ: only the whitespace around a block (qwen3: any; reference: "\n" on each side).
GET_A1 = [{"name": "get_balance", "arguments": {"account": "A1"}}]
G = '{"name": "g", "arguments": {}}'
SYNTAX_CASES = [
    # (id, text, {syntax: (expected calls, expected error code or None)})
    (
        "no_leading_newline",
        "<tool_call>\n" + GOOD + "\n</tool_call>",
        {"qwen3": (GET_A1, None), "reference": ([], "NO_TOOL_CALL_FOUND")},
    ),
    (
        "same_line",
        "\n<tool_call>" + GOOD + "</tool_call>",
        {"qwen3": (GET_A1, None), "reference": ([], "NO_TOOL_CALL_FOUND")},
    ),
    (
        "first_of_two_unprefixed",
        "<tool_call>\n" + GOOD + "\n</tool_call>" + block(G),
        {
            "qwen3": (GET_A1 + [{"name": "g", "arguments": {}}], None),
            "reference": ([{"name": "g", "arguments": {}}], None),
        },
    ),
    (
        "glued_to_think",
        "<think>\nx\n</think><tool_call>" + GOOD + "</tool_call>",
        {"qwen3": (GET_A1, None), "reference": ([], "NO_TOOL_CALL_FOUND")},
    ),
]
SYNTAX_TABLE = [(cid, text, syntax, *want[syntax]) for cid, text, want in SYNTAX_CASES for syntax in want] + [
    (cid, text, syntax, calls, code) for cid, text, calls, code in TOOL_CALL_CASES for syntax in ("qwen3", "reference")
]


@pytest.mark.parametrize("case_id,text,syntax,calls,code", SYNTAX_TABLE, ids=[f"{c[0]}-{c[2]}" for c in SYNTAX_TABLE])
def test_parse_tool_calls_table(case_id, text, syntax, calls, code):
    got_calls, error = parse_tool_calls(text, syntax=syntax)
    assert got_calls == calls
    if code is None:
        assert error is None
    else:
        assert code_of(error) == code
        assert code in TOOL_CALL_ERROR_CODES


@pytest.mark.parametrize("syntax", ["qwen3", "reference"])
def test_ignore_think_skips_calls_written_while_reasoning(syntax):
    parse = lambda t: parse_tool_calls(t, ignore_think=True, syntax=syntax)
    text = "<think>\nlike" + block("{oops") + "\n</think>\n\nAnswer."
    assert parse(text) == ([], None)
    assert split_assistant_text(text, True, syntax=syntax) == text
    text = "<think>\nmaybe" + block(GOOD) + "\n</think>\n" + block('{"name": "g", "arguments": {}}')
    assert parse(text) == ([{"name": "g", "arguments": {}}], None)
    # The content runs to the call that counts, the one in the thinking included.
    assert split_assistant_text(text, True, syntax=syntax) == text.split("\n</think>\n")[0] + "\n</think>\n"
    # A generation prompt may open the think block itself: only the orphan </think> appears.
    assert parse("reason" + block(GOOD) + "\n</think>\n\nDone.") == ([], None)
    # An unclosed think (length cut) hides everything after it.
    assert parse("<think>\n" + block(GOOD)) == ([], None)


def test_strip_think_variants():
    assert strip_think("<think>\na\n</think>\n\nB") == "\n\nB"
    assert strip_think("a</think>B") == "B"
    assert strip_think("A<think>b") == "A"
    assert strip_think("plain") == "plain"


def test_lone_surrogate_in_arguments_is_replaced():
    calls, error = parse_tool_calls(block('{"name": "f", "arguments": {"s": "a\\ud800b"}}'))
    assert error is None and calls[0]["arguments"] == {"s": "a\ufffdb"}
    json.dumps(calls, ensure_ascii=False).encode("utf-8")


def test_make_assistant_message_layout():
    text = "<think>\nr\n</think>\n" + block(GOOD) + block('{"name": "g", "arguments": {"k": 1}}')
    msg, error = make_assistant_message(text, call_id_prefix="call_7_2")
    assert error is None
    assert msg == {
        "role": "assistant",
        "content": "<think>\nr\n</think>\n",
        "tool_calls": [
            {
                "id": "call_7_2_0",
                "type": "function",
                "function": {"name": "get_balance", "arguments": {"account": "A1"}},
            },
            {"id": "call_7_2_1", "type": "function", "function": {"name": "g", "arguments": {"k": 1}}},
        ],
    }
    assert split_assistant_text("no calls here") == "no calls here"
    msg, error = make_assistant_message("x" + block("{bad"))
    assert code_of(error) == "JSON_DECODE_ERROR" and "tool_calls" not in msg and msg["content"] == "x"


def sim(body: str, think: str = "<think>\nok\n</think>\n") -> str:
    return f"{think}\n<execution_result>\n{body}\n</execution_result>"


SIM_CASES = [
    ("object", sim('{"balance": 3}'), '{"balance": 3}', None),
    ("redump_spacing", sim('{"a":1,"b":[1,2]}'), '{"a": 1, "b": [1, 2]}', None),
    ("redump_unicode", sim('{"city": "Z\\u00fcrich"}'), '{"city": "Zürich"}', None),
    ("list", sim('[{"id": 1}]'), '[{"id": 1}]', None),
    ("empty_list_allowed", sim("[]"), "[]", None),
    ("no_think", '\n<execution_result>\n{"a": 1}\n</execution_result>', '{"a": 1}', None),
    ("first_match_wins", sim('{"a": 1}') + sim('{"b": 2}', think=""), '{"a": 1}', None),
    ("empty", "", None, "EMPTY_SIMULATOR_OUTPUT"),
    ("whitespace", "  \n ", None, "EMPTY_SIMULATOR_OUTPUT"),
    ("only_think", "<think>\nhmm\n</think>", None, "EMPTY_SIMULATOR_OUTPUT"),
    ("no_tag", '{"balance": 3}', None, "NO_EXECUTION_RESULT_TAG_FOUND"),
    (
        "tag_only_in_think",
        "<think>\n<execution_result>\n{}\n</execution_result>\n</think>\nok",
        None,
        "NO_EXECUTION_RESULT_TAG_FOUND",
    ),
    ("same_line", '<execution_result>{"a": 1}</execution_result>', None, "EXECUTION_RESULT_TAG_MALFORMED"),
    ("unclosed", '\n<execution_result>\n{"a": 1}', None, "EXECUTION_RESULT_TAG_MALFORMED"),
    ("bad_json", sim('{"a": '), None, "SIMULATOR_JSON_DECODE_ERROR"),
    ("deep", sim("[" * 100000 + "]" * 100000), None, "SIMULATOR_JSON_DECODE_ERROR"),
    ("empty_object", sim("{}"), None, "INVALID_EXECUTION_RESULT_TYPE"),
    ("string", sim('"ok"'), None, "INVALID_EXECUTION_RESULT_TYPE"),
    ("number", sim("3"), None, "INVALID_EXECUTION_RESULT_TYPE"),
    ("null", sim("null"), None, "INVALID_EXECUTION_RESULT_TYPE"),
    ("nan", sim('{"x": NaN}'), None, "NON_SERIALIZABLE_EXECUTION_RESULT"),
    ("lone_surrogate", sim('{"s": "a\\ud800"}'), '{"s": "a\ufffd"}', None),
]


@pytest.mark.parametrize("case_id,text,result,code", SIM_CASES, ids=[c[0] for c in SIM_CASES])
def test_parse_simulator_output_table(case_id, text, result, code):
    got, error = parse_simulator_output(text)
    assert got == result
    if code is None:
        assert error is None
    else:
        assert set(error) == {"error_tool_call"}
        assert set(error["error_tool_call"]) == {"code", "message", "details"}
        assert error["error_tool_call"]["code"] == code and code in SIMULATOR_ERROR_CODES
        assert is_error_result(json.dumps(error)) and is_error_result(error)


def test_is_error_result():
    assert is_error_result('{"error_tool_call": {"code": "TOOL_NOT_AVAILABLE"}}')
    assert is_error_result('{"error_tool_call": "JSON_DECODE_ERROR: x"}')
    assert not is_error_result('{"balance": 3}')
    assert not is_error_result('[{"error_tool_call": 1}]')
    assert not is_error_result("error_tool_call")
    assert not is_error_result("")


def test_the_three_error_questions_differ_on_purpose():
    from envace_jax.chat.simulator import is_error_tool_message, is_failed_result

    verdict, real_error, ok = '{"error_tool_call": {"code": "X"}}', '{"error": "insufficient funds"}', '{"ok": 1}'
    # ends an episode: only the simulator's / parser's verdict, not a real tool's ordinary error reply
    assert [is_error_result(c) for c in (verdict, real_error, ok)] == [True, False, False]
    # a call that did not work: either
    assert [is_failed_result(c) for c in (verdict, real_error, ok, "not json")] == [True, True, False, False]
    # the judge's message test (reference: content contains error_tool_call, or the parse-error message)
    msg = lambda content, name="get": {"role": "tool", "name": name, "content": content}
    assert is_error_tool_message(msg(verdict)) and is_error_tool_message(msg("x", name="error_tool_call"))
    assert is_error_tool_message(msg("text mentioning error_tool_call"))
    assert not is_error_tool_message(msg(real_error))
    assert not is_error_tool_message({"role": "user", "content": verdict})


# ------------------------------------------------------------------ fuzzing
_pieces = st.sampled_from(
    [
        "\n",
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
        "<execution_result>",
        "</execution_result>",
        "{",
        "}",
        "[",
        "]",
        '"name"',
        '"arguments"',
        '"parameters"',
        ":",
        ",",
        '"f"',
        "1",
        "NaN",
        "null",
        '"\\ud800"',
        " ",
        "{}",
        "[]",
    ]
)
_texts = st.one_of(st.text(max_size=200), st.lists(st.one_of(_pieces, st.text(max_size=5)), max_size=40).map("".join))


@settings(max_examples=300, deadline=None)
@given(_texts, st.booleans())
def test_fuzz_parse_tool_calls_never_raises(text, ignore_think):
    for syntax in ("qwen3", "reference"):
        calls, error = parse_tool_calls(text, ignore_think=ignore_think, syntax=syntax)
        _check_parse(text, calls, error)
        content = split_assistant_text(text, ignore_think, syntax=syntax)
        assert text.startswith(content)


def _check_parse(text, calls, error):
    assert isinstance(calls, list)
    if error is not None:
        assert calls == [] and code_of(error) in TOOL_CALL_ERROR_CODES
    for c in calls:
        assert set(c) == {"name", "arguments"} and isinstance(c["name"], str) and c["name"].strip()
        assert isinstance(c["arguments"], dict)
        json.dumps(c, ensure_ascii=False, allow_nan=False).encode("utf-8")
    if "<tool_call>" not in text:
        assert (calls, error) == ([], None)


@settings(max_examples=300, deadline=None)
@given(_texts)
def test_fuzz_parse_simulator_output_never_raises(text):
    result, error = parse_simulator_output(text)
    assert (result is None) != (error is None)
    if error is not None:
        assert error["error_tool_call"]["code"] in SIMULATOR_ERROR_CODES
    else:
        value = json.loads(result)
        assert (isinstance(value, dict) and value) or isinstance(value, list)
        assert json.dumps(value, ensure_ascii=False) == result
        result.encode("utf-8")
