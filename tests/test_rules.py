"""Unit tables for the rules that do not depend on today's series: version order (the state
rules are in tests/series/test_verdict.py, a rebase step's in tests/sync/test_rebase_rules.py).
Plus `releases` against a local package index."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from synthetic import LocalIndex
from vllm_patchset.cli import main
from vllm_patchset.errors import BadInput
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.upstream import check_version, sort_versions
from vllm_patchset.series.verdict import (
    State,
)

# -- versions ------------------------------------------------------------------------------------
VERSION_ORDER = [
    # (given, PEP 440 order)
    (["0.25.1", "0.25.0", "0.24.0"], ["0.24.0", "0.25.0", "0.25.1"]),
    (["0.22.1", "0.3.0", "0.22.0", "0.10.0"], ["0.3.0", "0.10.0", "0.22.0", "0.22.1"]),
    (
        ["0.25.0", "0.25.0rc1", "0.25.0.post1", "0.25.0.dev3"],
        ["0.25.0.dev3", "0.25.0rc1", "0.25.0", "0.25.0.post1"],
    ),
    (["0.10.1.1", "0.10.1", "0.10.2"], ["0.10.1", "0.10.1.1", "0.10.2"]),
    (["0.27.1", "0.27.0", "0.26.0", "0.28.0"], ["0.26.0", "0.27.0", "0.27.1", "0.28.0"]),
]


@pytest.mark.parametrize(("given", "ordered"), VERSION_ORDER)
def test_versions_sort_by_pep_440(given: list[str], ordered: list[str]) -> None:
    assert sort_versions(given) == ordered


@pytest.mark.parametrize(
    "version", ["0.24.0", "0.25.1", "0.25.0rc1", "0.6.1.post2", "0.9.0.1", "1!2.0"]
)
def test_versions_accepted(version: str) -> None:
    assert check_version(version) == version


@pytest.mark.parametrize("version", ["latest", "v0.24.0x", "", "0.24.0-nightly", "git:nightly"])
def test_versions_refused(version: str) -> None:
    with pytest.raises(BadInput) as error:
        check_version(version)
    assert str(error.value) == f"not a vLLM version: {version!r} (expected e.g. 0.24.0)"


# -- a patch with given trailers ------------------------------------------------------------------
def patch_with(
    introduced_in: str, applied_upstream: str, upstream_pr: str = "https://x/pull/1"
) -> bytes:
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: a <a@example.com>\nDate: Sat, 27 Jun 2026 00:00:00 +0000\nSubject: [PATCH] x\n\n"
        f"Why.\n\nUpstream-PR: {upstream_pr}\nIntroduced-by: y\nIntroduced-in: {introduced_in}\n"
        f"Applied-upstream: {applied_upstream}\nRegression-test: tests/t.py::t\n---\n"
        "diff --git a/vllm/x.py b/vllm/x.py\nindex 1111111..2222222 100644\n"
        "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,1 +1,1 @@\n-a\n+b\n"
    ).encode()


A, U, X, C = State.APPLIES, State.UPSTREAM, State.ABSENT, State.CONFLICT


# -- releases on the index -----------------------------------------------------------------------
@pytest.fixture
def index_url(tmp_path: Path) -> Iterator[str]:
    """A local package index listing sdists (and a wheel, and a yanked sdist)."""
    with LocalIndex(tmp_path / "index") as index:
        for v in ("1.0", "1.1", "0.9.1", "1.1.1", "1.2rc1", "0.9", "1.1.post1", "1.3.1"):
            index.list_only({"filename": f"vllm-{v}.tar.gz", "url": "x", "hashes": {}})
        wheel = "vllm-1.4-cp38-abi3-manylinux_2_28_x86_64.whl"
        index.list_only({"filename": wheel, "url": "x", "hashes": {}})
        index.list_only({"filename": "vllm-1.3.tar.gz", "url": "x", "hashes": {}, "yanked": True})
        yield index.url


RELEASES = [
    ((), ["0.9", "0.9.1", "1.0", "1.1", "1.1.post1", "1.1.1", "1.3.1"]),
    (("--newer-than-pin",), ["1.1", "1.1.post1", "1.1.1", "1.3.1"]),
    (("--newer-than-pin", "--pre"), ["1.1", "1.1.post1", "1.1.1", "1.2rc1", "1.3.1"]),
]


def use_index(project: Project, url: str) -> None:
    text = project.pyproject.read_text()
    project.pyproject.write_text(text.replace(project.index_url, url))


@pytest.mark.parametrize(("args", "releases"), RELEASES)
def test_releases(
    tiny: Project,
    index_url: str,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    releases: list[str],
) -> None:
    use_index(tiny, index_url)
    assert main(["--project", str(tiny.root), "releases", *args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "ok": True,
        "command": "releases",
        "exit_code": 0,
        "pin": "1.0",
        "releases": releases,
        "newest": releases[-1],
    }
    assert main(["--project", str(tiny.root), "releases", *args]) == 0
    assert capsys.readouterr().out == "".join(f"{v}\n" for v in releases)


def test_releases_newer_than_a_git_pin_is_refused(
    tiny: Project, capsys: pytest.CaptureFixture[str], index_url: str
) -> None:
    use_index(tiny, index_url)
    text = tiny.pyproject.read_text()
    tiny.pyproject.write_text(text.replace('pin = "1.0"', 'pin = "git:nightly"'))
    assert main(["--project", str(tiny.root), "releases", "--newer-than-pin"]) == 2
    assert (
        capsys.readouterr().err == "vllm-patchset: the pin git:nightly is not a release version\n"
    )
