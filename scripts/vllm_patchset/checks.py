"""`vllm-patchset check`'s rules, in one place: the CLI runs them on the checkout, and a rebase
runs them on its staged result before it swaps anything in (a finished rebase leaves a project
that passes `check`)."""

from __future__ import annotations

from vllm_patchset.config import Project
from vllm_patchset.lock import Lock
from vllm_patchset.overlay import Walk, compare_locks, lock_for, walk
from vllm_patchset.series import Series, load_series, read_series_entries
from vllm_patchset.states import State
from vllm_patchset.upstream import Mirror, pin_base


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


def problems(project: Project, mirror: Mirror) -> tuple[Series, list[str]]:
    """Series <-> files and trailers (a bad file raises), then: every series patch applies to
    the pin with no fuzz and no offset, no archived patch applies to it, every parked patch
    says why it is parked, and the lock is the one a fresh build gives."""
    series = project_series(project)
    result = walk(mirror, pin_base(project, mirror), series.upstreamed + series.active)
    found = []
    active = {p.key for p in series.active}
    for verdict in result.verdicts:
        if verdict.patch in active and verdict.state != State.APPLIES:
            found.append(f"{verdict.patch}: {verdict.words} on the pin {project.pin}")
        elif verdict.patch in active and verdict.offsets:
            found.append(
                f"{verdict.patch}: applies to {project.pin} only at an offset "
                f"{verdict.offsets}: refresh it (queue import, queue export)"
            )
        elif verdict.patch not in active and verdict.state == State.APPLIES:
            found.append(f"{verdict.patch}: archived as upstream, yet applies to the pin")
    for name, reason in read_series_entries(project.parked_file):
        if not reason:
            found.append(
                f"{project.parked_file}: {name} has no reason (a `# why it is parked` comment"
                " on its line)"
            )
    freshness = lock_freshness(project, mirror, result)
    if freshness != "fresh":
        found.append(f"lock {project.lock_path.name}: {freshness}")
    return series, found
