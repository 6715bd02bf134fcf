"""Runs the main of envace_jax/cli/eval.py (``--help`` prints its docstring). So do
``python -m launch.eval`` and the ``envace-eval`` console script."""

from envace_jax.cli.eval import cli

if __name__ == "__main__":
    cli()
