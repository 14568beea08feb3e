"""`sync/swap.py`: the torch a release requires, read from its sdist within a bound, and the
stage context that stages each patch's file."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from support import project_at
from vllm_patchset.infra.gitrepo import Repo
from vllm_patchset.overlay.upstream import Mirror, Upstream
from vllm_patchset.sync import swap
from vllm_patchset.sync.rebase_state import Phase, RebaseState

# The torch a release requires, read from its sdist's requirements/cuda.txt (name -> bytes of the
# sdist's members before it, that member -> the torch read): within the bound, over it (refused,
# never read whole: no torch said), and none there.
CUDA_TXT = "vllm-9.9/requirements/cuda.txt"
TORCH_OF_SDIST = [
    ({"vllm-9.9/PKG-INFO": b"x", CUDA_TXT: b"torch==2.14.0\n"}, "2.14.0"),
    ({CUDA_TXT: b"torch==2.14.0\n" + b"#" * (swap.REQUIREMENTS_BOUND + 1)}, None),
    ({"vllm-9.9/PKG-INFO": b"x"}, None),
]


@pytest.mark.parametrize(("members", "torch"), TORCH_OF_SDIST)
def test_torch_of_the_sdist(tmp_path: Path, members: dict[str, bytes], torch: str | None) -> None:
    mirror = Mirror(tmp_path / "cache")
    mirror.sdists.mkdir()
    with tarfile.open(mirror.sdists / "vllm-9.9.tar.gz", "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    onto = Upstream("9.9", "9.9", "v9.9", "abc", "pypi:vllm-9.9.tar.gz sha256:0")
    assert swap._torch(mirror, onto) == torch


def test_what_a_rebase_may_replace_in_the_order_the_swap_takes() -> None:
    assert swap.rewritten_paths(project_at(Path("/checkout"))) == [
        "patches",
        "pyproject.toml",
        "overlay/overlay.lock.json",
        "CHANGELOG.md",
        "README.md",
        ".github/workflows/gpu-validation.yml",
        ".buildkite/gpu-validation.yml",
        "overlay/vllm",
    ]


def test_the_stage_context_places_a_checkout_path_under_the_stage(tmp_path: Path) -> None:
    project = project_at(tmp_path / "checkout")
    onto = Upstream("1.1", "1.1", "v1.1", "abc", "pypi:vllm-1.1.tar.gz")
    state = RebaseState(Phase.RUNNING, "1.0", onto, None, None, "123")
    lists = swap._Lists(active=[], unarchived=[], archived=[], parked={})
    staging = swap.Staging(project, Repo(tmp_path / "worktree"), state, tmp_path / "stage", lists)
    assert staging.staged(project.parked_file.parent / "0001-x.patch") == (
        tmp_path / "stage" / "patches" / "parked" / "0001-x.patch"
    )


# The checkout before a swap: (path -> its bytes; None: not there), and the staged paths.
SWAPS = [
    ({"a.txt": b"old", "b/c.txt": b"c"}, {"a.txt": b"new", "b/c.txt": b"C"}),
    ({"a.txt": None}, {"a.txt": b"created"}),  # the swap creates it: a marker, removed again
    ({"a.txt": b"old", "d.txt": b"kept"}, {"a.txt": b"new"}),
]


@pytest.mark.parametrize(("before", "staged"), SWAPS)
def test_swap_in_and_roll_back(
    tmp_path: Path, before: dict[str, bytes | None], staged: dict[str, bytes]
) -> None:
    """The swap moves each staged path in (twice is once), the roll-back puts the checkout
    back byte for byte, and `changed_files` names each file the swap changes."""
    root, folder = tmp_path / "root", tmp_path / "rebase"
    for rel, data in before.items():
        if data is not None:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
    for rel, data in staged.items():
        (folder / swap.STAGE / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / swap.STAGE / rel).write_bytes(data)
    moves = sorted({rel.split("/")[0] for rel in staged})
    changed = swap.changed_files(root, folder / swap.STAGE, moves, skip="overlay")
    assert changed == tuple(
        ("A " if before.get(rel) is None else "M ") + rel for rel in sorted(staged)
    )
    swap.swap_in(folder, root, moves)
    swap.swap_in(folder, root, moves)  # again, as after a kill: nothing more
    assert {rel: (root / rel).read_bytes() for rel in staged} == staged
    assert swap.has_backup(folder)
    swap.roll_back(folder, root, moves)
    after = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert after == {rel: data for rel, data in before.items() if data is not None}
