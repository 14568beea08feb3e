"""overlay/upstream.py: upstream sources agree by content (a PyPI sdist, a git clone and an
installed wheel), a modified install is refused, and which git sources are remote."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_install import CHANGED, FIRST, Overlay, Pristine, replace_file, run_cli
from vllm_patchset.cli import main
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.upstream import Mirror, is_remote_url

FUSED_MOE = "vllm/model_executor/layers/fused_moe"


def tree_id(mirror: Mirror, commit: str, path: str) -> str:
    return mirror.repo.run("rev-parse", f"{commit}:{path}").strip()


def test_sdist_and_git_clone_give_the_same_tree(mirror: Mirror, nightly_repo: Path) -> None:
    """The nightly-like repository's tag v0.21.0 holds the files of the 0.21.0 sdist."""
    release = mirror.release("0.21.0")
    from_git = mirror.git_ref(str(nightly_repo), "v0.21.0")
    assert (from_git.label, from_git.version, from_git.tag) == (
        "git:v0.21.0",
        "0.21.0",
        "git/v0.21.0",
    )
    assert mirror.repo.tree_of(from_git.commit) == mirror.repo.tree_of(release.commit)
    # A second fetch of the release needs no network: it is the same mirror commit.
    assert (
        Mirror(mirror.cache_dir, index_url="http://127.0.0.1:9/simple").release("0.21.0") == release
    )


def test_installed_wheel_agrees_with_sdist(
    mirror: Mirror, full_pristine: Pristine, project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--project", str(project.root), "fetch", "--target", str(full_pristine.root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("0.24.0: installed/0.24.0 ")
    installed = mirror.get("installed/0.24.0")
    assert installed is not None
    release = mirror.release("0.24.0")
    # The wheel's files are byte-identical to the sdist's for these paths (checked here).
    assert tree_id(mirror, installed.commit, FUSED_MOE) == tree_id(
        mirror, release.commit, FUSED_MOE
    )
    assert not [p for p in mirror.repo.list_files(installed.commit) if p.endswith((".so", ".pyc"))]


def test_modified_install_is_refused(
    target: Path, tiny: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    path = target / FIRST
    replace_file(path, path.read_bytes() + b"# local edit\n")
    mirror = Mirror(tiny.cache_dir)
    before = mirror.repo.tags("*")
    assert main(["--project", str(tiny.root), "fetch", "--target", str(target)]) == 2
    assert capsys.readouterr().err == (
        f"vllm-patchset: {path} does not match its RECORD hash: the installed vllm 0.24.0 was modified\n"
    )
    assert mirror.repo.tags("*") == before


def test_target_without_vllm(
    tmp_path: Path, tiny: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--project", str(tiny.root), "fetch", "--target", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"vllm-patchset: {tmp_path} holds no vllm package (vllm/__init__.py is missing)\n"
    )


def test_an_install_with_the_overlay_applied_gives_its_pristine_tree(
    target: Path,
    overlay: Overlay,
    project: Project,
    mirror: Mirror,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`fetch --target` (and `--python`) on an install with this tool's overlay applied: the
    overlaid files are taken from the originals `overlay apply` kept (each checked against
    the RECORD), so the mirror gets the pristine vllm; it said "was modified" before."""
    assert run_cli(overlay, "apply", "--target", str(target)).returncode == 0
    assert main(["--project", str(project.root), "fetch", "--target", str(target)]) == 0
    out = capsys.readouterr().out
    installed = mirror.get("installed/0.24.0")
    assert installed is not None
    assert out == (
        f"0.24.0: installed/0.24.0 {installed.commit[:12]} (installed:{target})\n"
        "note: the overlay applied there was set aside: its files were taken from the originals"
        " `overlay apply` kept, so the mirror holds the pristine 0.24.0\n"
    )
    release = mirror.release("0.24.0")  # the overlaid files are the sdist's (the target is slim)
    for rel in CHANGED:
        assert tree_id(mirror, installed.commit, rel) == tree_id(mirror, release.commit, rel)
    # An original that is not there any more: the one line says how to proceed.
    original = target / ".vllm-patchset" / "originals" / CHANGED[0]
    original.unlink()
    assert main(["--project", str(project.root), "fetch", "--target", str(target)]) == 2
    assert capsys.readouterr().err == (
        f"vllm-patchset: {target / CHANGED[0]} does not match its RECORD hash: the installed vllm"
        " 0.24.0 was modified (an overlay is applied there and keeps no original of this file:"
        f" `vllm-patchset overlay revert --target {target}` first)\n"
    )


@pytest.mark.parametrize(
    ("source", "remote"),
    [
        ("https://github.com/vllm-project/vllm", True),
        ("git@github.com:vllm-project/vllm.git", True),
        ("ssh://git@example.com/vllm.git", True),
        ("git://example.com/vllm", True),
        ("file:///srv/vllm", False),  # this machine's
        ("/home/me/vllm", False),
        ("../vllm", False),
        ("host:path", False),
    ],
)
def test_remote_git_sources(source: str, remote: bool) -> None:
    assert is_remote_url(source) == remote
