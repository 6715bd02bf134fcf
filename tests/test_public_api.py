"""The packages' public names (docs/api.md): each resolves to its home module's object, the list in the
docs is the packages' ``__all__``, and the host side of the API stays free of jax."""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = (
    "envace_jax",
    "envace_jax.models",
    "envace_jax.chat",
    "envace_jax.envs",
    "envace_jax.data",
    "envace_jax.rl",
    "envace_jax.serve",
    "envace_jax.eval",
    "envace_jax.demo",
    "envace_jax.aot",
)


def _documented() -> set[str]:
    with open(os.path.join(ROOT, "docs", "api.md"), encoding="utf-8") as f:
        return set(re.findall(r"^- `([\w.]+)`:", f.read(), flags=re.M))


def test_docs_list_exactly_the_exported_names():
    exported = {f"{p}.{n}" for p in PACKAGES for n in importlib.import_module(p).__all__}
    documented = _documented()
    assert exported - documented == set(), "exported but not in docs/api.md"
    assert documented - exported == set(), "in docs/api.md but not exported"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_is_its_home_modules_object(package):
    pkg = importlib.import_module(package)
    table = getattr(pkg, "_EXPORTS", {})
    submodules = {m.name for m in pkgutil.iter_modules(pkg.__path__)}
    for name in pkg.__all__:
        value = getattr(pkg, name)
        if name in table:  # lazy: the object its home module holds, and no submodule of the same name
            assert value is getattr(importlib.import_module(table[name]), name), name
            assert name not in submodules, f"{package}.{name} would shadow the module {package}.{name}"
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        getattr(pkg, "not_a_name")


def test_host_packages_and_the_top_level_names_they_serve_import_no_jax():
    code = (
        "import sys\n"
        "import envace_jax, envace_jax.chat, envace_jax.envs, envace_jax.data, envace_jax.config\n"
        "from envace_jax import SIZES, load_config, parse_tool_calls\n"
        "from envace_jax.data import RecordError, generate_tasks\n"
        "loaded = sorted(m for m in ('jax', 'flax', 'optax', 'orbax') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
        "import envace_jax.rl.advantages\n"  # the check does see jax once something loads it
        "assert 'jax' in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
