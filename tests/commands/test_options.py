"""`commands/options.py`: each shared option as every command spells it, a command's own help
in place of the shared one, and the base options."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from vllm_patchset.commands.options import SHARED_OPTIONS, add_base_options, add_options

# (flags given, line, the values parsed)
OPTIONS = [
    (("--git", "--ref"), ["--git", "/src", "--ref", "v1"], {"git": "/src", "ref": "v1"}),
    (("--target", "--python"), ["--target", "site"], {"target": Path("site"), "python": None}),
    (("--dry-run", "--force"), ["--force"], {"dry_run": False, "force": True}),
    (("--level", "--python-version"), [], {"level": 9, "python_version": "3.12"}),
    (("--level",), ["--level", "0"], {"level": 0}),
    (("--no-wheels", "--kit"), ["--no-wheels", "--kit", "k"], {"wheels": False, "kit": Path("k")}),
]


@pytest.mark.parametrize(("flags", "line", "values"), OPTIONS)
def test_shared_options_parsed(
    flags: tuple[str, ...], line: list[str], values: dict[str, object]
) -> None:
    parser = argparse.ArgumentParser()
    # The options without a shared help get the command's.
    own = [f.removeprefix("--").replace("-", "_") for f in flags if "help" not in SHARED_OPTIONS[f]]
    add_options(parser, *flags, **{name: f"{name}'s help" for name in own})
    assert vars(parser.parse_args(line)) == values


def test_a_command_s_own_help_replaces_the_shared_one() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, "--git", "--ref", ref="the ref to fetch")
    helps = {a.dest: a.help for a in parser._actions if a.dest in ("git", "ref")}
    assert helps == {"git": SHARED_OPTIONS["--git"]["help"], "ref": "the ref to fetch"}


def test_an_option_without_help_or_a_help_of_no_option_is_refused() -> None:
    with pytest.raises(AssertionError, match=r"^--force: the command gives its help$"):
        add_options(argparse.ArgumentParser(), "--force")
    with pytest.raises(AssertionError, match=r"^helps of options not added: \['kit'\]$"):
        add_options(argparse.ArgumentParser(), "--git", kit="a kit")


@pytest.mark.parametrize("flag", ["--base", "--pin"])
def test_the_base_options(flag: str) -> None:
    parser = argparse.ArgumentParser()
    add_base_options(parser, flag)
    values = vars(parser.parse_args([flag, "0.25.0", "--git", "/src"]))
    assert values == {"base": "0.25.0", "git": "/src", "ref": None}


@pytest.mark.parametrize(
    ("text", "level"),
    [("0", 0), ("9", 9), ("10", None), ("99", None), ("-1", None), ("x", None), ("", None)],
)
def test_level_is_an_xz_preset(
    text: str, level: int | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused when the line is parsed: no command has claimed its build folder yet."""
    parser = argparse.ArgumentParser(prog="p")
    add_options(parser, "--level")
    if level is not None:
        assert parser.parse_args(["--level", text]).level == level
        return
    with pytest.raises(SystemExit):
        parser.parse_args(["--level", text])
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"p: error: argument --level: xz level {text} is not in 0..9"
    )
