"""Runs the main of envace_jax/cli/pretrain.py (``--help`` prints its docstring). So do
``python -m launch.pretrain`` and the ``envace-pretrain`` console script."""

from envace_jax.cli.pretrain import cli

if __name__ == "__main__":
    cli()
