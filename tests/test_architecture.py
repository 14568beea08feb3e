"""The structural claims of ARCHITECTURE.md, checked against the code: the layers of the
package go one way, no import cycle, and one module imports git.

The imports are read from the source with `ast` (every `import` and `from … import`, those
inside functions too), so a lazy import is held to the same rule as one at the top."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "scripts" / "vllm_patchset"

# Layers, bottom to top: a module may import its own layer's modules within its own
# subpackage, and any module of a lower layer; never a higher layer, never a sibling
# subpackage of its own layer (sync, deploy and gpu know nothing of each other).
LAYERS: dict[str, int] = {
    "__init__": 0,
    "errors": 0,
    "versions": 0,
    "console": 0,
    "registry": 0,
    "infra": 1,
    "series": 2,
    "overlay": 3,
    "sync": 4,
    "deploy": 4,
    "gpu": 4,
    "commands": 5,
    "cli": 6,
    "__main__": 7,
}
# The one module that imports GitPython (`git`): the git boundary.
GIT_BOUNDARY = "vllm_patchset.infra.gitrepo"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@cache
def imports(path: Path, *, top_level_only: bool = False) -> frozenset[str]:
    """Absolute names of what `path` imports (`from a import b` gives `a.b` where `a.b` is a
    module of the package, else `a`)."""
    known = modules()
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
    return frozenset(found)


def component(module: str) -> str:
    """The layer's key: the subpackage, or the root module's own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_module_has_a_layer() -> None:
    assert sorted({component(m) for m in modules()} - set(LAYERS)) == []


def test_no_upward_or_sideways_import() -> None:
    wrong = []
    for name, path in modules().items():
        own = component(name)
        for target in sorted(imports(path)):
            if target.split(".")[0] != "vllm_patchset" or target == "vllm_patchset":
                continue
            other = component(target)
            if LAYERS[other] > LAYERS[own] or (LAYERS[other] == LAYERS[own] and other != own):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_no_import_cycle_at_module_level() -> None:
    known = modules()
    graph = {
        name: {t for t in imports(path, top_level_only=True) if t in known and t != name}
        for name, path in known.items()
    }
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[str] = []

    def visit(node: str, trail: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                cycles.append(" -> ".join([*trail[trail.index(nxt) :], nxt]))
            elif nxt not in seen:
                visit(nxt, [*trail, nxt])
        seen[node] = 2

    for name in sorted(graph):
        if name not in seen:
            visit(name, [name])
    assert cycles == []


def test_only_the_git_boundary_imports_git() -> None:
    importers = sorted(
        name
        for name, path in modules().items()
        if any(t == "git" or t.startswith("git.") for t in imports(path))
    )
    assert importers == [GIT_BOUNDARY]
