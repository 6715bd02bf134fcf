"""Jitted batched sampler: prefill + on-device decode loop over a device KV cache.

Usage::

    out = Sampler(model).generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=64))
    out.tokens, out.logprobs, out.finish_reasons, out.lengths

Multi-turn (the rollout engine's per-step call)::

    out = sampler.generate(prompts, params, return_state=True)
    out2 = sampler.continue_(out.state, appended, params2, rows=[2, 0, -1])

``continue_`` gathers the listed rows of the previous state's cache (``-1`` = a fresh prompt in that
slot), appends each row's new tokens after what the row already holds, and decodes again, so a turn
costs the appended tokens plus the generated ones, not the whole conversation. The last generated
token of a finished row is not in the cache yet (feeding it would cost one more forward that a
finished episode never needs); it is written in front of the row's next appended chunk. A row still
generating when a call returns early (``min_done``) has fed it already and carries its next-token
logits in the state, so continuing it writes nothing (``SamplerState.carried``).

The package, one job a module:

- ``records``: ``SamplingParams``, ``SamplerState``, ``SamplerOutput``, ``SamplerStats``.
- ``plan``: what a call does before touching the device (row resume, room, prefill chunks, cache
  window, decode budget), planned in numpy by ``plan_batch``; testable without a model.
- ``ops``: per-row token sampling on device (temperature, top-k, sort-free top-p).
- ``loop``: the compiled programs that carry a plan out per shape bucket: ``prefill`` (gather rows,
  resize the cache, write one right-padded chunk, logits at each row's last token) and ``decode`` (a
  ``lax.while_loop`` that samples, records and feeds one token per step until every row is done or
  the budget is reached). Shapes are bucketed (batch, chunk length, cache length, token budget) so a
  long run compiles a handful of programs; ``Sampler.num_compilations`` counts the XLA compilations
  made during the sampler's calls (a repeated call with the same buckets makes none).
- ``weights``: on CPU the per-layer weights the programs read (without a mesh, each layer's q/k/v and
  gate/up concatenated) are prepared once per weights version (``PreparedWeights``);
  ``Sampler.release_weights()`` drops that copy.
- ``client``: ``Sampler``, the host side that checks a call, plans it, places the arrays, runs the
  programs and reads the results back.

Finish reasons: ``"stop"`` (a stop token was generated; it is included in the output), ``"length"``
(``max_new_tokens`` reached), ``"cache_full"`` (the row reached ``capacity``, or its appended tokens
did not fit: then nothing is written, no token is generated, and the row's cache is left as it was),
``"running"`` (still generating when a ``min_done`` call returned).
"""

from envace_jax.sampling.client import Sampler
from envace_jax.sampling.records import SamplerOutput, SamplerState, SamplerStats, SamplingParams

__all__ = ["Sampler", "SamplerOutput", "SamplerState", "SamplerStats", "SamplingParams"]
