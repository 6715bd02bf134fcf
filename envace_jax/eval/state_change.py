"""Which logged tool calls changed the real environment's state: read from the environment, not from names.

A call is **state-changing** when executing it, at its place in the logged conversation, changed the
state of the real environment that produced the log: ``state_fingerprint`` is taken before and after
the call and compared. Nothing is inferred from tool names or from a benchmark's own read/write
labels, so a ``transfer`` refused for insufficient funds is not state-changing, and a ``cd`` in BFCL's
file system is (the working directory decides what ``ls`` answers next).

What the fingerprint covers, per environment:
* demo worlds (``envs.demo_worlds``): every attribute of the world object (balances, stock, orders,
  the next order number, slots);
* BFCL multi-turn (``envs.bfcl``): every attribute of every API instance, private ones included
  (the current directory, the seeded random generators that draw new ids and readings), except two
  that no later response can depend on: ``_last_modified``, a wall-clock time GorillaFileSystem stamps
  on each write and that no API returns, and TravelAPI's ``_flight_cost_lookup``, a cache that
  ``get_flight_cost`` overwrites and that ``book_flight`` reads only right after refilling it;
* tau2 (``envs.tau2``): tau2's own hashes of the agent database and of the user database.

``replay_state_changes`` re-executes a logged conversation on a freshly reset environment and checks
that every replayed response equals the logged one (as text, or as JSON where a stored log re-serialised
it); a difference means the log was not made from
that state, and the labels would describe other calls, so it raises.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import random
from typing import Any, Iterator, Mapping, Sequence

# Attributes that change without changing anything an API can return (see the module doc).
BFCL_UNOBSERVABLE_ATTRS = frozenset({"_last_modified", "_flight_cost_lookup"})


def logged_calls(
    conversation: Sequence[Mapping[str, Any]], roles: Sequence[str] = ("assistant",)
) -> Iterator[tuple[int, Mapping[str, Any], Mapping[str, Any], Mapping[str, Any] | None]]:
    """``(message index, message, call, answering tool message or None)`` for each call made by a
    message of one of ``roles``, in call order. Answers are the tool messages right after the message,
    matched by ``tool_call_id``."""
    for i, msg in enumerate(conversation):
        if msg.get("role") not in roles or not msg.get("tool_calls"):
            continue
        answers: dict[Any, Mapping[str, Any]] = {}
        for later in conversation[i + 1 :]:
            if later.get("role") != "tool":
                break
            answers[later.get("tool_call_id")] = later
        for j, call in enumerate(msg["tool_calls"]):
            if "id" not in call or "function" not in call:
                raise ValueError(f"message {i}: tool_calls[{j}] lacks 'id' or 'function'")
            yield i, msg, call, answers.get(call["id"])


# ----------------------------------------------------------------------------- fingerprints


def _plain(value: Any, path: str, seen: dict[int, str], skip: frozenset) -> Any:
    """A JSON-able picture of ``value``; an object met twice is a reference to its first path, so
    parent pointers and aliases neither loop nor hide which object they point to."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (datetime.date, datetime.time)):
        return ["<time>", value.isoformat()]
    if isinstance(value, datetime.timedelta):
        return ["<timedelta>", value.total_seconds()]
    if id(value) in seen:
        return ["<ref>", seen[id(value)]]
    seen[id(value)] = path
    if isinstance(value, random.Random):
        return ["<rng>", hashlib.sha256(repr(value.getstate()).encode()).hexdigest()]
    if isinstance(value, Mapping):
        items = [(_plain(k, f"{path}.<key>", {}, skip), k, v) for k, v in value.items()]
        items.sort(key=lambda kv: json.dumps(kv[0], sort_keys=True))
        return ["<map>"] + [[pk, _plain(v, f"{path}[{pk!r}]", seen, skip)] for pk, _, v in items]
    if isinstance(value, (list, tuple)):
        return ["<seq>"] + [_plain(x, f"{path}[{n}]", seen, skip) for n, x in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        members = [_plain(x, f"{path}{{}}", {}, skip) for x in value]
        return ["<set>"] + sorted(members, key=lambda m: json.dumps(m, sort_keys=True))
    if hasattr(value, "__dict__"):
        attrs = {k: v for k, v in vars(value).items() if k not in skip}
        return ["<obj>", type(value).__qualname__] + [
            [k, _plain(attrs[k], f"{path}.{k}", seen, skip)] for k in sorted(attrs)
        ]
    return ["<repr>", type(value).__qualname__, repr(value)]


def object_fingerprint(obj: Any, skip_attrs: frozenset = frozenset()) -> str:
    """SHA-256 of the structural picture of ``obj`` (attributes named in ``skip_attrs`` left out)."""
    picture = _plain(obj, "$", {}, frozenset(skip_attrs))
    return hashlib.sha256(json.dumps(picture, sort_keys=True, default=repr).encode()).hexdigest()


def state_fingerprint(env: Any) -> str:
    """A value that changes exactly when the environment's state changes (see the module doc)."""
    from envace_jax.envs.bfcl import BfclMultiTurnEnv
    from envace_jax.envs.demo_worlds import DemoWorld
    from envace_jax.envs.tau2 import Tau2Env

    if isinstance(env, DemoWorld):
        return object_fingerprint(env)
    if isinstance(env, BfclMultiTurnEnv):
        return object_fingerprint(env.instances, BFCL_UNOBSERVABLE_ATTRS)
    if isinstance(env, Tau2Env):
        if env.environment is None:
            raise RuntimeError("state_fingerprint: the tau2 environment needs a reset first")
        return json.dumps([env.environment.get_db_hash(), env.environment.get_user_db_hash()])
    raise TypeError(
        f"state_fingerprint: no state reader for {type(env).__name__}; "
        "expected a demo world, a BfclMultiTurnEnv or a Tau2Env"
    )


# ----------------------------------------------------------------------------- replay


def _same_response(replayed: str, logged: str) -> bool:
    """Equal text, or equal JSON values: stored logs may re-serialise a JSON response (spacing, key order)."""
    if replayed == logged:
        return True
    try:
        return json.loads(replayed) == json.loads(logged)
    except (ValueError, RecursionError):
        return False


def replay_state_changes(env: Any, conversation: Sequence[Mapping[str, Any]]) -> dict[tuple[int, str], bool]:
    """Re-executes every answered call of ``conversation`` (assistant and user side, in order) on
    ``env``, which must be freshly reset to the state the log started from.

    Returns ``{(message index, call id): changed}``. Raises ValueError when a replayed response (text
    or error flag, where the log records one) differs from the logged one. Calls the log never answered
    are not executed: nothing says they ran.
    """
    out: dict[tuple[int, str], bool] = {}
    before = state_fingerprint(env)
    for i, msg, call, answer in logged_calls(conversation, roles=("assistant", "user")):
        if answer is None:
            continue
        fn = call["function"]
        kwargs = {"requestor": "user"} if msg.get("role") == "user" else {}
        res = env.execute(fn.get("name"), fn.get("arguments"), **kwargs)
        logged = answer.get("content")
        logged = logged if isinstance(logged, str) else json.dumps(logged, ensure_ascii=False)
        if not _same_response(res.content, logged) or ("error" in answer and bool(answer["error"]) != res.error):
            raise ValueError(
                f"replay of call {call['id']!r} ({fn.get('name')!r}, message {i}) returned "
                f"{res.content[:200]!r} (error={res.error}); the log says {logged[:200]!r}: "
                "the log was not made from this environment state"
            )
        after = state_fingerprint(env)
        out[(i, call["id"])] = after != before
        before = after
    return out


def tau2_tool_labels(env: Any, conversation: Sequence[Mapping[str, Any]]) -> dict[tuple[int, str], str]:
    """tau2's own label (``read``, ``write``, ``think``, ``generic``) of each assistant call's tool,
    ``{(message index, call id): label}``; calls of unknown tools are left out."""
    from envace_jax.envs.tau2 import tool_type

    out = {}
    for i, _, call, _ in logged_calls(conversation):
        label = tool_type(env, call["function"].get("name"))
        if label is not None:
            out[(i, call["id"])] = label
    return out


__all__ = [
    "BFCL_UNOBSERVABLE_ATTRS",
    "logged_calls",
    "object_fingerprint",
    "replay_state_changes",
    "state_fingerprint",
    "tau2_tool_labels",
]
