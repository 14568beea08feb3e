"""How a command joins the command line: one call registers its parser, its handler and
whether it writes the checkout (`cli.main` runs those one at a time, under the checkout's
lock). A command group (`overlay`, `queue`, `kit`) is registered the same way, without a
handler: given alone it shows its subcommands.

Standard library only, below every command's module: `cli.build_parser` assembles the line
from the modules' `register_cli(sub)`, each of which calls `add_command` or `add_group`.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable, Sequence
from typing import TypeAlias

Handler: TypeAlias = Callable[[argparse.Namespace], int]
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


# The modules a command may need beyond the core (the standard library and packaging), by the
# name it imports, with the distribution that provides it and the extra that installs it.
EXTRAS: dict[str, tuple[str, str]] = {
    "git": ("gitpython", "maintain"),
    "tomlkit": ("tomlkit", "maintain"),
    "ruamel.yaml": ("ruamel.yaml", "maintain"),
    "rich": ("rich", "maintain"),
}
# What the checkout's commands that run git need (GitPython runs the git command line).
GIT = ("git",)
# The Python a command needs: the tool's (tomllib, enum.StrEnum, datetime.UTC), or, for the
# deploy commands a serving image runs, the oldest the pinned vLLM supports (0.24.0: 3.10 to
# 3.14), which the packed wheel declares.
TOOL_PYTHON = (3, 11)
DEPLOY_PYTHON = (3, 10)


def _description(help: str) -> str:
    return f"{help[:1].upper()}{help[1:]}."


def add_command(
    sub: Subcommands,
    name: str,
    handler: Handler,
    *,
    help: str,
    writes_checkout: bool,
    needs: Sequence[str] = (),
    python: tuple[int, int] = TOOL_PYTHON,
) -> argparse.ArgumentParser:
    """The parser of the command `name`; `writes_checkout`: the command rewrites the checkout
    (patches/, the overlay, the pin) or reads the overlay whole, so it takes the checkout's
    lock; `needs`: the modules (keys of EXTRAS) it imports beyond the core, which cli.main
    finds before the command runs (`missing_extra`); `python`: the oldest Python it runs on
    (`older_python`)."""
    unknown = [module for module in needs if module not in EXTRAS]
    assert not unknown, f"{name}: no extra provides {unknown}"
    parser = sub.add_parser(name, help=help, description=_description(help))
    parser.set_defaults(
        func=handler, writes_checkout=writes_checkout, needs=tuple(needs), min_python=python
    )
    return parser


def _importable(module: str) -> bool:
    """Whether `module` is installed (found, not imported; a dotted name's parent missing
    is a module missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def missing_extra(command: str, needs: Sequence[str]) -> str | None:
    """The one line for a command whose modules are not all installed (None: all are):
    which extra to install, and how."""
    missing = [module for module in needs if not _importable(module)]
    if not missing:
        return None
    extras = sorted({EXTRAS[module][1] for module in missing})
    names = ", ".join(EXTRAS[module][0] for module in missing)
    which = " and ".join(f"'{extra}'" for extra in extras)
    noun = "extra" if len(extras) == 1 else "extras"
    return (
        f"{command} needs the {which} {noun} (missing: {names}):"
        f" `pip install 'vllm-patchset[{','.join(extras)}]'`"
    )


def older_python(
    command: str, needs: tuple[int, int], running: tuple[int, ...] = tuple(sys.version_info[:3])
) -> str | None:
    """The one line for a command this Python is too old for (None: it is not)."""
    if tuple(running[:2]) >= needs:
        return None
    this = ".".join(map(str, running[:3]))
    return (
        f"{command} needs Python {needs[0]}.{needs[1]} or newer (this is {this}); from Python"
        f" {DEPLOY_PYTHON[0]}.{DEPLOY_PYTHON[1]}: `vllm-patchset overlay"
        " status|apply|verify|diff|revert`"
    )


def add_subcommands(parser: argparse.ArgumentParser, dest: str) -> Subcommands:
    """The subcommands of `parser` (the top parser or a group): given without one, the line
    has no handler (`func` None) and cli.main shows the group's help and names them."""
    words = " ".join([*parser.prog.split(), "COMMAND"])
    sub = parser.add_subparsers(
        dest=dest,
        title="commands",
        metavar="COMMAND",
        help=f"`{words} --help` shows a command's options",
    )
    sub.required = False
    parser.set_defaults(func=None, group=parser, subcommands=sub, writes_checkout=False, needs=())
    return sub


def add_group(sub: Subcommands, name: str, *, help: str) -> Subcommands:
    """A command group `name` (its subcommands are registered on what this returns)."""
    group = sub.add_parser(name, help=help, description=_description(help))
    return add_subcommands(group, f"{name}_command")


def subcommand_names(group: argparse.ArgumentParser) -> list[str]:
    """The names of the subcommands registered on `group`."""
    sub: Subcommands = group.get_default("subcommands")
    return list(sub.choices)
