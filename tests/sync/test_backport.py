"""`vllm-patchset backport`: an upstream fix taken onto the pin, its provenance read from the
releases' code (the tool's classification), not from the tags that contain the commit; on the
synthetic stories of backport_story.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from backport_story import BUG, FIX_BODY, FIX_SUBJECT, UPSTREAM_TEST, backport_story
from support import cli, git
from synthetic import BUGGY, FIXED, MOE, LocalIndex
from vllm_patchset.overlay.upstream import Mirror
from vllm_patchset.series.verdict import Reason, State, Verdict
from vllm_patchset.sync import backport

PR = "https://github.com/vllm-project/vllm/pull/46735"
NEEDS_BY = "the upstream pull request that brought the bug in (its URL), or `none (why)`"
NEEDS_PR = (
    "the upstream pull request with the fix (https://github.com/vllm-project/vllm/pull/N), or"
    " `none (why)`"
)
NEEDS_IN = "the first release with the bug (e.g. 0.24.0), or `nightly`"
NEEDS_APPLIED = "the first release with the fix; empty while no release has it"
NEEDS_TEST = (
    "the test that fails on the pin and passes with the fix (tests/gpu/<file>.py::<test>; write it)"
)
OLDER_CODE = (
    "# Introduced-in: the first release whose code is the one the fix changes; 0.9 has that"
    " code changed: the bug may be older (check)\n"
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
    ("older-code", "1.2", "0.9 conflict, 1.0 applies, 1.1 applies, 1.2 upstream"),
]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("VLLM_PATCHSET_CACHE", str(folder))
    return folder


def trailers(applied: str, case: str = "") -> str:
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
        f"{OLDER_CODE if case == 'older-code' else ''}"
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
        "  Introduced-in: 1.0"
        + (" (0.9 has that code changed: the bug may be older)" if case == "older-code" else ""),
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
        f"{FIX_BODY}\n\nBackport of upstream commit {story.fix}.\n\n{trailers(applied, case)}"
    )
    assert "tests/test_utils.py" not in patch  # only the package's changes are taken
    assert git(queue, "log", "-1", "--format=%an %s") == f"t {FIX_SUBJECT}\n"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


# (what REF names, exit code, the error after "vllm-patchset: ", {upstream} and {tag_commit}
# filled in)
REFUSED = [
    (
        "46999",
        2,
        "no commit of HEAD of {upstream} names pull request #46999 in its subject (as"
        " `… (#46999)`): name the commit instead, or another --branch",
    ),
    ("0123abc", 2, "0123abc is not a commit of {upstream} (nor of its HEAD)"),
    ("46735", 1, "the pin 1.2 already has this fix: nothing to backport"),
    (
        "v1.1",
        1,
        "git am -3 of {commit} onto 1.1 changed nothing: the queue ({root}/.queue) already has"
        " it; nothing was written",
    ),
    ("only-tests", 2, "{commit} changes nothing in vllm/: nothing to backport"),
]


@pytest.mark.parametrize(
    ("ref", "code", "error"), REFUSED, ids=["no-pr", "unknown", "on-pin", "taken", "tests"]
)
def test_backport_refuses_what_it_cannot_take_and_changes_nothing(
    tmp_path: Path,
    cache: Path,
    capsys: pytest.CaptureFixture[str],
    ref: str,
    code: int,
    error: str,
) -> None:
    pin = "1.2" if "1.2" in error else "1.1"
    story = backport_story(tmp_path, cache, "landed", pin)
    upstream = story.upstream.path
    root = story.project.root
    if ref == "v1.1":
        ref = git(upstream, "rev-parse", "v1.1").strip()
    if ref == "only-tests":
        (upstream / "tests" / "test_more.py").write_text("def test_more():\n    pass\n")
        git(upstream, "add", "-A")
        git(upstream, "commit", "-q", "-m", "tests: more (#46990)")
        ref = git(upstream, "rev-parse", "HEAD").strip()
    before = outside_queue(root)
    message = error.format(upstream=upstream, commit=ref[:12], root=root)
    assert cli(capsys, root, "backport", ref, "--from", str(upstream)) == (
        code,
        "",
        f"vllm-patchset: {message}\n",
    )
    assert outside_queue(root) == before
    queue = root / ".queue"
    if queue.exists():  # imported to take it: as `queue import` made it
        base = git(queue, "rev-parse", "refs/vllm-patchset/base")
        assert git(queue, "rev-parse", "HEAD") == base


def outside_queue(root: Path) -> dict[str, bytes]:
    return {k: v for k, v in snapshot(root).items() if not k.startswith(".queue/")}


def test_a_conflict_stops_in_the_queue_with_the_steps_to_finish(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The series changes the line the fix changes: `git am -3` stops in the queue, the
    message already holds the provenance; nothing is written in patches/."""
    story = backport_story(tmp_path, cache, "landed")
    root = story.project.root
    assert cli(capsys, root, "queue", "import")[0] == 0
    queue = root / ".queue"
    utils = queue / "vllm" / "utils.py"
    utils.write_text(utils.read_text().replace(BUG, '    words = name.split("_", 1)\n'))
    git(queue, "commit", "-q", "-am", "utils: a local change of the same line")
    before = snapshot(root / "patches")
    code, out, err = cli(capsys, root, "backport", "46735", "--from", str(story.upstream.path))
    assert (code, err) == (1, "")
    assert out.splitlines()[6:] == [
        "  stopped: git am -3 onto 1.1 conflicts in vllm/utils.py",
        "next:",
        f"  1. resolve them in {queue}, then git -C {queue} add PATH..., git -C {queue} am"
        " --continue",
        f"  2. git -C {queue} commit --amend  (fill Introduced-by and Regression-test: the #"
        " lines say what each needs)",
        "  3. write the regression test in tests/gpu/ (it fails on the pin, passes with the fix)",
        "  4. vllm-patchset queue export",
        "  5. vllm-patchset overlay build --update-lock",
        "  6. vllm-patchset check",
    ]
    assert snapshot(root / "patches") == before
    message = (queue / ".git" / "rebase-apply" / "final-commit").read_text()
    assert message.endswith(trailers("1.2"))


def test_the_releases_of_the_mirror_count_where_the_clone_has_no_tags(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A clone without tags (`git clone --no-tags`), a project pinned to a release of a
    package index: the releases are those the mirror holds (PyPI's sdists, as `fetch` leaves
    them), classified the same way."""
    with LocalIndex(tmp_path / "index") as index:
        story = backport_story(tmp_path, cache, "landed", index=index)
        for version in ("1.0", "1.2"):  # the pin 1.1 is there already
            Mirror(cache, index_url=index.url).release(version)
        clone = tmp_path / "clone"
        git(tmp_path, "clone", "-q", "--no-tags", str(story.upstream.path), str(clone))
        assert git(clone, "tag") == ""
        capsys.readouterr()  # the downloads
        code, out, err = cli(capsys, story.project.root, "backport", "46735", "--from", str(clone))
    assert (code, err) == (0, "")
    assert out.splitlines()[1:5] == [
        "  classified: 1.0 applies, 1.1 applies, 1.2 upstream",
        f"  Upstream-PR: {PR}",
        "  Introduced-in: 1.0",
        "  Applied-upstream: 1.2",
    ]


def test_a_queue_with_other_problems_takes_the_fix_and_writes_nothing(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another commit of the queue lacks its trailers: the fix is taken in the queue, the
    export writes nothing, and the report names that commit's problems first."""
    story = backport_story(tmp_path, cache, "landed")
    root = story.project.root
    assert cli(capsys, root, "queue", "import")[0] == 0
    queue = root / ".queue"
    moe = queue / "vllm" / "layers" / "moe.py"
    moe.write_text(moe.read_text() + "# more\n")
    git(queue, "commit", "-q", "-am", "moe: more")
    mine = git(queue, "rev-parse", "HEAD").strip()[:12]
    before = snapshot(root / "patches")
    code, out, err = cli(capsys, root, "backport", "46735", "--from", str(story.upstream.path))
    taken = git(queue, "rev-parse", "HEAD").strip()[:12]
    assert (code, err) == (1, "")
    assert out.splitlines()[6:10] == [
        f"  taken onto 1.1 in {queue} as {taken}; not exported:",
        f"    {mine} moe: more: Upstream-PR: missing ({NEEDS_PR}); Introduced-by: missing"
        f" ({NEEDS_BY}); Introduced-in: missing ({NEEDS_IN}); Applied-upstream: missing"
        f" ({NEEDS_APPLIED}); Regression-test: missing ({NEEDS_TEST})",
        "next:",
        "  1. fix those commits (vllm-patchset queue export lists each)",
    ]
    assert snapshot(root / "patches") == before


A, X, C = State.APPLIES, State.ABSENT, State.CONFLICT
REASONS = {A: Reason.APPLIES, X: Reason.NEVER_THERE, C: Reason.CONFLICT}
INTRODUCED = [
    # (the change's state on each older release, newest first) -> (Introduced-in, changed before)
    ({}, ("0.24.0", "")),
    ({"0.23.0": A, "0.22.0": A}, ("0.22.0", "")),
    ({"0.23.0": A, "0.22.0": C, "0.21.0": A}, ("0.23.0", "0.22.0")),  # its code changed there
    ({"0.23.0": X, "0.22.0": A}, ("0.24.0", "")),  # not there yet: the search stops
]


@pytest.mark.parametrize(("older", "expected"), INTRODUCED)
def test_introduced_in_searches_back_while_the_change_applies(
    older: dict[str, State], expected: tuple[str, str]
) -> None:
    asked: list[str] = []

    def on_release(version: str) -> Verdict:
        asked.append(version)
        state = older[version]
        return Verdict("x", version, state, REASONS[state], state, None, ())

    assert backport._introduced_in(on_release, "0.24.0", list(older)) == expected
    stop = next((i for i, v in enumerate(older) if older[v] != A), len(older) - 1)
    assert asked == list(older)[: stop + 1]  # nothing classified past the stop


def digits_commit(upstream: Path, subject: str, files: dict[str, str]) -> str:
    """A commit of `files` on upstream's HEAD whose first 7 hex digits are all decimal (one
    commit in 27 is): its committer time stepped a second at a time until it is. HEAD moves
    to it."""
    for path, text in files.items():
        (upstream / path).write_text(text)
    git(upstream, "add", "-A")
    tree = git(upstream, "write-tree").strip()
    parent = git(upstream, "rev-parse", "HEAD").strip()
    for second in range(2000):
        env = {"GIT_COMMITTER_DATE": f"{1782518400 + second} +0000"}
        made = git(upstream, "commit-tree", tree, "-p", parent, "-m", subject, env=env).strip()
        if made[:7].isdigit():
            git(upstream, "update-ref", "HEAD", made)
            return made
    raise AssertionError("no all-digit commit id in 2000 tries")


def test_bare_digits_that_abbreviate_a_commit_name_it_unless_a_subject_names_them_too(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression pin: `backport 4718290` took an all-digit short commit id for a pull request
    number and failed (CI at 87fe1ce, one run in a hundred: the commit ids of the synthetic
    upstream change with the clock)."""
    story = backport_story(tmp_path, cache, "landed", "1.2")
    upstream = story.upstream.path
    root = story.project.root
    moe = (upstream / MOE).read_text()
    fix = digits_commit(
        upstream, "moe: no tensor truthiness (#47000)", {MOE: moe.replace(BUGGY, FIXED)}
    )
    code, out, err = cli(capsys, root, "backport", fix[:7], "--from", str(upstream))
    assert (code, err) == (0, ""), err
    assert "  Upstream-PR: https://github.com/vllm-project/vllm/pull/47000" in out.splitlines()
    series = (root / "patches" / "series").read_text().splitlines()
    assert series[-1] == "0001-moe-no-tensor-truthiness-47000.patch"
    # A later subject that names the same digits as a pull request: neither is guessed.
    before = outside_queue(root)
    digits_commit(upstream, f"moe: note (#{fix[:7]})", {MOE: moe})
    assert cli(capsys, root, "backport", fix[:7], "--from", str(upstream)) == (
        2,
        "",
        f"vllm-patchset: {fix[:7]} names both pull request #{fix[:7]} and commit {fix[:12]} of"
        f" {upstream}: write #{fix[:7]} for the pull request, or more of the commit id\n",
    )
    assert outside_queue(root) == before
