"""The command line: one parser, one function per subcommand, one error boundary (`main`)."""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from packaging.version import Version

from vllm_patchset import bundle, deploy, fsio, kit, rebase, validate
from vllm_patchset.checks import lock_freshness, problems, project_series
from vllm_patchset.config import Project
from vllm_patchset.errors import BadInput, Finding, PatchsetError
from vllm_patchset.overlay import (
    build_overlay,
    export_tree,
    patches_for,
    walk,
)
from vllm_patchset.queue import export_queue, import_queue
from vllm_patchset.reports import matrix_json, matrix_table, state_cell
from vllm_patchset.series import read_series_entries
from vllm_patchset.states import Verdict, classify
from vllm_patchset.upstream import (
    Upstream,
    check_version,
    mirror_for,
    parse_version,
    pin_base,
    resolve_base,
    sort_versions,
)

Handler = Callable[[argparse.Namespace], int]


def _project(args: argparse.Namespace) -> Project:
    return Project.load(args.project, args.cache_dir)


def _reads_only() -> None:
    """The command changes nothing in the checkout (the mirror in the cache may grow)."""
    fsio.interrupt_leaves("nothing in the checkout was changed")


# -- status / check / matrix / releases --------------------------------------------------------
def cmd_status(args: argparse.Namespace) -> int:
    _reads_only()
    project = _project(args)
    mirror = mirror_for(project)
    series = project_series(project)
    result = walk(mirror, pin_base(project, mirror), series.all)
    # Parked patches are not applied: each is classified on the patched pin, for the record.
    parked = [
        classify(mirror.repo, result.tree, p, base=project.pin, version=result.upstream.version)
        for p in series.parked
    ]
    reasons = {f"{project.parked_file.parent.name}/{n}": r for n, r in _parked(project)}
    freshness = lock_freshness(project, mirror, result)
    verdicts = [*result.verdicts, *parked]
    if args.json:
        print(
            json.dumps(
                {
                    "pin": project.pin,
                    "patches": {v.patch: v.state.value for v in verdicts},
                    "disagreements": {v.patch: list(v.disagreements) for v in verdicts},
                    "parked": reasons,
                    "lock": freshness,
                },
                indent=2,
            )
        )
    else:
        print(f"pin: {project.package} {project.pin}")
        for verdict in verdicts:
            why = f" (parked: {reasons[verdict.patch]})" if verdict.patch in reasons else ""
            print(f"  {verdict.patch}: {state_cell(verdict)}{why}")
            for note in verdict.disagreements:
                print(f"    * {note}")
        print(f"lock: {freshness}")
    return 0 if freshness == "fresh" else 1


def _parked(project: Project) -> list[tuple[str, str]]:
    return read_series_entries(project.parked_file)


def cmd_check(args: argparse.Namespace) -> int:
    _reads_only()
    project = _project(args)
    series, found = problems(project, mirror_for(project))
    for problem in found:
        print(problem, file=sys.stderr)
    n = len(series.active) + len(series.upstreamed) + len(series.parked)
    print(f"check: {n} patches, {len(found)} problem(s)")
    return 1 if found else 0


def cmd_matrix(args: argparse.Namespace) -> int:
    _reads_only()
    project = _project(args)
    mirror = mirror_for(project)
    patches = patches_for(project)
    started = time.perf_counter()
    if bool(args.git) != bool(args.ref):
        raise BadInput(
            "--ref REF goes with --git URL|PATH" if args.ref else "--git needs --ref REF"
        )
    versions = sort_versions(dict.fromkeys(check_version(v) for v in args.versions))
    bases: list[Upstream] = [mirror.release(v) for v in versions]
    bases += [mirror.git_ref(args.git, ref) for ref in args.ref or []]
    if not bases:
        raise BadInput("matrix needs at least one VERSION (or --git URL --ref REF)")
    columns: dict[str, Sequence[Verdict]] = {
        base.label: walk(mirror, base, patches).verdicts for base in bases
    }
    elapsed = time.perf_counter() - started
    print(matrix_json(columns) if args.json else matrix_table(columns))
    print(
        f"matrix: {len(bases)} trees x {len(patches)} patches in {elapsed:.1f} s", file=sys.stderr
    )
    return 0


def cmd_releases(args: argparse.Namespace) -> int:
    project = _project(args)
    releases = mirror_for(project).available_versions(pre=args.pre)
    if args.newer_than_pin:
        pin = parse_version(project.pin)
        if pin is None:
            raise BadInput(f"the pin {project.pin} is not a release version")
        releases = [v for v in releases if Version(v) > pin]
    if args.json:
        newest = releases[-1] if releases else None
        print(json.dumps({"pin": project.pin, "releases": releases, "newest": newest}, indent=2))
    else:
        print("\n".join(releases))
    return 0


# -- upstream / overlay / tree -----------------------------------------------------------------
def cmd_fetch(args: argparse.Namespace) -> int:
    _reads_only()
    project = _project(args)
    mirror = mirror_for(project)
    if args.installed or args.python or args.target:
        upstream = mirror.installed(args.python, args.target)
    else:
        upstream = resolve_base(project, mirror, args.version, args.git, args.ref)
    print(f"{upstream.label}: {upstream.tag} {upstream.commit[:12]} ({upstream.source})")
    return 0


def _base(project: Project, args: argparse.Namespace) -> Upstream:
    """The upstream named by --base/--pin, --git and --ref, else the pin."""
    return resolve_base(project, mirror_for(project), args.base, args.git, args.ref)


def cmd_overlay_build(args: argparse.Namespace) -> int:
    fsio.interrupt_leaves("nothing was changed (what was staged is removed)")
    project = _project(args)
    base = _base(project, args)
    lock, where = build_overlay(
        project, update_lock=args.update_lock, base=base, out_dir=args.out, skip=tuple(args.skip)
    )
    print(f"overlay for {project.package} {lock.version}: {len(lock.entries)} file(s) in {where}")
    for entry in lock.entries:
        print(f"  {entry.path} {entry.patched_sha256[:12]} <- {', '.join(entry.patches)}")
    return 0


def cmd_tree(args: argparse.Namespace) -> int:
    fsio.interrupt_leaves("nothing was changed (what was staged is removed)")
    project = _project(args)
    dest = export_tree(project, _base(project, args), args.dest, pristine=args.pristine)
    print(f"wrote {'pristine' if args.pristine else 'patched'} tree to {dest}")
    return 0


def cmd_queue_import(args: argparse.Namespace) -> int:
    fsio.interrupt_leaves("nothing was changed (what was staged is removed)")
    info = import_queue(_project(args), force=args.force)
    print(f"queue: {len(info.patches)} patch(es) as commits on {info.base} in {info.path}")
    return 0


def cmd_queue_export(args: argparse.Namespace) -> int:
    fsio.interrupt_leaves("nothing was changed (what was staged is removed)")
    info = export_queue(_project(args), keep=not args.drop)
    print(f"exported {len(info.patches)} patch(es) to patches/")
    return 0


# -- parser ------------------------------------------------------------------------------------
def _add_base_options(parser: argparse.ArgumentParser, version_flag: str = "--base") -> None:
    parser.add_argument(
        version_flag, dest="base", metavar="VERSION", help="a vLLM release (default: the pin)"
    )
    parser.add_argument("--git", metavar="URL|PATH", help="a git repository holding vllm/")
    parser.add_argument("--ref", metavar="REF", help="the ref of --git to use")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-patchset", description=__doc__)
    parser.add_argument("--project", type=Path, help="project root (default: found from cwd)")
    parser.add_argument("--cache-dir", type=Path, help="upstream mirror and downloads")
    parser.add_argument("--verbose", action="store_true", help="tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("status", help="the pin, each patch's state on it, lock freshness")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("check", help="CI lint: series, trailers, clean apply on the pin, lock")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("releases", help="releases on the package index, in PEP 440 order")
    p.add_argument("--newer-than-pin", action="store_true", help="only those newer than the pin")
    p.add_argument("--pre", action="store_true", help="pre-releases too (rc, beta, dev)")
    p.add_argument("--json", action="store_true", help='{"pin", "releases": [...], "newest"}')
    p.set_defaults(func=cmd_releases)

    p = sub.add_parser("matrix", help="each patch's state on each version")
    p.add_argument("versions", nargs="*", metavar="VERSION")
    p.add_argument("--git", metavar="URL|PATH", help="add refs of this repository as columns")
    p.add_argument("--ref", action="append", metavar="REF")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_matrix)

    p = sub.add_parser("fetch", help="put an upstream tree in the mirror")
    p.add_argument("version", nargs="?")
    p.add_argument("--git", metavar="URL|PATH")
    p.add_argument("--ref", metavar="REF")
    p.add_argument("--installed", action="store_true", help="the vllm of this interpreter")
    p.add_argument("--python", metavar="EXE", help="the vllm of another interpreter")
    p.add_argument("--target", type=Path, metavar="DIR", help="the vllm installed in DIR")
    p.set_defaults(func=cmd_fetch)

    overlay = sub.add_parser("overlay", help="build, or deploy to an installed vllm")
    osub = overlay.add_subparsers(dest="overlay_command", required=True)
    p = osub.add_parser("build", help="regenerate overlay/vllm/** and check it against the lock")
    p.add_argument("--update-lock", action="store_true", help="rewrite the lock")
    p.add_argument("--out", type=Path, help="output dir (default: overlay/ for the pin)")
    p.add_argument("--skip", action="append", default=[], metavar="PATCH", help="leave it out")
    _add_base_options(p, "--pin")
    p.set_defaults(func=cmd_overlay_build)
    deploy.register_cli(osub)

    p = sub.add_parser("tree", help="write a full pristine or patched vllm/ tree")
    p.add_argument("dest", type=Path)
    p.add_argument("--pristine", action="store_true")
    _add_base_options(p)
    p.set_defaults(func=cmd_tree)

    queue = sub.add_parser("queue", help="edit the series as commits")
    qsub = queue.add_subparsers(dest="queue_command", required=True)
    p = qsub.add_parser("import", help="the series as commits on the pin in .queue/")
    p.add_argument("--force", action="store_true", help="replace an existing queue")
    p.set_defaults(func=cmd_queue_import)
    p = qsub.add_parser("export", help="the queue's commits back to patches/")
    p.add_argument("--drop", action="store_true", help="remove the worktree afterwards")
    p.set_defaults(func=cmd_queue_export)

    # Commands of their own modules, wired here by import: a renamed module fails loudly.
    for module in (rebase, validate, bundle, kit):
        module.register_cli(sub)
    return parser


def _writes_project(args: argparse.Namespace) -> bool:
    """Commands that rewrite the checkout (patches/, the overlay, the pin) run one at a time."""
    command = (args.command, getattr(args, "overlay_command", None))
    return args.command in ("rebase", "queue") or command == ("overlay", "build")


def _one_writer(args: argparse.Namespace) -> contextlib.AbstractContextManager[None]:
    if not _writes_project(args):
        return contextlib.nullcontext()
    root = Project.load(args.project, args.cache_dir).root
    return fsio.locked_dir(root, holder="another vllm-patchset rebase, queue or overlay build")


def _unencodable(error: UnicodeError) -> tuple[str | bytes, int]:
    """Output the terminal's encoding cannot take: a file name's undecodable bytes go out as
    they were (surrogateescape), any other character as a backslash escape."""
    assert isinstance(error, UnicodeEncodeError)
    chunk = error.object[error.start : error.end]
    if all("\udc80" <= c <= "\udcff" for c in chunk):
        return bytes(ord(c) - 0xDC00 for c in chunk), error.end
    return codecs.backslashreplace_errors(error)


codecs.register_error("vllm-patchset", _unencodable)


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a path or a line of code the encoding lacks
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="vllm-patchset")
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.func
    with fsio.signals_raise():
        try:
            with _one_writer(args):
                code = handler(args)
            sys.stdout.flush()  # here, so that a closed pipe is seen inside the boundary
            return code
        except BrokenPipeError:
            # The reader went away (`| head`): stop quietly, as other command-line tools do.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 128 + signal.SIGPIPE
        except PatchsetError as exc:
            if args.verbose:
                traceback.print_exc()
            left = f"; {exc.left}" if exc.left else ""
            print(f"vllm-patchset: {exc}{left}", file=sys.stderr)
            return exc.exit_code
        except KeyboardInterrupt as exc:
            signum = exc.signum if isinstance(exc, fsio.Interrupted) else signal.SIGINT
            note = fsio.interrupted_note()
            left = f"; {note}" if note else ""
            name = signal.Signals(signum).name
            print(f"vllm-patchset: interrupted ({name}){left}", file=sys.stderr)
            return 128 + signum
        except OSError as exc:  # what no check foresaw (a disk that fails): still one line
            if args.verbose:
                traceback.print_exc()
            where = f": {exc.filename}" if exc.filename else ""
            note = fsio.interrupted_note()
            left = f"; {note}" if note else ""
            print(f"vllm-patchset: {exc.strerror or exc}{where}{left}", file=sys.stderr)
            return 1


def run() -> None:
    raise SystemExit(main())


__all__ = ["Finding", "main", "run"]

if __name__ == "__main__":
    raise SystemExit(main())
