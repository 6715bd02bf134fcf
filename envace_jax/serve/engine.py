"""Batching concurrent requests (chat, and completions of a prompt given as is) into our sampler: one worker
thread owns the ``Sampler``; requests queue up while it samples and the next call takes as many whole requests as
fit ``max_rows`` rows (each of a request's ``n`` choices is a row), each row with its own sampling settings.

Seeds: choice ``c`` of a request with ``seed`` draws exactly what row ``c`` of a call holding that request alone
draws, wherever the batch puts it (``sampling.plan.seed_at_row``), so a seeded request repeats under any load.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from concurrent.futures import Future

import numpy as np

from envace_jax.serve.completions import CompletionRequest
from envace_jax.serve.protocol import ChatRequest, RequestError


@dataclasses.dataclass
class Choice:
    text: str
    reason: str  # the sampler's: "stop" (an end token), "length", or "stop_string"
    tokens: int
    ids: list[int] = dataclasses.field(default_factory=list)  # the sampled ids (a stop token included)


@dataclasses.dataclass
class Job:
    request: ChatRequest | CompletionRequest
    prompt: list[int]
    future: Future = dataclasses.field(default_factory=Future)


@dataclasses.dataclass
class EngineStats:
    requests: int = 0
    calls: int = 0
    rows: int = 0
    max_rows_in_a_call: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ServeEngine:
    """``submit(request) -> Future[(prompt token count, [Choice, ...])]`` over ``sampler`` and ``renderer`` (see
    the module docstring). ``max_model_len``: prompt plus completion tokens per row (the sampler's cache);
    ``batch_wait_s``: how long the worker waits for more requests after the first of an idle spell."""

    def __init__(
        self, sampler, renderer, *, max_model_len: int, max_rows: int = 32, batch_wait_s: float = 0.01, seed: int = 0
    ):
        if max_rows < 1:
            raise ValueError(f"serve: max_rows={max_rows} must be >= 1")
        self.sampler, self.renderer = sampler, renderer
        self.max_model_len, self.max_rows, self.batch_wait_s = max_model_len, max_rows, batch_wait_s
        self.stats = EngineStats()
        self._seeds = np.random.default_rng(seed)
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._held: Job | None = None  # a request that did not fit the last call: first in the next
        self._thread = threading.Thread(target=self._run, name="serve-engine", daemon=True)
        self._thread.start()

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary: the token ids a completions prompt may hold."""
        cfg = getattr(self.sampler, "cfg", None)
        return int(cfg.vocab_size) if cfg is not None else len(self.renderer.tokenizer)

    # ------------------------------------------------------------------ requests
    def render(self, request: ChatRequest) -> list[int]:
        kwargs = {} if request.enable_thinking is None else {"enable_thinking": request.enable_thinking}
        try:
            ids = self.renderer.render_messages(request.messages, request.tools, add_generation_prompt=True, **kwargs)
        except Exception as e:  # the chat template's own complaint (a role order it refuses, ...)
            raise RequestError(400, f"the chat template could not render these messages: {e}", "messages") from None
        return self._checked(ids, request, "messages")

    def prompt_of(self, request: CompletionRequest) -> list[int]:
        """A completions request's prompt: its token ids, or its text encoded with no template."""
        ids = list(request.prompt_ids) if request.prompt_ids is not None else self.renderer.encode(request.prompt_text)
        return self._checked(ids, request, "prompt")

    def _checked(self, ids: list[int], request, where: str) -> list[int]:
        if len(ids) >= self.max_model_len:
            raise RequestError(
                400,
                f"the prompt is {len(ids)} tokens; this server's max_model_len is {self.max_model_len} "
                "(prompt and completion together)",
                where,
            )
        if request.max_tokens is not None and len(ids) + request.max_tokens > self.max_model_len:
            raise RequestError(
                400,
                f"max_tokens={request.max_tokens} with a {len(ids)}-token prompt exceeds max_model_len="
                f"{self.max_model_len}",
                "max_tokens",
            )
        return ids

    def submit(self, request: ChatRequest | CompletionRequest, prompt: list[int] | None = None) -> Future:
        """Queues ``request``; ``prompt``: its ids when the caller has them already (``prompt_of``/``render``)."""
        if prompt is None:
            prompt = self.prompt_of(request) if isinstance(request, CompletionRequest) else self.render(request)
        job = Job(request, prompt)
        self._queue.put(job)
        return job.future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=60)

    # ------------------------------------------------------------------ worker
    def _take(self) -> list[Job] | None:
        first, self._held = self._held or self._queue.get(), None
        if first is None:
            return None
        jobs, rows = [first], first.request.n
        try:
            while rows < self.max_rows:
                job = self._queue.get(timeout=self.batch_wait_s)
                if job is None:
                    self._queue.put(None)  # stop after this call
                    break
                if rows + job.request.n > self.max_rows:
                    self._held = job
                    break
                jobs.append(job)
                rows += job.request.n
        except queue.Empty:
            pass
        return jobs

    def _run(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            try:
                results = self._generate(jobs)
            except Exception as e:  # a failed call fails its requests, never the server
                for job in jobs:
                    job.future.set_exception(e)
                continue
            for job, result in zip(jobs, results):
                job.future.set_result(result)

    def _row_params(self, job: Job, choice: int, row: int, stops: tuple[int, ...]):
        from envace_jax.sampling import SamplingParams
        from envace_jax.sampling.plan import seed_at_row

        r = job.request
        seed = r.seed if r.seed is not None else int(self._seeds.integers(2**62))
        if r.seed is None:
            choice = row  # a fresh seed per row: nothing to keep independent of the batch
        return SamplingParams(
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_new_tokens=r.max_tokens if r.max_tokens is not None else self.max_model_len - len(job.prompt),
            stop_token_ids=stops,
            seed=seed_at_row(seed % 2**64, choice, row),
        )

    def _stop_string_ids(self, stops: tuple[str, ...]) -> tuple[int, ...]:
        """Stop strings that are one token stop the row there; longer ones are cut from the text afterwards."""
        ids = [self.renderer.encode(s) for s in stops]
        return tuple(x[0] for x in ids if len(x) == 1)

    def _generate(self, jobs: list[Job]):
        from envace_jax.serve.protocol import cut_at_stop

        prompts, params, owners = [], [], []
        for j, job in enumerate(jobs):
            stops = tuple(self.renderer.stop_token_ids) + self._stop_string_ids(job.request.stop)
            stops += tuple(getattr(job.request, "stop_token_ids", ()))
            for c in range(job.request.n):
                params.append(self._row_params(job, c, len(prompts), stops))
                prompts.append(job.prompt)
                owners.append(j)
        out = self.sampler.generate(prompts, params)
        st = self.stats
        st.requests += len(jobs)
        st.calls += 1
        st.rows += len(prompts)
        st.max_rows_in_a_call = max(st.max_rows_in_a_call, len(prompts))
        results = [(len(job.prompt), []) for job in jobs]
        for i, (tokens, reason) in enumerate(zip(out.tokens, out.finish_reasons)):
            r = jobs[owners[i]].request
            text, cut = cut_at_stop(self.renderer.decode(tokens), r.stop)
            results[owners[i]][1].append(Choice(text, "stop" if cut else reason, len(tokens), list(tokens)))
            st.completion_tokens += len(tokens)
        st.prompt_tokens += sum(len(job.prompt) * job.request.n for job in jobs)
        return results
