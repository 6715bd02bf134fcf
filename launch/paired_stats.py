"""Runs the main of envace_jax/cli/paired_stats.py (``--help`` prints its docstring). So do
``python -m launch.paired_stats`` and the ``envace-paired-stats`` console script."""

from envace_jax.cli.paired_stats import cli

if __name__ == "__main__":
    cli()
