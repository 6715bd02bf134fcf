"""CM2 checklist task records: loading, validation, reference-layout conversion, filters.

A record is a plain dict (cross-team contract 2):

    {"uid": str, "data_source": str,
     "messages": [system?, first user message],
     "tools": [OpenAI function schemas],
     "reference_messages": [the full reference conversation],
     "checklist": checklist_list,          # [c][turn][item] -> item dict
     "env": optional {"name": str, "state": dict}}

Host-side only (no jax). Every error raised for bad input is a ``RecordError`` (a ValueError)
whose message names the record (index and uid when known) and the field path that is wrong,
so a bad line in a 100k-row file can be found without a debugger.

The reference (verl/CM2 parquet, spec section 3.2) keeps the prompt under ``messages`` (or
``prompt``) and everything else under ``extra_info``; ``from_reference_row`` converts that layout.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Callable, Iterable, Mapping, Sequence

log = logging.getLogger(__name__)

FOCUS_ON = (
    "assistant.tool_calls",
    "assistant.content.thinking",
    "assistant.content.user_visible_reply",
    "tool.content",
)
ITEM_KEYS = (
    "question",
    "focus_on",
    "pass_condition",
    "failure_examples",
    "evidence",
    "weight",
    "required_for_next_turn",
)
ROLES = ("system", "user", "assistant", "tool")
RULE_TYPES = ("tool_called", "tool_not_called", "reply_contains", "all", "any")
# Columns whose values are nested JSON; our parquet stores them as JSON strings because rows
# carry heterogeneous dicts (tool arguments, evidence) that a fixed Arrow schema cannot hold.
JSON_FIELDS = ("messages", "tools", "reference_messages", "checklist", "env")
# The reference drops prompts longer than max_prompt_length - 500 tokens (spec 3.2).
REFERENCE_PROMPT_MARGIN = 500


class RecordError(ValueError):
    """A task record is malformed; the message names the record and the field."""


def _where(index: int | None, rec: Any) -> str:
    uid = rec.get("uid") if isinstance(rec, Mapping) else None
    parts = []
    if index is not None:
        parts.append(f"record {index}")
    if uid is not None:
        parts.append(f"uid={uid!r}")
    return " ".join(parts) if parts else "record"


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# --------------------------------------------------------------------------- tool schemas


def validate_tool_schema(schema: Any, where: str) -> None:
    """Checks one OpenAI function schema; ``where`` prefixes the error (e.g. 'record 3: tools[1]')."""
    if not isinstance(schema, Mapping):
        raise RecordError(f"{where}: tool schema must be a dict, got {type(schema).__name__}")
    if schema.get("type") != "function":
        raise RecordError(f"{where}.type: must be 'function', got {schema.get('type')!r}")
    fn = schema.get("function")
    if not isinstance(fn, Mapping):
        raise RecordError(f"{where}.function: must be a dict, got {type(fn).__name__}")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise RecordError(f"{where}.function.name: must be a non-empty string, got {name!r}")
    if "description" in fn and fn["description"] is not None and not isinstance(fn["description"], str):
        raise RecordError(f"{where}.function.description: must be a string")
    params = fn.get("parameters")
    if params is None:
        return
    if not isinstance(params, Mapping):
        raise RecordError(f"{where}.function.parameters: must be a dict, got {type(params).__name__}")
    if params.get("type", "object") != "object":
        raise RecordError(f"{where}.function.parameters.type: must be 'object', got {params.get('type')!r}")
    props = params.get("properties", {})
    if props is None:
        props = {}
    if not isinstance(props, Mapping):
        raise RecordError(f"{where}.function.parameters.properties: must be a dict")
    for pname, pschema in props.items():
        if not isinstance(pschema, Mapping):
            raise RecordError(f"{where}.function.parameters.properties.{pname}: must be a dict")
    req = params.get("required", [])
    if req is None:
        req = []
    if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
        raise RecordError(f"{where}.function.parameters.required: must be a list of strings, got {req!r}")


# --------------------------------------------------------------------------- messages


def _validate_message(msg: Any, where: str) -> None:
    if not isinstance(msg, Mapping):
        raise RecordError(f"{where}: message must be a dict, got {type(msg).__name__}")
    role = msg.get("role")
    if role not in ROLES:
        raise RecordError(f"{where}.role: must be one of {ROLES}, got {role!r}")
    content = msg.get("content", "")
    if content is not None and not isinstance(content, str):
        raise RecordError(f"{where}.content: must be a string, got {type(content).__name__}")
    if role == "assistant":
        calls = msg.get("tool_calls") or []
        if not isinstance(calls, list):
            raise RecordError(f"{where}.tool_calls: must be a list")
        for j, call in enumerate(calls):
            cw = f"{where}.tool_calls[{j}]"
            fn = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(fn, Mapping):
                raise RecordError(f"{cw}.function: must be a dict")
            if not isinstance(fn.get("name"), str) or not fn["name"]:
                raise RecordError(f"{cw}.function.name: must be a non-empty string")
            if not isinstance(fn.get("arguments"), Mapping):
                raise RecordError(
                    f"{cw}.function.arguments: must be a parsed dict, got {type(fn.get('arguments')).__name__}"
                )
    if role == "tool" and not isinstance(msg.get("content"), str):
        raise RecordError(f"{where}.content: a tool message needs string content")


def _validate_messages(msgs: Any, where: str, *, need_user: bool) -> None:
    if not isinstance(msgs, list) or not msgs:
        raise RecordError(f"{where}: must be a non-empty list of messages")
    for i, m in enumerate(msgs):
        _validate_message(m, f"{where}[{i}]")
    if need_user and not any(m["role"] == "user" for m in msgs):
        raise RecordError(f"{where}: contains no user message")


# --------------------------------------------------------------------------- checklist and rules


def validate_rule(rule: Any, where: str = "rule") -> None:
    """Checks a rule-judge rule (contract 3); the one validator the records and the rule judge share.
    Raises RecordError (a ValueError) naming ``where`` and the bad field."""
    if not isinstance(rule, Mapping):
        raise RecordError(f"{where}: rule must be a dict, got {type(rule).__name__}")
    kind = rule.get("type")
    if kind not in RULE_TYPES:
        raise RecordError(f"{where}.type: unknown rule type {kind!r} (expected one of {RULE_TYPES})")
    if kind in ("tool_called", "tool_not_called"):
        if not isinstance(rule.get("name"), str) or not rule["name"]:
            raise RecordError(f"{where}.name: {kind} rule needs a non-empty string 'name'")
        if kind == "tool_called" and not isinstance(rule.get("arguments", {}), Mapping):
            raise RecordError(f"{where}.arguments: tool_called 'arguments' must be a dict")
    elif kind == "reply_contains":
        vals = rule.get("values")
        # an empty list would pass every reply: reject it rather than hand out free credit
        if not isinstance(vals, list) or not vals or not all(isinstance(v, str) for v in vals):
            raise RecordError(f"{where}.values: reply_contains needs 'values', a non-empty list of strings")
    else:
        subs = rule.get("rules")
        if not isinstance(subs, list) or not subs:
            raise RecordError(f"{where}.rules: {kind} rule needs 'rules', a non-empty list")
        for k, sub in enumerate(subs):
            validate_rule(sub, f"{where}.rules[{k}]")


def check_scoring_fields(item: Any, where: str) -> None:
    """The fields the checklist scorer reads: ``weight`` (a finite number >= 0), ``focus_on``, and
    ``required_for_next_turn`` (a bool, default False)."""
    if not isinstance(item, Mapping):
        raise RecordError(f"{where}: checklist item must be a dict")
    if not _is_number(item.get("weight")) or item["weight"] < 0:
        raise RecordError(f"{where}.weight: must be a finite non-negative number, got {item.get('weight')!r}")
    if item.get("focus_on") not in FOCUS_ON:
        raise RecordError(f"{where}.focus_on: must be one of {FOCUS_ON}, got {item.get('focus_on')!r}")
    if not isinstance(item.get("required_for_next_turn", False), bool):
        raise RecordError(f"{where}.required_for_next_turn: must be a bool, got {item.get('required_for_next_turn')!r}")


def validate_checklist_list(checklist_list: Any, where: str = "checklist_list") -> None:
    """What scoring a turn needs of a checklist list (``rl.reward`` calls it on every judged turn):
    lists of checklists of turns of items, each item's scoring fields valid. ``validate_record`` checks
    a stored record more strictly (every item key, non-empty turns, weights summing to 1)."""
    if not isinstance(checklist_list, (list, tuple)):
        raise RecordError(f"{where} must be a list, got {type(checklist_list).__name__}")
    for c, checklist in enumerate(checklist_list):
        if not isinstance(checklist, (list, tuple)):
            raise RecordError(f"{where}[{c}] must be a list of turns")
        for t, turn in enumerate(checklist):
            if not isinstance(turn, (list, tuple)):
                raise RecordError(f"{where}[{c}][{t}] must be a list of items")
            for k, item in enumerate(turn):
                check_scoring_fields(item, f"{where}[{c}][{t}][{k}]")


def _validate_item(item: Any, where: str) -> None:
    check_scoring_fields(item, where)
    for key in ITEM_KEYS:
        if key not in item:
            raise RecordError(f"{where}: checklist item is missing key {key!r}")
    for key in ("question", "pass_condition"):
        if not isinstance(item[key], str):
            raise RecordError(f"{where}.{key}: must be a string")
    if not isinstance(item["failure_examples"], list) or not all(isinstance(x, str) for x in item["failure_examples"]):
        raise RecordError(f"{where}.failure_examples: must be a list of strings")
    if not isinstance(item["evidence"], list) or not all(isinstance(x, Mapping) for x in item["evidence"]):
        raise RecordError(f"{where}.evidence: must be a list of dicts")
    if "rule" in item and item["rule"] is not None:
        validate_rule(item["rule"], f"{where}.rule")


def _validate_checklist(cl: Any, where: str, weight_tol: float | None) -> None:
    if not isinstance(cl, list) or not cl:
        raise RecordError(f"{where}: must be a non-empty list of checklists")
    for c, turns in enumerate(cl):
        if not isinstance(turns, list) or not turns:
            raise RecordError(f"{where}[{c}]: must be a non-empty list of turns")
        for t, items in enumerate(turns):
            tw = f"{where}[{c}][{t}]"
            if not isinstance(items, list) or not items:
                raise RecordError(f"{tw}: must be a non-empty list of checklist items")
            for k, item in enumerate(items):
                _validate_item(item, f"{tw}[{k}]")
            total = sum(float(it["weight"]) for it in items)
            if weight_tol is not None and abs(total - 1.0) > weight_tol:
                raise RecordError(f"{tw}: item weights sum to {total:.4f}, expected 1 (+-{weight_tol})")


# --------------------------------------------------------------------------- records


def validate_record(
    rec: Any, index: int | None = None, *, max_num_checklist: int | None = 1, weight_tol: float | None = 0.02
) -> dict[str, Any]:
    """Validates one record and returns a normalised copy.

    The copy has its checklist truncated to ``max_num_checklist`` (the reference uses 1; None
    keeps all) and optional fields filled (``data_source`` "", ``env`` None). ``weight_tol``
    bounds how far a turn's weights may sum away from 1 (None disables the check).
    """
    w = _where(index, rec)
    if not isinstance(rec, Mapping):
        raise RecordError(f"{w}: must be a dict, got {type(rec).__name__}")
    for key in ("uid", "messages", "tools", "reference_messages", "checklist"):
        if key not in rec:
            raise RecordError(f"{w}: missing field {key!r}")
    if not isinstance(rec["uid"], str) or not rec["uid"]:
        raise RecordError(f"{w}.uid: must be a non-empty string, got {rec['uid']!r}")
    ds = rec.get("data_source", "")
    if not isinstance(ds, str):
        raise RecordError(f"{w}.data_source: must be a string")
    _validate_messages(rec["messages"], f"{w}.messages", need_user=True)
    if not isinstance(rec["tools"], list):
        raise RecordError(f"{w}.tools: must be a list of tool schemas")
    for i, schema in enumerate(rec["tools"]):
        validate_tool_schema(schema, f"{w}.tools[{i}]")
    names = [s["function"]["name"] for s in rec["tools"]]
    if len(set(names)) != len(names):
        raise RecordError(f"{w}.tools: duplicate tool names {sorted(n for n in set(names) if names.count(n) > 1)}")
    _validate_messages(rec["reference_messages"], f"{w}.reference_messages", need_user=True)
    if max_num_checklist is not None and max_num_checklist < 1:
        raise ValueError(f"max_num_checklist must be >= 1 or None, got {max_num_checklist}")
    checklist = rec["checklist"]
    if isinstance(checklist, list) and max_num_checklist is not None:
        checklist = checklist[:max_num_checklist]
    _validate_checklist(checklist, f"{w}.checklist", weight_tol)
    env = rec.get("env")
    if env is not None:
        if not isinstance(env, Mapping) or not isinstance(env.get("name"), str):
            raise RecordError(f"{w}.env: must be None or a dict with a string 'name'")
        if not isinstance(env.get("state", {}), Mapping):
            raise RecordError(f"{w}.env.state: must be a dict")
    out = dict(rec)
    out["data_source"] = ds
    out["checklist"] = checklist
    out["env"] = None if env is None else {"name": env["name"], "state": dict(env.get("state", {}))}
    return out


def _maybe_json(value: Any, where: str) -> Any:
    if isinstance(value, (str, bytes)):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise RecordError(f"{where}: not valid JSON ({e.msg} at char {e.pos})") from None
    return value


def _clean_message(msg: Any, where: str, call_names: dict[str, str]) -> dict[str, Any]:
    """Converts one reference message to contract form: drops the None fields that Arrow's
    struct union adds, parses string tool arguments, names tool messages from their call id."""
    if not isinstance(msg, Mapping):
        raise RecordError(f"{where}: message must be a dict, got {type(msg).__name__}")
    out = {k: v for k, v in msg.items() if v is not None}
    if out.get("role") == "assistant":
        out.setdefault("content", "")
        calls = []
        for j, call in enumerate(out.get("tool_calls") or []):
            if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
                raise RecordError(f"{where}.tool_calls[{j}].function: must be a dict")
            fn = dict(call["function"])
            args = fn.get("arguments")
            fn["arguments"] = {} if args is None else _maybe_json(args, f"{where}.tool_calls[{j}].function.arguments")
            cid = call.get("id") or f"call_{j}"
            call_names[cid] = fn.get("name", "")
            calls.append({"id": cid, "type": "function", "function": fn})
        if calls:
            out["tool_calls"] = calls
        else:
            out.pop("tool_calls", None)
    elif out.get("role") == "tool":
        if "name" not in out and out.get("tool_call_id") in call_names:
            out["name"] = call_names[out["tool_call_id"]]
        if not isinstance(out.get("content", ""), str):
            out["content"] = json.dumps(out["content"], ensure_ascii=False)
    return out


def _clean_messages(msgs: Any, where: str) -> list[dict[str, Any]]:
    msgs = _maybe_json(msgs, where)
    if not isinstance(msgs, list):
        raise RecordError(f"{where}: must be a list of messages, got {type(msgs).__name__}")
    names: dict[str, str] = {}
    return [_clean_message(m, f"{where}[{i}]", names) for i, m in enumerate(msgs)]


def from_reference_row(row: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Converts one verl/CM2 parquet row (spec 3.2) to our record dict (not yet validated)."""
    w = f"record {index}"
    extra = _maybe_json(row.get("extra_info"), f"{w}.extra_info")
    if not isinstance(extra, Mapping):
        raise RecordError(f"{w}.extra_info: must be a dict")
    prompt = row.get("messages", row.get("prompt"))
    if prompt is None:
        raise RecordError(f"{w}: missing field 'messages' (or 'prompt')")
    kw = _maybe_json(extra.get("interaction_kwargs"), f"{w}.extra_info.interaction_kwargs") or {}
    if "checklist_list" not in kw:
        raise RecordError(f"{w}.extra_info.interaction_kwargs: missing field 'checklist_list'")
    uid_src = extra.get("original_index", extra.get("index", index))
    tools = _maybe_json(extra.get("tools", []), f"{w}.extra_info.tools")
    ref = extra.get("messages")
    if ref is None:
        raise RecordError(f"{w}.extra_info: missing field 'messages'")
    rec: dict[str, Any] = {
        "uid": str(uid_src),
        "data_source": str(row.get("data_source", "") or ""),
        "messages": _clean_messages(prompt, f"{w}.messages"),
        "tools": tools if tools is not None else [],
        "reference_messages": _clean_messages(ref, f"{w}.extra_info.messages"),
        "checklist": _maybe_json(kw["checklist_list"], f"{w}.extra_info.interaction_kwargs.checklist_list"),
    }
    if extra.get("env") is not None:
        rec["env"] = _maybe_json(extra["env"], f"{w}.extra_info.env")
    return rec


def _read_rows(path: str) -> list[dict[str, Any]]:
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.endswith((".jsonl", ".json")):
        rows = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise RecordError(f"{path} line {lineno}: not valid JSON ({e.msg})") from None
        return rows
    raise ValueError(f"load_records: unsupported file type {path!r} (want .jsonl, .json or .parquet)")


def load_records(
    path: str | os.PathLike,
    *,
    max_num_checklist: int | None = 1,
    weight_tol: float | None = 0.02,
    drop_invalid_tools: bool = False,
) -> list[dict[str, Any]]:
    """Reads and validates task records from JSONL or parquet, ours or the reference layout.

    A row with an ``extra_info`` field is taken to be in the reference layout and converted.
    ``drop_invalid_tools=True`` reproduces the reference, which silently drops samples whose
    tool schemas fail validation; we log each drop. By default a bad schema is an error.
    """
    path = os.fspath(path)
    out = []
    for i, row in enumerate(_read_rows(path)):
        if not isinstance(row, Mapping):
            raise RecordError(f"record {i}: must be a dict, got {type(row).__name__}")
        if "extra_info" in row and row["extra_info"] is not None:
            rec = from_reference_row(row, i)
        else:
            rec = dict(row)
            for key in JSON_FIELDS:
                if isinstance(rec.get(key), str):
                    rec[key] = _maybe_json(rec[key], f"{_where(i, rec)}.{key}")
        if drop_invalid_tools:
            try:
                if not isinstance(rec.get("tools"), list):
                    raise RecordError(f"{_where(i, rec)}.tools: must be a list of tool schemas")
                for j, schema in enumerate(rec["tools"]):
                    validate_tool_schema(schema, f"{_where(i, rec)}.tools[{j}]")
            except RecordError as e:
                log.warning("dropping record with invalid tools: %s", e)
                continue
        out.append(validate_record(rec, i, max_num_checklist=max_num_checklist, weight_tol=weight_tol))
    return out


def save_jsonl(records: Iterable[Mapping[str, Any]], path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def save_parquet(records: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    """Writes records with nested fields as JSON strings (our layout; ``load_records`` reads it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols: dict[str, list] = {"uid": [], "data_source": []}
    for key in JSON_FIELDS:
        cols[key] = []
    for rec in records:
        cols["uid"].append(rec["uid"])
        cols["data_source"].append(rec.get("data_source", ""))
        for key in JSON_FIELDS:
            val = rec.get(key)
            cols[key].append(None if val is None else json.dumps(val, ensure_ascii=False))
    pq.write_table(pa.table({k: pa.array(v, type=pa.string()) for k, v in cols.items()}), os.fspath(path))


def prompt_length_filter(
    records: Sequence[Mapping[str, Any]], tokenizer_fn: Callable[[Mapping[str, Any]], int], max_prompt_tokens: int
) -> list[dict[str, Any]]:
    """Keeps records whose templated prompt is at most ``max_prompt_tokens`` tokens.

    ``tokenizer_fn(record)`` returns the prompt length (messages + tools rendered by the chat
    template), which keeps this module free of any tokenizer. The reference uses
    ``max_prompt_tokens = max_prompt_length - 500`` (see ``reference_prompt_limit``).
    """
    if max_prompt_tokens <= 0:
        raise ValueError(f"max_prompt_tokens must be positive, got {max_prompt_tokens}")
    kept = []
    for i, rec in enumerate(records):
        n = tokenizer_fn(rec)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"tokenizer_fn returned {n!r} for {_where(i, rec)}; expected a token count")
        if n <= max_prompt_tokens:
            kept.append(dict(rec))
    if len(kept) < len(records):
        log.info(
            "prompt_length_filter: dropped %d of %d records over %d tokens",
            len(records) - len(kept),
            len(records),
            max_prompt_tokens,
        )
    return kept


def reference_prompt_limit(max_prompt_length: int) -> int:
    """The reference's prompt filter bound: ``max_prompt_length - 500`` (4000 -> 3500)."""
    return max_prompt_length - REFERENCE_PROMPT_MARGIN
