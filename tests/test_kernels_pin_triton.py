"""The overlay's kernels compiled with the Triton that the pin's users run. The tests' own stack is
newer (the dev extra's triton 3.9.0); vLLM 0.24.0 requires torch 2.11.0, whose Linux wheels
require triton 3.6.0. Both versions are read (torch's from the pin's wheel, Triton's from that
torch's metadata on PyPI: pip's report, the metadata file alone, no wheel), then checked against
the chain as it was written: a new pin changes it here.

tests/test_kernels_compile.py (every kernel in every configuration its launchers use, for
gfx942, gfx950 and sm_90) and tests/test_kernels_archs.py (the experts' launches per GPU from
sm_80 to sm_120 and gfx90a, within each GPU's shared memory, and Triton's refusal before sm_89)
run again in a child pytest with that Triton first on sys.path: every test they collect passes,
none skips. The interpreter's tests are not run again: users compile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest
from support import REPO, populating
from vllm_install import Pristine, pip

pytest.importorskip("torch", reason="the launchers run on torch tensors (pip install torch)")
pytest.importorskip("triton", reason="triton compiles the kernels (pip install triton)")

RERUN = ("tests/test_kernels_compile.py", "tests/test_kernels_archs.py")


def requirement(metadata: list[str], name: str) -> str:
    """The version a distribution pins `name` to (`Requires-Dist: name==V`, any marker)."""
    for line in metadata:
        spec = line.removeprefix("Requires-Dist:").split(";")[0].replace(" ", "")
        if spec.startswith(f"{name}=="):
            return spec.removeprefix(f"{name}==")
    raise AssertionError(f"no pinned {name} among {metadata}")


def wheel_requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(name).decode().splitlines()
    return [line for line in lines if line.startswith("Requires-Dist:")]


def torch_requires(version: str, cache_dir: Path) -> list[str]:
    """torch==version's Requires-Dist for CPython 3.11 on Linux x86_64, cached once read."""
    cached = cache_dir / "wheels" / f"torch-{version}.requires-dist.json"
    if not cached.is_file():
        home = cache_dir / "pip-home"
        home.mkdir(parents=True, exist_ok=True)
        report = home / "torch-report.json"
        pip("install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
            "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64", "--python-version",
            "3.11", "--implementation", "cp", "--target", str(home / "nowhere"),
            "--report", str(report), f"torch==={version}", home=home)  # fmt: skip
        (item,) = json.loads(report.read_text())["install"]
        requires = item["metadata"]["requires_dist"]
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(requires) + "\n")
    return [f"Requires-Dist: {r}" for r in json.loads(cached.read_text())]


@pytest.fixture(scope="module")
def pin_triton(full_pristine: Pristine, cache_dir: Path) -> tuple[str, Path]:
    """The Triton of the pin's torch, installed with `pip --target` in the test cache (a
    module's fixture: set up before each test's own environment, which leaves out the
    machine's index and TLS settings)."""
    with populating(cache_dir):
        torch_version = requirement(wheel_requires(full_pristine.wheel), "torch")
        version = requirement(torch_requires(torch_version, cache_dir), "triton")
        root = cache_dir / "installed" / f"triton-{version}"
        if not root.exists():
            home = cache_dir / "pip-home"
            wheels = cache_dir / "wheels"
            if not list(wheels.glob(f"triton-{version}-*.whl")):
                pip("download", f"triton=={version}", "--no-deps", "--only-binary=:all:",
                    "-d", str(wheels), home=home)  # fmt: skip
            wheel = next(wheels.glob(f"triton-{version}-*.whl"))
            staging = root.with_name(f"{root.name}.{os.getpid()}.tmp")
            shutil.rmtree(staging, ignore_errors=True)
            pip("install", "--no-deps", "--no-compile", "--target", str(staging), str(wheel),
                home=home)  # fmt: skip
            os.replace(staging, root)
    return version, root


def test_the_kernels_compile_with_the_pins_triton(
    pin_triton: tuple[str, Path], tmp_path: Path
) -> None:
    version, site = pin_triton
    assert version == "3.6.0"  # vLLM 0.24.0 -> torch 2.11.0 -> triton 3.6.0
    path = os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "PYTHONPATH": path}
    found = subprocess.run(
        [sys.executable, "-c", "import triton; print(triton.__version__, triton.__file__)"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert found == [version, str(site / "triton" / "__init__.py")]
    report = tmp_path / "junit.xml"
    command = [sys.executable, "-m", "pytest", *RERUN, "-q", "-n", "0", "-p", "no:cacheprovider"]
    collected = subprocess.run(
        [*command, "--collect-only", f"--basetemp={tmp_path / 'collect'}"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    expected = sorted(
        (module.removesuffix(".py").replace("/", "."), name)
        for module, _, name in (line.partition("::") for line in collected if "::" in line)
    )
    child = subprocess.run(
        [*command, f"--basetemp={tmp_path / 'child'}", f"--junitxml={report}"],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert child.returncode == 0, child.stdout[-3000:]
    cases = ET.parse(report).getroot().iter("testcase")
    # Every test of the two files ran with that Triton and passed: no failure, error or skip.
    outcomes = sorted((c.get("classname"), c.get("name"), [e.tag for e in c]) for c in cases)
    assert outcomes == [(module, name, []) for module, name in expected]
    assert len(expected) >= len(RERUN)
