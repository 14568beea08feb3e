"""`overlay pack` and the deploy without a checkout: the wheel it builds (exact contents, the
same bytes twice), installed into a fresh virtual environment beside a real vllm 0.24.0 (the
PyPI wheel's files), one for each Python from 3.10 to 3.14 (vLLM 0.24.0's) the machine has,
and `vllm-patchset overlay status|apply|verify|diff|revert` run there as in a serving image:
from a directory outside any checkout, with no git on PATH, the default target being that
environment's vllm; then vllm reinstalled by pip under the applied overlay."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from support import REPO, machine_pip_env, populating
from vllm_install import (
    ADDED,
    CHANGED,
    LOCK,
    OVERLAID,
    PATCHES,
    Overlay,
    Pristine,
    by_patch_of,
    record_mismatches,
)
from vllm_patchset.cli import main
from vllm_patchset.registry import TOOL_PYTHON

TOOL_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
# The wheel's core dependency (what the deploy commands and the guard need), at the version
# this environment runs: the fresh environment gets it from a wheel downloaded once into the
# test cache. No extra: no rich, no GitPython, no tomlkit there.
DEPENDENCIES = ("packaging",)
SERIES = ", ".join(PATCHES)


def lock_bytes(overlay: Overlay) -> bytes:
    return overlay.project.lock_path.read_bytes()


def wheel_version(overlay: Overlay) -> str:
    return f"{TOOL_VERSION}+vllm0.24.0.{hashlib.sha256(lock_bytes(overlay)).hexdigest()[:8]}"


def pack(overlay: Overlay, out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    argv = ["--project", str(overlay.project.root), "overlay", "pack", "--out", str(out)]
    assert main([*argv, *extra]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


def test_pack_writes_the_tool_and_the_overlay_into_one_wheel(
    overlay: Overlay, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    version = wheel_version(overlay)
    wheel = tmp_path / "a" / f"vllm_patchset-{version}-py3-none-any.whl"
    assert pack(overlay, tmp_path / "a", capsys) == (
        f"wrote {wheel}: vllm-patchset with the overlay for vllm 0.24.0 ({SERIES}; {len(OVERLAID)} file(s))\n"
        f"in the serving image: `pip install {wheel.name} && vllm-patchset overlay apply`\n"
    )
    info = f"vllm_patchset-{version}.dist-info"
    package = REPO / "scripts" / "vllm_patchset"
    code = sorted(package.rglob("*.py"))
    with zipfile.ZipFile(wheel) as archive:
        assert archive.namelist() == [
            *(f"vllm_patchset/{p.relative_to(package).as_posix()}" for p in code),
            "vllm_patchset/_overlay/overlay.lock.json",
            *(f"vllm_patchset/_overlay/{rel}" for rel in OVERLAID),
            f"{info}/METADATA",
            f"{info}/WHEEL",
            f"{info}/entry_points.txt",
            f"{info}/RECORD",
        ]
        for path in code:
            name = path.relative_to(package).as_posix()
            assert archive.read(f"vllm_patchset/{name}") == path.read_bytes()
        assert archive.read("vllm_patchset/_overlay/overlay.lock.json") == lock_bytes(overlay)
        for rel in OVERLAID:
            assert archive.read(f"vllm_patchset/_overlay/{rel}") == overlay.patched(rel)
        metadata = archive.read(f"{info}/METADATA").decode()
        assert metadata.splitlines()[:6] == [
            "Metadata-Version: 2.1",
            "Name: vllm-patchset",
            f"Version: {version}",
            "Summary: Bug fixes carried on top of a pinned vLLM release: patch series,"
            " hash-locked overlay, scripted rebase, GPU validation",
            "License: Apache-2.0",
            "Requires-Python: >=3.10",
        ]
        assert [line for line in metadata.splitlines() if line.startswith("Requires-Dist")][:5] == [
            "Requires-Dist: packaging>=23",
            'Requires-Dist: gitpython>=3.1.40; extra == "maintain"',
            'Requires-Dist: tomlkit>=0.12; extra == "maintain"',
            'Requires-Dist: ruamel.yaml>=0.18; extra == "maintain"',
            'Requires-Dist: rich>=13; extra == "maintain"',
        ]
        assert archive.read(f"{info}/entry_points.txt").decode() == (
            "[console_scripts]\nvllm-patchset = vllm_patchset.cli:run\n\n"
            "[vllm.general_plugins]\nvllm_patchset_guard = vllm_patchset.deploy.guard:register\n\n"
        )
        rows = list(csv.reader(io.StringIO(archive.read(f"{info}/RECORD").decode())))
        assert [row[0] for row in rows] == archive.namelist()
        for name, digest, size in rows[:-1]:
            data = archive.read(name)
            b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, size) == (f"sha256={b64}", str(len(data))), name
        assert rows[-1] == [f"{info}/RECORD", "", ""]

    # The same code and overlay: the same bytes (what an image build caches on).
    doc = json.loads(pack(overlay, tmp_path / "b", capsys, "--json"))
    again = tmp_path / "b" / wheel.name
    assert again.read_bytes() == wheel.read_bytes()
    assert doc == {
        "ok": True,
        "command": "overlay pack",
        "exit_code": 0,
        "wheel": str(again),
        "version": version,
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "vllm": "0.24.0",
        "patches": list(PATCHES),
    }


def test_the_line_to_paste_is_never_broken(
    overlay: Overlay,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In 80 columns the report is fitted, the command to paste kept whole on its line (it
    was broken after `&&`)."""
    monkeypatch.setenv("COLUMNS", "80")
    wheel = f"vllm_patchset-{wheel_version(overlay)}-py3-none-any.whl"
    lines = pack(overlay, tmp_path, capsys).splitlines()
    assert lines[-2:] == [
        "in the serving image:",
        f"  `pip install {wheel} && vllm-patchset overlay apply`",
    ]


def test_pack_refuses_an_overlay_that_is_not_the_lock_s(
    overlay: Overlay, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "project"
    shutil.copytree(overlay.project.root, root)
    edited = root / "overlay" / OVERLAID[0]
    edited.write_bytes(edited.read_bytes() + b"# edited\n")
    argv = ["--project", str(root), "overlay", "pack", "--out", str(tmp_path / "dist")]
    assert main(argv) == 1
    assert capsys.readouterr() == (
        "",
        f"vllm-patchset: {edited} does not match the lock's patched sha256: rebuild it with"
        " `vllm-patchset overlay build`\n",
    )
    assert not (tmp_path / "dist").exists()


# -- the wheel in a serving environment ----------------------------------------------------------
def dependency_wheels(cache_dir: Path) -> list[Path]:
    """The dependencies' wheels, downloaded once per cache (pip, from the package index)."""
    with populating(cache_dir):
        return _dependency_wheels(cache_dir / "wheels" / "tool-deps")


def _dependency_wheels(folder: Path) -> list[Path]:
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in DEPENDENCIES]
    marker = folder / "pins.txt"
    if not marker.is_file() or marker.read_text() != "\n".join(pins):
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--dest", str(folder), *pins],
            check=True,
            capture_output=True,
            env={**machine_pip_env(), "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )  # fmt: skip
        marker.write_text("\n".join(pins))
    return sorted(folder.glob("*.whl"))


def pip(python: Path, *args: str) -> None:
    """This interpreter's pip acting on the fresh environment (`pip --python`)."""
    env = {**os.environ, "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *args],
        check=True,
        capture_output=True,
        env={**env, "PIP_NO_CACHE_DIR": "1"},
    )


def interpreter(minor: int) -> str | None:
    """A Python 3.<minor> of this machine: the running one, one on PATH, or pyenv's."""
    if sys.version_info[:2] == (3, minor):
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = [
        shutil.which(f"python3.{minor}"),
        *sorted(pyenv.glob(f"3.{minor}.*/bin/python3.{minor}")),
    ]
    for candidate in filter(None, found):
        ran = subprocess.run([str(candidate), "-c", "pass"], capture_output=True)
        if ran.returncode == 0:
            return str(candidate)
    return None


# A serving image's Python: any that vLLM 0.24.0 supports (its Requires-Python: >=3.10,<3.15),
# each where this machine has it. The deploy commands run from 3.10; the tool needs 3.11.
SERVING_PYTHONS = [
    pytest.param(found, id=f"py3.{minor}")
    if (found := interpreter(minor))
    else pytest.param(None, id=f"py3.{minor}", marks=pytest.mark.skip(f"no Python 3.{minor} here"))
    for minor in range(10, 15)
]


def header(command: str, outcome: str, site: Path) -> str:
    return f"overlay {command}: {outcome} ({site}/vllm, 0.24.0; overlay for 0.24.0: {SERIES})"


@pytest.mark.parametrize("serving_python", SERVING_PYTHONS)
def test_the_packed_wheel_deploys_without_the_checkout(
    serving_python: str,
    overlay: Overlay,
    pristine: Pristine,
    cache_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pack(overlay, tmp_path / "dist", capsys)
    wheel = next((tmp_path / "dist").glob("*.whl"))
    env_root = tmp_path / "serving"
    subprocess.run([serving_python, "-m", "venv", "--without-pip", str(env_root)], check=True)
    python = env_root / "bin" / "python"
    this = subprocess.run(
        [str(python), "-c", "import platform; print(platform.python_version())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    too_old = tuple(map(int, this.split("."))) < TOOL_PYTHON  # the tool's commands refuse it
    pip(
        python,
        "install",
        "--no-index",
        "--no-deps",
        str(wheel),
        *map(str, dependency_wheels(cache_dir)),
    )
    site = next(env_root.glob("lib/python*/site-packages")).resolve()
    none_of_the_extras = subprocess.run(
        [str(python), "-c", "import importlib.util as u;"
         " print([m for m in ('git', 'rich', 'tomlkit', 'ruamel') if u.find_spec(m)])"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert none_of_the_extras == "[]\n"
    # vllm 0.24.0 as pip installs it: the PyPI wheel's files, hard links to the cached install.
    for name in ("vllm", "vllm-0.24.0.dist-info"):
        shutil.copytree(pristine.root / name, site / name, copy_function=os.link)
    elsewhere = tmp_path / "elsewhere"  # no checkout at or above it
    elsewhere.mkdir()
    # As in an image: no git (GitPython will not even import without it), no checkout.
    env = {"PATH": str(env_root / "bin"), "HOME": str(tmp_path / "home"), "LC_ALL": "C.UTF-8"}
    env["COLUMNS"] = os.environ["COLUMNS"]  # the exact texts are a wide terminal's (conftest)

    def tool(*args: str) -> tuple[int, str, str]:
        done = subprocess.run(
            [str(env_root / "bin" / "vllm-patchset"), *args],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return done.returncode, done.stdout, done.stderr

    def report(command: str, outcome: str, word: str | dict[str, str], *notes: str) -> str:
        words = word if isinstance(word, dict) else dict.fromkeys(OVERLAID, word)
        files = [f"  {words[rel]:10} {rel}" for rel in OVERLAID]
        if command == "status":  # the per-patch view beside the files
            files += by_patch_of(words)
        return "\n".join([header(command, outcome, site), *files, *notes]) + "\n"

    assert tool("--version") == (
        0,
        f"vllm-patchset {wheel_version(overlay)} (overlay for vllm 0.24.0: {SERIES})\n",
        "",
    )
    code, out, _ = tool("--version", "--json")
    assert (code, json.loads(out)["overlay"]) == (
        0,
        {"package": "vllm", "version": "0.24.0", "patches": list(PATCHES)},
    )
    assert tool("overlay", "status") == (0, report("status", "not applied", "pristine"), "")
    assert tool("overlay", "apply") == (0, report("apply", "applied", "patch"), "")
    for rel in OVERLAID:
        assert (site / rel).read_bytes() == overlay.patched(rel)
    assert tool("overlay", "verify") == (0, report("verify", "verified", "patched"), "")
    assert tool("overlay", "status") == (0, report("status", "applied", "patched"), "")
    assert tool("overlay", "diff") == (
        0,
        f"overlay diff: no difference ({site}/vllm, 0.24.0; overlay for 0.24.0: {SERIES})\n"
        "  shows: installed -> overlay (what `overlay apply` would change)\n"
        "  note: the overlay is applied: `vllm-patchset overlay diff --pristine` shows what it"
        " changes in vllm 0.24.0\n",
        "",
    )
    plugins = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; from vllm_patchset.deploy import guard;"
         " print([e.value for e in m.entry_points(group='vllm.general_plugins', name='vllm_patchset_guard')]);"
         f" print(guard.check(__import__('pathlib').Path({str(site)!r})).message)"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert plugins == (
        "['vllm_patchset.deploy.guard:register']\n"
        f"vllm-patchset: overlay active on vllm 0.24.0: {SERIES} ({len(OVERLAID)} files)\n"
    )

    if too_old:  # the tool's other commands say in one line which Python they need
        for command, args in (("overlay build", ()), ("rebase", ("--onto", "0.25.0")),
                              ("overlay pack", ())):  # fmt: skip
            assert tool(*command.split(), *args) == (
                2,
                "",
                f"vllm-patchset: {command} needs Python 3.11 or newer (this is {this}); from"
                " Python 3.10: `vllm-patchset overlay status|apply|verify|diff|revert`\n",
            )
    else:
        # A checkout's command says in one line which extra it needs, before anything else.
        assert tool("overlay", "build") == (
            2,
            "",
            "vllm-patchset: overlay build needs the 'maintain' extra (missing: gitpython):"
            " `pip install 'vllm-patchset[maintain]'`\n",
        )
        assert tool("rebase", "--onto", "0.25.0") == (
            2,
            "",
            "vllm-patchset: rebase needs the 'maintain' extra (missing: gitpython, tomlkit,"
            " ruamel.yaml): `pip install 'vllm-patchset[maintain]'`\n",
        )
        # One that needs only the checkout (no extra) says so, naming --project.
        assert tool("overlay", "pack") == (
            2,
            "",
            f"vllm-patchset: not in a vllm-patchset checkout (no pyproject.toml with"
            f" [tool.vllm-patchset] at or above {elsewhere}): run it in one, or pass --project"
            " DIR\n",
        )

    # pip reinstalls vllm under the applied overlay: status says so, apply puts it back.
    pip(
        python,
        "install",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--force-reinstall",
        str(pristine.wheel),
    )
    assert record_mismatches(site, pristine.record) == []
    gone = (
        f"  note: the overlay applied to vllm 0.24.0 ({SERIES}) is gone from the files (vllm was"
        " reinstalled over it): `vllm-patchset overlay apply` applies this lock's overlay again,"
        " `vllm-patchset overlay revert` removes the stale record"
    )
    # (a reinstall leaves the files the overlay added: patched still)
    reinstalled = {rel: "patched" if rel in ADDED else "pristine" for rel in OVERLAID}
    assert tool("overlay", "status") == (1, report("status", "gone", reinstalled, gone), "")
    code, out, err = tool("overlay", "diff")
    assert (code, err) == (0, "")
    assert [line for line in out.splitlines() if line.startswith("+++ ")] == [
        f"+++ b/{rel}" for rel in CHANGED
    ]
    code, out, err = tool("overlay", "apply")
    assert (code, out.splitlines()[0], err) == (0, header("apply", "applied", site), "")
    assert tool("overlay", "verify")[0] == 0
    assert tool("overlay", "revert") == (0, report("revert", "reverted", "restore"), "")
    assert record_mismatches(site, pristine.record) == []
    assert not (site / ".vllm-patchset").exists()
    assert overlay.lock == LOCK
