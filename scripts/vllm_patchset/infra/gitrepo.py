"""The one git boundary: every git call of the project goes through here.

GitPython runs the git command line; its errors become `GitError` with git's own `fatal:` line.
Commits made here have a fixed identity and date, so the same tree gives the same commit id
in every mirror.

Git runs with a clean environment (`gitargs.git_env`: the caller's `GIT_*` variables dropped,
but for the few that say how to reach a remote). A value from data or the command line never
reaches git where it could read as an option: a revision or ref that starts with `-` is
refused, sources are checked (`gitargs.py`), and `--` goes before repositories and paths.

Answers that depend on git objects alone (a file of a tree, whether a patch applies to a
tree, the tree it makes) are asked of git once per process and repository (`gitmemo.py`): an
object id names the same bytes forever. Revisions that are names (tags, HEAD) are asked
every time.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from vllm_patchset.errors import BadInput, GitError, NoGit
from vllm_patchset.infra import fsio
from vllm_patchset.infra.fsio import child
from vllm_patchset.infra.gitargs import check_rev, check_source, git_argv, git_env
from vllm_patchset.infra.gitmemo import Memo

BOT_NAME = "vllm-patchset"
BOT_EMAIL = "vllm-patchset@users.noreply.github.com"
FIXED_DATE = "1970-01-01T00:00:00+00:00"
_BOT_ENV = {
    "GIT_AUTHOR_NAME": BOT_NAME,
    "GIT_AUTHOR_EMAIL": BOT_EMAIL,
    "GIT_COMMITTER_NAME": BOT_NAME,
    "GIT_COMMITTER_EMAIL": BOT_EMAIL,
    "GIT_AUTHOR_DATE": FIXED_DATE,
    "GIT_COMMITTER_DATE": FIXED_DATE,
}
# format-patch output that is byte-identical across machines and git configs.
FORMAT_PATCH_ARGS = (
    "--zero-commit",
    "--full-index",
    "--no-signature",
    "--no-numbered",
    "--no-renames",
    "--no-binary",
    "--stat=80",
    "--stat-graph-width=20",
    "--subject-prefix=PATCH",
)


# About 2,000 files of a vLLM release's package, read by a rebase; a blob larger than
# _MEMO_BLOB_BYTES is read again each time (at most 512 MiB held, typically a few MiB).
_MEMO = Memo(4096)
_MEMO_BLOB_BYTES = 128 << 10


@dataclass(frozen=True)
class Repo:
    """A git repository: the upstream mirror (bare) or a worktree of it."""

    path: Path

    def run(self, *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None) -> str:
        return self.run_bytes(*args, env=env, stdin=stdin).decode("utf-8", "surrogateescape")

    def run_bytes(
        self, *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None
    ) -> bytes:
        git = _gitpython()
        full_env = git_env(env)
        cmd = git.Git(str(self.path))
        with fsio.scratch_file() as stdin_file:
            if stdin is not None:
                stdin_file.write(stdin)
                stdin_file.seek(0)
            try:
                # A killed run leaves no git running (fsio.child).
                argv, preexec = child(
                    git_argv(
                        ["-c", "core.quotepath=off", "-c", "core.autocrlf=false", *args], full_env
                    )
                )
                out = cmd.execute(
                    argv,
                    istream=stdin_file if stdin is not None else None,
                    env=full_env,
                    stdout_as_string=False,
                    strip_newline_in_stdout=False,
                    preexec_fn=preexec,
                )
            except git.exc.GitCommandNotFound as exc:
                raise NoGit(str(exc).strip().splitlines()[0]) from None
            except git.exc.GitCommandError as exc:
                if exc.status == 127:  # the shell of fsio.child found no git
                    raise NoGit("the shell found no `git` command") from None
                stderr = exc.stderr if isinstance(exc.stderr, str) else str(exc.stderr)
                # GitPython quotes git's stderr as "\n  stderr: '<text>'": the text only.
                raise GitError(
                    args[0], stderr.strip().removeprefix("stderr:").strip().strip("'")
                ) from None
            except (git.exc.GitError, OSError) as exc:
                raise GitError(args[0], str(exc)) from None
        assert isinstance(out, bytes)
        return out

    # -- objects ---------------------------------------------------------------------------
    def resolve(self, rev: str) -> str | None:
        ask = partial(self._rev_parse, f"{check_rev(rev)}^{{commit}}")
        return _MEMO.ask(self.path, rev, ("commit",), ask, keep_none=False)

    def tree_of(self, rev: str) -> str:
        ask = partial(self.run, "rev-parse", f"{check_rev(rev)}^{{tree}}")
        return _MEMO.ask(self.path, rev, ("tree",), ask).strip()

    def commit_message(self, commit: str) -> str:
        ask = partial(self.run, "log", "-1", "--format=%B", check_rev(commit))
        return _MEMO.ask(self.path, commit, ("message",), ask)

    def _rev_parse(self, spec: str) -> str | None:
        try:
            return self.run("rev-parse", "--verify", "--quiet", spec).strip() or None
        except GitError:
            return None

    def read_blob(self, rev: str, path: str) -> bytes | None:
        """File bytes at `rev:path`, or None when the file is not there."""
        blob = _MEMO.ask(self.path, rev, ("blob", path), partial(self._blob_id, rev, path))
        if blob is None:
            return None
        data = _MEMO.ask(self.path, blob, ("cat",), partial(self._cat_small, blob))
        return data if data is not None else self.run_bytes("cat-file", "blob", blob)

    def _blob_id(self, rev: str, path: str) -> str | None:
        listing = self.run("ls-tree", check_rev(rev), "--", path).strip()
        if not listing:
            return None
        mode_type_sha = listing.split("\t", 1)[0].split()
        return mode_type_sha[2] if mode_type_sha[1] == "blob" else None

    def _cat_small(self, blob: str) -> bytes | None:
        """The blob's bytes when they are few enough to keep (`_MEMO_BLOB_BYTES`), else None."""
        data = self.run_bytes("cat-file", "blob", blob)
        return data if len(data) <= _MEMO_BLOB_BYTES else None

    def blobs(self, rev: str) -> Mapping[str, tuple[str, str]]:
        """Every file of `rev` (a commit or tree), recursively: path -> (mode, blob id). A
        symlink is a blob of mode 120000 whose bytes are its target; a submodule is left out."""
        return _MEMO.ask(self.path, rev, ("blobs",), partial(self._blobs, rev))

    def _blobs(self, rev: str) -> dict[str, tuple[str, str]]:
        found = {}
        for row in self.run("ls-tree", "-r", "-z", check_rev(rev)).split("\0"):
            if row:
                head, path = row.split("\t", 1)
                mode, kind, sha = head.split()
                if kind == "blob":
                    found[path] = (mode, sha)
        return found

    def read_object(self, blob: str) -> bytes:
        """The bytes of the blob `blob` (an id, as `blobs` gives)."""
        data = _MEMO.ask(self.path, blob, ("cat",), partial(self._cat_small, blob))
        return data if data is not None else self.run_bytes("cat-file", "blob", check_rev(blob))

    def with_blobs(self, tree: str, blobs: Mapping[str, tuple[str, str]]) -> str:
        """The tree `tree` with each path of `blobs` set to its (mode, blob id)."""
        rows = "".join(f"{mode} {sha}\t{path}\0" for path, (mode, sha) in sorted(blobs.items()))
        with self._temp_index() as env:
            self.run("read-tree", check_rev(tree), env=env)
            stdin = rows.encode("utf-8", "surrogateescape")
            self.run("update-index", "-z", "--index-info", env=env, stdin=stdin)
            return self.run("write-tree", env=env).strip()

    def grep_files(
        self, rev: str, text: str, pathspec: str, *more: str, paths: Sequence[str] = ()
    ) -> list[str]:
        """Paths of the files of `rev` (a commit or tree) under `pathspec` (or among `paths`)
        that contain the line fragment `text` (fixed string; one git call for the whole
        tree), or one of `more`."""
        git = _gitpython()
        patterns = [arg for fragment in (text, *more) for arg in ("-e", fragment)]
        where = [f":(literal){p}" for p in paths] if paths else [pathspec]
        args = ["grep", "-l", "-z", "-F", *patterns, check_rev(rev), "--", *where]
        cmd = git.Git(str(self.path))
        env = git_env()
        argv, preexec = child(git_argv(["-c", "core.quotepath=off", *args], env))
        status, out, err = cmd.execute(
            argv,
            preexec_fn=preexec,
            with_extended_output=True,
            with_exceptions=False,
            stdout_as_string=False,
            env=env,
        )
        if status not in (0, 1):  # 1: no file matches
            raise GitError("grep", err if isinstance(err, str) else err.decode("utf-8", "replace"))
        assert isinstance(out, bytes)
        names = out.decode("utf-8", "surrogateescape").split("\0")
        return [name.split(":", 1)[1] for name in names if ":" in name]

    def renamed_paths(self, old: str, new: str) -> dict[str, str]:
        """Files git's rename detection (`git diff -M`) sees moved from `old` to `new`."""
        args = ("diff", "-M", "--name-status", "-z", "--diff-filter=R", check_rev(old))
        out = self.run(*args, check_rev(new), "--")
        fields = [f for f in out.split("\0") if f]
        return {fields[i + 1]: fields[i + 2] for i in range(0, len(fields) - 2, 3)}

    def list_files(self, rev: str, prefix: str = "") -> list[str]:
        args = ["ls-tree", "-r", "--name-only", "-z", check_rev(rev)]
        if prefix:
            args += ["--", prefix]
        return [p for p in self.run(*args).split("\0") if p]

    def tags(self, pattern: str) -> list[str]:
        return self.run("tag", "--list", pattern).split()

    def set_tag(self, name: str, commit: str) -> None:
        self.run("tag", "-f", check_rev(name, "a tag"), check_rev(commit))

    def delete_ref(self, ref: str) -> None:
        self.run("update-ref", "-d", check_rev(ref, "a ref"))

    def commit_tree(self, tree: str, message: str, parent: str | None = None) -> str:
        args = ["commit-tree", tree, "-m", message]
        if parent:
            args += ["-p", parent]
        return self.run(*args, env=_BOT_ENV).strip()

    # -- building trees without a worktree ---------------------------------------------------
    def tree_from_directory(self, directory: Path) -> str:
        """Write every file under `directory` as a tree (a temporary index, no worktree), the
        bytes as they are: no `.gitattributes` (one inside an sdist could say `text` or
        `eol=crlf`), filter or config may change what is stored (`hash-object --no-filters`).
        Only regular files are taken (the tool's own extraction wrote them)."""
        files = []
        for folder, dirs, names in os.walk(directory):
            dirs.sort()
            for name in names:
                path = Path(folder) / name
                if not path.is_symlink() and path.is_file():
                    files.append(path)
        files.sort()
        listing = "".join(f"{p}\n" for p in files).encode("utf-8", "surrogateescape")
        shas = self.run("hash-object", "-w", "--no-filters", "--stdin-paths", stdin=listing)
        rows = []
        for path, sha in zip(files, shas.split(), strict=True):
            mode = "100755" if os.stat(path).st_mode & 0o111 else "100644"
            rel = path.relative_to(directory).as_posix()
            rows.append(f"{mode} {sha}\t{rel}\0")
        with self._temp_index() as env:
            stdin = "".join(rows).encode("utf-8", "surrogateescape")
            self.run("update-index", "--add", "-z", "--index-info", env=env, stdin=stdin)
            return self.run("write-tree", env=env).strip()

    def wrap_tree(self, subtree: str, name: str) -> str:
        """A root tree holding `subtree` as the folder `name`."""
        return self.run("mktree", stdin=f"040000 tree {subtree}\t{name}\n".encode()).strip()

    def subtree(self, rev: str, path: str) -> str | None:
        ask = partial(self._rev_parse, f"{check_rev(rev)}:{path}")
        return _MEMO.ask(self.path, rev, ("subtree", path), ask, keep_none=False)

    def apply_to_tree(
        self, tree: str, patch: bytes, *, three_way: bool = False, reverse: bool = False
    ) -> str:
        """The tree that `patch` (undone, with `reverse`) makes of `tree` (no fuzz: context
        must match exactly)."""
        ask = partial(self._apply_to_tree, tree, patch, three_way, reverse)
        digest = hashlib.sha256(patch).hexdigest()
        return _MEMO.ask(self.path, tree, ("apply", digest, three_way, reverse), ask)

    def _apply_to_tree(self, tree: str, patch: bytes, three_way: bool, reverse: bool) -> str:
        with self._temp_index() as env:
            self.run("read-tree", check_rev(tree), env=env)
            args = ["apply", "--cached", "--whitespace=nowarn"]
            if three_way:
                args.append("--3way")
            if reverse:
                args.append("--reverse")
            self.run(*args, "-", env=env, stdin=patch)
            return self.run("write-tree", env=env).strip()

    def check_apply(self, tree: str, patch: bytes, *, reverse: bool = False) -> tuple[bool, str]:
        """Whether `patch` applies to `tree` (is undone from it, with `reverse`) with no fuzz,
        and git's words about it."""
        ask = partial(self._check_apply, tree, patch, reverse)
        digest = hashlib.sha256(patch).hexdigest()
        return _MEMO.ask(self.path, tree, ("check", digest, reverse), ask)

    def _check_apply(self, tree: str, patch: bytes, reverse: bool) -> tuple[bool, str]:
        with self._temp_index() as env:
            self.run("read-tree", check_rev(tree), env=env)
            args = [
                "apply",
                "--cached",
                "--check",
                "--verbose",
                *(["--reverse"] if reverse else []),
            ]
            try:
                out = self.run(*args, "-", env=env, stdin=patch)
                return True, out
            except GitError as exc:
                return False, str(exc)

    @contextmanager
    def _temp_index(self) -> Iterator[dict[str, str]]:
        with fsio.temp_dir("vllm-patchset-index-") as tmp:
            yield {"GIT_INDEX_FILE": str(tmp / "index")}

    def archive_to(self, rev: str, dest: Path) -> None:
        """Write the files of `rev` (a commit or tree) under `dest`: every member checked by
        `archives.checked_members` first (a tree from a git source may hold a symlink that
        leads out, which no tarfile filter of the interpreter is trusted to stop)."""
        from vllm_patchset.infra import archives

        data = self.run_bytes("archive", "--format=tar", check_rev(rev))
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                archives.extract(tar, dest, what=f"the tree {rev[:12]}")
        except archives.ArchiveRefused as exc:
            raise BadInput(str(exc)) from None

    def fetch(self, url: str, ref: str) -> str:
        """Fetch `ref` of the repository at `url` (a path or URL) and return its commit."""
        # Into a ref of this process's own: FETCH_HEAD is shared by every process using the
        # mirror, and another fetch could overwrite it between the fetch and the read.
        temp = f"refs/vllm-patchset/fetch/{os.getpid()}"
        check_source(url)
        if ":" in check_rev(ref, "a git ref"):
            raise BadInput(f"a git ref {ref!r} is not a git ref or commit")
        self.run("fetch", "--quiet", "--no-tags", "--", url, f"+{ref}:{temp}")
        sha = self.resolve(temp)
        self.delete_ref(temp)
        if sha is None:
            raise GitError("fetch", f"{ref} of {url} is not a commit")
        return sha

    # -- queue and rebase repositories ------------------------------------------------------------
    def am(self, patches: list[bytes]) -> None:
        for patch in patches:
            self.run(
                "am",
                "--keep-cr",
                "--committer-date-is-author-date",
                "-",
                stdin=patch,
                env={"GIT_COMMITTER_NAME": BOT_NAME, "GIT_COMMITTER_EMAIL": BOT_EMAIL},
            )

    def format_patches(self, base: str, head: str = "HEAD") -> list[tuple[str, bytes]]:
        """(file name, bytes) of each commit in base..head, as `git format-patch` writes them."""
        with fsio.temp_dir("vllm-patchset-fp-") as tmp:
            names = self.run(
                "format-patch",
                *FORMAT_PATCH_ARGS,
                "-o",
                str(tmp),
                f"{check_rev(base)}..{check_rev(head)}",
                "--",
            ).split()
            return [(Path(n).name, Path(n).read_bytes()) for n in names]

    # -- rebase ------------------------------------------------------------------------------
    def am_3way(self, patch: bytes) -> bool:
        """`git am -3` one patch: False when it stopped on a conflict (the am stays in progress
        for the maintainer: resolve, `git am --continue`)."""
        try:
            self.run(
                "am",
                "-3",
                "--keep-cr",
                "--committer-date-is-author-date",
                "-",
                stdin=patch,
                env={"GIT_COMMITTER_NAME": BOT_NAME, "GIT_COMMITTER_EMAIL": BOT_EMAIL},
            )
        except GitError:
            if self.am_in_progress():
                return False
            raise
        return True

    def am_in_progress(self) -> bool:
        return (self.path / self.run("rev-parse", "--git-path", "rebase-apply").strip()).is_dir()

    def am_quit(self) -> None:
        self.run("am", "--quit")

    def am_abort(self) -> None:
        """Give up the `git am` in progress: HEAD and the files as before it (the reset
        writes a reflog entry: an identity is needed where the user has none configured)."""
        self.run("am", "--abort", env=_BOT_ENV)

    def unmerged_paths(self) -> list[str]:
        return [
            p for p in self.run("diff", "--name-only", "--diff-filter=U", "-z").split("\0") if p
        ]

    def changed_paths(self, *pathspecs: str) -> list[str]:
        """`git status --porcelain` lines (tracked changes and untracked files) under pathspecs."""
        out = self.run("status", "--porcelain", "--untracked-files=all", "--", *pathspecs)
        return [line for line in out.split("\n") if line]

    def clone_shared(self, path: Path, commit: str, *, sparse: bool = False) -> Repo:
        """A repository at `path`, at `commit` (detached), that borrows this one's objects
        (`git clone --shared`). Unlike a worktree, nothing of it is registered here: deleting
        `path` removes it whole, even after a kill half way through. `sparse`: only the
        top-level files are checked out, the others as `widen` adds them (git commits,
        merges and `git am -3` work on the whole tree all the same)."""
        self.run("clone", "--quiet", "--shared", "--no-checkout", "--no-tags", "--", ".", str(path))
        clone = Repo(path)
        if sparse:
            clone.run("sparse-checkout", "set", "--no-cone")
        clone.run("checkout", "--quiet", "--detach", check_rev(commit))
        return clone

    def widen(self, paths: Iterable[str]) -> None:
        """Check out `paths` too in a sparse clone (each one file: a pattern anchored at the
        root, its wildcard characters escaped)."""
        patterns = sorted({"/" + re.sub(r"([\\*?\[\]!#])", r"\\\1", p) for p in paths})
        if patterns:
            self.run("sparse-checkout", "add", *patterns)

    def git_path(self, name: str) -> Path:
        """A file of this repository's own (`git rev-parse --git-path NAME`)."""
        return self.path / self.run("rev-parse", "--git-path", name).strip()

    def is_dirty(self) -> bool:
        return bool(self.run("status", "--porcelain", "--untracked-files=no").strip())

    def head(self) -> str:
        sha = self.resolve("HEAD")
        assert sha is not None
        return sha

    def count(self, base: str, head: str = "HEAD") -> int:
        return int(self.run("rev-list", "--count", f"{check_rev(base)}..{check_rev(head)}").strip())


def _gitpython() -> Any:
    """GitPython, imported at the first git call: it will not import without a git
    executable, and the deploy commands (a serving image may have no git) need none."""
    try:
        import git
    except ImportError as exc:
        raise NoGit(str(exc).strip().splitlines()[0] if str(exc).strip() else "no git") from None
    return git


def init_bare(path: Path) -> Repo:
    repo = Repo(path)
    if not (path / "HEAD").is_file():
        try:
            fsio.make_dir(path, parents=True, exist_ok=True)
        except OSError as exc:
            raise GitError("init", str(exc)) from None
        repo.run("init", "--quiet", "--bare")
    return repo
