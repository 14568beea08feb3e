"""`vllm-patchset cache list` and `cache prune` on a tmp copy of the story's cache (its mirror and
the sdists of 0.9 .. 1.2, pin 1.0), with two wheels and a folder that is not the tool's: exact
text, JSON, exit codes, and what a prune keeps (the pin's files, every tag, the lock's commit)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from command_lines import parse_line
from support import cli, snapshot
from synthetic import Story
from vllm_patchset.commands import cache as cache_command
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.cache import human

PIN_WHEEL = "vllm-1.0-py3-none-any.whl"
OLD_WHEEL = "vllm-1.1-py3-none-any.whl"
IDENTITY = {"NAME": "test", "EMAIL": "test@example.invalid"}
SDISTS = ("0.9", "1.0", "1.0.1", "1.1", "1.2")


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(os.lstat(os.path.join(d, n)).st_size for d, _, names in os.walk(path) for n in names)


def _git(cache: Path, *args: str) -> str:
    mirror = str(cache / "mirror.git")
    who = {f"GIT_{r}_{k}": v for r in ("AUTHOR", "COMMITTER") for k, v in IDENTITY.items()}
    done = subprocess.run(
        ["git", "--git-dir", mirror, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **who},
    )
    return done.stdout.strip() if done.returncode == 0 else f"rc={done.returncode}"


@pytest.fixture
def cache(story: Story, tiny: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    shutil.copytree(story.cache, path, symlinks=True)
    (path / "wheels").mkdir()
    (path / "wheels" / PIN_WHEEL).write_bytes(b"w" * 1500)
    (path / "wheels" / OLD_WHEEL).write_bytes(b"o" * 2500)
    (path / "triton").mkdir()
    (path / "triton" / "kernel.bin").write_bytes(b"t" * 100)
    monkeypatch.setenv("VLLM_PATCHSET_CACHE", str(path))
    return path


def _rows(cache: Path) -> list[tuple[str, str, int, str, str]]:
    tags = len(_git(cache, "tag", "--list").split())
    sdists = [
        (v, "sdist", _size(cache / f"sdists/vllm-{v}.tar.gz"), f"sdists/vllm-{v}.tar.gz")
        for v in SDISTS
    ]
    rows = [(*row, " (pin)" if row[0] == "1.0" else " (prunable)") for row in sdists]
    rows.insert(2, ("1.0", "wheel", 1500, f"wheels/{PIN_WHEEL}", " (pin)"))
    rows.insert(5, ("1.1", "wheel", 2500, f"wheels/{OLD_WHEEL}", " (prunable)"))
    rows.append(("mirror", "git", _size(cache / "mirror.git"), "mirror.git", f" ({tags} tags)"))
    rows.append(("other", "other", 100, "triton", ""))
    return rows


def test_cache_list(capsys: pytest.CaptureFixture[str], tiny: Project, cache: Path) -> None:
    rows = _rows(cache)
    total = sum(r[2] for r in rows)
    lines = [f"cache: {cache} ({len(rows)} items, {human(total)})"]
    size = max(len(human(r[2])) for r in rows)
    lines += [f"  {r:<6}  {k:<5}  {human(s):>{size}}  {p}{n}" for r, k, s, p, n in rows]
    assert cli(capsys, tiny.root, "cache", "list") == (0, "\n".join(lines) + "\n", "")
    code, out, err = cli(capsys, tiny.root, "cache", "list", "--json")
    doc = json.loads(out)
    assert (code, err, doc["exit_code"], doc["size"]) == (0, "", 0, total)
    assert [(i["release"], i["kind"], i["size"], i["path"]) for i in doc["items"]] == [
        r[:4] for r in rows
    ]
    assert [i["path"] for i in doc["items"] if i["prunable"]] == [
        "sdists/vllm-0.9.tar.gz",
        "sdists/vllm-1.0.1.tar.gz",
        "sdists/vllm-1.1.tar.gz",
        f"wheels/{OLD_WHEEL}",
        "sdists/vllm-1.2.tar.gz",
    ]


def test_cache_prune(capsys: pytest.CaptureFixture[str], tiny: Project, cache: Path) -> None:
    """A dry run changes nothing; the prune removes the imported sdists and the other
    release's wheel, keeps the pin's files, every tag and the lock's commit (made unreachable
    from every tag here, so only the prune's own ref keeps it), and the checkout still works
    without a download."""
    gone = [r for r in _rows(cache) if r[4] == " (prunable)"]
    freed = sum(r[2] for r in gone)
    listed = [f"  {r[3]} ({human(r[2])})" for r in gone]
    before = snapshot(cache)
    dry = "\n".join([f"would remove 5 file(s), {human(freed)}", *listed]) + "\n"
    assert cli(capsys, tiny.root, "cache", "prune", "--dry-run") == (0, dry, "")
    assert snapshot(cache) == before

    tags = _git(cache, "tag", "--list")
    tree = _git(cache, "rev-parse", "v1.0^{tree}")
    locked = _git(cache, "commit-tree", tree, "-m", "the lock's commit, from an older tool")
    stray = _git(cache, "commit-tree", tree, "-m", "left over: reachable from nothing")
    lock_path = tiny.lock_path
    lock = json.loads(lock_path.read_text())
    lock["upstream_commit"] = locked
    lock_path.write_text(json.dumps(lock, indent=2) + "\n")

    code, out, err = cli(capsys, tiny.root, "cache", "prune")
    assert (code, err) == (0, "")
    head, *rest = out.splitlines()
    assert head.startswith("removed 5 file(s), ")
    assert rest == [*listed, "mirror: unreachable objects removed, every tag kept"]
    assert sorted(p.name for p in (cache / "sdists").iterdir()) == ["vllm-1.0.tar.gz"]
    assert sorted(p.name for p in (cache / "wheels").iterdir()) == [PIN_WHEEL]
    assert (cache / "triton" / "kernel.bin").read_bytes() == b"t" * 100
    assert _git(cache, "tag", "--list") == tags
    assert _git(cache, "cat-file", "-t", locked) == "commit"
    assert _git(cache, "cat-file", "-t", stray) == "rc=128"

    code, out, err = cli(capsys, tiny.root, "fetch", "1.1")  # from the mirror: no download
    assert (code, err) == (0, "")


def test_cache_prune_needs_a_checkout(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_outside(capsys, "cache", "prune")
    assert (code, out) == (2, "")
    assert err.startswith("vllm-patchset: not in a vllm-patchset checkout (no pyproject.toml")


def cli_outside(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from vllm_patchset.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


CACHE = {"command": "cache", "writes_checkout": False, "needs": ("git",)}
CACHE_LINES = [
    (("list",), {"func": cache_command.cmd_cache_list, "cache_command": "list"}),
    (("prune",), {"func": cache_command.cmd_cache_prune, "cache_command": "prune", "dry_run": False}),
    (("prune", "--dry-run"), {"func": cache_command.cmd_cache_prune, "cache_command": "prune", "dry_run": True}),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "values"), CACHE_LINES)
def test_the_line_parsed(argv: tuple[str, ...], values: dict[str, object]) -> None:
    assert parse_line(cache_command, "cache", *argv) == {**CACHE, **values}
