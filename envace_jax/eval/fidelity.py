"""Rehearsal fidelity: how often REHEARSE predicts what the real tool actually returned.

Real trajectories are teacher-forced. At every tool call of a logged conversation (a demo task's
reference conversation, a BFCL ground-truth replay, a tau2 golden-action run) we build the REHEARSE
prompt exactly as the rollout engine does (``codec.simulator_prompt(record, history, caller_text,
call)`` with ``history`` = the messages before that assistant message), let a *rehearser* predict the
response, parse it with ``parse_simulator_output`` and compare it with the logged real response.

The real response is compared in its **JSON view** (``real_view``): the content itself when it parses
as a non-empty JSON object or array (what REHEARSE is asked to emit), ``{"error": text}`` when the
environment flagged the call as failed and the text is not already such an object (BFCL's
``Error during execution: ...``, tau2's ``Error: ...``), and ``{"result": value}`` otherwise (a bare
string or number: BFCL returns ``str(result)`` for non-dict results). A rehearser that reproduces the
real tool therefore emits the JSON view inside ``<execution_result>``.

Measures, per call:
* ``exact``: canonical JSON (sorted keys, numbers compared as JSON numbers) of prediction == real view;
* ``structure``: same key tree and JSON types (``skeleton``; lists compared element by element);
* ``field``: equal leaves / leaf paths of either side (``field_score``; lists by index, an empty
  container is a leaf), so missing and invented fields both count against the prediction;
* ``error_agreement``: prediction says failure == the real call failed. A response is a failure when
  its view is an object with an ``error`` or ``error_tool_call`` key; a prediction that does not parse
  counts as a failure because the rollout hands the caller an ``error_tool_call`` payload for it;
* ``parsed``: the prediction had a well-formed ``<execution_result>`` (reported, not part of the others).

A prediction that does not parse scores 0 on exact, structure and field.

Kind of call. Every case built here from a real environment (``demo_cases``, ``bfcl_cases``,
``tau2_cases``) carries ``state_changed``: whether executing the call at its place in the logged
conversation changed the real environment's state, read by comparing the environment's state before
and after it (``eval.state_change``), never from tool names. tau2 also labels its tools read/write;
that label is kept as ``tool_label`` and shown beside the split, but the report's read-only /
state-changing split is the executed one (a refused write left the state as it was). The report
(``eval.fidelity_report``) splits every measure by kind and by real outcome and gives the optimistic
and pessimistic hallucination rates; its module doc defines them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable, Mapping, Sequence

from envace_jax.chat.simulator import is_failed_result, parse_simulator_output
from envace_jax.chat.tool_parser import CALL_SEPARATOR
from envace_jax.eval import progress
from envace_jax.eval.fidelity_report import CallScore, FidelityReport
from envace_jax.eval.fidelity_report import MEASURES, hallucination_counts, kind_headline  # noqa: F401 (re-exported)
from envace_jax.eval.state_change import logged_calls, replay_state_changes, state_fingerprint, tau2_tool_labels
from envace_jax.rl.policy_client import GenRequest
from envace_jax.rl.rollout import RoleSampling
from envace_jax.rl.types import REHEARSE

ERROR_KEYS = ("error", "error_tool_call")  # what ``chat.simulator.is_failed_result`` looks for


# ----------------------------------------------------------------------------- cases


@dataclasses.dataclass
class FidelityCase:
    """One logged tool call with its real response, and what the REHEARSE prompt needs."""

    domain: str  # e.g. "demo/bank", "bfcl/multi_turn_base", "tau2/airline"
    task_uid: str
    record: Mapping[str, Any]  # task record as the rollout sees it (tools, reference_messages)
    history: list[dict[str, Any]]  # messages before the assistant message that made the call
    caller_text: str  # that assistant message's raw text, calls included
    call: tuple[str, str, dict]  # (call_id, tool name, arguments)
    real_content: str  # the real tool's response, as the caller read it
    real_error: bool  # the environment's own failure flag for this call
    state_changed: bool | None = None  # executing it changed the real environment's state (None: unknown)
    tool_label: str | None = None  # the benchmark's own label of the tool (tau2: read/write/...), if any

    @property
    def tool(self) -> str:
        return self.call[1]


def caller_raw_text(message: Mapping[str, Any]) -> str:
    """The raw text a model would have emitted for an assistant message: content, then each call as
    ``\\n<tool_call>\\n{json}\\n</tool_call>`` (the layout ``parse_tool_calls`` reads)."""
    content = message.get("content") or ""
    calls = "".join(
        CALL_SEPARATOR
        + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}, ensure_ascii=False)
        + "\n</tool_call>"
        for c in message.get("tool_calls") or []
    )
    return content + calls


def _flagged_error(content: str, flag: Any, error_prefixes: Sequence[str]) -> bool:
    if flag is not None:
        return bool(flag)
    return _view_is_error(_json_or_none(content)) or any(content.startswith(p) for p in error_prefixes)


CallKey = tuple[int, str]  # (index of the calling message in the conversation, call id)


def cases_from_conversation(
    record: Mapping[str, Any],
    conversation: Sequence[Mapping[str, Any]],
    domain: str,
    *,
    error_prefixes: Sequence[str] = (),
    state_changes: Mapping[CallKey, bool] | None = None,
    tool_labels: Mapping[CallKey, str] | None = None,
) -> list[FidelityCase]:
    """One case per answered call of the assistant messages of ``conversation``.

    Tool messages are matched to calls by ``tool_call_id``. A tool message may carry ``"error"``
    (the environment's flag, as tau2 golden runs record it); without it the failure is read from the
    content (an ``error``/``error_tool_call`` object, or a text starting with one of ``error_prefixes``).
    Calls made by the user side (``role == "user"`` with tool calls, tau2 telecom) stay in the history
    but are not cases: the rollout never rehearses them.

    ``state_changes`` and ``tool_labels`` (keyed by ``(message index, call id)``, as
    ``state_change.replay_state_changes`` returns them) fill ``state_changed`` and ``tool_label``;
    a call they do not name keeps None.
    """
    uid = str(record.get("uid", ""))
    state_changes, tool_labels = state_changes or {}, tool_labels or {}
    cases: list[FidelityCase] = []
    try:
        calls = list(logged_calls(conversation))
    except ValueError as e:
        raise ValueError(f"task {uid!r} {e}") from None
    for i, msg, call, tool_msg in calls:
        if tool_msg is None:
            continue  # an unanswered call (a cut-off log) has nothing to compare with
        content = tool_msg.get("content")
        content = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        fn = call["function"]
        cases.append(
            FidelityCase(
                domain=domain,
                task_uid=uid,
                record=record,
                history=[dict(m) for m in conversation[:i]],
                caller_text=caller_raw_text(msg),
                call=(call["id"], fn["name"], fn["arguments"]),
                real_content=content,
                real_error=_flagged_error(content, tool_msg.get("error"), error_prefixes),
                state_changed=state_changes.get((i, call["id"])),
                tool_label=tool_labels.get((i, call["id"])),
            )
        )
    return cases


def demo_cases(tasks: Sequence[Mapping[str, Any]]) -> list[FidelityCase]:
    """Cases of the demo suite: each task's reference conversation, after its system prompt, replayed
    on a fresh demo world to find the calls that changed its state."""
    from envace_jax.envs.demo_worlds import make_env

    out = []
    for t in tasks:
        system = [m for m in t["messages"] if m.get("role") == "system"]
        world = t.get("env", {}).get("name") or str(t.get("data_source", "demo")).rsplit("/", 1)[-1]
        conv = system + list(t["reference_messages"])
        try:
            changes = replay_state_changes(make_env(t), conv)
        except ValueError as e:
            raise ValueError(f"demo task {t.get('uid')!r}: {e}") from None
        out += cases_from_conversation(t, conv, f"demo/{world}", state_changes=changes)
    return out


BFCL_ERROR_PREFIXES = ("Error during execution",)
TAU2_ERROR_PREFIXES = ("Error:",)


def bfcl_cases(
    entries: Sequence[Mapping[str, Any]],
    ground_truth: Mapping[str, Sequence[Sequence[str]]],
    *,
    with_reference: bool = False,
) -> list[FidelityCase]:
    """Replays each entry's ground truth on a fresh BFCL environment and makes one case per call.

    Turn by turn: the turn's user messages, then one assistant message per ground-truth call (as a
    model calling one tool per step would), each answered by the real execution. ``with_reference``
    puts the replay into the record's ``reference_messages`` (the REHEARSE few-shot block then shows
    every real result: the reference's grounding, an upper bound); by default it stays empty, as in
    our BFCL evaluation records.
    """
    from envace_jax.envs import bfcl

    out: list[FidelityCase] = []
    for entry in entries:
        if entry["id"] not in ground_truth:
            raise ValueError(f"no ground truth for BFCL entry {entry['id']!r}")
        gt = ground_truth[entry["id"]]
        env = bfcl.BfclMultiTurnEnv(entry)
        record = bfcl.entry_to_task(entry, gt)
        conv: list[dict[str, Any]] = []
        changes: dict[CallKey, bool] = {}
        n = 0
        for turn, calls in zip(entry["question"], gt):
            conv.extend(dict(m) for m in turn)
            for text in calls:
                name, kwargs = env.parse_call(text)
                kwargs = json.loads(json.dumps(kwargs))  # the policy's arguments always come through JSON
                cid = f"gt_{n}"
                n += 1
                before = state_fingerprint(env)
                res = env.execute(name, kwargs)
                changes[(len(conv), cid)] = state_fingerprint(env) != before
                conv.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {"id": cid, "type": "function", "function": {"name": name, "arguments": kwargs}}
                        ],
                    }
                )
                conv.append(
                    {"role": "tool", "name": name, "tool_call_id": cid, "content": res.content, "error": res.error}
                )
        if with_reference:
            record = dict(record, reference_messages=conv)
        out += cases_from_conversation(
            record,
            conv,
            f"bfcl/{bfcl.category_of(entry['id'])}",
            error_prefixes=BFCL_ERROR_PREFIXES,
            state_changes=changes,
        )
    return out


def tau2_cases(domain: str, tasks: Sequence[Any], *, with_reference: bool = False) -> list[FidelityCase]:
    """Cases from tau2 golden-action runs (each reference action executed for real), then replayed on
    the task's fresh environment to find the calls that changed tau2's databases."""
    from envace_jax.envs import tau2

    env = tau2.Tau2Env(domain)
    out: list[FidelityCase] = []
    for task in tasks:
        record = tau2.task_to_record(domain, task)
        conv = list(record["messages"]) + tau2.golden_messages(domain, task, env=env)
        env.reset(task)
        labels = tau2_tool_labels(env, conv)
        try:
            changes = replay_state_changes(env, conv)
        except ValueError as e:
            raise ValueError(f"tau2 task {record['uid']!r}: {e}") from None
        if with_reference:
            record = dict(record, reference_messages=conv[1:])
        out += cases_from_conversation(
            record,
            conv,
            f"tau2/{domain}",
            error_prefixes=TAU2_ERROR_PREFIXES,
            state_changes=changes,
            tool_labels=labels,
        )
    return out


# ----------------------------------------------------------------------------- comparison


def _json_or_none(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _view_is_error(view: Any) -> bool:
    return is_failed_result(view) if isinstance(view, dict) else False


def real_view(content: str, error: bool) -> Any:
    """The JSON value a faithful rehearser would put in ``<execution_result>`` (see the module doc)."""
    value = _json_or_none(content)
    if (isinstance(value, dict) and value) or isinstance(value, list):
        if error and not _view_is_error(value):
            return {"error": value}
        return value
    if error:
        return {"error": content}
    return {"result": value if value is not None else content}


def canonical(value: Any) -> str:
    """Sorted keys, no spaces; 1 and 1.0 are the same JSON number."""
    return json.dumps(_normalise_numbers(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _normalise_numbers(v: Any) -> Any:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: _normalise_numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_normalise_numbers(x) for x in v]
    return v


def _type_name(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    raise TypeError(f"not a JSON value: {type(v).__name__}")


def skeleton(v: Any) -> Any:
    """The key tree with JSON type names at the leaves; lists keep one skeleton per element."""
    if isinstance(v, dict):
        return {k: skeleton(x) for k, x in v.items()}
    if isinstance(v, list):
        return [skeleton(x) for x in v]
    return _type_name(v)


def leaves(v: Any, prefix: tuple = ()) -> dict[tuple, Any]:
    """Leaf path -> value; list indices are path elements; an empty dict/list is itself a leaf."""
    if isinstance(v, dict) and v:
        out: dict[tuple, Any] = {}
        for k, x in v.items():
            out.update(leaves(x, prefix + (("k", k),)))
        return out
    if isinstance(v, list) and v:
        out = {}
        for i, x in enumerate(v):
            out.update(leaves(x, prefix + (("i", i),)))
        return out
    return {prefix: v}


def _leaf_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def field_score(pred: Any, real: Any) -> float:
    """Equal leaves over the union of both sides' leaf paths (1.0 when both are the same leaf)."""
    lp, lr = leaves(pred), leaves(real)
    paths = set(lp) | set(lr)
    same = sum(1 for p in paths if p in lp and p in lr and _leaf_equal(lp[p], lr[p]))
    return same / len(paths)


def compare(prediction_text: str, real_content: str, real_error: bool) -> dict[str, Any]:
    """All measures for one call (see the module doc)."""
    result, parse_error = parse_simulator_output(prediction_text)
    real = real_view(real_content, real_error)
    real_is_error = _view_is_error(real)
    if parse_error is not None:
        return {
            "exact": 0.0,
            "structure": 0.0,
            "field": 0.0,
            "parsed": 0.0,
            "error_agreement": float(real_is_error),
            "predicted_error": True,
            "real_error": real_is_error,
        }
    pred = json.loads(result)
    pred_is_error = _view_is_error(pred)
    return {
        "exact": float(canonical(pred) == canonical(real)),
        "structure": float(skeleton(pred) == skeleton(real)),
        "field": field_score(pred, real),
        "parsed": 1.0,
        "error_agreement": float(pred_is_error == real_is_error),
        "predicted_error": pred_is_error,
        "real_error": real_is_error,
    }


# ----------------------------------------------------------------------------- rehearsers

Rehearser = Callable[[Sequence[FidelityCase]], list[str]]


def oracle_rehearser(cases: Sequence[FidelityCase]) -> list[str]:
    """Returns each logged real response (its JSON view) in the REHEARSE output format."""
    return [
        f"\n<execution_result>\n{json.dumps(real_view(c.real_content, c.real_error), ensure_ascii=False)}"
        f"\n</execution_result>"
        for c in cases
    ]


def constant_rehearser(payload: Any = None) -> Rehearser:
    """Always answers the same JSON (default ``{"status": "ok"}``): the metric's floor."""
    text = json.dumps({"status": "ok"} if payload is None else payload)

    def rehearse(cases: Sequence[FidelityCase]) -> list[str]:
        return [f"\n<execution_result>\n{text}\n</execution_result>" for _ in cases]

    return rehearse


class PolicyRehearser:
    """REHEARSE played by a ``PolicyClient``: prompts built by the codec, ``batch_size`` rows per
    ``generate`` call (all at once by default). Counts prompt and generated tokens."""

    def __init__(
        self,
        codec: Any,
        client: Any,
        sampling: RoleSampling = RoleSampling(temperature=0.0, max_new_tokens=256),
        *,
        batch_size: int | None = None,
        seed: int = 0,
        progress_bar: bool = False,
    ):
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"PolicyRehearser batch_size must be >= 1, got {batch_size}")
        self.codec, self.client, self.sampling = codec, client, sampling
        self.batch_size, self.seed = batch_size, seed
        self.progress_bar = progress_bar  # a bar over the calls rehearsed, on stderr (eval.progress)
        self.generate_calls = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0

    def prompt(self, case: FidelityCase) -> list[int]:
        return self.codec.simulator_prompt(case.record, case.history, case.caller_text, case.call)

    def __call__(self, cases: Sequence[FidelityCase]) -> list[str]:
        reqs = [GenRequest(self.prompt(c), REHEARSE, self.sampling, self.seed + i) for i, c in enumerate(cases)]
        size = self.batch_size or max(1, len(reqs))
        texts: list[str] = []
        bar = progress.count_bar(len(reqs), "REHEARSE", "call") if self.progress_bar else None
        for start in range(0, len(reqs), size):
            chunk = reqs[start : start + size]
            outs = self.client.generate(chunk)
            if len(outs) != len(chunk):
                raise RuntimeError(f"policy client returned {len(outs)} outputs for {len(chunk)} requests")
            self.generate_calls += 1
            self.prompt_tokens += sum(len(r.prompt_ids) for r in chunk)
            self.generated_tokens += sum(len(o.ids) for o in outs)
            texts += [self.codec.decode(list(o.ids)) for o in outs]
            if bar is not None:
                bar.update(len(chunk))
        if bar is not None:
            bar.close()
        return texts


def evaluate_fidelity(
    cases: Sequence[FidelityCase],
    rehearser: Rehearser | Any,
    *,
    codec: Any = None,
    sampling: RoleSampling | None = None,
) -> FidelityReport:
    """Scores ``rehearser`` on ``cases``. ``rehearser`` is a callable (cases -> raw texts) or a
    ``PolicyClient`` (then ``codec`` is required and all prompts go in one ``generate`` call)."""
    if hasattr(rehearser, "generate") and not isinstance(rehearser, PolicyRehearser):
        if codec is None:
            raise ValueError("evaluate_fidelity: a PolicyClient rehearser needs codec=")
        rehearser = PolicyRehearser(codec, rehearser, **({"sampling": sampling} if sampling else {}))
    elif not callable(rehearser):
        raise TypeError(f"rehearser must be a callable or a PolicyClient, got {type(rehearser).__name__}")
    texts = rehearser(list(cases)) if cases else []
    if len(texts) != len(cases):
        raise RuntimeError(f"rehearser returned {len(texts)} predictions for {len(cases)} cases")
    scores = []
    for c, text in zip(cases, texts):
        if not isinstance(text, str):
            raise TypeError(f"rehearser prediction for {c.task_uid}/{c.tool} is {type(text).__name__}, not str")
        m = compare(text, c.real_content, c.real_error)
        scores.append(
            CallScore(
                c.domain,
                c.tool,
                c.task_uid,
                m["exact"],
                m["structure"],
                m["field"],
                m["error_agreement"],
                m["parsed"],
                m["real_error"],
                m["predicted_error"],
                text[:500],
                c.real_content[:500],
                c.state_changed,
                c.tool_label,
            )
        )
    return FidelityReport(scores)
