"""How a command joins the command line: one call registers its parser, its handler and
whether it writes the checkout (`cli.main` runs those one at a time, under the checkout's
lock). A command group (`overlay`, `queue`, `kit`) is registered the same way, without a
handler: given alone it shows its subcommands.

Standard library only, below every command's module: `cli.build_parser` assembles the line
from the modules' `register_cli(sub)`, each of which calls `add_command` or `add_group`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeAlias

Handler: TypeAlias = Callable[[argparse.Namespace], int]
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _description(help: str) -> str:
    return f"{help[:1].upper()}{help[1:]}."


def add_command(
    sub: Subcommands, name: str, handler: Handler, *, help: str, writes_checkout: bool
) -> argparse.ArgumentParser:
    """The parser of the command `name`; `writes_checkout`: the command rewrites the checkout
    (patches/, the overlay, the pin) or reads the overlay whole, so it takes the checkout's
    lock."""
    parser = sub.add_parser(name, help=help, description=_description(help))
    parser.set_defaults(func=handler, writes_checkout=writes_checkout)
    return parser


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
    parser.set_defaults(func=None, group=parser, subcommands=sub, writes_checkout=False)
    return sub


def add_group(sub: Subcommands, name: str, *, help: str) -> Subcommands:
    """A command group `name` (its subcommands are registered on what this returns)."""
    group = sub.add_parser(name, help=help, description=_description(help))
    return add_subcommands(group, f"{name}_command")


def subcommand_names(group: argparse.ArgumentParser) -> list[str]:
    """The names of the subcommands registered on `group`."""
    sub: Subcommands = group.get_default("subcommands")
    return list(sub.choices)
