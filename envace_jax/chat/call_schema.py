"""Does a tool call match the tool's declared schema? (name, arguments: JSON Schema via ``jsonschema``)

Only what the prompt itself declares is checked, so the answer is available wherever the policy is:
the tool exists, the arguments are an object, required ones are present, no undeclared one is passed,
enumerated values are among the choices, and the JSON types agree. Benchmarks write non-standard types
(BFCL's ``"dict"``, ``"float"``, ``"tuple"``); a type JSON Schema does not know is not checked.

Used by test-time rehearsal (``eval.rehearsal``): an imagined tool that refused a call the schema
accepts is a claim about the world's state, which only the real tool can settle; a call the schema
rejects is the policy's own mistake, and rehearsal has found it before the real attempt.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jsonschema

from envace_jax.chat.simulator import find_tool

_JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


def map_types(node: Any, rename: Callable[[str], str | None]) -> Any:
    """A copy of the JSON schema ``node`` with every ``"type"`` name ``t`` replaced by ``rename(t)``
    (None drops it; a list of types keeps the names that survive), at any depth. Property names are
    data, not schema keywords: only their schemas are walked."""
    if isinstance(node, list):
        return [map_types(x, rename) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "type" and isinstance(v, (str, list)):
            kept = [n for n in (rename(t) for t in ([v] if isinstance(v, str) else v) if isinstance(t, str)) if n]
            if kept:
                out[k] = kept[0] if isinstance(v, str) else kept
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: map_types(s, rename) for name, s in v.items()}
        else:
            out[k] = map_types(v, rename)
    return out


def call_problem(name: str, arguments: Any, tools: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the call ``name(arguments)`` does not match ``tools`` (OpenAI function schemas), or None."""
    fn = find_tool(tools, name)
    if fn is None:
        return f"no tool named {name!r}"
    if not isinstance(arguments, Mapping):
        return f"arguments of {name} are not an object"
    params = fn.get("parameters") or {}
    schema = map_types(dict(params), lambda t: t if t in _JSON_TYPES else None)
    schema.setdefault("type", "object")
    if "properties" in schema:  # a declared parameter list is the whole list
        schema.setdefault("additionalProperties", False)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(dict(arguments)), key=lambda e: list(e.path))
    if not errors:
        return None
    parts = []
    for e in errors:
        where = ".".join(str(p) for p in e.path)
        parts.append(f"{where + ': ' if where else ''}{e.message}")
    return f"{name}: " + "; ".join(parts)
