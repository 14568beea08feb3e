"""The decisions named on the rebase's command line (`--keep 0002`, `--drop upstreamed/0001`,
`--resolve-upstream 0001-x.patch`, `--port`): each PATCH resolved to one patch's key, and each
decision checked against the plan (a patch not settled yet, an option it has, a release that
has the fix) before anything is taken."""

from __future__ import annotations

from collections.abc import Sequence

from vllm_patchset import versions
from vllm_patchset.errors import BadInput
from vllm_patchset.overlay.upstream import Upstream, check_version
from vllm_patchset.series.patches import Patch, Series
from vllm_patchset.sync.rebase_plan import ordered
from vllm_patchset.sync.rebase_state import Choice, Decision, RebaseState, Step


def resolve_names(
    series: Series, choices: Sequence[tuple[Choice, str]], release: str | None
) -> tuple[Decision, ...]:
    """`--keep 0002`, `--drop upstreamed/0001`, `--resolve-upstream 0001-x.patch`: each
    PATCH is a key (path under patches/), a file name, or a key's number prefix."""
    patches = [p for _, p in ordered(series)]
    if release is not None:
        release = check_version(release)
        if not any(c == Choice.RESOLVE_UPSTREAM for c, _ in choices):
            raise BadInput("--release goes with --resolve-upstream PATCH")
    decisions: list[Decision] = []
    for choice, name in choices:
        key = _named(patches, choice, name)
        if any(d.patch == key for d in decisions):
            raise BadInput(f"{choice.flag} {name}: {key} has a decision already")
        decisions.append(
            Decision(key, choice, release if choice == Choice.RESOLVE_UPSTREAM else None)
        )
    return tuple(decisions)


def _named(patches: Sequence[Patch], choice: Choice, name: str) -> str:
    """The key of the one patch `name` names (its key, file name, or number prefix)."""
    found = (
        [p for p in patches if p.key == name]
        or [p for p in patches if p.name == name]
        or [p for p in patches if p.key.startswith(name + "-")]
    )
    if not found:
        raise BadInput(f"{choice.flag} {name}: no such patch in patches/")
    if len(found) > 1:
        keys = ", ".join(p.key for p in found)
        raise BadInput(f"{choice.flag} {name}: ambiguous ({keys}); name the file")
    return found[0].key


def validate(steps: Sequence[Step], decisions: Sequence[Decision], onto: Upstream) -> None:
    """Each decision names a patch of `steps` (not settled yet), one of its options, and a
    release that has the fix (`--resolve-upstream`)."""
    by_key = {s.key: s for s in steps}
    for decision in decisions:
        step = by_key.get(decision.patch)
        if step is None:
            raise BadInput(f"{decision.choice.flag} {decision.patch}: it is settled already")
        where = f"{step.verdict.words} on {onto.label}"
        if not step.options:
            raise BadInput(
                f"{decision.choice.flag} {decision.patch}: it needs no decision ({where})"
            )
        if decision.choice not in step.options:
            allowed = ", ".join(c.flag for c in step.options)
            raise BadInput(
                f"{decision.choice.flag} {decision.patch}: not an option for a patch {where}"
                f" (its options: {allowed})"
            )
        _check_release(decision, onto)


def _check_release(decision: Decision, onto: Upstream) -> None:
    """A `--resolve-upstream` names a release that has the fix: not newer than the base, and
    one there is (the base's own, or `--release`)."""
    newer = (
        decision.release is not None
        and onto.version is not None
        and versions.older(onto.version, decision.release)
    )
    if newer:
        raise BadInput(
            f"--resolve-upstream {decision.patch}: --release {decision.release} is newer"
            f" than {onto.label}, which has the fix"
        )
    if decision.choice == Choice.RESOLVE_UPSTREAM and not (decision.release or onto.version):
        raise BadInput(
            f"--resolve-upstream {decision.patch}: {onto.label} has no release version;"
            " say which release has the fix with --release VERSION"
        )


def not_settled(state: RebaseState, new: Sequence[Decision]) -> None:
    """Decisions given to `--continue` name patches not settled yet in this rebase."""
    taken = {s.key for s in state.steps[:-1]}
    for decision in new:
        if decision.patch in taken or state.decision(decision.patch):
            raise BadInput(
                f"{decision.choice.flag} {decision.patch}: settled already in this rebase"
                " (`rebase --abort` to start again)"
            )
