"""envace-jax's GRPO iteration for ``benchmarks/peers.py``: ``python ours_grpo.py SPEC.json``.

One iteration is the library's own path, the pieces ``rl.step.RLStep`` chains for a batch of rows:
``sampling.Sampler.generate`` (every prompt repeated ``group_size`` times, one call), the reward on the
sampled ids, ``rl.advantages.role_wise_advantages`` (GRPO: group mean baseline, divided by the group's
std), ``rl.batch.build_batch`` and one ``rl.trainer.Trainer.update`` (AdamW through ``rl.optim``, the
clipped policy loss, old log-probs taken from the update's own pass since there is one optimizer step
per batch). No KL term and no dual clip, as in the peers' configuration.

The 4 rows of a group begin with the same prompt. As framework ``"ours"`` the sampler writes each prompt
into its cache once (``Sampler(share_prompts=True)``) and the update runs those tokens once per group
(``Trainer(share_prefixes=True)``, ``rl.share_prompt_prefixes`` in a config); both give the same tokens and
log-probs up to float32 summation order. As ``"ours-plain"`` both run them once per row, as the peers do.
As ``"ours-defaults"`` the iteration is what a user writes with the public classes and their defaults only:
``Sampler(model, seed=...)``, ``build_batch(gens, adv, group_ids, max_len=...)``, ``Trainer(model, optim, loss)``
(its default micro-batch) and ``trainer.update(batch)`` (pi_old's log-probs are the sampler's).
As ``"ours-vllm"`` the rows come from the vLLM rollout engine (``rollout.engine="vllm"``, ``rl.vllm_engine``: a
worker process, torch.compile on) instead of our sampler, the update is ``"ours"``'s plus the engine's correction
(truncated importance weights over the engine's log-probs, as ``rl.vllm_client.with_engine_correction`` sets),
and each iteration ends by sending the new weights to the engine (``VllmClient.sync``, timed within the
iteration and reported as ``sync_s``). The engine's start-up is outside the timed iterations, as our compilation
is (it is reported as ``engine_start_s``).

Rows are padded as the peers pad them, to their own length (every completion runs to ``new_tokens``): the
batch's bucket is a multiple of ``LENGTH_MULTIPLE`` = 16 tokens (``rl.length_multiple=16`` in a config).
The library's default bucket of 64 would pad the benchmark's 32 + 64 = 96-token rows to 128, a third more
tokens through the update than either peer trains; it is there to keep the number of compiled shapes small
when row lengths vary, which they do not here.
"""

from __future__ import annotations

import time

import peer_common as pc

SPEC = pc.read_spec(pc.spec_path_from_argv())
LENGTH_MULTIPLE = 16
pc.limit_threads(int(SPEC["threads"]))

import os  # noqa: E402  (after the thread limits)

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from envace_jax.config import LossConfig, OptimConfig  # noqa: E402
from envace_jax.models import hf_io  # noqa: E402
from envace_jax.rl.advantages import role_wise_advantages  # noqa: E402
from envace_jax.rl.batch import build_batch  # noqa: E402
from envace_jax.rl.trainer import Trainer  # noqa: E402
from envace_jax.rl.types import ACT, ROLE_ID, Generation  # noqa: E402
from envace_jax.sampling import Sampler, SamplingParams  # noqa: E402


def build(spec):
    model = hf_io.load_hf(spec["model_dir"], dtype="float32")
    a = spec["adamw"]
    optim = OptimConfig(
        lr=float(spec["lr"]),
        b1=a["b1"],
        b2=a["b2"],
        eps=a["eps"],
        weight_decay=a["weight_decay"],
        grad_clip=a["grad_clip"],
    )
    loss = LossConfig(clip_low=spec["clip_eps"], clip_high=spec["clip_eps"], dual_clip=None, kl_coef=0.0)
    if spec["framework"] == "ours-defaults":  # nothing beyond what the iteration itself must say
        trainer = Trainer(model, optim, loss)
        return model, trainer, Sampler(model, seed=int(spec["seed"]))
    rows = len(spec["prompts"]) * int(spec["group_size"])
    micro = int(spec.get("micro_batch_rows") or rows)
    # "ours": the rows of a group share their prompt, written once by the sampler and computed once in
    # the update (rl.prefix_plan); "ours-plain" computes it for every row, as the peers do.
    share = spec["framework"] in ("ours", "ours-vllm")
    trainer = Trainer(model, optim, loss, micro_batch_size=micro, share_prefixes=share)
    if spec["framework"] == "ours-vllm":
        return model, trainer, vllm_engine(model, spec)
    return model, trainer, Sampler(model, seed=int(spec["seed"]), share_prompts=share)


def vllm_engine(model, spec):
    from envace_jax.config import VllmSettings
    from envace_jax.rl.vllm_engine import VllmEngine

    t = time.perf_counter()
    engine = VllmEngine(
        model.config,
        # 1 GiB of KV cache: this benchmark's rows need about 0.2 GiB at the 0.6B shape, and vLLM's default share
        # of the host's memory would take what the update needs
        VllmSettings(threads=int(spec["threads"]), kv_cache_gib=1),
        max_model_len=len(spec["prompts"][0]) + int(spec["new_tokens"]) + 8,
        seed=int(spec["seed"]),
    )
    engine.load_weights(model)
    engine.started_in = time.perf_counter() - t
    return engine


def vllm_generate(engine, prompts, spec, it: int):
    """The engine's rows as ``Sampler.generate`` gives them: (tokens, log-probs, finish reasons)."""
    base = {"temperature": float(spec["temperature"]), "top_p": 1.0, "top_k": 0, "stop_token_ids": []}
    params = [
        dict(base, max_tokens=int(spec["new_tokens"]), seed=(int(spec["seed"]) + it) * 100_003 + i)
        for i in range(len(prompts))
    ]
    rows = engine.generate(prompts, params)
    return [r["ids"] for r in rows], [r["logprobs"] for r in rows], [r["finish"] for r in rows]


def iteration(spec, sampler, trainer, it: int, clock: pc.IterationClock) -> float:
    G = int(spec["group_size"])
    prompts = [list(p) for p in spec["prompts"] for _ in range(G)]
    group_ids = np.repeat(np.arange(len(spec["prompts"])), G)
    params = SamplingParams(
        temperature=float(spec["temperature"]), max_new_tokens=int(spec["new_tokens"]), seed=int(spec["seed"]) + it
    )
    t0 = time.perf_counter()
    if spec["framework"] == "ours-vllm":
        tokens, logprobs, finishes = vllm_generate(sampler, prompts, spec, it)
    else:
        out = sampler.generate(prompts, params)
        tokens, logprobs, finishes = out.tokens, out.logprobs, out.finish_reasons
    clock.sampling(time.perf_counter() - t0)
    if any(len(t) != int(spec["new_tokens"]) for t in tokens):
        lengths = sorted(set(map(len, tokens)))
        raise RuntimeError(f"ours: completion lengths {lengths}, expected all {spec['new_tokens']}")
    scores = np.asarray([pc.reward(t) for t in tokens], np.float32)
    adv = np.asarray(role_wise_advantages(scores, group_ids, np.full(len(prompts), ROLE_ID[ACT]), normalize_std=True))
    gens = [
        Generation(ACT, p, list(t), list(lp), f"p{g}", i, 0, r, temperature=float(spec["temperature"]))
        for i, (p, t, lp, r, g) in enumerate(zip(prompts, tokens, logprobs, finishes, group_ids))
    ]
    width = len(prompts[0]) + int(spec["new_tokens"])
    if spec["framework"] == "ours-defaults":
        batch = build_batch(gens, adv, group_ids, max_len=width)
        trainer.update(batch)  # returns host floats: the step has finished
        return float(scores.mean())
    batch = build_batch(gens, adv, group_ids, max_len=width, length_multiple=LENGTH_MULTIPLE)
    if batch.tokens.shape[1] != -(-width // LENGTH_MULTIPLE) * LENGTH_MULTIPLE:
        raise RuntimeError(f"ours: rows padded to {batch.tokens.shape[1]} tokens for {width}-token rows")
    if spec["framework"] == "ours-vllm":
        batch.behaviour_logprobs = batch.old_logprobs.copy()  # the engine's: the behaviour policy
        trainer.update(batch, old_from_update=True, behaviour=("token", 2.0))
        SYNC_S.append(sampler.load_weights(trainer.model))  # the new weights reach the engine
        return float(scores.mean())
    trainer.update(batch, old_from_update=True)  # returns host floats: the step has finished
    return float(scores.mean())


SYNC_S: list[float] = []


def main():
    spec = SPEC
    model, trainer, sampler = build(spec)
    clock, rewards = pc.IterationClock(), []
    for it in range(int(spec["warmup"]) + int(spec["iters"])):
        clock.begin()
        rewards.append(iteration(spec, sampler, trainer, it, clock))
        clock.end()
    api = (
        "envace_jax: sampling.Sampler.generate (one call, group_size copies of each prompt) -> "
        "rl.advantages.role_wise_advantages(normalize_std=True) -> rl.batch.build_batch -> "
        "rl.trainer.Trainer.update(old_from_update=True), AdamW via rl.optim"
    )
    import flax

    versions = {"jax": jax.__version__, "flax": flax.__version__}
    record = pc.result(spec, clock, rewards, api, versions)
    if spec["framework"] == "ours-vllm":
        w = int(spec["warmup"])
        record["sync_s"] = SYNC_S[w:]
        record["engine_start_s"] = sampler.started_in
        record["api"] = api.replace("sampling.Sampler.generate", "rl.vllm_engine.VllmEngine.generate (vLLM)") + (
            ", behaviour=('token', 2.0) -> VllmEngine.load_weights"
        )
        versions["vllm"] = sampler.version
        sampler.close()
    pc.emit(record)


if __name__ == "__main__":
    main()
