"""The package's layers (docs/architecture.md "Layers"): every import of one of our modules by another, lazy ones
and ``import_module("mgrpo_verl....")`` strings included, goes to the same or a lower layer, so there is no
circle; and no module imports another module's underscored name. Read from the source (AST), nothing imported.

Run ``python -m pytest tests/contract/test_layers.py -q`` to check; the failure names the file, the line and the
import."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mgrpo_verl"

#: Top-level parts of the package, lowest layer first. A part may import its own layer or a lower one.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("algorithms", "models", "platform", "progress", "rowmeta", "user_code"),
    ("__init__", "config", "envs", "testing"),
    ("hf_rollout", "vllm_rollout", "store"),
    ("agent_loops",),
    ("trainer",),
    ("warmstart",),
    ("plugin", "launcher", "main_ppo", "experiments", "demo", "viewer"),
)
LAYER = {part: i for i, parts in enumerate(LAYERS) for part in parts}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _resolve(name: str) -> str | None:
    """The longest prefix of ``name`` that is one of our modules."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path):
    """(line, imported module, imported names) of every import in ``path``, relative ones resolved, and of every
    ``import_module`` / ``when_imported`` string literal naming one of our modules."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".")
                keep = len(here) - node.level + (1 if is_package else 0)
                base = ".".join(here[:keep] + ([base] if base else []))
            for alias in node.names:  # ``from pkg import module`` imports a module, else a name
                full = f"{base}.{alias.name}"
                yield (node.lineno, full, ()) if full in MODULES else (node.lineno, base, (alias.name,))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            value = node.args[0].value
            if func in ("import_module", "when_imported") and isinstance(value, str) and value.startswith("mgrpo_verl"):
                yield node.lineno, value, ()


def _edges():
    for module, path in sorted(MODULES.items()):
        for line, target, names in _imports(module, path):
            resolved = _resolve(target) if target.startswith("mgrpo_verl") else None
            if resolved is not None and resolved != module:
                yield module, path, line, resolved, names


def test_every_part_has_a_layer():
    parts = {_part(m) for m in MODULES}
    assert parts <= set(LAYER), f"parts without a layer in LAYERS: {sorted(parts - set(LAYER))}"


def test_no_import_goes_up_a_layer():
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line}: {module} (layer {LAYER[_part(module)]}) imports {target} "
           f"(layer {LAYER[_part(target)]})"
           for module, path, line, target, _ in _edges() if LAYER[_part(target)] > LAYER[_part(module)]]
    assert not bad, "imports that go up a layer:\n" + "\n".join(bad)


def test_no_module_imports_another_modules_private_name():
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line}: {module} imports {target}.{name}"
           for module, path, line, target, names in _edges() for name in names
           if name.startswith("_") and not name.startswith("__")]
    assert not bad, "private names imported across modules (make them public where they are used):\n" + "\n".join(bad)


def test_no_import_circle_between_modules():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, _, _, target, _ in _edges():
        if not module.startswith(target + "."):  # a package's submodule reading its own package __init__
            graph[module].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_the_scan_sees_lazy_imports_and_module_strings():
    """The scan is not blind: the plugin's hooks name the trainer and the loops by string, and per_agent imports
    the decoupled trainer's package lazily nowhere (decoupled imports per_agent)."""
    edges = {(m, t) for m, _, _, t, _ in _edges()}
    assert ("mgrpo_verl.plugin", "mgrpo_verl.trainer.per_agent") in edges
    assert ("mgrpo_verl.trainer.decoupled", "mgrpo_verl.trainer.per_agent") in edges
    assert ("mgrpo_verl.trainer.per_agent", "mgrpo_verl.trainer.decoupled") not in edges
