"""Upstream vLLM trees in one local git mirror: one commit and tag per version or ref.

Sources: a PyPI sdist (sha256 checked against the index), a git URL or path plus a ref, or the
vllm installed in an environment (files checked against its RECORD). Only the `vllm/` package
is kept, without compiled or cached files, so git's content hashes make trees from every
source agree where their files agree.
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
import weakref
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from vllm_patchset import versions
from vllm_patchset.console import progress
from vllm_patchset.errors import BadInput, DownloadFailed, UnknownVersion
from vllm_patchset.infra import archives, codec, fsio, index, indexsettings, jsonfile
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.fsio import no_symlink_below, plain_parts, read_regular
from vllm_patchset.infra.gitrepo import Repo, init_bare
from vllm_patchset.infra.hashes import record_hash, sha256_file
from vllm_patchset.infra.installed import (
    ORIGINALS,
    RECORD,
    STATE_DIR,
    installed_record,
    installed_version,
    parse_record,
    probe,
)
from vllm_patchset.overlay.cachelocks import hold_shared, importing, release_shared

SKIPPED_SUFFIXES = (".so", ".pyc", ".pyd", ".dylib")
# A git source that another machine can fetch too (a local path or file:// URL is not one).
_REMOTE_URL = re.compile(r"^(?!file:)[a-z][a-z0-9+.-]*://|^[\w.-]+@[\w.-]+:")


@dataclass(frozen=True)
class Upstream:
    """One upstream tree in the mirror."""

    label: str  # "0.24.0", or "git:<ref>" for a git ref
    version: str | None  # the release version, when known
    tag: str  # tag in the mirror
    commit: str
    source: str  # where it came from, for the lock and reports


def check_version(version: str) -> str:
    """`version` in PEP 440's normal form (`versions.normal`), or BadInput."""
    spelt = versions.normal(version)
    if spelt is None:
        raise BadInput(f"not a vLLM version: {version!r} (expected e.g. 0.24.0)")
    return spelt


def sort_versions(releases: Iterable[str]) -> list[str]:
    """Release versions in PEP 440 order (0.22.0 < 0.22.1 < 0.25.0rc1 < 0.25.0 < 0.25.0.post1)."""
    return versions.ordered(releases)


def is_remote_url(source: str) -> bool:
    return bool(_REMOTE_URL.match(source))


def git_source_commit(upstream: Upstream) -> str | None:
    """The commit of the git repository a `git:` upstream came from."""
    if not upstream.source.startswith("git:"):
        return None
    return upstream.source.rpartition("@")[2] or None


def _kept(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return (
        len(parts) > 1
        and parts[0] == "vllm"
        and "__pycache__" not in parts
        and not path.endswith(SKIPPED_SUFFIXES)
    )


@dataclass(frozen=True)
class _TagMeta:
    """A mirror tag's commit message after its first line, as JSON: where its tree is from."""

    label: str
    version: str | None
    source: str


class Mirror:
    """The local upstream mirror under the cache directory."""

    def __init__(
        self,
        cache_dir: Path,
        package: str = "vllm",
        index_url: str = "",
        *,
        index_setting: indexsettings.IndexSetting | None = None,
    ) -> None:
        self.cache_dir = cache_dir
        self.package = package
        # The index and its credentials (`mirror_for`: uv's, pip's or the project's setting);
        # a bare `index_url` is used as given, without credentials.
        self.index = index_setting or indexsettings.IndexSetting(
            index_url or indexsettings.DEFAULT, "the caller"
        )
        self.index_url = self.index.url
        # Nothing in the cache is followed through a symlink (a `mirror.git` linked to a
        # user's repository would be written and gc'd in).
        for name in ("mirror.git", "sdists"):
            fsio.no_symlink_below(cache_dir, (name,))
        hold_shared(cache_dir)
        weakref.finalize(self, release_shared, cache_dir)
        self.repo: Repo = Repo(cache_dir / "mirror.git")
        if not (cache_dir / "mirror.git" / "HEAD").is_file():
            with importing(cache_dir):
                self.repo = init_bare(cache_dir / "mirror.git")
        self.sdists = cache_dir / "sdists"

    # -- lookups ------------------------------------------------------------------------------
    def get(self, tag: str) -> Upstream | None:
        """The tree stored under `tag`, or None when there is none, or none usable: a tag this
        tool did not make (its commit message is not the JSON `_store` writes) is fetched again
        by the caller, which overwrites it."""
        commit = self.repo.resolve(f"refs/tags/{tag}")
        if commit is None:
            return None
        message = self.repo.commit_message(commit)
        try:
            doc = jsonfile.parse(message.split("\n\n", 1)[1].encode("utf-8", "surrogateescape"))
            meta = codec.from_doc(_TagMeta, doc)
        except (IndexError, ValueError):
            print(
                f"vllm-patchset: the mirror's tag {tag} was not made by vllm-patchset (its"
                " message is not the expected JSON): fetching it again",
                file=sys.stderr,
            )
            return None
        return Upstream(
            label=meta.label, version=meta.version, tag=tag, commit=commit, source=meta.source
        )

    def _store(self, tree: str, tag: str, label: str, version: str | None, source: str) -> Upstream:
        meta = json.dumps(codec.to_doc(_TagMeta(label, version, source)), sort_keys=True)
        message = f"{self.package} {label}\n\n{meta}\n"
        commit = self.repo.commit_tree(tree, message)
        self.repo.set_tag(tag, commit)
        return Upstream(label=label, version=version, tag=tag, commit=commit, source=source)

    # -- PyPI ---------------------------------------------------------------------------------
    def release(self, version: str) -> Upstream:
        """The PyPI release `version`, fetched once; a second call needs no network."""
        wanted = check_version(version)
        seen = self.repo.resolve(f"refs/tags/{self._release_tag(wanted)}")
        cached = self.get(self._release_tag(wanted))
        if cached is not None:
            return cached
        sdist, sha256, url, version = self._download_sdist(wanted)  # a prune waits
        # One import at a time, and never during a prune: it would gc the objects an import
        # has written and not yet tagged.
        with importing(self.cache_dir):
            tag = self._release_tag(wanted)
            if seen is None and self.repo.resolve(f"refs/tags/{tag}") is not None:
                cached = self.get(tag)  # another run imported it while this one downloaded
                if cached is not None:
                    return cached
            with (
                progress(f"importing {sdist.name} into the mirror"),
                fsio.temp_dir("vllm-patchset-sdist-") as root,
            ):
                _extract_package(sdist, root, self.package)
                tree = self.repo.tree_from_directory(root)
            source = f"pypi:{sdist.name} sha256:{sha256} {url}"
            return self._store(tree, f"v{version}", version, version, source)

    def _release_tag(self, wanted: str) -> str:
        stored = [t.removeprefix("v") for t in self.repo.tags("v*")]
        return f"v{versions.spelt_as(wanted, stored) or wanted}"

    def _index_files(self) -> list[index.IndexFile]:
        unreachable = " and the release is not cached"
        return index.files(self.index_url, self.package, unreachable=unreachable, auth=self.index)

    def available_versions(self, *, pre: bool = False) -> list[str]:
        """Releases with an sdist on the index, in PEP 440 order; pre- and dev releases only
        with `pre` (post-releases and patch releases are releases)."""
        prefix = f"{self.package}-"
        found = {
            f.filename[len(prefix) : -len(".tar.gz")]
            for f in self._index_files()
            if f.filename.startswith(prefix) and f.filename.endswith(".tar.gz") and not f.yanked
        }
        parsed = {v: versions.parse(v) for v in found}
        return sort_versions(
            v for v, p in parsed.items() if p is not None and (pre or not p.is_prerelease)
        )

    def _download_sdist(self, version: str) -> tuple[Path, str, str, str]:
        """The sdist of the release equal to `version` (PEP 440), its sha256, its URL (for
        the lock) and the version as the index spells it."""
        prefix, suffix = f"{self.package}-", ".tar.gz"
        entries = {
            f.filename[len(prefix) : -len(suffix)]: f
            for f in self._index_files()
            if f.filename.startswith(prefix) and f.filename.endswith(suffix)
        }
        spelt = versions.spelt_as(version, entries)
        if spelt is None:
            name = f"{prefix}{version}{suffix}"
            raise UnknownVersion(self.package, version, f"{self.index_url} (no sdist {name})")
        entry = entries[spelt]
        target = index.fetch(entry, self.sdists, self.index)
        # fetch refuses an entry without a sha256, but from a `file:` index (the user's folder)
        sha256 = entry.sha256 or sha256_file(target)
        return target, sha256, indexsettings.public(entry.url), spelt

    # -- git ----------------------------------------------------------------------------------
    def git_ref(self, url: str, ref: str) -> Upstream:
        """The `vllm/` package of `ref` in the repository at `url` (a path or URL)."""
        with importing(self.cache_dir), progress(f"fetching {ref} from {url}"):
            commit = self.repo.fetch(url, ref)
            subtree = self.repo.subtree(commit, self.package)
            if subtree is None:
                raise BadInput(f"{ref} of {url} has no {self.package}/ package")
            tree = self.repo.wrap_tree(subtree, self.package)
            version = ref.removeprefix("v") if versions.is_version(ref.removeprefix("v")) else None
            safe = re.sub(r"[^A-Za-z0-9._-]+", "-", ref)
            # A local path names this machine only: the source (written into locks) keeps the
            # ref and the commit instead.
            where = url if is_remote_url(url) else f"local:{ref}"
            source = f"git:{where}@{commit}"
            upstream = self._store(tree, f"git/{safe}", f"git:{ref}", version, source)
            # Also by the repository's commit: a git pin is found again by it, whatever the ref
            # names now (see `git_commit`).
            self.repo.set_tag(f"git-commit/{commit}", upstream.commit)
        return upstream

    def git_commit(self, commit: str) -> Upstream | None:
        """The tree a `git_ref` fetch of the repository commit `commit` stored, if any."""
        return self.get(f"git-commit/{commit}")

    # -- an installed vllm --------------------------------------------------------------------
    def installed(self, python: str | None = None, target: Path | None = None) -> Upstream:
        """The vllm installed in `target` (a dir holding the package, as pip's --target) or for
        `python` (default: this interpreter), every file checked against its RECORD."""
        if target is not None:
            site, version, record = _read_installed(target, self.package)
        else:
            site, version, record = _locate_installed(python or sys.executable, self.package)
        with (
            importing(self.cache_dir),
            progress(f"importing the installed {self.package} {version} into the mirror"),
            fsio.temp_dir("vllm-patchset-installed-") as root,
        ):
            for path, digest in record.items():
                if path.split("/", 1)[0] != self.package or not _kept(path):
                    continue  # the dist-info, scripts (`../../bin/…`), bytecode
                parts = plain_parts(path, self.package)
                if parts is None:
                    raise BadInput(
                        f"{site}: RECORD lists {path!r}, not a plain path inside"
                        f" {self.package}/: refusing this install"
                    )
                if not digest:
                    raise BadInput(
                        f"{site}: RECORD lists {path} without a sha256: the installed"
                        f" {self.package} {version} cannot be checked"
                    )
                bound = archives.TREE_BOUNDS.member  # what an sdist member may be, too
                data = read_regular(no_symlink_below(site, parts), limit=bound + 1)
                if data is not None and len(data) > bound:
                    raise BadInput(
                        f"{site / path} is over the bound of {bound} bytes a file: refusing"
                        " this install"
                    )
                if data is None or record_hash(data) != digest:
                    data = _original(site, parts, digest, version, data is None)
                out = root.joinpath(*parts)
                fsio.make_dir(out.parent, parents=True, exist_ok=True)
                fsio.write_file(out, data)
            tree = self.repo.tree_from_directory(root)
            return self._store(tree, f"installed/{version}", version, version, f"installed:{site}")


def _original(
    site: Path, parts: tuple[str, ...], digest: str, version: str, missing: bool
) -> bytes:
    """The pristine bytes of an installed file that is not its RECORD's: the original that
    `overlay apply` kept in the state dir beside the package (the overlay is applied there),
    when it is the RECORD's; else the install was modified, refused in one line."""
    state = site / STATE_DIR
    kept = None
    if state.is_dir() and not state.is_symlink():
        original = no_symlink_below(state / ORIGINALS, parts)
        kept = read_regular(original, limit=archives.TREE_BOUNDS.member + 1)
    if kept is not None and record_hash(kept) == digest:
        return kept
    path = site.joinpath(*parts)
    what = "is missing" if missing else "does not match its RECORD hash"
    line = f"{path} {what}: the installed {parts[0]} {version} was modified"
    if (state / RECORD).is_file():
        line += (
            f" (an overlay is applied there and keeps no original of this file: `vllm-patchset"
            f" overlay revert --target {site}` first)"
        )
    raise BadInput(line)


def applied_overlay(site: Path) -> bool:
    """Whether an overlay is recorded as applied to the install in `site`."""
    return (site / STATE_DIR / RECORD).is_file()


def _extract_package(sdist: Path, dest: Path, package: str) -> None:
    """Extract `<name>-<version>/<package>/**` of the sdist into dest/<package>/: the regular
    files, each checked and bounded before it is written (`archives`), in one pass."""

    def select(member: tarfile.TarInfo) -> tuple[str, ...] | None:
        parts = tuple(member.name.split("/"))
        if len(parts) < 3 or parts[1] != package or not member.isreg():
            return None
        return parts[1:] if _kept("/".join(parts[1:])) else None

    try:
        with tarfile.open(sdist, "r|gz") as tar:
            archives.extract(
                tar, dest, what=str(sdist), select=select, stream=True, bounds=archives.SDIST_BOUNDS
            )
    except archives.ArchiveRefused as exc:
        raise DownloadFailed(str(exc)) from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise DownloadFailed(f"{sdist} is not a readable sdist ({why})") from None
    if not (dest / package / "__init__.py").is_file():
        raise DownloadFailed(f"{sdist} holds no {package}/ package")


def _read_installed(site: Path, package: str) -> tuple[Path, str, dict[str, str]]:
    if not (site / package / "__init__.py").is_file():
        raise BadInput(f"{site} holds no {package} package ({package}/__init__.py is missing)")
    return site, installed_version(site, package), installed_record(site, package)


def _locate_installed(python: str, package: str) -> tuple[Path, str, dict[str, str]]:
    found = probe(python, package)
    if not found.origin or not found.origin.endswith("__init__.py") or not found.version:
        raise BadInput(f"{python} has no {package} package installed")
    if not found.record:
        raise BadInput(f"{package} for {python} has no RECORD: its files cannot be checked")
    site = Path(found.origin).parent.parent
    return site, found.version, parse_record(found.record)


# -- the project's mirror and bases ---------------------------------------------------------------
def mirror_for(project: Project) -> Mirror:
    """The project's upstream mirror (its cache dir, package and index: `indexsettings`)."""
    setting = indexsettings.for_project(project)
    return Mirror(project.cache_dir, project.package, index_setting=setting)


def pin_base(project: Project, mirror: Mirror) -> Upstream:
    """The pin's upstream tree: a PyPI release, or a git commit (`pin-commit`, found in the
    mirror, else fetched from `pin-git` at `pin-ref`), or a git ref (`pin-git` + `pin-ref`)."""
    if project.pin_commit:
        found = mirror.git_commit(project.pin_commit)
        if found is not None:
            return found
        if not project.pin_git:
            raise BadInput(
                f"the pin is commit {project.pin_commit[:12]} ({project.pin_ref}) of a local git"
                f" repository, which is not in the mirror: `vllm-patchset fetch --git PATH --ref"
                f" {project.pin_ref}` first"
            )
        fetched = mirror.git_ref(project.pin_git, project.pin_ref or project.pin_commit)
        if git_source_commit(fetched) != project.pin_commit:
            raise BadInput(
                f"{project.pin_ref} of {project.pin_git} is now {git_source_commit(fetched)},"
                f" not the pinned commit {project.pin_commit}"
            )
        return fetched
    if project.pin_git and project.pin_ref:
        return mirror.git_ref(project.pin_git, project.pin_ref)
    return mirror.release(project.pin)


def resolve_base(
    project: Project,
    mirror: Mirror,
    version: str | None = None,
    git_url: str | None = None,
    ref: str | None = None,
) -> Upstream:
    """The one place that says which upstream a command works on: a release (`version`), a
    git ref (`git_url` + `ref`), else the pin."""
    if git_url or ref:
        if not (git_url and ref):
            raise BadInput("--git and --ref go together")
        return mirror.git_ref(git_url, ref)
    return mirror.release(version) if version else pin_base(project, mirror)


def is_pin(project: Project, upstream: Upstream) -> bool:
    """Whether `upstream` is the pin's own tree (the committed lock is for it)."""
    if project.pin_commit:
        return git_source_commit(upstream) == project.pin_commit
    if project.pin_git and project.pin_ref:
        return upstream.label == f"git:{project.pin_ref}"
    return versions.spelt_as(project.pin, [upstream.tag.removeprefix("v")]) is not None
