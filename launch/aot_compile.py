"""Runs the main of envace_jax/cli/aot_compile.py (``--help`` prints its docstring). So do
``python -m launch.aot_compile`` and the ``envace-aot-compile`` console script."""

from envace_jax.cli.aot_compile import cli

if __name__ == "__main__":
    cli()
