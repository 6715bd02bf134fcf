"""Tunix's GRPO iteration for ``benchmarks/peers.py``: ``python tunix_grpo.py SPEC.json`` in Tunix's venv.

The API is Tunix's own GRPO learner, ``tunix.rl.grpo.grpo_learner.GRPOLearner``, driven by its ``train``
loop over ``warmup + iters`` batches of the spec's prompts, on an ``RLCluster`` with the ``"vanilla"``
rollout engine (Tunix's JAX sampler; no vLLM) colocated with the actor on one CPU device mesh, so the
sampler and the trainer share one model (no weight sync). The model is
``tunix.models.qwen3.params.create_model_from_safe_tensors`` on the exported folder, float32.
Settings: ``GRPOConfig(num_generations=G, num_iterations=1, beta=0.0, epsilon=clip_eps)`` (one
optimizer step per batch, no reference model, as ours), the rollout at the spec's temperature with
``top_p=1.0, top_k=None`` (plain categorical sampling, Tunix skips its sort then), and the optimizer
``optax.chain(clip_by_global_norm, adamw)`` with the spec's numbers.

Prompts go in as text through an id tokenizer (text = space-joined ids, one token per id), so Tunix
samples from exactly the spec's ids; its eos and pad id is the vocabulary size, which the model cannot
produce, so every completion runs to ``new_tokens`` as in the other frameworks.

Timing: one iteration is one call of the learner's ``_run_global_step`` (rollout, reward, advantages and
the actor update of one global step); sampling is ``RLCluster.generate`` inside it.
"""

from __future__ import annotations

import time

import peer_common as pc

SPEC = pc.read_spec(pc.spec_path_from_argv())
pc.limit_threads(int(SPEC["threads"]))

import os  # noqa: E402

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from tunix.models.qwen3 import model as q3_model  # noqa: E402
from tunix.models.qwen3 import params as q3_params  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.grpo import grpo_learner  # noqa: E402
from tunix.rl.rollout import base_rollout  # noqa: E402


class IdTokenizer:
    """Text is space-joined token ids; no BOS; eos and pad are the id ``vocab_size`` (never sampled)."""

    def __init__(self, vocab_size: int):
        self.sentinel = int(vocab_size)

    def encode(self, text, **kw):
        return pc.ids_from_text(text)

    def decode(self, ids, **kw):
        return pc.text_from_ids(ids)

    def bos_id(self):
        return None

    def eos_id(self):
        return self.sentinel

    def pad_id(self):
        return self.sentinel


def build_model(spec, mesh):
    m = spec["model"]
    cfg = q3_model.ModelConfig(
        num_layers=m["num_layers"],
        vocab_size=m["vocab_size"],
        embed_dim=m["hidden_size"],
        hidden_dim=m["intermediate_size"],
        num_heads=m["num_heads"],
        head_dim=m["head_dim"],
        num_kv_heads=m["num_kv_heads"],
        rope_theta=int(m["rope_theta"]),
        norm_eps=m["rms_norm_eps"],
        use_tied_embedding=bool(m["tie_word_embeddings"]),
        dtype=jnp.float32,
        param_dtype=jnp.float32,
    )
    with mesh:
        return q3_params.create_model_from_safe_tensors(spec["model_dir"], cfg, mesh)


def main():
    spec = SPEC
    G, N = int(spec["group_size"]), int(spec["new_tokens"])
    prompt_len = len(spec["prompts"][0])
    steps = int(spec["warmup"]) + int(spec["iters"])
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    model = build_model(spec, mesh)
    a = spec["adamw"]
    optimizer = optax.chain(
        optax.clip_by_global_norm(a["grad_clip"]),
        optax.adamw(float(spec["lr"]), b1=a["b1"], b2=a["b2"], eps=a["eps"], weight_decay=a["weight_decay"]),
    )
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=N,
        max_prompt_length=prompt_len,
        kv_cache_size=prompt_len + N + 8,
        temperature=float(spec["temperature"]),
        top_p=1.0,
        top_k=None,
        eos_tokens=[int(spec["model"]["vocab_size"])],
    )
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optimizer,
        eval_every_n_steps=10**9,
        max_steps=steps,
        mini_batch_size=None,
        train_micro_batch_size=None,
    )
    roles = (rl_cluster_lib.Role.ACTOR, rl_cluster_lib.Role.ROLLOUT, rl_cluster_lib.Role.REFERENCE)
    cluster = rl_cluster_lib.RLCluster(
        actor=model,
        reference=None,
        tokenizer=IdTokenizer(spec["model"]["vocab_size"]),
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={r: mesh for r in roles},
            rollout_engine="vanilla",
            offload_to_cpu=False,
            training_config=training,
            rollout_config=rollout,
        ),
    )
    algo = grpo_learner.GRPOConfig(num_generations=G, num_iterations=1, beta=0.0, epsilon=float(spec["clip_eps"]))
    rewards: list[float] = []

    def reward_fn(prompts, completions, **kw):
        scores = [pc.reward(pc.ids_from_text(c)) for c in completions]
        if any(len(pc.ids_from_text(c)) != N for c in completions):
            lengths = sorted({len(c.split()) for c in completions})
            raise RuntimeError(f"tunix: completion lengths {lengths}, expected {N}")
        rewards.append(float(np.mean(scores)))
        return scores

    learner = grpo_learner.GRPOLearner(cluster, algo, reward_fn)
    clock = pc.IterationClock()

    inner_generate = cluster.generate

    def timed_generate(*args, **kw):
        t0 = time.perf_counter()
        out = inner_generate(*args, **kw)
        clock.sampling(time.perf_counter() - t0)
        return out

    cluster.generate = timed_generate
    inner_step = learner._run_global_step

    def timed_step(*args, **kw):
        clock.begin()
        out = inner_step(*args, **kw)
        jax.block_until_ready(nnx.state(cluster.actor_trainer.model))  # the update has finished
        clock.end()
        return out

    learner._run_global_step = timed_step
    texts = [pc.text_from_ids(p) for p in spec["prompts"]]
    # One array leaf per batch: the learner repeats every leaf G times along axis 0 (a list of strings
    # would be G copies of each string instead).
    learner.train([{"prompts": np.asarray(texts)} for _ in range(steps)])
    api = (
        "tunix.rl.grpo.grpo_learner.GRPOLearner.train on RLCluster(rollout_engine='vanilla', actor=rollout=one "
        "CPU mesh), GRPOConfig(num_generations=G, num_iterations=1, beta=0); "
        "optax.chain(clip_by_global_norm, adamw)"
    )
    import flax
    import tunix  # noqa: F401

    from importlib.metadata import version

    versions = {"google-tunix": version("google-tunix"), "jax": jax.__version__, "flax": flax.__version__}
    pc.emit(pc.result(spec, clock, rewards, api, versions))


if __name__ == "__main__":
    main()
