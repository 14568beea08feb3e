"""The options that several commands take, each spelled once (`add_options`), and the base
options (`--base`/`--pin`, `--git`, `--ref`) of the commands that work on an upstream tree."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def xz_level(text: str) -> int:
    """`--level`: an xz preset, 0 to 9, refused when the line is parsed (before a command
    claims or clears its build folder)."""
    if not (text.isdigit() and int(text) <= 9):
        raise argparse.ArgumentTypeError(f"xz level {text} is not in 0..9")
    return int(text)


# The options that several commands take, each spelled here once (argparse's keywords); a
# command may give one its own help (`add_options`).
SHARED_OPTIONS: dict[str, dict[str, Any]] = {
    "--git": {"metavar": "URL|PATH", "help": "a git repository holding vllm/"},
    "--ref": {"metavar": "REF", "help": "the ref of --git to use (tag, branch)"},
    "--target": {"type": Path, "metavar": "DIR", "help": "the vllm installed in DIR"},
    "--python": {"metavar": "EXE", "help": "the vllm of another interpreter"},
    "--dry-run": {"action": "store_true", "help": "say what would change, change nothing"},
    "--force": {"action": "store_true"},
    "--level": {"type": xz_level, "default": 9, "help": "xz preset, 0 (fast) .. 9 (small)"},
    "--python-version": {"default": "3.12", "help": "the GPU host's Python (wheels)"},
    "--no-wheels": {"dest": "wheels", "action": "store_false"},
    "--kit": {"type": Path},
}


def add_options(parser: argparse._ActionsContainer, *flags: str, **helps: str) -> None:
    """The shared options `flags` on `parser` (or on a group of it), each as SHARED_OPTIONS
    spells it; `helps`: the command's own help of an option, keyed by its name
    (`python_version=` for `--python-version`)."""
    for flag in flags:
        spec = dict(SHARED_OPTIONS[flag])
        spec["help"] = helps.pop(flag.removeprefix("--").replace("-", "_"), spec.get("help"))
        assert spec["help"], f"{flag}: the command gives its help"
        parser.add_argument(flag, **spec)
    assert not helps, f"helps of options not added: {sorted(helps)}"


def add_base_options(parser: argparse.ArgumentParser, version_flag: str = "--base") -> None:
    parser.add_argument(
        version_flag, dest="base", metavar="VERSION", help="a vLLM release (default: the pin)"
    )
    add_options(parser, "--git", "--ref")
