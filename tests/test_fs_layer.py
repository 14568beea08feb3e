"""The file-system layer (`infra/fsio/`) is the only writer and the only starter of children:
an `ast` scan of the package finds every call of a write API (the table below) and every
start of a child process, and only the layer makes them. `gpu/kitparts.py`, `gpu/gpurun.py`
and `infra/archives.py` travel alone to GPU hosts (the bundle carries them without the
package) and keep their own standard-library code: they say so at their top."""

from __future__ import annotations

import ast

import pytest
from support import REPO

PACKAGE = REPO / "scripts" / "vllm_patchset"
LAYER = "infra/fsio/"
TRAVEL_ALONE = ("gpu/kitparts.py", "gpu/gpurun.py", "infra/archives.py")

# `module.name(...)` calls that write, rename or remove (or make a temp file or dir).
WRITE_CALLS = {
    "os": {
        "replace", "rename", "renames", "link", "symlink", "unlink", "remove", "rmdir",
        "removedirs", "mkdir", "makedirs", "chmod", "lchmod", "fchmod", "chown", "lchown",
        "fchown", "truncate", "ftruncate", "mkfifo", "mknod", "utime",
    },
    "shutil": {
        "copy", "copy2", "copyfile", "copyfileobj", "copytree", "copymode", "copystat",
        "move", "rmtree", "chown",
    },
    "tempfile": {
        "mkstemp", "mkdtemp", "TemporaryDirectory", "NamedTemporaryFile", "TemporaryFile",
        "SpooledTemporaryFile",
    },
}  # fmt: skip
# `anything.name(...)`: the pathlib methods that write (`.replace` with one argument: a
# `str.replace` takes two).
PATH_WRITE_METHODS = {
    "write_text", "write_bytes", "rename", "unlink", "rmdir", "mkdir", "touch", "symlink_to",
    "hardlink_to", "chmod", "lchmod",
}  # fmt: skip
# Openers that write when the mode says so (`open`, `Path.open`, `io.open` and the
# compressors and archives given a path rather than a stream already open).
STREAM_OPENERS = {("lzma", "open"), ("gzip", "open"), ("bz2", "open"), ("tarfile", "open"),
                  ("zipfile", "ZipFile")}  # fmt: skip
WRITE_MODE = set("wax+")
WRITE_FLAGS = {"O_CREAT", "O_TRUNC", "O_APPEND"}  # os.open flags that make or change a file
# What starts a child process.
CHILD_CALLS = {
    "subprocess": {"run", "Popen", "call", "check_call", "check_output", "getoutput",
                   "getstatusoutput"},
    "os": {"system", "popen", "fork", "forkpty", "execv", "execve", "execvp", "execvpe",
           "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
           "spawnl", "spawnle", "spawnlp", "spawnlpe", "posix_spawn", "posix_spawnp"},
    "pty": {"spawn"},
    "multiprocessing": {"Process"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
}  # fmt: skip
# Receivers that are modules (`fsio.touch` is the layer's, not a `Path.touch`).
MODULES = {*WRITE_CALLS, *CHILD_CALLS, *(m for m, _ in STREAM_OPENERS), "io", "dataclasses", "fsio"}


def _mode(call: ast.Call, position: int) -> str:
    """The mode literal of an opener (positional at `position`, or `mode=`), "" if none."""
    node = call.args[position] if len(call.args) > position else None
    for keyword in call.keywords:
        if keyword.arg == "mode":
            node = keyword.value
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


def _flags(node: ast.expr) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)} | {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name)
    }


class Scan(ast.NodeVisitor):
    """The write calls and child starts of one module, as (line, what)."""

    def __init__(self) -> None:
        self.writes: list[tuple[int, str]] = []
        self.children: list[tuple[int, str]] = []
        self.imported: dict[str, tuple[str, str]] = {}  # `from os import replace as r`
        self.streams: set[str] = set()  # names bound to a stream already open

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            self.imported[alias.asname or alias.name] = (node.module or "", alias.name)

    def visit_withitem(self, node: ast.withitem) -> None:
        if isinstance(node.optional_vars, ast.Name):
            self.streams.add(node.optional_vars.id)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Call) and _qualified(node.value.func, {}) == (
            "io",
            "BytesIO",
        ):
            self.streams.update(t.id for t in node.targets if isinstance(t, ast.Name))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        name = _qualified(node.func, self.imported)
        module, attr = name
        what = {"": attr, "?": f".{attr}"}.get(module, f"{module}.{attr}")
        if attr in CHILD_CALLS.get(module, ()):
            self.children.append((node.lineno, what))
        elif self._writes(node, module, attr):
            self.writes.append((node.lineno, what))

    def _writes(self, node: ast.Call, module: str, attr: str) -> bool:
        if attr in WRITE_CALLS.get(module, ()):
            return True
        if (module, attr) == ("os", "open"):
            return len(node.args) > 1 and bool(_flags(node.args[1]) & WRITE_FLAGS)
        if (module, attr) in (("", "open"), ("io", "open")):
            return bool(set(_mode(node, 1)) & WRITE_MODE)
        if (module, attr) in STREAM_OPENERS:
            target = node.args[0] if node.args else None
            if isinstance(target, ast.Call) and _qualified(target.func, {})[1] == "cast":
                target = target.args[1]
            stream = any(k.arg == "fileobj" for k in node.keywords) or (
                isinstance(target, ast.Name) and target.id in self.streams
            )
            return not stream and bool(set(_mode(node, 1)) & WRITE_MODE)
        if module == "?" and attr == "open":  # Path.open(mode)
            return bool(set(_mode(node, 0)) & WRITE_MODE)
        if module == "?" and attr == "replace":  # Path.replace(target); str.replace has two
            return len(node.args) == 1 and not node.keywords
        return module == "?" and attr in PATH_WRITE_METHODS


def _qualified(func: ast.expr, imported: dict[str, tuple[str, str]]) -> tuple[str, str]:
    """("os", "replace") for `os.replace`, ("", "open") for `open`, ("?", "unlink") for a
    method of some object (`path.unlink`)."""
    if isinstance(func, ast.Name):
        return imported.get(func.id, ("", func.id))
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id in MODULES:
            return func.value.id, func.attr
        return "?", func.attr
    return "?", ""


def scan(source: str) -> Scan:
    found = Scan()
    found.visit(ast.parse(source))
    return found


def modules() -> dict[str, str]:
    return {
        path.relative_to(PACKAGE).as_posix(): path.read_text("utf-8")
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def outside_the_layer(kind: str) -> list[str]:
    return [
        f"{rel}:{line}: {what}"
        for rel, source in modules().items()
        if not rel.startswith(LAYER) and rel not in TRAVEL_ALONE
        for line, what in getattr(scan(source), kind)
    ]


# The scanner itself, on one line each: what it must see, and what it must let pass.
SCAN_CASES = [
    ("os.replace(a, b)", ["os.replace"]),
    ("path.rename(other)", [".rename"]),
    ("path.replace(other)", [".replace"]),
    ("text.replace('a', 'b')", []),
    ("dataclasses.replace(state, phase='done')", []),
    ("path.write_text('x', encoding='utf-8')", [".write_text"]),
    ("shutil.rmtree(path, ignore_errors=True)", ["shutil.rmtree"]),
    ("from shutil import copy2 as c\nc(a, b)", ["shutil.copy2"]),
    ("tempfile.TemporaryDirectory(prefix='x')", ["tempfile.TemporaryDirectory"]),
    ("open(path, 'wb')", ["open"]),
    ("open(path)", []),
    ("path.open('a', encoding='utf-8')", [".open"]),
    ("path.open()", []),
    ("os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)", ["os.open"]),
    ("os.open(os.devnull, os.O_WRONLY)", []),
    ("lzma.open(partial, 'wb')", ["lzma.open"]),
    ("with fsio.writing(partial) as raw, lzma.open(raw, 'wb') as xz: pass", []),
    ("tarfile.open(fileobj=xz, mode='w')", []),
    ("buffer = io.BytesIO()\nzipfile.ZipFile(buffer, 'w')", []),
    ("zipfile.ZipFile(path, 'w')", ["zipfile.ZipFile"]),
    ("tarfile.open(sdist, 'r:gz')", []),
]
CHILD_CASES = [
    ("subprocess.run(argv, capture_output=True)", ["subprocess.run"]),
    ("from subprocess import Popen\nPopen(argv)", ["subprocess.Popen"]),
    ("os.execvp(argv[0], argv)", ["os.execvp"]),
    ("fsio.run_child(argv, capture_output=True)", []),
]


@pytest.mark.parametrize(("source", "expected"), SCAN_CASES)
def test_the_scan_sees_each_write_api(source: str, expected: list[str]) -> None:
    assert [what for _, what in scan(source).writes] == expected


@pytest.mark.parametrize(("source", "expected"), CHILD_CASES)
def test_the_scan_sees_each_child_start(source: str, expected: list[str]) -> None:
    assert [what for _, what in scan(source).children] == expected


def test_only_the_layer_writes() -> None:
    """Before: 76 write calls in 11 modules outside fsio.py (by this scan; the swap's renames
    among them, which the kill tests therefore missed)."""
    assert outside_the_layer("writes") == []


def test_only_the_layer_starts_children() -> None:
    """Before: bundle.py ran pip without `fsio.child` (it outlived a killed run); validate.py
    and installed.py ran their own `subprocess.run` around `fsio.child`."""
    assert outside_the_layer("children") == []


def test_git_children_get_the_layers_command_line() -> None:
    """gitrepo.py hands GitPython the command line `fsio.child` makes: each function that
    calls `.execute(` calls `child(` too."""
    tree = ast.parse((PACKAGE / "infra" / "gitrepo.py").read_text("utf-8"))
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef):
            calls = {
                _qualified(c.func, {})[1] for c in ast.walk(function) if isinstance(c, ast.Call)
            }
            assert "execute" not in calls or "child" in calls, function.name


def test_the_modules_that_travel_alone_say_so() -> None:
    for rel in TRAVEL_ALONE:
        doc = ast.get_docstring(ast.parse((PACKAGE / rel).read_text("utf-8"))) or ""
        assert "infra/fsio/" in doc and "travel" in doc, rel
