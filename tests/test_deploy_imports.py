"""The deploy commands import only what they use: on a serving image with the tool's wheel,
`overlay apply|verify|revert|status|diff` run without the other commands' dependencies
(tomlkit, which the rebase uses, and GitPython, which needs a git executable). The GPU host of
issue 19 had no tomlkit, and every command died on import because the command line imported
every command's module at start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_install import OVERLAID, Overlay

# The modules a deploy command imports, and no other of the package's.
DEPLOY_MODULES = [
    "vllm_patchset",
    "vllm_patchset.cli",
    # the command modules that live with the command line: their handlers import the work
    "vllm_patchset.commands",
    "vllm_patchset.commands.backport",
    "vllm_patchset.commands.bundle",
    "vllm_patchset.commands.cache",
    "vllm_patchset.commands.check",
    "vllm_patchset.commands.deploy",
    "vllm_patchset.commands.fetch",
    "vllm_patchset.commands.kit",
    "vllm_patchset.commands.matrix",
    "vllm_patchset.commands.options",
    "vllm_patchset.commands.overlay",
    "vllm_patchset.commands.patch",
    "vllm_patchset.commands.queue",
    "vllm_patchset.commands.rebase",
    "vllm_patchset.commands.releases",
    "vllm_patchset.commands.status",
    "vllm_patchset.commands.tree",
    "vllm_patchset.commands.validate",
    "vllm_patchset.console",
    "vllm_patchset.deploy",
    "vllm_patchset.deploy.bytecode",
    "vllm_patchset.deploy.guard",  # stdlib only: the stale-bytecode check of status and verify
    "vllm_patchset.deploy.operations",
    "vllm_patchset.deploy.plan",
    "vllm_patchset.deploy.record",
    "vllm_patchset.deploy.report",
    "vllm_patchset.deploy.source",
    "vllm_patchset.deploy.target",
    "vllm_patchset.deploy.transaction",
    "vllm_patchset.errors",
    "vllm_patchset.gpu",  # the names of the GPU commands' outputs, for their help
    "vllm_patchset.infra",
    "vllm_patchset.infra.codec",
    "vllm_patchset.infra.config",
    "vllm_patchset.infra.fsio",
    "vllm_patchset.infra.fsio.children",
    "vllm_patchset.infra.fsio.interrupts",
    "vllm_patchset.infra.fsio.locks",
    "vllm_patchset.infra.fsio.paths",
    "vllm_patchset.infra.fsio.writes",
    "vllm_patchset.infra.gitargs",  # the settings' checks of a pin's git source and ref: no git
    "vllm_patchset.infra.hashes",
    "vllm_patchset.infra.installed",
    "vllm_patchset.infra.jsonfile",
    "vllm_patchset.overlay",
    "vllm_patchset.overlay.lock",
    "vllm_patchset.registry",
]
BLOCKED = ("tomlkit", "git")  # None in sys.modules: their import fails
SCRIPT = """
import json, sys
for name in {blocked!r}:
    sys.modules[name] = None
from vllm_patchset.cli import main
codes = [main(["--project", {project!r}, "overlay", command, "--target", {target!r}, "--json"])
         for command in {commands!r}]
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "vllm_patchset")
print(json.dumps({{"codes": codes, "modules": loaded}}))
"""
COMMANDS = ["status", "diff", "apply", "verify", "status", "revert"]


def test_deploy_commands_without_the_other_commands_dependencies(
    overlay: Overlay, target: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = SCRIPT.format(
        blocked=BLOCKED, project=str(overlay.project.root), target=str(target), commands=COMMANDS
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    documents, text, decoder = [], done.stdout, json.JSONDecoder()
    while text.strip():
        document, end = decoder.raw_decode(text.lstrip())
        documents.append(document)
        text = text.lstrip()[end:]
    *reports, last = documents
    outcomes = [(d["command"], d["outcome"]) for d in reports]
    assert outcomes == [
        ("overlay status", "not applied"),
        ("overlay diff", "differs"),
        ("overlay apply", "applied"),
        ("overlay verify", "verified"),
        ("overlay status", "applied"),
        ("overlay revert", "reverted"),
    ]
    assert last == {"codes": [0, 0, 0, 0, 0, 0], "modules": DEPLOY_MODULES}
    assert len(OVERLAID) >= 1
