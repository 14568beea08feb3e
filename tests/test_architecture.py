"""The structural claims of ARCHITECTURE.md, checked against the code: the layers of the
package go one way, no import cycle, one module imports git, every module is small and plain
(radon's measures under fixed thresholds) and has its test home.

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


# -- size and complexity ---------------------------------------------------------------------------
# Every module of the package: at most MAX_LINES lines and a maintainability index (radon mi,
# multi-line strings counted as comments) of at least MIN_INDEX; every function and method: a
# cyclomatic complexity (radon cc) of at most MAX_COMPLEXITY and at most MAX_FUNCTION_LINES
# lines from its `def` to its last line.
MAX_LINES = 500
MIN_INDEX = 20.0
MAX_COMPLEXITY = 15
MAX_FUNCTION_LINES = 60


def over_thresholds(name: str, text: str) -> list[str]:
    """What of module `name` (its source `text`) is over the thresholds, one line each."""
    from radon.complexity import cc_visit
    from radon.metrics import mi_visit

    found = []
    lines = len(text.splitlines())
    if lines > MAX_LINES:
        found.append(f"{name}: {lines} lines (at most {MAX_LINES})")
    index = mi_visit(text, multi=True)
    if index < MIN_INDEX:
        found.append(f"{name}: maintainability index {index:.1f} (at least {MIN_INDEX:.0f})")
    found += [
        f"{name}.{block.fullname}: complexity {block.complexity} (at most {MAX_COMPLEXITY})"
        for block in cc_visit(text)
        if block.complexity > MAX_COMPLEXITY
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(
                    f"{name}.{node.name} (line {node.lineno}): {length} lines"
                    f" (at most {MAX_FUNCTION_LINES})"
                )
    return found


def test_modules_under_the_thresholds() -> None:
    found = [
        line for name, path in modules().items() for line in over_thresholds(name, path.read_text())
    ]
    assert found == []


def test_the_thresholds_catch_what_they_name() -> None:
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(16))
    long_body = "".join(f"    y{i} = {i}\n" for i in range(60))
    text = f"def branchy(x):\n{branches}    return -1\n\n\ndef long():\n{long_body}"
    assert over_thresholds("m", text) == [
        "m.branchy: complexity 17 (at most 15)",
        "m.long (line 37): 61 lines (at most 60)",
    ]
    assert over_thresholds("m", "x = 1\n" * 501)[0] == "m: 501 lines (at most 500)"


# -- test homes ------------------------------------------------------------------------------------
TESTS = Path(__file__).resolve().parent
# The package folder gpu/ has its tests in tests/gpu_jobs/: tests/gpu/ is the GPU suite, which
# travels whole to GPU hosts.
TEST_FOLDERS = {"gpu": "gpu_jobs"}


def home_of(name: str) -> Path:
    """Where the tests of module `name` live: tests/<folder>/test_<module>.py (a root module's:
    tests/test_<module>.py)."""
    *folders, module = name.split(".")[1:]
    if folders:
        folders[0] = TEST_FOLDERS.get(folders[0], folders[0])
    return TESTS.joinpath(*folders, f"test_{module}.py")


def test_every_module_has_a_test_home_that_imports_it() -> None:
    """Each module of the package (but `__init__` and `__main__`) has its test home, and the
    home imports the module: its tests call it."""
    missing = []
    for name, path in modules().items():
        if path.stem in ("__init__", "__main__"):
            continue
        home = home_of(name)
        where = home.relative_to(TESTS.parent)
        if not home.is_file():
            missing.append(f"{name}: no {where}")
            continue
        tree = ast.parse(home.read_text(), str(home))
        named = {
            f"{node.module}.{alias.name}" if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        } | {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
        }
        if name not in named and not any(n.startswith(f"{name}.") for n in named):
            missing.append(f"{name}: {where} does not import it")
    assert missing == []


def test_test_homes_of_a_folder_and_a_root_module() -> None:
    assert home_of("vllm_patchset.sync.rebase") == TESTS / "sync" / "test_rebase.py"
    assert home_of("vllm_patchset.infra.fsio.paths") == TESTS / "infra" / "fsio" / "test_paths.py"
    assert home_of("vllm_patchset.gpu.bundle") == TESTS / "gpu_jobs" / "test_bundle.py"
    assert home_of("vllm_patchset.cli") == TESTS / "test_cli.py"
