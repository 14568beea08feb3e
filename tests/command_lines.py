"""One command module's line parsed on its own: its `register_cli` on a bare parser (no global
options, no other command), the values it gives a handler (the tests in tests/commands/)."""

from __future__ import annotations

import argparse
from types import ModuleType

from vllm_patchset.registry import TOOL_PYTHON, add_subcommands

# What argparse and the registry keep on every line, beside the command's own values.
PLUMBING = ("group", "subcommands")


def parse_line(module: ModuleType, *argv: str) -> dict[str, object]:
    """The values of `argv` as `module`'s commands parse it (`func` the handler; `min_python`
    only where it is not the tool's, as for the deploy commands)."""
    parser = argparse.ArgumentParser(prog="vllm-patchset")
    module.register_cli(add_subcommands(parser, "command"))
    values = {k: v for k, v in vars(parser.parse_args(argv)).items() if k not in PLUMBING}
    if values.get("min_python") == TOOL_PYTHON:
        del values["min_python"]
    return values
