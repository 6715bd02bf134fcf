"""Runs the main of envace_jax/cli/serve.py (``--help`` prints its docstring). So do
``python -m launch.serve`` and the ``envace-serve`` console script."""

import sys

from envace_jax.cli.serve import cli

if __name__ == "__main__":
    sys.exit(cli())
