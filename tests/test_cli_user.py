"""The command line as a user meets it: help, --version, global options anywhere, one JSON shape
for every command and every error, usage errors in one line, the readable matrix, `overlay
diff`, colours and progress on a terminal only, and the deploy commands outside a checkout.

Terminal behaviour is tried on a real pseudo-terminal (pty): rich decides from the stream."""

from __future__ import annotations

import argparse
import json
import os
import pty
import random
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import export_committed
from synthetic import STORY_ARCHIVED, STORY_FIX, STORY_LOCAL, LocalIndex, Story, sdist_bytes
from vllm_install import (
    ADDED,
    CHANGED,
    EDITED,
    OVERLAID,
    PATCHES,
    Overlay,
    Pristine,
    by_patch,
    replace_file,
)
from vllm_patchset.cli import DESCRIPTION, EXIT_CODES, build_parser, main
from vllm_patchset.gpu.kitbuild import write_kit
from vllm_patchset.infra.config import Project

SERIES = ", ".join(PATCHES)


HEAD = ("ok", "command", "exit_code")


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The colour and terminal settings a user's shell may hold are each case's to give."""
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLORTERM"):
        monkeypatch.delenv(name, raising=False)


def cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def tool(
    *argv: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """The tool in a process of its own (exit code, stdout, stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "vllm_patchset", *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    return done.returncode, done.stdout, done.stderr


def on_a_terminal(*argv: str | Path, env: dict[str, str], stream: str) -> tuple[int, bytes]:
    """The tool with `stream` (stdout or stderr) on a pseudo-terminal: what the terminal got."""
    leader, follower = pty.openpty()
    streams = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, stream: follower}
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm_patchset", *map(str, argv)],
        stdin=subprocess.DEVNULL,
        stdout=streams["stdout"],
        stderr=streams["stderr"],
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", **env},
    )
    os.close(follower)
    received = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        received += chunk
    os.close(leader)
    return process.wait(timeout=300), received


# -- help, version, global options ---------------------------------------------------------------
def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_command_option_and_argument_has_help() -> None:
    missing = [
        f"{' '.join(path) or 'vllm-patchset'} {action.option_strings or action.dest}"
        for path, parser in _parsers(build_parser())
        for action in parser._actions
        if action.dest != "help" and not action.help
    ]
    assert missing == []
    undescribed = [" ".join(p) for p, parser in _parsers(build_parser()) if not parser.description]
    assert undescribed == []
    commands = [p for p, _ in _parsers(build_parser())]
    assert ("overlay", "pack") in commands and ("overlay", "diff") in commands


def test_help_is_for_users_and_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert " ".join(out.split()).count(" ".join(DESCRIPTION.split())) == 1
    assert out.endswith(EXIT_CODES + "\n")
    with pytest.raises(SystemExit):
        main(["overlay", "revert", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Restore the files that apply replaced, byte for byte." in out
    assert (
        "--force override the hash guard only: restore the saved originals over files that"
        " changed since apply" in out
    )
    assert "exit codes: 0 success 1 a finding" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(capsys, "--version") == (0, "vllm-patchset 0.1.0\n", "")
    assert cli(capsys, "--version", "--json") == (
        0,
        json.dumps(
            {"ok": True, "command": "", "exit_code": 0, "version": "0.1.0", "overlay": None},
            indent=2,
        )
        + "\n",
        "",
    )


@pytest.mark.parametrize(
    "order",
    [
        ("--project", "{root}", "--json", "status"),
        ("status", "--project", "{root}", "--json"),
        ("--json", "status", "--project", "{root}"),
        ("--project", "{root}", "status", "--json", "--verbose"),
    ],
    ids=" ".join,
)
def test_global_options_before_or_after_the_command(
    tiny: Project, capsys: pytest.CaptureFixture[str], order: tuple[str, ...]
) -> None:
    code, out, err = cli(capsys, *(a.format(root=tiny.root) for a in order))
    assert (code, err) == (0, "")
    assert json.loads(out)["lock"] == "fresh"


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        ((), "a command is needed: status, check, releases, matrix, fetch, overlay, tree, queue,"
         " patch, backport, rebase, validate, bundle, kit, cache"),
        (("overlay",), "overlay: a subcommand is needed: build, pack, apply, verify, revert, status, diff"),
        (("queue",), "queue: a subcommand is needed: import, export"),
        (("kit", "--json"), "kit: a subcommand is needed: build, verify, assemble"),
        (("cache",), "cache: a subcommand is needed: list, prune"),
    ],
)  # fmt: skip
def test_a_command_group_alone_lists_its_commands(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], names: str
) -> None:
    code, out, err = cli(capsys, *argv)
    command = argv[0] if argv else ""
    parser = dict(_parsers(build_parser()))[(command,) if command else ()]
    assert (code, err) == (2, parser.format_help() + f"vllm-patchset: {names}\n")
    if "--json" in argv:
        assert json.loads(out) == {"ok": False, "command": command, "exit_code": 2, "error": names}
    else:
        assert out == ""


USAGE_ERRORS = [
    (("overlay", "apply", "--bogus"), "overlay apply",
     "overlay apply: unrecognized arguments: --bogus (see `vllm-patchset overlay apply --help`)"),
    (("bogus",), "",
     "unknown command 'bogus' (choose from status, check, releases, matrix, fetch, overlay,"
     " tree, queue, patch, backport, rebase, validate, bundle, kit, cache)"
     " (see `vllm-patchset --help`)"),
    (("overlay", "status", "--target", "x", "--python", "y"), "overlay status",
     "overlay status: argument --python: not allowed with argument --target"
     " (see `vllm-patchset overlay status --help`)"),
    (("validate", "--work"), "validate",
     "validate: argument --work: expected one argument (see `vllm-patchset validate --help`)"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "command", "message"), USAGE_ERRORS)
def test_usage_errors_are_one_line_and_a_json_document(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], command: str, message: str
) -> None:
    assert cli(capsys, *argv) == (2, "", f"vllm-patchset: {message}\n")
    code, out, err = cli(capsys, *argv, "--json")
    assert (code, err) == (2, f"vllm-patchset: {message}\n")
    assert json.loads(out) == {"ok": False, "command": command, "exit_code": 2, "error": message}


# -- one JSON shape --------------------------------------------------------------------------------
def _kit(tmp_path: Path) -> Path:
    """A native-ops kit of a tiny wheel (a package and its RECORD)."""
    wheel = tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/__init__.py", b"")
        archive.writestr("vllm-0.24.0.dist-info/RECORD", "vllm/__init__.py,,0\n")
    write_kit(wheel, "ab" * 32, "0.24.0", tmp_path / "kit", level=0)
    return tmp_path / "kit"


# (command, its arguments, exit code, the report's keys after "ok", "command", "exit_code")
JSON_COMMANDS = [
    ("status", (), 0, ["pin", "patches", "warnings", "disagreements", "parked", "lock"]),
    ("check", (), 0, ["patches", "problems"]),
    ("matrix", ("1.0",), 0, ["versions", "details"]),
    ("fetch", ("1.0",), 0, ["label", "version", "tag", "commit", "source"]),
    ("overlay build", (), 0, ["version", "dir", "patches", "files"]),
    ("tree", ("{tmp}/tree",), 0, ["dest", "kind"]),
    ("queue import", (), 0, ["path", "base", "patches"]),
    ("patch new", ("x: y",), 0, ["commit", "queue", "imported"]),
    ("validate", ("--build-only", "--work", "{tmp}/work"), 0, ["work", "trees"]),
    ("bundle", ("--no-wheels", "--level", "0", "--out", "{tmp}/b.tar.xz"), 0,
     ["archive", "size", "kit", "run"]),
    ("kit verify", ("{kit}",), 0, ["kit", "vllm", "parts"]),
    ("cache list", (), 0, ["cache", "size", "items"]),
    ("cache prune", ("--dry-run",), 0, ["dry_run", "removed", "freed"]),
    ("overlay status", ("--target", "{tmp}"), 2, ["error"]),
]  # fmt: skip


@pytest.mark.parametrize(("command", "args", "code", "keys"), JSON_COMMANDS, ids=lambda v: str(v))
def test_every_command_prints_one_json_document(
    tiny: Project,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    args: tuple[str, ...],
    code: int,
    keys: list[str],
) -> None:
    export_committed(["tests/gpu"], tiny.root)  # for validate, bundle
    kit = _kit(tmp_path) if command == "kit verify" else None
    words = [*command.split(), *(a.format(tmp=tmp_path, kit=kit) for a in args)]
    got, out, _ = cli(capsys, "--project", tiny.root, *words, "--json")
    doc = json.loads(out)
    assert (got, list(doc)) == (code, [*HEAD, *keys])
    assert (doc["ok"], doc["command"], doc["exit_code"]) == (code == 0, command, code)


def test_an_error_is_a_json_document_too(tiny: Project, capsys: pytest.CaptureFixture[str]) -> None:
    message = "not a vLLM version: 'latest' (expected e.g. 0.24.0)"
    assert cli(capsys, "matrix", "latest", "--project", tiny.root, "--json") == (
        2,
        json.dumps({"ok": False, "command": "matrix", "exit_code": 2, "error": message}, indent=2)
        + "\n",
        f"vllm-patchset: {message}\n",
    )


# -- the matrix -------------------------------------------------------------------------------
# The synthetic story's (tests/synthetic.py): one column of each kind of cell.
MATRIX = f"""\
version  U0001     0001                    0002
1.0      upstream  applies                 applies
1.1      upstream  upstream                conflict
1.2      upstream  conflict (rewritten) *  conflict (rewritten) *
ids (patches/):
U0001  upstreamed/{STORY_ARCHIVED.name}
0001   {STORY_FIX.name}
0002   {STORY_LOCAL.name}
states: applies (needed, applies cleanly), upstream (the version has the fix),
  absent (the code it fixes is not there), conflict (needed, does not apply);
  (verdict) when finer, * a warning below
* WARNING 1.2 0001: text says absent, trailers say applies: the code it changes
  is gone (rewritten or removed upstream)
* WARNING 1.2 0002: text says absent, trailers say applies: the code it changes
  is gone (rewritten or removed upstream)
1 cosmetic note(s) on upstreamed code (--verbose shows them)
"""


# With --verbose the cosmetic note is shown where the count was.
MATRIX_VERBOSE = MATRIX.replace(
    "1 cosmetic note(s) on upstreamed code (--verbose shows them)\n",
    "  note 1.1 0001: hunk 1 (vllm/layers/moe.py): code matches upstream, comment\n"
    "    lines differ\n",
)


def test_the_matrix_reads_in_80_columns(
    tiny: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = cli(capsys, "--project", tiny.root, "matrix", "1.2", "1.1", "1.0")
    assert (code, out) == (0, MATRIX)
    assert max(len(line) for line in out.splitlines()) <= 80
    assert err.startswith("matrix: 3 trees x 3 patches in ")
    code, out, _ = cli(capsys, "--project", tiny.root, "matrix", "1.2", "1.1", "1.0", "--verbose")
    assert (code, out) == (0, MATRIX_VERBOSE)


@pytest.mark.parametrize(("env", "coloured"), [({}, True), ({"NO_COLOR": "1"}, False)])
def test_matrix_states_are_coloured_on_a_terminal(
    tiny: Project, env: dict[str, str], coloured: bool
) -> None:
    argv = ("--project", tiny.root, "matrix", "1.2", "1.1", "1.0")
    code, shown = on_a_terminal(*argv, env={"COLUMNS": "80", **env}, stream="stdout")
    text = shown.decode().replace("\r\n", "\n")
    assert code == 0
    assert ("\x1b[32mapplies\x1b[0m" in text) is coloured
    assert ("\x1b[1;31mconflict (rewritten) *\x1b[0m" in text) is coloured
    assert (text == MATRIX) is not coloured


# -- overlay diff -------------------------------------------------------------------------------
def test_overlay_diff_is_what_apply_changes(
    overlay: Overlay, target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("--project", overlay.project.root, "overlay")
    code, out, err = cli(capsys, *args, "diff", "--target", target)
    assert (code, err) == (0, "")
    head, shows, diff = out.split("\n", 2)  # the report's line, which diff, then the diff
    assert (head, shows) == (
        f"overlay diff: differs ({target}/vllm, 0.24.0; overlay for 0.24.0: {SERIES})",
        "  shows: installed -> overlay (what `overlay apply` would change)",
    )
    headers = [line for line in diff.splitlines() if line.startswith(("--- ", "+++ "))]
    assert headers == [
        h
        for rel in OVERLAID
        for h in ("--- /dev/null" if rel in ADDED else f"--- a/{rel}", f"+++ b/{rel}")
    ]
    # The diff is a patch: applied to a copy of the installed files, it gives the overlay's.
    copy = tmp_path / "copy"
    for rel in CHANGED:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(target / rel, copy / rel)
    subprocess.run(["git", "apply", "-p1"], input=diff, text=True, cwd=copy, check=True)
    for rel in OVERLAID:
        assert (copy / rel).read_bytes() == overlay.patched(rel)

    code, out, err = cli(capsys, *args, "apply", "--dry-run", "--diff", "--target", target)
    report = "\n".join(
        [
            f"overlay apply: would apply ({target}/vllm, 0.24.0; overlay for 0.24.0: {SERIES})",
            *(f"  patch      {rel}" for rel in OVERLAID),
        ]
    )
    assert (code, out, err) == (0, f"{report}\n{diff}", "")
    code, out, _ = cli(capsys, *args, "diff", "--target", target, "--json")
    doc = json.loads(out)
    chunks = ["--- " + c for c in diff.split("\n--- ")]  # one file's diff each, in lock order
    chunks = [c.removeprefix("--- ") if i == 0 else c for i, c in enumerate(chunks)]
    assert (code, doc["outcome"], doc["shows"]) == (0, "differs", "installed -> overlay")
    assert [f["diff"] for f in doc["files"]] == [
        c if c.endswith("\n") else c + "\n" for c in chunks
    ]
    assert cli(capsys, *args, "apply", "--target", target)[0] == 0
    where = f"({target}/vllm, 0.24.0; overlay for 0.24.0: {SERIES})"
    assert cli(capsys, *args, "diff", "--target", target) == (
        0,
        f"overlay diff: no difference {where}\n"
        "  shows: installed -> overlay (what `overlay apply` would change)\n"
        "  note: the overlay is applied: `vllm-patchset overlay diff --pristine` shows what it"
        " changes in vllm 0.24.0\n",
        "",
    )
    # What the overlay changed in this vllm, once applied: pristine (the saved originals) to
    # the overlay's files, the diff that apply had to make.
    assert cli(capsys, *args, "diff", "--pristine", "--target", target) == (
        0,
        f"overlay diff: differs {where}\n"
        "  shows: pristine -> overlay (what the overlay changes in vllm 0.24.0)\n" + diff,
        "",
    )
    code, out, _ = cli(capsys, *args, "diff", "--pristine", "--target", target, "--json")
    assert (code, json.loads(out)["shows"]) == (0, "pristine -> overlay")
    assert cli(capsys, *args, "revert", "--target", target)[0] == 0
    replace_file(target / EDITED, b"edited\n")  # neither pristine nor saved: nothing to show
    assert cli(capsys, *args, "diff", "--pristine", "--target", target) == (
        1,
        "",
        f"vllm-patchset: no pristine {EDITED} at {target}: the installed file is modified and no"
        " original of the pristine one is saved there; reinstall vllm==0.24.0 to see the"
        " overlay's changes\n",
    )


@pytest.mark.parametrize(("env", "coloured"), [({}, True), ({"NO_COLOR": "1"}, False)])
def test_overlay_diff_is_coloured_on_a_terminal(
    overlay: Overlay, target: Path, env: dict[str, str], coloured: bool
) -> None:
    argv = ("--project", overlay.project.root, "overlay", "diff", "--target", target)
    code, shown = on_a_terminal(*argv, env=env, stream="stdout")
    text = shown.decode().replace("\r\n", "\n")
    assert code == 0
    assert (f"\x1b[1m+++ b/{OVERLAID[0]}\x1b[0m\n" in text) is coloured
    assert ("\x1b[31m-" in text and "\x1b[32m+" in text and "\x1b[36m@@ " in text) is coloured
    assert (f"\n+++ b/{OVERLAID[0]}\n" in text) is not coloured


# -- progress ----------------------------------------------------------------------------------
@pytest.fixture
def index_with_the_pin(story: Story, tmp_path: Path) -> Iterator[str]:
    """A local package index serving the story's pin as an sdist of a few MB (a model's data
    file beside the package: a download long enough to show its progress)."""
    files = {
        **story.upstream.files("1.0"),
        "vllm/data/table.txt": random.Random(0).randbytes(1536 << 10).hex(),
    }
    with LocalIndex(tmp_path / "index") as index:
        index.publish("vllm-1.0.tar.gz", sdist_bytes("1.0", files))
        yield index.url


def test_a_download_shows_its_progress_on_a_terminal_only(
    tiny: Project, index_with_the_pin: str, tmp_path: Path
) -> None:
    text = tiny.pyproject.read_text().replace(tiny.index_url, index_with_the_pin)
    tiny.pyproject.write_text(text)
    argv = ("--project", tiny.root, "fetch", "1.0", "--cache-dir")
    code, shown = on_a_terminal(*argv, tmp_path / "cache-a", env={}, stream="stderr")
    assert code == 0
    terminal = shown.decode("utf-8", "replace")
    assert "downloading vllm-1.0.tar.gz" in terminal
    assert " MB" in terminal  # bytes, as rich's download column shows them
    assert "importing vllm-1.0.tar.gz into the mirror" in terminal
    code, out, err = tool(*argv, tmp_path / "cache-b")
    assert (code, err) == (0, "downloaded vllm-1.0.tar.gz, sha256 verified\n")
    assert out.startswith("1.0: v1.0 ")


def test_status_and_revert_need_only_the_record(
    overlay: Overlay, target: Path, pristine: Pristine, tmp_path: Path
) -> None:
    """Outside a checkout, with a vllm-patchset that carries no overlay: status and revert
    work from what apply recorded; apply says what it needs."""
    assert tool("--project", overlay.project.root, "overlay", "apply", "--target", target)[0] == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    note = (
        "  note: no overlay given (no checkout here, none packed in this vllm-patchset):"
        " compared with the one recorded at apply"
    )
    head = f"({target}/vllm, 0.24.0; overlay for 0.24.0: {SERIES})"
    assert tool("overlay", "status", "--target", target, cwd=elsewhere) == (
        0,
        "\n".join(
            [
                f"overlay status: applied {head}",
                *(f"  patched    {r}" for r in OVERLAID),
                *by_patch("applied"),
                note,
            ]
        )
        + "\n",
        "",
    )
    assert tool("overlay", "apply", "--target", target, cwd=elsewhere) == (
        2,
        "",
        f"vllm-patchset: overlay apply needs an overlay: {elsewhere} is not in a vllm-patchset"
        " checkout and this vllm-patchset carries none; pass --project DIR (a checkout with a"
        " built overlay), or install the wheel that `vllm-patchset overlay pack` builds\n",
    )
    assert tool("overlay", "revert", "--target", target, cwd=elsewhere) == (
        0,
        "\n".join(
            [f"overlay revert: reverted {head}", *(f"  restore    {r}" for r in OVERLAID), note]
        )
        + "\n",
        "",
    )
    for rel in CHANGED:
        assert (target / rel).read_bytes() == (pristine.root / rel).read_bytes()
    assert [rel for rel in ADDED if (target / rel).exists()] == []
    assert not (target / ".vllm-patchset").exists()


def test_the_tool_s_own_environment_without_vllm_points_to_python_and_target(
    overlay: Overlay, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)  # this venv has no vllm of its own
    assert cli(capsys, "--project", overlay.project.root, "overlay", "status") == (
        2,
        "",
        f"vllm-patchset: {sys.executable} has no vllm package installed: this is"
        " vllm-patchset's own environment; name the serving one with --python EXE (its"
        " interpreter) or --target DIR (the dir holding the package)\n",
    )
