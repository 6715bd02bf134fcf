"""The public classes' defaults that buy speed with nothing but float32 summation order, and the one switch
that turns them back for bit-for-bit replays of runs recorded before they were the defaults.

Three defaults of the GRPO iteration written with the public classes (``Sampler``, ``build_batch``,
``Trainer.update``) are chosen here:

- ``build_batch(length_multiple=16)``: rows are padded to a multiple of 16 tokens (64 before): a batch of
  96-token rows runs 96 positions through the update, not 128. Padding carries zero loss weight, so the loss
  and gradient are the same up to summation order; what a smaller multiple costs is more distinct widths,
  hence more compiled programs, when row lengths vary a lot (the config keeps ``rl.length_multiple = 64``
  for that reason: docs/performance.md).
- ``Sampler(share_prompts=None)`` and ``Trainer(share_prefixes=None)`` mean "on where it applies": without a
  mesh, or on a mesh of one device. The rows of a GRPO group repeat one prompt; the sampler then writes
  each distinct prompt into its cache once and the update runs it once per micro-batch. Calls whose rows
  share nothing run as before.

``ENVACE_JAX_REPLAY_DEFAULTS=1`` in the environment (read at each call, so a script needs no edit) brings
back the earlier defaults: 64-token buckets, nothing shared. The training loops (``launch/train.py``,
``launch/demo.py``) do not read these defaults: they pass their own settings, so recorded runs of them
replay bit for bit either way. ``launch/eval.py``'s model policies build a ``Sampler`` with its default (on one
device, a call whose rows repeat a prompt writes it once); an evaluation recorded before replays under the
switch.
"""

from __future__ import annotations

import os

REPLAY_ENV = "ENVACE_JAX_REPLAY_DEFAULTS"
LENGTH_MULTIPLE = 16
REPLAY_LENGTH_MULTIPLE = 64


def replaying() -> bool:
    """Whether ``ENVACE_JAX_REPLAY_DEFAULTS`` asks for the earlier defaults (1/true/yes/on)."""
    value = os.environ.get(REPLAY_ENV, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{REPLAY_ENV}={os.environ[REPLAY_ENV]!r}: use 1 (the earlier defaults) or 0")


def length_multiple() -> int:
    """``build_batch``'s default bucket multiple: 16, or 64 when replaying."""
    return REPLAY_LENGTH_MULTIPLE if replaying() else LENGTH_MULTIPLE


def share_repeated_prompts(requested: bool | None, mesh) -> bool:
    """``Sampler(share_prompts=)`` / ``Trainer(share_prefixes=)``: an explicit True or False is kept (the
    callers refuse True on a mesh of several devices); None is True on one device (no mesh, or a mesh of
    one) unless replaying."""
    if requested is not None:
        return bool(requested)
    return not replaying() and (mesh is None or mesh.size == 1)
