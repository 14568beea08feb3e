"""The command line: one parser, one function per subcommand, one error boundary (`main`)."""

from __future__ import annotations

import argparse
import codecs
import contextlib
import importlib
import io
import json
import os
import signal
import sys
import textwrap
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

from packaging.version import Version

from vllm_patchset.console import colours, emit, print_json, progress

# The deploy commands (`overlay apply|verify|revert|status|diff`, on a serving image that has
# the tool's wheel but maybe not every dependency of the other commands) import only what they
# use: the modules of the other commands are imported by the commands (and by build_parser
# for the lines that may need them), not here.
from vllm_patchset.deploy import deploy, pack
from vllm_patchset.errors import INTERNAL_ERROR, BadInput, Finding, PatchsetError
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project

if TYPE_CHECKING:
    from vllm_patchset.overlay.upstream import Upstream
    from vllm_patchset.series.states import Verdict

# Commands registered by modules of their own (each module's register_cli), imported only for
# a line that may name them.
COMMAND_MODULES = ("sync.rebase", "gpu.validate", "gpu.bundle", "gpu.kit", "overlay.cache")

Handler = Callable[[argparse.Namespace], int]


def _project(args: argparse.Namespace) -> Project:
    return Project.load(args.project, args.cache_dir)


def _reads_only() -> None:
    """The command changes nothing in the checkout (the mirror in the cache may grow)."""
    fsio.interrupt_leaves("nothing in the checkout was changed")


# -- status / check / matrix / releases --------------------------------------------------------
def cmd_status(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.build import walk
    from vllm_patchset.overlay.upstream import mirror_for, pin_base
    from vllm_patchset.series.states import classify
    from vllm_patchset.sync.checks import lock_freshness, project_series
    from vllm_patchset.sync.reports import note_lines, state_cell

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
    lines = [f"pin: {project.package} {project.pin}"]
    for verdict in verdicts:
        why = f" (parked: {reasons[verdict.patch]})" if verdict.patch in reasons else ""
        lines.append(f"  {verdict.patch}: {state_cell(verdict)}{why}")
    lines += note_lines([(v.patch, v) for v in verdicts], verbose=args.verbose)
    lines.append(f"lock: {freshness}")
    body = {
        "pin": project.pin,
        "patches": {v.patch: v.state.value for v in verdicts},
        "warnings": {v.patch: list(v.warnings) for v in verdicts},
        "disagreements": {v.patch: list(v.disagreements) for v in verdicts},
        "parked": reasons,
        "lock": freshness,
    }
    if args.verbose:  # the index vLLM comes from and where that setting came from (never a secret)
        lines.append(mirror.index.describe())
        body["index"] = mirror.index.as_json()
    return emit(args, "\n".join(lines), body, 0 if freshness == "fresh" else 1)


def _parked(project: Project) -> list[tuple[str, str]]:
    from vllm_patchset.series.patches import read_series_entries

    return read_series_entries(project.parked_file)


def cmd_check(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.upstream import mirror_for
    from vllm_patchset.sync.checks import problems

    _reads_only()
    project = _project(args)
    n, found = problems(project, mirror_for(project))
    for problem in found:
        print(problem, file=sys.stderr)
    text = f"check: {n} patches, {len(found)} problem(s)"
    return emit(args, text, {"patches": n, "problems": found}, 1 if found else 0)


def cmd_matrix(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.build import patches_for, walk_project
    from vllm_patchset.overlay.upstream import check_version, mirror_for, sort_versions
    from vllm_patchset.sync.reports import matrix_json, matrix_table

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
    code = emit(args, text, json.loads(matrix_json(columns)))
    print(
        f"matrix: {len(columns)} trees x {len(patches)} patches in {elapsed:.1f} s",
        file=sys.stderr,
    )
    return code


def cmd_releases(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.upstream import mirror_for, parse_version

    project = _project(args)
    releases = mirror_for(project).available_versions(pre=args.pre)
    if args.newer_than_pin:
        pin = parse_version(project.pin)
        if pin is None:
            raise BadInput(f"the pin {project.pin} is not a release version")
        releases = [v for v in releases if Version(v) > pin]
    newest = releases[-1] if releases else None
    body = {"pin": project.pin, "releases": releases, "newest": newest}
    return emit(args, "\n".join(releases), body)


# -- upstream / overlay / tree -----------------------------------------------------------------
def cmd_fetch(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.upstream import mirror_for, resolve_base

    _reads_only()
    project = _project(args)
    mirror = mirror_for(project)
    if args.installed or args.python or args.target:
        upstream = mirror.installed(args.python, args.target)
    else:
        upstream = resolve_base(project, mirror, args.version, args.git, args.ref)
    text = f"{upstream.label}: {upstream.tag} {upstream.commit[:12]} ({upstream.source})"
    body = {
        "label": upstream.label,
        "version": upstream.version,
        "tag": upstream.tag,
        "commit": upstream.commit,
        "source": upstream.source,
    }
    return emit(args, text, body)


def _base(project: Project, args: argparse.Namespace) -> Upstream:
    """The upstream named by --base/--pin, --git and --ref, else the pin."""
    from vllm_patchset.overlay.upstream import mirror_for, resolve_base

    return resolve_base(project, mirror_for(project), args.base, args.git, args.ref)


def cmd_overlay_build(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.build import build_overlay

    fsio.interrupt_leaves("nothing was changed (what was staged is removed)")
    project = _project(args)
    with progress("overlay build: the upstream tree") as step:
        base = _base(project, args)
        step.describe(f"overlay build: patching {base.label}")
        lock, where = build_overlay(
            project,
            update_lock=args.update_lock,
            base=base,
            out_dir=args.out,
            skip=tuple(args.skip),
        )
    lines = [
        f"overlay for {project.package} {lock.version}: {len(lock.entries)} file(s) in {where}"
    ]
    lines += [f"  {e.path} {e.patched_sha256[:12]} <- {', '.join(e.patches)}" for e in lock.entries]
    body = {
        "version": lock.version,
        "dir": str(where),
        "patches": list(lock.patches),
        "files": [
            {"path": e.path, "patched_sha256": e.patched_sha256, "patches": list(e.patches)}
            for e in lock.entries
        ],
    }
    return emit(args, "\n".join(lines), body)


def cmd_tree(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.build import export_tree

    fsio.interrupt_leaves("nothing was changed (what was staged is removed)")
    project = _project(args)
    kind = "pristine" if args.pristine else "patched"
    with progress(f"tree: writing a {kind} tree"):
        dest = export_tree(project, _base(project, args), args.dest, pristine=args.pristine)
    return emit(args, f"wrote {kind} tree to {dest}", {"dest": str(dest), "kind": kind})


def cmd_queue_import(args: argparse.Namespace) -> int:
    from vllm_patchset.sync.queue import import_queue

    fsio.interrupt_leaves("nothing was changed (what was staged is removed)")
    info = import_queue(_project(args), force=args.force)
    text = f"queue: {len(info.patches)} patch(es) as commits on {info.base} in {info.path}"
    body = {"path": str(info.path), "base": info.base, "patches": list(info.patches)}
    return emit(args, text, body)


def cmd_queue_export(args: argparse.Namespace) -> int:
    from vllm_patchset.sync.queue import export_queue

    fsio.interrupt_leaves("nothing was changed (what was staged is removed)")
    info = export_queue(_project(args), keep=not args.drop)
    body = {"patches": list(info.patches)}
    return emit(args, f"exported {len(info.patches)} patch(es) to patches/", body)


# -- parser ------------------------------------------------------------------------------------
DESCRIPTION = (
    "Carry bug fixes on top of a pinned vLLM release: keep them as a patch series, build the"
    " hash-locked overlay, apply it to the vLLM of a serving image, and rebase the series onto"
    " new vLLM releases."
)
EXIT_CODES = """\
exit codes:
  0        success
  1        a finding: a mismatch, a conflict, drift, a decision needed
  2        bad usage or input (nothing was changed)
  3        an internal error: a bug of vllm-patchset (--verbose shows the traceback)
  130, 143 interrupted (SIGINT, SIGTERM): the message says what the run left
  141      the reader of stdout went away
--project, --cache-dir, --verbose and --json go before or after the subcommand."""


class UsageError(BadInput):
    """A command line argparse refuses, or a command group given without its subcommand."""

    def __init__(self, message: str, command: str) -> None:
        super().__init__(message)
        self.command = command


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line through cli.main (and a JSON document with
    --json) instead of a usage block and sys.exit."""

    def error(self, message: str) -> NoReturn:
        raise usage_error(self.prog.removeprefix("vllm-patchset").strip(), message)


def usage_error(command: str, message: str) -> UsageError:
    where = f"{command}: " if command else ""
    hint = f"`vllm-patchset {command} --help`" if command else "`vllm-patchset --help`"
    return UsageError(f"{where}{message} (see {hint})", command)


def _add_base_options(parser: argparse.ArgumentParser, version_flag: str = "--base") -> None:
    parser.add_argument(
        version_flag, dest="base", metavar="VERSION", help="a vLLM release (default: the pin)"
    )
    parser.add_argument("--git", metavar="URL|PATH", help="a git repository holding vllm/")
    parser.add_argument("--ref", metavar="REF", help="the ref of --git to use (tag, branch)")


def _add_global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """On the top parser with their defaults, on every subparser without: a value given after
    the subcommand overrides, one not given there leaves the top's."""

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    group = parser.add_argument_group("global options")
    group.add_argument(
        "--project",
        type=Path,
        metavar="DIR",
        default=default(None),
        help="the vllm-patchset checkout (default: found from the current directory)",
    )
    group.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        default=default(None),
        help="upstream mirror and downloads (default: $VLLM_PATCHSET_CACHE, else"
        " ~/.cache/vllm-patchset)",
    )
    group.add_argument(
        "--verbose",
        action="store_true",
        default=default(False),
        help="a traceback with an error, cosmetic notes in reports",
    )
    group.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help='one JSON document on stdout: "ok", "command", "exit_code", then the report'
        ' (errors: "error")',
    )


def _finish(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
    """Below `parser`: every subcommand gets a description, the exit codes, the global options
    and its name for JSON documents; a command group given alone shows its subcommands.

    argparse keeps subcommands in a private attribute (`_actions`, `_choices_actions`): the
    one place it is read."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        action.required = False
        words = " ".join(("vllm-patchset", *path, "COMMAND"))
        action.help = action.help or f"`{words} --help` shows a command's options"
        parser.set_defaults(func=None, group=parser)
        for choice in action._choices_actions:
            sub = action.choices[choice.dest]
            text = choice.help or ""
            sub.description = sub.description or f"{text[:1].upper()}{text[1:]}."
            sub.epilog = EXIT_CODES
            sub.formatter_class = argparse.RawDescriptionHelpFormatter
            _add_global_options(sub, top=False)
            sub.set_defaults(command_name=" ".join((*path, choice.dest)))
            _finish(sub, (*path, choice.dest))


def _needs_subcommand(group: argparse.ArgumentParser, command: str) -> UsageError:
    names = [
        n for a in group._actions if isinstance(a, argparse._SubParsersAction) for n in a.choices
    ]
    what = f"{command}: a subcommand" if command else "a command"
    return UsageError(f"{what} is needed: {', '.join(names)}", command)


def version_line() -> str:
    """`vllm-patchset --version`: the installed version (pip's), and the overlay it carries
    (a wheel `overlay pack` built)."""
    from importlib.metadata import PackageNotFoundError, version

    from vllm_patchset import __version__

    try:
        installed = version("vllm-patchset")
    except PackageNotFoundError:  # run from a source tree without an install
        installed = __version__
    packed = deploy.packaged_overlay()
    if packed is None:
        return f"vllm-patchset {installed}"
    lock = packed.lock
    return (
        f"vllm-patchset {installed} (overlay for {lock.package} {lock.version}:"
        f" {', '.join(lock.patches) or 'no patches'})"
    )


def build_parser(*, every_command: bool = True) -> argparse.ArgumentParser:
    """The command line; without `every_command`, the commands of COMMAND_MODULES left out
    (their modules not imported)."""
    parser = Parser(
        prog="vllm-patchset",
        description=textwrap.fill(DESCRIPTION, 79),
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=version_line(),
        help="print the version (and the overlay, for a wheel built by `overlay pack`)",
    )
    _add_global_options(parser, top=True)
    parser.set_defaults(command_name="")
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", title="commands", metavar="COMMAND"),
    )

    p = sub.add_parser("status", help="the pin, each patch's state on it, the lock's freshness")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "check", help="CI lint: series and files, trailers, clean apply on the pin, lock fresh"
    )
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("releases", help="the vLLM releases on the package index, oldest first")
    p.add_argument("--newer-than-pin", action="store_true", help="only those newer than the pin")
    p.add_argument("--pre", action="store_true", help="pre-releases too (rc, beta, dev)")
    p.set_defaults(func=cmd_releases)

    p = sub.add_parser("matrix", help="each patch's state on each vLLM version")
    p.add_argument("versions", nargs="*", metavar="VERSION", help="vLLM releases (e.g. 0.25.0)")
    p.add_argument("--git", metavar="URL|PATH", help="a git repository holding vllm/, for --ref")
    p.add_argument(
        "--ref", action="append", metavar="REF", help="a ref of --git as one more row (repeat)"
    )
    p.set_defaults(func=cmd_matrix)

    p = sub.add_parser("fetch", help="put an upstream vLLM tree in the local mirror")
    p.add_argument("version", nargs="?", metavar="VERSION", help="a vLLM release from the index")
    p.add_argument("--git", metavar="URL|PATH", help="a git repository holding vllm/")
    p.add_argument("--ref", metavar="REF", help="the ref of --git to fetch (tag, branch)")
    p.add_argument("--installed", action="store_true", help="the vllm of this interpreter")
    p.add_argument("--python", metavar="EXE", help="the vllm of another interpreter")
    p.add_argument("--target", type=Path, metavar="DIR", help="the vllm installed in DIR")
    p.set_defaults(func=cmd_fetch)

    overlay = sub.add_parser("overlay", help="build the overlay, or deploy it to an installed vllm")
    osub: argparse._SubParsersAction[argparse.ArgumentParser] = overlay.add_subparsers(
        dest="overlay_command", title="commands", metavar="COMMAND"
    )
    p = osub.add_parser("build", help="regenerate overlay/vllm/** and check it against the lock")
    p.add_argument("--update-lock", action="store_true", help="rewrite the lock")
    p.add_argument(
        "--out", type=Path, metavar="DIR", help="output dir (default: overlay/ for the pin)"
    )
    p.add_argument(
        "--skip", action="append", default=[], metavar="PATCH", help="leave a patch out (repeat)"
    )
    _add_base_options(p, "--pin")
    p.set_defaults(func=cmd_overlay_build)
    pack.register_cli(osub)
    deploy.register_cli(osub)

    p = sub.add_parser("tree", help="write a full pristine or patched vllm/ tree")
    p.add_argument("dest", type=Path, metavar="DEST", help="a new or empty directory")
    p.add_argument("--pristine", action="store_true", help="upstream's tree, no patch applied")
    _add_base_options(p)
    p.set_defaults(func=cmd_tree)

    queue = sub.add_parser("queue", help="edit the series as git commits")
    qsub = queue.add_subparsers(dest="queue_command", title="commands", metavar="COMMAND")
    p = qsub.add_parser("import", help="the series as commits on the pin, in .queue/")
    p.add_argument("--force", action="store_true", help="replace a queue this tool made")
    p.set_defaults(func=cmd_queue_import)
    p = qsub.add_parser("export", help="the queue's commits back to patches/ and patches/series")
    p.add_argument("--drop", action="store_true", help="remove the worktree afterwards")
    p.set_defaults(func=cmd_queue_export)

    # Commands of their own modules, wired here by import: a renamed module fails loudly.
    for name in COMMAND_MODULES if every_command else ():
        importlib.import_module(f"vllm_patchset.{name}").register_cli(sub)
    _finish(parser, ())
    return parser


def _writes_project(args: argparse.Namespace) -> bool:
    """Commands that rewrite the checkout (patches/, the overlay, the pin) or read the overlay
    whole (pack) run one at a time."""
    command = (args.command, getattr(args, "overlay_command", None))
    return args.command in ("rebase", "queue") or command in (
        ("overlay", "build"),
        ("overlay", "pack"),
    )


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


def _failed(message: str, exit_code: int, *, command: str, as_json: bool) -> int:
    """The one line on stderr, and with --json the error as a document on stdout too."""
    print(f"vllm-patchset: {message}", file=sys.stderr)
    if as_json:
        print_json(command, exit_code, {"error": message})
    return exit_code


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The line parsed; a line that may be a deploy command first by a parser without the
    commands of COMMAND_MODULES (anything else it refuses goes to the whole parser)."""
    if "overlay" in argv:
        with contextlib.suppress(UsageError):
            args, extra = build_parser(every_command=False).parse_known_args(argv)
            if args.command == "overlay" and not extra:
                return args, extra
    return build_parser().parse_known_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a path or a line of code the encoding lacks
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="vllm-patchset")
    argv = list(sys.argv[1:] if argv is None else argv)
    # Until the line is parsed: what it asks for, as far as a refused line tells.
    command, verbose, as_json = "", "--verbose" in argv, "--json" in argv
    with fsio.signals_raise():
        try:
            args, extra = _parse(argv)
            command, verbose, as_json = args.command_name, args.verbose, args.json
            if extra:
                raise usage_error(command, f"unrecognized arguments: {' '.join(extra)}")
            if args.func is None:  # `vllm-patchset overlay`: its subcommands
                args.group.print_help(sys.stderr)
                raise _needs_subcommand(args.group, command)
            handler: Handler = args.func
            with _one_writer(args):
                code = handler(args)
            sys.stdout.flush()  # here, so that a closed pipe is seen inside the boundary
            return code
        except BrokenPipeError:
            # The reader went away (`| head`): stop quietly, as other command-line tools do.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 128 + signal.SIGPIPE
        except PatchsetError as exc:
            if verbose and not isinstance(exc, UsageError):
                traceback.print_exc()
            left = f"; {exc.left}" if exc.left else ""
            if isinstance(exc, UsageError):
                command = exc.command
            return _failed(f"{exc}{left}", exc.exit_code, command=command, as_json=as_json)
        except KeyboardInterrupt as exc:
            signum = exc.signum if isinstance(exc, fsio.Interrupted) else signal.SIGINT
            note = fsio.interrupted_note()
            left = f"; {note}" if note else ""
            name = signal.Signals(signum).name
            message = f"interrupted ({name}){left}"
            return _failed(message, 128 + signum, command=command, as_json=as_json)
        except OSError as exc:  # what no check foresaw (a disk that fails): still one line
            if verbose:
                traceback.print_exc()
            where = f": {exc.filename}" if exc.filename else ""
            note = fsio.interrupted_note()
            left = f"; {note}" if note else ""
            message = f"{exc.strerror or exc}{where}{left}"
            return _failed(message, INTERNAL_ERROR, command=command, as_json=as_json)
        except Exception as exc:  # a bug: still one line, and an exit code of its own
            if verbose:
                traceback.print_exc()
            note = fsio.interrupted_note()
            left = f"; {note}" if note else ""
            hint = "" if verbose else " (a bug of vllm-patchset: --verbose shows the traceback)"
            message = f"internal error: {internal_words(exc)}{hint}{left}"
            return _failed(message, INTERNAL_ERROR, command=command, as_json=as_json)


def internal_words(exc: BaseException) -> str:
    """What an unforeseen exception says, in words: its kind and its first line, never a
    repr (a KeyError's str is its key's repr: the key is named instead)."""
    kind = type(exc).__name__
    if isinstance(exc, KeyError) and exc.args:
        return f"{kind}: no key {exc.args[0]}"
    lines = str(exc).strip().splitlines()
    return f"{kind}: {lines[0]}" if lines else kind


def run() -> None:
    raise SystemExit(main())


__all__ = ["Finding", "main", "run"]

if __name__ == "__main__":
    raise SystemExit(main())
