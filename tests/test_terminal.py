"""Output that fits the terminal, and version arguments as PEP 440 reads them.

Every report and every command's --help in 80 columns ($COLUMNS, as a pipe gets by default):
lines broken between words only (a path longer than a line stays whole, on a line of its own),
tables laid out by rich; `--version --json`; `0.24` is the release 0.24.0 wherever a version is
typed (PEP 440 holds them equal)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import cli
from synthetic import LocalIndex, Story, sdist_bytes
from test_cli_user import _parsers
from vllm_install import Overlay
from vllm_patchset.cli import build_parser
from vllm_patchset.console import fit
from vllm_patchset.infra.config import Project

WIDTH = 80


def _fits(text: str) -> list[str]:
    """The lines of `text` wider than WIDTH that could have been broken (more than one word)."""
    return [line for line in text.splitlines() if len(line) > WIDTH and " " in line.strip()]


@pytest.fixture
def columns_80(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))


# -- fitting ----------------------------------------------------------------------------------
FITTED = [
    ("a short line", "a short line"),
    (
        "states: applies (needed, applies cleanly), upstream (the version has the fix), absent",
        "states: applies (needed, applies cleanly), upstream (the version has the fix),\n  absent",
    ),
    (  # a word is never cut: `upstream` and `conflict` stay whole
        "  " + "x" * 70 + " upstream conflict",
        "  " + "x" * 70 + "\n    upstream conflict",
    ),
    ("/" + "p" * 90, "/" + "p" * 90),  # a path longer than a line: whole, on its own line
    ("    | " + "code " * 20, "    | " + "code " * 20),  # quoted code as it is
]


@pytest.mark.parametrize(("text", "fitted"), FITTED)
def test_fit_breaks_between_words_only(text: str, fitted: str) -> None:
    assert fit(text, WIDTH) == fitted


# -- every --help -----------------------------------------------------------------------------
def test_every_help_fits_80_columns(columns_80: None) -> None:
    wide = {
        " ".join(path) or "vllm-patchset": _fits(parser.format_help())
        for path, parser in _parsers(build_parser())
    }
    assert {name: lines for name, lines in wide.items() if lines} == {}


REBASE_USAGE = """\
usage: vllm-patchset rebase [-h]
                            (--onto VERSION | --onto-git URL|PATH | --continue
                             | --abort)
                            [--ref REF] [--keep PATCH] [--drop PATCH]
"""


def test_the_rebase_usage_is_broken_between_words(columns_80: None) -> None:
    parser = dict(_parsers(build_parser()))[("rebase",)]
    assert parser.format_usage().startswith(REBASE_USAGE)


# -- every report -----------------------------------------------------------------------------
# (the command line on the synthetic story's project, its exit code)
REPORTS = [
    (("status",), 0),
    (("status", "--verbose"), 0),
    (("check",), 0),
    (("matrix", "1.2", "1.1", "1.0"), 0),
    (("matrix", "1.2", "1.1", "1.0", "--verbose"), 0),
    (("overlay", "build"), 0),
    (("cache", "list"), 0),
    (("rebase", "--onto", "1.2"), 1),  # stopped: two decisions needed
]


@pytest.mark.parametrize(("argv", "code"), REPORTS, ids=lambda v: str(v))
def test_every_report_fits_80_columns(
    tiny: Project,
    capsys: pytest.CaptureFixture[str],
    columns_80: None,
    argv: tuple[str, ...],
    code: int,
) -> None:
    got, out, _ = cli(capsys, tiny.root, *argv)
    assert (got, _fits(out)) == (code, [])
    assert out.strip()


MATRIX_48 = """\
version  U0001     0001          0002
1.0      upstream  applies       applies
1.1      upstream  upstream      conflict
1.2      upstream  conflict      conflict
                   (rewritten)   (rewritten) *
                   *
"""


def test_a_narrow_terminal_wraps_cells_inside_their_columns(
    tiny: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "48")
    code, out, _ = cli(capsys, tiny.root, "matrix", "1.2", "1.1", "1.0")
    assert code == 0
    assert out.startswith(MATRIX_48)
    assert [line for line in out.splitlines() if len(line) > 48 and " " in line.strip()] == []


def test_the_deploy_reports_fit_80_columns(
    overlay: Overlay,
    target: Path,
    capsys: pytest.CaptureFixture[str],
    columns_80: None,
) -> None:
    root = overlay.project.root
    for command in ("status", "apply", "verify", "status", "revert"):
        code, out, err = cli(capsys, root, "overlay", command, "--target", str(target))
        assert (command, code, err, _fits(out)) == (command, 0, "", [])


# -- --version --json -------------------------------------------------------------------------
def test_version_as_a_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, Path("."), "--version", "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert (list(doc), doc["ok"], doc["overlay"]) == (
        ["ok", "command", "exit_code", "version", "overlay"],
        True,
        None,
    )
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", doc["version"])


# -- versions as PEP 440 reads them -----------------------------------------------------------
def test_matrix_takes_any_spelling_of_a_release(
    tiny: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    """1.0.0 and 1 are the release 1.0 (PEP 440): one row, named as the index spells it."""
    plain = cli(capsys, tiny.root, "matrix", "1.1", "1.0")
    assert cli(capsys, tiny.root, "matrix", "1.1.0", "1", "1.0.0")[:2] == plain[:2]
    assert plain[1].startswith("version  U0001     0001      0002\n1.0 ")


SPELLINGS = [
    (("rebase", "--onto", "1.0.0"), 2, "vllm-patchset: the pin 1.0 is 1.0 already: nothing to rebase\n"),
    (("overlay", "build", "--pin", "1.0.0"), 0, ""),
    (("tree", "--base", "1.00", "{tmp}/tree"), 0, ""),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "code", "err"), SPELLINGS, ids=lambda v: str(v))
def test_every_version_argument_is_read_as_pep_440(
    tiny: Project,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    argv: tuple[str, ...],
    code: int,
    err: str,
) -> None:
    words = [a.format(tmp=tmp_path) for a in argv]
    assert cli(capsys, tiny.root, *words)[::2] == (code, err)


def test_fetch_finds_the_index_s_spelling(
    tiny: Project, story: Story, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fetch 1.1.0` downloads vllm-1.1.tar.gz and stores it as 1.1; a spelling the index
    lacks is named as it was typed (normalised)."""
    with LocalIndex(tmp_path / "index") as index:
        index.publish("vllm-1.1.tar.gz", sdist_bytes("1.1", story.upstream.files("1.1")))
        text = tiny.pyproject.read_text().replace(tiny.index_url, index.url)
        tiny.pyproject.write_text(text)
        cache = tmp_path / "cache"
        code, out, err = cli(capsys, tiny.root, "--cache-dir", str(cache), "fetch", "1.1.0")
        assert (code, out.split(" ")[:2], err) == (
            0,
            ["1.1:", "v1.1"],
            "downloaded vllm-1.1.tar.gz, sha256 verified\n",
        )
        assert cli(capsys, tiny.root, "--cache-dir", str(cache), "fetch", "1.1.0.0")[:2] == (
            0,
            out,
        )
        assert cli(capsys, tiny.root, "--cache-dir", str(cache), "fetch", "V2.0") == (
            2,
            "",
            f"vllm-patchset: vllm 2.0 is not available from {index.url} (no sdist"
            " vllm-2.0.tar.gz)\n",
        )
