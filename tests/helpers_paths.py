"""Where the repository is, for tests at any depth under tests/ (configs, launch scripts, subprocess
PYTHONPATH)."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
