"""Unit tables for the rules that do not depend on today's series: version order and the state
rules. Plus `releases` against a local package index."""

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
from vllm_patchset.series.patches import parse_patch_bytes
from vllm_patchset.series.states import (
    HunkFinding,
    Reason,
    State,
    decide,
    text_state,
    trailer_state,
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


# -- the trailers' state -------------------------------------------------------------------------
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


TRAILER_STATES = [
    # (Introduced-in, Applied-upstream, version, state)
    ("0.24.0", "0.25.0", "0.23.0", State.ABSENT),
    ("0.24.0", "0.25.0", "0.24.0", State.APPLIES),
    ("0.24.0", "0.25.0", "0.25.0rc1", State.APPLIES),  # a pre-release of 0.25.0 is before it
    ("0.24.0", "0.25.0", "0.25.0", State.UPSTREAM),
    ("0.24.0", "0.25.0", "0.25.0.post1", State.UPSTREAM),
    ("0.24.0", "", "0.33.0", State.APPLIES),
    ("0.20.0", "", "0.22.1", State.APPLIES),
    ("0.22.1", "", "0.22.0", State.ABSENT),
    ("nightly", "0.21.0", "0.20.2", State.ABSENT),
    ("nightly", "0.21.0", "0.21.0", State.UPSTREAM),
    ("nightly", "", "0.21.0", None),
    ("0.24.0", "0.25.0", None, None),  # a git ref with no version: the trailers cannot say
]


@pytest.mark.parametrize(("introduced", "merged", "version", "state"), TRAILER_STATES)
def test_trailer_state(
    introduced: str, merged: str, version: str | None, state: State | None
) -> None:
    patch = parse_patch_bytes(patch_with(introduced, merged), Path("x.patch"))
    assert trailer_state(patch, version) == state


# -- the state rules -----------------------------------------------------------------------------
A, U, X, C = State.APPLIES, State.UPSTREAM, State.ABSENT, State.CONFLICT
GONE_APPLIED = "it applied on the old pin; the code it changes is gone from 1.1 (rewritten or removed upstream)"
RULES = [
    # (text, trailers, was applied on the old pin, 3-way, ambiguous, pending) -> (state, reason, warnings)
    ((A, A, None, None, False, True), (A, Reason.APPLIES, ())),
    (
        (A, U, True, None, False, False),
        (
            A,
            Reason.APPLIES,
            (
                "text says applies, trailers say upstream: the bug is back (a revert?); the text"
                " decides",
            ),
        ),
    ),
    ((U, A, True, None, False, True), (U, Reason.UPSTREAM, ())),  # merged upstream, trailer pending
    (
        (U, A, True, None, False, False),
        (U, Reason.UPSTREAM, ("text says upstream, trailers say applies",)),
    ),
    (
        (U, X, None, None, False, True),
        (U, Reason.UPSTREAM, ("text says upstream, trailers say absent",)),
    ),
    ((C, A, True, "clean", False, True), (A, Reason.THREE_WAY, ())),
    ((C, A, True, "conflict", False, True), (C, Reason.CONFLICT, ())),
    (
        (C, X, None, "conflict", False, True),
        (C, Reason.CONFLICT, ("text says conflict, trailers say absent",)),
    ),
    (
        (C, U, None, "conflict", False, False),
        # The trailers never make a patch upstream: the code it changes is there.
        (
            C,
            Reason.CONFLICT,
            (
                "text says conflict, trailers say upstream: the code it changes is still there,"
                " changed; not upstream",
            ),
        ),
    ),
    ((X, X, True, None, False, True), (X, Reason.NEVER_THERE, ())),
    ((X, None, None, None, False, True), (X, Reason.NOT_FOUND, ())),
    ((X, None, False, None, False, True), (X, Reason.NOT_FOUND, ())),
    ((X, None, True, None, False, True), (C, Reason.REWRITTEN, (GONE_APPLIED,))),
    ((X, A, True, None, False, True), (C, Reason.REWRITTEN, (GONE_APPLIED,))),
    (
        (X, A, None, None, False, True),
        (
            C,
            Reason.REWRITTEN,
            (
                "text says absent, trailers say applies: the code it changes is gone (rewritten or removed upstream)",
            ),
        ),
    ),
    (
        (X, A, True, "clean", False, True),
        (
            C,
            Reason.REWRITTEN,
            (GONE_APPLIED, "3-way merge: clean, although the code it changes was not found"),
        ),
    ),
    ((X, A, True, None, True, True), (C, Reason.AMBIGUOUS, ())),
    (
        (X, U, True, None, False, False),
        # Neither the fix nor the bug: a decision, never `upstream` on the trailers' word.
        (
            C,
            Reason.REWRITTEN,
            (
                "text says absent, trailers say upstream: neither its fix nor the code it"
                " changes is there (rewritten upstream?); not taken as upstream",
            ),
        ),
    ),
]


@pytest.mark.parametrize(("signals", "expected"), RULES)
def test_state_rules(
    signals: tuple[State, State | None, bool | None, str | None, bool, bool],
    expected: tuple[State, Reason, tuple[str, ...]],
) -> None:
    text, trailers, was_applied, three_way, ambiguous, pending = signals
    got = decide(
        text,
        trailers,
        was_applied=was_applied,
        three_way=three_way,
        ambiguous=ambiguous,
        pending=pending,
        base="1.1",
    )
    assert got == expected


def finding(result_present: bool, located: bool) -> HunkFinding:
    return HunkFinding(
        "vllm/x.py", 1, "@@ -1 +1 @@", None, None, result_present, located, (), (), 0
    )


UPSTREAM, LOCATED, GONE = finding(True, True), finding(False, True), finding(False, False)
TEXT_STATES = [
    # (the hunks found, the patch applies as it is) -> the text's state
    ((GONE,), True, A),  # applying is the proof, whatever a hunk search says
    ((UPSTREAM, UPSTREAM), False, U),  # every hunk's result is there
    ((UPSTREAM, LOCATED), False, C),  # some is there, the rest is located but differs
    ((LOCATED,), False, C),
    ((UPSTREAM, GONE), False, X),  # part of it is nowhere: not upstream, not a conflict
    ((GONE,), False, X),
]


@pytest.mark.parametrize(("hunks", "applies", "state"), TEXT_STATES)
def test_text_state(hunks: tuple[HunkFinding, ...], applies: bool, state: State) -> None:
    assert text_state(hunks, applies) == state


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
