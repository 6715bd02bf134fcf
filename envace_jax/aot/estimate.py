"""An estimate of one RL step's seconds from the compiled programs' rooflines (a ``report.Report``,
as ``launch/aot_compile.py --estimate`` prints it).

The rooflines are lower bounds per program call (max of flops over peak and bytes over HBM bandwidth
per chip), so the step estimated here is what the programs would take at 100% of the chip's peak or
bandwidth; real runs land above it. What a step does is an assumption about the workload, stated
in ``StepAssumptions`` and printed with the result:

- **rollout**, every host in parallel on its own prompts: ``generations`` sampler calls per episode
  (an episode's turns follow each other), each writing ``prompt_tokens`` new tokens per row (prefill,
  in calls of the compiled chunk) and decoding ``generated_tokens`` steps;
- **old log-probs and update**, over the whole slice: one training row per generation (spec: one row
  per caller turn and per simulated tool call), ``row_tokens`` tokens each, in micro-batches of the
  compiled ``train_step`` rows. The compiled programs are at the config's maximum row width; a row of
  ``row_tokens`` is charged ``row_tokens / width`` of a row (linear in length: attention's quadratic
  part makes this an under-estimate for long rows, and padding to the widest row of a micro-batch
  an under-estimate too).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping


@dataclasses.dataclass(frozen=True)
class StepAssumptions:
    prompts: int = 16  # the reference's train_batch_size
    rollouts: int = 4  # n
    generations: int = 10  # per episode: ACT turns plus simulated tool calls
    generated_tokens: int = 800  # per generation (thinking on)
    prompt_tokens: int = 1500  # new tokens per generation call (tool response, next prompt)
    row_tokens: int = 8000  # mean training row (prompt so far + generation)

    def describe(self) -> str:
        return (
            f"{self.prompts} prompts x {self.rollouts} rollouts, {self.generations} generations per episode "
            f"of {self.generated_tokens} generated tokens after {self.prompt_tokens} new prompt tokens each; "
            f"{self.prompts * self.rollouts * self.generations} training rows of {self.row_tokens} tokens"
        )


def estimate_step(report, a: StepAssumptions = StepAssumptions()) -> dict[str, float]:
    """Seconds per phase of one RL step from a ``report.Report`` (its programs' rooflines and the
    run's sizes)."""
    progs = {p.name: p for p in report.programs}
    missing = {"train_step", "logprobs", "prefill", "decode"} - set(progs)
    if missing:
        raise ValueError(f"the report lacks {sorted(missing)}: compile every program (no --programs filter)")
    not_fit = [n for n, p in progs.items() if not p.fits]
    if not_fit:
        raise ValueError(f"{not_fit} do not fit on {report.topology}: no step estimate for this layout")
    s = report.shapes
    episodes = a.prompts * a.rollouts
    if episodes % s.processes:
        raise ValueError(f"{episodes} episodes do not split over {s.processes} hosts")
    rows_per_call = s.rows_per_episode * episodes // s.processes  # requests (plus parked ACT rows)
    if rows_per_call > s.sample_batch:
        raise ValueError(f"{rows_per_call} sampler rows per host exceed the compiled batch {s.sample_batch}")
    dec = progs["decode"]
    per_step = (dec.roofline_s - dec.setup_s) / dec.steps
    decode = a.generations * (dec.setup_s + a.generated_tokens * per_step)
    prefill = a.generations * math.ceil(a.prompt_tokens / s.prefill_chunk) * progs["prefill"].roofline_s
    micro_batches = episodes * a.generations * a.row_tokens / (s.train_rows * s.train_width)
    logprobs = micro_batches * progs["logprobs"].roofline_s
    update = micro_batches * progs["train_step"].roofline_s
    return {
        "decode": decode,
        "prefill": prefill,
        "old_logprobs": logprobs,
        "update": update,
        "total": decode + prefill + logprobs + update,
    }


def format_estimate(est: Mapping[str, float], a: StepAssumptions, topology: str) -> str:
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in est.items() if k != "total")
    return (
        f"estimated RL step on {topology} at the rooflines (a lower bound): {est['total']:.0f} s "
        f"({est['total'] / 60:.1f} min) = {parts}\n  assuming {a.describe()}"
    )
