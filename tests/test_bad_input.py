"""Bad input: one clear line on stderr, exit 2 (1 for findings), nothing written."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_patchset.cli import main
from vllm_patchset.config import Project
from vllm_patchset.upstream import Mirror

FIX2 = "0001-triton_moe-no-tensor-truthiness-when-quantizing-defe.patch"
FUSED = "0002-nvfp4_emulation_moe-fused-NVFP4-GEMMs-over-the-route.patch"
SERIES = f"{FIX2}\n{FUSED}\n"
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
    project: Project, capsys: pytest.CaptureFixture[str], text: str, reason: str
) -> None:
    (project.patches_dir / "0003-bad.patch").write_text(text)
    (project.patches_dir / "series").write_text(f"{SERIES}0003-bad.patch\n")
    before = snapshot(project.root)
    for argv in (["overlay", "build"], ["check"], ["status"], ["matrix", "0.24.0"]):
        assert main(["--project", str(project.root), *argv]) == 2
        err = capsys.readouterr().err
        assert (
            err
            == f"vllm-patchset: malformed patch {project.patches_dir / '0003-bad.patch'}: {reason}\n"
        )
    assert snapshot(project.root) == before


SERIES_PROBLEMS = [
    (f"{SERIES}0003-missing.patch\n", None, "entry 0003-missing.patch has no file"),
    ("", None, f"{FIX2} is not listed in"),
    (f"{SERIES}{FIX2}\n", None, "a patch is listed twice"),
    (f"{SERIES}../evil.patch\n", None, "bad series entry '../evil.patch'"),
    (SERIES, "stray.patch", "stray.patch is not listed in"),
]


@pytest.mark.parametrize(("series", "extra", "message"), SERIES_PROBLEMS)
def test_series_problems(
    project: Project,
    capsys: pytest.CaptureFixture[str],
    series: str,
    extra: str | None,
    message: str,
) -> None:
    (project.patches_dir / "series").write_text(series)
    if extra:
        (project.patches_dir / extra).write_bytes((project.patches_dir / FIX2).read_bytes())
    before = snapshot(project.root)
    assert main(["--project", str(project.root), "overlay", "build"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vllm-patchset: ") and message in err and err.count("\n") == 1
    assert snapshot(project.root) == before


VERSION_PROBLEMS = [
    (
        "9.9.9",
        2,
        "vllm-patchset: vllm 9.9.9 is not available from https://pypi.org/simple (no sdist vllm-9.9.9.tar.gz)\n",
    ),
    ("latest", 2, "vllm-patchset: not a vLLM version: 'latest' (expected e.g. 0.24.0)\n"),
]


@pytest.mark.parametrize(("version", "code", "message"), VERSION_PROBLEMS)
def test_unknown_version(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    project: Project,
    version: str,
    code: int,
    message: str,
) -> None:
    cache = tmp_path / "fresh-cache"
    argv = ["--project", str(project.root), "--cache-dir", str(cache)]
    assert main([*argv, "matrix", version]) == code
    assert capsys.readouterr().err == message
    assert Mirror(cache).repo.tags("*") == []
    assert not (cache / "sdists").exists() or not any((cache / "sdists").iterdir())


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class _Index:
    """A local package index (PEP 691 JSON) serving one sdist, possibly damaged."""

    def __init__(self, root: Path) -> None:
        self.root = root
        handler = lambda *a, **k: _QuietHandler(*a, directory=str(root), **k)  # noqa: E731
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/simple"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def publish(self, name: str, served: bytes, sha256: str) -> None:
        (self.root / "files").mkdir(exist_ok=True)
        (self.root / "files" / name).write_bytes(served)
        index = self.root / "simple" / "vllm"
        index.mkdir(parents=True, exist_ok=True)
        doc = {
            "files": [
                {
                    "filename": name,
                    "url": f"{self.url[:-7]}/files/{name}",
                    "hashes": {"sha256": sha256},
                }
            ]
        }
        (index / "index.html").write_text(json.dumps(doc))


@pytest.fixture
def local_index(tmp_path: Path) -> Iterator[_Index]:
    index = _Index(tmp_path / "index")
    index.root.mkdir()
    index.thread.start()
    yield index
    index.server.shutdown()
    index.server.server_close()


def _use_index(project: Project, url: str) -> None:
    text = project.pyproject.read_text().replace(
        'index-url = "https://pypi.org/simple"', f'index-url = "{url}"'
    )
    project.pyproject.write_text(text)


def test_truncated_download_imports_nothing(
    project: Project,
    mirror: Mirror,
    local_index: _Index,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mirror.release("0.24.0")
    real = (mirror.sdists / "vllm-0.24.0.tar.gz").read_bytes()
    local_index.publish(
        "vllm-0.24.0.tar.gz", real[: len(real) // 2], hashlib.sha256(real).hexdigest()
    )
    _use_index(project, local_index.url)
    cache = tmp_path / "fresh-cache"
    assert (
        main(["--project", str(project.root), "--cache-dir", str(cache), "overlay", "build"]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("vllm-patchset: vllm-0.24.0.tar.gz: sha256 ")
    assert err.endswith(" (truncated or altered download; nothing was imported)\n")
    assert list((cache / "sdists").iterdir()) == []
    assert Mirror(cache).repo.tags("*") == []
    assert not (project.overlay_dir / "vllm").exists()


def test_corrupt_sdist_with_matching_hash_imports_nothing(
    project: Project, local_index: _Index, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = b"not a tarball" * 100
    local_index.publish("vllm-0.24.0.tar.gz", junk, hashlib.sha256(junk).hexdigest())
    _use_index(project, local_index.url)
    cache = tmp_path / "fresh-cache"
    assert main(["--project", str(project.root), "--cache-dir", str(cache), "fetch", "0.24.0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "downloaded vllm-0.24.0.tar.gz, sha256 verified"
    assert err[1] == (
        f"vllm-patchset: {cache}/sdists/vllm-0.24.0.tar.gz is not a readable sdist (not a gzip file)"
    )
    assert Mirror(cache).repo.tags("*") == []


def test_no_network_and_no_cache(
    project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_index(project, "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    cache = tmp_path / "fresh-cache"
    assert (
        main(["--project", str(project.root), "--cache-dir", str(cache), "overlay", "build"]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith(
        "vllm-patchset: cannot read the package index http://127.0.0.1:9/simple/vllm/ ("
    )
    assert err.endswith(") and the release is not cached\n")
    assert Mirror(cache).repo.tags("*") == []
    assert not (project.overlay_dir / "vllm").exists()


def test_second_build_runs_offline(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--project", str(project.root), "overlay", "build"]) == 0
    _use_index(project, "http://127.0.0.1:9/simple")
    assert main(["--project", str(project.root), "overlay", "build"]) == 0
    assert main(["--project", str(project.root), "fetch", "0.24.0"]) == 0
    capsys.readouterr()


GIT_PROBLEMS = [
    (
        ["overlay", "build", "--git", "/nonexistent/repo"],
        "vllm-patchset: --git and --ref go together\n",
    ),
    (["fetch", "--git", "{tmp}/not-a-repo", "--ref", "main"], "vllm-patchset: git fetch failed: "),
    (["fetch", "--git", "{nightly}", "--ref", "no-such-ref"], "vllm-patchset: git fetch failed: "),
]


@pytest.mark.parametrize(("argv", "message"), GIT_PROBLEMS)
def test_bad_git_sources(
    project: Project,
    nightly_repo: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    (tmp_path / "not-a-repo").mkdir()
    argv = [a.format(tmp=tmp_path, nightly=nightly_repo) for a in argv]
    assert main(["--project", str(project.root), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
