"""Runs the main of envace_jax/cli/export_hf.py (``--help`` prints its docstring). So do
``python -m launch.export_hf`` and the ``envace-export-hf`` console script."""

from envace_jax.cli.export_hf import cli

if __name__ == "__main__":
    cli()
