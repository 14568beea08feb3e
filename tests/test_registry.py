"""A command's extra (`registry.add_command(..., needs=...)`): the one line `missing_extra`
gives when a module a command needs is not installed, and every command's needs."""

from __future__ import annotations

import argparse

import pytest
from vllm_patchset import registry
from vllm_patchset.cli import build_parser

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
        "patch new": ("git",),
        "backport": ("git",),
        "rebase": ("git", "tomlkit", "ruamel.yaml"),
        "validate": ("git",),
        "bundle": ("git",),
        "cache list": ("git",),
        "cache prune": ("git",),
    }
    assert all(needs[f"overlay {c}"] == () for c in ("apply", "verify", "revert", "status", "diff"))
