"""`commands/rebase.py`: the rebase's command line parsed into its decisions, and the lines it
refuses before the rebase runs (exact messages)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from vllm_patchset import registry
from vllm_patchset.commands import rebase
from vllm_patchset.errors import BadInput
from vllm_patchset.sync.rebase_state import Choice


def parsed(*line: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm-patchset")
    rebase.register_cli(registry.add_subcommands(parser, "command"))
    return parser.parse_args(["rebase", *line])


def test_the_decisions_in_the_order_of_the_flags() -> None:
    args = parsed("--continue", "--drop", "3", "--keep", "1", "--port", "4", "--keep", "2")
    assert rebase._choices(args) == [
        (Choice.KEEP, "1"),
        (Choice.KEEP, "2"),
        (Choice.DROP, "3"),
        (Choice.PORT, "4"),
    ]
    assert (args.needs, args.writes_checkout) == (("git", "tomlkit", "ruamel.yaml"), True)


LOCAL_PATHS = [
    # (--onto-git, a local path)
    ("../vllm", True),
    ("/src/vllm", True),
    ("https://github.com/vllm-project/vllm", False),
    ("git@github.com:vllm-project/vllm", False),
    ("host:vllm", False),
]


@pytest.mark.parametrize(("source", "local"), LOCAL_PATHS)
def test_local_path(source: str, local: bool) -> None:
    assert rebase._local_path(source) == local


REFUSED = [
    (("--onto-git", "https://x/vllm"), "--onto-git needs --ref REF"),
    (("--onto", "1.1", "--ref", "v1.1"), "--ref goes with --onto-git"),
    (("--abort", "--keep", "0001"), "--abort takes no decisions (it puts everything back)"),
    (("--abort", "--release", "1.1"), "--abort takes no decisions (it puts everything back)"),
]


@pytest.mark.parametrize(("line", "message"), REFUSED)
def test_lines_refused_before_the_rebase_runs(line: tuple[str, ...], message: str) -> None:
    args = parsed(*line)
    with pytest.raises(BadInput) as refused:
        rebase._refuse_bad_line(args, rebase._choices(args))
    assert str(refused.value) == message


def test_a_local_onto_git_is_the_callers_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    args = parsed("--onto-git", "vllm", "--ref", "v1.1")
    rebase._refuse_bad_line(args, [])
    assert args.onto_git == str(tmp_path.resolve() / "vllm")
