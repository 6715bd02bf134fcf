"""Runs the main of envace_jax/cli/train.py (``--help`` prints its docstring). So do
``python -m launch.train`` and the ``envace-train`` console script."""

from envace_jax.cli.train import cli

if __name__ == "__main__":
    cli()
