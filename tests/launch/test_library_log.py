"""The package logs (``logging.getLogger("envace_jax....")``) and the launch commands show its records on stderr
as the bare lines they printed before (envace_jax/cli/entrypoint.py ``show_library_log``), once each, also under absl's
app.run, which puts a handler of its own on the root logger."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import textwrap

from tests import helpers_loop as h


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def emit(self, record):
        self.seen.append(record.getMessage())


def test_bare_lines_at_info_that_stop_at_the_package_logger():
    from envace_jax.cli import entrypoint as ep

    pkg, root = logging.getLogger("envace_jax"), logging.getLogger()
    saved = (list(pkg.handlers), pkg.level, pkg.propagate)
    on_root = _Records()
    root.addHandler(on_root)
    try:
        out = io.StringIO()
        handler = ep.show_library_log(out)
        assert ep.show_library_log(io.StringIO()) is handler  # a second call adds nothing
        logging.getLogger("envace_jax.rl.training_loop").info("resumed from checkpoint step %d", 7)
        logging.getLogger("envace_jax.checkpoint").warning("moved bad checkpoint step %d aside", 8)
        logging.getLogger("envace_jax.aot.report").debug("below INFO: not shown")
        assert out.getvalue() == "resumed from checkpoint step 7\nmoved bad checkpoint step 8 aside\n"
        assert on_root.seen == []  # not handed on to root, where absl's handler would print it again
    finally:
        root.removeHandler(on_root)
        pkg.handlers[:] = saved[0]
        pkg.setLevel(saved[1])
        pkg.propagate = saved[2]


SCRIPT = textwrap.dedent("""
    import logging, sys

    from envace_jax.cli.entrypoint import run
    import orbax.checkpoint  # what the commands import: it gives the root logger a handler of its own

    def main(argv):
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.WARNING)  # as launch/train.py does, to quiet Orbax
        logging.getLogger("envace_jax.rl.training_loop").info("resumed from checkpoint step 3")
        logging.getLogger("envace_jax.checkpoint").warning("moved bad checkpoint step %d aside", 4)
        logging.getLogger("elsewhere").info("another library's INFO: below absl's WARNING")

    sys.argv = sys.argv[:1]
    run(main, config_flag=None)
""")


def test_a_command_under_absl_prints_each_package_line_once_and_bare(tmp_path):
    script = tmp_path / "command.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=h.env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr == "resumed from checkpoint step 3\nmoved bad checkpoint step 4 aside\n"
