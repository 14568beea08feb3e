"""`vllm-patchset validate`: the red/green trees built (`gpu/validate.py`) and run on this
host's GPU (`gpu/gpurun.py`), with a native-ops kit's real ops if one is given."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_patchset.commands import project_of
from vllm_patchset.commands.options import add_options
from vllm_patchset.console import emit, progress
from vllm_patchset.errors import BadInput, as_project_errors
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project
from vllm_patchset.registry import GIT, Subcommands, add_command

if TYPE_CHECKING:
    from vllm_patchset.gpu.validate import BuiltTrees


def unknown_tree(names: list[str], only: list[str]) -> str | None:
    """The refusal of the first `--only` that names no tree (None: all name one)."""
    unknown = [name for name in only if name not in names]
    if not unknown:
        return None
    return f"validate --only {unknown[0]}: no such tree (the trees: {', '.join(names)})"


def _work(project: Project, work: Path | None) -> Path:
    """Where the trees go: --work, else our own build output in the build folder we marked,
    started clean."""
    if work is not None:
        return work
    work = fsio.build_dir(project.root) / "gpu"
    fsio.remove_output(work)
    return work


@contextmanager
def _removed_unless_built(work: Path) -> Iterator[None]:
    """The trees' folder, new here, removed again where the build stops midway (Ctrl-C,
    SIGTERM, an error): a half-built --work was left, and the next run refused it (`exists
    already`)."""
    new = not work.exists()
    try:
        yield
    except BaseException:
        if new and work.exists():
            fsio.remove_tree(work)
            fsio.interrupt_leaves(f"removed the half-built {work}")
        raise


def _native_site(kit: Path | None, work: Path, python: str) -> Path | None:
    """The site folder of the kit assembled under `work` (None: no --kit)."""
    from vllm_patchset.gpu import kitparts

    if kit is None:
        return None
    with as_project_errors(kitparts.KitError), progress("validate: assembling the kit"):
        native = kitparts.assemble(kit, work / "native", python) / "site"
    print(f"native ops for the pin's trees from {native}", file=sys.stderr)
    return native


def _run(args: argparse.Namespace, built: BuiltTrees, work: Path, native: Path | None) -> int:
    """tests/gpu on the trees (--only's, else all), and the table of expectations."""
    from vllm_patchset.gpu import gpurun

    only = tuple(args.only)
    count = len(only) or len(built.specs)
    # gpurun prints a line per tree on stdout: here it goes to stderr, stdout holds the report.
    running = progress(f"validate: tests/gpu on {count} tree(s)")
    with running, redirect_stdout(sys.stderr):
        rows = gpurun.run_all(built.root, built.root / "results", args.python, only, native)
    unmet = [r for r in rows if not r.met]
    body = {"work": str(work), "rows": [r.__dict__ for r in rows], "unmet": len(unmet)}
    code = emit(args, gpurun.table(rows), body, 1 if unmet else 0)
    if unmet:
        print(
            f"vllm-patchset: {len(unmet)} red/green expectation(s) unmet (UNMET in the table;"
            f" logs in {built.root / 'results'})",
            file=sys.stderr,
        )
    return code


def cmd_validate(args: argparse.Namespace) -> int:
    from vllm_patchset.gpu.validate import build_trees, require_torch, tree_names

    project = project_of(args)
    refused = unknown_tree(tree_names(project), args.only)
    if refused:
        raise BadInput(refused)
    if not args.build_only:
        require_torch(args.python)
    work = _work(project, args.work)
    with progress("validate: building the trees"), _removed_unless_built(work):
        built = build_trees(project, work)
    for spec in built.specs:
        where = f"skipped: {spec.skipped}" if spec.skipped else spec.path
        print(f"tree {spec.name}: {where}", file=sys.stderr)
    native = _native_site(args.kit, work, args.python)
    if args.build_only:
        return emit(args, "", {"work": str(work), "trees": [s.name for s in built.specs]})
    return _run(args, built, work, native)


def register_cli(sub: Subcommands) -> None:
    p = add_command(
        sub,
        "validate",
        cmd_validate,
        help="GPU tests on pristine, overlaid and buggy trees",
        writes_checkout=False,
        needs=GIT,
    )
    p.add_argument("--work", type=Path, help="where to build the trees (default: build/gpu)")
    p.add_argument("--python", default=sys.executable, help="the interpreter with torch")
    p.add_argument(
        "--only", action="append", default=[], metavar="TREE", help="run this tree only (repeat)"
    )
    p.add_argument("--build-only", action="store_true", help="build the trees, run nothing")
    add_options(p, "--kit", kit="a native-ops kit: the pin's trees run its real ops")
