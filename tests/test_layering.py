"""The packages' dependencies point down only (docs/architecture.md, "Layers"):

    omega (the application)  ->  simulator, schedulers  ->  cellstate

and no package imports itself round in a circle. Read from the source with ``ast``, so
an import inside a function counts as much as one at the top of a module."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cellstate", "schedulers", "simulator", "omega")

# What each layer may import of the others (its own package is always allowed).
ALLOWED = {
    "cellstate": set(),
    "schedulers": {"cellstate"},
    "simulator": {"cellstate", "schedulers"},
    "omega": {"cellstate", "schedulers", "simulator"},
}

# Policies decide from a snapshot; they never touch the store or a KV backend.
POLICY_MODULES = ("schedulers.batch", "schedulers.service", "schedulers.placement",
                  "schedulers.api")
POLICY_FORBIDDEN = ("cellstate.store", "cellstate.kv", "cellstate.api")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> Iterator[tuple[str, Path]]:
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "pb" in path.relative_to(ROOT).parts[:-1] and path.name.endswith("_pb2.py"):
                continue
            yield module_name(path), path


def imports_of(name: str, path: Path) -> set[str]:
    """Every absolute module name ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.add(mod)
            # "from pkg import sub" may name a submodule.
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def graph() -> dict[str, set[str]]:
    mods = dict(source_modules())
    known = set(mods)
    g: dict[str, set[str]] = {}
    for name, path in mods.items():
        g[name] = {m for m in imports_of(name, path) if m in known and m != name}
    return g


def test_every_layer_imports_only_the_layers_below_it() -> None:
    bad = []
    for name, deps in graph().items():
        layer = name.split(".")[0]
        for dep in deps:
            other = dep.split(".")[0]
            if other != layer and other not in ALLOWED[layer]:
                bad.append(f"{name} imports {dep}")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


@pytest.mark.parametrize("policy", POLICY_MODULES)
def test_policies_do_not_import_the_store_or_a_backend(policy: str) -> None:
    deps = graph()[policy]
    bad = sorted(d for d in deps if d.startswith(POLICY_FORBIDDEN))
    assert not bad, f"{policy} imports {bad}"


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among the modules (by depth-first search), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(g.get(n, ())):
            if state.get(d) == 1:
                return [*stack[stack.index(d):], d]
            if d not in state and (found := visit(d)) is not None:
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (found := visit(n)) is not None:
            return found
    return None


def test_no_import_cycle_between_modules() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checks_catch_what_they_are_for() -> None:
    """The cycle finder and the layer rule, on graphs known to break them."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    tree = imports_of("cellstate.x", ROOT / "cellstate" / "model.py")
    assert "schedulers.api" not in tree
