"""The deploy commands (commands/deploy.py: `overlay apply|verify|revert|status|diff`) as a
user meets them: which overlay a line deploys, compared with what the target records. The
commands' work on a real vLLM, killed at every write point, is test_deploy.py's."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from command_lines import parse_line
from support import cli
from vllm_install import PATCHES, Overlay
from vllm_patchset.commands import deploy, overlay


def test_status_names_the_other_overlay_applied_there(
    overlay: Overlay, target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(capsys, overlay.project.root, "overlay", "apply", "--target", target)[0] == 0
    other = tmp_path / "other"
    shutil.copytree(overlay.project.root, other, ignore=shutil.ignore_patterns(".git"))
    lock = dataclasses.replace(overlay.lock, patches=overlay.lock.patches[:1])
    (other / "overlay" / "overlay.lock.json").write_text(lock.to_json())
    code, out, err = cli(capsys, other, "overlay", "status", "--target", target)
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == (
        f"  note: the overlay applied there ({', '.join(PATCHES)} on 0.24.0) is not this one:"
        " `vllm-patchset overlay revert` removes it, then `overlay apply` applies this one"
    )


DEPLOY = {
    "command": "overlay",
    "func": deploy.cmd_deploy,
    "writes_checkout": False,
    "needs": (),
    "min_python": (3, 10),  # what a serving image may run (the packed wheel's floor)
}
TARGET = {"target": Path("/srv/site"), "python": None}
LINES = [
    (("apply", "--target", "/srv/site"), {**TARGET, "dry_run": False, "force": False, "diff": False}),
    (("apply", "--target", "/srv/site", "--dry-run", "--diff"), {**TARGET, "dry_run": True, "force": False, "diff": True}),
    (("verify", "--target", "/srv/site"), TARGET),
    (("revert", "--target", "/srv/site", "--force"), {**TARGET, "dry_run": False, "force": True}),
    (("status", "--python", "/venv/bin/python"), {"target": None, "python": "/venv/bin/python"}),
    (("diff", "--target", "/srv/site", "--pristine"), {**TARGET, "pristine": True}),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "values"), LINES)
def test_the_deploy_lines_parsed(argv: tuple[str, ...], values: dict[str, object]) -> None:
    """Each deploy command joins the `overlay` group with its handler and options."""
    assert parse_line(overlay, "overlay", *argv) == {
        **DEPLOY,
        "overlay_command": argv[0],
        **values,
    }
