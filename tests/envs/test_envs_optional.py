"""The core package imports without the benchmark extras; using an adapter says how to get them."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_adapters_import_without_benchmark_packages_and_fail_clearly():
    # sys.modules[name] = None makes `import name` raise ImportError, as if not installed.
    code = textwrap.dedent("""
        import sys
        for name in ("bfcl_eval", "tau2", "litellm"):
            sys.modules[name] = None
        import envace_jax.envs
        from envace_jax.envs import bfcl, tau2
        for make in (lambda: bfcl.load_entries("multi_turn_base"),
                     lambda: bfcl.BfclMultiTurnEnv(),
                     lambda: tau2.Tau2Env("airline")):
            try:
                make()
            except ImportError as e:
                assert "make eval-deps" in str(e), e
            else:
                raise AssertionError("no ImportError")
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
