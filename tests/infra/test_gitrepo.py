"""infra/gitrepo.py as a unit, on a real bare repository made here: a folder's bytes as a tree
(whatever a `.gitattributes` says), files read back, a tree edited without a worktree, a patch
applied to a tree or checked against it, the fixed identity of its commits, and git's failures
as one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_patchset.errors import BadInput, GitError
from vllm_patchset.infra.gitrepo import BOT_EMAIL, Repo, init_bare

FILES = {
    "vllm/__init__.py": b"",
    "vllm/a.py": b"one\r\ntwo\n",  # kept as it is: no filter, no eol conversion
    "vllm/sub/b.txt": b"b\n",
    ".gitattributes": b"* text eol=crlf\n",
}
PATCH = b"""\
diff --git a/vllm/sub/b.txt b/vllm/sub/b.txt
--- a/vllm/sub/b.txt
+++ b/vllm/sub/b.txt
@@ -1 +1 @@
-b
+c
"""


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return init_bare(tmp_path / "mirror.git")


@pytest.fixture
def tree(repo: Repo, tmp_path: Path) -> str:
    for rel, data in FILES.items():
        path = tmp_path / "src" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return repo.tree_from_directory(tmp_path / "src")


def test_a_folder_as_a_tree_and_its_files_read_back(repo: Repo, tree: str) -> None:
    assert repo.list_files(tree) == sorted(FILES)
    assert repo.list_files(tree, "vllm/sub") == ["vllm/sub/b.txt"]
    assert {path: repo.read_blob(tree, path) for path in FILES} == FILES
    assert repo.read_blob(tree, "vllm/none.py") is None
    assert repo.read_blob(tree, "vllm/sub") is None  # a folder is no file
    blobs = repo.blobs(tree)
    assert {path: repo.read_object(blob) for path, (_, blob) in blobs.items()} == FILES
    assert {mode for mode, _ in blobs.values()} == {"100644"}


def test_a_tree_edited_without_a_worktree(repo: Repo, tree: str) -> None:
    sub = repo.subtree(tree, "vllm")
    assert sub is not None and repo.subtree(tree, "torch") is None
    wrapped = repo.wrap_tree(sub, "vllm")
    assert repo.list_files(wrapped) == [p for p in sorted(FILES) if p.startswith("vllm/")]
    blob = repo.blobs(tree)["vllm/sub/b.txt"]
    edited = repo.with_blobs(wrapped, {"vllm/c.py": blob})
    assert repo.read_blob(edited, "vllm/c.py") == b"b\n"


def test_a_patch_on_a_tree(repo: Repo, tree: str) -> None:
    assert repo.check_apply(tree, PATCH)[0] is True
    patched = repo.apply_to_tree(tree, PATCH)
    assert repo.read_blob(patched, "vllm/sub/b.txt") == b"c\n"
    assert repo.apply_to_tree(patched, PATCH, reverse=True) == tree
    applies, words = repo.check_apply(patched, PATCH)
    assert (applies, words) == (
        False,
        "git apply failed: error: vllm/sub/b.txt: patch does not apply",
    )
    with pytest.raises(GitError) as error:
        repo.apply_to_tree(patched, PATCH)
    assert str(error.value).startswith("git apply failed: ")


def test_commits_have_a_fixed_identity_and_date(repo: Repo, tree: str) -> None:
    first = repo.commit_tree(tree, "message")
    assert repo.commit_tree(tree, "message") == first  # the same tree, the same commit
    assert repo.resolve(first) == first and repo.tree_of(first) == tree
    assert repo.commit_message(first) == "message\n\n"  # git log's %B and its newline
    assert repo.run("log", "-1", "--format=%ae %ad", "--date=unix", first) == f"{BOT_EMAIL} 0\n"
    repo.set_tag("v1", first)
    assert (repo.tags("v*"), repo.resolve("refs/tags/v1")) == (["v1"], first)
    repo.delete_ref("refs/tags/v1")
    assert repo.resolve("refs/tags/v1") is None


def test_git_failures_are_one_line(repo: Repo, tmp_path: Path) -> None:
    with pytest.raises(GitError) as error:
        repo.run("rev-parse", "--verify", "nothing^{commit}")
    assert str(error.value) == "git rev-parse failed: fatal: Needed a single revision"
    with pytest.raises(BadInput) as refused:
        repo.fetch(str(tmp_path), "-x")
    assert str(refused.value) == "a git ref '-x' is not a git ref or commit"
    with pytest.raises(BadInput) as refused:
        repo.fetch(str(tmp_path), "main:refs/heads/x")
    assert str(refused.value) == "a git ref 'main:refs/heads/x' is not a git ref or commit"
    with pytest.raises(BadInput) as refused:
        repo.set_tag("-f", "a" * 40)
    assert str(refused.value) == "a tag '-f' is not a git ref or commit"
