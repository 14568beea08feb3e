"""Bad input on the synthetic story: one clear line on stderr, exit 2 (1 for findings), nothing
written; a package index that is unreachable, does not have the release, or serves a damaged
sdist."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from synthetic import STORY_FIX, STORY_LOCAL, LocalIndex, Story, sdist_bytes
from vllm_patchset.cli import main
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.upstream import Mirror

FIX = STORY_FIX.name
SERIES = f"{FIX}\n{STORY_LOCAL.name}\n"
GOOD_HEADER = (
    "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
    "From: a <a@example.com>\nDate: Sat, 27 Jun 2026 00:00:00 +0000\nSubject: [PATCH] x\n\n"
    "Why.\n\nUpstream-PR: none\nIntroduced-by: none\nIntroduced-in: 0.24.0\n"
    "Applied-upstream:\nRegression-test: tests/test_bad_input.py\n---\n"
)
HUNK = "@@ -1,1 +1,1 @@\n-a\n+b\n"


def diff(path: str, hunk: str = HUNK) -> str:
    return f"diff --git a/{path} b/{path}\nindex 1111111..2222222 100644\n--- a/{path}\n+++ b/{path}\n{hunk}"


# (patch text, the error after "malformed patch <path>: ")
MALFORMED = [
    ("just some text\n", "no `diff --git` section"),
    (
        "diff --git a/vllm/x.py b/vllm/x.py\n" + HUNK,
        "not `git format-patch` output (no From/Subject header)",
    ),
    (GOOD_HEADER + diff("../etc/passwd"), "touches '../etc/passwd', outside the vllm/ package"),
    (GOOD_HEADER + diff("/etc/passwd"), "touches '/etc/passwd', outside the vllm/ package"),
    (GOOD_HEADER + diff("setup.py"), "touches 'setup.py', outside the vllm/ package"),
    (
        GOOD_HEADER + diff("vllm/x.py", "@@ -1,2 +1,1 @@\n-a\n+b\n"),
        "vllm/x.py: hunk line counts do not match its header",
    ),
    (GOOD_HEADER + diff("vllm/x.py", HUNK + "junk\n"), "vllm/x.py: unexpected line 'junk'"),
    (GOOD_HEADER + diff("vllm/x.py", ""), "vllm/x.py: no hunks"),
    (
        GOOD_HEADER.replace("Regression-test: tests/test_bad_input.py\n", "") + diff("vllm/x.py"),
        "missing trailer(s) Regression-test",
    ),
    (
        GOOD_HEADER.replace("Upstream-PR: none\n", "") + diff("vllm/x.py"),
        "missing trailer(s) Upstream-PR",
    ),
]


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


@pytest.mark.parametrize(("text", "reason"), MALFORMED)
def test_malformed_patch(
    tiny: Project, capsys: pytest.CaptureFixture[str], text: str, reason: str
) -> None:
    (tiny.patches_dir / "0003-bad.patch").write_text(text)
    (tiny.patches_dir / "series").write_text(f"{SERIES}0003-bad.patch\n")
    before = snapshot(tiny.root)
    # (`check` lists it with the other problems, exit 1: tests/test_sync_truth.py.)
    for argv in (["overlay", "build"], ["status"], ["matrix", "1.0"]):
        assert main(["--project", str(tiny.root), *argv]) == 2
        err = capsys.readouterr().err
        assert (
            err
            == f"vllm-patchset: malformed patch {tiny.patches_dir / '0003-bad.patch'}: {reason}\n"
        )
    assert snapshot(tiny.root) == before


SERIES_PROBLEMS = [
    (f"{SERIES}0003-missing.patch\n", None, "entry 0003-missing.patch has no file"),
    ("", None, f"{FIX} is not listed in"),
    (f"{SERIES}{FIX}\n", None, "a patch is listed twice"),
    (f"{SERIES}../evil.patch\n", None, "bad series entry '../evil.patch'"),
    (SERIES, "stray.patch", "stray.patch is not listed in"),
]


@pytest.mark.parametrize(("series", "extra", "message"), SERIES_PROBLEMS)
def test_series_problems(
    tiny: Project,
    capsys: pytest.CaptureFixture[str],
    series: str,
    extra: str | None,
    message: str,
) -> None:
    (tiny.patches_dir / "series").write_text(series)
    if extra:
        (tiny.patches_dir / extra).write_bytes((tiny.patches_dir / FIX).read_bytes())
    before = snapshot(tiny.root)
    assert main(["--project", str(tiny.root), "overlay", "build"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vllm-patchset: ") and message in err and err.count("\n") == 1
    assert snapshot(tiny.root) == before


VERSION_PROBLEMS = [
    ("9.9.9", "vllm 9.9.9 is not available from {url} (no sdist vllm-9.9.9.tar.gz)"),
    ("latest", "not a vLLM version: 'latest' (expected e.g. 0.24.0)"),
]


@pytest.mark.parametrize(("version", "message"), VERSION_PROBLEMS)
def test_unknown_version(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tiny: Project,
    story: Story,
    version: str,
    message: str,
) -> None:
    cache = tmp_path / "fresh-cache"
    argv = ["--project", str(tiny.root), "--cache-dir", str(cache)]
    assert main([*argv, "matrix", version]) == 2
    assert capsys.readouterr().err == f"vllm-patchset: {message.format(url=story.index.url)}\n"
    assert Mirror(cache).repo.tags("*") == []
    assert not (cache / "sdists").exists() or not any((cache / "sdists").iterdir())


@pytest.fixture
def local_index(tmp_path: Path) -> Iterator[LocalIndex]:
    with LocalIndex(tmp_path / "index") as index:
        yield index


def _use_index(project: Project, url: str) -> None:
    text = project.pyproject.read_text()
    assert text.count(f'index-url = "{project.index_url}"') == 1
    project.pyproject.write_text(text.replace(project.index_url, url))


def test_truncated_download_imports_nothing(
    tiny: Project,
    story: Story,
    local_index: LocalIndex,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    real = sdist_bytes("1.0", story.upstream.files("1.0"))
    sha256 = hashlib.sha256(real).hexdigest()
    local_index.publish("vllm-1.0.tar.gz", real[: len(real) // 2], sha256=sha256)
    _use_index(tiny, local_index.url)
    cache = tmp_path / "fresh-cache"
    assert main(["--project", str(tiny.root), "--cache-dir", str(cache), "overlay", "build"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"vllm-patchset: vllm-1.0.tar.gz: sha256 {hashlib.sha256(real[: len(real) // 2]).hexdigest()}"
        f" does not match the index's {sha256} (truncated or altered download; nothing was"
        " imported)\n"
    )
    assert list((cache / "sdists").iterdir()) == []
    assert Mirror(cache).repo.tags("*") == []
    assert not (tiny.overlay_dir / "vllm").exists()


def test_corrupt_sdist_with_matching_hash_imports_nothing(
    tiny: Project, local_index: LocalIndex, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local_index.publish("vllm-1.0.tar.gz", b"not a tarball" * 100)
    _use_index(tiny, local_index.url)
    cache = tmp_path / "fresh-cache"
    assert main(["--project", str(tiny.root), "--cache-dir", str(cache), "fetch", "1.0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "downloaded vllm-1.0.tar.gz, sha256 verified"
    assert err[1] == (
        f"vllm-patchset: {cache}/sdists/vllm-1.0.tar.gz is not a readable sdist (not a gzip file)"
    )
    assert Mirror(cache).repo.tags("*") == []


def test_no_network_and_no_cache(
    tiny: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_index(tiny, "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    cache = tmp_path / "fresh-cache"
    assert main(["--project", str(tiny.root), "--cache-dir", str(cache), "overlay", "build"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "vllm-patchset: cannot read the package index http://127.0.0.1:9/simple/vllm/ ("
    )
    assert err.endswith(") and the release is not cached\n")
    assert Mirror(cache).repo.tags("*") == []
    assert not (tiny.overlay_dir / "vllm").exists()


def test_second_build_runs_offline(tiny: Project, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--project", str(tiny.root), "overlay", "build"]) == 0
    _use_index(tiny, "http://127.0.0.1:9/simple")
    assert main(["--project", str(tiny.root), "overlay", "build"]) == 0
    assert main(["--project", str(tiny.root), "fetch", "1.0"]) == 0
    capsys.readouterr()


GIT_PROBLEMS = [
    (
        ["overlay", "build", "--git", "/nonexistent/repo"],
        "vllm-patchset: --git and --ref go together\n",
    ),
    (["fetch", "--git", "{tmp}/not-a-repo", "--ref", "main"], "vllm-patchset: git fetch failed: "),
    (["fetch", "--git", "{upstream}", "--ref", "no-such-ref"], "vllm-patchset: git fetch failed: "),
]


@pytest.mark.parametrize(("argv", "message"), GIT_PROBLEMS)
def test_bad_git_sources(
    tiny: Project,
    story: Story,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    (tmp_path / "not-a-repo").mkdir()
    argv = [a.format(tmp=tmp_path, upstream=story.upstream.path) for a in argv]
    assert main(["--project", str(tiny.root), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
