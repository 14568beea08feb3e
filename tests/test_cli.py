"""cli.main's refusals before a command runs: a command whose extra is not installed (one
line naming it, the handler never called), and a mistyped command or choice (the closest one
named, difflib); and the parser built without importing any command's work."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
from vllm_patchset import registry
from vllm_patchset.cli import did_you_mean, main


def test_a_command_that_lacks_its_extra_is_refused_before_it_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[str] = []

    def handler(args: argparse.Namespace) -> int:
        ran.append(args.command_name)
        return 0

    def register_cli(sub: registry.Subcommands) -> None:
        registry.add_command(
            sub, "needy", handler, help="needs what is not here", writes_checkout=True,
            needs=("no_such_module",),
        )  # fmt: skip

    monkeypatch.setattr(
        registry, "EXTRAS", {**registry.EXTRAS, "no_such_module": ("nsm", "maintain")}
    )
    import vllm_patchset.cli as cli

    class Module:
        pass

    module = Module()
    module.register_cli = register_cli  # type: ignore[attr-defined]
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, module))
    assert main(["needy", "--project", "/nonexistent"]) == 2
    assert ran == []
    assert capsys.readouterr() == (
        "",
        "vllm-patchset: needy needs the 'maintain' extra (missing: nsm):"
        " `pip install 'vllm-patchset[maintain]'`\n",
    )


DID_YOU_MEAN = [
    (
        "argument COMMAND: invalid choice: 'stauts' (choose from 'status', 'check', 'matrix')",
        "unknown command 'stauts': did you mean 'status'?",
    ),
    (
        "argument COMMAND: invalid choice: 'xyzzy' (choose from 'status', 'check')",
        "unknown command 'xyzzy' (choose from status, check)",
    ),
    (
        "argument --model: invalid choice: 'nvfp4-L84' (choose from 'nvfp4', 'nvfp4-L48', 'bf16')",
        "argument --model: invalid choice 'nvfp4-L84': did you mean 'nvfp4-L48'?",
    ),
    (
        "the following arguments are required: --onto",
        "the following arguments are required: --onto",
    ),
]


@pytest.mark.parametrize(("argparse_says", "line"), DID_YOU_MEAN)
def test_did_you_mean(argparse_says: str, line: str) -> None:
    assert did_you_mean(argparse_says) == line


def test_a_typo_gets_the_closest_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stauts"]) == 2
    assert capsys.readouterr() == (
        "",
        "vllm-patchset: unknown command 'stauts': did you mean 'status'? (see `vllm-patchset --help`)\n",
    )
    assert main(["overlay", "aply"]) == 2
    assert capsys.readouterr().err == (
        "vllm-patchset: overlay: unknown command 'aply': did you mean 'apply'?"
        " (see `vllm-patchset overlay --help`)\n"
    )


def test_an_error_line_fits_the_terminal_a_command_kept_whole(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one line on stderr is broken between words at $COLUMNS like any other output (it
    ran to 150-330 columns); a command in backticks is never broken."""
    monkeypatch.setenv("COLUMNS", "50")
    assert main(["stauts"]) == 2
    assert capsys.readouterr().err == (
        "vllm-patchset: unknown command 'stauts': did you\n"
        "  mean 'status'? (see `vllm-patchset --help`)\n"
    )


HEAVY = ("git", "tomlkit", "ruamel", "rich", "torch")
LIGHT_PARSER = """
import json, sys
from vllm_patchset.cli import build_parser
build_parser()
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})))
"""


def test_the_parser_imports_no_command_s_work() -> None:
    """Every command module imports the modules that do its work in its handler: the whole
    line is built on a serving image that has the core dependencies only."""
    code = LIGHT_PARSER.format(heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stderr, json.loads(done.stdout)) == (0, "", [])
