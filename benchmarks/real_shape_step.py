"""One RL step at Qwen3-0.6B shape with the official Qwen3 tokenizer, end to end on CPU.

    python benchmarks/real_shape_step.py --out runs/real_shape_step                   # Qwen3-0.6B shape
    python benchmarks/real_shape_step.py --preset tiny --out /tmp/rs                  # 2 layers, real vocabulary
    make real-shape-step                                                              # the first line

This walks the path of a user who has a real Qwen3 checkpoint folder, with random weights in its place:

1. checkpoint: transformers builds a random ``Qwen3ForCausalLM`` with Qwen3-0.6B's hyperparameters
   (``--preset qwen3_0_6b``: 28 layers, hidden 1024, MLP 3072, 16 heads, 8 KV heads, head_dim 128,
   vocabulary 151,936, tied embeddings, rope_theta 1e6, 40,960 positions) and saves it in bfloat16 as the
   released checkpoint is, next to the official tokenizer files (``tokenizer.json`` and
   ``tokenizer_config.json`` with Qwen3's chat template; ``--tokenizer_dir``, fetched by
   ``make qwen3-files``). It runs in a child process, so its memory is not counted in the run's.
2. data: demo tool-use tasks (the repository's own CM2-style checklist records) written as a JSONL file,
   the ``data.path`` a user passes.
3. build run: ``configs/envace_qwen3_8b.py`` (the reference config) with the checkpoint folder as
   ``model.hf_path`` and ``tokenizer.path``, preset ``qwen3_0_6b``, the rule checklist judge (no network)
   and small sizes, then ``rl.train.build_run``, as ``launch/train.py`` does: tokenizer from the folder,
   ``hf_io.load_hf`` (bfloat16 on disk -> float32 master weights), the trainer (AdamW), the sampler client,
   the rollout engine in rehearsal mode, the data iterator.
4. one RL step (``RLStep``): rollouts (the prompts rendered with the official chat template), the judge,
   role-wise GRPO advantages, the old log-probs pass and one PPO/GRPO update.
5. export: ``hf_io.save_hf`` of the updated policy plus the tokenizer files (what ``launch/export_hf.py``
   writes).
6. parity: the exported folder loads in transformers (child process), its logits on the last
   ``--compare_tokens`` tokens of ``--compare_rows`` training rows (prompt + sampled reply) are compared
   with our updated JAX model's, and its tokenizer renders the first prompt with the official template to
   exactly the ids the rollout sampled from.

It prints seconds and peak resident memory per phase (a thread samples /proc/self/statm every 20 ms,
and a phase that raised the process's ``ru_maxrss`` counts that peak; child processes report their own
VmHWM, see ``own_peak_gib``), the process's peak (``resource.getrusage`` ``ru_maxrss`` and VmHWM), and
the parity figures, then the phase table as markdown, and writes everything to ``<out>/summary.json``.
The step is the first of the run, so its phases include XLA compilation.

With random weights the policy never emits a well-formed tool call, so rollouts hold ACT rows only
(REHEARSE is asked only to answer tool calls) and every episode scores 0: the advantages are zero and
the update moves the weights by AdamW's weight decay alone. The work and memory of the update are the
same as with real weights; the rows' lengths are not (every reply runs to ``--max_new_tokens``).

Measured at commit 05bbc6a with ``--lr 1e-4`` and the defaults (4 prompts x 2 rollouts, 64 new tokens,
prompts of 308 tokens on average with the official template), on 2 CPU cores shared with other jobs
(load average ~10), 20.5 minutes in all: checkpoint 42 s (child 3.2 GiB); build_run 42 s, 7.4 GiB
(float32 weights 2.4 GB + AdamW moments 4.8 GB); rollouts 345 s (prefill of 2,466 tokens 217 s, 64
decode steps of 8 rows 128 s), 11.0 GiB; old log-probs 131 s; update 487 s (8 micro-batches of one
448-token row, full remat), 15.4 GiB, the run's peak; export 18 s; transformers reads the export with
logits within 6.0e-6 of ours (largest |logit| 3.5), and its template renders the prompt to the sampled ids.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import multiprocessing
import os
import resource
import shutil
import sys
import threading
import time
from typing import Any, Iterator

from envace_jax.chat.tokenizer import QWEN3_FILES, QWEN3_FILES_ENV, official_qwen3_dir  # host code: no jax
from envace_jax.model_sizes import QWEN3_0_6B, QWEN3_VOCAB, TINY

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE_CONFIG = os.path.join(REPO, "configs", "envace_qwen3_8b.py")
# The files launch/export_hf.py copies next to the exported weights.
TOKENIZER_PREFIXES = ("tokenizer", "special_tokens", "vocab", "merges", "chat_template")

# transformers Qwen3Config fields. Qwen3-0.6B's are those of its released config.json.
_QWEN3_COMMON = dict(
    vocab_size=QWEN3_VOCAB,
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    attention_bias=False,
    bos_token_id=151643,
    eos_token_id=151645,
    use_sliding_window=False,
)
HF_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3_0_6b": dict(_QWEN3_COMMON, **QWEN3_0_6B.hf_fields(), max_window_layers=QWEN3_0_6B.num_layers),
    # Same vocabulary, tokenizer and config path; model_sizes.TINY (2 small layers), for tests and development.
    "tiny": dict(_QWEN3_COMMON, **TINY.hf_fields(), max_window_layers=TINY.num_layers),
}
# Our preset of the same architecture: build_model checks the loaded checkpoint against it.
MODEL_PRESET = {"qwen3_0_6b": "qwen3_0_6b", "tiny": "tiny"}

GIB = float(1 << 30)


# ----------------------------------------------------------------------------- memory and phases

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """This process's resident set size now (/proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def ru_maxrss_gib() -> float:
    """This process's peak RSS (``resource.getrusage``; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def own_peak_gib() -> float:
    """This process's own peak RSS (VmHWM of its address space). A spawned child's ``ru_maxrss`` is not
    that: Linux copies the parent's high-water mark into the child at fork and keeps it across exec, so
    a child of a 15 GiB process reports at least 15 GiB. Children report this instead."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / GIB
    raise RuntimeError("/proc/self/status has no VmHWM line")


class RssWatch:
    """Peak RSS since the last ``restart``, from a thread sampling /proc/self/statm every ``interval`` s,
    and from ``ru_maxrss`` whenever a phase raised the process's peak (a spike shorter than the interval
    is then still counted). Reading, not resetting: ``ru_maxrss`` stays the process's true peak."""

    def __init__(self, interval: float = 0.02):
        self.peak = rss_bytes()
        self._lock = threading.Lock()  # a restart must not be overwritten by a sample taken before it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval,), daemon=True)
        self._thread.start()

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            with self._lock:
                self.peak = max(self.peak, rss_bytes())

    def restart(self) -> None:
        with self._lock:
            self.peak = rss_bytes()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclasses.dataclass
class Phase:
    name: str
    seconds: float
    peak_gib: float | None  # this process; None: not measured (a split of its parent's time)
    depth: int
    note: str = ""
    child_peak_gib: float | None = None  # a child process's own peak (``own_peak_gib``)


class PhaseTable:
    """Seconds and peak RSS of nested phases. A phase's peak covers its children: before a child
    phase restarts the watch, the parent folds in what it has seen so far."""

    def __init__(self):
        self.rows: list[Phase] = []
        self._stack: list[list[float]] = []  # running peak (bytes) of each open phase
        self.watch = RssWatch()

    @contextlib.contextmanager
    def measure(self, name: str, note: str = "", *, accumulate: bool = False) -> Iterator[Phase]:
        """Times the block as phase ``name``. ``accumulate``: repeated calls add to one row (its
        seconds summed, its peak the largest)."""
        if self._stack:
            self._stack[-1][0] = max(self._stack[-1][0], self.watch.peak)
        depth = len(self._stack)
        row = next((r for r in self.rows if accumulate and r.name == name and r.depth == depth), None)
        if row is None:
            row = Phase(name, 0.0, None, depth, note)
            self.rows.append(row)
        self._stack.append([(row.peak_gib or 0.0) * GIB])
        ru0 = ru_maxrss_gib()
        self.watch.restart()
        t0 = time.perf_counter()
        try:
            yield row
        finally:
            row.seconds += time.perf_counter() - t0
            ru1 = ru_maxrss_gib()
            peak = max(self._stack.pop()[0], self.watch.peak, rss_bytes(), ru1 * GIB if ru1 > ru0 else 0.0)
            row.peak_gib = peak / GIB
            if self._stack:
                self._stack[-1][0] = max(self._stack[-1][0], peak)
            if depth <= 1:  # progress for long runs
                print(
                    f"{'  ' * depth}done: {name}, {time.perf_counter() - t0:.1f} s, peak RSS {row.peak_gib:.2f} GiB",
                    file=sys.stderr,
                    flush=True,
                )

    def add(self, name: str, seconds: float, depth: int, *, note: str = "") -> None:
        self.rows.append(Phase(name, seconds, None, depth, note))

    def markdown(self) -> str:
        out = ["| phase | seconds | peak RSS GiB | child process peak GiB | note |", "|---|---:|---:|---:|---|"]
        for r in self.rows:
            name = "&nbsp;&nbsp;" * r.depth + ("- " if r.depth else "") + r.name
            peak = "" if r.peak_gib is None else f"{r.peak_gib:.2f}"
            child = "" if r.child_peak_gib is None else f"{r.child_peak_gib:.2f}"
            out.append(f"| {name} | {r.seconds:.1f} | {peak} | {child} | {r.note} |")
        return "\n".join(out)


@contextlib.contextmanager
def wrapped(obj: Any, attr: str, table: PhaseTable, name: str) -> Iterator[None]:
    """Measures the calls of ``obj.attr`` as one phase ``name`` (nested in the phase they are made in)."""
    inner = getattr(obj, attr)

    def call(*a, **k):
        with table.measure(name, accumulate=True):
            return inner(*a, **k)

    setattr(obj, attr, call)
    try:
        yield
    finally:
        setattr(obj, attr, inner)


# ----------------------------------------------------------------------------- children


def _child_limits() -> None:
    import torch

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def build_checkpoint(fields: dict[str, Any], tokenizer_dir: str, out_dir: str, seed: int) -> dict[str, Any]:
    """(child) A random transformers Qwen3 with ``fields``, saved in bfloat16 with the tokenizer files."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    _child_limits()
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    model = Qwen3ForCausalLM(Qwen3Config(**fields)).to(torch.bfloat16).eval()
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out_dir)
    for name in QWEN3_FILES:
        shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(out_dir, name))
    return {"params": int(n_params), "seconds": time.perf_counter() - t0, "peak_gib": own_peak_gib()}


def weight_change(before_dir: str, after_dir: str) -> dict[str, float]:
    """Largest |after - before| over the tensors of two safetensors folders, and the fraction of
    values that changed (the tensors of ``after``; both hold the same names)."""
    import numpy as np
    from safetensors import safe_open

    def index(d):
        out = {}
        for name in os.listdir(d):
            if name.endswith(".safetensors"):
                with safe_open(os.path.join(d, name), "np") as f:
                    out.update({k: os.path.join(d, name) for k in f.keys()})
        return out

    before, after = index(before_dir), index(after_dir)
    if set(before) != set(after):
        raise ValueError(f"tensor names differ: {sorted(set(before) ^ set(after))[:5]}")
    biggest, changed, total = 0.0, 0, 0
    for k in sorted(after):
        with safe_open(before[k], "pt") as f:
            b = f.get_tensor(k).float().numpy()
        with safe_open(after[k], "pt") as f:
            a = f.get_tensor(k).float().numpy()
        d = np.abs(a - b)
        biggest, changed, total = max(biggest, float(d.max())), changed + int((d > 0).sum()), total + d.size
    return {"max_abs_change": biggest, "changed_frac": changed / max(1, total)}


def transformers_parity(
    export_dir: str,
    tokenizer_dir: str,
    ours_npz: str,
    record: dict[str, Any],
    prompt_ids: list[int],
    enable_thinking: bool,
    checkpoint_dir: str,
) -> dict[str, Any]:
    """(child) Loads ``export_dir`` in transformers; max |logits - ours| on the saved rows, whether its
    tokenizer (official template) renders ``record``'s prompt to ``prompt_ids``, and how far the update
    moved the weights from ``checkpoint_dir``'s."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _child_limits()
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    saved = np.load(ours_npz)
    ids, ours = saved["ids"], saved["logits"]
    diffs = []
    with torch.no_grad():
        for i in range(ids.shape[0]):
            ref = model(torch.as_tensor(ids[i : i + 1], dtype=torch.long)).logits[0].float().numpy()
            diffs.append(float(np.abs(ref - ours[i]).max()))
    tok = AutoTokenizer.from_pretrained(export_dir, local_files_only=True)
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        official_template = json.load(f)["chat_template"]
    rendered = tok.apply_chat_template(
        record["messages"],
        tools=record["tools"] or None,
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=enable_thinking,
    )
    architecture = type(model).__name__
    del model
    return {
        **weight_change(checkpoint_dir, export_dir),
        "architecture": architecture,
        "load_s": load_s,
        "max_abs_diff_per_row": diffs,
        "max_abs_diff": max(diffs),
        "logit_scale": float(np.abs(ours).max()),
        "official_template": tok.chat_template == official_template,
        "prompt_ids_match": tok.encode(rendered, add_special_tokens=False) == list(prompt_ids),
        "seconds": time.perf_counter() - t0,
        "peak_gib": own_peak_gib(),
    }


def in_child(fn, *args) -> Any:
    """``fn(*args)`` in a fresh interpreter (spawn): its memory is its own and is returned to the system."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


# ----------------------------------------------------------------------------- the run


def find_tokenizer_dir(arg: str | None) -> str:
    path = arg or official_qwen3_dir(REPO)
    missing = [f for f in QWEN3_FILES if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise SystemExit(
            f"real_shape_step: the official Qwen3 tokenizer files {missing} are not in {path!r}. "
            f"Run `make qwen3-files` to fetch them into .cache/qwen3-official, or pass "
            f"--tokenizer_dir (or set {QWEN3_FILES_ENV}) to a folder holding {list(QWEN3_FILES)}."
        )
    return path


def run_config(args, ckpt: str, data_path: str, run_dir: str):
    """The reference config (configs/envace_qwen3_8b.py) pointed at the checkpoint, sized for a CPU."""
    from envace_jax import config as config_lib

    c = config_lib.config_from_file(REFERENCE_CONFIG)
    c.name = f"real_shape_step_{args.preset}"
    c.run_dir = run_dir
    c.total_steps = 1
    c.model.hf_path = ckpt
    c.model.preset = MODEL_PRESET[args.preset]
    c.model.param_dtype = "float32"
    c.model.dtype = args.dtype
    if args.remat:
        c.model.remat_policy = args.remat
    c.tokenizer.path = ckpt
    c.data.path = data_path
    c.data.prompts_per_step = args.prompts
    c.rollout.max_steps = args.max_steps
    c.rollout.max_assistant_turns = args.max_turns
    c.rollout.max_user_turns = args.max_turns
    for role in (c.rollout.act, c.rollout.rehearse):
        role.max_new_tokens = args.max_new_tokens
    if args.lr is not None:
        c.optim.lr = args.lr
    c.judge.kind = "rule"
    c.rl.n_rollouts = args.group
    c.rl.micro_batch_size = args.micro_batch
    c.log.tensorboard = False
    c.log.plot = False
    c.log.progress_bar = False
    c.checkpoint.async_save = False
    return config_lib.load_config(c)


def our_logits(model, rows: list[list[int]]):
    """Our model's float32 logits ``[R, T, V]`` on equal-length rows (one jitted forward)."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    ids = np.asarray(rows, np.int32)
    logits = nnx.jit(lambda m, x: m(x))(model, jnp.asarray(ids))
    return ids, np.asarray(logits, np.float32)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3_0_6b", choices=sorted(HF_PRESETS))
    ap.add_argument("--out", default="runs/real_shape_step", help="checkpoint, run dir, export and summary.json")
    ap.add_argument(
        "--tokenizer_dir",
        default=None,
        help=f"folder with the official {' and '.join(QWEN3_FILES)} (default: ${QWEN3_FILES_ENV}, "
        f"then .cache/qwen3-official, which `make qwen3-files` fills)",
    )
    ap.add_argument("--prompts", type=int, default=4, help="prompts in the step (data.prompts_per_step)")
    ap.add_argument("--group", type=int, default=2, help="rollouts per prompt (rl.n_rollouts)")
    ap.add_argument("--max_new_tokens", type=int, default=64, help="per generation, both roles")
    ap.add_argument("--max_steps", type=int, default=4, help="micro-steps per episode (rollout.max_steps)")
    ap.add_argument("--max_turns", type=int, default=2, help="assistant and user turns per episode")
    ap.add_argument("--micro_batch", type=int, default=1, help="rows per micro-batch of the update")
    ap.add_argument("--tasks", type=int, default=16, help="demo tasks written to the data file")
    ap.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="compute dtype (parameters stay float32)"
    )
    ap.add_argument(
        "--lr",
        type=float,
        default=None,
        help="optim.lr (default: the reference config's 1e-6). With random weights the gradient is "
        "zero, so only AdamW's decoupled weight decay (lr x 0.01) moves the weights: at 1e-6 "
        "that is below float32 resolution; 1e-4 changes them, so the export check compares "
        "weights the update wrote",
    )
    ap.add_argument("--remat", default=None, help="model.remat_policy (default: the reference config's)")
    ap.add_argument("--compare_rows", type=int, default=3)
    ap.add_argument("--compare_tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tokenizer_dir = find_tokenizer_dir(args.tokenizer_dir)

    out = os.path.abspath(args.out)
    ckpt, run_dir, export_dir = (os.path.join(out, d) for d in ("checkpoint", "run", "export"))
    for d in (ckpt, run_dir, export_dir):
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    table = PhaseTable()
    summary: dict[str, Any] = {"preset": args.preset, "args": vars(args), "tokenizer_dir": tokenizer_dir}
    print(
        f"real_shape_step: preset {args.preset}, {args.prompts} prompts x {args.group} rollouts, "
        f"{args.max_new_tokens} new tokens, out {out}",
        flush=True,
    )

    with table.measure("checkpoint (transformers, child process)") as row:
        child = in_child(build_checkpoint, HF_PRESETS[args.preset], tokenizer_dir, ckpt, args.seed)
        row.child_peak_gib = child["peak_gib"]
        row.note = f"{child['params'] / 1e6:.0f}M parameters, bfloat16 safetensors"
    summary["params"] = child["params"]

    with table.measure("data (demo tasks -> JSONL)"):
        from envace_jax.data.demo_tasks import generate_tasks
        from envace_jax.data.records import save_jsonl

        data_path = os.path.join(out, "train.jsonl")
        save_jsonl(generate_tasks(args.tasks, args.seed, "train"), data_path)

    import jax
    import numpy as np

    from envace_jax.models import hf_io
    from envace_jax.rl import train as rl_train

    with table.measure("build run (rl.train.build_run)"):
        cfg = run_config(args, ckpt, data_path, run_dir)
        with wrapped(hf_io, "load_hf", table, "hf_io.load_hf (bfloat16 file -> float32)"):
            run = rl_train.build_run(cfg)
    step = run.step_fn
    trainer = run.trainers["act"]
    client = step.engine.policy
    client.sampler.timed = True
    records = next(run.data)

    with contextlib.ExitStack() as stack:
        stack.enter_context(wrapped(step.engine, "judge", table, "judge (rule checklist)"))
        stack.enter_context(wrapped(trainer, "compute_logprobs", table, "old log-probs"))
        stack.enter_context(wrapped(trainer, "update", table, "GRPO update (forward + backward + AdamW)"))
        with table.measure("RL step (RLStep)") as step_row:
            with table.measure("rollouts (rehearsal mode)") as roll_row:
                episodes = step.rollout(records, 0)
            st = client.sampler.stats
            table.add("sampler prefill", st.prefill_s, 2, note=f"{st.prefill_tokens} tokens, {st.calls} calls")
            table.add("sampler decode", st.decode_s, 2, note=f"{st.generated_tokens} tokens, {st.decode_steps} steps")
            own_rollout = step.rollout
            step.rollout = lambda *_, done=episodes: done  # the rest of RLStep.__call__ on these episodes
            try:
                with table.measure("advantages, batch, old log-probs, update"):
                    result = step(records, 0)
            finally:
                step.rollout = own_rollout
    gens = [g for e in episodes for g in e.generations]
    roll_row.note = f"{len(episodes)} episodes, {len(gens)} rows"
    m = result.metrics
    step_row.note = (
        f"{result.rows} rows trained, width {m.get('update/seq_len', 0):.0f} tokens, "
        f"reward mean {m.get('act/reward_mean', 0):.3f}"
    )
    summary["metrics"] = m
    summary["rows"] = [
        {
            "role": g.role,
            "prompt_tokens": len(g.prompt_ids),
            "generated_tokens": len(g.gen_ids),
            "finish_reason": g.finish_reason,
            "score": g.score,
        }
        for g in gens
    ]

    with table.measure("export (hf_io.save_hf + tokenizer files)"):
        hf_io.save_hf(trainer.model, export_dir)
        for name in os.listdir(cfg.tokenizer.path):
            if name.startswith(TOKENIZER_PREFIXES):
                shutil.copy(os.path.join(cfg.tokenizer.path, name), os.path.join(export_dir, name))

    # Parity rows: the last compare_tokens tokens of a few ACT rows (prompt + sampled reply).
    act = [g for g in gens if g.role == "act"]
    if not act:
        raise RuntimeError("the rollouts produced no ACT rows to compare logits on")
    rows = [list(g.prompt_ids) + list(g.gen_ids) for g in act[: args.compare_rows]]
    width = min(args.compare_tokens, *(len(r) for r in rows))
    ours_npz = os.path.join(out, "our_logits.npz")
    with table.measure("our logits after the update (JAX)"):
        ids, logits = our_logits(trainer.model, [r[-width:] for r in rows])
        np.savez(ours_npz, ids=ids, logits=logits)
    first = act[0]
    record = next(r for r in records if str(r["uid"]) == first.uid)
    first_prompt = list(first.prompt_ids)
    enable_thinking = cfg.tokenizer.enable_thinking
    del run, step, trainer, client, logits, episodes, gens, act, result
    jax.clear_caches()

    with table.measure("transformers loads the export (child process)") as row:
        parity = in_child(
            transformers_parity,
            export_dir,
            tokenizer_dir,
            ours_npz,
            {"messages": record["messages"], "tools": record["tools"]},
            first_prompt,
            enable_thinking,
            ckpt,
        )
        row.child_peak_gib = parity["peak_gib"]
        row.note = f"{ids.shape[0]} rows x {ids.shape[1]} tokens: max abs logit diff {parity['max_abs_diff']:.2e}"
    os.remove(ours_npz)
    summary["parity"] = parity
    summary["phases"] = [dataclasses.asdict(r) for r in table.rows]
    summary["ru_maxrss_gib"] = ru_maxrss_gib()
    summary["own_peak_gib"] = own_peak_gib()
    summary["child_peak_gib"] = max(r.child_peak_gib for r in table.rows if r.child_peak_gib is not None)
    table.watch.close()

    print()
    for r in table.rows:
        peak = "" if r.peak_gib is None else f"  peak {r.peak_gib:6.2f} GiB"
        peak += "" if r.child_peak_gib is None else f" (child process {r.child_peak_gib:.2f} GiB)"
        print(f"{'  ' * r.depth}{r.name:<{56 - 2 * r.depth}} {r.seconds:8.1f} s{peak}  {r.note}")
    print(
        f"\npeak host memory: this process {summary['ru_maxrss_gib']:.2f} GiB (resource.getrusage ru_maxrss; "
        f"VmHWM {summary['own_peak_gib']:.2f} GiB: ru_maxrss also counts a larger parent's peak), "
        f"largest child process {summary['child_peak_gib']:.2f} GiB (its VmHWM)"
    )
    print(
        f"exported folder: {parity['architecture']} in transformers; logits vs our updated model on "
        f"{ids.shape[0]} rows x {ids.shape[1]} tokens: max abs diff {parity['max_abs_diff']:.3e} "
        f"(largest |logit| {parity['logit_scale']:.2f}); official chat template kept: {parity['official_template']}; "
        f"first prompt re-rendered by transformers equals the sampled prompt ids: {parity['prompt_ids_match']}"
    )
    print(
        f"the update moved the weights (export vs bfloat16 checkpoint) by at most {parity['max_abs_change']:.3e}, "
        f"{100 * parity['changed_frac']:.2f}% of values changed; "
        f"grad norm {m.get('update/grad_norm', float('nan')):.3e}, "
        f"advantages nonzero on {100 * m.get('adv/act/nonzero_frac', 0):.0f}% of ACT rows"
    )
    print("\n" + table.markdown(), flush=True)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
