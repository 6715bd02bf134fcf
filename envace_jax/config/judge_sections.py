"""The judge's sections of a run's config: ``judge`` (which kind), ``judge.http`` (an OpenAI-compatible endpoint)
and ``judge.local`` (a judge model run in-process). Re-exported by ``envace_jax.config``."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from envace_jax.config.choices import DTYPES, ROLLOUT_ENGINES
from envace_jax.config.engine_sections import VllmSettings
from envace_jax.config.rules import _NONNEG, _POS, _PROB, Checked, Rule, check_rules, one_of

# judge.kind: rules alone, an HTTP endpoint, a local model, or rules first with a model for items without a rule
JUDGE_KINDS = ("rule", "http", "local", "rule_then_http", "rule_then_local")


@dataclasses.dataclass(frozen=True)
class HttpJudgeConfig(Checked):
    """An OpenAI-compatible judge endpoint. Defaults are the reference's (spec section 4.1)."""

    LABEL: ClassVar[str] = "judge.http"
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("base_url", lambda v: v.startswith(("http://", "https://")), "an http:// or https:// URL"),
        ("max_attempts", _POS, ">= 1"),
        ("max_concurrency", _POS, ">= 1"),
        ("max_tokens", _POS, ">= 1"),
        ("timeout_s", _NONNEG, ">= 0"),
        ("backoff_base_s", _NONNEG, ">= 0"),
        ("backoff_max_s", _NONNEG, ">= 0"),
    )

    base_url: str = "http://127.0.0.1:8000"
    model: str = "Qwen/Qwen3-30B-A3B"
    temperature: float = 0.6
    top_p: float = 0.8
    max_tokens: int = 6000
    max_attempts: int = 5  # total attempts per verdict, first one included
    backoff_base_s: float = 1.0  # sleep after the a-th failure (a from 0): min(base*2^a, max)
    backoff_max_s: float = 30.0
    timeout_s: float = 300.0  # per HTTP attempt, applied to connect and to each socket read
    max_concurrency: int = 32  # HTTP requests in flight at once, across all callers
    api_key_env: str | None = None  # name of an env var holding a bearer token
    use_response_format: bool = True  # send the strict json_schema (servers without it: False)

    def validate(self) -> None:
        """The construction-time checks again (kept for callers that validate explicitly)."""
        check_rules(self, self.LABEL, self.RULES)


@dataclasses.dataclass(frozen=True)
class LocalJudgeConfig(Checked):
    """A checklist judge model run in-process by our sampler (``rl.local_judge``), e.g. the reference's own judge
    Qwen3-30B-A3B (a Qwen3-MoE) or any dense Qwen3. Sampling defaults are the reference's HTTP judge's."""

    LABEL: ClassVar[str] = "judge.local"
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("dtype", *one_of(DTYPES)),
        ("temperature", _NONNEG, ">= 0"),
        ("top_p", _PROB, "in (0, 1]"),
        ("max_tokens", _POS, ">= 1"),
        ("max_attempts", _POS, ">= 1"),
        ("max_model_len", _POS, ">= 1"),
        ("engine", *one_of(ROLLOUT_ENGINES)),
    )

    hf_path: str = ""  # a local Hugging Face checkpoint directory (config.json names qwen3 or qwen3_moe)
    tokenizer_path: str = ""  # default: hf_path
    dtype: str = "bfloat16"
    temperature: float = 0.6
    top_p: float = 0.8
    max_tokens: int = 6000
    max_attempts: int = 5  # generations per verdict, first one included (a malformed answer is asked again)
    enable_thinking: bool = True
    max_model_len: int = 16384  # prompt + answer tokens a judge call may hold
    seed: int = 0
    # what generates the verdicts: "native" (our Sampler) or "vllm" (a vLLM engine in a process of its own, loaded
    # with the judge's weights once; rl/vllm_engine.py, docs/vllm.md)
    engine: str = "native"
    vllm: VllmSettings = VllmSettings()


@dataclasses.dataclass(frozen=True)
class JudgeSection(Checked):
    LABEL: ClassVar[str] = "judge"
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("kind", *one_of(JUDGE_KINDS)),
        ("outage_share", lambda v: 0 <= v <= 1, "in [0, 1]"),
        ("outage_steps", _POS, "> 0"),
    )

    # rule | http | local | rule_then_http / rule_then_local (rules first, the model for items without one)
    kind: str = "rule"
    http: HttpJudgeConfig = dataclasses.field(default_factory=HttpJudgeConfig)
    local: LocalJudgeConfig = dataclasses.field(default_factory=LocalJudgeConfig)
    # The run stops (rl.judge_outage.JudgeOutageError) once more than ``outage_share`` of a step's episodes
    # ended without a verdict (termination ``judge_api_failure``) on ``outage_steps`` consecutive steps: an
    # unreachable judge must not pass for a policy that scores 0. 1.0 never stops.
    outage_share: float = 0.5
    outage_steps: int = 2
