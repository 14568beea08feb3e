"""`vllm-patchset matrix`: each patch's state on each vLLM version."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vllm_patchset.commands import project_of, reads_only
from vllm_patchset.console import colours, emit, progress
from vllm_patchset.errors import BadInput
from vllm_patchset.registry import GIT, Subcommands, add_command

if TYPE_CHECKING:
    from vllm_patchset.series.verdict import Verdict


def cmd_matrix(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.build import patches_for, walk_project
    from vllm_patchset.overlay.upstream import check_version, mirror_for, sort_versions
    from vllm_patchset.sync.verdict_reports import matrix_body, matrix_table

    reads_only()
    project = project_of(args)
    mirror = mirror_for(project)
    patches = patches_for(project)
    started = time.perf_counter()
    if bool(args.git) != bool(args.ref):
        raise BadInput(
            "--ref REF goes with --git URL|PATH" if args.ref else "--git needs --ref REF"
        )
    versions = sort_versions(dict.fromkeys(check_version(v) for v in args.versions))
    if not versions and not args.ref:
        raise BadInput("matrix needs at least one VERSION (or --git URL --ref REF)")
    todo = [(v, None) for v in versions] + [(ref, args.git) for ref in args.ref or []]
    columns: dict[str, Sequence[Verdict]] = {}
    with progress("matrix", total=len(todo)) as step:
        for name, git in todo:
            step.describe(f"matrix: {name}")
            base = mirror.git_ref(git, name) if git else mirror.release(name)
            columns[base.label] = walk_project(project, mirror, base, patches).verdicts
            step.advance()
    elapsed = time.perf_counter() - started
    text = matrix_table(columns, colour=colours(), verbose=args.verbose)
    code = emit(args, text, matrix_body(columns))
    print(
        f"matrix: {len(columns)} trees x {len(patches)} patches in {elapsed:.1f} s",
        file=sys.stderr,
    )
    return code


def register_cli(sub: Subcommands) -> None:
    p = add_command(
        sub,
        "matrix",
        cmd_matrix,
        help="each patch's state on each vLLM version",
        writes_checkout=False,
        needs=GIT,
    )
    p.add_argument("versions", nargs="*", metavar="VERSION", help="vLLM releases (e.g. 0.25.0)")
    p.add_argument("--git", metavar="URL|PATH", help="a git repository holding vllm/, for --ref")
    p.add_argument(
        "--ref", action="append", metavar="REF", help="a ref of --git as one more row (repeat)"
    )
