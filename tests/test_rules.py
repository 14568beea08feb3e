"""Unit tables for the rules that do not depend on today's series: version order, the state
rules, which decisions settle a patch, and the text edits a rebase makes. Plus `releases`
against a local package index."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from synthetic import LocalIndex
from vllm_patchset.cli import main
from vllm_patchset.errors import BadInput
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.upstream import Mirror, Upstream, check_version, sort_versions
from vllm_patchset.series.edits import (
    insert_entry,
    rewrite_paths,
    set_ci_images,
    set_pin,
    with_trailer,
)
from vllm_patchset.series.patches import parse_patch_bytes
from vllm_patchset.series.states import (
    HunkFinding,
    Reason,
    State,
    Verdict,
    decide,
    text_state,
    trailer_state,
)
from vllm_patchset.sync import swap
from vllm_patchset.sync.rebase_report import range_diff, short_id
from vllm_patchset.sync.rebase_rules import is_local, options
from vllm_patchset.sync.rebase_state import (
    Action,
    Choice,
    Decision,
    Phase,
    RebaseState,
    Section,
    Step,
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


# -- which decisions settle a patch --------------------------------------------------------------
def verdict(state: State, reason: Reason) -> Verdict:
    return Verdict("k", "1.1", state, reason, state, None, ())


KEEP, DROP, UP, PORT = Choice.KEEP, Choice.DROP, Choice.RESOLVE_UPSTREAM, Choice.PORT
OPTIONS = [
    # (section, state, reason, local patch, the bug located) -> options
    (Section.SERIES, A, Reason.APPLIES, False, False, ()),
    (Section.SERIES, A, Reason.MOVED, False, False, ()),
    (Section.SERIES, U, Reason.UPSTREAM, False, False, ()),  # archived with its release
    (Section.SERIES, U, Reason.UPSTREAM, True, False, (UP, KEEP, DROP)),  # never archived unasked
    (Section.SERIES, C, Reason.CONFLICT, False, False, (KEEP, DROP, UP)),  # or resolved by hand
    (Section.SERIES, C, Reason.REWRITTEN, True, False, (KEEP, DROP, UP)),
    (Section.SERIES, C, Reason.AMBIGUOUS, False, False, (KEEP, DROP, UP)),
    # The bug is there: ported by hand first (never only decisions that leave it live).
    (Section.SERIES, C, Reason.AMBIGUOUS, False, True, (PORT, KEEP, DROP)),
    (Section.SERIES, C, Reason.REWRITTEN, False, True, (PORT, KEEP, DROP)),  # partly gone
    (Section.SERIES, C, Reason.UNREADABLE, False, True, (PORT, KEEP, DROP)),  # past the bounds
    (Section.SERIES, X, Reason.NEVER_THERE, False, False, (KEEP, DROP)),
    (Section.UPSTREAMED, U, Reason.UPSTREAM, False, False, ()),
    (Section.UPSTREAMED, X, Reason.NEVER_THERE, False, False, ()),
    (
        Section.UPSTREAMED,
        A,
        Reason.APPLIES,
        False,
        False,
        (KEEP, DROP),
    ),  # upstream reverted the fix
    (Section.UPSTREAMED, C, Reason.CONFLICT, False, False, ()),  # fixed in other words
    (Section.UPSTREAMED, C, Reason.REWRITTEN, False, False, (DROP,)),  # its code is gone
    (Section.UPSTREAMED, C, Reason.CONFLICT, False, True, (KEEP, DROP)),  # the bug is back
    (Section.UPSTREAMED, C, Reason.AMBIGUOUS, False, True, (KEEP, DROP)),  # ... elsewhere
    (Section.PARKED, A, Reason.APPLIES, True, False, ()),
    (Section.PARKED, C, Reason.REWRITTEN, True, False, ()),
]


@pytest.mark.parametrize(("section", "state", "reason", "local", "bug", "expected"), OPTIONS)
def test_options(
    section: Section,
    state: State,
    reason: Reason,
    local: bool,
    bug: bool,
    expected: tuple[Choice, ...],
) -> None:
    """`--resolve-upstream` only where the text shows no bug; an archived patch whose bug is
    back is a decision (carry it again, or drop it) however it applies."""
    pr = "none (local)" if local else "https://github.com/vllm-project/vllm/pull/1"
    patch = parse_patch_bytes(patch_with("1.0", "", pr), Path("x.patch"))
    assert is_local(patch) == local
    found = dataclasses.replace(verdict(state, reason), bug_present=bug)
    assert options(section, found, patch) == expected


@pytest.mark.parametrize(
    ("pr", "local"),
    [("none", True), ("None (local)", True), ("", True), ("https://github.com/x/y/pull/3", False)],
)
def test_is_local(pr: str, local: bool) -> None:
    raw = patch_with("1.0", "").replace(
        b"Upstream-PR: https://x/pull/1", f"Upstream-PR: {pr}".encode()
    )
    assert is_local(parse_patch_bytes(raw, Path("x.patch"))) == local


# -- the journal ---------------------------------------------------------------------------------
def test_state_round_trip() -> None:
    finding = HunkFinding("vllm/x.py", 1, "@@ -1 +1 @@", None, None, False, True, ("a",), ("b",), 3)
    moved = Verdict(
        "0001-x.patch",
        "git:v1.1",
        State.CONFLICT,
        Reason.MOVED,
        State.CONFLICT,
        State.APPLIES,
        (finding,),
        ("moved: a -> b",),
        ("cosmetic",),
        "conflict",
        (("a", "b"),),
        ("c", "d"),
    )
    step = Step(
        "0001-x.patch",
        "0001-x.patch",
        Section.SERIES,
        moved,
        Action.CONFLICT,
        Choice.KEEP,
        (Choice.KEEP, Choice.DROP),
        ("n",),
        "c0ffee",
    )
    state = RebaseState(
        phase=Phase.STOPPED,
        old_pin="1.0",
        onto=Upstream("git:v1.1", "1.1", "git/v1.1", "abc", "git:local:v1.1@def"),
        git="/somewhere",
        ref="v1.1",
        project_head="123",
        decisions=(Decision("0001-x.patch", Choice.RESOLVE_UPSTREAM, "1.1"),),
        applied_before=("0001-x.patch",),
        renames=(("a", "b"),),
        steps=(step,),
        stop=Action.CONFLICT,
        stopped_head="456",
        moves=("patches",),
    )
    assert RebaseState.from_json(state.to_json()) == state
    # The journal spells phase, stop and action as strings (one written before they were enums
    # reads the same).
    doc = json.loads(state.to_json())
    assert (doc["phase"], doc["stop"], doc["steps"][0]["action"]) == (
        "stopped",
        "conflict",
        "conflict",
    )


# The torch a release requires, read from its sdist's requirements/cuda.txt (name -> bytes of the
# sdist's members before it, that member -> the torch read): within the bound, over it (refused,
# never read whole: no torch said), and none there.
CUDA_TXT = "vllm-9.9/requirements/cuda.txt"
TORCH_OF_SDIST = [
    ({"vllm-9.9/PKG-INFO": b"x", CUDA_TXT: b"torch==2.14.0\n"}, "2.14.0"),
    ({CUDA_TXT: b"torch==2.14.0\n" + b"#" * (swap.REQUIREMENTS_BOUND + 1)}, None),
    ({"vllm-9.9/PKG-INFO": b"x"}, None),
]


@pytest.mark.parametrize(("members", "torch"), TORCH_OF_SDIST)
def test_torch_of_the_sdist(tmp_path: Path, members: dict[str, bytes], torch: str | None) -> None:
    mirror = Mirror(tmp_path / "cache")
    mirror.sdists.mkdir()
    with tarfile.open(mirror.sdists / "vllm-9.9.tar.gz", "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    onto = Upstream("9.9", "9.9", "v9.9", "abc", "pypi:vllm-9.9.tar.gz sha256:0")
    assert swap._torch(mirror, onto) == torch


# -- text edits ----------------------------------------------------------------------------------
PYPROJECT = """\
[project]
name = "p"
# the GPU extras
[project.optional-dependencies]
gpu = ["torch==2.11.0", "vllm==0.24.0"]  # keep this comment

[tool.vllm-patchset]
pin = "0.24.0"  # the pin
package = "vllm"

[tool.other]
x = 1
"""
SET_PIN = [
    # (arguments, the lines that change: old -> new)
    (
        {"pin": "0.25.1"},
        {
            'pin = "0.24.0"  # the pin': 'pin = "0.25.1"  # the pin',
            'gpu = ["torch==2.11.0", "vllm==0.24.0"]  # keep this comment': 'gpu = ["torch==2.11.0", "vllm==0.25.1"]  # keep this comment',
        },
    ),
    (
        {"pin": "1.1", "ref": "v1.1", "commit": "c0ffee", "requirement": False},
        {
            'pin = "0.24.0"  # the pin': 'pin = "1.1"  # the pin\npin-ref = "v1.1"\npin-commit = "c0ffee"'
        },
    ),
    (
        {
            "pin": "1.1",
            "ref": "v1.1",
            "commit": "c0ffee",
            "git_url": "https://github.com/vllm-project/vllm",
            "requirement": False,
        },
        {
            'pin = "0.24.0"  # the pin': 'pin = "1.1"  # the pin\npin-git = "https://github.com/vllm-project/vllm"\npin-ref = "v1.1"\npin-commit = "c0ffee"'
        },
    ),
]


@pytest.mark.parametrize(("arguments", "changes"), SET_PIN)
def test_set_pin_keeps_the_rest_of_the_file(
    arguments: dict[str, object], changes: dict[str, str]
) -> None:
    pin = str(arguments.pop("pin"))
    expected = PYPROJECT
    for old, new in changes.items():
        expected = expected.replace(old, new)
    assert set_pin(PYPROJECT, pin, **arguments) == expected  # type: ignore[arg-type]
    # And back: a release pin drops the git keys again.
    assert set_pin(expected, "0.24.0") == PYPROJECT


REQUIREMENTS = """\
[project]
name = "p"
dependencies = ["gitpython", "vllm == 0.24.0"]

[project.optional-dependencies]
gpu = ["vllm>=0.20", "torch"]
cpu = ["vllm==0.24.0"]

[tool.vllm-patchset]
pin = "0.24.0"
"""
SET_PIN_MORE = [
    # (text, pin, requirement, expected)
    (  # every `vllm==` requirement follows (spaces or not), a range is left alone
        REQUIREMENTS,
        "0.25.0",
        True,
        REQUIREMENTS.replace('"vllm == 0.24.0"', '"vllm==0.25.0"')
        .replace('"vllm==0.24.0"', '"vllm==0.25.0"')
        .replace('pin = "0.24.0"', 'pin = "0.25.0"'),
    ),
    (REQUIREMENTS, "0.25.0", False, REQUIREMENTS.replace('pin = "0.24.0"', 'pin = "0.25.0"')),
    (  # a git pin becomes a release pin: its keys go, the others stay
        '[tool.vllm-patchset]\npin = "1.1"\npin-git = "x"\npin-ref = "v1.1"\npin-commit = "c"\n'
        'index-url = "u"\n',
        "0.25.0",
        True,
        '[tool.vllm-patchset]\npin = "0.25.0"\nindex-url = "u"\n',
    ),
]


@pytest.mark.parametrize(("text", "pin", "requirement", "expected"), SET_PIN_MORE)
def test_set_pin_requirements_and_git_keys(
    text: str, pin: str, requirement: bool, expected: str
) -> None:
    assert set_pin(text, pin, requirement=requirement) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[tool.other]\nx = 1\n", "pyproject.toml: no `pin` in [tool.vllm-patchset]"),
        ("[tool.vllm-patchset\npin = 1\n", "pyproject.toml: not valid TOML ("),
    ],
)
def test_set_pin_refuses(text: str, message: str) -> None:
    with pytest.raises(BadInput) as error:
        set_pin(text, "0.25.0")
    assert str(error.value).startswith(message)


CI = """\
jobs:
  cuda:
    name: CUDA (vLLM 0.24.0 image)
    container:
      image: vllm/vllm-openai:v0.24.0
  rocm:
    name: ROCm (vLLM 0.24.0 image)  # vLLM PR #46254 shipped untested on ROCm
    container:
      image: vllm/vllm-openai-rocm:v0.24.0
      plugin: docker#v5.12.0
"""


@pytest.mark.parametrize("version", ["0.25.1", "0.26.0rc1"])
def test_ci_images_follow_the_pin(version: str) -> None:
    assert set_ci_images(CI, version) == CI.replace("0.24.0", version)


CHANGELOG_CASES = [
    (
        "",
        "# Changelog\n\nAll notable changes to this patch set are documented in this file.\nThe format is based on [Keep a Changelog](https://keepachangelog.com/en/1.1.0/).\n\n## [Unreleased]\n\nE\n",
    ),
    ("# C\n\n## [Unreleased]\n\n- x\n", "# C\n\n## [Unreleased]\n\n- x\n\nE\n"),
    (
        "# C\n\n## [Unreleased]\n- x\n\n## [vllm-0.24.0] - d\n- y\n",
        "# C\n\n## [Unreleased]\n- x\n\nE\n\n## [vllm-0.24.0] - d\n- y\n",
    ),
    ("# C\n\n## [vllm-0.24.0] - d\n- y\n", "# C\n\nE\n\n## [vllm-0.24.0] - d\n- y\n"),
    ("# C\n\n## Unreleased\n- x", "# C\n\n## Unreleased\n- x\n\nE\n"),  # no brackets, no \n
    (
        "# C\n\n## [unreleased]\n\n## [vllm-1.0] - d\n",
        "# C\n\n## [unreleased]\n\nE\n\n## [vllm-1.0] - d\n",
    ),
    ("# C\n", "# C\n\nE\n"),  # no section yet
]


@pytest.mark.parametrize(("changelog", "expected"), CHANGELOG_CASES)
def test_changelog_entry_goes_after_unreleased(changelog: str, expected: str) -> None:
    assert insert_entry(changelog, "E\n") == expected


RAW = b"From 0\nSubject: [PATCH] x\n\nWhy.\n\nApplied-upstream:\nRegression-test: t\n---\n x | 1 +\n\ndiff --git a/vllm/a.py b/vllm/a.py\nindex 1..2 100644\n--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1 +1 @@\n-Applied-upstream: a\n+b\n"


@pytest.mark.parametrize(
    ("release", "line"), [("0.25.0", b"Applied-upstream: 0.25.0"), ("", b"Applied-upstream:")]
)
def test_with_trailer_changes_the_message_only(release: str, line: bytes) -> None:
    out = with_trailer(RAW, release)
    assert out == RAW.replace(b"\nApplied-upstream:\n", b"\n" + line + b"\n", 1)
    assert out.endswith(b"-Applied-upstream: a\n+b\n")  # the diff is not touched
    # And back; a message with no such trailer is left as it is.
    assert with_trailer(out, "") == RAW
    no_trailer = RAW.replace(b"Applied-upstream:\nRegression", b"Regression", 1)
    assert with_trailer(no_trailer, release) == no_trailer


HEADERS = b"diff --git a/vllm/a.py b/vllm/a.py\nindex 1..2 100644\n--- a/vllm/a.py\n+++ b/vllm/a.py"
TWO_FILES = RAW + RAW[RAW.index(b"diff --git") :].replace(b"vllm/a.py", b"vllm/c.py")
REWRITES = [
    # (patch, moves, the patch expected)
    (
        RAW,
        {"vllm/a.py": "vllm/b/a.py"},
        RAW.replace(HEADERS, HEADERS.replace(b"vllm/a.py", b"vllm/b/a.py")),
    ),
    (RAW, {"vllm/other.py": "vllm/x.py"}, RAW),
    (RAW, {"vllm/a": "vllm/b"}, RAW),  # whole paths only, never a prefix
    (
        TWO_FILES,
        {"vllm/c.py": "vllm/d.py", "vllm/a.py": "vllm/e.py"},
        TWO_FILES.replace(HEADERS, HEADERS.replace(b"vllm/a.py", b"vllm/e.py")).replace(
            HEADERS.replace(b"vllm/a.py", b"vllm/c.py"), HEADERS.replace(b"vllm/a.py", b"vllm/d.py")
        ),
    ),
    (
        RAW[: RAW.index(b"\ndiff --git")],
        {"vllm/a.py": "vllm/b.py"},
        RAW[: RAW.index(b"\ndiff --git")],
    ),
]


@pytest.mark.parametrize(("raw", "moves", "expected"), REWRITES)
def test_rewrite_paths_moves_the_diff_headers_only(
    raw: bytes, moves: dict[str, str], expected: bytes
) -> None:
    """The message (which quotes `-Applied-upstream: a` here) and the hunks are kept."""
    assert rewrite_paths(raw, moves) == expected


RANGE_DIFFS = [
    (RAW, RAW, None, ("unchanged", "")),
    (
        RAW,
        RAW.replace(b"@@ -1 +1 @@", b"@@ -7 +7 @@").replace(b"index 1..2", b"index 3..4"),
        None,
        ("context-only churn", ""),
    ),
    (
        RAW,
        rewrite_paths(RAW, {"vllm/a.py": "vllm/b.py"}),
        {"vllm/a.py": "vllm/b.py"},
        ("unchanged", ""),
    ),
    (
        RAW,
        RAW.replace(b"+b\n", b"+c\n"),
        None,
        (
            "content changed",
            "--- old patch\n+++ new patch\n@@ -4,4 +4,4 @@\n @@ \n -Applied-upstream: a\n-+b\n++c\n \n",
        ),
    ),
    (RAW, RAW.replace(b"Why.", b"Why, in other words."), None, ("context-only churn", "")),
    (
        RAW,
        rewrite_paths(RAW, {"vllm/a.py": "vllm/b.py"}).replace(b"+b\n", b"+c\n"),
        {"vllm/a.py": "vllm/b.py"},
        (
            "content changed",
            "--- old patch\n+++ new patch\n@@ -4,4 +4,4 @@\n @@ \n -Applied-upstream: a\n-+b\n++c\n \n",
        ),
    ),
]


@pytest.mark.parametrize(("old", "new", "moves", "expected"), RANGE_DIFFS)
def test_range_diff(
    old: bytes, new: bytes, moves: dict[str, str] | None, expected: tuple[str, str]
) -> None:
    assert range_diff(old, new, moves) == expected


@pytest.mark.parametrize(
    ("key", "keys", "short"),
    [
        ("0002-x.patch", ("0001-a.patch", "0002-x.patch"), "0002"),
        ("upstreamed/0001-a.patch", ("upstreamed/0001-a.patch", "0001-b.patch"), "upstreamed/0001"),
        ("0001-b.patch", ("0001-b.patch", "0001-c.patch"), "0001-b.patch"),  # two 0001s
        ("fix.patch", ("fix.patch",), "fix.patch"),
    ],
)
def test_short_ids(key: str, keys: tuple[str, ...], short: str) -> None:
    assert short_id(key, keys) == short


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
