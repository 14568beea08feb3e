"""`vllm-patchset rebase` on real vLLM releases, with this project's own series (copied into a
fresh git repo in tmp). The mechanics (moved code, conflicts, decisions, a damaged journal,
signals) are tested on synthetic upstreams in test_rebase_synthetic.py; here, what the real
series meets.

The series: fix 1 (archived: upstream since 0.21.0), fix 2 (triton_moe, upstream in 0.25.0)
and the fused NVFP4 emulation kernel (0002, local, written for 0.24.0). 0.25.0 rewrote the
function 0002 replaces (a fused kernel of its own): from the pin, every rebase onto 0.25.0 or
later stops for a decision on 0002 before it writes anything, and finishes with `--keep 0002`
(parked) or `--drop 0002`; `check` passes after each.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import committed, git
from vllm_patchset.cli import main
from vllm_patchset.config import Project
from vllm_patchset.lock import Lock
from vllm_patchset.overlay import build_overlay
from vllm_patchset.upstream import Mirror

FIX1 = "0001-nvfp4-oracle-take-the-E2M1-table-s-device-from-w13.patch"
FIX2 = "0001-triton_moe-no-tensor-truthiness-when-quantizing-defe.patch"
NVFP4 = "0002-nvfp4_emulation_moe-fused-NVFP4-GEMMs-over-the-route.patch"
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
PARKED_LINE = "- Parked `{name}` (--keep): conflict (rewritten) on vLLM {v}; kept in `patches/parked/`, not applied."
DROPPED_LINE = "- Dropped `{name}` (--drop): conflict (rewritten) on vLLM {v}."


def entry(new: str, old: str, rule: str, *, fix2: bool = True, images: bool = True) -> str:
    """The CHANGELOG section of a rebase from the pin's series (fix 2 archived there, 0002
    parked or dropped)."""
    changed = f"- Pin: vLLM {old} -> {new}" + (
        f" (`vllm=={new}`, GPU validation images `v{new}`)." if images else "."
    )
    lines = [
        f"## [vllm-{new}] - {DATE}",
        "",
        f"Rebased onto vLLM {new} (from {old}) by `vllm-patchset rebase`.",
        "",
        "### Changed",
        "",
        changed,
    ]
    if rule == "--keep":
        lines.append(PARKED_LINE.format(name=NVFP4, v=new))
    lines.append("- Still carried: none.")
    removed = []
    if fix2:
        removed.append(
            f"- Dropped as upstream: `{FIX2}`, merged in vLLM 0.25.0 by {PR_46735}; archived in `patches/upstreamed/`."
        )
    if rule == "--drop":
        removed.append(DROPPED_LINE.format(name=NVFP4, v=new))
    if removed:
        lines += ["", "### Removed", "", *removed]
    return "\n".join(lines) + "\n"


def parked_series(old: str, new: str) -> str:
    return f"{NVFP4}  # kept by `rebase` {old} -> {new} on {DATE}: conflict (rewritten) there\n"


# -- helpers -------------------------------------------------------------------------------------
def cli(capsys: pytest.CaptureFixture[str], root: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--project", str(root), *args])
    out, err = capsys.readouterr()
    return code, out, err


def rebase_json(
    capsys: pytest.CaptureFixture[str], root: Path, *args: str, code: int = 0
) -> dict[str, object]:
    got, out, err = cli(capsys, root, "rebase", *args, "--json")
    assert (got, err) == (code, ""), err
    doc: dict[str, object] = json.loads(out)
    return doc


def sha256s(root: Path) -> dict[str, str]:
    """Every file of the checkout (git's own and the rebase's state dirs aside)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] not in (".git", ".rebase")
    }


def commit_all(root: Path, message: str) -> None:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)


def check(capsys: pytest.CaptureFixture[str], root: Path, patches: int) -> None:
    """`check` passes: what every finished rebase must leave."""
    assert cli(capsys, root, "check") == (0, f"check: {patches} patches, 0 problem(s)\n", "")
    assert not (root / ".rebase").exists()


@pytest.fixture(autouse=True)
def _fixed_date(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)


@pytest.fixture
def pinned(project: Project) -> Project:
    """The project as it is (pin 0.24.0), with its .gitignore and no CHANGELOG yet."""
    (project.root / ".gitignore").write_bytes(committed(".gitignore"))
    (project.root / "CHANGELOG.md").unlink(missing_ok=True)
    commit_all(project.root, "gitignore, no changelog")
    return project


def expect_decision_on_0002(capsys: pytest.CaptureFixture[str], root: Path, version: str) -> None:
    """The rebase onto `version` stops before it writes anything: 0002 needs a decision."""
    before = sha256s(root)
    doc = rebase_json(capsys, root, "--onto", version, code=1)
    assert (doc["status"], doc["started"]) == ("stopped", False)
    assert doc["decisions"] == [
        {
            "patch": NVFP4,
            "state": "conflict",
            "verdict": "rewritten",
            "options": ["--keep 0002", "--drop 0002", "--resolve-upstream 0002"],
            "means": [
                "park it in patches/parked/ (kept, not applied; port it later)",
                "remove it",
                "archive it in patches/upstreamed/ as fixed upstream (its regression test keeps"
                " guarding)",
            ],
        }
    ]
    assert sha256s(root) == before
    assert not (root / ".rebase").exists()


# -- the chain of real releases ------------------------------------------------------------------
@pytest.mark.parametrize("rule", ["--keep", "--drop"])
def test_chain_nightly_to_0_24_0_to_0_25_0_to_0_33_0(
    pinned: Project,
    nightly_repo: Path,
    capsys: pytest.CaptureFixture[str],
    rule: str,
) -> None:
    root = pinned.root
    real = {name: committed(f"patches/{name}") for name in (FIX2, NVFP4)}
    real_fix1 = committed(f"patches/upstreamed/{FIX1}")
    real_pyproject = (root / "pyproject.toml").read_bytes()
    real_ci = {
        path: (root / path).read_text()
        for path in (".github/workflows/gpu-validation.yml", ".buildkite/gpu-validation.yml")
    }
    # On the nightly pin, fix 1 is carried and pending (Applied-upstream empty); no fix 2, no
    # NVFP4 kernel (both written for 0.24.0).
    pending_fix1 = real_fix1.replace(b"\nApplied-upstream: 0.21.0\n", b"\nApplied-upstream:\n")
    assert pending_fix1 != real_fix1
    patches = root / "patches"
    (patches / FIX2).unlink()
    (patches / NVFP4).unlink()
    (patches / "upstreamed" / FIX1).unlink()
    (patches / FIX1).write_bytes(pending_fix1)
    (patches / "series").write_text(f"{FIX1}\n")
    (patches / "upstreamed" / "series").write_text("")
    pyproject = real_pyproject.decode()
    assert pyproject.count('pin = "0.24.0"\n') == 1
    (root / "pyproject.toml").write_text(
        pyproject.replace(
            'pin = "0.24.0"\n',
            f'pin = "git:nightly"\npin-git = "{nightly_repo}"\npin-ref = "nightly"\n',
        )
    )
    build_overlay(Project.load(root, pinned.cache_dir), update_lock=True)
    assert Lock.load(pinned.lock_path).patches == (FIX1,)
    commit_all(root, "nightly pin")

    # 1. nightly -> 0.24.0: fix 1 is upstream (first release with it: 0.21.0), archived.
    doc = rebase_json(capsys, root, "--onto", "0.24.0")
    assert (doc["versions"], doc["status"], doc["pin"]) == (
        {"0.24.0": {FIX1: "upstream"}},
        "done",
        "0.24.0",
    )
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
    assert {path: (root / path).read_text() for path in real_ci} == real_ci
    assert (root / "CHANGELOG.md").read_text() == HEADER + ENTRY_0_24_0
    assert Lock.load(pinned.lock_path).patches == ()
    check(capsys, root, 1)
    commit_all(root, "rebase onto 0.24.0")

    # The edit loop: fix 2, then the NVFP4 kernel on top of it, join as commits in the queue,
    # exported to patches/: the project as it is.
    assert cli(capsys, root, "queue", "import")[0] == 0
    for name in (FIX2, NVFP4):
        (root.parent / name).write_bytes(committed(f"patches/{name}"))
    git(root / ".queue", "am", "-q", str(root.parent / FIX2), str(root.parent / NVFP4))
    assert cli(capsys, root, "queue", "export", "--drop")[0] == 0
    assert cli(capsys, root, "overlay", "build", "--update-lock")[0] == 0
    assert {n: (patches / n).read_bytes() for n in real} == real
    assert pinned.lock_path.read_bytes() == committed("overlay/overlay.lock.json")
    check(capsys, root, 3)
    commit_all(root, "fix 2, NVFP4 kernel")

    # 2. 0.24.0 -> 0.25.0: fix 2 is upstream (trailer 0.25.0 kept), archived byte-identical;
    # 0.25.0 rewrote the emulation 0002 replaces: a stop for a decision, then the decision.
    expect_decision_on_0002(capsys, root, "0.25.0")
    doc = rebase_json(capsys, root, "--onto", "0.25.0", rule, "0002")
    assert doc["versions"] == {
        "0.25.0": {f"upstreamed/{FIX1}": "upstream", FIX2: "upstream", NVFP4: "conflict"}
    }
    fix2 = doc["patches"][FIX2]  # type: ignore[index]
    assert (fix2["action"], fix2["applied_upstream"], fix2["verdict"]) == (
        "archived",
        "0.25.0",
        "upstream",
    )
    assert fix2["notes"] == ["Applied-upstream: 0.25.0 (trailer kept)"]
    assert fix2["warnings"] == []
    assert fix2["disagreements"] == [
        "hunk 1 (vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py):"
        " code present, surrounding text differs",
        "hunk 3 (vllm/model_executor/layers/fused_moe/experts/triton_moe.py):"
        " code matches upstream, comment lines differ",
        "3-way merge: conflict (the release's code differs from the patch's)",
    ]
    nvfp4 = doc["patches"][NVFP4]  # type: ignore[index]
    assert (nvfp4["verdict"], nvfp4["action"], nvfp4["decision"], nvfp4["trailer_state"]) == (
        "rewritten",
        "parked" if rule == "--keep" else "dropped",
        rule[2:],
        "applies",
    )
    assert doc["warnings"] == [
        f"{NVFP4}: it applied on the old pin; the code it changes is gone from 0.25.0"
        " (rewritten or removed upstream)"
    ]
    assert doc["changelog"] == entry("0.25.0", "0.24.0", rule)
    assert (patches / "upstreamed" / FIX2).read_bytes() == real[FIX2]
    assert (patches / "upstreamed" / FIX1).read_bytes() == real_fix1
    assert (patches / "upstreamed" / "series").read_text() == f"{FIX1}\n{FIX2}\n"
    assert (patches / "series").read_text() == ""
    kept = rule == "--keep"
    assert sorted(p.relative_to(patches).as_posix() for p in patches.rglob("*.patch")) == [
        *([f"parked/{NVFP4}"] if kept else []),
        f"upstreamed/{FIX1}",
        f"upstreamed/{FIX2}",
    ]
    if kept:
        assert (patches / "parked" / NVFP4).read_bytes() == real[NVFP4]
        assert (patches / "parked" / "series").read_text() == parked_series("0.24.0", "0.25.0")
    assert (root / "CHANGELOG.md").read_text() == (
        HEADER + entry("0.25.0", "0.24.0", rule) + "\n" + ENTRY_0_24_0
    )
    assert '"vllm==0.25.0"' in (root / "pyproject.toml").read_text()
    for path, text in real_ci.items():
        assert (root / path).read_text() == text.replace("0.24.0", "0.25.0")
    lock = Lock.load(pinned.lock_path)
    assert (lock.version, lock.patches, lock.entries) == ("0.25.0", (), ())
    check(capsys, root, 3 if kept else 2)
    commit_all(root, "rebase onto 0.25.0")

    # 3. 0.25.0 -> 0.33.0: no decision left to make; the archive keeps guarding, a parked
    # kernel stays parked (its reason kept).
    code, out, err = cli(capsys, root, "rebase", "--onto", "0.33.0")
    assert (code, err) == (0, "")
    width = len(f"upstreamed/{FIX2}")
    assert out == "\n".join(
        [
            "rebase 0.25.0 -> 0.33.0: done",
            f"  {f'upstreamed/{FIX1}'.ljust(width)}  upstream  stays in patches/upstreamed/",
            f"  {f'upstreamed/{FIX2}'.ljust(width)}  upstream  stays in patches/upstreamed/",
            *(
                [f"  {f'parked/{NVFP4}'.ljust(width)}  conflict  stays in patches/parked/"]
                if kept
                else []
            ),
            *(
                [
                    f"WARNING: parked/{NVFP4}: text says absent, trailers say applies: the code it"
                    " changes is gone (rewritten or removed upstream)"
                ]
                if kept
                else []
            ),
            "3 cosmetic note(s) on upstreamed code (--verbose shows them)",
            "pin: vllm 0.33.0 (was 0.25.0); patches/, overlay/overlay.lock.json and CHANGELOG.md"
            " rewritten, `check` passes; review and commit them",
            "",
            entry("0.33.0", "0.25.0", "", fix2=False),
        ]
    )
    assert (root / "CHANGELOG.md").read_text() == (
        HEADER
        + entry("0.33.0", "0.25.0", "", fix2=False)
        + "\n"
        + entry("0.25.0", "0.24.0", rule)
        + "\n"
        + ENTRY_0_24_0
    )
    pyproject = (root / "pyproject.toml").read_text()
    assert 'pin = "0.33.0"\n' in pyproject
    assert '"vllm==0.33.0"' in pyproject
    for path, text in real_ci.items():
        assert (root / path).read_text() == text.replace("0.24.0", "0.33.0")
    assert (patches / "upstreamed" / "series").read_text() == f"{FIX1}\n{FIX2}\n"
    if kept:
        assert (patches / "parked" / NVFP4).read_bytes() == real[NVFP4]
        assert (patches / "parked" / "series").read_text() == parked_series("0.24.0", "0.25.0")
    lock = Lock.load(pinned.lock_path)
    assert (lock.version, lock.patches, lock.entries) == ("0.33.0", (), ())
    check(capsys, root, 3 if kept else 2)


@pytest.mark.parametrize("rule", ["--keep", "--drop"])
def test_pin_to_0_33_0_directly(
    pinned: Project, capsys: pytest.CaptureFixture[str], rule: str
) -> None:
    """The daily sync's next run. Before: it exited 0 with "done", CHANGELOG.md said 0002 was
    "still carried", the rebuilt lock was empty and `check` failed."""
    root = pinned.root
    before = sha256s(root)
    code, out, err = cli(capsys, root, "rebase", "--onto", "0.33.0")
    assert (code, err) == (1, "")
    width = len(f"upstreamed/{FIX1}")
    assert out == "\n".join(
        [
            "rebase 0.24.0 -> 0.33.0: stopped, 1 decision(s) needed (nothing has changed)",
            f"  upstreamed/{FIX1}  upstream  stays in patches/upstreamed/",
            f"  {FIX2.ljust(width)}  upstream  -> patches/upstreamed/ (Applied-upstream: 0.25.0)",
            "    * Applied-upstream: 0.25.0 (trailer kept)",
            f"  {NVFP4.ljust(width)}  conflict  DECISION NEEDED (rewritten)",
            f"WARNING: {NVFP4}: it applied on the old pin; the code it changes is gone from 0.33.0"
            " (rewritten or removed upstream)",
            "3 cosmetic note(s) on upstreamed code (--verbose shows them)",
            "decisions needed (rerun with one option per patch; nothing has changed):",
            f"  {NVFP4} (conflict, rewritten):",
            "    --keep 0002: park it in patches/parked/ (kept, not applied; port it later)",
            "    --drop 0002: remove it",
            "    --resolve-upstream 0002: archive it in patches/upstreamed/ as fixed upstream (its"
            " regression test keeps guarding)",
            "  rerun: vllm-patchset rebase --onto 0.33.0 <an option per patch above>",
            "  No rebase is in progress: nothing was written.",
            "",
        ]
    )
    assert sha256s(root) == before
    assert not (root / ".rebase").exists()
    expect_decision_on_0002(capsys, root, "0.33.0")
    doc = rebase_json(capsys, root, "--onto", "0.33.0", rule, "0002")
    assert doc["versions"] == {
        "0.33.0": {f"upstreamed/{FIX1}": "upstream", FIX2: "upstream", NVFP4: "conflict"}
    }
    assert doc["changelog"] == entry("0.33.0", "0.24.0", rule)
    assert (root / "CHANGELOG.md").read_text() == HEADER + entry("0.33.0", "0.24.0", rule)
    check(capsys, root, 3 if rule == "--keep" else 2)


# -- refusals ------------------------------------------------------------------------------------
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
    before = sha256s(root)
    code, out, err = cli(capsys, root, "rebase", "--onto", "0.25.0", "--keep", "0002")
    assert (code, out) == (2, "")
    assert err == (
        f"vllm-patchset: the checkout {root} has uncommitted changes ({status}):"
        " commit or stash them before a rebase\n"
    )
    assert sha256s(root) == before
    assert not (root / ".rebase").exists()


BAD_USAGE = [
    (("--onto", "0.24.0"), "the pin 0.24.0 is 0.24.0 already: nothing to rebase"),
    (("--onto", "latest"), "not a vLLM version: 'latest' (expected e.g. 0.24.0)"),
    (("--onto", "0.25.0", "--ref", "v0.25.0"), "--ref goes with --onto-git"),
    (("--onto-git", "/nonexistent"), "--onto-git needs --ref REF"),
    (("--continue",), "no rebase in progress (start one with `rebase --onto VERSION`)"),
    (("--abort",), "no rebase in progress (start one with `rebase --onto VERSION`)"),
    (("--abort", "--keep", "0002"), "--abort takes no decisions (it puts everything back)"),
    (
        ("--onto", "0.25.0", "--keep", "0001"),
        f"--keep {FIX2}: it needs no decision (upstream on 0.25.0)",
    ),
    (
        ("--onto", "0.25.0", "--keep", "upstreamed/0001"),
        f"--keep upstreamed/{FIX1}: it needs no decision (upstream on 0.25.0)",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD_USAGE)
def test_bad_usage_changes_nothing(
    pinned: Project, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    before = sha256s(pinned.root)
    assert cli(capsys, pinned.root, "rebase", *args) == (2, "", f"vllm-patchset: {message}\n")
    assert sha256s(pinned.root) == before
    assert not (pinned.root / ".rebase").exists()


# -- other processes: killed, or running at the same time ----------------------------------------
def spawn_rebase(root: Path, cache: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "VLLM_PATCHSET_CACHE": str(cache), "SOURCE_DATE_EPOCH": EPOCH}
    return subprocess.Popen(
        [sys.executable, "-m", "vllm_patchset", "--project", str(root), "rebase", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: a kill takes its git children too
    )


def wait_for(process: subprocess.Popen[bytes], ready: Callable[[], bool]) -> None:
    """Poll (every half millisecond) until `ready()` holds, the process still running."""
    deadline = time.monotonic() + 120
    while not ready():
        assert process.poll() is None, "the rebase ended before the point to stop it"
        assert time.monotonic() < deadline
        time.sleep(0.0005)


def expect_rebased_onto_0_25_0(root: Path) -> None:
    """The project rebased onto 0.25.0 with `--keep 0002`."""
    patches = root / "patches"
    assert (patches / "series").read_text() == ""
    assert (patches / "upstreamed" / "series").read_text() == f"{FIX1}\n{FIX2}\n"
    assert (patches / "upstreamed" / FIX2).read_bytes() == committed(f"patches/{FIX2}")
    assert (patches / "parked" / NVFP4).read_bytes() == committed(f"patches/{NVFP4}")
    assert (root / "CHANGELOG.md").read_text() == HEADER + entry("0.25.0", "0.24.0", "--keep")
    lock = Lock.load(root / "overlay/overlay.lock.json")
    assert (lock.version, lock.patches) == ("0.25.0", ())


def phase(root: Path) -> str | None:
    try:
        return str(json.loads((root / ".rebase" / "state.json").read_text())["phase"])
    except (OSError, ValueError, KeyError):
        return None


KILL_POINTS = [
    ("taking the patches", lambda root: (root / ".rebase" / "worktree").exists()),
    ("staging", lambda root: (root / ".rebase" / "stage").exists()),
]


@pytest.mark.parametrize(("name", "point"), KILL_POINTS)
def test_killed_rebase_leaves_the_checkout_as_it_was(
    pinned: Project,
    capsys: pytest.CaptureFixture[str],
    name: str,
    point: Callable[[Path], bool],
) -> None:
    root = pinned.root
    before = sha256s(root)
    process = spawn_rebase(root, pinned.cache_dir, "--onto", "0.25.0", "--keep", "0002")
    wait_for(process, lambda: point(root))
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    assert sha256s(root) == before
    assert git(root, "status", "--porcelain") == ""
    code, _, err = cli(capsys, root, "rebase", "--onto", "0.25.0")
    assert code == 2
    assert "a rebase is in progress" in err
    assert cli(capsys, root, "rebase", "--continue") == (
        2,
        "",
        "vllm-patchset: the rebase was interrupted before it finished: `rebase --abort`,"
        " then start again\n",
    )
    assert cli(capsys, root, "rebase", "--abort") == (
        0,
        "rebase onto 0.25.0 aborted: everything is as it was\n",
        "",
    )
    assert sha256s(root) == before
    assert not (root / ".rebase").exists()
    assert cli(capsys, root, "rebase", "--onto", "0.25.0", "--keep", "0002")[0] == 0
    expect_rebased_onto_0_25_0(root)
    check(capsys, root, 3)


@pytest.mark.parametrize("then", ["--abort", "--continue"])
def test_rebase_killed_while_swapping_is_undone_or_finished(
    pinned: Project, capsys: pytest.CaptureFixture[str], then: str
) -> None:
    """SIGKILL (which no process can defer) while the staged files move in, or just after:
    `--abort` puts everything back byte for byte, `--continue` finishes."""
    root = pinned.root
    before = sha256s(root)
    process = spawn_rebase(root, pinned.cache_dir, "--onto", "0.25.0", "--keep", "0002")
    wait_for(process, lambda: phase(root) in ("swap", "done"))
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    assert phase(root) in ("swap", "done")
    assert cli(capsys, root, "rebase", then)[0] == 0
    assert not (root / ".rebase").exists()
    if then == "--abort":
        assert sha256s(root) == before
    else:
        expect_rebased_onto_0_25_0(root)
        check(capsys, root, 3)


def test_a_second_writer_is_refused_while_a_rebase_runs(
    pinned: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rebases at once, an `--abort` under a running rebase, or a `queue export` during
    one: the second is refused, and the first finishes as if alone. (Before: `--abort` removed
    `.rebase/` under the running rebase.) The first is held still with SIGSTOP while the others
    try."""
    root = pinned.root
    assert cli(capsys, root, "queue", "import")[0] == 0
    process = spawn_rebase(root, pinned.cache_dir, "--onto", "0.25.0", "--keep", "0002")
    wait_for(process, lambda: (root / ".rebase" / "worktree").exists())
    os.killpg(process.pid, signal.SIGSTOP)
    try:
        assert process.poll() is None
        monkeypatch.setenv("VLLM_PATCHSET_LOCK_TIMEOUT", "0")  # refused at once, not after 60 s
        refused = (
            "vllm-patchset: another vllm-patchset rebase, queue or overlay build is running in"
            f" {root} (waited 0 s): nothing was changed\n"
        )
        for args in (("rebase", "--onto", "0.33.0"), ("rebase", "--abort"), ("queue", "export")):
            assert cli(capsys, root, *args) == (1, "", refused)
    finally:
        os.killpg(process.pid, signal.SIGCONT)
    assert process.wait() == 0
    expect_rebased_onto_0_25_0(root)


def test_git_pin_is_found_again_by_its_commit(
    pinned: Project, nightly_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rebase onto a local git ref writes `pin-ref` and `pin-commit`, never the local path:
    the next `check` finds the tree in the mirror by its commit."""
    root = pinned.root
    doc = rebase_json(
        capsys,
        root,
        "--onto-git",
        str(nightly_repo),
        "--ref",
        "v0.21.0",
        "--drop",
        "0001",
        "--drop",
        "0002",
    )
    assert doc["status"] == "done"
    commit = git(nightly_repo, "rev-parse", "v0.21.0^{commit}").strip()
    pyproject = (root / "pyproject.toml").read_text()
    assert f'pin = "0.21.0"\npin-ref = "v0.21.0"\npin-commit = "{commit}"\n' in pyproject
    assert '"vllm==0.24.0"' in pyproject  # a git pin leaves the PyPI requirement alone
    for written in ("pyproject.toml", "overlay/overlay.lock.json", "CHANGELOG.md"):
        assert str(nightly_repo) not in (root / written).read_text()
    check(capsys, root, 1)
    assert Mirror(pinned.cache_dir).git_commit(commit) is not None
