"""Synthetic upstreams for tests of the mechanics: a tiny `vllm/` package in a local git repo
with one tag per "release", and a project with its own patch series (provenance trailers
included), all written by the test. No network, no real vLLM: a test states the whole story
(what each release changes, what each patch fixes) in a few lines.

    upstream = SyntheticUpstream(tmp_path / "upstream")
    upstream.release("1.0", BASE)                                   # files of the package
    upstream.release("1.1", {MOE: MOE_TEXT.replace(A, B)})          # changes on top of 1.0
    project = make_project(tmp_path / "project", cache, upstream, "1.0", series=[FIX])

`make_project` writes `patches/` (`git format-patch` files, built with git on the pin),
pyproject.toml with a git pin (`pin-ref` + `pin-commit`: the mirror finds it again without a
path) or, with `index_url`, a release pin served by a `LocalIndex`, CHANGELOG.md, the lock
(`overlay build --update-lock`), and commits it all.

`make_story` builds the one story most tests of the mechanics share (`tests/conftest.py`'s
`tiny` fixture copies it): four releases served as sdists by a local package index, a project
pinned to release 1.0 with two patches in its series and one archived (see STORY_STATES).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.server
import io
import json
import shutil
import tarfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from support import git
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.gitrepo import FORMAT_PATCH_ARGS, Repo
from vllm_patchset.overlay.build import build_overlay
from vllm_patchset.overlay.upstream import Mirror, git_source_commit

BOT = {
    "GIT_AUTHOR_NAME": "vllm-patchset",
    "GIT_AUTHOR_EMAIL": "vllm-patchset@users.noreply.github.com",
    "GIT_AUTHOR_DATE": "2026-06-27T00:00:00+00:00",
    "GIT_COMMITTER_NAME": "vllm-patchset",
    "GIT_COMMITTER_EMAIL": "vllm-patchset@users.noreply.github.com",
    "GIT_COMMITTER_DATE": "2026-06-27T00:00:00+00:00",
}
CHANGELOG = (
    "# Changelog\n\n"
    "All notable changes to this patch set are documented in this file.\n"
    "The format is based on [Keep a Changelog](https://keepachangelog.com/en/1.1.0/).\n\n"
    "## [Unreleased]\n"
)

# The package of release 1.0: a MoE layer with the tensor-truthiness bug, and a utility
# module; each function is long enough for a hunk's three lines of context.
MOE = "vllm/layers/moe.py"
UTILS = "vllm/utils.py"
MOE_TEXT = '''\
"""A tiny MoE layer."""

import math


def quantize(x, scale, gscale):
    """Scale, then round."""
    return round(x * scale / gscale, 3)


class Experts:
    """The experts of one layer."""

    def __init__(self, a1_scale=None, a1_gscale=1.0):
        self.a1_scale = a1_scale
        self.a1_gscale = a1_gscale
        self.calls = 0

    def apply(self, hidden):
        self.calls += 1
        scale = self.a1_scale or self.a1_gscale
        out = quantize(hidden, scale, self.a1_gscale)
        return out

    def name(self):
        label = "experts"
        return label


def top_k(scores, k):
    ranked = sorted(scores, reverse=True)
    return ranked[:k]


def norm(values):
    return math.sqrt(sum(v * v for v in values))
'''
UTILS_TEXT = '''\
"""Utilities."""


def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value


def describe(name):
    words = name.split("_")
    return " ".join(words)
'''
BASE = {"vllm/__init__.py": '__version__ = "1.0"\n', MOE: MOE_TEXT, UTILS: UTILS_TEXT}
BUGGY = "        scale = self.a1_scale or self.a1_gscale\n"
FIXED = "        scale = self.a1_scale\n"
PROPERTY = (
    "    @property\n"
    "    def scale(self):\n"
    "        return self.a1_gscale if self.a1_scale is None else self.a1_scale\n"
    "\n"
)


@dataclass(frozen=True)
class PatchSpec:
    """One patch: text replacements (each `old` must be in the file exactly once) written as
    a commit on the pin (or on `base`), with the series' trailers."""

    name: str  # file name in patches/, e.g. "0001-moe-no-tensor-truthiness.patch"
    edits: dict[str, tuple[str, str]]  # path -> (old text, new text)
    subject: str = "fix"
    upstream_pr: str = "https://github.com/vllm-project/vllm/pull/1"
    introduced_by: str = "https://github.com/vllm-project/vllm/pull/0"
    introduced_in: str = "1.0"
    applied_upstream: str = ""
    regression_test: str = "tests/gpu/test_synthetic.py::test_fix"
    base: str | None = None  # write it on this release instead of the pin (e.g. archived)
    body: str = "Why: a synthetic fix."
    adds: dict[str, str] = field(default_factory=dict)  # path -> text of a file it adds
    deletes: tuple[str, ...] = ()  # paths of files it deletes

    @property
    def message(self) -> str:
        return (
            f"{self.subject}\n\n{self.body}\n\n"
            f"Upstream-PR: {self.upstream_pr}\n"
            f"Introduced-by: {self.introduced_by}\n"
            f"Introduced-in: {self.introduced_in}\n"
            f"Applied-upstream: {self.applied_upstream}\n"
            f"Regression-test: {self.regression_test}\n"
        )


@dataclass
class SyntheticUpstream:
    """A local git repository of the tiny package, one commit and tag `v<version>` a release."""

    path: Path
    releases: dict[str, dict[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.path.mkdir(parents=True)
        git(self.path, "init", "-q", "-b", "main")

    def files(self, version: str) -> dict[str, str]:
        return dict(self.releases[version])

    def release(
        self,
        version: str,
        changes: Mapping[str, str | None],
        *,
        base: str | None = None,
        renames: dict[str, str] | None = None,
    ) -> str:
        """Tag `v<version>`: the files of `base` (default: the last release; none for the
        first) with `changes` (path -> text, None deletes) and `renames` (git mv, done
        first, so that git's rename detection sees them). Returns the commit."""
        previous = base or (list(self.releases)[-1] if self.releases else None)
        files = self.files(previous) if previous else {}
        if previous:
            git(self.path, "checkout", "-q", "--detach", f"v{previous}")
        for old, new in (renames or {}).items():
            (self.path / new).parent.mkdir(parents=True, exist_ok=True)
            git(self.path, "mv", old, new)
            files[new] = files.pop(old)
        for path, text in changes.items():
            if text is None:
                git(self.path, "rm", "-q", path)
                files.pop(path)
                continue
            (self.path / path).parent.mkdir(parents=True, exist_ok=True)
            (self.path / path).write_text(text)
            files[path] = text
        git(self.path, "add", "-A")
        git(self.path, "commit", "-q", "--allow-empty", "-m", f"vllm {version}")
        git(self.path, "tag", f"v{version}")
        self.releases[version] = files
        return git(self.path, "rev-parse", "HEAD").strip()


def write_patches(
    upstream: SyntheticUpstream, pin: str, specs: list[PatchSpec], folder: Path, scratch: Path
) -> list[str]:
    """The specs as `git format-patch` files in `folder`, each written on its base (the pin,
    the specs before it applied, unless it names a base of its own). Returns the names."""
    names = []
    for i, spec in enumerate(specs):
        work = scratch / f"work-{folder.name}-{i}"
        shutil.rmtree(work, ignore_errors=True)
        git(scratch, "clone", "-q", str(upstream.path), str(work))
        git(work, "checkout", "-q", "--detach", f"v{spec.base or pin}")
        if spec.base is None:
            for earlier in specs[:i]:
                if earlier.base is None:
                    _edit(work, earlier)
            if any(e.base is None for e in specs[:i]):
                git(work, "commit", "-q", "-am", "earlier patches")
        _edit(work, spec)
        repo = Repo(work)
        repo.run("commit", "-q", "-a", "-m", spec.message, env=BOT)
        data = repo.run_bytes("format-patch", *FORMAT_PATCH_ARGS, "--stdout", "HEAD^..HEAD")
        (folder / spec.name).write_bytes(data)
        names.append(spec.name)
        shutil.rmtree(work)
    return names


def _edit(work: Path, spec: PatchSpec) -> None:
    for path, (old, new) in spec.edits.items():
        text = (work / path).read_text()
        assert text.count(old) == 1, f"{spec.name}: {old!r} is not once in {path}"
        (work / path).write_text(text.replace(old, new))
    for path, text in spec.adds.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
        git(work, "add", path)
    for path in spec.deletes:
        git(work, "rm", "-q", path)


def make_project(
    root: Path,
    cache: Path,
    upstream: SyntheticUpstream,
    pin: str,
    *,
    series: list[PatchSpec] = (),  # type: ignore[assignment]
    upstreamed: list[PatchSpec] = (),  # type: ignore[assignment]
    extra_pyproject: str = "",
    index_url: str | None = None,
) -> Project:
    """A committed project pinned to the synthetic release `pin`, with its series, archive,
    CHANGELOG.md and a fresh lock. The pin is the git tag v<pin> of `upstream`, or with
    `index_url` the release `pin` from that package index (a `LocalIndex` serving it)."""
    patches = root / "patches"
    (patches / "upstreamed").mkdir(parents=True)
    scratch = root.parent / f"{root.name}-scratch"
    scratch.mkdir(exist_ok=True)
    names = write_patches(upstream, pin, list(series), patches, scratch)
    archived = write_patches(upstream, pin, list(upstreamed), patches / "upstreamed", scratch)
    (patches / "series").write_text("".join(f"{n}\n" for n in names))
    (patches / "upstreamed" / "series").write_text("".join(f"{n}\n" for n in archived))
    if index_url is None:
        pinned = Mirror(cache).git_ref(str(upstream.path), f"v{pin}")
        source = f'pin-ref = "v{pin}"\npin-commit = "{git_source_commit(pinned)}"\n'
    else:
        source = f'index-url = "{index_url}"\n'
    (root / "pyproject.toml").write_text(
        "[project]\n"
        'name = "synthetic-patchset"\n'
        'version = "0"\n\n'
        "[project.optional-dependencies]\n"
        f'gpu = ["vllm=={pin}"]\n\n'
        "[tool.vllm-patchset]\n"
        f'pin = "{pin}"\n'
        f"{source}"
        f"{extra_pyproject}"
    )
    (root / "CHANGELOG.md").write_text(CHANGELOG)
    (root / ".gitignore").write_text("/overlay/vllm/\n/.rebase/\n/.queue/\n")
    project = Project.load(root, cache)
    build_overlay(project, update_lock=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")
    return project


# -- releases on a package index -----------------------------------------------------------------
def sdist_bytes(version: str, files: dict[str, str]) -> bytes:
    """An sdist (`vllm-<version>/<path>`, as PyPI's) of the package files, byte-reproducible."""
    out = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{path}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class _Guarded(_Quiet):
    """Records each request's Authorization header; answers 401 without the expected one."""

    expected: str | None = None
    seen: list[str | None]

    def do_GET(self) -> None:
        got = self.headers.get("Authorization")
        self.seen.append(got)
        if self.expected is not None and got != self.expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="index"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()


class LocalIndex:
    """A package index (PEP 691 JSON, as pypi.org/simple answers) on 127.0.0.1, serving the
    files published to it from `root`. Close it (or use it in a `with`). With `auth` (user,
    password), every request without that HTTP Basic auth is answered 401; `seen` holds the
    Authorization header of every request."""

    def __init__(self, root: Path, auth: tuple[str, str] | None = None) -> None:
        self.root = root
        (root / "files").mkdir(parents=True)
        (root / "simple" / "vllm").mkdir(parents=True)
        self.seen: list[str | None] = []
        token = base64.b64encode(":".join(auth).encode()).decode() if auth else None
        attrs = {"expected": f"Basic {token}" if token else None, "seen": self.seen}
        guarded = type("Handler", (_Guarded,), attrs)
        handler = lambda *a, **k: guarded(*a, directory=str(root), **k)  # noqa: E731
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        self.url = f"{self.base}/simple"
        self.entries: list[dict[str, object]] = []
        self._write()
        kwargs = {"poll_interval": 0.01}  # a quick shutdown (the default polls every 0.5 s)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs=kwargs)
        self.thread.daemon = True
        self.thread.start()

    def publish(self, name: str, data: bytes, *, sha256: str | None = None) -> None:
        """Serve `data` as the file `name`, listed with its sha256 (or the one given)."""
        (self.root / "files" / name).write_bytes(data)
        self.entries = [e for e in self.entries if e["filename"] != name]
        digest = sha256 or hashlib.sha256(data).hexdigest()
        url = f"{self.base}/files/{name}"
        self.entries.append({"filename": name, "url": url, "hashes": {"sha256": digest}})
        self._write()

    def publish_release(self, upstream: SyntheticUpstream, version: str) -> None:
        self.publish(f"vllm-{version}.tar.gz", sdist_bytes(version, upstream.files(version)))

    def list_only(self, entry: dict[str, object]) -> None:
        """List an entry with no file behind it (a wheel, a yanked sdist)."""
        self.entries.append(entry)
        self._write()

    def _write(self) -> None:
        doc = json.dumps({"files": self.entries})
        (self.root / "simple" / "vllm" / "index.html").write_text(doc)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def __enter__(self) -> LocalIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the shared story ----------------------------------------------------------------------------
# 0.9 predates the code the MoE fix changes (an older `apply`) and has a clamp bug that 1.0
# fixed (the archived patch); 1.0 is the pin; 1.1 has the MoE fix (without
# the patch's comment line) and renamed the label the local patch changes (a conflict); 1.2
# rewrote `apply`, the function the MoE fix changes. The git tag `nightly` is 1.2 again, under a
# name that says no version. 1.0.1 is 1.0 with an import more: both patches apply there, one
# line down.
IMPORTS = "import math\n"
OLD_APPLY = (
    "    def apply(self, hidden):\n"
    "        return quantize(hidden, self.a1_gscale, self.a1_gscale)\n"
)
CLAMP_FIXED = "    if value > high:\n"
CLAMP_BUG = "    if value >= high:\n"
COMMENT = "        # bool(tensor) syncs the device: never `or` on a tensor\n"
NAME_OLD = '        label = "experts"\n'
NAME_NEW = '        label = "fused experts"\n'
NAME_UPSTREAM = '        label = "moe experts"\n'
REWRITTEN_APPLY = (
    "    def apply(self, hidden):\n"
    "        return fused_apply(hidden, self.a1_scale, self.a1_gscale)\n"
)


def rewritten(text: str, apply: str = REWRITTEN_APPLY) -> str:
    """`text` with Experts.apply replaced by `apply` (the code a fix of it changes is gone)."""
    start = text.index("    def apply(self, hidden):\n")
    end = text.index("    def name(self):\n")
    return text[:start] + apply + "\n" + text[end:]


STORY_FIX = PatchSpec(
    "0001-moe-no-tensor-truthiness.patch",
    {MOE: (BUGGY, COMMENT + FIXED)},
    subject="moe: no tensor truthiness",
    upstream_pr="https://github.com/vllm-project/vllm/pull/2",
)
STORY_LOCAL = PatchSpec(
    "0002-moe-say-fused.patch",
    {MOE: (NAME_OLD, NAME_NEW)},
    subject="moe: say fused",
    upstream_pr="none (local)",
    introduced_by="none",
    introduced_in="0.9",
    regression_test="tests/gpu/test_synthetic.py::test_name",
)
STORY_ARCHIVED = PatchSpec(
    "0001-utils-clamp-to-high.patch",
    {UTILS: (CLAMP_BUG, CLAMP_FIXED)},
    subject="utils: clamp to high",
    upstream_pr="https://github.com/vllm-project/vllm/pull/3",
    introduced_in="0.9",
    applied_upstream="1.0",
    regression_test="tests/gpu/test_synthetic.py::test_clamp",
    base="0.9",
)
# What `validate` copies into its pytest.ini.
PYTEST_SETTINGS = """
[tool.pytest.ini_options]
markers = ["gpu: needs a CUDA or ROCm GPU (tests/gpu); skipped with a reason elsewhere"]
filterwarnings = ["error"]
"""
STORY_RELEASES = ("0.9", "1.0", "1.0.1", "1.1", "1.2")
STORY_TESTS = (
    "".join(
        f"def {name}():\n    pass\n\n\n" for name in ("test_fix", "test_name", "test_clamp")
    ).rstrip("\n")
    + "\n"
)


@dataclass(frozen=True)
class Story:
    upstream: SyntheticUpstream
    index: LocalIndex
    cache: Path  # the mirror the story's releases are in (the tests' VLLM_PATCHSET_CACHE)
    project: Path  # the committed project, to copy (never changed itself)


def make_story(folder: Path) -> Story:
    upstream = SyntheticUpstream(folder / "upstream")
    moe_10 = MOE_TEXT
    moe_11 = moe_10.replace(BUGGY, FIXED).replace(NAME_OLD, NAME_UPSTREAM)
    version = "vllm/__init__.py"
    upstream.release(
        "0.9",
        {
            **BASE,
            version: '__version__ = "0.9"\n',
            MOE: rewritten(moe_10, OLD_APPLY),
            UTILS: UTILS_TEXT.replace(CLAMP_FIXED, CLAMP_BUG),
        },
    )
    upstream.release("1.0", {version: '__version__ = "1.0"\n', MOE: moe_10, UTILS: UTILS_TEXT})
    upstream.release("1.1", {version: '__version__ = "1.1"\n', MOE: moe_11})
    upstream.release("1.2", {version: '__version__ = "1.2"\n', MOE: rewritten(moe_11)})
    git(upstream.path, "tag", "nightly", "v1.2")  # a ref that names no release
    upstream.release(
        "1.0.1",
        {
            version: '__version__ = "1.0.1"\n',
            MOE: moe_10.replace(IMPORTS, "import functools\n" + IMPORTS),
        },
        base="1.0",
    )
    index = LocalIndex(folder / "index")
    for release in STORY_RELEASES:
        index.publish_release(upstream, release)
    cache = folder / "cache"
    project = make_project(
        folder / "project",
        cache,
        upstream,
        "1.0",
        series=[STORY_FIX, STORY_LOCAL],
        upstreamed=[STORY_ARCHIVED],
        index_url=index.url,
        extra_pyproject=PYTEST_SETTINGS,
    )
    # The regression tests the patches name (`check` finds each in tests/).
    gpu = project.root / "tests" / "gpu"
    gpu.mkdir(parents=True)
    (gpu / "test_synthetic.py").write_text(STORY_TESTS)
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "regression tests")
    shutil.rmtree(folder / "project" / "overlay" / "vllm")  # generated, as in a fresh clone
    for release in STORY_RELEASES:  # in the mirror: no test waits for the index
        Mirror(cache, index_url=index.url).release(release)
    return Story(upstream, index, cache, folder / "project")
