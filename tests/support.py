"""Helpers shared by the tests (imported by name: `from support import ...`; a module of its
own, since tests/ and tests/gpu/ each have a conftest.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from vllm_patchset.upstream import Mirror

REPO = Path(__file__).resolve().parent.parent
PROJECT_FILES = (
    "pyproject.toml",
    "patches",
    "overlay/overlay.lock.json",
    "CHANGELOG.md",
    ".github/workflows/gpu-validation.yml",
    ".buildkite/gpu-validation.yml",
)
NIGHTLY_LINE_FIXED = "kE2M1ToFloat_handle.val = kE2M1ToFloat_handle.val.to(w13.device)"
NIGHTLY_LINE_BUGGY = "kE2M1ToFloat_handle.val = kE2M1ToFloat_handle.val.to(layer.weight.device)"
ORACLE = "vllm/model_executor/layers/fused_moe/oracle/nvfp4.py"


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout


def make_upstream_repo(mirror: Mirror, version: str, path: Path) -> Path:
    """A local git repo holding vLLM `version` (from its PyPI sdist), tagged v<version>."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    mirror.repo.archive_to(mirror.release(version).commit, path)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", f"vllm {version}")
    git(path, "tag", f"v{version}")
    return path
