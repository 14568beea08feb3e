"""The upstream story of the backport tests: a bug in `describe` of the synthetic package that
came in with release 1.0, the pin 1.1, and upstream's fix (PR #46735) landed after it, each
case saying what the releases after it did with the fix.

    0.9   no `describe` yet                    (the bug's code is not there)
    1.0   `describe` with the bug              -> Introduced-in: 1.0
    1.1   the pin (an unrelated change)
    fix   "utils: describe dashed names (#46735)", with a test outside vllm/
    then, by case:
      landed         1.2 has the fix                                  -> Applied-upstream 1.2
      reverted       1.2 reverted it (contains the commit, not the fix), 1.3 has it again -> 1.3
      patch-release  1.1.1, from the pin, took the fix in a commit of its own; 1.2 has it -> 1.1.1
      unreleased     no release after it                              -> Applied-upstream empty
      older-code     as landed, but 0.9 has `describe` written otherwise (the code the fix
                     changes is there, changed: a conflict) -> Introduced-in 1.0, with a
                     comment that the bug may be older
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from support import git
from synthetic import BASE, MOE, UTILS, UTILS_TEXT, LocalIndex, SyntheticUpstream, make_project
from vllm_patchset.infra.config import Project

BUG = '    words = name.split("_")\n'
FIX = '    words = name.replace("-", "_").split("_")\n'
UTILS_FIXED = UTILS_TEXT.replace(BUG, FIX)
UTILS_WITHOUT = UTILS_TEXT[: UTILS_TEXT.index("\n\ndef describe")] + "\n"
FIX_SUBJECT = "utils: describe dashed names (#46735)"
FIX_BODY = "A dashed name was described as one word."
UPSTREAM_TEST = "tests/test_utils.py"
OLDER = '    words = name.split(" ")\n'  # 0.9's `describe`, in the case older-code


@dataclass(frozen=True)
class BackportStory:
    upstream: SyntheticUpstream
    project: Project
    fix: str  # the upstream commit of the fix


def commit(upstream: SyntheticUpstream, files: dict[str, str], message: str) -> str:
    for path, text in files.items():
        (upstream.path / path).parent.mkdir(parents=True, exist_ok=True)
        (upstream.path / path).write_text(text)
    git(upstream.path, "add", "-A")
    git(upstream.path, "commit", "-q", "-m", message)
    return git(upstream.path, "rev-parse", "HEAD").strip()


def backport_story(
    folder: Path, cache: Path, case: str, pin: str = "1.1", index: LocalIndex | None = None
) -> BackportStory:
    """The case's upstream, and a project pinned to its release `pin`: from `index` (every
    release published there), else the upstream's tag."""
    upstream = SyntheticUpstream(folder / "upstream")
    version = "vllm/__init__.py"
    older = UTILS_TEXT.replace(BUG, OLDER) if case == "older-code" else UTILS_WITHOUT
    upstream.release("0.9", {**BASE, version: '__version__ = "0.9"\n', UTILS: older})
    upstream.release("1.0", {version: '__version__ = "1.0"\n', UTILS: UTILS_TEXT})
    moe = upstream.files("1.0")[MOE]
    upstream.release("1.1", {version: '__version__ = "1.1"\n', MOE: "# 1.1\n" + moe})
    git(upstream.path, "checkout", "-q", "--detach", "v1.1")
    test = "def test_describe():\n    pass\n"
    fix = commit(
        upstream, {UTILS: UTILS_FIXED, UPSTREAM_TEST: test}, f"{FIX_SUBJECT}\n\n{FIX_BODY}\n"
    )
    if case == "reverted":
        commit(upstream, {UTILS: UTILS_TEXT}, f'Revert "{FIX_SUBJECT}" (#46800)')
        release(upstream, "1.2")
        commit(upstream, {UTILS: UTILS_FIXED}, "utils: describe dashed names again (#46900)")
        release(upstream, "1.3")
    elif case in ("landed", "patch-release", "older-code"):
        release(upstream, "1.2")
    if case == "patch-release":
        git(upstream.path, "checkout", "-q", "--detach", "v1.1")
        commit(upstream, {UTILS: UTILS_FIXED}, "[cherry-pick] utils: describe dashed names")
        release(upstream, "1.1.1")
        git(upstream.path, "checkout", "-q", "--detach", "v1.2")
    if index is not None:
        for version in upstream.releases:
            index.publish_release(upstream, version)
    url = index.url if index else None
    project = make_project(folder / "project", cache, upstream, pin, index_url=url)
    gpu = project.root / "tests" / "gpu"
    gpu.mkdir(parents=True)
    (gpu / "test_describe.py").write_text("def test_dashed():\n    pass\n")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "tests")
    return BackportStory(upstream, project, fix)


def release(upstream: SyntheticUpstream, version: str) -> None:
    """Tag HEAD `v<version>` (with its version in the package, as a release has)."""
    commit(upstream, {"vllm/__init__.py": f'__version__ = "{version}"\n'}, f"vllm {version}")
    git(upstream.path, "tag", f"v{version}")
    paths = git(upstream.path, "ls-files", "vllm").split()
    upstream.releases[version] = {p: (upstream.path / p).read_text() for p in paths}
