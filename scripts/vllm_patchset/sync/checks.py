"""`vllm-patchset check`'s rules, in one place: the CLI runs them on the checkout, and a rebase
runs them on its staged result before it swaps anything in (a finished rebase leaves a project
that passes `check`)."""

from __future__ import annotations

import re

from vllm_patchset import versions
from vllm_patchset.errors import MalformedPatch
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.fsio import plain_parts, read_regular
from vllm_patchset.overlay.build import Walk, lock_for, walk
from vllm_patchset.overlay.lock import Lock, compare_locks
from vllm_patchset.overlay.upstream import Mirror, pin_base
from vllm_patchset.series.patches import (
    Patch,
    Series,
    Trailers,
    load_series,
    parse_patch,
    read_series_entries,
    read_series_file,
)
from vllm_patchset.series.verdict import Reason, State, Verdict
from vllm_patchset.sync.verdict_reports import lock_next_step


def project_series(project: Project) -> Series:
    """The series, the upstreamed archive and the parked patches (each listed file parsed,
    its trailers read; every patch file listed)."""
    return load_series(project.series_file, project.upstreamed_file, project.parked_file)


def lock_freshness(project: Project, mirror: Mirror, result: Walk) -> str:
    """ "fresh", "missing", or "stale (<the first difference>)"."""
    if not project.lock_path.is_file():
        return "missing"
    difference = compare_locks(
        lock_for(mirror, result, project.package), Lock.load(project.lock_path)
    )
    return "fresh" if difference is None else f"stale ({difference})"


_PR_URL = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/pull/\d+$")
_PR_NUMBER = re.compile(r"^#?\d+$")
_NODE = re.compile(r"^(tests/[\w./-]+\.py)((?:::[\w\[\]-]+)*)$")


def _line(raw: bytes, prefix: str) -> int:
    """The 1-based line of the patch where `prefix` starts a line (1 when none does)."""
    for number, line in enumerate(raw.decode("utf-8", "replace").split("\n"), 1):
        if line.startswith(prefix):
            return number
    return 1


def _defines(project: Project, path: str, names: list[str]) -> bool:
    data = read_regular(project.root / path) if plain_parts(path, "tests") else None
    if data is None:
        return False
    text = data.decode("utf-8", "replace")
    return all(
        re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(n)}\b", text, re.M) for n in names
    )


def trailer_problems(project: Project, patch: Patch, archived: bool) -> list[str]:
    """Every trailer of `patch` checked against what the patches use: versions PEP 440 (or
    `nightly` where a bug came in), `Introduced-in` <= `Applied-upstream`, a series patch's
    `Applied-upstream` (when set) a release after the pin, an archived one's at or before it,
    `Upstream-PR` a pull request (URL or number) or `none` with its reason, `Regression-test`
    ids of tests that exist in tests/ (where the project has a tests/ folder)."""
    t = patch.trailers
    found = [
        *_version_problems(t),
        *_release_problems(t, project.pin, archived),
        *_pr_problems(t.upstream_pr),
        *_test_problems(project, t.regression_tests),
    ]
    return [f"{patch.path}:{_line(patch.raw, name + ':')}: {message}" for name, message in found]


# (the trailer, what is wrong with it)
_Problems = list[tuple[str, str]]


def _version_problems(t: Trailers) -> _Problems:
    """The versions, each on its own and the two together."""
    out = []
    for name, value, nightly in (
        ("Introduced-in", t.introduced_in, True),
        ("Applied-upstream", t.applied_upstream, False),
    ):
        problem = versions.trailer_problem(name, value, nightly=nightly)
        if problem:
            out.append((name, problem))
    if not t.introduced_in:
        out.append(("Introduced-in", "Introduced-in: empty (a release, or `nightly`)"))
    if versions.older(t.applied_upstream, t.introduced_in):
        out.append(
            (
                "Applied-upstream",
                f"Applied-upstream: {t.applied_upstream} is before Introduced-in:"
                f" {t.introduced_in}",
            )
        )
    return out


def _release_problems(t: Trailers, pin: str, archived: bool) -> _Problems:
    """`Applied-upstream` against the pin: an archived patch's at or before it, a series
    patch's (when a version) after it."""
    if archived and not t.applied_upstream:
        why = "Applied-upstream: empty on an archived patch (the release with the fix)"
    elif archived and versions.older(pin, t.applied_upstream):
        why = f"Applied-upstream: {t.applied_upstream} on an archived patch is after the pin {pin}"
    elif (
        not archived
        and versions.is_version(t.applied_upstream)
        and versions.is_version(pin)
        and not versions.older(pin, t.applied_upstream)
    ):
        why = (
            f"Applied-upstream: {t.applied_upstream} on a patch of the series is not a"
            f" release after the pin {pin} (archive it, or empty it)"
        )
    else:
        return []
    return [("Applied-upstream", why)]


def _pr_problems(pr: str) -> _Problems:
    words = pr.split()
    if words and words[0].lower() == "none":
        if len(words) == 1:
            return [("Upstream-PR", "Upstream-PR: `none` without its reason (e.g. `none (local)`)")]
        return []
    if not (_PR_URL.match(pr) or _PR_NUMBER.match(pr)):
        why = f"Upstream-PR: {pr!r} is not a pull request URL or number, nor `none (why)`"
        return [("Upstream-PR", why)]
    return []


def _test_problems(project: Project, nodes: tuple[str, ...]) -> _Problems:
    """Each id a test id; of a test that exists, where the project has a tests/ folder."""
    has_tests = (project.root / "tests").is_dir()
    out = []
    for node in nodes:
        match = _NODE.match(node)
        if not match:
            why = f"Regression-test: {node!r} is not a test id (tests/<file>.py::<test>)"
            out.append(("Regression-test", why))
        elif has_tests:
            names = [n.split("[", 1)[0] for n in match.group(2).split("::") if n]
            if not _defines(project, match.group(1), names):
                out.append(("Regression-test", f"Regression-test: {node} does not exist in tests/"))
    return out


def lint(project: Project) -> tuple[int, list[str], Series | None]:
    """Every listed patch file parsed and its trailers checked, whatever else fails: (the
    number of patches, the problems, the series when every file parsed)."""
    found: list[str] = []
    count = 0
    for series_file, prefix, archived in (
        (project.series_file, "", False),
        (project.upstreamed_file, project.upstreamed_file.parent.name + "/", True),
        (project.parked_file, project.parked_file.parent.name + "/", False),
    ):
        names = read_series_file(series_file)  # a series that cannot be read: exit 2
        count += len(names)
        for name in names:
            path = series_file.parent / name
            try:
                patch = parse_patch(path, prefix + name)
            except MalformedPatch as exc:
                found.append(f"{path}:1: {exc}")
                continue
            if series_file != project.parked_file:
                found += trailer_problems(project, patch, archived)
    if found:
        return count, found, None
    return count, found, project_series(project)


def series_problems(verdict: Verdict, pin: str) -> list[str]:
    """A series patch's verdict on the pin: it must apply there as it is (no other reason, no
    offset)."""
    if verdict.state != State.APPLIES:
        return [f"{verdict.patch}: {verdict.words} on the pin {pin}"]
    if verdict.reason != Reason.APPLIES:
        return [
            f"{verdict.patch}: applies to {pin} only {verdict.reason.value} (its code there is"
            " reformatted, moved or in several places): refresh it (queue import, queue export)"
        ]
    if verdict.offsets:
        return [
            f"{verdict.patch}: applies to {pin} only at an offset {verdict.offsets}: refresh it"
            " (queue import, queue export)"
        ]
    return []


def archive_problems(verdict: Verdict) -> list[str]:
    """An archived patch's verdict on the pin: it must neither apply there nor find its bug."""
    if verdict.state == State.APPLIES:
        return [f"{verdict.patch}: archived as upstream, yet applies to the pin"]
    if verdict.bug_present:
        return [f"{verdict.patch}: archived as upstream, yet its bug is on the pin"]
    return []


def problems(project: Project, mirror: Mirror) -> tuple[int, list[str]]:
    """The number of patches and every problem: each patch file and its trailers (`lint`),
    then: every series patch applies to the pin with no fuzz and no offset, no archived patch
    applies to it or has its bug there, every parked patch says why it is parked, and the
    lock is the one a fresh build gives."""
    count, found, series = lint(project)
    if series is None:
        return count, found
    result = walk(mirror, pin_base(project, mirror), series.upstreamed + series.active)
    active = {p.key for p in series.active}
    for verdict in result.verdicts:
        if verdict.patch in active:
            found += series_problems(verdict, project.pin)
        else:
            found += archive_problems(verdict)
    for name, reason in read_series_entries(project.parked_file):
        if not reason:
            found.append(
                f"{project.parked_file}: {name} has no reason (a `# why it is parked` comment"
                " on its line)"
            )
    freshness = lock_freshness(project, mirror, result)
    if freshness != "fresh":
        found.append(f"lock {project.lock_path.name}: {freshness}: {lock_next_step(freshness)}")
    return count, found
