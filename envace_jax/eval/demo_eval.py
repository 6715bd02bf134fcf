"""Demo task suite: real-environment success and checklist score (rule judge), with Wilson intervals.

``policy=oracle`` scores each task's reference conversation (whose tool messages were produced by the
real demo worlds) with the rule judge. ``policy=model`` plays the tasks with our ``RolloutEngine`` in
mode ``real`` (tools run in the demo worlds, the rule judge scores every user turn), optionally after
N private rehearsals (``eval.rehearsal.TestTimeRehearsal``). ``valid`` = every checklist item passed
(episode score 1); ``score_mean`` is the mean checklist score.

``sweep`` runs N x mode (issue 7 part 4) and reports score and success versus N and extra tokens.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from envace_jax.eval import progress
from envace_jax.eval.config import DemoSuiteConfig
from envace_jax.eval.results import CategoryResult, EntryResult, is_success
from envace_jax.eval.rehearsal import RehearsalConfig, RehearsalRun, TestTimeRehearsal, rehearsal_sweep


def load_tasks(cfg: DemoSuiteConfig) -> list[dict[str, Any]]:
    from envace_jax.data.demo_tasks import generate_tasks

    return generate_tasks(cfg.num_tasks, cfg.seed, cfg.split)


def _judge():
    from envace_jax.rl.judges import RuleJudge

    return RuleJudge()


def _category(
    name: str,
    uids: Sequence[str],
    scores: Sequence[float],
    details: Sequence[dict],
    extra: dict[str, Any] | None = None,
) -> CategoryResult:
    passed = [is_success(s) for s in scores]
    rows = [
        EntryResult(u, ok, None if ok else (d.get("termination") or "score_below_1"), dict(d, score=s))
        for u, s, d, ok in zip(uids, scores, details, passed)
    ]
    n = max(1, len(rows))
    out = {"score_mean": sum(scores) / n}
    out.update(extra or {})
    return CategoryResult(name, rows, out)


def evaluate_oracle(tasks: Sequence[dict[str, Any]]) -> CategoryResult:
    """The reference conversations, judged turn by turn exactly as a rollout's turns are."""
    from envace_jax.rl.reward import episode_score, score_conversation

    judge = _judge()
    scores, details = [], []
    for t in tasks:
        system = [m for m in t["messages"] if m.get("role") == "system"]
        msgs = system + list(t["reference_messages"])
        rewards = score_conversation(msgs, t["checklist"], judge)
        scores.append(episode_score(rewards, t["checklist"]))
        details.append({"turn_rewards": rewards})
    return _category("demo", [t["uid"] for t in tasks], scores, details)


def make_rehearsal_runner(tasks: Sequence[dict[str, Any]], codec, client, rollout_cfg, make_env=None):
    """``run(RehearsalConfig) -> RehearsalRun`` over ``tasks`` in the real demo worlds (N = 0: act directly).

    ``make_env(task)`` builds the real environment (default: ``demo_worlds.make_env``; the demo
    pipeline passes its JSON-normalising wrapper)."""
    from envace_jax.envs import demo_worlds
    from envace_jax.rl.reward import ChecklistTurnJudge

    make_env = make_env or demo_worlds.make_env

    def run(rcfg: RehearsalConfig) -> RehearsalRun:
        client_reset = getattr(client, "reset", None)
        if client_reset is not None:  # rows cached by an earlier setting belong to other episodes
            client_reset()
        label = "demo" if rcfg.n == 0 else f"demo after {rcfg.n} {rcfg.mode} rehearsal(s)"
        with progress.stage(f"{label}: {len(tasks)} tasks"), progress.EpisodeBar(len(tasks), label) as bar:
            ttr = TestTimeRehearsal(
                rcfg,
                rollout_cfg,
                codec,
                client,
                ChecklistTurnJudge(_judge()),
                make_env,
                episode_bar=bar,
                stage_lines=True,
            )
            return ttr.run(list(tasks))

    return run


def _from_run(name: str, run: RehearsalRun) -> CategoryResult:
    n = max(1, len(run.committed))
    details = [
        dict(e.metrics(), extra_generated_tokens=o.generated_tokens, extra_prompt_tokens=o.prompt_tokens)
        for e, o in zip(run.committed, run.rehearsals)
    ]
    extra = {
        "extra_generated_tokens_mean": sum(o.generated_tokens for o in run.rehearsals) / n,
        "extra_prompt_tokens_mean": sum(o.prompt_tokens for o in run.rehearsals) / n,
        "memory_chars_mean": sum(len(o.memory) for o in run.rehearsals) / n,
    }
    return _category(name, [e.uid for e in run.committed], run.scores, details, extra)


def evaluate_model(
    tasks: Sequence[dict[str, Any]], codec, client, rollout_cfg, rehearsal: RehearsalConfig = RehearsalConfig()
) -> CategoryResult:
    run = make_rehearsal_runner(tasks, codec, client, rollout_cfg)(rehearsal)
    name = "demo" if rehearsal.n == 0 else f"demo_rehearsal_{rehearsal.mode}_n{rehearsal.n}"
    return _from_run(name, run)


def sweep(
    tasks: Sequence[dict[str, Any]],
    codec,
    client,
    rollout_cfg,
    base: RehearsalConfig,
    ns: Sequence[int],
    modes: Sequence[str],
    make_env=None,
    runs: dict[tuple[str, int], RehearsalRun] | None = None,
):
    """Score/success versus N and mode: (``eval.rehearsal.SweepResult``, one results category per cell).

    N = 0 does not depend on the mode: it runs once and is reported under every mode. Each row also holds
    ``seconds``, the wall time of its setting (rehearsals and the real attempt; N = 0's row under every
    mode is the one run's). ``runs``, when given, receives each setting's ``RehearsalRun`` by (mode, N).
    """
    runner = make_rehearsal_runner(tasks, codec, client, rollout_cfg, make_env)
    runs = {} if runs is None else runs
    seconds: dict[tuple[str, int], float] = {}

    def run(rcfg: RehearsalConfig) -> RehearsalRun:
        t0 = time.perf_counter()
        runs[(rcfg.mode, rcfg.n)] = out = runner(rcfg)
        seconds[(rcfg.mode, rcfg.n)] = time.perf_counter() - t0
        return out

    result = rehearsal_sweep(run, base, ns, modes)
    for row in result.rows:
        key = (row["mode"], row["n"])
        row["seconds"] = seconds[key] if key in seconds else next(v for (_, k), v in seconds.items() if k == row["n"])
    cats = []
    for row in result.rows:
        r = runs.get((row["mode"], row["n"])) or next(v for (m, k), v in runs.items() if k == row["n"])
        cats.append(_from_run(f"{row['mode']}_n{row['n']}", r))
    return result, cats
