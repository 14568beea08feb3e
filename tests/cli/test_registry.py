"""A command's extra (`registry.add_command(..., needs=...)`): what cli.main says, before the
command runs, when a module it needs is not installed; and a mistyped command or choice."""

from __future__ import annotations

import argparse

import pytest
from vllm_patchset import registry
from vllm_patchset.cli import build_parser, did_you_mean, main

MISSING_EXTRA = [
    # (command, needs, the line; None: every module is installed here)
    ("status", ("git",), None),
    ("rebase", ("git", "tomlkit", "ruamel.yaml"), None),
    ("overlay apply", (), None),
]


@pytest.mark.parametrize(("command", "needs", "line"), MISSING_EXTRA)
def test_installed_modules_need_nothing(command: str, needs: tuple[str, ...], line: None) -> None:
    assert registry.missing_extra(command, needs) is line


@pytest.mark.parametrize(
    ("modules", "line"),
    [
        (
            {"no_such_ruamel.yaml": ("ruamel.yaml", "maintain")},
            "rebase needs the 'maintain' extra (missing: ruamel.yaml):"
            " `pip install 'vllm-patchset[maintain]'`",
        ),
        (
            {
                "no_such_module_a": ("dist-a", "maintain"),
                "no_such.module_b": ("dist-b", "maintain"),
            },
            "rebase needs the 'maintain' extra (missing: dist-a, dist-b):"
            " `pip install 'vllm-patchset[maintain]'`",
        ),
        (
            {"no_such_module_a": ("dist-a", "maintain"), "no_such_module_c": ("dist-c", "index")},
            "rebase needs the 'index' and 'maintain' extras (missing: dist-a, dist-c):"
            " `pip install 'vllm-patchset[index,maintain]'`",
        ),
    ],
)
def test_a_missing_module_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, modules: dict[str, tuple[str, str]], line: str
) -> None:
    """Modules that are not installed (their names made up: a dotted one whose parent is
    missing too), registered as EXTRAS entries."""
    monkeypatch.setattr(registry, "EXTRAS", {**registry.EXTRAS, **modules})
    assert registry.missing_extra("rebase", tuple(modules)) == line


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


def test_a_need_no_extra_provides_is_a_bug_at_registration() -> None:
    sub = argparse.ArgumentParser().add_subparsers()
    with pytest.raises(AssertionError, match=r"x: no extra provides \['numpy'\]"):
        registry.add_command(
            sub, "x", lambda a: 0, help="x", writes_checkout=False, needs=("numpy",)
        )


def test_every_registered_need_is_an_extra_s() -> None:
    """The checkout's commands that run git say so; the deploy commands need nothing."""
    parser = build_parser()
    needs = {}
    for name, command in parser.get_default("subcommands").choices.items():
        sub = command.get_default("subcommands")
        for inner, leaf in sub.choices.items() if sub else [("", command)]:
            needs[f"{name} {inner}".strip()] = leaf.get_default("needs")
    assert {k: v for k, v in needs.items() if v} == {
        "status": ("git",),
        "check": ("git",),
        "matrix": ("git",),
        "fetch": ("git",),
        "overlay build": ("git",),
        "tree": ("git",),
        "queue import": ("git",),
        "queue export": ("git",),
        "rebase": ("git", "tomlkit", "ruamel.yaml"),
        "validate": ("git",),
        "bundle": ("git",),
        "cache list": ("git",),
        "cache prune": ("git",),
    }
    assert all(needs[f"overlay {c}"] == () for c in ("apply", "verify", "revert", "status", "diff"))


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
