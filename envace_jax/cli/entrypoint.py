"""What every command shares (``launch/*.py``, ``python -m launch.<name>``, the ``envace-*`` console scripts): a
short message instead of a traceback for the failures a user can fix, the package's log on stderr, and a quiet
start on hosts without an accelerator. It needs only the standard library (and absl inside ``run``): the cluster
scripts in launch/gpu and launch/tpu_vm load it by its path, where the package may not be installed.

- ``run(main)`` runs an absl main: ``--help`` shows its module's docstring and flags (``lend_help``); it checks
  the ``--config.a.b=v`` overrides against the config file first (an unknown field is one line naming the
  nearest valid one, exit 2), then runs ``main`` under ``guard``.
- ``guard()`` turns the expected failures (a config error, a missing file, a full disk, a corrupt weights
  file, a checkpoint that does not fit the config, other bad input) into one or two lines on stderr and a
  non-zero exit. ``--verbose`` or ``ENVACE_DEBUG=1`` lets the exception through with its traceback.
  Anything else (a TypeError, a KeyError, ...) is a bug and keeps its traceback.
- ``show_library_log()`` prints the package's log records (``logging.getLogger("envace_jax")``: a resume, a
  preemption, compile progress) on stderr as bare lines, as the commands printed them before the package
  logged them.
- ``quiet_cpu_host()`` keeps JAX on the CPU when this host has no TPU or GPU and the user did not choose
  a platform, so an installed libtpu does not print its start-up complaints (see the function).

Exit codes: 2 for bad input (a config or usage error, a value our checks reject, a checkpoint that does not fit
the config, a missing package), 1 for a failure while running (a file, the disk, the weights, XLA), 130 on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import glob
import logging
import os
import re
import sys
from typing import Any, Callable, Iterator, Sequence

DEBUG_ENV = "ENVACE_DEBUG"
TRACEBACK_HINT = f"{DEBUG_ENV}=1 (or --verbose) shows the traceback"
MAX_MESSAGE = 400  # characters of an exception's own text that are shown


class UsageError(Exception):
    """A command-line mistake found before anything ran (exit 2)."""


# ----------------------------------------------------------------------------- accelerator plugins

GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_ENV_HINTS = (
    "TPU_NAME",
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_HOSTNAMES",
    "TPU_WORKER_ID",
    "TPU_CHIPS_PER_HOST_BOUNDS",
)


def visible_accelerator(root: str = "/") -> str | None:
    """``"tpu"``, ``"gpu"`` or None: what this host shows of an accelerator, read without loading JAX.

    A TPU VM shows its chips as Google PCI devices (vendor 0x1ae0) that are not network cards (Google's
    gVNIC shares the vendor id), and as /dev/accel* or /dev/vfio/<n>; a GPU host shows /dev/nvidia* (or
    AMD's /dev/kfd). ``root`` is for tests."""
    path = lambda p: os.path.join(root, p.lstrip("/"))
    for vendor in glob.glob(path("/sys/bus/pci/devices/*/vendor")):
        try:
            with open(vendor) as f:
                if f.read().strip() != GOOGLE_PCI_VENDOR:
                    continue
            with open(os.path.join(os.path.dirname(vendor), "class")) as f:
                if not f.read().strip().startswith("0x02"):  # 0x02xxxx: a network controller (gVNIC)
                    return "tpu"
        except OSError:
            continue
    if glob.glob(path("/dev/accel[0-9]*")) or glob.glob(path("/dev/vfio/[0-9]*")):
        return "tpu"
    if glob.glob(path("/dev/nvidia[0-9]*")) or os.path.exists(path("/dev/kfd")):
        return "gpu"
    return None


def quiet_cpu_host(environ: dict | None = None, root: str = "/") -> bool:
    """Sets ``JAX_PLATFORMS=cpu`` when nothing asks for an accelerator and none is visible. Returns whether
    it did. Call it before JAX initialises its backends (first thing in a main).

    Why: with libtpu installed (``make aot-deps``; CI installs it too) JAX tries the TPU backend on every
    start, and libtpu prints five lines to stderr (host bounds, worker hostnames, an INVALID_ARGUMENT
    trace) before JAX falls back to the CPU. On a CPU-only host the CPU is the only backend there is, so
    naming it changes nothing but the noise. A TPU VM or GPU host is left alone (its devices are visible,
    see ``visible_accelerator``), as is any host where the user set ``JAX_PLATFORMS`` (even to "") or a
    ``TPU_*`` variable. aot_compile.py keeps JAX on the CPU itself and loads libtpu's compiler on purpose.
    """
    env = os.environ if environ is None else environ
    if "JAX_PLATFORMS" in env or any(k in env for k in TPU_ENV_HINTS):
        return False
    if visible_accelerator(root) is not None:
        return False
    env["JAX_PLATFORMS"] = "cpu"
    return True


# ----------------------------------------------------------------------------- the package's log

LIBRARY_LOGGER = "envace_jax"


class _LibraryLogHandler(logging.StreamHandler):
    """Marks the handler ``show_library_log`` installed, so a second call does not add another."""


def show_library_log(stream=None) -> logging.Handler:
    """Shows the package's INFO and higher records on ``stream`` (stderr) as the bare message, and returns
    the handler. The package logs what a run reports (``resumed from checkpoint step 7``, ``aot: ...``) and
    leaves the display to its user; a command shows those lines as plain text, the way it printed them.

    The records do not go on to the root logger: absl.app puts its own handler there, which would print
    each line a second time with its prefix (level, time, thread, file:line), and ``absl_logging.
    set_verbosity(WARNING)`` in a main (quiet Orbax) sets the root level, not this logger's."""
    logger = logging.getLogger(LIBRARY_LOGGER)
    for h in logger.handlers:
        if isinstance(h, _LibraryLogHandler):
            return h
    handler = _LibraryLogHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler


# ----------------------------------------------------------------------------- config overrides


def _config_spec(argv: Sequence[str], flag: str) -> tuple[str | None, int]:
    """The value of ``--flag=...`` / ``--flag ...`` in ``argv`` and its index (-1 when absent)."""
    for i, a in enumerate(argv):
        if a in (f"--{flag}", f"-{flag}") and i + 1 < len(argv):
            return argv[i + 1], i
        for prefix in (f"--{flag}=", f"-{flag}="):
            if a.startswith(prefix):
                return a[len(prefix) :], i
    return None, -1


def override_paths(argv: Sequence[str], flag: str = "config") -> list[str]:
    """The dotted field of each ``--config.a.b=v`` (``--noconfig.a.b``, ``-config.a.b v``) in ``argv``."""
    out = []
    for a in argv:
        m = re.match(rf"^--?(?:no)?{re.escape(flag)}\.([^=]+)", a)
        if m:
            out.append(m.group(1))
    return out


def _keys(node: Any) -> list[str] | None:
    if hasattr(node, "keys") and callable(node.keys):
        return [str(k) for k in node.keys()]
    return None


def nearest(name: str, choices: Sequence[str]) -> str | None:
    """The valid name closest to a mistyped one (difflib), or None when nothing is close."""
    near = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return near[0] if near else None


def unknown_override(config: Any, path: str, flag: str = "config") -> str | None:
    """None when ``path`` names a field of ``config``; else one line naming the first unknown part and the
    nearest valid name (difflib), e.g. ``--config.optim.lrr: config.optim has no field 'lrr'; did you
    mean --config.optim.lr?``."""
    node, done = config, []
    for part in path.split("."):
        keys = _keys(node)
        where = ".".join([flag, *done])
        if keys is None:
            return f"--{flag}.{path}: {where} is a value, not a section with a field {part!r}"
        if part not in keys:
            near = nearest(part, keys)
            hint = (
                f"did you mean --{'.'.join([flag, *done, near])}?"
                if near
                else f"its fields are {', '.join(sorted(keys))}"
            )
            return f"--{flag}.{path}: {where} has no field {part!r}; {hint}"
        node, done = node[part], done + [part]
    return None


def check_overrides(argv: Sequence[str], default_config: str | None = None, flag: str = "config") -> None:
    """Loads the config file named by ``--config`` (or ``default_config``) and raises ``UsageError`` for a
    missing file or the first override that names no field. ml-collections would otherwise fail while
    parsing flags, with a traceback of ~50 lines around its own hint."""
    spec, _ = _config_spec(argv, flag)
    spec = spec if spec is not None else default_config
    paths = override_paths(argv, flag)
    if spec is None:
        return
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise UsageError(f"--{flag}={spec}: no such file {path!r}")
    if not paths:
        return
    from envace_jax.config import config_from_file

    config = config_from_file(path, arg or None)
    for p in paths:
        msg = unknown_override(config, p, flag)
        if msg:
            raise UsageError(msg)


# ----------------------------------------------------------------------------- failures -> messages


def debug_requested(argv: Sequence[str] | None = None) -> bool:
    """``ENVACE_DEBUG`` set to anything but 0/false, or ``--verbose`` before any ``--``."""
    if os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        return True
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        argv = argv[: argv.index("--")]
    return "--verbose" in argv or "--verbose=true" in argv


def _text(exc: BaseException) -> str:
    """The exception's message on one line, cut to ``MAX_MESSAGE`` characters."""
    msg = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    one = lines[0] + (" ..." if len(lines) > 1 else "") if lines else type(exc).__name__
    return one if len(one) <= MAX_MESSAGE else one[:MAX_MESSAGE] + " ..."


_SHAPE = re.compile(r"[Rr]equested shape:? *(\([^)]*\)).*?stored shape:? *(\([^)]*\))")
_CKPT_DIR = re.compile(r"no usable checkpoint in (\S+)")


def _library_error(exc: BaseException, name: str) -> bool:
    return any(c.__name__ == name for c in type(exc).__mro__)


def describe(exc: BaseException) -> tuple[str, str, int] | None:
    """``(what failed, what to do, exit code)`` for an expected failure; None for anything else (a bug,
    which keeps its traceback)."""
    msg = str(exc)
    if isinstance(exc, UsageError):
        return _text(exc), "fix the command line (--help lists the flags)", 2
    if _library_error(exc, "ConfigError"):  # envace_jax.config's (the cluster scripts run without the package)
        return f"config error: {_text(exc)}", "fix that field in the config file or its --config.* override", 2
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", "a rerun of the same command resumes from the newest checkpoint where there is one", 130
    if getattr(exc, "errno", None) == errno.ENOSPC or "No space left on device" in msg:
        where = getattr(exc, "filename", None)
        return (
            f"disk full{f' writing {where}' if where else ''}: {_text(exc)}",
            "free space on that disk or write elsewhere (--config.run_dir, --out_dir, --output)",
            1,
        )
    # hf_io's WeightsError names the file and tensor; safetensors' own error (raised where hf_io does not
    # wrap it) names neither, but says what is wrong with the header
    if _library_error(exc, "WeightsError") or _library_error(exc, "SafetensorError"):
        text = _text(exc) if _library_error(exc, "WeightsError") else f"safetensors: {_text(exc)}"
        return (
            f"bad weights file: {text}",
            "copy or export the weights again (a truncated or corrupt file cannot be read)",
            1,
        )
    shape = _SHAPE.search(msg)
    if shape and isinstance(exc, (ValueError, RuntimeError)):
        ckpt = _CKPT_DIR.search(msg)
        return (
            f"the checkpoint{f' in {ckpt.group(1)}' if ckpt else ''} holds an array of shape {shape.group(2)} "
            f"where this config builds {shape.group(1)}",
            "restore with the config of the run that wrote it (its run_dir/config.json); --config.model.* must match",
            2,
        )
    if isinstance(exc, FileNotFoundError):
        what = exc.filename or _text(exc)
        return (
            f"not found: {what}" + ("" if exc.filename is None else f" ({exc.strerror})"),
            "check the path, or that the program is installed and on PATH",
            1,
        )
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename or _text(exc)}", "check the path's owner and mode", 1
    if isinstance(exc, OSError):
        return f"I/O error: {_text(exc)}", "check the path and the disk", 1
    if isinstance(exc, ImportError) and (exc.name or "").split(".")[0] == "envace_jax":
        # The scripts import the package, not a path next to them: it must be installed (editable).
        return (
            f"missing package: {_text(exc)}",
            "install the project (make venv, or pip install -e .) and run with its python (.venv/bin/python)",
            2,
        )
    if isinstance(exc, ImportError):
        return f"missing package: {_text(exc)}", "install the extra it belongs to (make eval-deps, make aot-deps)", 2
    if isinstance(exc, ValueError):  # bad input, found by our checks: nothing to retry
        return f"error: {_text(exc)}", "the message names what to change", 2
    if isinstance(exc, RuntimeError):  # a failure while running (XLA, Orbax, a judge endpoint)
        return f"error: {_text(exc)}", "the message says what failed", 1
    return None


def report(exc: BaseException, prog: str | None = None, stream=None) -> int | None:
    """Prints the two lines for ``exc`` and returns the exit code, or returns None (not an expected failure)."""
    d = describe(exc)
    if d is None:
        return None
    what, todo, code = d
    prog = prog or os.path.basename(sys.argv[0] or "launch")
    stream = sys.stderr if stream is None else stream
    print(f"{prog}: {what}", file=stream, flush=True)
    print(f"{' ' * len(prog)}  {todo}; {TRACEBACK_HINT}", file=stream, flush=True)
    return code


def _closed_loop_noise(exc: BaseException | None) -> bool:
    """True for the error a TensorStore read callback raises when it finishes after Orbax closed its event
    loop (a restore that failed part-way). It says nothing about the run, and it arrives from another
    thread at any moment, in the middle of our own message."""
    return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"


@contextlib.contextmanager
def guard(argv: Sequence[str] | None = None, prog: str | None = None) -> Iterator[None]:
    """Runs the body; an expected failure becomes two lines on stderr and ``SystemExit`` (see ``describe``).
    With ``--verbose`` in ``argv`` or ``ENVACE_DEBUG=1`` every exception propagates unchanged."""
    previous_hook = sys.unraisablehook
    if not debug_requested(argv):
        sys.unraisablehook = lambda u: None if _closed_loop_noise(u.exc_value) else previous_hook(u)
    try:
        yield
    except SystemExit:
        raise
    except BaseException as e:  # KeyboardInterrupt too: a short line, not a traceback
        if debug_requested(argv):
            raise
        code = report(e, prog)
        if code is None:
            raise
        # The failure is reported. What the interrupted work leaves behind is not news: a failed Orbax
        # restore leaves read coroutines whose errors Python prints as "Exception ignored" tracebacks
        # (~60 lines) when it collects them at exit.
        sys.unraisablehook = lambda unraisable: None
        raise SystemExit(code) from None


def lend_help(main: Callable) -> None:
    """absl's ``--help`` prints the ``__main__`` module's docstring and the flags that module defined. A main in
    ``envace_jax.cli`` runs from a wrapper (``launch/train.py``, the ``envace-train`` console script), which is
    ``__main__`` then: it gets the docstring and flags of ``main``'s module, so ``--help`` shows those."""
    from absl import flags

    module = sys.modules.get(getattr(main, "__module__", ""))
    if module is None or module is sys.modules.get("__main__"):
        return
    for flag in flags.FLAGS.get_key_flags_for_module(module.__name__):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    sys.modules["__main__"].__doc__ = module.__doc__


def run(
    main: Callable[[list[str]], Any], default_config: str | None = None, config_flag: str | None = "config"
) -> None:
    """``absl.app.run(main)`` with the checks above: the accelerator choice, the package's log on stderr,
    the config overrides, then ``main`` under ``guard``. ``--verbose`` is accepted as a flag (it only changes
    how failures print)."""
    from absl import app, flags

    if "verbose" not in flags.FLAGS:
        flags.DEFINE_bool("verbose", False, f"full tracebacks on failure (or set {DEBUG_ENV}=1)")
    lend_help(main)
    quiet_cpu_host()
    show_library_log()
    with guard():
        if config_flag:
            check_overrides(sys.argv[1:], default_config, config_flag)
        app.run(main)
