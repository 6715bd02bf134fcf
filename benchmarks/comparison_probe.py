"""Probe: can the shipped demo base learn to compare two numbers, and does it carry over to the tool tasks?

The demo's RL gain on silent push-backs ("if ana has at least 28, send 28 ...") is a learned prior, because
the 0.5M-parameter base cannot compare two numbers (docs/results.md, "What RL learned"). A pretrained Qwen3 can; this
probe asks whether generic comparison questions without tools ("Is 52 at least 49?" -> "Yes, 52 is at least
49.", three phrasings, numbers 1-120) teach the base to, on held-out questions and on the validation tasks
whose right answer depends on a comparison (bank/compare, bank/conditional, shop/order_if). Validation split
only; nothing here touches the test split.

Modes:
- ``only``: the base trained on comparison rows alone (batch 32); every quarter of ``--steps`` it prints, on
  300 held-out questions, the exact answer, the yes/no decision and which number it names as larger.
- ``mixed``: two arms from the base for ``--steps`` steps on its own pretraining corpus (16 ACT + 16
  REHEARSE rows a batch): ``control`` as is, ``compare`` with ``--share`` of the 16 ACT rows replaced by
  comparison rows; each arm, and the base, is scored on held-out questions and on 240 validation tasks of
  the comparison types (50% push-back), greedy, against the real tools.

- ``--form tool`` (``mixed`` only): the comparison rows are tool-shaped instead, in a world the
  tasks do not have (water tanks: ``get_level``, ``pump``; ``envace_jax/data/tank_tasks.py``). Half are
  conditional pumps ("If north holds at least 40, pump 40 from north to east. Otherwise tell me north's
  level."): read a level from a JSON tool response, compare it with the user's number, then pump or send
  nothing; half compare two tanks' levels ("Which tank holds more, north or east?"). It asks whether
  comparison in the form the tool tasks need, but not on their tools, carries over. ``--arms compare`` skips
  the control arm (its figures are in docs/results.md).
- ``--grow K`` (``mixed`` only): train a K times deeper copy of the base (``models/grow.py``), which computes the
  base's function at step 0, to ask whether depth is what the comparison lacks.

- ``replies``: no training; the base (and ``--model``, a demo run's exported RL model) on ``--questions``
  fresh validation bank/compare tasks ("Who has more money, ana or bob?"), greedy, real tools: of the
  replies in the demonstrated form ("<name> has more: <x> against <y>"), how often the two balances come in
  the right order (the larger first) and how often the named account is the richer one.

Usage: python benchmarks/comparison_probe.py --mode only --steps 2000 --lr 1e-3
       python benchmarks/comparison_probe.py --mode mixed --steps 1000 --share 8 --lr 1e-3 --rows 4096 --questions 200
       python benchmarks/comparison_probe.py --mode mixed --form tool --arms compare --steps 1000 --share 8 --lr 1e-3
       python benchmarks/comparison_probe.py --mode mixed --form tool --arms compare --grow 2 --steps 3000 --share 10
       python benchmarks/comparison_probe.py --mode replies --questions 200 [--model runs/demo/model]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

COMPARISON_TYPES = ("bank/compare", "bank/conditional", "shop/order_if")


def comparison_tasks(n: int, seed: int) -> list[dict]:
    """``n`` tool-less chat tasks asking to compare two numbers, in three phrasings, with their answers."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(1, 120), rng.randint(1, 120)
        kind = rng.randrange(3)
        if kind == 0:
            q = f"Is {a} at least {b}?"
            r = f"Yes, {a} is at least {b}." if a >= b else f"No, {a} is less than {b}."
        elif kind == 1:
            b = b + 1 if a == b else b
            q = f"Which is more, {a} or {b}?"
            r = f"{max(a, b)} is more than {min(a, b)}."
        else:
            q = f"I have {a} and need {b}. Is that enough?"
            r = f"Yes, {a} is enough for {b}." if a >= b else f"No, {a} is less than {b}."
        msgs = [
            {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
            {"role": "user", "content": q},
        ]
        out.append(
            {
                "uid": f"compare-{seed}-{i}",
                "messages": msgs,
                "tools": [],
                "reference_messages": [msgs[1], {"role": "assistant", "content": r}],
            }
        )
    return out


def question_scores(model, codec, tasks) -> dict:
    """Greedy answers to held-out comparison questions: exact, the yes/no decision, the larger number named."""
    from envace_jax.sampling import Sampler
    from envace_jax.sampling import SamplingParams

    prompts = [codec.caller_prompt([dict(m) for m in t["messages"]], []) for t in tasks]
    params = SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=codec.renderer.stop_token_ids)
    out = Sampler(model, cache_size=256).generate(prompts, params)
    end = codec.renderer.im_end_id
    texts = [codec.renderer.decode([x for x in toks if x != end]).strip() for toks in out.tokens]
    exact = yesno = yesno_n = more = more_n = 0
    for text, t in zip(texts, tasks):
        ref = t["reference_messages"][1]["content"]
        exact += text == ref
        if ref.startswith(("Yes", "No")):
            yesno_n += 1
            yesno += text.split(",")[0] == ref.split(",")[0]
        else:
            more_n += 1
            more += text.split(" ")[0] == ref.split(" ")[0]
    return {
        "exact": round(exact / len(tasks), 3),
        "yes/no decision": round(yesno / max(yesno_n, 1), 3),
        "larger number named": round(more / max(more_n, 1), 3),
        "e.g.": [(t["messages"][1]["content"], x) for x, t in zip(texts[:2], tasks[:2])],
    }


def tank_scores(model, codec, n: int = 300) -> dict:
    """Greedy decisions on held-out tank conversations, after the tool response: on ``n`` conditional pumps,
    whether the model pumps exactly when the level read meets the user's number (a rule that reads only the
    user's number gets about 0.78), and on ``n`` two-tank comparisons, whether it names the fuller tank."""
    from envace_jax.data.tank_tasks import tank_tasks
    from envace_jax.demo import data as demo_data
    from envace_jax.sampling import Sampler
    from envace_jax.sampling import SamplingParams

    held_out = tank_tasks(8 * n, 99)
    cond = [t for t in held_out if t["messages"][1]["content"].startswith("If")][:n]
    comp = [t for t in held_out if t["messages"][1]["content"].startswith("Which")][:n]
    params = SamplingParams(temperature=0.0, max_new_tokens=40, stop_token_ids=codec.renderer.stop_token_ids)
    end = codec.renderer.im_end_id

    def replies(tasks):  # the second ACT row's context: the conversation up to the first tool response
        out = Sampler(model, cache_size=512).generate(
            [list(demo_data.act_rows(t, codec, 0)[1].prompt_ids) for t in tasks], params
        )
        return [codec.renderer.decode([x for x in toks if x != end]).strip() for toks in out.tokens]

    holds = [sum(m["role"] == "assistant" for m in t["reference_messages"]) == 3 for t in cond]  # call, pump, reply
    pumped = ["<tool_call>" in x and '"pump"' in x for x in replies(cond)]
    named = [
        x.split(" ")[0] == t["reference_messages"][-1]["content"].split(" ")[0] for x, t in zip(replies(comp), comp)
    ]
    return {
        "tank conditional right": round(sum(p == h for p, h in zip(pumped, holds)) / len(cond), 3),
        "tank comparison right": round(sum(named) / len(comp), 3),
    }


def task_scores(model, codec, tasks, demo_cfg) -> dict:
    import numpy as np

    from envace_jax.demo import stages
    from envace_jax.eval.results import is_success

    res = stages.evaluate_real(demo_cfg, model, codec, tasks)
    rate = lambda v: round(float(np.mean([is_success(s) for s in v])), 3)
    return {
        "success": rate(res.scores),
        "by_type": {k: (rate(v), len(v)) for k, v in sorted(res.by_type.items())},
        "by_branch": {k: rate(v) for k, v in sorted(res.by_branch.items())},
    }


def reply_binding(model, codec, tasks, demo_cfg) -> dict:
    """bank/compare replies split by whether the balances are ordered right and the richer account named."""
    import re

    from envace_jax.demo import stages

    engine = stages.make_engine(
        demo_cfg, "real", codec, stages.make_client(model, codec, demo_cfg, slots=128), greedy=True
    )
    out = {"tasks": len(tasks), "other form": 0, "numbers right": 0, "name right": 0, "both right": 0}
    for e in engine.run(tasks, [t["uid"] for t in tasks]):
        reads = [json.loads(m["content"]) for m in e.messages if m["role"] == "tool"]
        reply = re.fullmatch(r"(\w+) has more: (\d+) against (\d+)\.?", (e.messages[-1].get("content") or "").strip())
        balances = {r["account"]: r["balance"] for r in reads if isinstance(r, dict) and "balance" in r}
        if reply is None or len(balances) != 2:
            out["other form"] += 1
            continue
        numbers = int(reply.group(2)) == max(balances.values()) and int(reply.group(3)) == min(balances.values())
        name = reply.group(1) == max(balances, key=balances.get)
        out["numbers right"] += numbers
        out["name right"] += name
        out["both right"] += numbers and name
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("only", "mixed", "replies"), default="mixed")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--share", type=int, default=8, help="mixed: comparison rows of the 16 ACT rows of a batch")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--rows", type=int, default=16384, help="comparison tasks to train on")
    ap.add_argument("--questions", type=int, default=300, help="held-out comparison questions to score")
    ap.add_argument(
        "--form",
        choices=("text", "tool"),
        default="text",
        help="comparison rows: questions without tools, or tool-shaped in the tank world",
    )
    ap.add_argument("--arms", default="control,compare", help="mixed: which training arms to run")
    ap.add_argument("--base", default="assets/demo_base")
    ap.add_argument(
        "--save",
        default="",
        help="mixed: write the compare arm's model as a base directory here "
        "(the base's tokenizer and manifest; for --config.base_dir)",
    )
    ap.add_argument(
        "--grow",
        type=int,
        default=1,
        help="mixed: train a GROW times deeper copy of the base (models/grow.py; the same function at step 0)",
    )
    ap.add_argument("--model", default="", help="replies: also score this exported model (a demo run's model/)")
    args = ap.parse_args()
    if not 0 < args.share <= 16 or args.steps < 4:
        raise SystemExit("--share must be in 1..16 and --steps at least 4")
    if args.form == "tool" and args.mode != "mixed":
        raise SystemExit("--form tool is scored on the validation tasks: use it with --mode mixed")
    arms = args.arms.split(",")
    if not arms or set(arms) - {"control", "compare"}:
        raise SystemExit(f"--arms takes control and/or compare, comma-separated; got {args.arms!r}")
    if args.grow < 1 or (args.grow > 1 and args.mode != "mixed"):
        raise SystemExit("--grow must be at least 1, and above 1 only with --mode mixed")
    if args.save and (args.mode != "mixed" or "compare" not in arms):
        raise SystemExit("--save writes the compare arm: use it with --mode mixed and --arms including compare")
    from envace_jax import host_memory

    host_memory.retain_freed_memory()
    from envace_jax.data.demo_tasks import generate_tasks
    from envace_jax.demo import data as demo_data
    from envace_jax.demo import pretrain as P
    from envace_jax.demo import stages
    from envace_jax.rl.trainer import LossConfig, OptimConfig, Trainer
    from envace_jax.rl.types import ACT, REHEARSE

    t0 = time.perf_counter()
    base = P.load_base(args.base)
    codec = demo_data.make_codec(base.tokenizer)
    if args.mode == "replies":
        from envace_jax.models import hf_io

        pool = generate_tasks(args.questions * 40, 5, "validation")
        tasks = [demo_data.normalize_task(t) for t in pool if t["task_type"] == "bank/compare"][: args.questions]
        demo_cfg = P._demo_cfg(base.config)
        arms = [("base", base.model())] + ([(args.model, hf_io.load_hf(args.model))] if args.model else [])
        for name, model in arms:
            print(json.dumps({"model": name, **reply_binding(model, codec, tasks, demo_cfg)}), flush=True)
        return
    from envace_jax.data.tank_tasks import tank_tasks

    make_rows = tank_tasks if args.form == "tool" else comparison_tasks
    rows = [r for e, t in enumerate(make_rows(args.rows, 11)) for r in demo_data.act_rows(t, codec, e)]
    questions = comparison_tasks(args.questions, 99)
    optim = OptimConfig(
        lr=args.lr, schedule="constant", warmup_steps=0, total_steps=args.steps, weight_decay=0.0, grad_clip=1.0
    )

    def train(model, groups, shares, seed, micro, every=None, on_eval=None):
        tr = Trainer(model, optim, LossConfig(), micro_batch_size=micro, pad_micro_batches=True)
        batches = P.IndexedBatches(groups, shares, seed)
        for k in range(args.steps):
            m = tr.update(stages.sft_batch(batches.batch(k), P.MAX_LEN), kind="sft")
            if k % 250 == 0:
                print(f"  step {k}: nll act {m.get('nll/act', 0):.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
            if every and (k + 1) % every == 0:
                on_eval(k + 1)

    if args.mode == "only":
        model = base.model()
        print(json.dumps({"step": 0, **question_scores(model, codec, questions)}), flush=True)
        train(
            model,
            {ACT: rows},
            {ACT: 32},
            3,
            32,
            every=args.steps // 4,
            on_eval=lambda k: print(json.dumps({"step": k, **question_scores(model, codec, questions)}), flush=True),
        )
        return
    demos = base.demonstrations()
    corpus = base.corpus_rows(demos, codec)
    groups = {
        ACT: [r for r in corpus if r.role == ACT],
        REHEARSE: [r for r in corpus if r.role == REHEARSE],
        "compare": rows,
    }
    pool = [
        demo_data.normalize_task(t) for t in generate_tasks(3000, base.config.seed, "validation", push_back_share=0.5)
    ]
    val = [t for t in pool if t["task_type"] in COMPARISON_TYPES][:240]
    demo_cfg = P._demo_cfg(base.config)
    print(
        f"setup {time.perf_counter() - t0:.0f} s: {len(rows)} comparison rows, {len(val)} validation tasks", flush=True
    )

    def report(arm, model):
        held_out = (
            {"tank": tank_scores(model, codec)}
            if args.form == "tool"
            else {"questions": question_scores(model, codec, questions)}
        )
        print(
            json.dumps({"arm": arm, **held_out, "validation tasks": task_scores(model, codec, val, demo_cfg)}),
            flush=True,
        )

    from envace_jax.models.grow import grow_depth

    start = (lambda: grow_depth(base.model(), args.grow)) if args.grow > 1 else base.model
    report("base", start())
    for arm in [a for a in ("control", "compare") if a in arms]:
        model = start()
        shares = (
            {ACT: 16, REHEARSE: 16} if arm == "control" else {ACT: 16 - args.share, "compare": args.share, REHEARSE: 16}
        )
        print(f"{arm}: {args.steps} steps, lr {args.lr}, rows per batch {shares}", flush=True)
        train(model, groups, shares, 1, 16)
        report(arm, model)
        if arm == "compare" and args.save:
            import shutil

            from envace_jax.demo.rehearsal_table import export_model

            shutil.copytree(args.base, args.save, ignore=shutil.ignore_patterns("model"), dirs_exist_ok=True)
            if args.grow > 1:  # the manifest describes the model it sits beside
                with open(os.path.join(args.save, "manifest.json")) as f:
                    manifest = json.load(f)
                manifest["config"]["num_layers"] = model.config.num_layers
                manifest["grown_from"] = {"base": args.base, "factor": args.grow}
                with open(os.path.join(args.save, "manifest.json"), "w") as f:
                    json.dump(manifest, f, indent=1)
            print(f"saved to {export_model(model, args.save)}", flush=True)


if __name__ == "__main__":
    main()
