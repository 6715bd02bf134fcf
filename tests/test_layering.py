"""The import graph flows one way: no module imports from a layer above its own.

The layers, lowest first (a module may import from its own layer and from any layer before it):

    host      config/, metrics.py, host_memory.py,         plain Python: never jax, flax, optax or orbax;
              model_sizes.py, fast_defaults.py, _lazy.py
    chat      chat/                                          within the host tier chat renders and parses text,
    envs      envs/                                          envs execute tools (their schemas use chat's types),
    data      data/                                          data builds tasks and records from both
    models    models/, sharding.py, checkpoint.py, jit_maps.py
    sampling  sampling/
    rl        rl/
    eval      eval/                                          eval and demo are one tier of the design;
    demo      demo/                                          the demo uses eval's harnesses, never the reverse
    aot       aot/                                           ahead-of-time TPU compilation of a run's programs
    api       envace_jax/__init__.py                         the package's public names (lazy: see _lazy.py)
    cli       envace_jax/cli/                                the commands' mains (console scripts in pyproject.toml)
    launch    launch/ (the commands as files, pod scripts), benchmarks/

Every import statement counts, including the ones inside functions (a lazy import is still a
dependency). The graph is read from the source with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "host",
        (
            "envace_jax.config",
            "envace_jax.metrics",
            "envace_jax.host_memory",
            "envace_jax.model_sizes",
            "envace_jax.fast_defaults",
            "envace_jax._lazy",
        ),
    ),
    ("chat", ("envace_jax.chat",)),
    ("envs", ("envace_jax.envs",)),
    ("data", ("envace_jax.data",)),
    ("models", ("envace_jax.models", "envace_jax.sharding", "envace_jax.checkpoint", "envace_jax.jit_maps")),
    ("sampling", ("envace_jax.sampling",)),
    ("serve", ("envace_jax.serve",)),
    ("rl", ("envace_jax.rl",)),
    ("eval", ("envace_jax.eval",)),
    ("demo", ("envace_jax.demo",)),
    ("aot", ("envace_jax.aot",)),
    ("api", ("envace_jax.__init__",)),
    ("cli", ("envace_jax.cli",)),
    ("launch", ("launch", "benchmarks")),
]
ACCELERATOR_LIBS = ("jax", "flax", "optax", "orbax", "jaxlib")
HOST_TIER = ("host", "chat", "envs", "data")  # plain Python: never an accelerator library


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
                    out[
                        rel[: -len(".__init__")] if rel.endswith(".__init__") and rel != "envace_jax.__init__" else rel
                    ] = os.path.join(dirpath, f)
    return out


def _is_lazy_table(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)
        and isinstance(node.value, ast.Dict)
    )


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
        elif _is_lazy_table(node):  # a package __init__'s lazy re-exports: {name: home module}
            names = [v.value for v in node.value.values]
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
            if dep.split(".")[0] in ACCELERATOR_LIBS and LAYERS[own][0] in HOST_TIER:
                bad.append(f"{m} imports {dep}: the host tier (chat, envs, data, config) never imports jax/flax")
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
    # A lazy re-export table counts as importing the home module it names.
    lazy = tmp_path / "lazy.py"
    lazy.write_text('_EXPORTS = {"run_eval": "envace_jax.eval.runner"}\n')
    assert "envace_jax.eval.runner" in _imports(str(lazy), "envace_jax.rl", set(_modules()))
    assert _layer("envace_jax.eval.results") > _layer("envace_jax.rl.up") > _layer("envace_jax.data.records")
    # ... and sideways inside the host tier: chat reading data's task generator (as chat.tokenizer once did).
    assert _layer("envace_jax.data.demo_tasks") > _layer("envace_jax.chat.tokenizer")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    # A package's __init__ re-exporting its modules is not a dependency of those modules on each other.
    return {
        m: {d for d in _imports(p, m, known) if d in known and d != m and not m.startswith(d + ".")}
        for m, p in mods.items()
        if not p.endswith("__init__.py")
    }


def test_no_two_modules_import_each_other():
    # Within a layer the order is free, but a cycle (a imports b, b imports a, even lazily) means neither
    # module can be read, tested or moved without the other.
    assert _cycles(_graph()) == [], "import cycles"


def test_the_checker_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
