"""`vllm-patchset backport REF --from GIT`: an upstream fix taken onto the pin as a patch of the
series, its provenance computed where the code can tell it (`sync/backport.py`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from vllm_patchset.commands import project_of, staged_only
from vllm_patchset.console import emit, fit
from vllm_patchset.registry import GIT, Subcommands, add_command

if TYPE_CHECKING:
    from vllm_patchset.sync.backport import Backport


def cmd_backport(args: argparse.Namespace) -> int:
    from vllm_patchset.sync.backport import backport

    staged_only()
    done = backport(project_of(args), args.ref, args.source, args.branch)
    body = {
        "commit": done.commit,
        "subject": done.subject,
        "pin": done.pin,
        "trailers": done.provenance.values(),
        "left": list(done.left),
        "states": dict(done.provenance.states),
        "left_out": list(done.left_out),
        "queue_commit": done.taken,
        "patch": done.patch,
        "conflicts": list(done.conflicts),
        "problems": [p.commit for p in done.problems],
    }
    code = 1 if done.conflicts or done.problems else 0
    return emit(args, "\n".join(report_lines(done)), body, code, verbatim=True)


def report_lines(done: Backport) -> list[str]:
    from vllm_patchset.sync.queue import shown

    queue = shown(done.queue)
    states = ", ".join(f"{v} {words}" for v, words in done.provenance.states)
    said = done.provenance.values()
    head = f"backport: {done.commit[:12]} {done.subject}"
    lines = [head, f"  classified: {states}"]
    empty = "(empty: no release has it yet)"
    older = done.provenance.changed_before
    notes = {"Introduced-in": f" ({older} has that code changed: the bug may be older)"}
    lines += [
        f"  {key}: {value or empty}{notes.get(key, '') if older else ''}"
        for key, value in said.items()
    ]
    lines += [f"  left out (outside the package): {path}" for path in done.left_out]
    left = " and ".join(done.left)
    steps = [
        f"git -C {queue} commit --amend  (fill {left}: the # lines say what each needs)",
        "write the regression test in tests/gpu/ (it fails on the pin, passes with the fix)",
        "vllm-patchset queue export",
        "vllm-patchset overlay build --update-lock",
        "vllm-patchset check",
    ]
    if done.conflicts:
        lines.append(
            f"  stopped: git am -3 onto {done.pin} conflicts in {', '.join(done.conflicts)}"
        )
        steps = [
            f"resolve them in {queue}, then git -C {queue} add PATH..., git -C {queue} am"
            " --continue",
            *steps,
        ]
    elif done.problems:
        lines.append(f"  taken onto {done.pin} in {queue} as {done.taken[:12]}; not exported:")
        lines += [f"    {p.commit} {p.subject}: {'; '.join(p.problems)}" for p in done.problems]
        steps = ["fix those commits (vllm-patchset queue export lists each)", *steps]
    else:
        lines.append(
            f"  taken onto {done.pin} as patches/{done.patch} (in {queue}: {done.taken[:12]});"
            " the overlay lock is stale until step 4"
        )
    lines = [fit(line) for line in lines]  # the steps, commands to copy, stay whole
    lines.append("next:")
    lines += [f"  {n}. {step}" for n, step in enumerate(steps, 1)]
    return lines


def register_cli(sub: Subcommands) -> None:
    p = add_command(
        sub,
        "backport",
        cmd_backport,
        help="take an upstream fix (a commit, or a PR number) onto the pin as a patch",
        writes_checkout=True,
        needs=GIT,
    )
    p.add_argument("ref", metavar="REF", help="an upstream commit, or a pull request number")
    p.add_argument(
        "--from",
        dest="source",
        metavar="GIT",
        required=True,
        help="the upstream vLLM repository (a clone's path, or a URL)",
    )
    p.add_argument(
        "--branch",
        default="HEAD",
        metavar="REF",
        help="where a pull request number is looked for (default: GIT's HEAD)",
    )
