"""A later vLLM release's NVFP4 emulation MoE on the pin's tree: bench_nvfp4_moe.py's
``upstream`` column, the anchor a user weighs against upgrading vLLM.

    python benchmarks/upstream_graft.py files 0.25.0 --out GRAFT          # here (the mirror)
    python benchmarks/upstream_graft.py tree GRAFT --pristine TREE --out GRAFTED   # GPU host
    python benchmarks/bench_nvfp4_moe.py --overlay ... --upstream GRAFTED --columns overlay upstream

vLLM 0.25.0 added its own fused NVFP4 emulation kernel (each weight tile dequantized inside a
Triton GEMM, ``fused_moe_nvfp4_emulation_kernel``); 0.25.0 to 0.34.0 ship the same kernel (their
files differ in docstrings only). A later release's whole tree needs its own compiled ops (0.33.0
asks for torch 2.14), so the column runs that release's two files on a copy of the pin's
pristine tree, with the pin's compiled ops: the experts module and the E2M1 helpers it imports
(0.25.0's ``_e2m1_inline`` takes the sign bit, 0.24.0's does not: the experts module alone
would decode every negative weight as positive). Everything else they import is the pin's, with
the same names (tests/test_upstream_graft.py checks each import against the pin's tree), and
the oracle that lays out the emulation's weights did not change for it.

``files`` (the ``maintain`` extra: the project's upstream mirror, which downloads the release's
sdist once) writes the two files at their paths under GRAFT with ``vllm-patchset-graft.json``
(the release, each file's sha256). ``tree`` (standard library only, for the GPU host) copies
TREE (the folder holding the pin's ``vllm/``; links stay links, as the kit's compiled
extensions are linked in), puts the files in place after checking their sha256 and writes the
same note with the tree's own version; bench_nvfp4_moe.py names the column by it. Upstream code
is read at run time and never committed. Bad input: one line, exit 2, nothing written (each
output is staged beside it and moved in whole); Ctrl-C or kill (SIGTERM): one line, exit 130 or
143, nothing written; the reader of the output gone: exit 141, the output whole.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import stops

if TYPE_CHECKING:  # the maintain extra's; `tree` (the GPU host) needs the standard library only
    from vllm_patchset.overlay.upstream import Mirror

REPO = Path(__file__).resolve().parent.parent
EXPERTS = "vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py"
E2M1 = "vllm/model_executor/layers/quantization/utils/nvfp4_emulation_utils.py"
GRAFTED = (EXPERTS, E2M1)
KERNEL = "def fused_moe_nvfp4_emulation_kernel("  # the fused kernel, from 0.25.0 on
NOTE = "vllm-patchset-graft.json"


class GraftError(Exception):
    """Bad input: the message is the one line printed."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A folder beside ``out`` that becomes ``out`` when the block ends without an error, and
    is removed otherwise (an interrupt included). ``out`` must not exist."""
    if out.exists() or out.is_symlink():
        raise GraftError(f"{out} exists: name a new folder")
    if not out.parent.is_dir():
        raise GraftError(f"{out.parent}: no such folder")
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    stage.chmod(0o777 & ~umask)  # a folder as mkdir makes it (mkdtemp's is the owner's alone)
    try:
        yield stage
        os.rename(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def release_files(mirror: Mirror, release: str) -> dict[str, bytes]:
    """The grafted files of vLLM ``release`` (a PyPI release, from the project's mirror)."""
    commit = mirror.release(release).commit
    files = {}
    for path in GRAFTED:
        data = mirror.repo.read_blob(commit, path)
        if data is None:
            raise GraftError(f"vLLM {release} has no {path}")
        files[path] = data
    if KERNEL.encode() not in files[EXPERTS]:
        raise GraftError(
            f"vLLM {release}'s NVFP4 emulation has no fused kernel (fused_moe_nvfp4_emulation"
            "_kernel, from 0.25.0 on): the pristine column measures that emulation"
        )
    return files


def write_files(files: dict[str, bytes], release: str, out: Path) -> None:
    """GRAFT: the files at their paths and the note."""
    with staged(out) as stage:
        for path, data in files.items():
            (stage / path).parent.mkdir(parents=True, exist_ok=True)
            (stage / path).write_bytes(data)
        note = {"release": release, "files": {p: sha256(d) for p, d in files.items()}}
        (stage / NOTE).write_text(json.dumps(note, indent=1) + "\n")


def read_note(folder: Path) -> dict[str, Any]:
    """A graft's or a grafted tree's note, checked: a release and a sha256 per grafted file."""
    try:
        note = json.loads((folder / NOTE).read_text())
    except (OSError, ValueError) as exc:
        raise GraftError(f"{folder}: no readable {NOTE} ({exc})") from None
    files = note.get("files") if isinstance(note, dict) else None
    if not isinstance(files, dict) or not isinstance(note.get("release"), str):
        raise GraftError(f"{folder / NOTE}: not a graft's note (release, files)")
    if sorted(files) != sorted(GRAFTED):
        raise GraftError(f"{folder / NOTE}: files {sorted(files)}, not {sorted(GRAFTED)}")
    return note


def tree_version(tree: Path) -> str:
    """The version a tree's ``vllm/_version.py`` declares (bench_nvfp4_moe.py's label)."""
    scope: dict[str, object] = {}
    try:
        exec((tree / "vllm" / "_version.py").read_text(), scope)
    except (OSError, SyntaxError) as exc:
        raise GraftError(f"{tree}: no vLLM tree ({exc})") from None
    return str(scope.get("__version__") or scope.get("version"))


def graft_tree(graft: Path, pristine: Path, out: Path) -> str:
    """GRAFTED: a copy of ``pristine`` with the graft's files in place; returns its label."""
    note = read_note(graft)
    files = {}
    for path, digest in note["files"].items():
        try:
            data = (graft / path).read_bytes()
        except OSError as exc:
            raise GraftError(f"{graft}: {path} unreadable ({exc})") from None
        if sha256(data) != digest:
            raise GraftError(f"{graft / path}: its sha256 is not the note's (edited?)")
        files[path] = data
    version = tree_version(pristine)
    for path in GRAFTED:
        if not (pristine / path).is_file():
            raise GraftError(f"{pristine}: no {path} to replace")
        # The copy keeps links: writing through one would change the file it points to.
        within = [Path(path), *Path(path).parents[:-1]]  # the file, each folder above it
        linked = [p for p in within if (pristine / p).is_symlink()]
        if linked:
            raise GraftError(f"{pristine}: {path} is reached through a link ({linked[0]})")
    with staged(out) as stage:
        shutil.copytree(pristine, stage, symlinks=True, dirs_exist_ok=True)
        for path, data in files.items():
            (stage / path).write_bytes(data)
            stem = Path(path).stem  # the pin's bytecode of the file replaced
            for cached in (stage / path).parent.glob(f"__pycache__/{stem}.*.pyc"):
                cached.unlink()
        (stage / NOTE).write_text(json.dumps({**note, "on": version}, indent=1) + "\n")
    return label(note["release"], version)


def label(release: str, version: str) -> str:
    return f"{release}'s NVFP4 emulation on {version}"


def grafted_release(tree: Path) -> str | None:
    """The release whose files a grafted tree runs (None: not a grafted tree)."""
    return read_note(tree)["release"] if (tree / NOTE).is_file() else None


def run(args: argparse.Namespace) -> str:
    """The command's work; its one line of output."""
    if args.command == "tree":
        return f"{args.out}: {graft_tree(args.graft, args.pristine, args.out)}"
    from vllm_patchset.errors import PatchsetError
    from vllm_patchset.infra.config import Project
    from vllm_patchset.overlay.upstream import mirror_for

    try:
        found = release_files(mirror_for(Project.load(REPO)), args.release)
    except PatchsetError as exc:
        raise GraftError(str(exc)) from None
    write_files(found, args.release, args.out)
    return f"{args.out}: vLLM {args.release}'s {', '.join(GRAFTED)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    files = sub.add_parser("files", help="a release's two files, from the project's mirror")
    files.add_argument("release")
    files.add_argument("--out", type=Path, required=True)
    tree = sub.add_parser("tree", help="the pin's pristine tree with a graft's files")
    tree.add_argument("graft", type=Path)
    tree.add_argument("--pristine", type=Path, required=True, help="the folder holding vllm/")
    tree.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        with stops.raised():  # each staged() removes what it began
            done = run(args)
    except (GraftError, OSError) as exc:
        print(f"upstream_graft: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("upstream_graft: interrupted: nothing written", file=sys.stderr)
        return stops.status(exc)
    print(done)  # a closed pipe here: stops.main ends it quietly (141), the output whole
    return 0


if __name__ == "__main__":
    raise SystemExit(stops.main(main, "upstream_graft"))
