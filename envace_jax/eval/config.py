"""Every knob of an evaluation run, in one place: frozen dataclasses in the shape of ``configs/eval_*.py``.

``launch/eval.py`` reads a config file into a ``ConfigDict``; ``load_eval_config`` turns it into an
``EvalConfig`` through the same converter as training configs (``envace_jax.config.load_section``): every
field is type- and range-checked and an unknown field is an error naming it. The defaults here are the
only defaults: every ``configs/eval_*.py`` starts from ``eval_config_dict``. List-valued fields may be written as
comma-separated strings, so they override cleanly from the command line
(``--config.bfcl.categories=multi_turn_base,simple_python``).

Plain Python (no jax): the harnesses import their sections from here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from envace_jax.config import ROLLOUT_ENGINES, RoleSampling, VllmSettings, load_section
from envace_jax.envs import bfcl, tau2
from envace_jax.model_sizes import TINY

SUITES = ("bfcl", "tau2", "demo", "rehearsal_sweep", "fidelity")
POLICIES = ("oracle", "model", "http")
HTTP_SUITES = ("bfcl", "tau2")  # the suites whose agent a served model can be
TOKENIZER_CORPORA = ("demo", "demo+bfcl")
PRE_SPLITS = ("qwen", "lines")
TAU2_USERS = ("scripted", "model")
REHEARSAL_MODES = ("parallel", "sequential")
# What answers a rehearsal's tool calls: REHEARSE ("imagined", EnvACE), or a private copy of the real environment
# ("real", an upper bound: what a memory is worth when the rehearsal sees no imagination error)
REHEARSAL_WORLDS = ("imagined", "real")
DEMO_SWEEP_NS = (0, 1, 2, 4)  # suite rehearsal_sweep's grid when rehearsal.sweep_ns is empty
MEMORY_KINDS = ("template", "model")
PLACEMENTS = ("system", "note")
# When the committed run gets the memory: "always" (EnvACE); "on_mistake": only when a rehearsal wrote a
# call the tool schema rejects or a malformed call; "on_error": only when a rehearsal met any failure, an
# imagined error or refusal included; "on_tools": only when a rehearsal called one of ``memory_tools`` (eval.rehearsal
# explains why).
MEMORY_GATES = ("always", "on_mistake", "on_error", "on_tools")


def check_memory_tools(place_memory: str, memory_tools: tuple[str, ...], gate_field: str, tools_field: str) -> None:
    """``memory_tools`` names the tools of ``place_memory="on_tools"``, and only of it (the field names are those
    of the caller's config, so the error names what the user wrote)."""
    if (place_memory == "on_tools") != bool(memory_tools):
        raise ValueError(
            f"{tools_field} names the tools of {gate_field}='on_tools', and only of it: got "
            f"{gate_field}={place_memory!r}, {tools_field}={memory_tools!r}"
        )


def _at_least(cfg: Any, section: str, names: tuple[str, ...], low: int) -> None:
    for name in names:
        v = getattr(cfg, name)
        if not isinstance(v, int) or v < low:
            raise ValueError(f"config.{section}.{name} must be an int >= {low}, got {v!r}")


@dataclasses.dataclass(frozen=True)
class TinySpec:
    """``model.random_tiny``: a random Qwen3 of these sizes and the offline demo tokenizer."""

    hidden: int = TINY.hidden_size  # model_sizes.TINY (the MLP width is Qwen3Config.tiny's, 2 * hidden)
    layers: int = TINY.num_layers
    heads: int = TINY.num_heads
    kv_heads: int = TINY.num_kv_heads
    head_dim: int = TINY.head_dim
    vocab_size: int = 480
    # "demo+bfcl" also trains the demo tokenizer on BFCL's multi-turn tool schemas and questions.
    # BFCL prompts (~17k characters, ~30 tool schemas) are ~10k tokens with the "demo" corpus and
    # ~4k with "demo+bfcl" (the floor of Qwen3's word-level pre-split); with pre_split="lines" and a
    # large vocabulary, merges span words and a prompt shrinks to a few hundred tokens.
    tokenizer_corpus: str = "demo"
    pre_split: str = "qwen"
    max_token_chars: int = 0  # 0 = unlimited

    def __post_init__(self):
        _at_least(self, "model.tiny", ("hidden", "layers", "heads", "kv_heads", "head_dim"), 1)
        _at_least(self, "model.tiny", ("max_token_chars",), 0)
        if self.tokenizer_corpus not in TOKENIZER_CORPORA:
            raise ValueError(
                f"config.model.tiny.tokenizer_corpus={self.tokenizer_corpus!r}; choose one of {TOKENIZER_CORPORA}"
            )
        if self.pre_split not in PRE_SPLITS:
            raise ValueError(f"config.model.tiny.pre_split={self.pre_split!r}; choose one of {PRE_SPLITS}")


# The smallest random Qwen3 that plays BFCL (configs/eval_bfcl_tiny.py, the served-parity check). BFCL prompts are
# ~17k characters (~30 tool schemas): 7k-11k tokens with the demo tokenizer, ~4k with Qwen3's word-level
# pre-split even when trained on BFCL. A line-level BPE trained on the schemas and questions (tokens up to 64
# characters) brings them to ~300-800 tokens (mean ~540), so prefill no longer dominates a run. The model is as
# small as Qwen3's shape allows.
BFCL_TINY = TinySpec(
    hidden=32,
    layers=1,
    heads=2,
    kv_heads=1,
    head_dim=8,
    vocab_size=8192,
    tokenizer_corpus="demo+bfcl",
    pre_split="lines",
    max_token_chars=64,
)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Which policy to load: a local HF checkpoint (``model_path``), or ``random_tiny`` (CI)."""

    model_path: str = ""  # local Qwen3 HF checkpoint directory (policy=model)
    tokenizer_path: str = ""  # default: model_path (random_tiny: a demo tokenizer built into output_dir)
    random_tiny: bool = False
    dtype: str = "float32"
    tiny: TinySpec = TinySpec()
    # what generates the policy's turns: "native" (our Sampler) or "vllm" (the vLLM rollout engine, rl/vllm_engine.py,
    # in a process of its own: `make vllm-deps`; docs/vllm.md); its settings in ``vllm``
    engine: str = "native"
    vllm: VllmSettings = VllmSettings()

    def __post_init__(self):
        if self.engine not in ROLLOUT_ENGINES:
            raise ValueError(f"config.model.engine={self.engine!r}; choose one of {ROLLOUT_ENGINES}")


@dataclasses.dataclass(frozen=True)
class HttpPolicySpec:
    """``policy=http``: a model behind an OpenAI-compatible chat-completions endpoint (``launch/serve.py``, vLLM,
    SGLang). Each turn sends the conversation's messages and tools; the reply's content and tool calls are turned
    back into Qwen3 text, which the suite parses as it parses an in-process model's."""

    base_url: str = ""  # e.g. http://127.0.0.1:8000 (``/v1/chat/completions`` is appended)
    model: str = ""  # the served model name
    api_key_env: str = ""  # environment variable holding the API key; empty: no key is sent
    timeout_s: float = 600.0
    max_concurrency: int = 16  # requests in flight
    max_attempts: int = 3  # tries of a request that got no answer or a 5xx
    # the served model's tokenizer (a local folder): test-time rehearsal renders its token-level prompts with it and
    # sends them to /v1/completions (eval.http_policy_client); evaluation without rehearsal does not need it
    tokenizer_path: str = ""


@dataclasses.dataclass(frozen=True)
class SamplerShapes:
    """Shape buckets for the eval sampler (``Sampler`` keywords; empty = the sampler's defaults).

    Each new (batch, chunk length, cache window) bucket compiles a prefill and a decode program,
    seconds each on CPU. A run whose every call fits one batch and one window (set ``window_buckets`` to
    ``max_model_len + max_chunk``, the most the sampler allocates) compiles a handful of programs.
    """

    batch_buckets: tuple[int, ...] = ()
    length_buckets: tuple[int, ...] = ()
    window_buckets: tuple[int, ...] = ()
    max_chunk: int = 512

    def __post_init__(self):
        for name in ("batch_buckets", "length_buckets", "window_buckets"):
            if any(int(b) < 1 for b in getattr(self, name)):
                raise ValueError(f"config.sampler.{name} must be positive, got {getattr(self, name)}")
        if self.max_chunk < 1:
            raise ValueError(f"config.sampler.max_chunk must be >= 1, got {self.max_chunk}")


@dataclasses.dataclass(frozen=True)
class RehearsalConfig:
    n: int = 0  # imagined episodes per task (0: act directly)
    mode: str = "parallel"
    max_tokens_per_rehearsal: int = 2048
    memory: str = "template"
    max_memory_chars: int = 1500
    placement: str = "system"
    place_memory: str = "always"  # or "on_mistake", "on_error", "on_tools" (MEMORY_GATES)
    grounding: str = "none"  # "reference" keeps the few-shot logged results (privileged)
    user_turns: str = "first"  # "all" rehearses every scripted user turn
    summary: RoleSampling = RoleSampling(temperature=0.0, max_new_tokens=256)
    # sampling temperature of the imagined episodes (both roles); None: the committed run's. With a greedy
    # committed run, N > 1 parallel rehearsals at temperature None are N copies of one episode.
    temperature: float | None = None
    seed: int = 0  # an eval run sets it to the run's ``seed``
    # tools that change nothing, whose calls a rehearsal runs against its own copy of the real environment
    # until it first calls another tool (eval.rehearsal, "Real reads"); empty: purely imagined
    real_reads: tuple[str, ...] = ()
    # place_memory="on_tools": the memory is placed only when a rehearsal called one of these tools (those whose
    # effect cannot be undone and does not hang on a number REHEARSE must guess, e.g. closing an account)
    memory_tools: tuple[str, ...] = ()
    rehearser: str = "imagined"  # or "real" (REHEARSAL_WORLDS)

    def __post_init__(self):
        for name in ("real_reads", "memory_tools"):
            tools = getattr(self, name)
            if isinstance(tools, str) or not all(isinstance(t, str) and t for t in tools):
                raise ValueError(f"rehearsal.{name} must be a tuple of tool names, got {tools!r}")
            object.__setattr__(self, name, tuple(tools))
        check_memory_tools(self.place_memory, self.memory_tools, "place_memory", "rehearsal.memory_tools")
        choices = {
            "mode": REHEARSAL_MODES,
            "memory": MEMORY_KINDS,
            "placement": PLACEMENTS,
            "place_memory": MEMORY_GATES,
            "grounding": ("none", "reference"),
            "user_turns": ("first", "all"),
            "rehearser": REHEARSAL_WORLDS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"rehearsal.{name}={getattr(self, name)!r}; choose one of {allowed}")
        if self.temperature is not None and not (isinstance(self.temperature, (int, float)) and self.temperature >= 0):
            raise ValueError(f"rehearsal.temperature must be None or >= 0, got {self.temperature!r}")
        for name in ("n", "max_tokens_per_rehearsal", "max_memory_chars"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < (0 if name == "n" else 1):
                raise ValueError(f"rehearsal.{name} must be an int >= {0 if name == 'n' else 1}, got {v!r}")


@dataclasses.dataclass(frozen=True)
class RehearsalSection(RehearsalConfig):
    """Test-time rehearsal of the demo, BFCL and tau2 suites, and the grid of a sweep over N.

    ``sweep_ns`` empty: suites ``demo``, ``bfcl`` and ``tau2`` run the one setting above (``n``, ``mode``,
    ``rehearser``); suite ``rehearsal_sweep`` sweeps ``DEMO_SWEEP_NS``. Given (``--config.rehearsal.sweep_ns=0,1,2``):
    ``bfcl`` and ``tau2`` sweep N x ``sweep_modes`` x ``sweep_rehearsers`` (``eval.benchmark_rehearsal``), and
    ``rehearsal_sweep`` sweeps N x ``sweep_modes`` on the demo."""

    sweep_ns: tuple[int, ...] = ()
    sweep_modes: tuple[str, ...] = REHEARSAL_MODES
    sweep_rehearsers: tuple[str, ...] = ()  # empty: ``rehearser`` alone

    def __post_init__(self):
        super().__post_init__()
        if any(not isinstance(n, int) or n < 0 for n in self.sweep_ns) or len(set(self.sweep_ns)) < len(self.sweep_ns):
            raise ValueError(f"config.rehearsal.sweep_ns must be distinct ints >= 0, got {self.sweep_ns}")
        if not self.sweep_modes or any(m not in REHEARSAL_MODES for m in self.sweep_modes):
            raise ValueError(f"config.rehearsal.sweep_modes must be some of {REHEARSAL_MODES}, got {self.sweep_modes}")
        if any(r not in REHEARSAL_WORLDS for r in self.sweep_rehearsers):
            raise ValueError(
                f"config.rehearsal.sweep_rehearsers must be some of {REHEARSAL_WORLDS}, got {self.sweep_rehearsers}"
            )

    @property
    def rehearses(self) -> bool:
        """Does a bfcl or tau2 run rehearse (a sweep, or one setting with N > 0)?"""
        return bool(self.sweep_ns) or self.n > 0

    def rehearsal(self) -> RehearsalConfig:
        """The settings of one rehearsal run (without the sweep grid)."""
        names = [f.name for f in dataclasses.fields(RehearsalConfig)]
        return RehearsalConfig(**{k: getattr(self, k) for k in names})


@dataclasses.dataclass(frozen=True)
class BfclConfig:
    categories: tuple[str, ...] = ("multi_turn_base",)
    limit: int = 0  # entries per category (0 = all)
    max_steps_per_turn: int = 20  # BFCL's MAXIMUM_STEP_LIMIT
    batch_size: int = 16  # entries played at once

    def __post_init__(self):
        if not self.categories:
            raise ValueError("config.bfcl.categories is empty")
        for c in self.categories:
            if c not in bfcl.MULTI_TURN_CATEGORIES + bfcl.SINGLE_TURN_CATEGORIES:
                raise ValueError(
                    f"config.bfcl.categories: unsupported category {c!r}; expected some of "
                    f"{bfcl.MULTI_TURN_CATEGORIES + bfcl.SINGLE_TURN_CATEGORIES}"
                )
        _at_least(self, "bfcl", ("max_steps_per_turn", "batch_size"), 1)
        _at_least(self, "bfcl", ("limit",), 0)


@dataclasses.dataclass(frozen=True)
class Tau2Config:
    domains: tuple[str, ...] = tau2.DOMAINS
    split: str = "test"
    limit: int = 0  # tasks per domain (0 = all)
    user: str = "scripted"  # scripted (offline, CI) | model
    user_model_path: str = ""  # user=model: the user's checkpoint (empty: the policy's weights)
    max_steps: int = 30  # agent + user messages before the run is cut (tau2: max_steps)
    batch_size: int = 8

    def __post_init__(self):
        if not self.domains:
            raise ValueError("config.tau2.domains is empty")
        for d in self.domains:
            if d not in tau2.DOMAINS:
                raise ValueError(f"config.tau2.domains: unknown domain {d!r}; expected some of {tau2.DOMAINS}")
        if self.user not in TAU2_USERS:
            raise ValueError(f"config.tau2.user={self.user!r}; choose one of {TAU2_USERS}")
        if self.split not in ("train", "test", "base"):
            raise ValueError(f"config.tau2.split={self.split!r}; choose train, test or base")
        _at_least(self, "tau2", ("max_steps", "batch_size"), 1)
        _at_least(self, "tau2", ("limit",), 0)


@dataclasses.dataclass(frozen=True)
class DemoSuiteConfig:
    """The demo task suite: which tasks, and the real-tool episode's caps."""

    num_tasks: int = 40
    seed: int = 0
    split: str = "test"
    max_steps: int = 24
    max_assistant_turns: int = 8
    max_user_turns: int = 4

    def __post_init__(self):
        _at_least(self, "demo", ("num_tasks", "max_steps", "max_assistant_turns", "max_user_turns"), 1)
        if self.split not in ("train", "validation", "test"):
            raise ValueError(f"config.demo.split={self.split!r}; choose train, validation or test")


REHEARSERS = ("oracle", "constant", "model")


@dataclasses.dataclass(frozen=True)
class FidelityBenchConfig:
    """Suite ``fidelity`` (``eval.fidelity_bench``): REHEARSE on the benchmarks' logged calls."""

    bfcl_categories: tuple[str, ...] = ("multi_turn_base",)  # multi-turn categories (empty: none)
    tau2_domains: tuple[str, ...] = ("airline", "retail", "telecom")
    tau2_split: str = "test"
    demo_tasks: int = 0  # demo reference conversations (0: none)
    demo_split: str = "test"
    limit: int = 0  # entries / tasks per BFCL category and tau2 domain (0 = all)
    with_reference: bool = False  # put the replay into the record's reference_messages (an upper bound)
    rehearser: str = "oracle"  # oracle | constant | model
    batch_size: int = 16  # REHEARSE prompts per generate call (model)
    seed: int = 0  # an eval run sets it to the run's ``seed``

    def __post_init__(self):
        if self.rehearser not in REHEARSERS:
            raise ValueError(f"config.fidelity.rehearser={self.rehearser!r}; choose one of {REHEARSERS}")
        for c in self.bfcl_categories:
            if c not in bfcl.MULTI_TURN_CATEGORIES:
                raise ValueError(
                    f"config.fidelity.bfcl_categories: {c!r} has no logged multi-turn replay; "
                    f"expected some of {bfcl.MULTI_TURN_CATEGORIES}"
                )
        for d in self.tau2_domains:
            if d not in tau2.DOMAINS:
                raise ValueError(f"config.fidelity.tau2_domains: unknown domain {d!r}; expected some of {tau2.DOMAINS}")
        for name in ("limit", "demo_tasks"):
            if getattr(self, name) < 0:
                raise ValueError(f"config.fidelity.{name} must be >= 0, got {getattr(self, name)}")
        if self.batch_size < 1:
            raise ValueError(f"config.fidelity.batch_size must be >= 1, got {self.batch_size}")
        if not (self.bfcl_categories or self.tau2_domains or self.demo_tasks):
            raise ValueError("config.fidelity names no BFCL category, no tau2 domain and no demo task")

    @classmethod
    def from_mapping(cls, section: Any, seed: int = 0) -> "FidelityBenchConfig":
        """From the config's ``fidelity`` section (a dict or ConfigDict); unknown keys are an error."""
        return dataclasses.replace(load_section(cls, section or {}, "config.fidelity"), seed=seed)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    suite: str = "bfcl"  # bfcl | tau2 | demo | rehearsal_sweep
    policy: str = "oracle"  # oracle (replays ground truth) | model | http (a served model)
    output_dir: str = ""  # results.json, results.md, <category>.jsonl go here
    seed: int = 0
    write_entries: bool = True  # per-entry <category>.jsonl files
    model: ModelSpec = ModelSpec()
    http: HttpPolicySpec = HttpPolicySpec()  # policy=http
    sampling: RoleSampling = RoleSampling(temperature=0.0, max_new_tokens=1024)  # greedy
    sampler: SamplerShapes = SamplerShapes()
    max_model_len: int = 32768  # prompt + generated tokens per conversation
    enable_thinking: bool = True
    rehearsal: RehearsalSection = RehearsalSection()
    bfcl: BfclConfig = BfclConfig()
    tau2: Tau2Config = Tau2Config()
    demo: DemoSuiteConfig = DemoSuiteConfig()
    fidelity: FidelityBenchConfig = FidelityBenchConfig()

    def __post_init__(self):
        if self.suite not in SUITES:
            raise ValueError(f"config.suite={self.suite!r}; choose one of {SUITES}")
        if self.policy not in POLICIES:
            raise ValueError(f"config.policy={self.policy!r}; choose one of {POLICIES}")
        if self.policy == "http":
            if self.suite not in HTTP_SUITES:
                raise ValueError(f"config.policy='http' evaluates the suites {HTTP_SUITES}, not {self.suite!r}")
            if not self.http.base_url or not self.http.model:
                raise ValueError("config.policy='http' needs config.http.base_url and config.http.model")
            if self.http.timeout_s <= 0 or self.http.max_concurrency < 1 or self.http.max_attempts < 1:
                raise ValueError("config.http: timeout_s must be > 0, max_concurrency and max_attempts >= 1")
        if self.suite in ("bfcl", "tau2") and self.rehearsal.rehearses:
            if self.policy == "oracle":
                raise ValueError(
                    f"config.rehearsal (n={self.rehearsal.n}, sweep_ns={self.rehearsal.sweep_ns}) rehearses with a "
                    "model: it needs config.policy='model' or 'http', not 'oracle' (set rehearsal.n=0 and sweep_ns='' "
                    "to replay the ground truth)"
                )
            if self.policy == "http" and not self.http.tokenizer_path:
                raise ValueError(
                    "config.policy='http' with rehearsal needs config.http.tokenizer_path, the served model's "
                    "tokenizer folder: rehearsal renders its prompts as token ids for the server's /v1/completions"
                )
            if self.suite == "bfcl":
                single = [c for c in self.bfcl.categories if c not in bfcl.MULTI_TURN_CATEGORIES]
                if single:
                    raise ValueError(
                        f"config.bfcl.categories: rehearsal runs on BFCL's multi-turn categories; {single} are "
                        "single-turn (evaluate them in a run without rehearsal)"
                    )
        if self.max_model_len <= self.sampling.max_new_tokens:
            raise ValueError(
                f"config.max_model_len={self.max_model_len} must exceed "
                f"config.sampling.max_new_tokens={self.sampling.max_new_tokens}"
            )


def eval_config_dict(suite: str):
    """A ConfigDict of every eval field at its default (list fields as comma-separated strings, so that
    ``--config.bfcl.categories=a,b`` overrides them); every ``configs/eval_*.py`` starts from it."""
    from envace_jax.config import to_config_dict

    d = to_config_dict(EvalConfig(suite=suite))
    for section in ("rehearsal", "fidelity"):  # these seeds follow the run's ``seed``: not knobs of their own
        del d[section]["seed"]
    return d


def load_eval_config(cfg: Any) -> EvalConfig:
    """A ConfigDict / dict (configs/eval_*.py, or a partial dict in code) -> validated ``EvalConfig``."""
    return load_section(EvalConfig, cfg, "config")
