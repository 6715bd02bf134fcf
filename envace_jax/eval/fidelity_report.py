"""Rehearsal-fidelity report: per-call scores summed up by domain, tool, kind of call and real outcome.

Kinds of call (``CallScore.state_changed``, set from the real environment: ``eval.state_change``):
``state_changing`` when executing the call in the logged conversation changed the environment's state,
``read_only`` when it did not, ``unknown`` when the cases were built without replaying a real
environment (only then). Outcome: ``error`` when the real response is an error, ``success`` otherwise.

Hallucination rates (the direction of the error-agreement misses):
* **optimistic**: of the calls whose real response is an error, the fraction rehearsed as a success,
  i.e. a prediction that parsed and is not an error view. A prediction that does not parse never
  counts as optimistic: the rollout hands the caller an ``error_tool_call`` payload for it, so the
  caller does read a failure (``compare`` sets ``predicted_error=True``);
* **pessimistic**: of the calls whose real response is a success, the fraction rehearsed as an error,
  an error view or a prediction that does not parse (for the same reason). The markdown says how
  many of them did not parse; ``parsed`` of the ``success`` rows gives the same in the JSON.
Both are NaN where their denominator is empty. ``1 - optimistic`` is the error agreement on the real
errors and ``1 - pessimistic`` the error agreement on the real successes.

Reading it next to EnvSimBench (arXiv 2605.07247: frontier LLM simulators keep 99-100% exact state
match when the state does not change and 10-23% on state-changing actions): our ``exact`` is an
exact match of the rehearsed *response*, not of a simulated state, so the comparable figures are the
gap between ``by_kind.read_only.exact`` and ``by_kind.state_changing.exact``, not their levels.

For a run summary (the demo's summary.json), ``kind_headline(summary)`` gives the four figures
``fidelity_state_changing``, ``fidelity_read_only`` (exact match), ``optimistic_hallucination``
and ``pessimistic_hallucination``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

from envace_jax.eval.results import nan_to_none

MEASURES = ("exact", "structure", "field", "error_agreement", "parsed")
KINDS = ("read_only", "state_changing")
UNKNOWN_KIND = "unknown"
OUTCOMES = ("success", "error")
_KIND_WORDS = {"read_only": "read-only", "state_changing": "state-changing", UNKNOWN_KIND: "unknown"}


@dataclasses.dataclass
class CallScore:
    domain: str
    tool: str
    task_uid: str
    exact: float
    structure: float
    field: float
    error_agreement: float
    parsed: float
    real_error: bool
    predicted_error: bool
    prediction: str  # raw rehearser text (truncated) for inspection
    real: str
    state_changed: bool | None = None  # the real call changed the environment's state (None: not replayed)
    tool_label: str | None = None  # the benchmark's own label of the tool (tau2: read/write/...), if any

    @property
    def kind(self) -> str:
        if self.state_changed is None:
            return UNKNOWN_KIND
        return "state_changing" if self.state_changed else "read_only"

    @property
    def outcome(self) -> str:
        return "error" if self.real_error else "success"


def _num(x: float) -> str:
    return "n/a" if x != x else f"{x:.3f}"  # an empty group's NaN


def _rate(hits: int, n: int) -> float:
    return hits / n if n else float("nan")


def hallucination_counts(rows: Sequence[CallScore]) -> dict[str, int]:
    """Numerators and denominators of the two rates (see the module doc)."""
    errors = [r for r in rows if r.real_error]
    successes = [r for r in rows if not r.real_error]
    return {
        "real_errors": len(errors),
        "optimistic": sum(not r.predicted_error for r in errors),
        "real_successes": len(successes),
        "pessimistic": sum(bool(r.predicted_error) for r in successes),
        "pessimistic_unparsed": sum(r.parsed == 0.0 for r in successes),
    }


def _stats(rows: Sequence[CallScore]) -> dict[str, Any]:
    n = len(rows)
    out: dict[str, Any] = {"count": n, "real_errors": sum(r.real_error for r in rows)}
    for m in MEASURES:
        out[m] = sum(getattr(r, m) for r in rows) / n if n else float("nan")
    h = hallucination_counts(rows)
    out["state_changing"] = sum(r.state_changed is True for r in rows)
    out["optimistic_hallucination"] = _rate(h["optimistic"], h["real_errors"])
    out["pessimistic_hallucination"] = _rate(h["pessimistic"], h["real_successes"])
    return out


def _by_kind(rows: Sequence[CallScore]) -> dict[str, dict[str, Any]]:
    kinds = list(KINDS) + ([UNKNOWN_KIND] if any(r.kind == UNKNOWN_KIND for r in rows) else [])
    return {k: _stats([r for r in rows if r.kind == k]) for k in kinds}


def kind_headline(summary: Mapping[str, Any]) -> dict[str, float]:
    """The four figures a run summary carries (exact match per kind, and the two rates)."""
    return {
        "fidelity_state_changing": summary["by_kind"]["state_changing"]["exact"],
        "fidelity_read_only": summary["by_kind"]["read_only"]["exact"],
        "optimistic_hallucination": summary["optimistic_hallucination"],
        "pessimistic_hallucination": summary["pessimistic_hallucination"],
    }


@dataclasses.dataclass
class FidelityReport:
    scores: list[CallScore]

    def summary(self) -> dict[str, Any]:
        """``overall``, ``by_domain``, ``by_tool``: one stats row per group; ``by_kind`` (read_only,
        state_changing, and unknown when present), ``by_kind_outcome`` (kind -> success/error),
        ``by_domain_kind`` (domain -> kind), ``by_label`` (benchmark tool label -> calls and how many
        changed state; empty without labels), and the overall ``optimistic_hallucination`` /
        ``pessimistic_hallucination``. Each stats row: count, real_errors, the MEASURES,
        state_changing (count) and the two rates."""
        by_domain: dict[str, list[CallScore]] = {}
        by_tool: dict[str, list[CallScore]] = {}
        by_label: dict[str, list[CallScore]] = {}
        for s in self.scores:
            by_domain.setdefault(s.domain, []).append(s)
            by_tool.setdefault(f"{s.domain}/{s.tool}", []).append(s)
            if s.tool_label is not None:
                by_label.setdefault(s.tool_label, []).append(s)
        overall = _stats(self.scores)
        kinds = _by_kind(self.scores)
        return {
            "overall": overall,
            "by_domain": {k: _stats(v) for k, v in sorted(by_domain.items())},
            "by_tool": {k: _stats(v) for k, v in sorted(by_tool.items())},
            "by_kind": kinds,
            "by_kind_outcome": {
                k: {o: _stats([r for r in self.scores if r.kind == k and r.outcome == o]) for o in OUTCOMES}
                for k in kinds
            },
            "by_domain_kind": {d: _by_kind(v) for d, v in sorted(by_domain.items())},
            "by_label": {
                lab: {
                    "count": len(v),
                    "state_changing": sum(r.state_changed is True for r in v),
                    "read_only": sum(r.state_changed is False for r in v),
                }
                for lab, v in sorted(by_label.items())
            },
            "optimistic_hallucination": overall["optimistic_hallucination"],
            "pessimistic_hallucination": overall["pessimistic_hallucination"],
        }

    def to_json(self, *, with_calls: bool = False) -> str:
        """The summary (and every call) as strict JSON: an empty group's NaN is written as null."""
        out = self.summary()
        if with_calls:
            out["calls"] = [dataclasses.asdict(s) for s in self.scores]
        return json.dumps(nan_to_none(out), indent=2, ensure_ascii=False)

    def to_markdown(self) -> str:
        summ = self.summary()
        head = "| group | calls | real errors | exact | structure | field | error agreement | parsed |"
        rule = "|---|---:|---:|---:|---:|---:|---:|---:|"

        def row(name: str, s: Mapping[str, Any]) -> str:
            return (
                f"| {name} | {s['count']} | {s['real_errors']} | "
                + " | ".join(f"{s[m]:.3f}" for m in ("exact", "structure", "field", "error_agreement", "parsed"))
                + " |"
            )

        lines = ["### Rehearsal fidelity by domain", "", head, rule, row("all", summ["overall"])]
        lines += [row(k, v) for k, v in summ["by_domain"].items()]
        lines += ["", "### Rehearsal fidelity by tool", "", head, rule]
        lines += [row(k, v) for k, v in summ["by_tool"].items()]
        lines += [""] + self._kind_markdown(summ)
        return "\n".join(lines) + "\n"

    def _kind_markdown(self, summ: Mapping[str, Any]) -> list[str]:
        def kind_row(kind: str, outcome: str, s: Mapping[str, Any]) -> str:
            return (
                f"| {_KIND_WORDS[kind]} | {outcome} | {s['count']} | "
                + " | ".join(_num(s[m]) for m in ("exact", "field", "error_agreement", "parsed"))
                + " |"
            )

        lines = [
            "### Rehearsal fidelity by kind of call",
            "",
            "State-changing: executing the call in the logged conversation changed the real environment's "
            "state (compared before and after); read-only: it did not. Error: the real response is an error.",
            "",
            "| kind | real response | calls | exact | field | error agreement | parsed |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for kind, stats in summ["by_kind"].items():
            for outcome in OUTCOMES:
                lines.append(kind_row(kind, outcome, summ["by_kind_outcome"][kind][outcome]))
            lines.append(kind_row(kind, "all", stats))
        h = hallucination_counts(self.scores)
        lines += [
            "",
            f"Optimistic hallucination (real error rehearsed as a success): {h['optimistic']}/"
            f"{h['real_errors']} = {_num(summ['optimistic_hallucination'])}.",
            f"Pessimistic hallucination (real success rehearsed as an error; an unparseable prediction counts "
            f"as an error): {h['pessimistic']}/{h['real_successes']} = {_num(summ['pessimistic_hallucination'])}"
            f" ({h['pessimistic_unparsed']} of them unparseable).",
            "",
            "### By domain and kind of call",
            "",
            "| domain | kind | calls | real errors | exact | field | error agreement | optimistic | pessimistic |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for dom, kinds in summ["by_domain_kind"].items():
            for kind, s in kinds.items():
                lines.append(
                    f"| {dom} | {_KIND_WORDS[kind]} | {s['count']} | {s['real_errors']} | "
                    + " | ".join(
                        _num(s[m])
                        for m in (
                            "exact",
                            "field",
                            "error_agreement",
                            "optimistic_hallucination",
                            "pessimistic_hallucination",
                        )
                    )
                    + " |"
                )
        if summ["by_label"]:
            lines += [
                "",
                "### Benchmark tool labels and the executed state change",
                "",
                "The split above is by what the call did to the real state; this is the benchmark's own label.",
                "",
                "| label | calls | changed state | left state unchanged |",
                "|---|---:|---:|---:|",
            ]
            lines += [
                f"| {lab} | {v['count']} | {v['state_changing']} | {v['read_only']} |"
                for lab, v in summ["by_label"].items()
            ]
        return lines


__all__ = [
    "CallScore",
    "FidelityReport",
    "KINDS",
    "MEASURES",
    "OUTCOMES",
    "UNKNOWN_KIND",
    "hallucination_counts",
    "kind_headline",
]
