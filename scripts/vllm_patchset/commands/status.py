"""`vllm-patchset status`: the pin, each patch's state on it, the lock's freshness."""

from __future__ import annotations

import argparse

from vllm_patchset.commands import project_of, reads_only
from vllm_patchset.console import emit
from vllm_patchset.infra.config import Project
from vllm_patchset.registry import GIT, Subcommands, add_command


def cmd_status(args: argparse.Namespace) -> int:
    from vllm_patchset.overlay.build import walk
    from vllm_patchset.overlay.upstream import mirror_for, pin_base
    from vllm_patchset.series.classify import classify
    from vllm_patchset.sync.checks import lock_freshness, project_series
    from vllm_patchset.sync.verdict_reports import status_report

    reads_only()
    project = project_of(args)
    mirror = mirror_for(project)
    series = project_series(project)
    result = walk(mirror, pin_base(project, mirror), series.all)
    # Parked patches are not applied: each is classified on the patched pin, for the record.
    parked = [
        classify(mirror.repo, result.tree, p, base=project.pin, version=result.upstream.version)
        for p in series.parked
    ]
    reasons = {f"{project.parked_file.parent.name}/{n}": r for n, r in _parked(project)}
    freshness = lock_freshness(project, mirror, result)
    verdicts = [*result.verdicts, *parked]
    text, body = status_report(
        project.package, project.pin, verdicts, reasons, freshness, verbose=args.verbose
    )
    if args.verbose:  # the index vLLM comes from and where that setting came from (never a secret)
        text += "\n" + mirror.index.describe()
        body["index"] = mirror.index.as_json()
    return emit(args, text, body, 0 if freshness == "fresh" else 1)


def _parked(project: Project) -> list[tuple[str, str]]:
    from vllm_patchset.series.patches import read_series_entries

    return read_series_entries(project.parked_file)


def register_cli(sub: Subcommands) -> None:
    add_command(
        sub,
        "status",
        cmd_status,
        help="the pin, each patch's state on it, the lock's freshness",
        writes_checkout=False,
        needs=GIT,
    )
