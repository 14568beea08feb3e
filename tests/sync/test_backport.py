"""`vllm-patchset backport`: an upstream fix taken onto the pin, its provenance read from the
releases' code (the tool's classification), not from the tags that contain the commit; on the
synthetic stories of backport_story.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from backport_story import FIX_BODY, FIX_SUBJECT, UPSTREAM_TEST, backport_story
from support import cli, git

PR = "https://github.com/vllm-project/vllm/pull/46735"
NEEDS_BY = "the upstream pull request that brought the bug in (its URL), or `none (why)`"
NEEDS_APPLIED = "the first release with the fix; empty while no release has it"
NEEDS_TEST = (
    "the test that fails on the pin and passes with the fix (tests/gpu/<file>.py::<test>; write it)"
)
PATCH = "0001-utils-describe-dashed-names-46735.patch"
# (case, Applied-upstream, the states the report lists: the pin's, back to the first release
# without the bug, then forward to the first with the fix)
PROVENANCE = [
    ("landed", "1.2", "0.9 absent (not-found), 1.0 applies, 1.1 applies, 1.2 upstream"),
    (
        "reverted",
        "1.3",
        "0.9 absent (not-found), 1.0 applies, 1.1 applies, 1.2 applies, 1.3 upstream",
    ),
    ("patch-release", "1.1.1", "0.9 absent (not-found), 1.0 applies, 1.1 applies, 1.1.1 upstream"),
    ("unreleased", "", "0.9 absent (not-found), 1.0 applies, 1.1 applies"),
]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("VLLM_PATCHSET_CACHE", str(folder))
    return folder


def trailers(applied: str) -> str:
    """The message's end as backport writes it: computed trailers filled, the others empty
    after a comment saying what each needs."""
    applied_line = (
        f"Applied-upstream: {applied}\n"
        if applied
        else f"# Applied-upstream: {NEEDS_APPLIED} (no release known has the fix)\n"
        "Applied-upstream:\n"
    )
    return (
        f"Upstream-PR: {PR}\n"
        f"# Introduced-by: {NEEDS_BY}\nIntroduced-by:\n"
        "Introduced-in: 1.0\n"
        f"{applied_line}"
        f"# Regression-test: {NEEDS_TEST}\nRegression-test:\n"
    )


@pytest.mark.parametrize(("case", "applied", "states"), PROVENANCE, ids=[c[0] for c in PROVENANCE])
@pytest.mark.parametrize("by", ["pr", "commit"])
def test_backport_computes_the_provenance_from_the_releases_code(
    tmp_path: Path,
    cache: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    applied: str,
    states: str,
    by: str,
) -> None:
    story = backport_story(tmp_path, cache, case)
    root = story.project.root
    ref = "46735" if by == "pr" else story.fix
    code, out, err = cli(capsys, root, "backport", ref, "--from", str(story.upstream.path))
    queue = root / ".queue"
    taken = git(queue, "rev-parse", "HEAD").strip()
    lines = [
        f"backport: {story.fix[:12]} {FIX_SUBJECT}",
        f"  classified: {states}",
        f"  Upstream-PR: {PR}",
        "  Introduced-in: 1.0",
        f"  Applied-upstream: {applied or '(empty: no release has it yet)'}",
        f"  left out (outside the package): {UPSTREAM_TEST}",
        f"  taken onto 1.1 as patches/{PATCH} (in {queue}: {taken[:12]}); the overlay lock is"
        " stale until step 4",
        "next:",
        f"  1. git -C {queue} commit --amend  (fill Introduced-by and Regression-test: the #"
        " lines say what each needs)",
        "  2. write the regression test in tests/gpu/ (it fails on the pin, passes with the fix)",
        "  3. vllm-patchset queue export",
        "  4. vllm-patchset overlay build --update-lock",
        "  5. vllm-patchset check",
    ]
    assert (code, out, err) == (0, "\n".join(lines) + "\n", "")
    assert (root / "patches" / "series").read_text() == f"{PATCH}\n"
    patch = (root / "patches" / PATCH).read_text()
    message = patch.split("\n\n", 1)[1].split("\n---\n", 1)[0] + "\n"
    assert message == (
        f"{FIX_BODY}\n\nBackport of upstream commit {story.fix}.\n\n{trailers(applied)}"
    )
    assert "tests/test_utils.py" not in patch  # only the package's changes are taken
    assert git(queue, "log", "-1", "--format=%an %s") == f"t {FIX_SUBJECT}\n"
