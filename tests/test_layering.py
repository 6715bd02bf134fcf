"""The import graph flows one way: no module imports from a layer above its own.

The layers, lowest first (a module may import from its own layer and from any layer before it):

    host      chat/, envs/, data/, config.py, metrics.py,  plain Python: never jax, flax, optax or orbax
              host_memory.py
    models    models/, sharding.py, checkpoint.py
    sampling  sampling/
    rl        rl/
    eval      eval/                                          eval and demo are one tier of the design;
    demo      demo/                                          the demo uses eval's harnesses, never the reverse
    aot       aot/                                           ahead-of-time TPU compilation of a run's programs
    launch    launch/ (absl mains and pod scripts), benchmarks/

Every import statement counts, including the ones inside functions (a lazy import is still a
dependency). The graph is read from the source with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("host", ("envace_jax.chat", "envace_jax.envs", "envace_jax.data", "envace_jax.config", "envace_jax.metrics",
              "envace_jax.host_memory", "envace_jax.__init__")),
    ("models", ("envace_jax.models", "envace_jax.sharding", "envace_jax.checkpoint")),
    ("sampling", ("envace_jax.sampling",)),
    ("rl", ("envace_jax.rl",)),
    ("eval", ("envace_jax.eval",)),
    ("demo", ("envace_jax.demo",)),
    ("aot", ("envace_jax.aot",)),
    ("launch", ("launch", "benchmarks")),
]
ACCELERATOR_LIBS = ("jax", "flax", "optax", "orbax", "jaxlib")
# Compatibility re-exports left where a module used to live; each may import its new home only.
SHIMS = {"envace_jax.rl.rehearsal": "envace_jax.eval.rehearsal"}


def _layer(module: str) -> int | None:
    best = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                best = rank
    return best


def _modules() -> dict[str, str]:
    """module name -> file, for the package, launch/ and benchmarks/."""
    out = {}
    for top in ("envace_jax", "launch", "benchmarks"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
                    out[rel[:-len(".__init__")] if rel.endswith(".__init__") and rel != "envace_jax.__init__"
                        else rel] = os.path.join(dirpath, f)
    return out


def _imports(path: str, module: str, known: set[str]) -> set[str]:
    """Absolute names of what ``path`` imports (``from a import b`` gives ``a.b`` when that is a module)."""
    launch_scripts = {m.split(".")[-1] for m in known if m.startswith("launch.")}
    out = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import: resolve against this module's package
                package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for n in names:
            out.add(f"launch.{n}" if n.split(".")[0] in launch_scripts else n)
    return out


def test_no_module_imports_from_a_layer_above_it():
    mods = _modules()
    known = set(mods)
    unplaced = sorted(m for m in mods if _layer(m) is None)
    assert not unplaced, f"modules with no layer in LAYERS: {unplaced}"
    bad = []
    for m, path in sorted(mods.items()):
        own = _layer(m)
        for dep in sorted(_imports(path, m, known)):
            if SHIMS.get(m) == dep:
                continue
            if dep.split(".")[0] in ACCELERATOR_LIBS and LAYERS[own][0] == "host":
                bad.append(f"{m} imports {dep}: the host layer (chat, envs, data, config) never imports jax/flax")
            rank = _layer(dep)
            if rank is not None and rank > own:
                bad.append(f"{m} ({LAYERS[own][0]}) imports {dep} ({LAYERS[rank][0]})")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_the_checker_sees_an_upward_import(tmp_path):
    # The rule must be able to fail: an rl module importing eval, and a data module importing jax.
    up = tmp_path / "up.py"
    up.write_text("def f():\n    from envace_jax.eval import results\n    import jax.numpy as jnp\n")
    deps = _imports(str(up), "envace_jax.rl.up", set(_modules()))
    assert "envace_jax.eval.results" in deps and "jax.numpy" in deps
    assert _layer("envace_jax.eval.results") > _layer("envace_jax.rl.up") > _layer("envace_jax.data.records")
