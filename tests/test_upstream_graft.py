"""benchmarks/upstream_graft.py on the CPU: a later release's NVFP4 emulation files from the
tests' mirror (real sdists), every vLLM name they import found in the pin's tree (or in the
other grafted file), a grafted tree, bench_nvfp4_moe.py's upstream column named by it, and bad
input (one line, exit 2, nothing written)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import REPO, STOPPED, to_closed_pipe
from vllm_install import Pristine
from vllm_patchset.overlay.upstream import Mirror

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_nvfp4_moe as bench
import upstream_graft as graft

EXPERTS, E2M1 = graft.EXPERTS, graft.E2M1
SHA256 = {  # the releases' own files (0.33.0's experts module differs in docstrings only)
    "0.25.0": {
        EXPERTS: "f24467762b60702f0df122ed64786be839a838a9b6cafaecbd04d35fbfedb189",
        E2M1: "539e0e57d0a94c0a0f8facbeb1cd2212c1da7bc44e51f1241cf8665a5e24f423",
    },
    "0.33.0": {
        EXPERTS: "c7068ff662eeba5f39b6bb638237a2e30b8a14748c4d7eefa2f458d1fb1460ee",
        E2M1: "b9208fdc99be5182c96fefeac24c65eb9b95544ff85ebed97c4646948ba50966",
    },
}
# (module, name) pairs of vLLM the two files import, each found: per release.
IMPORTED = {"0.25.0": 21, "0.33.0": 22}


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def staging_left(folder: Path) -> list[str]:
    """What a run staged beside its output and did not move in or remove (.<out>.*)."""
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("release", SHA256)
def test_files_of_a_release(mirror: Mirror, tmp_path: Path, release: str) -> None:
    out = tmp_path / "graft"
    graft.write_files(graft.release_files(mirror, release), release, out)
    note = json.loads((out / graft.NOTE).read_text())
    assert note == {"release": release, "files": SHA256[release]}
    digests = {p: hashlib.sha256((out / p).read_bytes()).hexdigest() for p in graft.GRAFTED}
    assert digests == SHA256[release]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # as mkdir makes a folder
    files = [p for p in listing(out) if (out / p).is_file()]
    assert files == sorted([graft.NOTE, *graft.GRAFTED])
    assert staging_left(tmp_path) == []


def test_files_command(
    mirror: Mirror,
    cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`files` as a user runs it, on the project's mirror (here the tests'): the line naming
    what it wrote; a release without the fused kernel: one line, exit 2, nothing written."""
    monkeypatch.setenv("VLLM_PATCHSET_CACHE", str(cache_dir))
    out = tmp_path / "graft"
    assert graft.main(["files", "0.25.0", "--out", str(out)]) == 0
    assert capsys.readouterr() == (f"{out}: vLLM 0.25.0's {EXPERTS}, {E2M1}\n", "")
    assert json.loads((out / graft.NOTE).read_text())["files"] == SHA256["0.25.0"]
    before = listing(tmp_path)
    assert graft.main(["files", "0.24.0", "--out", str(tmp_path / "old")]) == 2
    message = (
        "vLLM 0.24.0's NVFP4 emulation has no fused kernel (fused_moe_nvfp4_emulation_kernel,"
        " from 0.25.0 on): the pristine column measures that emulation"
    )
    assert capsys.readouterr() == ("", f"upstream_graft: {message}\n")
    assert listing(tmp_path) == before


# -- the grafted files on the pin's modules --------------------------------------------------------
def defined_names(source: str) -> set[str]:
    """The names a module binds at its top level (inside top-level if/try blocks too)."""
    names: set[str] = set()
    todo: list[ast.stmt] = list(ast.parse(source).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            todo += node.body + node.orelse + getattr(node, "finalbody", [])
            todo += [s for h in getattr(node, "handlers", []) for s in h.body]
    return names


def unresolved(files: dict[str, bytes], pin: Path) -> tuple[list[tuple[str, str, str]], int]:
    """Every ``from vllm... import name`` and ``import vllm...`` of the files (lazy ones in
    functions too) that neither the pin's tree nor the other grafted file defines, and how
    many names were looked up."""

    def source(module: str) -> str | None:
        base = module.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if path in files:
                return files[path].decode()
            if (pin / path).is_file():
                return (pin / path).read_text()
        return None

    missing, looked = [], 0
    for path, data in files.items():
        for node in ast.walk(ast.parse(data)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
                module = str(node.module)
                found = source(module)
                for alias in node.names:
                    looked += 1
                    if found is None or (
                        alias.name not in defined_names(found)
                        and source(f"{module}.{alias.name}") is None
                    ):
                        missing.append((path, module, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("vllm"):
                        looked += 1
                        if source(alias.name) is None:
                            missing.append((path, alias.name, ""))
    return missing, looked


@pytest.mark.parametrize("release", SHA256)
def test_grafted_imports_are_the_pins(
    mirror: Mirror, full_pristine: Pristine, release: str
) -> None:
    missing, looked = unresolved(graft.release_files(mirror, release), full_pristine.root)
    assert (missing, looked) == ([], IMPORTED[release])


def e2m1_parameters(source: str) -> list[str]:
    tree = ast.parse(source)
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_e2m1_inline"]
    return [a.arg for a in found[0].args.args]


def test_the_e2m1_helper_comes_along(mirror: Mirror, full_pristine: Pristine) -> None:
    """Why the helpers' file is grafted with the experts module: the pin's _e2m1_inline decodes
    a magnitude (its callers apply the sign), 0.25.0's a whole nibble, sign included, and the
    fused kernel calls it on nibbles."""
    files = graft.release_files(mirror, "0.25.0")
    assert e2m1_parameters((full_pristine.root / E2M1).read_text()) == ["magnitude"]
    assert e2m1_parameters(files[E2M1].decode()) == ["nibble"]
    assert b"_e2m1_inline(low_nibble)" in files[EXPERTS]


# -- the grafted tree, and the benchmark's column ----------------------------------------------------
VERSION = 'version = __version__ = "0.24.0"\n'


def pristine_tree(root: Path) -> Path:
    """A tree as the GPU host's: the pin's files, a compiled extension linked in, bytecode."""
    for path, text in ((EXPERTS, "pin experts"), (E2M1, "pin e2m1"), ("vllm/_version.py", VERSION)):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "vllm" / "_C.abi3.so").symlink_to("/kit/vllm/_C.abi3.so")
    for path in (EXPERTS, "vllm/model_executor/layers/fused_moe/experts/other.py"):
        cached = root / Path(path).parent / "__pycache__" / f"{Path(path).stem}.cpython-312.pyc"
        cached.parent.mkdir(exist_ok=True)
        cached.write_bytes(b"pyc")
    return root


def graft_folder(root: Path) -> Path:
    graft.write_files({EXPERTS: b"0.25.0 experts", E2M1: b"0.25.0 e2m1"}, "0.25.0", root)
    return root


def test_grafted_tree(tmp_path: Path) -> None:
    pristine = pristine_tree(tmp_path / "pristine")
    out = tmp_path / "grafted"
    label = graft.graft_tree(graft_folder(tmp_path / "graft"), pristine, out)
    assert label == "0.25.0's NVFP4 emulation on 0.24.0"
    assert (out / EXPERTS).read_bytes() == b"0.25.0 experts"
    assert (out / E2M1).read_bytes() == b"0.25.0 e2m1"
    assert (out / "vllm" / "_C.abi3.so").readlink() == Path("/kit/vllm/_C.abi3.so")
    replaced = str(Path(EXPERTS).parent / "__pycache__" / "nvfp4_emulation_moe.cpython-312.pyc")
    assert listing(out) == sorted([p for p in listing(pristine) if p != replaced] + [graft.NOTE])
    note = json.loads((out / graft.NOTE).read_text())
    assert note == {"release": "0.25.0", "files": note["files"], "on": "0.24.0"}
    assert (graft.grafted_release(out), graft.grafted_release(pristine)) == ("0.25.0", None)
    assert staging_left(tmp_path) == []


def test_the_upstream_column_names_the_graft(tmp_path: Path) -> None:
    out = tmp_path / "grafted"
    graft.graft_tree(graft_folder(tmp_path / "graft"), pristine_tree(tmp_path / "p"), out)
    argv = ["--upstream", str(out), "--upstream", str(tmp_path / "p"), "--columns", "upstream"]
    args = bench.parse_args(argv)
    trees = bench.trees_of(args)
    assert trees == [bench.Tree("upstream", out, "0.25.0"), bench.Tree("upstream", tmp_path / "p")]
    label = "0.25.0's NVFP4 emulation on 0.24.0 (upstream)"
    assert trees[0].by_column("0.24.0") == {"upstream": (label, "emulation")}
    assert bench.column_of_label(label) == "upstream"


def test_the_upstream_column_refuses_a_bad_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A grafted tree whose note is damaged, or a folder with no vLLM: the benchmark's usage
    error (one line, exit 2) before any worker starts."""
    out = tmp_path / "grafted"
    graft.graft_tree(graft_folder(tmp_path / "graft"), pristine_tree(tmp_path / "p"), out)
    (out / graft.NOTE).write_text("{}")
    for tree, message in (
        (out, f"{out / graft.NOTE}: not a graft's note (release, files)"),
        (tmp_path, f"{tmp_path}: no vLLM tree ([Errno 2] No such file or directory:"
                   f" '{tmp_path / 'vllm' / '_version.py'}')"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as ended:
            bench.parse_args(["--upstream", str(tree), "--columns", "upstream"])
        assert ended.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: {message}")


# -- bad input -------------------------------------------------------------------------------------
def edited(tmp: Path) -> tuple[list[str], str]:
    folder = graft_folder(tmp / "graft")
    (folder / EXPERTS).write_bytes(b"edited")
    return graft_args(tmp), f"{folder / EXPERTS}: its sha256 is not the note's (edited?)"


def no_note(tmp: Path) -> tuple[list[str], str]:
    (graft_folder(tmp / "graft") / graft.NOTE).unlink()
    path = tmp / "graft" / graft.NOTE
    return graft_args(tmp), (
        f"{tmp / 'graft'}: no readable {graft.NOTE} ([Errno 2] No such file or directory: '{path}')"
    )


def note_a_list(tmp: Path) -> tuple[list[str], str]:
    (graft_folder(tmp / "graft") / graft.NOTE).write_text("[]")
    return graft_args(tmp), f"{tmp / 'graft' / graft.NOTE}: not a graft's note (release, files)"


def note_of_other_files(tmp: Path) -> tuple[list[str], str]:
    note = tmp / "graft" / graft.NOTE
    graft_folder(tmp / "graft")
    note.write_text(json.dumps({"release": "0.25.0", "files": {EXPERTS: "0" * 64}}))
    return graft_args(tmp), f"{note}: files {[EXPERTS]}, not {sorted(graft.GRAFTED)}"


def out_exists(tmp: Path) -> tuple[list[str], str]:
    graft_folder(tmp / "graft")
    (tmp / "out").mkdir()
    return graft_args(tmp), f"{tmp / 'out'} exists: name a new folder"


def out_in_no_folder(tmp: Path) -> tuple[list[str], str]:
    graft_folder(tmp / "graft")
    argv = graft_args(tmp)
    argv[-1] = str(tmp / "nowhere" / "out")
    return argv, f"{tmp / 'nowhere'}: no such folder"


def not_a_tree(tmp: Path) -> tuple[list[str], str]:
    graft_folder(tmp / "graft")
    shutil.rmtree(tmp / "pristine")
    (tmp / "pristine").mkdir()
    path = tmp / "pristine" / "vllm" / "_version.py"
    return graft_args(tmp), (
        f"{tmp / 'pristine'}: no vLLM tree ([Errno 2] No such file or directory: '{path}')"
    )


def linked_file(tmp: Path) -> tuple[list[str], str]:
    """The file a graft replaces is a link in the pristine tree (the copy keeps links): writing
    through it would change the file it points to."""
    graft_folder(tmp / "graft")
    (tmp / "elsewhere.py").write_text("not to be written")
    (tmp / "pristine" / EXPERTS).unlink()
    (tmp / "pristine" / EXPERTS).symlink_to(tmp / "elsewhere.py")
    return graft_args(tmp), f"{tmp / 'pristine'}: {EXPERTS} is reached through a link ({EXPERTS})"


def linked_folder(tmp: Path) -> tuple[list[str], str]:
    graft_folder(tmp / "graft")
    layers = tmp / "pristine" / "vllm" / "model_executor" / "layers"
    layers.rename(tmp / "layers")
    layers.symlink_to(tmp / "layers")
    return graft_args(tmp), (
        f"{tmp / 'pristine'}: {EXPERTS} is reached through a link (vllm/model_executor/layers)"
    )


def graft_args(tmp: Path) -> list[str]:
    return [
        "tree",
        str(tmp / "graft"),
        "--pristine",
        str(tmp / "pristine"),
        "--out",
        str(tmp / "out"),
    ]


BAD = [
    edited,
    no_note,
    note_a_list,
    note_of_other_files,
    out_exists,
    out_in_no_folder,
    not_a_tree,
    linked_file,
    linked_folder,
]


@pytest.mark.parametrize("make", BAD)
def test_bad_input(
    make: Callable[[Path], tuple[list[str], str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pristine_tree(tmp_path / "pristine")
    argv, message = make(tmp_path)
    before = listing(tmp_path)
    assert graft.main(argv) == 2
    assert capsys.readouterr() == ("", f"upstream_graft: {message}\n")
    assert listing(tmp_path) == before


@pytest.mark.parametrize(("signum", "code"), STOPPED)
def test_interrupted(
    signum: int,
    code: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ctrl-C or kill while the tree is copied (the signal sent to this process): one line,
    exit 130 or 143, nothing left of the copy, the handlers as they were."""
    pristine_tree(tmp_path / "pristine")
    graft_folder(tmp_path / "graft")
    before = listing(tmp_path)
    handlers = [signal.getsignal(s) for s, _ in STOPPED]
    real_copy = shutil.copytree

    def stopped(*args: Any, **kwargs: Any) -> None:
        real_copy(*args, **kwargs)  # the copy begun, then the signal
        os.kill(os.getpid(), signum)

    monkeypatch.setattr(graft.shutil, "copytree", stopped)
    assert graft.main(graft_args(tmp_path)) == code
    assert capsys.readouterr() == ("", "upstream_graft: interrupted: nothing written\n")
    assert listing(tmp_path) == before
    assert [signal.getsignal(s) for s, _ in STOPPED] == handlers


def test_reader_gone(tmp_path: Path) -> None:
    """The output's reader gone before the line is printed (`| head -0`): exit 141, no
    traceback, the tree written whole."""
    pristine_tree(tmp_path / "pristine")
    graft_folder(tmp_path / "graft")
    script = REPO / "benchmarks" / "upstream_graft.py"
    argv = [sys.executable, str(script), *graft_args(tmp_path)]
    assert to_closed_pipe(argv) == (128 + signal.SIGPIPE, "")
    assert graft.grafted_release(tmp_path / "out") == "0.25.0"
    assert (tmp_path / "out" / EXPERTS).read_bytes() == b"0.25.0 experts"
