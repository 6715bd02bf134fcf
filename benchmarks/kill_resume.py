"""Kill -9 a tiny ``launch/train.py`` run at N random moments, restarting it after each kill, and check
that every restart resumes from the newest checkpoint step that was committed when the kill landed,
and that the final parameters equal those of one uninterrupted run, bit for bit.

The run is the tests' tiny CPU config (``tests/helpers_loop.py``: demo tokenizer, 2 prompts x 4
rollouts per step, keep 2, asynchronous saves) with a checkpoint every ``--every`` steps (default 2:
with a save at every step the next save starts about when the previous one commits, which hides a
step that is committed but not yet marked complete). Each kill moment is drawn
(seeded) uniformly from ``[0, --max-delay]`` seconds after the restarted run logs its first new step,
so the kills fall on every phase of the step and of the asynchronous save that follows it; a kill
during start-up could not lose anything new, so none is aimed there.

For every kill the table shows what was on disk once the process was dead: the newest step Orbax had
committed (a ``<step>`` directory), the newest step whose manifest checks out, whether a write was
still in flight (an Orbax tmp directory), and the step the next run resumed from. A row fails when
the resume step differs from the newest committed step, or a committed step lacks a good manifest,
or the next run reports an unusable step. Exit status 1 on any failure or parameter difference.

Usage: PYTHONPATH=. python benchmarks/kill_resume.py [--kills 20] [--seed 0] [--max-delay 2.0]
       [--every 2] [--steps N] [--work DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # this process only reads manifests

from envace_jax.checkpoint import check_manifest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_loop_helpers():
    # The tests' tiny-run harness (task file, tokenizer, command line), loaded by path so the
    # benchmark runs exactly the configuration the kill tests run.
    spec = importlib.util.spec_from_file_location("helpers_loop", os.path.join(ROOT, "tests", "helpers_loop.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


h = _load_loop_helpers()


def metrics_lines(run_dir: str) -> int:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if line.strip())


def on_disk(run_dir: str) -> dict:
    """The checkpoint directory as a restart will find it."""
    ck = os.path.join(run_dir, "checkpoints")
    names = os.listdir(ck) if os.path.isdir(ck) else []
    committed = sorted(int(n) for n in names if n.isdigit())
    reasons = {s: check_manifest(os.path.join(ck, str(s))) for s in committed}
    manifested = [s for s in committed if reasons[s] is None]
    return {
        "committed": committed[-1] if committed else 0,
        "manifested": manifested[-1] if manifested else 0,
        "unmanifested": {s: r for s, r in reasons.items() if r is not None},
        "in_flight": any(".orbax-checkpoint-tmp" in n for n in names),
    }


def resumed_from(stderr: str) -> tuple[int, list[str]]:
    """(step the run resumed from, 0 for a fresh start; lines reporting unusable steps)."""
    m = re.findall(r"resumed from checkpoint step (\d+)", stderr)
    return (int(m[-1]) if m else 0), [line for line in stderr.splitlines() if "is unusable" in line]


def train_cmd(run_dir: str, steps: int, every: int, dump: str) -> list[str]:
    return h.train_cmd(run_dir, steps, f"--dump_params={dump}", **{"checkpoint.every": every})


def start(cmd: list[str], err_path: str) -> subprocess.Popen:
    with open(err_path, "w") as err:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, env=h.env(), stdout=subprocess.DEVNULL, stderr=err, text=True)


def params(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-delay", type=float, default=2.0, help="seconds after a restart's first new step")
    ap.add_argument("--every", type=int, default=2, help="checkpoint every this many steps")
    ap.add_argument("--steps", type=int, default=None, help="total steps (default 10 per kill + 10)")
    ap.add_argument("--work", default=None, help="working directory (default: a new temp dir)")
    a = ap.parse_args()
    if a.kills < 1 or a.max_delay <= 0 or a.every < 1:
        ap.error("--kills and --every must be >= 1 and --max-delay > 0")
    steps = a.steps or 10 * a.kills + 10
    work = a.work or tempfile.mkdtemp(prefix="kill_resume_")
    rng = random.Random(a.seed)
    ref_dir, run_dir = os.path.join(work, "ref"), os.path.join(work, "run")
    t0 = time.time()

    print(f"work dir {work}; {steps} steps, checkpoint every {a.every}, {a.kills} kills, seed {a.seed}", flush=True)
    ref = subprocess.run(
        train_cmd(ref_dir, steps, a.every, f"{work}/ref.npz"), env=h.env(), capture_output=True, text=True
    )
    if ref.returncode != 0:
        print(ref.stderr[-3000:], file=sys.stderr)
        return 2
    print(f"uninterrupted run done ({time.time() - t0:.0f} s)", flush=True)

    rows = []
    segment = 0
    while True:
        err_path = os.path.join(work, f"segment_{segment}.err")
        proc = start(train_cmd(run_dir, steps, a.every, f"{work}/run.npz"), err_path)
        if segment > 0:  # the kill before this segment is judged by where this one resumed
            rows[-1]["next_err"] = err_path
        if len(rows) == a.kills:
            proc.wait()
            break
        lines0 = metrics_lines(run_dir)
        while metrics_lines(run_dir) <= lines0 and proc.poll() is None:
            time.sleep(0.005)
        delay = rng.uniform(0.0, a.max_delay)
        time.sleep(delay)
        if proc.poll() is not None:
            print(f"the run finished before kill {len(rows) + 1}; use more --steps", file=sys.stderr)
            return 2
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        rows.append({"kill": len(rows) + 1, "delay_s": delay, **on_disk(run_dir)})
        segment += 1
    if proc.returncode != 0:
        print(open(err_path).read()[-3000:], file=sys.stderr)
        return 2

    failures = 0
    header = f"{'kill':>4} {'at s':>5} {'committed':>9} {'manifested':>10} {'in flight':>9} {'resumed':>7}  result"
    print(header)
    print("-" * len(header))
    for r in rows:
        with open(r["next_err"]) as f:
            r["resumed"], unusable = resumed_from(f.read())
        problems = []
        if r["resumed"] != r["committed"]:
            problems.append(f"resumed {r['resumed']} != committed {r['committed']}")
        if r["unmanifested"]:
            problems.append(f"committed steps failing their manifest check: {r['unmanifested']}")
        if unusable:
            problems.append("; ".join(unusable))
        failures += bool(problems)
        r["result"] = "ok" if not problems else "FAIL: " + "; ".join(problems)
        print(
            f"{r['kill']:>4} {r['delay_s']:>5.2f} {r['committed']:>9} {r['manifested']:>10} "
            f"{'yes' if r['in_flight'] else 'no':>9} {r['resumed']:>7}  {r['result']}"
        )

    ref_p, got_p = params(f"{work}/ref.npz"), params(f"{work}/run.npz")
    same = sorted(ref_p) == sorted(got_p) and all(
        ref_p[k].dtype == got_p[k].dtype and np.array_equal(ref_p[k], got_p[k]) for k in ref_p
    )
    print(f"final parameters ({len(ref_p)} arrays) bit-identical to the uninterrupted run: {same}")
    print(f"{failures} of {len(rows)} kills failed; {time.time() - t0:.0f} s in all", flush=True)
    with open(os.path.join(work, "kill_resume.json"), "w") as f:
        json.dump(
            {
                "rows": [{k: v for k, v in r.items() if k != "next_err"} for r in rows],
                "params_identical": same,
                "steps": steps,
                "seed": a.seed,
            },
            f,
            indent=1,
        )
    return 0 if same and failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
