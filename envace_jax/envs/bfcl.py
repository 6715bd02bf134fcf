"""BFCL-v4 adapters: executable multi-turn environments, call-form conversions, loaders, checkers.

Uses the offline pieces of ``bfcl-eval`` (an optional extra: ``make eval-deps``): its
stateful API classes (GorillaFileSystem, TradingBot, ...), its data files, and its own
checkers (``multi_turn_checker``, ``ast_checker``), so a score here is BFCL's score.

Why we do not call BFCL's execution helper in rollouts: it ``eval``s the model's call
text (blocking only a handful of names) and keeps instances in module globals forever.
``BfclMultiTurnEnv`` instead dispatches a parsed (name, kwargs) pair to a public bound
method, and holds its instances itself, one set per environment object.

Trajectory form used by the checkers: ``trajectory[turn][step]`` is a list of
``(name, kwargs)`` pairs, the calls of one assistant message.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import os
import sys
import tempfile
import types
from typing import Any, Mapping, Sequence

from envace_jax.chat.call_schema import map_types
from envace_jax.envs.base import ToolEnvironment, ToolResult

MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
SINGLE_TURN_CATEGORIES = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
ENV_NAME = "bfcl_multi_turn"

Call = tuple[str, dict[str, Any]]

_INSTALL_HINT = (
    "the BFCL adapter needs the optional package bfcl-eval; install the benchmark "
    "extras into the project venv with `make eval-deps`"
)


def _require_bfcl() -> None:
    """Imports bfcl_eval lazily, pointing its output root away from site-packages first."""
    # bfcl_eval creates result/, score/ and lock dirs under BFCL_PROJECT_ROOT at import time;
    # unset, that is inside site-packages.
    if "BFCL_PROJECT_ROOT" not in os.environ:
        os.environ["BFCL_PROJECT_ROOT"] = tempfile.mkdtemp(prefix="envace_bfcl_")
    try:
        import bfcl_eval  # noqa: F401 (imported only to check that it is installed)
    except ImportError as e:
        raise ImportError(_INSTALL_HINT) from e


def _install_model_config_stub() -> None:
    """ast_checker imports bfcl_eval.constants.model_config, which imports every vendor SDK.

    The checker only reads ``MODEL_CONFIG_MAPPING[name].underscore_to_dot``; we never rename
    dotted function names, so a mapping that answers False for every model is exact for us.
    """
    name = "bfcl_eval.constants.model_config"
    if name in sys.modules:
        return

    class _NoRename:
        underscore_to_dot = False

    class _AnyModel(dict):
        def __getitem__(self, key):
            return _NoRename()

    stub = types.ModuleType(name)
    stub.MODEL_CONFIG_MAPPING = _AnyModel()
    sys.modules[name] = stub


# ----------------------------------------------------------------------------- loaders


def load_entries(category: str) -> list[dict[str, Any]]:
    """BFCL entries of one category, with ``function`` docs filled in (multi-turn too)."""
    if category not in MULTI_TURN_CATEGORIES + SINGLE_TURN_CATEGORIES:
        raise ValueError(
            f"unsupported BFCL category {category!r}; expected one of {MULTI_TURN_CATEGORIES + SINGLE_TURN_CATEGORIES}"
        )
    _require_bfcl()
    from bfcl_eval.utils import load_dataset_entry

    return load_dataset_entry(category)


def load_ground_truth(category: str) -> dict[str, Any]:
    """Ground truth by entry id: multi-turn -> per-turn call strings; single-turn -> possible answers."""
    if category not in MULTI_TURN_CATEGORIES + SINGLE_TURN_CATEGORIES:
        raise ValueError(f"unsupported BFCL category {category!r}")
    _require_bfcl()
    from bfcl_eval.utils import load_ground_truth_entry

    return {g["id"]: g["ground_truth"] for g in load_ground_truth_entry(category)}


def category_of(entry_id: str) -> str:
    """'multi_turn_base_12' -> 'multi_turn_base'; 'live_simple_3-2-0' -> 'live_simple'."""
    return entry_id.rsplit("_", 1)[0]


# ----------------------------------------------------------------------------- schemas

# BFCL writes Python-flavoured type names; JSON schema needs its own. "any" becomes "string"
# as in BFCL's own OpenAPI mapping (bfcl_eval/constants/type_mappings.py: GORILLA_TO_OPENAPI).
_JSON_TYPE = {
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "any": "string",
    "list": "array",
    "bool": "boolean",
    "int": "integer",
    "str": "string",
}


def _json_schema(node: Any) -> Any:
    return map_types(node, lambda t: _JSON_TYPE.get(t, t))


def function_doc_to_schema(doc: Mapping[str, Any], *, include_response: bool = False) -> dict[str, Any]:
    """One BFCL function doc -> an OpenAI tool schema ``{"type": "function", "function": {...}}``.

    ``include_response`` keeps BFCL's response schema (multi-turn docs have one) under
    ``function["response"]``, for prompts that describe what a tool returns.
    """
    for key in ("name", "parameters"):
        if key not in doc:
            raise ValueError(f"BFCL function doc lacks {key!r}: {str(doc)[:200]}")
    fn = {
        "name": doc["name"],
        "description": doc.get("description", ""),
        "parameters": _json_schema(copy.deepcopy(doc["parameters"])),
    }
    if include_response and "response" in doc:
        fn["response"] = _json_schema(copy.deepcopy(doc["response"]))
    return {"type": "function", "function": fn}


# ----------------------------------------------------------------------------- call forms


def _literal(node: ast.AST, where: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError as e:
        raise ValueError(f"non-literal argument in BFCL call {where!r}") from e


def parse_call_string(text: str, param_names: Sequence[str] | None = None) -> Call:
    """A BFCL call string -> ``(name, kwargs)``; only literals are accepted, nothing is evaluated.

    Positional arguments (the ground truth has some, e.g. ``sort('final_report.pdf')``) are
    named with ``param_names`` in order; without it they are an error.
    """
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not a Python call: {text!r}") from e
    call = tree.body
    if not isinstance(call, ast.Call):
        raise ValueError(f"not a function call: {text!r}")
    parts = []
    fn = call.func
    while isinstance(fn, ast.Attribute):
        parts.append(fn.attr)
        fn = fn.value
    if not isinstance(fn, ast.Name):
        raise ValueError(f"call target is not a name: {text!r}")
    name = ".".join([fn.id] + parts[::-1])
    kwargs: dict[str, Any] = {}
    if call.args:
        if param_names is None or len(call.args) > len(param_names):
            raise ValueError(
                f"cannot name the positional arguments of {text!r} (parameters known: {list(param_names or [])})"
            )
        for pname, node in zip(param_names, call.args):
            kwargs[pname] = _literal(node, text)
    for kw in call.keywords:
        if kw.arg is None:
            raise ValueError(f"**kwargs are not allowed in a BFCL call: {text!r}")
        if kw.arg in kwargs:
            raise ValueError(f"argument {kw.arg!r} given twice in {text!r}")
        kwargs[kw.arg] = _literal(kw.value, text)
    return name, kwargs


def format_call(name: str, kwargs: Mapping[str, Any]) -> str:
    """``(name, kwargs)`` -> BFCL keyword-form call text, e.g. ``cd(folder='document')``.

    Keyword form always: BFCL's text decoder silently drops positional arguments.
    """
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")"


def result_to_string(result: Any) -> str:
    """BFCL's rule for turning an execution result into the text the model reads."""
    # Exact type checks on purpose: BFCL uses type(x) == str / dict, so subclasses go to str().
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except Exception:
            return str(result)
    return str(result)


# ----------------------------------------------------------------------------- environment


class BfclMultiTurnEnv(ToolEnvironment):
    """Fresh instances of one BFCL multi-turn entry's API classes; safe dispatch by method name.

    ``reset`` accepts a BFCL entry (``id``, ``initial_config``, ``involved_classes``, ...) or one
    of our task records whose ``env`` is ``{"name": "bfcl_multi_turn", "state": <BFCL entry>}``.
    """

    def __init__(
        self,
        entry: Mapping[str, Any] | None = None,
        *,
        long_context: bool | None = None,
        include_response_schema: bool = False,
    ):
        _require_bfcl()
        self._long_context_override = long_context
        self._include_response = include_response_schema
        self.instances: dict[str, Any] = {}
        self._methods: dict[str, Any] = {}
        self._schemas: list[dict[str, Any]] = []
        self.entry: dict[str, Any] | None = None
        if entry is not None:
            self.reset(entry)

    @staticmethod
    def _entry_of(task: Mapping[str, Any]) -> dict[str, Any]:
        env = task.get("env")
        if isinstance(env, Mapping):
            if env.get("name") != ENV_NAME:
                raise ValueError(f"task env name is {env.get('name')!r}, expected {ENV_NAME!r}")
            task = env.get("state") or {}
        for key in ("id", "involved_classes"):
            if key not in task:
                raise ValueError(f"BFCL entry lacks {key!r} (uid/id: {task.get('uid', task.get('id'))!r})")
        return dict(task)

    def reset(self, task: Mapping[str, Any]) -> None:
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        entry = self._entry_of(task)
        long_context = self._long_context_override
        if long_context is None:
            long_context = "long_context" in category_of(entry["id"])
        config = entry.get("initial_config") or {}
        self.instances, self._methods = {}, {}
        for cls_name in entry["involved_classes"]:
            if cls_name not in CLASS_FILE_PATH_MAPPING:
                raise ValueError(f"entry {entry['id']!r}: unknown BFCL class {cls_name!r}")
            inst = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls_name]), cls_name)()
            if cls_name not in STATELESS_CLASSES:
                inst._load_scenario(copy.deepcopy(config.get(cls_name, {})), long_context=long_context)
            self.instances[cls_name] = inst
            # Later classes win a shared method name, as in BFCL's own name->instance map.
            for mname, method in inspect.getmembers(inst, predicate=inspect.ismethod):
                if not mname.startswith("_"):
                    self._methods[mname] = method
        self.entry = entry
        docs = entry.get("function")
        if docs is None:
            docs = _class_docs(entry["involved_classes"])
        self._schemas = [function_doc_to_schema(d, include_response=self._include_response) for d in docs]

    def add_functions(self, docs: Sequence[Mapping[str, Any]]) -> None:
        """Reveals held-out docs (miss_func turns); the methods were callable all along, as in BFCL."""
        self._schemas.extend(function_doc_to_schema(d, include_response=self._include_response) for d in docs)

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return list(self._schemas)

    def param_names(self, name: str) -> list[str]:
        if name not in self._methods:
            raise KeyError(f"no public method {name!r} among {sorted(self.instances)}")
        return list(inspect.signature(self._methods[name]).parameters)

    def parse_call(self, text: str) -> Call:
        """A BFCL ground-truth call string -> (name, kwargs), naming positional args by signature."""
        name = text.split("(", 1)[0].strip()
        names = self.param_names(name) if name in self._methods else None
        return parse_call_string(text, names)

    def execute(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        if self.entry is None:
            raise RuntimeError("BfclMultiTurnEnv.execute called before reset")
        if not isinstance(name, str) or name.startswith("_") or name not in self._methods:
            # The text a BFCL model sees for an unknown function is Python's NameError.
            return ToolResult(f"Error during execution: name {name!r} is not defined", error=True)
        if not isinstance(arguments, Mapping):
            return ToolResult(
                f"Error during execution: arguments of {name!r} must be an object, got {type(arguments).__name__}",
                error=True,
            )
        try:
            result = self._methods[name](**dict(arguments))
        except Exception as e:  # the tool's own failure is the response, as in BFCL
            return ToolResult(f"Error during execution: {e}", error=True)
        error = type(result) is dict and "error" in result
        return ToolResult(result_to_string(result), error=bool(error))

    def state(self) -> dict[str, dict[str, Any]]:
        """Public attributes per class: what BFCL's state checker compares."""
        return {c: {k: v for k, v in vars(i).items() if not k.startswith("_")} for c, i in self.instances.items()}


def _class_docs(classes: Sequence[str]) -> list[dict[str, Any]]:
    from bfcl_eval.constants.eval_config import MULTI_TURN_FUNC_DOC_PATH
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    docs = []
    for c in classes:
        with open(MULTI_TURN_FUNC_DOC_PATH / MULTI_TURN_FUNC_DOC_FILE_MAPPING[c]) as f:
            docs.extend(json.loads(line) for line in f if line.strip())
    return docs


def entry_to_task(entry: Mapping[str, Any], ground_truth: Sequence[Sequence[str]] | None = None) -> dict[str, Any]:
    """A multi-turn BFCL entry as one of our task records (contract 2), checklist left empty.

    ``user_turns`` keeps every turn's user messages; ``messages`` holds the first turn only.
    """
    turns = entry["question"]
    first = list(turns[0]) if turns else []
    task = {
        "uid": entry["id"],
        "data_source": f"bfcl/{category_of(entry['id'])}",
        "messages": first,
        "tools": [function_doc_to_schema(d) for d in entry.get("function", [])],
        "reference_messages": [],
        "checklist": [],
        "env": {"name": ENV_NAME, "state": copy.deepcopy(dict(entry))},
        "user_turns": [list(t) for t in turns],
    }
    if ground_truth is not None:
        task["ground_truth"] = [list(t) for t in ground_truth]
    return task


# ----------------------------------------------------------------------------- checkers


def ground_truth_trajectory(env: BfclMultiTurnEnv, ground_truth: Sequence[Sequence[str]]) -> list[list[list[Call]]]:
    """Per-turn GT call strings -> our trajectory form, one call per step (as a model would)."""
    return [[[env.parse_call(s)] for s in turn] for turn in ground_truth]


def check_multi_turn(
    trajectory: Sequence[Sequence[Sequence[Call]]],
    entry: Mapping[str, Any],
    ground_truth: Sequence[Sequence[str]],
    *,
    model_name: str = "envace",
) -> dict[str, Any]:
    """BFCL's multi_turn_checker (plus its irrelevance check) on our trajectory.

    BFCL keeps checker instances in module globals keyed by (model_name, entry id); a unique
    suffix per call keeps one check from seeing another's state.
    """
    _require_bfcl()
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
        multi_turn_checker,
        multi_turn_irrelevance_checker,
    )

    if len(trajectory) != len(ground_truth):
        return {
            "valid": False,
            "error_type": "multi_turn:force_terminated",
            "error_message": f"{len(trajectory)} turns in the trajectory, {len(ground_truth)} in the ground truth",
        }
    decoded = [[[format_call(n, kw) for n, kw in step] for step in turn if step] for turn in trajectory]
    name = f"{model_name}_{_next_check_id()}"
    before = set(vars(multi_turn_utils))
    try:
        result = multi_turn_checker(
            decoded, [list(t) for t in ground_truth], copy.deepcopy(dict(entry)), category_of(entry["id"]), name
        )
        if result.get("valid"):
            irrelevance = multi_turn_irrelevance_checker(decoded, [list(t) for t in ground_truth])
            if not irrelevance.get("valid"):
                result = irrelevance
    finally:
        # Free the instances BFCL parked in its module globals for this check.
        for key in set(vars(multi_turn_utils)) - before:
            delattr(multi_turn_utils, key)
    return result


_CHECK_COUNTER = [0]


def _next_check_id() -> int:
    _CHECK_COUNTER[0] += 1
    return _CHECK_COUNTER[0]


def _pick(answers: Any, *, structured: bool = True) -> tuple[bool, Any]:
    """First acceptable value of a possible-answer list; (False, None) when omission is the only choice.

    Only a parameter's own dict (or list-of-dicts) answer holds per-key acceptable lists, as
    BFCL's dict_checker reads it; values one level further down are compared literally.
    """
    for a in answers:
        if a == "":
            continue
        if structured and isinstance(a, dict):
            return True, _pick_dict(a)
        if structured and isinstance(a, list) and a and all(isinstance(x, dict) for x in a):
            return True, [_pick_dict(x) for x in a]
        return True, a
    return False, None


def _pick_dict(answer: Mapping[str, list]) -> dict[str, Any]:
    out = {}
    for k, vs in answer.items():
        keep, v = _pick(vs, structured=False)
        if keep:
            out[k] = v
    return out


def possible_answer_to_calls(
    possible_answer: Sequence[Mapping[str, Mapping[str, list]]],
    function_docs: Sequence[Mapping[str, Any]] | None = None,
) -> list[Call]:
    """Single-turn possible answers -> one concrete call each (first acceptable value per param).

    With ``function_docs``, an optional answer parameter the function does not declare is left
    out (a few BFCL answers list such parameters; the checker rejects unknown ones).
    """
    declared = {d["name"]: set(d.get("parameters", {}).get("properties", {})) for d in (function_docs or [])}
    calls = []
    for ans in possible_answer:
        if len(ans) != 1:
            raise ValueError(f"a possible answer names one function, got {list(ans)}")
        ((name, params),) = ans.items()
        kwargs = {}
        for k, vs in params.items():
            if name in declared and k not in declared[name] and "" in vs:
                continue
            keep, v = _pick(vs)
            if keep:
                kwargs[k] = v
        calls.append((name, kwargs))
    return calls


def check_single_turn(
    calls: Sequence[Call], entry: Mapping[str, Any], possible_answer: Sequence[Mapping], *, model_name: str = "envace"
) -> dict[str, Any]:
    """BFCL's ast_checker on our calls of one single-turn entry (python categories)."""
    _require_bfcl()
    _install_model_config_stub()
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    category = category_of(entry["id"])
    if category not in SINGLE_TURN_CATEGORIES:
        raise ValueError(f"entry {entry['id']!r}: category {category!r} is not a python AST category")
    model_output = [{n: dict(kw)} for n, kw in calls]
    return ast_checker(entry["function"], model_output, list(possible_answer), Language.PYTHON, category, model_name)
