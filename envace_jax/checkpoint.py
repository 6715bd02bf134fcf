"""Orbax checkpoints of the train state and the data iterator, safe against preemption and kill -9.

A checkpoint step holds two items: ``state`` (any pytree: params as an nnx.State, optax state,
step, rng key) written with ``StandardSave``, and ``data`` (the grain iterator state) as JSON.

Why a manifest on top of Orbax: a finished Orbax step whose files are later truncated or deleted
can restore without error (a missing tensorstore chunk reads back as fill values), so each step
carries ``envace_manifest.json`` listing every file and its size. ``restore_latest_good`` checks
the manifest, then restores; a step that fails either way is logged by number, renamed aside
(``<step>.corrupt``) so the step can be saved again, and the previous step is tried.

When the manifest is written: from Orbax's ``post_finalization_callback``, which runs in Orbax's
background save thread once every process has written all its files, and *before* Orbax renames
``<step>.orbax-checkpoint-tmp`` to ``<step>``. So a step directory never exists without its
manifest: there is no window in which a kill -9 loses a finished step, a kill before the rename
leaves only a tmp directory (removed at the next start; the older steps are untouched), and
``max_to_keep`` pruning, which Orbax runs after the rename, never removes the newest manifested
step before a newer one, manifest included, is in place. The manifest leaves out Orbax's
``_CHECKPOINT_METADATA``, which Orbax rewrites during the rename step (it adds the commit time).

Pruning is a rename too: Orbax moves a pruned step into ``.pruned/`` (its ``todelete_subdir``), and
we delete that folder before the next save and at start. Orbax's own deletion works file by file in
place, so a kill during it would leave a half-deleted step that still looks like a step.

Preemption: ``PreemptionGuard`` turns SIGTERM into a flag; the loop calls
``ckpt.maybe_save(step, state, data_state, force=guard.check())`` and, when preempted, ``close()``
(which waits for the async write) before exiting 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import signal
import threading
from typing import Any, Iterable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

log = logging.getLogger(__name__)

MANIFEST = "envace_manifest.json"
_KEY_IMPLS = "__key_impls__"
_TMP_MARK = ".orbax-checkpoint-tmp"  # Orbax's suffix for a step still being written
_PRUNED = ".pruned"  # where Orbax moves steps pruned by max_to_keep; we delete its contents
# Orbax's step metadata file: Orbax rewrites it after our manifest (adding the commit time), so the
# manifest cannot pin its size. Restoring does not need it (a truncated or missing one restores the
# same values: Orbax logs the parse error and goes on).
_ORBAX_STEP_METADATA = "_CHECKPOINT_METADATA"


# --------------------------------------------------------------------------- manifest


def _walk_files(root: epath.Path) -> Iterable[epath.Path]:
    # epath refuses recursive globs (they would be RPC storms on GCS), so walk by hand.
    for p in root.iterdir():
        if p.is_dir():
            yield from _walk_files(p)
        else:
            yield p


def _file_digest(p: epath.Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def write_manifest(step_dir: epath.PathLike, *, hashes: bool = False) -> dict[str, Any]:
    """Records every file of a finished step (relative path -> size [, sha256])."""
    root = epath.Path(step_dir)
    files = {}
    for p in sorted(_walk_files(root), key=str):
        rel = str(p.relative_to(root))
        if rel in (MANIFEST, MANIFEST + ".tmp", _ORBAX_STEP_METADATA):
            continue
        entry: dict[str, Any] = {"size": p.stat().length}
        if hashes:
            entry["sha256"] = _file_digest(p)
        files[rel] = entry
    manifest = {"files": files, "hashes": hashes}
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, sort_keys=True))
    tmp.rename(root / MANIFEST)  # atomic on POSIX: the manifest is there whole or not at all
    return manifest


def check_manifest(step_dir: epath.PathLike) -> str | None:
    """Returns None when every file in the manifest is present and intact, else the reason."""
    root = epath.Path(step_dir)
    mpath = root / MANIFEST
    if not mpath.exists():
        return f"no {MANIFEST} (the save never completed)"
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        return f"unreadable {MANIFEST} ({e})"
    for rel, entry in files.items():
        p = root / rel
        if not p.exists():
            return f"file {rel} is missing"
        size = p.stat().length
        if size != entry["size"]:
            return f"file {rel} has {size} bytes, expected {entry['size']}"
        if manifest.get("hashes") and _file_digest(p) != entry["sha256"]:
            return f"file {rel} has the wrong sha256"
    return None


# --------------------------------------------------------------------------- typed PRNG keys


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _split_keys(tree: Any) -> tuple[Any, dict[str, str]]:
    """Typed PRNG keys -> raw uint32 key data (Orbax stores plain arrays); returns impl per path."""
    impls: dict[str, str] = {}

    def conv(path, x):
        if _is_key(x):
            impls[jax.tree_util.keystr(path)] = str(jax.random.key_impl(x))
            return jax.random.key_data(x)
        return x

    return jax.tree_util.tree_map_with_path(conv, tree), impls


def _abstract_leaf(x: Any) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):
        if _is_key(x):
            data = jax.eval_shape(jax.random.key_data, x)
            return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=x.sharding)
        return x
    if isinstance(x, jax.Array):
        if _is_key(x):
            x = jax.random.key_data(x)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    if isinstance(x, (int, float, bool, np.number)) or isinstance(x, np.ndarray):
        arr = np.asarray(x)
        return jax.ShapeDtypeStruct(arr.shape, arr.dtype)
    raise TypeError(f"checkpoint target leaf of type {type(x).__name__} is not an array, scalar or ShapeDtypeStruct")


def abstract_target(tree: Any) -> Any:
    """A restore target mirroring ``tree``: ShapeDtypeStructs carrying each array's sharding.

    Python scalars stay as they are, so ``restore`` can hand back the same Python types. To
    restore into other shardings, pass your own ShapeDtypeStructs with ``sharding=`` set.
    """
    return jax.tree.map(lambda x: x if isinstance(x, (bool, int, float)) else _abstract_leaf(x), tree)


def _plain_path(path: tuple) -> tuple[str, ...]:
    """A tree path as plain strings, so a stored tree (dicts) and a live one (dicts, lists, nnx state)
    name the same leaf the same way."""
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _rebuild_leaf(target_leaf: Any, value: Any, impl: str | None) -> Any:
    if impl is not None:
        return jax.random.wrap_key_data(value, impl=impl)
    # Python scalars (e.g. step) come back as 0-d numpy arrays; give the caller its type back.
    if isinstance(target_leaf, bool):
        return bool(value)
    if isinstance(target_leaf, int):
        return int(value)
    if isinstance(target_leaf, float):
        return float(value)
    return value


# --------------------------------------------------------------------------- manager


@dataclasses.dataclass
class RestoreResult:
    step: int
    state: Any
    data_state: Any
    skipped: list[tuple[int, str]]  # (bad step, reason), newest first


class Checkpointer:
    """Orbax CheckpointManager for (train state pytree, data iterator JSON) with good-step restore."""

    def __init__(
        self,
        directory: epath.PathLike,
        *,
        max_to_keep: int | None = 3,
        save_interval_steps: int = 1,
        async_save: bool = True,
        hash_files: bool = False,
        quarantine_bad: bool = True,
        read_only: bool = False,
    ):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"checkpoint.max_to_keep must be >= 1 or None, got {max_to_keep}")
        if save_interval_steps < 1:
            raise ValueError(f"checkpoint.save_interval_steps must be >= 1, got {save_interval_steps}")
        self.directory = epath.Path(directory)
        self.save_interval_steps = save_interval_steps
        self.hash_files = hash_files
        # read_only: a reader beside a live run (an export during training) must not clear that run's
        # in-flight write or pruned steps, nor rename its steps aside; it only restores.
        self.read_only = read_only
        self.quarantine_bad = quarantine_bad and not read_only
        if not read_only:
            self._remove_orphan_tmp_dirs()
        self.async_save = async_save
        # Always Orbax's async checkpointer: only it has the post_finalization_callback that writes
        # the manifest before the step becomes visible. A synchronous save waits for it in save().
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=1,
            enable_async_checkpointing=True,
            create=True,
            todelete_subdir=_PRUNED,
            async_options=ocp.AsyncOptions(post_finalization_callback=self._write_manifest_before_commit),
        )
        self._mgr = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))
        self._writing: int | None = None  # the step whose write is in flight (one at a time)

    def _remove_orphan_tmp_dirs(self) -> None:
        # A process killed mid-write (SIGKILL) leaves an Orbax tmp dir that never becomes a step
        # (Orbax 0.12.8's CheckpointManager accepts cleanup_tmp_directories but does not act on
        # it); nothing of ours is writing at construction, so clear them here.
        if jax.process_index() != 0 or not self.directory.exists():
            return
        for p in self.directory.iterdir():
            if _TMP_MARK in p.name and p.is_dir():
                log.info("removing unfinished checkpoint write %s", p)
                p.rmtree()
        self._empty_pruned()

    def _empty_pruned(self) -> None:
        # Called only while no save is in flight, so Orbax is not moving a step in here right now.
        pruned = self.directory / _PRUNED
        if jax.process_index() == 0 and not self.read_only and pruned.exists():
            pruned.rmtree()

    # ---- saving
    def _uncommitted_dir(self, step: int) -> epath.Path:
        """Where Orbax holds ``step`` between the end of its writes and its commit."""
        tmp = [p for p in self.directory.iterdir() if p.name.startswith(f"{step}{_TMP_MARK}") and p.is_dir()]
        if len(tmp) == 1:
            return tmp[0]
        final = self._step_dir(step)
        if not tmp and final.is_dir():
            return final  # storage where Orbax writes in place and commits with a success file (e.g. GCS)
        raise RuntimeError(
            f"cannot find the directory of checkpoint step {step} being written in {self.directory} "
            f"(tmp candidates: {[p.name for p in tmp]})"
        )

    def _write_manifest_before_commit(self) -> None:
        # Orbax calls this on the primary process, in its background save thread, after every process
        # has written all its files and before it renames the tmp dir to the step's name. An exception
        # here stops that commit: the step never appears, and the error is raised by the next save/wait.
        step = self._writing
        if step is None:
            raise RuntimeError("Orbax finished a checkpoint write this Checkpointer did not start")
        write_manifest(self._uncommitted_dir(step), hashes=self.hash_files)

    def _step_dir(self, step: int) -> epath.Path:
        return self.directory / str(step)

    def save(self, step: int, state: Any, data_state: Any = None) -> bool:
        """Starts saving ``state`` (and the data iterator's JSON state) at ``step``; async by default.

        Returns False (and writes nothing) if ``step`` is already saved.
        """
        if self.read_only:
            raise RuntimeError(f"this Checkpointer of {self.directory} is read-only; it does not save")
        # One write at a time, so the manifest callback knows its step; Orbax would wait here anyway.
        self._mgr.wait_until_finished()
        self._empty_pruned()
        if step in self._mgr.all_steps():
            return False
        storable, impls = _split_keys(state)
        data = {"data_state": data_state, _KEY_IMPLS: impls}
        self._writing = int(step)
        saved = self._mgr.save(
            int(step),
            args=ocp.args.Composite(state=ocp.args.StandardSave(storable), data=ocp.args.JsonSave(data)),
            force=True,
        )
        if not self.async_save:
            self._mgr.wait_until_finished()
        return bool(saved)

    def maybe_save(self, step: int, state: Any, data_state: Any = None, *, force: bool = False) -> bool:
        """Saves every ``save_interval_steps`` steps, or now when ``force`` (e.g. preempted)."""
        if force or step % self.save_interval_steps == 0:
            saved = self.save(step, state, data_state)
            if force:
                self._mgr.wait_until_finished()
            return saved
        return False

    def wait(self) -> None:
        """Blocks until the last save (manifest included) is committed."""
        self._mgr.wait_until_finished()

    def close(self) -> None:
        self._mgr.close()
        self._empty_pruned()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- inspecting
    def all_steps(self) -> list[int]:
        return sorted(self._mgr.all_steps())

    def latest_step(self) -> int | None:
        return self._mgr.latest_step()

    # ---- restoring
    def restore(self, step: int, target: Any) -> tuple[Any, Any]:
        """Restores ``step`` into the structure/shardings of ``target`` (arrays or ShapeDtypeStructs).

        Returns (state, data_state). Raises whatever Orbax raises for an unreadable step.
        """
        data = self._mgr.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))["data"]
        impls = data.get(_KEY_IMPLS, {}) if isinstance(data, dict) else {}
        abstract = jax.tree.map(_abstract_leaf, target)
        self._check_shapes(step, abstract)
        raw = self._mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
        state = jax.tree_util.tree_map_with_path(
            lambda path, t, v: _rebuild_leaf(t, v, impls.get(jax.tree_util.keystr(path))), target, raw
        )
        return state, data.get("data_state")

    def _check_shapes(self, step: int, abstract: Any) -> None:
        """Raises before any array is read when ``abstract`` asks for a shape the step does not hold.

        Orbax would raise the same mismatch itself, but only after it has started reading every array;
        the reads still in flight then finish into a closed event loop and print stray tracebacks from
        TensorStore's threads. Comparing against the step's metadata first reads no array at all.
        """
        try:
            stored = ocp.StandardCheckpointHandler().metadata(self._step_dir(step) / "state").tree
        except Exception:  # no readable metadata: let the restore itself report what is wrong
            return
        shapes = {_plain_path(p): tuple(m.shape) for p, m in jax.tree_util.tree_flatten_with_path(stored)[0]}
        for path, want in jax.tree_util.tree_flatten_with_path(abstract)[0]:
            have = shapes.get(_plain_path(path))
            if have is not None and isinstance(want, jax.ShapeDtypeStruct) and tuple(want.shape) != have:
                raise ValueError(
                    f"Requested shape: {tuple(want.shape)} is not compatible with the stored shape: {have} "
                    f"(array {jax.tree_util.keystr(path)} of step {step})"
                )

    def restore_latest_good(self, target: Any) -> RestoreResult | None:
        """Restores the newest step that passes its manifest check and restores cleanly.

        Each bad step is logged with its number and reason; once an older step restores, the bad
        newer ones are renamed aside (when ``quarantine_bad``). Returns None for an empty
        directory (a fresh start). If steps exist but none is usable it raises instead: a wrong
        ``target`` (e.g. a changed model config) fails every step the same way, and silently
        starting over or moving all checkpoints aside would be worse than stopping.
        """
        self._mgr.wait_until_finished()
        skipped: list[tuple[int, str]] = []
        steps = sorted(self._mgr.all_steps(), reverse=True)
        for i, step in enumerate(steps):
            reason = check_manifest(self._step_dir(step))
            if reason is None:
                try:
                    state, data_state = self.restore(step, target)
                except Exception as e:  # any failure to read means this step is unusable
                    reason = f"restore failed: {type(e).__name__}: {str(e)[:300]}"
                else:
                    if skipped:
                        self._quarantine([s for s, _ in skipped])
                    return RestoreResult(step, state, data_state, skipped)
            nxt = steps[i + 1] if i + 1 < len(steps) else None
            log.warning(
                "checkpoint step %d in %s is corrupt or partial: %s; %s",
                step,
                self.directory,
                reason,
                f"falling back to step {nxt}" if nxt is not None else "no earlier step to fall back to",
            )
            skipped.append((step, reason))
        unfinished = f"no {MANIFEST} (the save never completed)"
        if skipped and self.quarantine_bad and all(r == unfinished for _, r in skipped):
            # Only saves killed before they completed (e.g. SIGKILL during the first save): nothing was
            # ever checkpointed, so a fresh start loses nothing; a wrong target would fail differently.
            self._quarantine([s for s, _ in skipped])
            return None
        if skipped:
            listing = "; ".join(f"step {s}: {r}" for s, r in skipped)
            raise RuntimeError(
                f"no usable checkpoint in {self.directory} ({listing}). If the restore target "
                f"changed shape or structure, fix it; otherwise move the bad steps aside."
            )
        return None

    def _quarantine(self, steps: list[int]) -> None:
        if not self.quarantine_bad:
            return
        if jax.process_index() == 0:
            for step in steps:
                src = self._step_dir(step)
                dst = self.directory / f"{step}.corrupt"
                n = 1
                while dst.exists():
                    n += 1
                    dst = self.directory / f"{step}.corrupt{n}"
                src.rename(dst)
                log.warning("moved bad checkpoint step %d aside to %s", step, dst)
        self._mgr.reload()


# --------------------------------------------------------------------------- preemption


class PreemptionGuard:
    """Turns SIGTERM (TPU/GPU preemption notice) into a flag the training loop polls.

    Use as a context manager so the previous handlers come back afterwards. With several JAX
    processes, ``check()`` must be called by every process at every step: it ORs the flag across
    processes so all of them save the same step and stop together.
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)):
        self.signals = signals
        self._flag = threading.Event()
        self._previous: dict[int, Any] = {}
        self.signal_received: int | None = None

    def _handler(self, signum, frame) -> None:
        self.signal_received = signum
        self._flag.set()

    def install(self) -> "PreemptionGuard":
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handler)
        return self

    def uninstall(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

    def __enter__(self) -> "PreemptionGuard":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    @property
    def preempted(self) -> bool:
        return self._flag.is_set()

    def check(self) -> bool:
        """True once any process has been told to stop."""
        local = self._flag.is_set()
        if jax.process_count() == 1:
            return local
        from jax.experimental import multihost_utils

        return bool(np.any(multihost_utils.process_allgather(np.array(local))))
