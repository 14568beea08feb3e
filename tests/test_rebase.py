"""`vllm-patchset rebase`: real vLLM releases, real git, a copy of the project in tmp.

The series: fix 1 (archived: upstream since 0.21.0), fix 2 (triton_moe, upstream in 0.25.0) and
the fused NVFP4 emulation kernel (0002, local, written for 0.24.0 on top of fix 2).

The chain: the nightly-like base (v0.21.0 with #41630's line reverted) -> 0.24.0 (fix 1 is
upstream since 0.21.0; fix 2 and the NVFP4 kernel join through the queue edit loop) -> 0.25.0
(fix 2 upstream; the kernel absent, since 0.25.0 rewrote nvfp4_emulation_moe.py: kept or
dropped by the absent rule) -> 0.33.0. Then synthetic releases in a local git repo (a changed
patched line: conflict; a line added above the hunks: context-only churn), an absent patch on
0.23.0 with the kernel that builds on it in conflict, a dirty checkout, and killed runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO, git, make_upstream_repo
from vllm_patchset.cli import main
from vllm_patchset.config import Project
from vllm_patchset.lock import Lock
from vllm_patchset.overlay import build_overlay
from vllm_patchset.upstream import Mirror

FIX1 = "0001-nvfp4-oracle-take-the-E2M1-table-s-device-from-w13.patch"
FIX2 = "0001-triton_moe-no-tensor-truthiness-when-quantizing-defe.patch"
NVFP4 = "0002-nvfp4_emulation_moe-fused-NVFP4-GEMMs-over-the-route.patch"
TRITON = "vllm/model_executor/layers/fused_moe/experts/triton_moe.py"
NVFP4_FILE = "vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py"
BUGGY = "                self.a1_scale or self.a1_gscale,\n"
CHANGED = "                self.a1_gscale if self.a1_scale is None else self.a1_scale,\n"
EPOCH = "1782518400"  # SOURCE_DATE_EPOCH: 2026-06-27
DATE = "2026-06-27"
PR_41630 = "[#41630](https://github.com/vllm-project/vllm/pull/41630)"
PR_46735 = "[#46735](https://github.com/vllm-project/vllm/pull/46735)"
HEADER = (
    "# Changelog\n\n"
    "All notable changes to this patch set are documented in this file.\n"
    "The format is based on [Keep a Changelog](https://keepachangelog.com/en/1.1.0/).\n\n"
    "## [Unreleased]\n\n"
)
ENTRY_0_24_0 = f"""## [vllm-0.24.0] - {DATE}

Rebased onto vLLM 0.24.0 (from git:nightly) by `vllm-patchset rebase`.

### Changed

- Pin: vLLM git:nightly -> 0.24.0.
- Still carried: none.

### Removed

- Dropped as upstream: `{FIX1}`, merged in vLLM 0.21.0 by {PR_41630}; archived in `patches/upstreamed/`.
"""
ABSENT_RULE = {
    "--keep": "absent patches stay in the series unchanged (the overlay skips a patch that is"
    " absent); rerun with --drop to remove them",
    "--drop": "absent patches leave the series (--drop); git history keeps them",
}
KEPT_OR_DROPPED = {"--keep": "kept", "--drop": "dropped"}
ENTRY_0_25_0 = {
    "--keep": f"""## [vllm-0.25.0] - {DATE}

Rebased onto vLLM 0.25.0 (from 0.24.0) by `vllm-patchset rebase`.

### Changed

- Pin: vLLM 0.24.0 -> 0.25.0.
- Still carried: `{NVFP4}` (absent on 0.25.0, kept).

### Removed

- Dropped as upstream: `{FIX2}`, merged in vLLM 0.25.0 by {PR_46735}; archived in `patches/upstreamed/`.
""",
    "--drop": f"""## [vllm-0.25.0] - {DATE}

Rebased onto vLLM 0.25.0 (from 0.24.0) by `vllm-patchset rebase`.

### Changed

- Pin: vLLM 0.24.0 -> 0.25.0.
- Still carried: none.

### Removed

- Dropped as upstream: `{FIX2}`, merged in vLLM 0.25.0 by {PR_46735}; archived in `patches/upstreamed/`.
- Dropped `{NVFP4}`: absent from vLLM 0.25.0 (--drop).
""",
}
ENTRY_0_33_0 = {  # the NVFP4 kernel kept on 0.25.0, or not
    kept: f"""## [vllm-0.33.0] - {DATE}

Rebased onto vLLM 0.33.0 (from 0.25.0) by `vllm-patchset rebase`.

### Changed

- Pin: vLLM 0.25.0 -> 0.33.0.
- Still carried: {carried}.
"""
    for kept, carried in ((True, f"`{NVFP4}` (absent on 0.33.0, kept)"), (False, "none"))
}


# -- helpers -------------------------------------------------------------------------------------
def cli(capsys: pytest.CaptureFixture[str], root: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--project", str(root), *args])
    out, err = capsys.readouterr()
    return code, out, err


def rebase_json(capsys: pytest.CaptureFixture[str], root: Path, *args: str) -> dict[str, object]:
    code, out, err = cli(capsys, root, "rebase", *args, "--json")
    assert code == 0, err
    doc: dict[str, object] = json.loads(out)
    return doc


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of the checkout (git's own and the rebase's state dirs aside)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] not in (".git", ".rebase")
    }


def commit_all(root: Path, message: str) -> None:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)


def worktrees(mirror: Mirror) -> str:
    return mirror.repo.run("worktree", "list", "--porcelain")


def set_pin_lines(root: Path, lines: str) -> None:
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    assert text.count('pin = "0.24.0"\n') == 1
    pyproject.write_text(text.replace('pin = "0.24.0"\n', lines))


@pytest.fixture(autouse=True)
def _fixed_date(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)


@pytest.fixture
def pinned(project: Project) -> Project:
    """The project as it is (pin 0.24.0), with its .gitignore and no CHANGELOG yet."""
    shutil.copy2(REPO / ".gitignore", project.root / ".gitignore")
    (project.root / "CHANGELOG.md").unlink(missing_ok=True)
    commit_all(project.root, "gitignore, no changelog")
    return project


@pytest.fixture(scope="session")
def synthetic_repo(mirror: Mirror, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vLLM 0.24.0 in a local git repo, plus two made-up releases: v0.24.1 changes the line
    fix 2 patches; v0.24.2 adds a comment line at the top of the file (the hunks move)."""
    path = make_upstream_repo(mirror, "0.24.0", tmp_path_factory.mktemp("synthetic") / "vllm")
    target = path / TRITON
    pristine = target.read_text()
    assert pristine.count(BUGGY) == 1
    target.write_text(pristine.replace(BUGGY, CHANGED))
    git(path, "commit", "-q", "-am", "a1 scale: no truthiness (another way)")
    git(path, "tag", "v0.24.1")
    git(path, "checkout", "-q", "-b", "churn", "v0.24.0")
    target.write_text("# One more line above every hunk.\n" + pristine)
    git(path, "commit", "-q", "-am", "a comment")
    git(path, "tag", "v0.24.2")
    return path


def blob_id(data: bytes) -> str:
    return (
        subprocess.run(
            ["git", "hash-object", "--stdin"], input=data, capture_output=True, check=True
        )
        .stdout.decode()
        .strip()
    )


# -- the chain of real releases ------------------------------------------------------------------
@pytest.mark.parametrize("rule", ["--keep", "--drop"])
def test_chain_nightly_to_0_24_0_to_0_25_0_to_0_33_0(
    pinned: Project,
    nightly_repo: Path,
    mirror: Mirror,
    capsys: pytest.CaptureFixture[str],
    rule: str,
) -> None:
    root = pinned.root
    real_fix1 = (REPO / "patches/upstreamed" / FIX1).read_bytes()
    real_fix2 = (REPO / "patches" / FIX2).read_bytes()
    real_nvfp4 = (REPO / "patches" / NVFP4).read_bytes()
    real_pyproject = (root / "pyproject.toml").read_bytes()
    # On the nightly pin, fix 1 is carried and pending (Applied-upstream empty); no fix 2, no
    # NVFP4 kernel (both written for 0.24.0).
    assert real_fix1.count(b"\nApplied-upstream: 0.21.0\n") == 1
    pending_fix1 = real_fix1.replace(b"\nApplied-upstream: 0.21.0\n", b"\nApplied-upstream:\n")
    patches = root / "patches"
    (patches / FIX2).unlink()
    (patches / NVFP4).unlink()
    (patches / "upstreamed" / FIX1).unlink()
    (patches / FIX1).write_bytes(pending_fix1)
    (patches / "series").write_text(f"{FIX1}\n")
    (patches / "upstreamed" / "series").write_text("")
    set_pin_lines(root, f'pin = "git:nightly"\npin-git = "{nightly_repo}"\npin-ref = "nightly"\n')
    build_overlay(Project.load(root, pinned.cache_dir), update_lock=True)
    assert Lock.load(pinned.lock_path).patches == (FIX1,)
    commit_all(root, "nightly pin")

    # 1. nightly -> 0.24.0: fix 1 is upstream (first release with it: 0.21.0), archived.
    doc = rebase_json(capsys, root, "--onto", "0.24.0")
    assert doc["versions"] == {"0.24.0": {FIX1: "upstream"}}
    assert doc["status"] == "done"
    assert doc["pin"] == "0.24.0"
    fix1 = doc["patches"][FIX1]  # type: ignore[index]
    assert (fix1["action"], fix1["applied_upstream"], fix1["three_way"]) == (
        "archived",
        "0.21.0",
        "no change",
    )
    assert doc["changelog"] == ENTRY_0_24_0
    assert (patches / "upstreamed" / FIX1).read_bytes() == real_fix1
    assert not (patches / FIX1).exists()
    assert (patches / "series").read_text() == ""
    assert (patches / "upstreamed" / "series").read_text() == f"{FIX1}\n"
    assert (root / "pyproject.toml").read_bytes() == real_pyproject
    assert (root / "CHANGELOG.md").read_text() == HEADER + ENTRY_0_24_0
    assert Lock.load(pinned.lock_path).patches == ()
    commit_all(root, "rebase onto 0.24.0")

    # The edit loop: fix 2, then the NVFP4 kernel on top of it, join as commits in the queue,
    # exported to patches/: the project as it is.
    assert cli(capsys, root, "queue", "import")[0] == 0
    git(root / ".queue", "am", "-q", str(REPO / "patches" / FIX2), str(REPO / "patches" / NVFP4))
    assert cli(capsys, root, "queue", "export", "--drop")[0] == 0
    assert cli(capsys, root, "overlay", "build", "--update-lock")[0] == 0
    assert (patches / FIX2).read_bytes() == real_fix2
    assert (patches / NVFP4).read_bytes() == real_nvfp4
    assert (patches / "series").read_text() == f"{FIX2}\n{NVFP4}\n"
    assert snapshot(patches) == snapshot(REPO / "patches")
    assert pinned.lock_path.read_bytes() == (REPO / "overlay/overlay.lock.json").read_bytes()
    assert Lock.load(pinned.lock_path).patches == (FIX2, NVFP4)
    commit_all(root, "fix 2, NVFP4 kernel")
    assert cli(capsys, root, "check") == (0, "check: 3 patches, 0 problem(s)\n", "")

    # 2. 0.24.0 -> 0.25.0: fix 2 is upstream (trailer 0.25.0 kept), archived byte-identical;
    # 0.25.0 rewrote the NVFP4 emulation, so the kernel is absent: the rule keeps or drops it.
    doc = rebase_json(capsys, root, "--onto", "0.25.0", rule)
    assert doc["versions"] == {
        "0.25.0": {f"upstreamed/{FIX1}": "upstream", FIX2: "upstream", NVFP4: "absent"}
    }
    assert doc["absent_rule"] == ABSENT_RULE[rule]
    fix2 = doc["patches"][FIX2]  # type: ignore[index]
    assert (fix2["action"], fix2["applied_upstream"], fix2["text_state"]) == (
        "archived",
        "0.25.0",
        "upstream",
    )
    assert fix2["notes"] == [
        "hunk 1 (vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py):"
        " code present, surrounding text differs",
        "hunk 3 (vllm/model_executor/layers/fused_moe/experts/triton_moe.py):"
        " code matches upstream, comment lines differ",
        "3-way merge: conflict (the release's code differs from the patch's)",
        "Applied-upstream: 0.25.0 (trailer kept)",
    ]
    nvfp4 = doc["patches"][NVFP4]  # type: ignore[index]
    assert nvfp4 == {
        "file": NVFP4,
        "state": "absent",
        "text_state": "absent",
        "trailer_state": "applies",
        "three_way": "conflict",
        "action": KEPT_OR_DROPPED[rule],
        "notes": ["text says absent, trailers say applies"],
        "range_diff": None,
        "diff_of_diffs": None,
        "applied_upstream": None,
        "upstream_pr": "none (local)",
    }
    assert doc["changelog"] == ENTRY_0_25_0[rule]
    assert (patches / "upstreamed" / FIX2).read_bytes() == real_fix2
    assert (patches / "upstreamed" / FIX1).read_bytes() == real_fix1
    assert (patches / "upstreamed" / "series").read_text() == f"{FIX1}\n{FIX2}\n"
    kept = rule == "--keep"
    assert (patches / "series").read_text() == (f"{NVFP4}\n" if kept else "")
    assert sorted(p.relative_to(patches).as_posix() for p in patches.rglob("*.patch")) == [
        *([NVFP4] if kept else []),
        f"upstreamed/{FIX1}",
        f"upstreamed/{FIX2}",
    ]
    if kept:
        assert (patches / NVFP4).read_bytes() == real_nvfp4  # unchanged: the overlay skips it
    assert (root / "CHANGELOG.md").read_text() == (
        HEADER + ENTRY_0_25_0[rule] + "\n" + ENTRY_0_24_0
    )
    lock = Lock.load(pinned.lock_path)
    assert (lock.version, lock.patches, lock.entries) == ("0.25.0", (), ())
    commit_all(root, "rebase onto 0.25.0")
    # check (the CI lint) wants every patch of the series to apply to the pin: it names a kept
    # absent patch, the one thing the maintainer is left to decide.
    assert cli(capsys, root, "check") == (
        (1, "check: 3 patches, 1 problem(s)\n", f"{NVFP4}: absent on the pin 0.25.0\n")
        if kept
        else (0, "check: 2 patches, 0 problem(s)\n", "")
    )

    # 3. 0.25.0 -> 0.33.0 (the default rule): the archive keeps guarding; a kept kernel is
    # absent again, and kept again.
    code, out, err = cli(capsys, root, "rebase", "--onto", "0.33.0")
    assert (code, err) == (0, "")
    width = len(f"upstreamed/{FIX2}")
    assert out == "\n".join(
        [
            "rebase 0.25.0 -> 0.33.0: done",
            f"  {f'upstreamed/{FIX1}'.ljust(width)}  upstream  stays in patches/upstreamed/",
            f"  upstreamed/{FIX2}  upstream  stays in patches/upstreamed/",
            "    * hunk 1 (vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py):"
            " code present, surrounding text differs",
            "    * hunk 3 (vllm/model_executor/layers/fused_moe/experts/triton_moe.py):"
            " code matches upstream, comment lines differ",
            *(
                [
                    f"  {NVFP4.ljust(width)}  absent    kept in the series (absent)",
                    "    * text says absent, trailers say applies",
                ]
                if kept
                else []
            ),
            f"absent rule: {ABSENT_RULE['--keep']}",
            "pin: vllm 0.33.0 (was 0.25.0); patches/, overlay/overlay.lock.json and CHANGELOG.md"
            " rewritten; review and commit them",
            "",
            ENTRY_0_33_0[kept],
        ]
    )
    assert (root / "CHANGELOG.md").read_text() == (
        HEADER + ENTRY_0_33_0[kept] + "\n" + ENTRY_0_25_0[rule] + "\n" + ENTRY_0_24_0
    )
    pyproject = (root / "pyproject.toml").read_text()
    assert 'pin = "0.33.0"\n' in pyproject
    assert '"vllm==0.33.0"' in pyproject
    assert (patches / "upstreamed" / "series").read_text() == f"{FIX1}\n{FIX2}\n"
    assert (patches / "upstreamed" / FIX2).read_bytes() == real_fix2
    assert (patches / "upstreamed" / FIX1).read_bytes() == real_fix1
    assert (patches / "series").read_text() == (f"{NVFP4}\n" if kept else "")
    if kept:
        assert (patches / NVFP4).read_bytes() == real_nvfp4
    lock = Lock.load(pinned.lock_path)
    assert (lock.version, lock.patches, lock.entries) == ("0.33.0", (), ())
    commit_all(root, "rebase onto 0.33.0")
    assert cli(capsys, root, "check") == (
        (1, "check: 3 patches, 1 problem(s)\n", f"{NVFP4}: absent on the pin 0.33.0\n")
        if kept
        else (0, "check: 2 patches, 0 problem(s)\n", "")
    )
    assert not (root / ".rebase").exists()
    assert str(root) not in worktrees(mirror)


# -- conflicts -----------------------------------------------------------------------------------
def resolved_fix2(synthetic: Path) -> bytes:
    """Fix 2 as the maintainer's resolution on v0.24.1 exports it: the removed line and the
    pre-image's blob id are v0.24.1's; everything else is the original patch."""
    original = (REPO / "patches" / FIX2).read_bytes()
    changed_blob = blob_id(
        subprocess.run(
            ["git", "-C", str(synthetic), "show", f"v0.24.1:{TRITON}"],
            capture_output=True,
            check=True,
        ).stdout
    )
    old_index = b"index abe31e017d565f39b39b3fdac06caefb7b1e6cc0..98e220a7"
    assert original.count(old_index) == 1
    return original.replace(b"-" + BUGGY.encode(), b"-" + CHANGED.encode()).replace(
        old_index, f"index {changed_blob}..98e220a7".encode()
    )


def start_conflict(
    capsys: pytest.CaptureFixture[str], root: Path, synthetic: Path
) -> tuple[str, Path]:
    code, out, err = cli(capsys, root, "rebase", "--onto-git", str(synthetic), "--ref", "v0.24.1")
    assert (code, err) == (1, "")
    return out, root / ".rebase" / "worktree"


def test_conflict_reports_hunks_then_continue(
    pinned: Project, synthetic_repo: Path, mirror: Mirror, capsys: pytest.CaptureFixture[str]
) -> None:
    root = pinned.root
    before = snapshot(root)
    out, worktree = start_conflict(capsys, root, synthetic_repo)
    assert out == (
        "rebase 0.24.0 -> git:v0.24.1: stopped\n"
        f"  upstreamed/{FIX1}  upstream  stays in patches/upstreamed/\n"
        f"  {FIX2.ljust(len(f'upstreamed/{FIX1}'))}  conflict  CONFLICT: the rebase stopped here\n"
        "absent rule: absent patches stay in the series unchanged (the overlay skips a patch"
        " that is absent); rerun with --drop to remove them\n"
        f"{FIX2} on git:v0.24.1: conflict\n"
        f"  hunk 2 {TRITON} @@ -245 +245 @@: expected\n"
        "    |             lora_unquantized_hidden_states = hidden_states\n"
        "    |             hidden_states, a1q_scale = moe_kernel_quantize_input(\n"
        "    |                 hidden_states,\n"
        f"    | {BUGGY}"
        "    |                 self.quant_dtype,\n"
        "    |                 self.per_act_token_quant,\n"
        "    |                 self.block_shape,\n"
        "  git:v0.24.1 has at line 245:\n"
        "    |             lora_unquantized_hidden_states = hidden_states\n"
        "    |             hidden_states, a1q_scale = moe_kernel_quantize_input(\n"
        "    |                 hidden_states,\n"
        f"    | {CHANGED}"
        "    |                 self.quant_dtype,\n"
        "    |                 self.per_act_token_quant,\n"
        "    |                 self.block_shape,\n"
        "next steps:\n"
        f"  1. cd {worktree}\n"
        f"  2. resolve the conflict in: {TRITON}\n"
        "  3. git add <the files> && git am --continue (keeps the patch's message, author and"
        " date; `git am --skip` drops the patch)\n"
        f"  4. cd {root} && vllm-patchset rebase --continue\n"
        "  To give up: vllm-patchset rebase --abort (everything is restored as it was).\n"
        "  Nothing in patches/, pyproject.toml, the lock or CHANGELOG.md has changed yet.\n"
    )
    assert snapshot(root) == before
    conflicted = (worktree / TRITON).read_text()
    assert "<<<<<<< HEAD\n" + CHANGED + "=======\n                self.a1_scale,\n" in conflicted
    # --continue before the conflict is resolved: a finding, nothing changes.
    code, _, err = cli(capsys, root, "rebase", "--continue")
    assert code == 1
    assert err.startswith(f"vllm-patchset: {FIX2} is not resolved yet in {worktree}")
    # The maintainer takes the patch's side of the hunk and lets git am commit it.
    git(worktree, "checkout", "--theirs", "--", TRITON)
    git(worktree, "add", TRITON)
    git(worktree, "am", "--continue")
    doc = rebase_json(capsys, root, "--continue")
    assert doc["versions"] == {
        "git:v0.24.1": {f"upstreamed/{FIX1}": "upstream", FIX2: "conflict", NVFP4: "applies"}
    }
    fix2 = doc["patches"][FIX2]  # type: ignore[index]
    assert (fix2["action"], fix2["range_diff"]) == ("resolved", "content changed")
    assert fix2["diff_of_diffs"] == (
        "--- old patch\n+++ new patch\n@@ -21,5 +21,5 @@\n"
        "              hidden_states, a1q_scale = moe_kernel_quantize_input(\n"
        "                  hidden_states,\n"
        f"--{BUGGY}"
        f"+-{CHANGED}"
        " +                self.a1_scale,\n"
        "                  self.quant_dtype,\n"
    )
    # The NVFP4 kernel applies on the resolution (fix 2's side of nvfp4_emulation_moe.py is the
    # same): taken again, byte-identical.
    nvfp4 = doc["patches"][NVFP4]  # type: ignore[index]
    assert (nvfp4["action"], nvfp4["three_way"], nvfp4["range_diff"], nvfp4["notes"]) == (
        "refreshed",
        "clean",
        "unchanged",
        [],
    )
    assert (root / "patches" / FIX2).read_bytes() == resolved_fix2(synthetic_repo)
    assert (root / "patches" / NVFP4).read_bytes() == (REPO / "patches" / NVFP4).read_bytes()
    assert (root / "patches" / "series").read_text() == f"{FIX2}\n{NVFP4}\n"
    assert (root / "CHANGELOG.md").read_text() == HEADER + (
        f"## [vllm-0.24.1] - {DATE}\n\n"
        "Rebased onto vLLM 0.24.1 (from 0.24.0) by `vllm-patchset rebase`.\n\n"
        "### Changed\n\n"
        "- Pin: vLLM 0.24.0 -> 0.24.1.\n"
        f"- Conflict resolved in `{FIX2}` (content changed).\n"
        f"- Still carried: `{FIX2}`, `{NVFP4}`.\n"
    )
    pyproject = (root / "pyproject.toml").read_text()
    assert f'pin = "0.24.1"\npin-git = "{synthetic_repo}"\npin-ref = "v0.24.1"\n' in pyproject
    assert '"vllm==0.24.0"' in pyproject  # a git pin leaves the PyPI requirement alone
    lock = Lock.load(pinned.lock_path)
    assert (lock.version, lock.patches) == ("0.24.1", (FIX2, NVFP4))
    # The lock is the one a fresh build of the new pin gives.
    assert cli(capsys, root, "overlay", "build")[0] == 0
    assert not (root / ".rebase").exists()
    assert str(root) not in worktrees(mirror)


def test_conflict_then_abort_is_byte_identical(
    pinned: Project, synthetic_repo: Path, mirror: Mirror, capsys: pytest.CaptureFixture[str]
) -> None:
    root = pinned.root
    before = snapshot(root)
    _, worktree = start_conflict(capsys, root, synthetic_repo)
    (worktree / TRITON).write_text("half resolved\n")  # work in progress, thrown away
    code, out, _ = cli(capsys, root, "rebase", "--abort")
    assert (code, out) == (0, "rebase onto git:v0.24.1 aborted: everything is as it was\n")
    assert snapshot(root) == before
    assert not (root / ".rebase").exists()
    assert git(root, "status", "--porcelain") == ""
    assert str(root) not in worktrees(mirror)
    code, _, err = cli(capsys, root, "rebase", "--continue")
    assert (code, err) == (
        2,
        "vllm-patchset: no rebase in progress (start one with `rebase --onto VERSION`)\n",
    )


def test_conflict_skip_drops_the_patch(
    pinned: Project, synthetic_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = pinned.root
    _, worktree = start_conflict(capsys, root, synthetic_repo)
    git(worktree, "am", "--skip")
    doc = rebase_json(capsys, root, "--continue")
    assert doc["versions"] == {
        "git:v0.24.1": {f"upstreamed/{FIX1}": "upstream", FIX2: "conflict", NVFP4: "applies"}
    }
    assert doc["patches"][FIX2]["action"] == "skipped"  # type: ignore[index]
    # Without fix 2's five lines in nvfp4_emulation_moe.py, the NVFP4 kernel still applies
    # (its last hunk five lines up): refreshed, its pre-image now the release's file.
    nvfp4 = doc["patches"][NVFP4]  # type: ignore[index]
    assert (nvfp4["action"], nvfp4["three_way"], nvfp4["range_diff"], nvfp4["diff_of_diffs"]) == (
        "refreshed",
        "clean",
        "context-only churn",
        None,
    )
    original = (REPO / "patches" / NVFP4).read_bytes()
    pristine, patched = _nvfp4_blobs_without_fix2(pinned)
    expected = original.replace(
        b"index c8825f559d93767c953a16af6b8004ea36669f8b..617982e6c545dae10dcc8592c5207cf8f6569465",
        f"index {pristine}..{patched}".encode(),
    ).replace(b"@@ -105,9 +482,132 @@", b"@@ -100,9 +477,132 @@")
    assert expected != original
    assert (root / "patches" / NVFP4).read_bytes() == expected
    assert (root / "patches" / "series").read_text() == f"{NVFP4}\n"
    assert not (root / "patches" / FIX2).exists()
    assert (root / "CHANGELOG.md").read_text() == HEADER + (
        f"## [vllm-0.24.1] - {DATE}\n\n"
        "Rebased onto vLLM 0.24.1 (from 0.24.0) by `vllm-patchset rebase`.\n\n"
        "### Changed\n\n"
        "- Pin: vLLM 0.24.0 -> 0.24.1.\n"
        f"- Refreshed `{NVFP4}` (context-only churn).\n"
        f"- Still carried: `{NVFP4}`.\n\n"
        "### Removed\n\n"
        f"- Dropped `{FIX2}` while resolving its conflict (git am --skip).\n"
    )
    assert Lock.load(pinned.lock_path).patches == (NVFP4,)
    assert cli(capsys, root, "overlay", "build")[0] == 0  # the lock is a fresh build's


def _nvfp4_blobs_without_fix2(project: Project) -> tuple[str, str]:
    """nvfp4_emulation_moe.py's blob ids on 0.24.0, and with the NVFP4 kernel alone on it."""
    mirror = Mirror(project.cache_dir)
    tree = mirror.repo.tree_of(mirror.release("0.24.0").commit)
    patched = mirror.repo.apply_to_tree(tree, (REPO / "patches" / NVFP4).read_bytes())
    before, after = (
        mirror.repo.read_blob(tree, NVFP4_FILE),
        mirror.repo.read_blob(patched, NVFP4_FILE),
    )
    assert before is not None and after is not None
    return blob_id(before), blob_id(after)


def test_moved_hunks_are_context_only_churn(
    pinned: Project, synthetic_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = pinned.root
    doc = rebase_json(capsys, root, "--onto-git", str(synthetic_repo), "--ref", "v0.24.2")
    assert doc["versions"] == {
        "git:v0.24.2": {f"upstreamed/{FIX1}": "upstream", FIX2: "applies", NVFP4: "applies"}
    }
    fix2 = doc["patches"][FIX2]  # type: ignore[index]
    assert (fix2["action"], fix2["range_diff"], fix2["diff_of_diffs"]) == (
        "refreshed",
        "context-only churn",
        None,
    )
    original = (REPO / "patches" / FIX2).read_bytes()
    moved = blob_id(b"# One more line above every hunk.\n" + _pristine_triton(synthetic_repo))
    patched = blob_id(b"# One more line above every hunk.\n" + _patched_triton(pinned))
    expected = (
        original.replace(
            b"index abe31e017d565f39b39b3fdac06caefb7b1e6cc0..98e220a71c9e79d6da78d8c6607f5303ec75c9ee",
            f"index {moved}..{patched}".encode(),
        )
        .replace(b"@@ -245,7 +245,7 @@", b"@@ -246,7 +246,7 @@")
        .replace(b"@@ -332,12 +332,23 @@", b"@@ -333,12 +333,23 @@")
    )
    assert (root / "patches" / FIX2).read_bytes() == expected
    # The NVFP4 kernel touches nvfp4_emulation_moe.py only, which v0.24.2 left alone.
    nvfp4 = doc["patches"][NVFP4]  # type: ignore[index]
    assert (nvfp4["action"], nvfp4["range_diff"]) == ("refreshed", "unchanged")
    assert (root / "patches" / NVFP4).read_bytes() == (REPO / "patches" / NVFP4).read_bytes()
    assert (root / "patches" / "series").read_text() == f"{FIX2}\n{NVFP4}\n"
    assert (root / "CHANGELOG.md").read_text() == HEADER + (
        f"## [vllm-0.24.2] - {DATE}\n\n"
        "Rebased onto vLLM 0.24.2 (from 0.24.0) by `vllm-patchset rebase`.\n\n"
        "### Changed\n\n"
        "- Pin: vLLM 0.24.0 -> 0.24.2.\n"
        f"- Refreshed `{FIX2}` (context-only churn).\n"
        f"- Still carried: `{FIX2}`, `{NVFP4}`.\n"
    )
    assert Lock.load(pinned.lock_path).patches == (FIX2, NVFP4)


def _pristine_triton(synthetic: Path) -> bytes:
    return subprocess.run(
        ["git", "-C", str(synthetic), "show", f"v0.24.0:{TRITON}"], capture_output=True, check=True
    ).stdout


def _patched_triton(project: Project) -> bytes:
    mirror = Mirror(project.cache_dir)
    tree = mirror.repo.apply_to_tree(
        mirror.repo.tree_of(mirror.release("0.24.0").commit),
        (REPO / "patches" / FIX2).read_bytes(),
    )
    data = mirror.repo.read_blob(tree, TRITON)
    assert data is not None
    return data


# -- absent patches ------------------------------------------------------------------------------
# nvfp4_emulation_moe.py's imports, before the class: 0.24.0 (fix 2's pre-image, the kernel's
# context) and 0.23.0 (one more import), as the conflict report prints them.
IMPORTS_HEAD = [
    "    FusedMoEQuantConfig,",
    ")",
    "from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts",
]
IMPORTS_TAIL = [
    "from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (",
    "    dequantize_to_dtype,",
    ")",
    "from vllm.model_executor.layers.quantization.utils.quant_utils import (",
    "    QuantKey,",
    "    kNvfp4Dynamic,",
    "    kNvfp4Static,",
    ")",
    "",
    "logger = init_logger(__name__)",
    "",
    "",
    "class Nvfp4QuantizationEmulationTritonExperts(TritonExperts):",
]
IMPORT_0_23_0 = "from vllm.model_executor.layers.fused_moe.utils import moe_kernel_quantize_input"


@pytest.mark.parametrize(
    ("flag", "fix2_line", "series", "carried", "removed"),
    [
        (
            "--keep",
            "absent    kept in the series (absent)",
            f"{FIX2}\n",
            f"`{FIX2}` (absent on 0.23.0, kept)",
            "",
        ),
        (
            "--drop",
            "absent    dropped",
            "",
            "none",
            f"- Dropped `{FIX2}`: absent from vLLM 0.23.0 (--drop).\n",
        ),
    ],
)
def test_absent_patch_kept_or_dropped_then_the_kernel_on_it_conflicts(
    pinned: Project,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    fix2_line: str,
    series: str,
    carried: str,
    removed: str,
) -> None:
    """On 0.23.0, fix 2 is absent (text and trailers); the NVFP4 kernel, whose context holds
    0.24.0's imports, is a conflict there (its trailers say absent: reported) and stops the
    rebase whatever the absent rule; `git am --skip` drops it."""
    root = pinned.root
    before = snapshot(root)
    fix2_before = (root / "patches" / FIX2).read_bytes()
    code, out, err = cli(capsys, root, "rebase", "--onto", "0.23.0", flag)
    assert (code, err) == (1, "")
    worktree = root / ".rebase" / "worktree"
    width = len(f"upstreamed/{FIX1}")
    assert out == "\n".join(
        [
            "rebase 0.24.0 -> 0.23.0: stopped",
            f"  upstreamed/{FIX1}  upstream  stays in patches/upstreamed/",
            f"  {FIX2.ljust(width)}  {fix2_line}",
            f"  {NVFP4.ljust(width)}  conflict  CONFLICT: the rebase stopped here",
            "    * text says conflict, trailers say absent",
            f"absent rule: {ABSENT_RULE[flag]}",
            f"{NVFP4} on 0.23.0: conflict",
            f"  hunk 2 {NVFP4_FILE} @@ -21 +46 @@: expected",
            *(f"    | {line}" for line in [*IMPORTS_HEAD, *IMPORTS_TAIL, '    """']),
            "  0.23.0 has at line 21:",
            *(f"    | {line}" for line in [*IMPORTS_HEAD, IMPORT_0_23_0, *IMPORTS_TAIL]),
            "next steps:",
            f"  1. cd {worktree}",
            f"  2. resolve the conflict in: {NVFP4_FILE}",
            "  3. git add <the files> && git am --continue (keeps the patch's message, author and"
            " date; `git am --skip` drops the patch)",
            f"  4. cd {root} && vllm-patchset rebase --continue",
            "  To give up: vllm-patchset rebase --abort (everything is restored as it was).",
            "  Nothing in patches/, pyproject.toml, the lock or CHANGELOG.md has changed yet.",
            "",
        ]
    )
    assert snapshot(root) == before
    git(worktree, "am", "--skip")
    doc = rebase_json(capsys, root, "--continue")
    assert doc["versions"] == {
        "0.23.0": {f"upstreamed/{FIX1}": "upstream", FIX2: "absent", NVFP4: "conflict"}
    }
    fix2 = doc["patches"][FIX2]  # type: ignore[index]
    assert (fix2["action"], fix2["text_state"], fix2["trailer_state"], fix2["notes"]) == (
        KEPT_OR_DROPPED[flag],
        "absent",
        "absent",
        [],
    )
    nvfp4 = doc["patches"][NVFP4]  # type: ignore[index]
    assert (nvfp4["action"], nvfp4["text_state"], nvfp4["trailer_state"]) == (
        "skipped",
        "conflict",
        "absent",
    )
    assert (root / "patches" / "series").read_text() == series
    assert (root / "patches" / "upstreamed" / "series").read_text() == f"{FIX1}\n"
    assert sorted(p.name for p in (root / "patches").glob("*.patch")) == (
        [FIX2] if flag == "--keep" else []
    )
    if flag == "--keep":
        assert (root / "patches" / FIX2).read_bytes() == fix2_before
    assert (root / "CHANGELOG.md").read_text() == HEADER + (
        f"## [vllm-0.23.0] - {DATE}\n\n"
        "Rebased onto vLLM 0.23.0 (from 0.24.0) by `vllm-patchset rebase`.\n\n"
        "### Changed\n\n"
        "- Pin: vLLM 0.24.0 -> 0.23.0.\n"
        f"- Still carried: {carried}.\n\n"
        "### Removed\n\n"
        f"{removed}"
        f"- Dropped `{NVFP4}` while resolving its conflict (git am --skip).\n"
    )
    lock = Lock.load(pinned.lock_path)
    assert (lock.version, lock.patches, lock.entries) == ("0.23.0", (), ())


# -- refusals and interruptions ------------------------------------------------------------------
DIRTY = [
    ("patches/" + FIX2, "M patches/" + FIX2),
    ("patches/0003-stray.patch", "?? patches/0003-stray.patch"),
    ("README.md", "M README.md"),
]


@pytest.mark.parametrize(("path", "status"), DIRTY)
def test_dirty_checkout_is_refused(
    pinned: Project, capsys: pytest.CaptureFixture[str], path: str, status: str
) -> None:
    root = pinned.root
    (root / "README.md").write_text("readme\n")
    commit_all(root, "readme")
    target = root / path
    target.write_bytes((target.read_bytes() if target.exists() else b"") + b"\n")
    before = snapshot(root)
    code, out, err = cli(capsys, root, "rebase", "--onto", "0.25.0")
    assert (code, out) == (2, "")
    assert err == (
        f"vllm-patchset: the checkout {root} has uncommitted changes ({status}):"
        " commit or stash them before a rebase\n"
    )
    assert snapshot(root) == before
    assert not (root / ".rebase").exists()


BAD_USAGE = [
    (("--onto", "0.24.0"), "the pin 0.24.0 is 0.24.0 already: nothing to rebase"),
    (("--onto", "latest"), "not a vLLM version: 'latest' (expected e.g. 0.24.0)"),
    (("--onto", "0.25.0", "--ref", "v0.25.0"), "--ref goes with --onto-git"),
    (("--onto-git", "/nonexistent"), "--onto-git needs --ref REF"),
    (("--continue",), "no rebase in progress (start one with `rebase --onto VERSION`)"),
    (("--abort",), "no rebase in progress (start one with `rebase --onto VERSION`)"),
]


@pytest.mark.parametrize(("args", "message"), BAD_USAGE)
def test_bad_usage_changes_nothing(
    pinned: Project, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    before = snapshot(pinned.root)
    assert cli(capsys, pinned.root, "rebase", *args) == (2, "", f"vllm-patchset: {message}\n")
    assert snapshot(pinned.root) == before
    assert not (pinned.root / ".rebase").exists()


def spawn_rebase(root: Path, cache: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "VLLM_PATCHSET_CACHE": str(cache), "SOURCE_DATE_EPOCH": EPOCH}
    return subprocess.Popen(
        [sys.executable, "-m", "vllm_patchset", "--project", str(root), "rebase", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the kill takes its git children too
    )


def kill_when(process: subprocess.Popen[bytes], ready: object) -> None:
    """SIGKILL the rebase as soon as `ready()` holds (polled every half millisecond)."""
    assert callable(ready)
    deadline = time.monotonic() + 120
    while not ready():
        assert process.poll() is None, "the rebase ended before the point to kill it"
        assert time.monotonic() < deadline
        time.sleep(0.0005)
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL


def expect_rebased_onto_0_25_0(root: Path) -> None:
    """The project rebased onto 0.25.0 by the default rule: fix 2 archived, the NVFP4 kernel
    (absent there) kept."""
    patches = root / "patches"
    assert (patches / "series").read_text() == f"{NVFP4}\n"
    assert (patches / "upstreamed" / "series").read_text() == f"{FIX1}\n{FIX2}\n"
    assert (patches / "upstreamed" / FIX2).read_bytes() == (REPO / "patches" / FIX2).read_bytes()
    assert (patches / NVFP4).read_bytes() == (REPO / "patches" / NVFP4).read_bytes()
    assert not (patches / FIX2).exists()
    assert (root / "CHANGELOG.md").read_text() == HEADER + ENTRY_0_25_0["--keep"]
    lock = Lock.load(root / "overlay/overlay.lock.json")
    assert (lock.version, lock.patches) == ("0.25.0", ())


KILL_POINTS = [
    ("running", lambda root: (root / ".rebase" / "worktree").exists()),
    ("staging", lambda root: (root / ".rebase" / "stage").exists()),
]


@pytest.mark.parametrize(("name", "point"), KILL_POINTS)
def test_killed_rebase_leaves_the_checkout_as_it_was(
    pinned: Project,
    mirror: Mirror,
    capsys: pytest.CaptureFixture[str],
    name: str,
    point: object,
) -> None:
    root = pinned.root
    before = snapshot(root)
    process = spawn_rebase(root, pinned.cache_dir, "--onto", "0.25.0")
    kill_when(process, lambda: point(root))  # type: ignore[operator]
    assert snapshot(root) == before
    assert git(root, "status", "--porcelain") == ""
    code, _, err = cli(capsys, root, "rebase", "--onto", "0.25.0")
    assert code == 2
    assert "a rebase is in progress" in err
    code, _, err = cli(capsys, root, "rebase", "--continue")
    assert (code, err) == (
        2,
        "vllm-patchset: the rebase was interrupted before it finished: `rebase --abort`,"
        " then start again\n",
    )
    assert cli(capsys, root, "rebase", "--abort")[0] == 0
    assert snapshot(root) == before
    assert not (root / ".rebase").exists()
    assert str(root) not in worktrees(mirror)
    assert cli(capsys, root, "rebase", "--onto", "0.25.0")[0] == 0
    expect_rebased_onto_0_25_0(root)


def swapping(root: Path) -> bool:
    state = root / ".rebase" / "state.json"
    try:
        return '"phase": "swap"' in state.read_text() or '"phase": "done"' in state.read_text()
    except OSError:
        return False


@pytest.mark.parametrize("then", ["--abort", "--continue"])
def test_rebase_killed_while_swapping_is_undone_or_finished(
    pinned: Project, capsys: pytest.CaptureFixture[str], then: str
) -> None:
    root = pinned.root
    before = snapshot(root)
    process = spawn_rebase(root, pinned.cache_dir, "--onto", "0.25.0")
    kill_when(process, lambda: swapping(root))
    # Killed while moving the staged files in ("swap"), or just after the last move ("done"):
    # from "done" on, the rebase is complete and --abort only finishes its cleanup.
    phase = json.loads((root / ".rebase" / "state.json").read_text())["phase"]
    assert phase in ("swap", "done")
    assert cli(capsys, root, "rebase", then)[0] == 0
    assert not (root / ".rebase").exists()
    if then == "--abort" and phase == "swap":
        assert snapshot(root) == before
    else:
        expect_rebased_onto_0_25_0(root)
