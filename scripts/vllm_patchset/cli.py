"""The command line: the one entry (`main`) and its error boundary, the global options, and the
parser assembled from the modules of `commands/`, each registering its commands through
`registry.add_command`."""

from __future__ import annotations

import argparse
import codecs
import contextlib
import difflib
import io
import re
import signal
import sys
import textwrap
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

# The deploy commands (`overlay apply|verify|revert|status|diff`, on a serving image that has
# the tool's wheel but maybe not every dependency of the other commands) import only what they
# use: the command modules imported here import the modules that do the work in their handlers.
from vllm_patchset.commands import (
    backport,
    bundle,
    cache,
    check,
    fetch,
    kit,
    matrix,
    overlay,
    patch,
    queue,
    rebase,
    releases,
    status,
    tree,
    validate,
)
from vllm_patchset.console import emit, fit, print_json
from vllm_patchset.errors import INTERNAL_ERROR, BadInput, Finding, PatchsetError
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project
from vllm_patchset.registry import (
    Handler,
    add_subcommands,
    missing_extra,
    older_python,
    subcommand_names,
)

# The commands in their order on the line (and in --help).
COMMANDS = (
    status,
    check,
    releases,
    matrix,
    fetch,
    overlay,
    tree,
    queue,
    patch,
    backport,
    rebase,
    validate,
    bundle,
    kit,
    cache,
)

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
  3        an internal error: a bug of vllm-patchset (--verbose: its traceback)
  130, 143 interrupted (SIGINT, SIGTERM): the message says what the run left
  141      the reader of stdout went away
--project, --cache-dir, --verbose and --json go before or after the subcommand."""


class UsageError(BadInput):
    """A command line argparse refuses, or a command group given without its subcommand."""

    def __init__(self, message: str, command: str) -> None:
        super().__init__(message)
        self.command = command


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help with the usage in the terminal's width: argparse keeps a group of
    choices (`(--onto VERSION | ... | --abort)`) on one line however long; such a line is
    broken between words here."""

    def _format_usage(self, *args: Any) -> str:
        lines = []
        for line in super()._format_usage(*args).split("\n"):
            indent = " " * (len(line) - len(line.lstrip()))
            if len(line) > self._width:
                line = textwrap.fill(
                    line.lstrip(),
                    self._width,
                    initial_indent=indent,
                    subsequent_indent=indent + " ",
                    break_on_hyphens=False,
                )
            lines.append(line)
        return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line through cli.main (and a JSON document with
    --json) instead of a usage block and sys.exit."""

    def error(self, message: str) -> NoReturn:
        raise usage_error(self.prog.removeprefix("vllm-patchset").strip(), did_you_mean(message))


# argparse's refusal of a word not among an argument's choices (3.11: the choices quoted).
_INVALID_CHOICE = re.compile(
    r"^argument (?P<arg>.+?): invalid choice: '?(?P<word>.*?)'? \(choose from (?P<choices>.*)\)$"
)


def did_you_mean(message: str) -> str:
    """argparse's refusal of a mistyped choice, with the closest choice named (difflib) in
    place of the whole list: `unknown command 'stauts': did you mean 'status'?`. Other
    messages are returned as they are."""
    match = _INVALID_CHOICE.match(message)
    if not match:
        return message
    word = match["word"]
    choices = [c.strip().strip("'") for c in match["choices"].split(",")]
    what = "command" if match["arg"] == "COMMAND" else None
    head = (
        f"unknown {what} '{word}'" if what else f"argument {match['arg']}: invalid choice '{word}'"
    )
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f"{head}: did you mean '{close[0]}'?"
    return f"{head} (choose from {', '.join(choices)})"


def usage_error(command: str, message: str) -> UsageError:
    where = f"{command}: " if command else ""
    hint = f"`vllm-patchset {command} --help`" if command else "`vllm-patchset --help`"
    return UsageError(f"{where}{message} (see {hint})", command)


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
    """Below `parser`: every subcommand gets the exit codes, the global options (after its
    own) and its name for JSON documents."""
    sub = parser.get_default("subcommands")
    for name, command in (sub.choices if sub else {}).items():
        command.epilog = EXIT_CODES
        command.formatter_class = Formatter
        _add_global_options(command, top=False)
        command.set_defaults(command_name=" ".join((*path, name)))
        _finish(command, (*path, name))


def _needs_subcommand(group: argparse.ArgumentParser, command: str) -> UsageError:
    what = f"{command}: a subcommand" if command else "a command"
    return UsageError(f"{what} is needed: {', '.join(subcommand_names(group))}", command)


def version_report() -> tuple[str, dict[str, object]]:
    """`vllm-patchset --version`: the installed version (pip's), and the overlay it carries
    (a wheel `overlay pack` built), as the text and the JSON body."""
    from importlib.metadata import PackageNotFoundError, version

    from vllm_patchset import __version__
    from vllm_patchset.deploy.source import packaged_overlay

    try:
        installed = version("vllm-patchset")
    except PackageNotFoundError:  # run from a source tree without an install
        installed = __version__
    packed = packaged_overlay()
    if packed is None:
        return f"vllm-patchset {installed}", {"version": installed, "overlay": None}
    lock = packed.lock
    overlay = {"package": lock.package, "version": lock.version, "patches": list(lock.patches)}
    return (
        f"vllm-patchset {installed} (overlay for {lock.package} {lock.version}:"
        f" {', '.join(lock.patches) or 'no patches'})",
        {"version": installed, "overlay": overlay},
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line: the global options, then each command of COMMANDS."""
    parser = Parser(
        prog="vllm-patchset",
        description=textwrap.fill(DESCRIPTION, 79),
        epilog=EXIT_CODES,
        formatter_class=Formatter,
    )
    parser.add_argument(
        "--version",
        dest="show_version",  # `fetch VERSION` has a `version` of its own
        action="store_true",
        help="print the version (and the overlay, for a wheel built by `overlay pack`)",
    )
    _add_global_options(parser, top=True)
    parser.set_defaults(command_name="")
    sub = add_subcommands(parser, "command")
    for module in COMMANDS:
        module.register_cli(sub)
    _finish(parser, ())
    return parser


def _one_writer(args: argparse.Namespace) -> contextlib.AbstractContextManager[None]:
    """The commands registered as writing the checkout run one at a time."""
    if not args.writes_checkout:
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


class MissingExtra(BadInput):
    """A command whose modules (an extra of the package) are not installed, or that needs a
    newer Python than this one: refused before it runs, so before it writes anything."""


def _failed(message: str, exit_code: int, *, command: str, as_json: bool) -> int:
    """The one line on stderr (broken between words at the terminal's width like any other
    output, a command in backticks kept whole), and with --json the error as a document on
    stdout too."""
    print(fit(f"vllm-patchset: {message}"), file=sys.stderr)
    if as_json:
        print_json(command, exit_code, {"error": message})
    return exit_code


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a path or a line of code the encoding lacks
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="vllm-patchset")
    argv = list(sys.argv[1:] if argv is None else argv)
    # Until the line is parsed: what it asks for, as far as a refused line tells.
    command, verbose, as_json = "", "--verbose" in argv, "--json" in argv
    with fsio.signals_raise():
        try:
            try:
                args, extra = build_parser().parse_known_args(argv)
            except SystemExit:  # --help, printed: a closed pipe is seen here, not at exit
                sys.stdout.flush()
                raise
            command, verbose, as_json = args.command_name, args.verbose, args.json
            if extra:
                raise usage_error(command, f"unrecognized arguments: {' '.join(extra)}")
            if args.show_version:  # whatever follows it, as argparse's own --version did
                code = emit(args, *version_report())
            elif args.func is None:  # `vllm-patchset overlay`: its subcommands
                args.group.print_help(sys.stderr)
                raise _needs_subcommand(args.group, command)
            else:
                missing = older_python(command, args.min_python) or missing_extra(
                    command, args.needs
                )
                if missing:
                    raise MissingExtra(missing)
                handler: Handler = args.func
                with _one_writer(args):
                    code = handler(args)
            sys.stdout.flush()  # here, so that a closed pipe is seen inside the boundary
            return code
        except BrokenPipeError:  # the reader went away (`| head`): stop quietly
            return fsio.reader_gone()
        except (Exception, KeyboardInterrupt) as exc:
            if isinstance(exc, UsageError):
                command = exc.command
            message, code = _failure(exc, verbose=verbose)
            return _failed(message, code, command=command, as_json=as_json)


def _failure(exc: Exception | KeyboardInterrupt, *, verbose: bool) -> tuple[str, int]:
    """The one line and the exit code of what stopped a command: an error the tool raised, an
    interrupt, an OSError no check foresaw (a disk that fails), or a bug. Called inside the
    `except` (the traceback --verbose prints is that exception's)."""
    if isinstance(exc, PatchsetError):
        if verbose and not isinstance(exc, UsageError):
            traceback.print_exc()
        left = f"; {exc.left}" if exc.left else ""
        return f"{exc}{left}", exc.exit_code
    note = fsio.interrupted_note()
    left = f"; {note}" if note else ""
    if isinstance(exc, KeyboardInterrupt):
        signum = exc.signum if isinstance(exc, fsio.Interrupted) else signal.SIGINT
        return f"interrupted ({signal.Signals(signum).name}){left}", 128 + signum
    if verbose:
        traceback.print_exc()
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or exc}{where}{left}", INTERNAL_ERROR
    hint = "" if verbose else " (a bug of vllm-patchset: --verbose shows the traceback)"
    return f"internal error: {internal_words(exc)}{hint}{left}", INTERNAL_ERROR


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
