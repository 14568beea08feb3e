"""The GPU jobs (.github/workflows/gpu-validation.yml, .buildkite/gpu-validation.yml) as ROCm and
CUDA users run them, and their script's steps up to the GPU on the CPU
(`GPU_VALIDATION_DRY_RUN=1 scripts/gpu-validation.sh`: the image's pin, `check`,
`validate --build-only`), so that a broken job shows here before a runner exists.

ROCm: the containers get /dev/kfd and /dev/dri, the video and render groups, seccomp unconfined,
and the runner's GPUs through HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES, as vLLM's own AMD CI
starts them; CUDA: --gpus with CUDA_VISIBLE_DEVICES. Both in vLLM's own image for the pin.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from support import REPO, committed, export_committed
from vllm_install import Pristine
from vllm_patchset.gpu.validate import tree_names
from vllm_patchset.infra.config import Project

PIN = Project.load(REPO, None).pin
IMAGES = {"cuda": f"vllm/vllm-openai:v{PIN}", "rocm": f"vllm/vllm-openai-rocm:v{PIN}"}
ROCM_OPTIONS = (
    "--device=/dev/kfd",
    "--device=/dev/dri",
    "--group-add video",
    "--group-add render",
    "--security-opt seccomp=unconfined",
    "-e HIP_VISIBLE_DEVICES",
    "-e ROCR_VISIBLE_DEVICES",
)
CUDA_OPTIONS = ("--gpus all", "-e CUDA_VISIBLE_DEVICES")
SCRIPT = "bash scripts/gpu-validation.sh"


def workflow(path: str) -> Any:
    return YAML(typ="safe").load(committed(path).decode())


@pytest.mark.parametrize(("job", "options"), [("cuda", CUDA_OPTIONS), ("rocm", ROCM_OPTIONS)])
def test_github_gpu_job(job: str, options: tuple[str, ...]) -> None:
    spec = workflow(".github/workflows/gpu-validation.yml")["jobs"][job]
    assert spec["container"]["image"] == IMAGES[job]
    given = " ".join(spec["container"]["options"].split())
    assert [o for o in options if o not in given] == []
    steps = spec["steps"]
    checkout = steps[0]
    assert checkout["uses"].startswith("actions/checkout@")
    assert checkout["with"]["persist-credentials"] is False  # nothing is pushed
    assert [s["run"] for s in steps if s.get("run", "").startswith("bash ")] == [SCRIPT]
    # The container runs as root: what it wrote goes back to the runner's user, always.
    chown = steps[-1]
    assert (chown["if"], chown["run"].split()[:2]) == ("always()", ["chown", "-R"])


def test_buildkite_gpu_jobs() -> None:
    steps = {s["key"]: s for s in workflow(".buildkite/gpu-validation.yml")["steps"]}
    for job in ("cuda", "rocm"):
        step = steps[f"gpu-validation-{job}"]
        assert step["command"] == SCRIPT
        docker = next(v for p in step["plugins"] for k, v in p.items() if k.startswith("docker#"))
        assert docker["image"] == IMAGES[job]
        if job == "rocm":
            assert docker["devices"] == ["/dev/kfd", "/dev/dri"]
            assert docker["add-groups"] == ["video", "render"]
            assert docker["security-opts"] == ["seccomp=unconfined"]
            assert docker["environment"] == ["HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"]
        else:
            assert (docker["gpus"], docker["environment"]) == ("all", ["CUDA_VISIBLE_DEVICES"])


def test_current_actions_and_credentials() -> None:
    """Actions on Node 24 (checkout v7, setup-python v7, cache v5, upload-artifact v7), pinned
    by commit; credentials kept only by the job that pushes (the sync)."""
    majors = {"checkout": "v7", "setup-python": "v7", "cache": "v5", "upload-artifact": "v7"}
    for path in sorted((REPO / ".github" / "workflows").glob("*.yml")):
        rel = str(path.relative_to(REPO))
        for job_name, job in workflow(rel)["jobs"].items():
            for step in job["steps"]:
                uses = step.get("uses", "")
                if not uses.startswith("actions/"):
                    continue
                action = uses.split("@")[0].removeprefix("actions/").split("/")[0]
                sha = uses.split("@")[1]
                assert len(sha) == 40, (rel, uses)
                line = next(t for t in committed(rel).decode().splitlines() if uses in t)
                assert line.split("# ")[-1].startswith(f"{majors[action]}."), (rel, line)
                if action == "checkout" and job_name != "sync":
                    assert step["with"]["persist-credentials"] is False, (rel, job_name)


def test_the_sync_saves_its_cache_on_days_it_stops() -> None:
    steps = workflow(".github/workflows/upstream-sync.yml")["jobs"]["sync"]["steps"]
    restore = next(s for s in steps if s.get("uses", "").startswith("actions/cache/restore@"))
    save = next(s for s in steps if s.get("uses", "").startswith("actions/cache/save@"))
    assert save["if"].startswith("always()")
    assert save["with"] == {"path": restore["with"]["path"], "key": restore["with"]["key"]}
    assert steps.index(save) == len(steps) - 1


# -- the script's dry run ----------------------------------------------------------------------
def fake_image(site: Path, pristine: Pristine, version: str) -> None:
    """The image's vllm as its metadata says: the pin's dist-info (version rewritten)."""
    info = f"vllm-{PIN}.dist-info"
    shutil.copytree(pristine.root / info, site / info)
    metadata = site / info / "METADATA"
    metadata.write_text(metadata.read_text().replace(f"Version: {PIN}\n", f"Version: {version}\n"))


def dry_run(project: Project, site: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GPU_VALIDATION_DRY_RUN": "1",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(site),
    }
    return subprocess.run(
        ["bash", str(project.root / "scripts" / "gpu-validation.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.fixture
def job_project(project: Project) -> Project:
    """The project as the job's checkout has it: the script and the GPU tests besides."""
    export_committed(("scripts/gpu-validation.sh", "tests/gpu"), project.root)
    return project


def test_dry_run_up_to_the_gpu(job_project: Project, pristine: Pristine, tmp_path: Path) -> None:
    fake_image(tmp_path / "image", pristine, PIN)
    done = dry_run(job_project, tmp_path / "image")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        f"dry run: vllm {PIN} is the pin; check and trees done; stopped before the GPU"
    )
    build = job_project.root / "build"
    trees = sorted(p.name for p in (build / "gpu-validate" / "trees").iterdir())
    assert trees == sorted(tree_names(job_project))
    # The project's pytest options but pytest-xdist's: one pytest process per tree, one GPU.
    ini = (build / "gpu-validate" / "pytest.ini").read_text()
    assert ini.splitlines()[1] == "addopts = -ra --strict-markers"


def test_dry_run_refuses_an_image_that_is_not_the_pin(
    job_project: Project, pristine: Pristine, tmp_path: Path
) -> None:
    fake_image(tmp_path / "image", pristine, "0.23.0")
    done = dry_run(job_project, tmp_path / "image")
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        f"this image holds vllm 0.23.0, the pin is {PIN}\n",
    )
