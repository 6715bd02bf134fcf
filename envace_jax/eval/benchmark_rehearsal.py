"""Test-time rehearsal on the benchmarks: BFCL's multi-turn categories and tau2's domains (suites ``bfcl``, ``tau2``).

The paper's test-time claim, on the benchmarks it was made on. Before the one real run of a task the policy
rehearses it N times through ``eval.rehearsal.TestTimeRehearsal`` (the demo's: parallel or sequential, the
memory gates, real reads, ``rehearser="real"``), then the benchmark's own loop plays it once, with the memory in
its prompt, and the benchmark's own checker scores it:

- **BFCL** (every multi-turn category). The rehearsal record is the entry's first turn: its user messages and the
  entry's tool schemas (``envs.bfcl.entry_to_task``); REHEARSE imagines each tool's response from those schemas
  and the conversation, as in training. With ``user_turns="all"`` the later turns' first user messages follow
  (a turn whose functions BFCL adds later is rehearsed without them). The memory is a system message before the
  first user message (BFCL's prompts have none); ``bfcl_eval.play_multi_turn`` plays the entry, BFCL's
  ``multi_turn_checker`` scores it.
- **tau2** (airline, retail, telecom). The task is known once the user has said it: the rehearsal starts from the
  agent's view at its first turn (the domain policy, the greeting, the user's opening) with the domain's agent
  tools, and the memory goes into the system prompt (``placement``) before the agent writes anything
  (``tau2_eval.play``'s ``before_first_act``). tau2's evaluator scores the run. Imagined episodes rehearse the
  agent's side only: nobody plays the user in them.

``rehearser="real"`` (the upper bound) runs each rehearsal against a private copy of the real environment: a
fresh BFCL environment of the entry, or a copy of the tau2 environment as it stands when the rehearsal starts
(after any action the user took on their phone).

A sweep (``--config.rehearsal.sweep_ns=0,1,2``, with ``sweep_modes`` and ``sweep_rehearsers``) runs each setting
over the same tasks and writes, in ``output_dir``:

- ``eval_<arm>_tasks.jsonl`` per setting: one ``{"uid", "success", "score"}`` line per task, keyed by the
  benchmark's ids (BFCL's entry id, ``<domain>/<task id>`` for tau2); ``arm_name`` names the settings (``n0``,
  ``n2``, ``n2_sequential``, ``n2_real``); ``launch/paired_stats.py`` recomputes the paired tables from them;
- ``eval_<arm>_rehearsals.jsonl``: per task, the memory placed and every rehearsal's calls and responses;
- ``rehearsal_sweep.md`` / ``.json``: per category, success and score, the cost (rehearsal tokens generated and
  fed, the real run's tokens, seconds), the fidelity of the rehearsals whose memory was placed, and the paired
  table of each setting against N = 0 (and of ``real`` against ``imagined`` at the same N).

Fidelity, two ways (``eval.imagined_fidelity.KINDS``: exact / same outcome / wrong outcome): ``replayed``, each
rehearsal's calls replayed in order on a fresh copy of the task's environment, every imagined response judged
against the real one; ``vs real run``, each imagined response to a call the real run also made (same name and
arguments) against the response the real run got (``unmatched``: imagined calls the real run never made). Steps
a real read or the real rehearser answered are not counted.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import json
import os
import time
from typing import Any, Callable, Mapping, Sequence

from envace_jax.envs import bfcl
from envace_jax.eval import imagined_fidelity, paired, progress
from envace_jax.eval.config import EvalConfig, RehearsalConfig, RehearsalSection
from envace_jax.eval.results import CategoryResult, is_success
from envace_jax.eval.rehearsal import (
    RehearsalRun,
    TaskRehearsal,
    TestTimeRehearsal,
    call_text,
    rehearsal_record,
    with_memory,
)

KINDS = imagined_fidelity.KINDS


# ----------------------------------------------------------------------------- settings


def arm_name(n: int, mode: str = "parallel", rehearser: str = "imagined") -> str:
    """``n0`` (no rehearsal: mode and rehearser do not matter), ``n<N>`` (parallel, imagined: EnvACE's), else with
    ``_sequential`` and / or ``_real`` appended."""
    if n == 0:
        return "n0"
    return f"n{n}" + ("" if mode == "parallel" else f"_{mode}") + ("" if rehearser == "imagined" else f"_{rehearser}")


def settings(section: RehearsalSection) -> list[RehearsalConfig]:
    """The settings a run covers: the one of ``section`` when ``sweep_ns`` is empty, else N x modes x rehearsers,
    N = 0 first and once, and N = 1 once per rehearser (with one rehearsal, sequential is parallel)."""
    base = section.rehearsal()
    if not section.sweep_ns:
        return [base]
    out, seen = [], set()
    for n in sorted(section.sweep_ns):
        for rehearser in section.sweep_rehearsers or (section.rehearser,):
            for mode in section.sweep_modes:
                mode, rehearser = (mode if n > 1 else "parallel"), (rehearser if n > 0 else "imagined")
                if arm_name(n, mode, rehearser) not in seen:
                    seen.add(arm_name(n, mode, rehearser))
                    out.append(dataclasses.replace(base, n=n, mode=mode, rehearser=rehearser))
    return out


def rehearsal_rollout(cfg: EvalConfig, max_user_turns: int, max_assistant_turns: int):
    """The rollout caps of a rehearsal episode: the benchmark's own (BFCL's steps per turn, tau2's max steps)."""
    from envace_jax.rl.rollout import RolloutConfig

    return RolloutConfig(
        mode="real",  # TestTimeRehearsal imagines with mode "rehearsal", or runs "real" for rehearser="real"
        max_steps=4 * max_assistant_turns,
        max_assistant_turns=max_assistant_turns,
        max_user_turns=max_user_turns,
        max_model_len=cfg.max_model_len,
        act=cfg.sampling,
        rehearse=cfg.sampling,
        seed=cfg.seed,
    )


# ----------------------------------------------------------------------------- one category, one setting


@dataclasses.dataclass
class CategoryRun:
    """One benchmark category (a BFCL category or a tau2 domain) under one rehearsal setting."""

    category: str
    config: RehearsalConfig
    result: CategoryResult  # the benchmark checker's rows
    uids: list[str]  # the outcome keys, in the rows' order
    scores: list[float]
    rehearsals: dict[str, TaskRehearsal]  # uid -> its rehearsals (tasks that were rehearsed)
    records: dict[str, dict[str, Any]]  # uid -> the record rehearsed
    real_calls: dict[str, list[tuple[str, Any, str, bool]]]  # uid -> the real run's calls and responses
    make_env: Callable[[Mapping[str, Any]], Any]  # a fresh real environment of a record (the replay)
    committed_generated: int = 0
    committed_prompt: int = 0
    seconds: float = 0.0

    @property
    def arm(self) -> str:
        return arm_name(self.config.n, self.config.mode, self.config.rehearser)

    def outcomes(self) -> list[paired.TaskOutcome]:
        return paired.outcomes_of(self.uids, self.scores)


def _rehearser(
    cfg: EvalConfig, rcfg: RehearsalConfig, codec, client, make_env, max_user_turns: int, max_turns: int
) -> TestTimeRehearsal:
    def no_committed_judge(episodes):  # only ``rehearse`` is used: the benchmark's own loop is the real run
        raise RuntimeError("the benchmark's checker scores the real run")

    return TestTimeRehearsal(
        dataclasses.replace(rcfg, seed=cfg.seed),
        rehearsal_rollout(cfg, max_user_turns, max_turns),
        codec,
        client,
        no_committed_judge,
        make_env,
        stage_lines=True,
    )


def bfcl_record(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The rehearsal record of a multi-turn BFCL entry: its first turn and tool schemas; ``reference_messages``
    holds each turn's first user message (what ``user_turns="all"`` replays)."""
    rec = bfcl.entry_to_task(entry)
    rec["reference_messages"] = [dict(next(m for m in t if m.get("role") == "user")) for t in rec["user_turns"] if t]
    return rec


def bfcl_env(record: Mapping[str, Any]) -> bfcl.BfclMultiTurnEnv:
    """A fresh real environment of a BFCL record (its entry's initial state)."""
    return bfcl.BfclMultiTurnEnv(record["env"]["state"])


def run_bfcl_category(category: str, cfg: EvalConfig, rcfg: RehearsalConfig, agent, codec, client) -> CategoryRun:
    from envace_jax.eval import bfcl_eval

    bcfg = cfg.bfcl
    entries = bfcl.load_entries(category)
    gts = bfcl.load_ground_truth(category)
    if bcfg.limit:
        entries = entries[: bcfg.limit]
    records = [bfcl_record(e) for e in entries]
    t0 = time.perf_counter()
    rehearsals: dict[str, TaskRehearsal] = {}
    if rcfg.n > 0:
        turns = max(len(r["reference_messages"]) for r in records) if records else 1
        ttr = _rehearser(cfg, rcfg, codec, client, bfcl_env, turns, (bcfg.max_steps_per_turn + 1) * turns)
        for lo in range(0, len(records), bcfg.batch_size):
            for t in ttr.rehearse(records[lo : lo + bcfg.batch_size]):
                rehearsals[t.uid] = t
    memories = {u: t.memory for u, t in rehearsals.items() if t.memory}
    label = f"{category} {arm_name(rcfg.n, rcfg.mode, rcfg.rehearser)}"
    episodes = bfcl_eval.play_multi_turn(entries, agent, bcfg, desc=label, memories=memories)
    result = bfcl_eval.score_multi_turn(category, episodes, gts)
    return CategoryRun(
        category,
        rcfg,
        result,
        [r.id for r in result.entries],
        [1.0 if r.valid else 0.0 for r in result.entries],
        rehearsals,
        {r["uid"]: r for r in records},
        {ep.entry["id"]: ep.real_calls for ep in episodes},
        bfcl_env,
        sum(ep.generated_tokens for ep in episodes),
        sum(ep.prompt_tokens for ep in episodes),
        time.perf_counter() - t0,
    )


def tau2_uid(domain: str, task_id: Any) -> str:
    return f"{domain}/{task_id}"


def run_tau2_domain(
    domain: str, cfg: EvalConfig, rcfg: RehearsalConfig, agent, codec, client, user_agent=None
) -> CategoryRun:
    from envace_jax.envs import tau2 as T
    from envace_jax.eval import tau2_eval

    tcfg = cfg.tau2
    tasks = T.load_tasks(domain, tcfg.split)
    if tcfg.limit:
        tasks = tasks[: tcfg.limit]
    snapshots: dict[str, Any] = {}  # uid -> the environment as the rehearsal found it
    records: dict[str, dict[str, Any]] = {}
    rehearsals: dict[str, TaskRehearsal] = {}

    def env_of(record: Mapping[str, Any]):
        return copy.deepcopy(snapshots[record["uid"]])

    ttr = _rehearser(cfg, rcfg, codec, client, env_of, 1, tcfg.max_steps) if rcfg.n > 0 else None

    def before_first_act(episodes) -> None:
        if ttr is None:
            return
        recs = []
        for ep in episodes:
            uid = tau2_uid(domain, ep.task.id)
            snapshots[uid] = copy.deepcopy(ep.env)
            users = [dict(m) for m in ep.agent.messages if m.get("role") == "user"]
            recs.append(
                {
                    "uid": uid,
                    "data_source": f"tau2/{domain}",
                    "messages": copy.deepcopy(ep.agent.messages),
                    "tools": ep.agent.tools,
                    "reference_messages": users,
                    "checklist": [],
                }
            )
        for ep, rec, out in zip(episodes, recs, ttr.rehearse(recs)):
            records[rec["uid"]], rehearsals[rec["uid"]] = rec, out
            if out.memory:
                ep.agent.messages = with_memory({"messages": ep.agent.messages}, out.memory, rcfg.placement)["messages"]

    t0 = time.perf_counter()
    episodes = tau2_eval.play(domain, tasks, agent, tcfg, user_agent, before_first_act=before_first_act)
    result = tau2_eval.score_episodes(domain, episodes)
    return CategoryRun(
        domain,
        rcfg,
        result,
        [tau2_uid(domain, r.id) for r in result.entries],
        [float(r.detail.get("reward", 0.0)) for r in result.entries],
        rehearsals,
        records,
        {tau2_uid(domain, ep.task.id): ep.real_calls for ep in episodes},
        env_of,
        sum(ep.generated_tokens for ep in episodes),
        sum(ep.prompt_tokens for ep in episodes),
        time.perf_counter() - t0,
    )


# ----------------------------------------------------------------------------- fidelity and cost


def agreement_with_real_run(run: CategoryRun, used_only: bool = True) -> dict[str, int]:
    """Each imagined response to a call the real run also made (same name and arguments; its first such call)
    against the response the real run got: counts of ``KINDS``, and ``unmatched`` imagined calls."""
    counts = collections.Counter({k: 0 for k in KINDS + ("unmatched",)})
    for uid, reh in run.rehearsals.items():
        if used_only and not reh.memory:
            continue
        real: dict[str, tuple[str, bool]] = {}
        for name, args, content, failed in run.real_calls.get(uid, []):
            real.setdefault(call_text(name, args), (content, failed))
        for trace in reh.traces:
            for step in trace.steps:
                if step.real:
                    continue
                hit = real.get(call_text(step.name, step.arguments))
                counts["unmatched" if hit is None else imagined_fidelity.classify(step.response, *hit)] += 1
    return dict(counts)


def fidelity(run: CategoryRun) -> dict[str, Any]:
    """Both fidelity measures (module doc) of a setting with rehearsals; {} without."""
    if not run.rehearsals:
        return {}
    uids = list(run.rehearsals)
    replay = imagined_fidelity.fidelity_split(
        RehearsalRun(run.config, [], [run.rehearsals[u] for u in uids]), [run.records[u] for u in uids], run.make_env
    )
    return {
        "replayed_used": replay["used"],
        "replayed_all": replay["all"],
        "vs_real_run_used": agreement_with_real_run(run, used_only=True),
        "vs_real_run_all": agreement_with_real_run(run, used_only=False),
        "by_tool": replay["by_tool"],
    }


def row_of(run: CategoryRun) -> dict[str, Any]:
    """The summary row of one category under one setting: outcome, cost per task, fidelity."""
    n = max(1, len(run.uids))
    rehs = list(run.rehearsals.values())
    return {
        "category": run.category,
        "arm": run.arm,
        "n": run.config.n,
        "mode": run.config.mode,
        "rehearser": run.config.rehearser,
        "place_memory": run.config.place_memory,
        "tasks": len(run.uids),
        "success": sum(is_success(s) for s in run.scores) / n,
        "score": sum(run.scores) / n,
        "memory_placed": sum(bool(t.memory) for t in rehs) / n,
        "rehearsal_generated_tokens": sum(t.generated_tokens for t in rehs) / n,
        "rehearsal_prompt_tokens": sum(t.prompt_tokens for t in rehs) / n,
        "real_generated_tokens": run.committed_generated / n,
        "real_prompt_tokens": run.committed_prompt / n,
        "seconds": run.seconds,
        "seconds_per_task": run.seconds / n,
        "fidelity": fidelity(run),
    }


def _kinds(counts: Mapping[str, int] | None, extra: str = "") -> str:
    if not counts:
        return "-"
    text = " / ".join(str(counts.get(k, 0)) for k in KINDS)
    return text + (f" ({counts.get(extra, 0)})" if extra else "")


def sweep_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "| category | setting | tasks | success | score | memory placed | rehearsal gen tok/task | "
        "rehearsal prompt tok/task | real run gen tok/task | s/task | replayed: exact / same / wrong | "
        "vs real run: exact / same / wrong (unmatched) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        f = r["fidelity"]
        lines.append(
            f"| {r['category']} | {r['arm']} | {r['tasks']} | {r['success']:.3f} | {r['score']:.3f} | "
            f"{'-' if r['n'] == 0 else format(r['memory_placed'], '.0%')} | {r['rehearsal_generated_tokens']:.0f} | "
            f"{r['rehearsal_prompt_tokens']:.0f} | {r['real_generated_tokens']:.0f} | {r['seconds_per_task']:.2f} | "
            f"{_kinds(f.get('replayed_used'))} | {_kinds(f.get('vs_real_run_used'), 'unmatched')} |"
        )
    return "\n".join(lines) + "\n"


def paired_pairs(arms: Sequence[str]) -> list[tuple[str, str, str]]:
    """(label, A, B): every setting against N = 0, and each real rehearser against the imagined one at its N."""
    out = [(f"{a} vs n0", a, "n0") for a in arms if a != "n0" and "n0" in arms]
    out += [(f"{a} vs {a[:-5]}", a, a[: -len("_real")]) for a in arms if a.endswith("_real") and a[:-5] in arms]
    return out


# ----------------------------------------------------------------------------- the run


def run(cfg: EvalConfig, out_dir: str, agent, codec, client, user_agent=None) -> tuple[list[CategoryResult], dict]:
    """Every setting of ``cfg.rehearsal`` (``settings``) on every category of the suite; writes the files of the
    module doc and returns (one results category per category and setting, the extra files written)."""
    runs: list[CategoryRun] = []
    names = cfg.bfcl.categories if cfg.suite == "bfcl" else cfg.tau2.domains
    for rcfg in settings(cfg.rehearsal):
        arm = arm_name(rcfg.n, rcfg.mode, rcfg.rehearser)
        for name in names:
            with progress.stage(f"{cfg.suite} {name}, {arm}"):
                if cfg.suite == "bfcl":
                    runs.append(run_bfcl_category(name, cfg, rcfg, agent, codec, client))
                else:
                    runs.append(run_tau2_domain(name, cfg, rcfg, agent, codec, client, user_agent))
    return write_sweep(runs, out_dir, cfg)


def write_sweep(runs: Sequence[CategoryRun], out_dir: str, cfg: EvalConfig) -> tuple[list[CategoryResult], dict]:
    arms: dict[str, list[CategoryRun]] = collections.defaultdict(list)
    for r in runs:
        arms[r.arm].append(r)
    files: dict[str, str] = {}
    by_cat = {(r.arm, r.category): r.outcomes() for r in runs}
    outcomes: dict[str, list[paired.TaskOutcome]] = {}
    for arm, group in arms.items():
        outcomes[arm] = [o for r in group for o in by_cat[(arm, r.category)]]
        files[f"{arm}_tasks"] = os.path.basename(paired.write_outcomes(out_dir, arm, outcomes[arm]))
        if any(r.rehearsals for r in group):
            path = os.path.join(out_dir, f"eval_{arm}_rehearsals.jsonl")
            with open(path, "w", encoding="utf-8") as f:
                for r in group:
                    for t in r.rehearsals.values():
                        f.write(json.dumps(dict(rehearsal_record(t), category=r.category), ensure_ascii=False) + "\n")
            files[f"{arm}_rehearsals"] = os.path.basename(path)
    rows = [row_of(r) for r in runs]
    pairs = paired_pairs(list(arms))
    paired_rows, paired_json = [], []
    categories = list(dict.fromkeys(r.category for r in runs))
    for label, a, b in pairs:
        scopes = [(c, by_cat.get((a, c)), by_cat.get((b, c))) for c in categories]
        if len(categories) > 1:
            scopes.append(("all", outcomes[a], outcomes[b]))
        for scope, oa, ob in scopes:
            if oa and ob:
                res = paired.compare(oa, ob, a, b, seed=cfg.seed)
                paired_rows.append(paired.paired_row(f"{scope}: {label}", res))
                paired_json.append(dict(res.as_dict(), label=label, scope=scope))
    suite = "BFCL" if cfg.suite == "bfcl" else "tau2"
    model = cfg.model.model_path or "a random tiny Qwen3 (checks the path; its scores mean nothing)"
    md = (
        f"# Test-time rehearsal on {suite}\n\nModel: {model}. Greedy real run"
        f"{', user ' + cfg.tau2.user if cfg.suite == 'tau2' else ''}; memory placed: "
        f"{cfg.rehearsal.place_memory} ({cfg.rehearsal.placement}). Settings: n<N> = N parallel imagined "
        "rehearsals, _sequential = each with the memory of the ones before, _real = rehearsals against a private "
        "copy of the real environment.\n\n"
        + sweep_markdown(rows)
        + "\nTokens per task: the rehearsals' (generated and fed to the policy, summaries included) and the real "
        "run's. Fidelity counts the imagined steps of the rehearsals whose memory was placed: replayed on a fresh "
        "environment, and against the real run's response to the same call (module doc of "
        "envace_jax.eval.benchmark_rehearsal).\n"
    )
    if paired_rows:
        md += "\nPaired on the same tasks (A - B):\n\n" + paired.markdown_table(paired_rows) + "\n\n"
        md += paired.PAIRED_NOTE + "\n"
    with open(os.path.join(out_dir, "rehearsal_sweep.md"), "w", encoding="utf-8") as f:
        f.write(md)
    with open(os.path.join(out_dir, "rehearsal_sweep.json"), "w", encoding="utf-8") as f:
        json.dump({"rows": rows, "paired": paired_json}, f, indent=2, default=str)
    files.update(sweep_md="rehearsal_sweep.md", sweep_json="rehearsal_sweep.json")
    cats = []
    for r, row in zip(runs, rows):
        extra = dict(r.result.extra)
        extra.update({k: row[k] for k in ("n", "mode", "rehearser", "memory_placed", "seconds")})
        extra.update({k: row[k] for k in row if k.endswith("_tokens")})
        cats.append(CategoryResult(f"{r.category}_{r.arm}", r.result.entries, extra))
    return cats, files
