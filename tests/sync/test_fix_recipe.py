"""The README's recipe "Add or backport a fix", end to end on a synthetic upstream
(backport_story.py): two upstream fixes backported (by pull request number, by commit), a local
fix started with `patch new`, every problem of the queue listed by one `queue export` and fixed
with the commands it names, then the series, the lock, `check`, `overlay pack`, and the packed
wheel's overlay applied to an installed vllm of the pin, verified and reverted."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from backport_story import backport_story, commit, release
from support import cli, git
from synthetic import BUGGY, FIXED, MOE, NAME_NEW, NAME_OLD

BY = "https://github.com/vllm-project/vllm/pull/40000"
DESCRIBE_TEST = "tests/gpu/test_describe.py::test_dashed"
SERIES = [
    "0001-utils-describe-dashed-names-46735.patch",
    "0002-moe-no-tensor-truthiness-47000.patch",
    "0003-moe-say-fused-experts.patch",
]


def filled(message: str, test: str) -> str:
    """The message with the maintainer's trailers filled and the comment lines dropped (as
    `git commit --amend` in an editor leaves it)."""
    message = message.replace("Introduced-by:\n", f"Introduced-by: {BY}\n")
    message = message.replace("Regression-test:\n", f"Regression-test: {test}\n")
    return "".join(line for line in message.splitlines(True) if not line.startswith("#"))


def amend(queue: Path, test: str) -> None:
    message = git(queue, "log", "-1", "--format=%B").rstrip("\n") + "\n"
    git(queue, "commit", "-q", "--amend", "--cleanup=verbatim", "-m", filled(message, test))


def install(site: Path, files: dict[str, str], version: str) -> None:
    """The vllm of release `version` as pip installs it: its files, a dist-info, a RECORD."""
    info = f"vllm-{version}.dist-info"
    rows = []
    for path, text in sorted(files.items()):
        data = text.encode()
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(data)
        sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append([path, f"sha256={sha}", str(len(data))])
    (site / info).mkdir()
    (site / info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    )
    (site / info / "INSTALLER").write_text("pip\n")
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(
        [
            *rows,
            [f"{info}/METADATA", "", ""],
            [f"{info}/INSTALLER", "", ""],
            [f"{info}/RECORD", "", ""],
        ]
    )
    (site / info / "RECORD").write_text(out.getvalue())


def test_add_or_backport_a_fix_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("VLLM_PATCHSET_CACHE", str(cache))
    story = backport_story(tmp_path, cache, "reverted")
    upstream = story.upstream
    # A second upstream fix after 1.3, released in 1.4: the MoE bug every release had.
    moe = upstream.files("1.0")[MOE]
    git(upstream.path, "checkout", "-q", "--detach", "v1.3")
    moe_fix = commit(
        upstream,
        {MOE: "# 1.1\n" + moe.replace(BUGGY, FIXED)},
        "moe: no tensor truthiness (#47000)",
    )
    release(upstream, "1.4")
    root = story.project.root
    queue = root / ".queue"
    source = str(upstream.path)

    # 1. Backport by pull request number, then by (short) commit id: both written to the
    # series at once, each with the provenance its code tells and the maintainer's part empty.
    code, out, _ = cli(capsys, root, "backport", "#46735", "--from", source)
    assert code == 0 and "Applied-upstream: 1.3" in out, out
    code, out, _ = cli(capsys, root, "backport", moe_fix[:10], "--from", source)
    assert code == 0, out
    assert out.splitlines()[1:5] == [
        "  classified: 0.9 applies, 1.0 applies, 1.1 applies, 1.2 applies, 1.3 applies,"
        " 1.4 upstream",
        "  Upstream-PR: https://github.com/vllm-project/vllm/pull/47000",
        "  Introduced-in: 0.9",
        "  Applied-upstream: 1.4",
    ]
    assert (root / "patches" / "series").read_text().splitlines() == SERIES[:2]
    # 2. A local fix from the template, its change made, its message half done.
    assert cli(capsys, root, "patch", "new", "moe: say fused experts")[0] == 0
    (queue / MOE).write_text((queue / MOE).read_text().replace(NAME_OLD, NAME_NEW))
    half = "moe: say fused experts\n\nUpstream-PR: none (local)\nIntroduced-in: 1.1\n"
    git(queue, "commit", "-q", "-a", "--amend", "-m", half)
    # 3. One export lists every problem of every commit, and writes nothing.
    before = {p.name: p.read_bytes() for p in (root / "patches").iterdir() if p.is_file()}
    code, out, _ = cli(capsys, root, "queue", "export")
    first, second, third = (
        git(queue, "rev-parse", r).strip()[:12] for r in ("HEAD~2", "HEAD^", "HEAD")
    )
    assert code == 1
    assert [line.split(" (")[0] for line in out.splitlines()] == [
        f"{first} utils: describe dashed names",
        "  - Introduced-by: empty",
        "  - Regression-test: empty",
        f"  fix: git -C {queue} rebase -i {first}^",
        f"{second} moe: no tensor truthiness",
        "  - Introduced-by: empty",
        "  - Regression-test: empty",
        f"  fix: git -C {queue} rebase -i {second}^",
        f"{third} moe: say fused experts",
        "  - Introduced-by: missing",
        "  - Applied-upstream: missing",
        "  - Regression-test: missing",
        f"  fix: git -C {queue} commit --amend",
        f"queue export: 7 problem(s) in 3 of 3 commit(s) of {queue}; nothing was written",
    ]
    assert {p.name: p.read_bytes() for p in (root / "patches").iterdir() if p.is_file()} == before
    # 4. Fixed with the commands it names (one `git rebase -i` stopping at each), the
    # regression tests written.
    (root / "tests" / "gpu" / "test_moe.py").write_text(
        "def test_truthiness():\n    pass\n\n\ndef test_name():\n    pass\n"
    )
    editor = "sed -i 's/^pick /edit /'"
    git(queue, "-c", f"sequence.editor={editor}", "rebase", "-q", "-i", f"{first}^")
    amend(queue, DESCRIBE_TEST)
    git(queue, "rebase", "--continue")
    amend(queue, "tests/gpu/test_moe.py::test_truthiness")
    git(queue, "rebase", "--continue")
    whole = (
        "moe: say fused experts\n\nWhy: the label says which experts.\n\n"
        "Upstream-PR: none (local)\nIntroduced-by: none (local)\nIntroduced-in: 1.1\n"
        "Applied-upstream:\nRegression-test: tests/gpu/test_moe.py::test_name\n"
    )
    git(queue, "commit", "-q", "--amend", "-m", whole)
    git(queue, "rebase", "--continue")
    # 5. The series.
    assert cli(capsys, root, "queue", "export")[0] == 0
    assert (root / "patches" / "series").read_text().splitlines() == SERIES
    patch = (root / "patches" / SERIES[1]).read_text()
    assert (
        "Upstream-PR: https://github.com/vllm-project/vllm/pull/47000\n"
        f"Introduced-by: {BY}\nIntroduced-in: 0.9\nApplied-upstream: 1.4\n"
        "Regression-test: tests/gpu/test_moe.py::test_truthiness\n"
    ) in patch
    # 6. The lock, the check, the wheel.
    assert cli(capsys, root, "check")[0] == 1  # the lock is stale until it is rebuilt
    assert cli(capsys, root, "overlay", "build", "--update-lock")[0] == 0
    assert cli(capsys, root, "check") == (0, "check: 3 patches, 0 problem(s)\n", "")
    code, out, err = cli(capsys, root, "overlay", "pack", "--out", str(tmp_path / "dist"))
    assert (code, err) == (0, ""), err
    wheel = next((tmp_path / "dist").glob("*.whl"))
    # 7. The packed wheel's overlay on the pin's vllm, installed: apply, verify, revert.
    tool = tmp_path / "tool"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tool)
    site = tmp_path / "site"
    pin_files = upstream.files("1.1")
    install(site, pin_files, "1.1")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tool)}
    env.pop("VLLM_PATCHSET_CACHE")

    def run(*args: str) -> tuple[int, str, str]:
        done = subprocess.run(
            [sys.executable, "-m", "vllm_patchset", *args],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return done.returncode, done.stdout, done.stderr

    overlaid = root / "overlay" / "vllm"
    names = ", ".join(SERIES)
    assert run("--version")[1].endswith(f" (overlay for vllm 1.1: {names})\n")

    def report(command: str, outcome: str, word: str) -> tuple[int, str, str]:
        head = f"overlay {command}: {outcome} ({site / 'vllm'}, 1.1; overlay for 1.1: {names})"
        return (0, f"{head}\n  {word:10} vllm/layers/moe.py\n  {word:10} vllm/utils.py\n", "")

    assert run("overlay", "apply", "--target", str(site)) == report("apply", "applied", "patch")
    for rel in ("utils.py", "layers/moe.py"):
        assert (site / "vllm" / rel).read_bytes() == (overlaid / rel).read_bytes()
    assert FIXED in (site / MOE).read_text() and NAME_NEW in (site / MOE).read_text()
    assert run("overlay", "verify", "--target", str(site)) == report(
        "verify", "verified", "patched"
    )
    assert run("overlay", "revert", "--target", str(site)) == report(
        "revert", "reverted", "restore"
    )
    for path, text in pin_files.items():
        assert (site / path).read_text() == text
