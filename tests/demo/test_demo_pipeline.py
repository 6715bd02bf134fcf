"""A reduced `make demo` end to end in a subprocess: data (tfds + grain), tokenizer, SFT, RL steps,
real-tool evaluation, fidelity, more-SFT baseline, and report files that parse."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from envace_jax.demo import report
from tests.helpers_paths import ROOT, demo_env


@pytest.fixture(scope="module")
def reduced_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("demo") / "run"
    env = demo_env()
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "demo.py"),
            f"--config={ROOT}/configs/demo.py:reduced",
            "--config.prompts_per_step=3",
            f"--run_dir={run_dir}",
            "--no_progress",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir, proc.stdout


def test_report_files_exist_and_summary_has_required_keys(reduced_run):
    run_dir, stdout = reduced_run
    for name in (
        "summary.json",
        "report.md",
        "rewards.png",
        "success.png",
        "metrics_rl.jsonl",
        "fidelity_before.md",
        "fidelity_after.md",
        "tokenizer/tokenizer.json",
    ):
        assert (run_dir / name).exists(), name
    s = json.loads((run_dir / "summary.json").read_text())
    report.check_summary(s)
    # the report states the RL settings the run used (reduced preset: T=0.6, one replay batch per step)
    text = (run_dir / "report.md").read_text()
    assert (
        "at temperature 0.6" in text
        and "1 SFT replay batch(es) (act+rehearse rows of the corpus) after each RL step" in text
    )
    n = s["test_episodes"]
    assert n == 8 and s["eval_split"] == "test"
    for key in ("real_success_before", "real_success_after", "more_sft_success", "fidelity_before", "fidelity_after"):
        assert 0.0 <= s[key] <= 1.0, key
    for key in ("real_success_ci_before", "real_success_ci_after", "more_sft_success_ci"):
        lo, hi = s[key]
        assert 0.0 <= lo <= hi <= 1.0
    # Wilson interval recomputed from the counts
    wins = round(s["real_success_after"] * n)
    assert s["real_success_ci_after"] == pytest.approx(report.wilson_ci(wins, n))
    assert s["eval"]["before"]["episodes"] == n
    assert sum(s["eval"]["after"]["terminations"].values()) == n
    assert s["data"]["sft_rows_by_role"]["act"] > 0 and s["data"]["sft_rows_by_role"]["rehearse"] > 0
    assert "| model" in stdout and "total:" in stdout


def _table_cells(text: str, label: str) -> list[str]:
    """The cells of the markdown table row that starts with ``label``."""
    rows = [line for line in text.splitlines() if line.startswith(f"| {label} ")]
    assert len(rows) == 1, (label, rows)
    return [c.strip() for c in rows[0].strip().strip("|").split("|")]


def test_per_task_outcomes_and_the_paired_table(reduced_run):
    """Every evaluated arm leaves eval_<arm>_tasks.jsonl with one line per test task (the split's uids, in
    the same set for every arm); the success rate of the report is their mean; report.md's paired table is
    what eval.paired computes from those files, and launch/paired_stats.py prints the same rows."""
    from envace_jax.data.tfds_builder import read_split
    from envace_jax.demo import arms
    from envace_jax.demo import data as demo_data
    from envace_jax.eval import paired

    run_dir, _ = reduced_run
    s = json.loads((run_dir / "summary.json").read_text())
    test = read_split(str(run_dir / "data"), demo_data.DATASET_NAME, "test")
    uids = [test[i]["uid"] for i in range(len(test))]
    assert len(set(uids)) == len(uids) == s["test_episodes"]
    assert set(paired.find_arms(str(run_dir))) == {"before", "after", "more_sft"}
    outcomes = {}
    for arm, key in (
        ("before", "real_success_before"),
        ("after", "real_success_after"),
        ("more_sft", "more_sft_success"),
    ):
        outcomes[arm] = paired.read_outcomes(str(run_dir / f"eval_{arm}_tasks.jsonl"))
        assert sorted(o.uid for o in outcomes[arm]) == sorted(uids), arm
        assert all(o.success == report.is_success(o.score) for o in outcomes[arm])
        assert sum(o.success for o in outcomes[arm]) / len(uids) == pytest.approx(s[key])
        assert sum(o.score for o in outcomes[arm]) / len(uids) == pytest.approx(s["eval"][arm]["score"])
        # the transcripts kept for diagnosis name their task and score too: the same pairs
        by_uid = {o.uid: o.score for o in outcomes[arm]}
        samples = json.loads((run_dir / f"eval_{arm}_samples.json").read_text())
        assert samples and all(by_uid[x["uid"]] == x["score"] for x in samples)
    text = (run_dir / "report.md").read_text()
    assert "Paired comparisons on the same test tasks" in text
    assert [(r["label"], r["a"], r["b"]) for r in s["paired"]] == arms.DEMO_PAIRS
    for label, a, b in arms.DEMO_PAIRS:
        r = paired.compare(outcomes[a], outcomes[b], a, b)
        assert _table_cells(text, label) == paired.paired_row(label, r)
        # the counts, read independently of the module: tasks A solved and B did not, and the reverse
        by_b = {o.uid: o.success for o in outcomes[b]}
        assert r.wins == sum(o.success and not by_b[o.uid] for o in outcomes[a])
        assert r.losses == sum(by_b[o.uid] and not o.success for o in outcomes[a])
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "paired_stats.py"),
            str(run_dir),
        ],
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for label, a, b in arms.DEMO_PAIRS:
        assert f"## {label} (A = {a}, B = {b})" in proc.stdout
        block = proc.stdout.split(f"## {label} ")[1].split("\n## ")[0]
        # the same cells as report.md's row, the first (the run directory instead of the label) aside
        assert _table_cells(block, str(run_dir))[1:] == _table_cells(text, label)[1:]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--config.sft_tasks=0"], "demo sft_tasks must be >= 1, got 0"),
        (["--preset=reduced", "--set", "sft_tasks=0"], "demo sft_tasks must be >= 1, got 0"),  # the earlier spelling
        (["--set", "sft_tasks=0"], "demo sft_tasks must be >= 1, got 0"),  # ... without a preset (was an unknown flag)
        (["--config.eval_split=dev"], "demo eval_split must be one of"),
        (["--config.rl_push_back_share=1.5"], "demo rl_push_back_share must be None or in [0, 1], got 1.5"),
        (["--config.rl_seed=-1"], "demo rl_seed must be None or an int >= 0, got -1"),
        (["--compare_algorithms=grpo,ppo"], "--compare_algorithms must be distinct names of"),
        (
            ["--compare_algorithms=grpo,dapo", "--config.rl_max_staleness=1"],
            "with dapo needs --config.rl_max_staleness=0",
        ),
        (["--config.rl_algorithm=ppo"], "demo rl_algorithm must be one of ('grpo', 'gspo', 'dapo', 'dr_grpo')"),
        (["--config.rl_algorithm=dapo", "--config.rl_max_staleness=1"], "rl_algorithm='dapo' needs rl_max_staleness"),
        (["--rehearsal_sweep", "--sweep_ns=0,x"], "--sweep_ns must be integers, got '0,x'"),
        (["--rehearsal_sweep", "--sweep_ns=0,2,2"], "--sweep_ns must be distinct integers >= 0"),
        (["--rehearsal_sweep", "--sweep_modes=parallel,batch"], "--sweep_modes must be distinct names of"),
    ],
)
def test_demo_settings_are_one_typed_config(args, needle):
    """launch/demo.py reads its settings like every other main (an ml-collections config, ``--config.f=v``,
    checked by the shared converter); the earlier --preset/--set spellings are rewritten to it."""
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "demo.py"), *args, "--run_dir=/nonexistent"],
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr[-2000:]


def test_rl_steps_logged_with_both_roles(reduced_run):
    run_dir, _ = reduced_run
    steps = [json.loads(line) for line in (run_dir / "metrics_rl.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        # every rollout batch of rehearsal mode holds both roles' rows (unless no episode made a call)
        assert m["act/rows"] > 0
        assert m["episode/count"] == 3 * 2  # --config.prompts_per_step=3 (reached the run) x 2 rollouts
        assert "update/loss" in m or "update/skipped_no_rows" in m
        # the reduced preset interleaves one SFT replay batch (both roles) after each RL step
        assert m["replay/nll/act"] > 0 and m["replay/nll/rehearse"] > 0


def test_wilson_and_mean_ci_by_hand():
    lo, hi = report.wilson_ci(5, 20)
    # p = 0.25, n = 20, z = 1.96 -> [0.1119, 0.4687] (textbook Wilson interval)
    assert lo == pytest.approx(0.1119, abs=1e-3) and hi == pytest.approx(0.4687, abs=1e-3)
    assert report.mean_ci([0.0, 1.0, 0.5, 0.5]) == pytest.approx(
        [0.5 - 1.96 * 0.408248 / 2, 0.5 + 1.96 * 0.408248 / 2], abs=1e-4
    )
    assert report.cis_separate([0.1, 0.2], [0.3, 0.4]) and not report.cis_separate([0.1, 0.35], [0.3, 0.4])


def test_exported_model_runs_the_rehearsal_sweep(reduced_run):
    """The demo's exported model is a real HF checkpoint (transformers loads it with the same
    logits) and drives the test-time rehearsal table end to end."""
    import numpy as np
    import torch
    from transformers import Qwen3ForCausalLM

    from envace_jax.demo.config import reduced
    from envace_jax.demo.rehearsal_table import run_rehearsal_table
    from envace_jax.models import hf_io

    run_dir, _ = reduced_run
    ids = np.arange(3, 19, dtype=np.int32)[None]
    ours = np.asarray(hf_io.load_hf(str(run_dir / "model"))(ids))
    with torch.no_grad():
        theirs = Qwen3ForCausalLM.from_pretrained(str(run_dir / "model")).eval()(torch.tensor(ids).long()).logits
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-4)
    # The export carries the demo tokenizer's stop and pad ids, so transformers' generate stops where ours does.
    gen = json.load(open(run_dir / "model" / "generation_config.json"))
    tok = json.load(open(run_dir / "tokenizer" / "tokenizer.json"))
    vocab = tok["model"]["vocab"] | {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert gen["eos_token_id"] == [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
    assert gen["pad_token_id"] == vocab["<|endoftext|>"]

    out = run_rehearsal_table(reduced(), str(run_dir), ns=(0, 1), modes=("parallel",), num_tasks=3)
    assert [(r["mode"], r["n"], r["tasks"]) for r in out["rows"]] == [("parallel", 0, 3), ("parallel", 1, 3)]
    assert out["rows"][0]["extra_generated_tokens"] == 0 and out["rows"][1]["extra_generated_tokens"] > 0
    for r in out["rows"]:
        lo, hi = r["success_ci95"]
        assert 0.0 <= lo <= r["success"] <= hi <= 1.0
    # the sweep table's two rows, and N = 1's row of the cost table (N = 0's reads "-")
    assert (run_dir / "rehearsal_sweep.md").read_text().count("| parallel |") == 3
    assert all(r["seconds"] > 0 for r in out["rows"])
    fid = out["rows"][1]["fidelity"]  # every imagined step of N = 1 classed against the replayed real one
    assert "fidelity" not in out["rows"][0] and set(fid["all"]) == {"exact", "same_outcome", "wrong_outcome"}
    assert all(fid["used"][k] <= fid["all"][k] for k in fid["all"])
    assert fid["tasks_used"] == round(out["rows"][1]["memory_placed"] * 3)
    # per-task outcomes of N = 0 and N = 1 on the same 3 tasks, and N = 1 paired against N = 0
    from envace_jax.eval import imagined_fidelity as F
    from envace_jax.eval import paired
    from envace_jax.eval import rehearsal as R

    n0, n1 = (paired.read_outcomes(str(run_dir / f"eval_{arm}_tasks.jsonl")) for arm in ("n0", "n1"))
    assert len(n0) == 3 and {o.uid for o in n0} == {o.uid for o in n1}
    assert sum(o.success for o in n1) / 3 == pytest.approx(out["rows"][1]["success"])
    assert [(r["label"], r["a"], r["b"]) for r in out["paired"]] == [("N=1 parallel vs N=0", "n1", "n0")]
    want = paired.paired_row("N=1 parallel vs N=0", paired.compare(n1, n0, "n1", "n0"))
    assert _table_cells((run_dir / "rehearsal_sweep.md").read_text(), "N=1 parallel vs N=0") == want

    # another task family: its own directory, the run's files untouched
    before = (run_dir / "rehearsal_sweep.md").read_text()
    cfg = reduced().replace(task_family="irreversible", rehearsal_place_memory="always")
    out = run_rehearsal_table(cfg, str(run_dir), ns=(0, 2), modes=("parallel",), num_tasks=2)
    sub = run_dir / "rehearsal_irreversible"
    assert out["dir"] == str(sub) and (run_dir / "rehearsal_sweep.md").read_text() == before
    uids = [o.uid for o in paired.read_outcomes(str(sub / "eval_n2_tasks.jsonl"))]
    assert len(uids) == 2 and all(u.startswith("demo-irreversible-test-") for u in uids)
    assert out["rows"][1]["fidelity"]["tasks_used"] == 2  # "always": both memories placed
    # what each task's two rehearsals imagined, beside the memory that was placed
    recs = [json.loads(line) for line in (sub / "eval_n2_rehearsals.jsonl").read_text().splitlines()]
    assert [r["uid"] for r in recs] == uids and all(r["memory_placed"] and r["memory"] for r in recs)
    for r in recs:  # the records hold all the memory was built from: rebuilt from them, it is the same text
        traces = [
            R.RehearsalTrace(**dict(reh, steps=[R.StepTrace(**st) for st in reh["steps"]])) for reh in r["rehearsals"]
        ]
        assert [tr.index for tr in traces] == [1, 2]
        assert R.build_template_memory(traces, cfg.rehearsal_max_memory_chars) == r["memory"]
    assert not (sub / "eval_n0_rehearsals.jsonl").exists()
    assert "Cost and fidelity per setting" in (sub / "rehearsal_sweep.md").read_text()
    # per tool, what the used steps predicted against the tools: as many steps as the used fidelity counts,
    # and a table of them in the sweep's page when there are any
    fid = out["rows"][1]["fidelity"]
    assert sum(sum(c[k] for k in F.OUTCOMES) for c in fid["by_tool"].values()) == sum(fid["used"].values())
    heading = "Predicted against real, imagined steps of the placed memories (parallel, N = 2)"
    assert (heading in (sub / "rehearsal_sweep.md").read_text()) == bool(fid["by_tool"])
    # recomputed offline from the arm's records, the same counts as the sweep's own
    from envace_jax.demo.rehearsal_table import outcomes_of_records

    again = outcomes_of_records(cfg.replace(test_tasks=2), str(run_dir), "n2")["fidelity"]
    for key in ("used", "all", "tasks_used", "by_tool", "reasons"):
        assert again[key] == fid[key], key
    with pytest.raises(FileNotFoundError, match="n3"):
        outcomes_of_records(cfg, str(run_dir), "n3")
    with pytest.raises(ValueError, match="not in the test split"):
        outcomes_of_records(cfg.replace(seed=cfg.seed + 1), str(run_dir), "n2")


def test_sweep_cells_from_the_command_line(reduced_run, tmp_path):
    """--sweep_ns and --sweep_modes pick the sweep's cells; the run's model and tokenizer are copied so
    the other tests' files in the run directory stay as they are."""
    import shutil

    run_dir, _ = reduced_run
    for d in ("model", "tokenizer"):
        shutil.copytree(run_dir / d, tmp_path / d)
    cmd = [sys.executable, os.path.join(ROOT, "launch", "demo.py"), f"--config={ROOT}/configs/demo.py:reduced"]
    cmd += [f"--run_dir={tmp_path}", "--rehearsal_sweep", "--sweep_tasks=2", "--sweep_ns=0,1", "--sweep_modes=parallel"]
    proc = subprocess.run(cmd, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "rehearsal_sweep.md").read_text()
    assert table.count("| parallel |") == 3 and "| sequential |" not in table  # N = 0, 1 and N = 1's cost row
    assert sorted(p.name for p in tmp_path.glob("eval_*.jsonl")) == [
        "eval_n0_tasks.jsonl",
        "eval_n1_rehearsals.jsonl",
        "eval_n1_tasks.jsonl",
    ]


# ----------------------------------------------------------------------------- from a pretrained base


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """`make pretrain` at its tiny preset, then the reduced demo from that base (the default's path)."""
    root = tmp_path_factory.mktemp("demo_base")
    base_dir, run_dir = root / "base", root / "run"
    env = demo_env()
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "pretrain.py"),
            "--preset=tiny",
            f"--out={base_dir}",
            "--no_progress",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "demo.py"),
            "--preset=reduced",
            f"--set=base_dir={base_dir}",
            "--set=sft_steps=0",
            "--set=more_sft_lr=1e-4",
            f"--run_dir={run_dir}",
            "--no_progress",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return base_dir, run_dir


def test_demo_from_a_base_starts_from_it_and_reports_per_branch(base_run):
    from envace_jax.data.demo_tasks import BRANCHES
    from envace_jax.demo import pretrain

    base_dir, run_dir = base_run
    s = json.loads((run_dir / "summary.json").read_text())
    report.check_summary(s)
    assert s["start"] == "base" and s["base"]["dir"] == str(base_dir) and s["base"]["pretrain_steps"] == 6
    # the RL start is the shipped base itself: its evaluation is the base's, and the tokenizer is the base's
    assert (run_dir / "tokenizer" / "tokenizer.json").read_text() == (
        base_dir / "tokenizer" / "tokenizer.json"
    ).read_text()
    # RL prompts never repeat a task of the pretraining corpus; the stated mixes are the drawn ones
    b = pretrain.load_base(str(base_dir))
    demos = b.demonstrations()
    from envace_jax.demo import data as demo_data

    used = b.corpus_uids(b.corpus_rows(demos, demo_data.make_codec(b.tokenizer)), demos)
    rl = [json.loads(line) for line in (run_dir / "metrics_rl.jsonl").read_text().splitlines()]
    assert len(rl) == 2
    assert s["data"]["branch_share"]["eval"]["push_back"] == pytest.approx(0.5)
    assert s["data"]["sft_tasks"] == 24
    for tag in ("before", "after"):
        assert set(s[f"success_by_branch_{tag}"]) == set(BRANCHES)
        n_b = s["eval"][tag]["episodes_by_branch"]
        # the overall success is the episode-weighted mean of the per-branch ones
        assert s[f"real_success_{tag}"] == pytest.approx(
            sum(s[f"success_by_branch_{tag}"][k] * n_b[k] for k in BRANCHES) / sum(n_b.values())
        )
        # push-back success is the episode-weighted mean over its announced and silent kinds
        n_k = s["eval"][tag]["episodes_by_push_back_kind"]
        assert sum(n_k.values()) == n_b["push_back"] and set(n_k) <= {"announced", "silent"}
        assert s[f"success_by_branch_{tag}"]["push_back"] == pytest.approx(
            sum(s[f"success_by_push_back_kind_{tag}"][k] * n_k[k] for k in n_k) / n_b["push_back"]
        )
        for key in ("fidelity_state_changing", "fidelity_read_only", "optimistic_hallucination"):
            v = s[f"{key}_{tag}"]
            assert v is None or v != v or 0.0 <= v <= 1.0, key
    text = (run_dir / "report.md").read_text()
    assert "base (pretrained, shipped)" in text and "push_back (n=4)" in text
    from envace_jax.data.tfds_builder import read_split

    train = read_split(str(run_dir / "data"), demo_data.DATASET_NAME, "train")
    rl_uids = {train[i]["uid"] for i in range(len(train))}
    assert len(rl_uids) == 16 and not used & rl_uids


def test_replay_batches_hold_the_configured_roles(tmp_path):
    """``rl_replay_roles="rehearse"`` (the default preset) replays world-model rows only; "act+rehearse"
    half of each role; an unknown value is refused by name."""
    from envace_jax.demo.config import default
    from envace_jax.demo.pipeline import Demo
    from envace_jax.rl.types import ACT, REHEARSE, Generation

    rows = [Generation(role, [1, 2], [3], [0.0], f"u{i}", i, 0) for i, role in enumerate([ACT, REHEARSE] * 20)]
    for roles, want in (("rehearse", {REHEARSE: 8}), ("act+rehearse", {ACT: 4, REHEARSE: 4})):
        d = Demo(default().replace(rl_replay_roles=roles, sft_batch_rows=8), str(tmp_path), progress=False)
        d.rows = rows
        batch = next(d.replay_stream())
        assert {r: sum(g.role == r for g in batch) for r in want} == want and len(batch) == 8
    assert default().rl_replay_roles == "rehearse"
    assert Demo(default().replace(rl_replay_batches=0), str(tmp_path), progress=False).replay_stream() is None
    with pytest.raises(ValueError, match="rl_replay_roles"):
        default().replace(rl_replay_roles="act")


def test_replay_rows_update_the_model_that_plays_their_role(tmp_path):
    """A replay batch updates the shared policy with all its rows, in order; under ``noshare`` the ACT rows
    update the policy's trainer and the REHEARSE rows the simulator copy's, each NLL read from its own update."""
    from envace_jax.demo.config import reduced
    from envace_jax.demo.pipeline import Demo
    from envace_jax.rl.types import ACT, REHEARSE, ROLE_ID, Generation

    class Recorder:
        def __init__(self, nll):
            self.seen, self.nll = [], nll

        def update(self, batch, kind):
            assert kind == "sft"
            self.seen.append([int(r) for r in batch.role_ids])
            return {f"nll/{role}": self.nll for role in (ACT, REHEARSE)} | {"loss": 0.0}

    rows = [Generation(role, [1, 2], [3], [0.0], f"u{i}", i, 0) for i, role in enumerate([ACT, REHEARSE, ACT])]
    d = Demo(reduced(), str(tmp_path), progress=False)
    d.max_len = 64
    shared = Recorder(1.0)
    assert d._replay(rows, {ACT: shared, REHEARSE: shared}) == {"replay/nll/act": 1.0, "replay/nll/rehearse": 1.0}
    assert shared.seen == [[ROLE_ID[ACT], ROLE_ID[REHEARSE], ROLE_ID[ACT]]]
    act, reh = Recorder(2.0), Recorder(3.0)
    assert d._replay(rows, {ACT: act, REHEARSE: reh}) == {"replay/nll/act": 2.0, "replay/nll/rehearse": 3.0}
    assert act.seen == [[ROLE_ID[ACT]] * 2] and reh.seen == [[ROLE_ID[REHEARSE]]]


def test_rl_seed_moves_the_rl_streams_only(tmp_path):
    """``rl_seed`` reseeds RL's own streams (here the replay batches; the prompt order and rollout sampling
    read the same ``rl_stream_seed``) and leaves the task draw to ``seed``."""
    from envace_jax.demo import data as demo_data
    from envace_jax.demo.config import default
    from envace_jax.demo.pipeline import Demo
    from envace_jax.rl.types import ACT, REHEARSE, Generation

    rows = [Generation(role, [1, 2], [3], [0.0], f"u{i}", i, 0) for i, role in enumerate([ACT, REHEARSE] * 40)]

    def first_replay(cfg):
        d = Demo(cfg.replace(sft_batch_rows=8), str(tmp_path), progress=False)
        d.rows = rows
        return [g.uid for g in next(d.replay_stream())]

    crossed = default().replace(seed=3, rl_seed=4)
    assert crossed.rl_stream_seed == 4 and default().replace(seed=3).rl_stream_seed == 3
    assert first_replay(crossed) == first_replay(default().replace(seed=4))
    assert first_replay(crossed) != first_replay(default().replace(seed=3))
    small = dict(rl_tasks=24)
    assert demo_data.draw_rl_tasks(crossed.replace(**small)) == demo_data.draw_rl_tasks(
        default().replace(seed=3, **small)
    )


def test_learning_curve_points_leave_rl_unchanged(tmp_path):
    """``rl_eval_every`` evaluates the model during RL; the RL run itself (sampling, updates, final weights)
    is the same as without those evaluations, and the RL clock does not count them."""
    import jax
    import numpy as np

    from envace_jax.demo import stages
    from envace_jax.demo.config import reduced
    from envace_jax.demo.pipeline import Demo

    cfg = reduced().replace(rl_steps=3, rl_eval_every=1, prompts_per_step=2, test_tasks=4, fidelity_tasks=2)
    d = Demo(cfg, str(tmp_path), progress=False)
    d.prepare()
    d.sft()
    log_curve = d.rl(cfg.rl_mode, tag="rl")
    w_curve = jax.tree.leaves(stages.host_copy(stages.snapshot(d.model)))
    points = d.curves["rl"]
    assert [p["step"] for p in points] == [1, 2]  # the end point is the stage's own "after" evaluation
    for p in points:
        assert 0.0 <= p["success"] <= 1.0 and p["success_ci"][0] <= p["success"] <= p["success_ci"][1]
    assert d.timing["rl curve"].wall > 0

    d.cfg = cfg.replace(rl_eval_every=0)
    log_plain = d.rl(cfg.rl_mode, tag="rl_plain")
    w_plain = jax.tree.leaves(stages.host_copy(stages.snapshot(d.model)))
    assert d.curves["rl_plain"] == [] and "rl_plain curve" not in d.timing
    assert len(w_curve) == len(w_plain)
    for a, b in zip(w_curve, w_plain):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(log_curve, log_plain):
        assert a.get("episode/score_mean") == b.get("episode/score_mean")

    ev = {
        "success": 0.5,
        "success_ci": [0.2, 0.8],
        "score": 0.7,
        "success_by_branch": {"happy": 1.0, "push_back": 0.0},
        "success_by_push_back_kind": {"silent": 0.0},
    }
    curve = d.curve("rl", ev, ev)
    assert [p["step"] for p in curve] == [0, 1, 2, 3]
    rows, header = report.curve_rows(curve)
    assert header[:3] == ["RL step", "real success", "95% CI"] and "push-back, silent" in header
    assert rows[0][:3] == ["0", "0.500", "[0.200, 0.800]"] and len(rows) == 4


def test_lagged_demo_rl_repeats_and_replays_before_the_weights_go_out(tmp_path):
    """The demo's RL stage with ``rl_max_staleness=1`` (reduced preset, from its own SFT start): the rows of step
    k >= 1 are one update old, the replay batches still run after every update, and running the stage again
    from the same start gives the same weights, bit for bit."""
    import jax

    from envace_jax.demo import stages
    from envace_jax.demo.config import reduced
    from envace_jax.demo.pipeline import Demo

    cfg = reduced().replace(rl_max_staleness=1, rl_steps=3, more_sft=False)
    d = Demo(cfg, str(tmp_path), progress=False)
    d.prepare()
    d.sft()
    log = d.rl("rehearsal")
    first = stages.snapshot(d.model)
    assert [m["async/staleness_max"] for m in log] == [0.0, 1.0, 1.0]
    assert all("replay/nll/act" in m for m in log)
    d.rl("rehearsal")
    second = stages.snapshot(d.model)
    assert all(bool((a == b).all()) for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)))
    with pytest.raises(ValueError, match="rl_memory_fraction"):
        cfg.replace(rl_memory_fraction=0.5)
