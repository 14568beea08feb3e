"""`vllm-patchset backport REF --from GIT`: an upstream fix taken onto the pin as a patch of the
series, with the provenance the code can tell.

REF is a commit of the upstream repository GIT (a path or URL), or a pull request number
(`46735`, `#46735`), found in the history of GIT's branch (`--branch`, default HEAD) by the
subject vLLM's squash merges give it (`… (#46735)`). The commit's changes to the package (the
rest, tests and docs, is left out and named) are taken onto the pin with `git am -3` in the
queue (`.queue/`, imported first where there is none), then exported to `patches/` and the
series. The message keeps the upstream subject and body and gets the series' trailers:

- `Upstream-PR`: the pull request of the commit's subject;
- `Applied-upstream`: the first release after the pin whose code has the fix: the tool's own
  classification (`series.classify.classify`) of the change on each release, not the tags that
  contain the commit (a release that contains it but whose code lacks the fix, reverted or
  rewritten, is not it; a patch release that took the fix without the commit is);
- `Introduced-in`: the first release whose code has the bug: going back from the pin, the
  releases where the change still applies (state `applies`, 3-way included), up to the first
  where it does not;
- `Introduced-by` and `Regression-test` are left empty for the maintainer, each after a `#`
  comment that says what it needs.

The releases are those tagged in GIT (`v<version>`, pre-releases aside) and those in the
mirror (PyPI sdists); a release in both is read from the mirror.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from packaging.version import Version

from vllm_patchset import versions
from vllm_patchset.console import progress
from vllm_patchset.errors import BadInput, Finding, GitError
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.gitargs import check_source
from vllm_patchset.infra.gitrepo import FORMAT_PATCH_ARGS, Repo
from vllm_patchset.overlay.upstream import Mirror, Upstream, mirror_for, pin_base
from vllm_patchset.series.classify import classify
from vllm_patchset.series.patches import REQUIRED_TRAILERS, Patch, parse_patch_bytes
from vllm_patchset.series.verdict import State, Verdict
from vllm_patchset.sync.queue import (
    CommitProblems,
    export_queue,
    import_queue,
    left_for_maintainer,
    open_queue,
    queue_path,
    trailer_lines,
)

PR_URL = "https://github.com/vllm-project/vllm/pull/{}"
_PR_REF = re.compile(r"#?(\d+)")
_PR_SUBJECT = re.compile(r"\(#(\d+)\)\s*$")


@dataclass(frozen=True)
class Provenance:
    """What the code tells of a fix: each value, and the states it was read from."""

    upstream_pr: str  # the pull request URL, or "" (no `(#N)` in the subject)
    introduced_in: str  # "" where the pin's code does not have the bug as the change expects
    applied_upstream: str  # "" where no release (of those known) has the fix
    states: tuple[tuple[str, str], ...]  # (release, its state's words), in version order
    # The release before `introduced_in` where the code the fix changes is there, changed
    # (a conflict): the bug may be older than the code the fix expects.
    changed_before: str = ""

    def values(self) -> dict[str, str]:
        """The trailers it fills (the others are the maintainer's)."""
        said = {
            "Upstream-PR": self.upstream_pr,
            "Introduced-in": self.introduced_in,
            "Applied-upstream": self.applied_upstream,
        }
        return {k: v for k, v in said.items() if v or k == "Applied-upstream"}


@dataclass(frozen=True)
class Backport:
    commit: str  # the upstream commit
    subject: str
    pin: str
    provenance: Provenance
    left_out: tuple[str, ...]  # the commit's paths outside the package (not taken)
    queue: Path
    taken: str  # the queue's commit, or "" where `git am -3` stopped on a conflict
    conflicts: tuple[str, ...] = ()
    patch: str = ""  # the file written in patches/
    problems: tuple[CommitProblems, ...] = ()  # other commits' problems: nothing was written

    @property
    def left(self) -> tuple[str, ...]:
        """The trailers left for the maintainer."""
        said = self.provenance.values()
        return tuple(k for k in REQUIRED_TRAILERS if k not in said)


# -- the commit ----------------------------------------------------------------------------------
def find_commit(repo: Repo, source: str, ref: str, branch: str) -> str:
    """The commit REF names, fetched from `source` into `repo` (the mirror): a pull request
    number is looked for in the subjects of `branch`'s history; bare digits that are also an
    abbreviated commit id of that history are the commit, unless a subject names them too."""
    check_source(source)
    number = _PR_REF.fullmatch(ref)
    if number is None:
        try:
            with progress(f"fetching {ref} from {source}"):
                return repo.fetch(source, ref)
        except GitError:  # a short commit id: git fetches names and full ids only
            with progress(f"fetching {branch} from {source}"):
                head = repo.fetch(source, branch)
        found = repo.resolve(ref)
        if found is None or not _contains(repo, head, found):
            raise BadInput(f"{ref} is not a commit of {source} (nor of its {branch})") from None
        return found
    with progress(f"fetching {branch} from {source}"):
        head = repo.fetch(source, branch)
    pr = number.group(1)
    log = repo.run("log", "--format=%H %s", "--fixed-strings", f"--grep=(#{pr})", head, "--")
    named = [
        line.split(" ", 1)[0]
        for line in log.splitlines()
        if (match := _PR_SUBJECT.search(line)) and match.group(1) == pr
    ]
    # Bare digits may also be an abbreviated commit id (one in a hundred of them is all digits).
    found = None if ref.startswith("#") else repo.resolve(ref)
    if found is not None and _contains(repo, head, found):
        if named:
            raise BadInput(
                f"{ref} names both pull request #{pr} and commit {found[:12]} of {source}: write"
                f" #{pr} for the pull request, or more of the commit id"
            )
        return found
    if not named:
        raise BadInput(
            f"no commit of {branch} of {source} names pull request #{pr} in its subject (as"
            f" `… (#{pr})`): name the commit instead, or another --branch"
        )
    if len(named) > 1:
        ids = ", ".join(c[:12] for c in named)
        raise BadInput(f"{len(named)} commits of {source} name pull request #{pr} ({ids})")
    return named[0]


def _contains(repo: Repo, head: str, commit: str) -> bool:
    try:
        repo.run("merge-base", "--is-ancestor", commit, head)
    except GitError:
        return False
    return True


def upstream_patch(repo: Repo, commit: str, package: str) -> tuple[bytes, tuple[str, ...]]:
    """The commit's changes to `package` as a format-patch file, and its other paths."""
    parents = repo.run("rev-list", "--parents", "-n", "1", commit).split()[1:]
    if len(parents) != 1:
        raise BadInput(f"{commit[:12]} is a merge or a root commit: name the commit of the fix")
    listing = repo.run("diff-tree", "--no-commit-id", "--name-only", "-r", "-z", commit)
    paths = [p for p in listing.split("\0") if p]
    left_out = tuple(p for p in paths if PurePosixPath(p).parts[:1] != (package,))
    data = repo.run_bytes(
        "format-patch", *FORMAT_PATCH_ARGS, "--stdout", f"{commit}^..{commit}", "--", f"{package}/"
    )
    if not data:
        raise BadInput(f"{commit[:12]} changes nothing in {package}/: nothing to backport")
    return data, left_out


def with_body(raw: bytes, body: str) -> bytes:
    """The format-patch file `raw` with `body` as its message after the subject."""
    header, _, rest = raw.partition(b"\n\n")
    rest = b"\n" + rest
    end = rest.index(b"\n---\n")
    return header + b"\n\n" + body.rstrip("\n").encode() + rest[end:]


# -- the provenance ------------------------------------------------------------------------------
def releases(mirror: Mirror, source: str) -> dict[str, str]:
    """version -> the tag it is read from: `v<version>` of the mirror, else `git:<tag>` of
    `source`. Final releases only (post-releases included)."""
    found: dict[str, str] = {}
    listing = mirror.repo.run("ls-remote", "--tags", "--", source)
    for line in listing.splitlines():
        name = line.split("\t", 1)[-1].removeprefix("refs/tags/")
        if not name.endswith("^{}"):
            _add(found, name.removeprefix("v"), f"git:{name}")
    for tag in mirror.repo.tags("v*"):
        _add(found, tag.removeprefix("v"), tag, replace=True)
    return found


def _add(found: dict[str, str], spelt: str, where: str, *, replace: bool = False) -> None:
    version = versions.parse(spelt)
    if version is None or version.is_prerelease:
        return
    key = str(version)
    if replace or key not in found:
        found[key] = where


def _tree(mirror: Mirror, source: str, where: str) -> Upstream:
    if where.startswith("git:"):
        return mirror.git_ref(source, where.removeprefix("git:"))
    found = mirror.get(where)
    if found is None:  # not the tool's own tag: fetched from the index again
        return mirror.release(where.removeprefix("v"))
    return found


def _state(mirror: Mirror, upstream: Upstream, patch: Patch) -> Verdict:
    """The text's state of the change on `upstream` (no trailer tells it anything)."""
    tree = mirror.repo.tree_of(upstream.commit)
    return classify(mirror.repo, tree, patch, base=upstream.label, version=None, three_way=True)


def _introduced_in(
    on_release: Callable[[str], Verdict], pin_version: str, older: list[str]
) -> tuple[str, str]:
    """The earliest release the change applies to, searching back from the pin through
    `older` (newest first) while it applies; and the release where the search stopped on a
    conflict (its code changed there: the bug may be older), else ""."""
    introduced = pin_version
    for version in older:
        verdict = on_release(version)
        if verdict.state != State.APPLIES:
            return introduced, version if verdict.state == State.CONFLICT else ""
        introduced = version
    return introduced, ""


def provenance(
    mirror: Mirror, source: str, pin: Upstream, pin_version: str, patch: Patch, subject: str
) -> Provenance:
    """`Upstream-PR`, `Introduced-in` and `Applied-upstream` of the change `patch` (the module's
    docstring says how)."""
    number = _PR_SUBJECT.search(subject)
    pinned = versions.parse(pin_version)
    if pinned is None:
        raise BadInput(f"the pin {pin_version!r} is not a release version: no release to compare")
    known = releases(mirror, source)
    states: dict[str, str] = {}

    def on_release(version: str) -> Verdict:
        verdict = _state(mirror, _tree(mirror, source, known[version]), patch)
        states[version] = verdict.words
        return verdict

    with progress("classifying the fix on the releases"):
        on_pin = _state(mirror, pin, patch)
        states[pin_version] = on_pin.words
        if on_pin.state == State.UPSTREAM:
            raise Finding(f"the pin {pin_version} already has this fix: nothing to backport")
        introduced, changed_before = "", ""
        if on_pin.state == State.APPLIES:
            older = sorted((v for v in known if Version(v) < pinned), key=Version, reverse=True)
            introduced, changed_before = _introduced_in(on_release, pin_version, older)
        newer = sorted((v for v in known if Version(v) > pinned), key=Version)
        applied = next((v for v in newer if on_release(v).state == State.UPSTREAM), "")
    return Provenance(
        upstream_pr=PR_URL.format(number.group(1)) if number else "",
        introduced_in=introduced,
        applied_upstream=applied,
        states=tuple((v, states[v]) for v in versions.ordered(states)),
        changed_before=changed_before,
    )


def message_body(commit: str, body: str, prov: Provenance) -> str:
    """The upstream body, where the commit came from, and the trailers: those computed, the
    others empty after a `#` comment saying what each needs (and why it is left)."""
    why = {
        "Upstream-PR": "its subject names no pull request, as `... (#N)`",
        "Introduced-in": "the change does not apply to the pin as it is",
        "Applied-upstream": "no release known has the fix",
    }
    lines = [body.strip(), ""] if body.strip() else []
    lines += [f"Backport of upstream commit {commit}.", ""]
    for line in trailer_lines(prov.values(), why):
        if line.startswith("Introduced-in: ") and prov.changed_before:
            lines.append(
                f"# Introduced-in: the first release whose code is the one the fix changes;"
                f" {prov.changed_before} has that code changed: the bug may be older (check)"
            )
        lines.append(line)
    return "\n".join(lines) + "\n"


# -- the backport --------------------------------------------------------------------------------
def backport(project: Project, ref: str, source: str, branch: str = "HEAD") -> Backport:
    mirror = mirror_for(project)
    repo = mirror.repo
    commit = find_commit(repo, source, ref, branch)
    raw, left_out = upstream_patch(repo, commit, project.package)
    subject = repo.run("log", "-1", "--format=%s", commit).strip()
    body = repo.run("log", "-1", "--format=%b", commit)
    # Classified with the trailers as placeholders (the text decides; the version is not given).
    placeholders = "\n".join(f"{k}: -" for k in REQUIRED_TRAILERS if k != "Applied-upstream")
    source_name = Path(f"{commit[:12]}.patch")
    patch = parse_patch_bytes(with_body(raw, placeholders + "\nApplied-upstream:\n"), source_name)
    pin = pin_base(project, mirror)
    prov = provenance(mirror, source, pin, project.pin, patch, subject)
    taken = with_body(raw, message_body(commit, body, prov))
    if queue_path(project).exists():
        queue = open_queue(project)
        if queue.is_dirty():
            raise Finding(f"{queue.path} has uncommitted changes: commit them (git commit) first")
    else:
        import_queue(project)
        queue = open_queue(project)
    done = Backport(commit, subject, project.pin, prov, left_out, queue.path, "")
    before = queue.head()
    with progress(f"taking {commit[:12]} onto {project.pin} (git am -3)"):
        clean = queue.am_3way(taken)
    if not clean:
        return replace(done, conflicts=tuple(queue.unmerged_paths()))
    head = queue.head()
    if head == before:  # `git am -3` skips a patch whose changes are all there
        raise Finding(
            f"git am -3 of {commit[:12]} onto {project.pin} changed nothing: the queue"
            f" ({queue.path}) already has it; nothing was written"
        )
    # Its empty trailers, and those of the backports before it not edited since, are the
    # maintainer's to fill: the export writes them as they are.
    info = export_queue(project, unfinished=left_for_maintainer(queue) | {head})
    name = info.patches[-1] if info.patches else ""
    return replace(done, taken=head, patch=name, problems=info.problems)
