"""The rebase's edits of README.md and CHANGELOG.md (`series/edits.py`) on the files as they
are committed: the lines each edit changes, exactly (the README's pin line, image tag, wheel
name and patch table; the CHANGELOG's `[Unreleased]` pin line and the new pin's section)."""

from __future__ import annotations

import difflib

from support import REPO
from vllm_patchset.series.edits import insert_entry, set_readme, set_unreleased_pin

FIX2 = "0001-triton_moe-no-tensor-truthiness-when-quantizing-defe.patch"
NVFP4 = "0002-nvfp4_emulation_moe-fused-NVFP4-GEMMs-over-the-route.patch"
ARCHIVED = "upstreamed/0001-nvfp4-oracle-take-the-E2M1-table-s-device-from-w13.patch"


def changed(old: str, new: str) -> list[str]:
    """The lines removed (`-`, in order), then the lines added (`+`, in order)."""
    diff = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
    lines = [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    return [line for line in lines if line[0] == "-"] + [line for line in lines if line[0] == "+"]


def test_the_readme_follows_a_rebase_onto_0_25_0() -> None:
    readme = (REPO / "README.md").read_text()
    rows: dict[str, tuple[str, str, str] | None] = {
        FIX2: (f"upstreamed/{FIX2}", "0.25.0", "upstream"),
        NVFP4: (NVFP4, "", "conflict"),
    }
    new = set_readme(readme, "0.24.0", "0.25.0", rows)
    fix2_cell = next(line for line in readme.splitlines() if line.startswith(f"| `patches/{FIX2}`"))
    nvfp4_cell = next(
        line for line in readme.splitlines() if line.startswith(f"| `patches/{NVFP4}`")
    )
    fixes2 = fix2_cell.split(" | ")[1]
    fixes_nvfp4 = nvfp4_cell.split(" | ")[1]
    assert changed(readme, new) == [
        "-release that has them. The pin is **vllm 0.24.0** (`[tool.vllm-patchset]` in `pyproject.toml`).",
        "-| patch | fixes | upstream | on 0.24.0 |",
        f"-{fix2_cell}",
        f"-{nvfp4_cell}",
        "-It writes `dist/vllm_patchset-0.1.0+vllm0.24.0.<lock>-py3-none-any.whl`: the tool with the",
        "-FROM vllm/vllm-openai:v0.24.0",
        "+release that has them. The pin is **vllm 0.25.0** (`[tool.vllm-patchset]` in `pyproject.toml`).",
        "+| patch | fixes | upstream | on 0.25.0 |",
        f"+| `patches/upstreamed/{FIX2}` | {fixes2} | 0.25.0 | upstream |",
        f"+| `patches/{NVFP4}` | {fixes_nvfp4} | — | conflict |",
        "+It writes `dist/vllm_patchset-0.1.0+vllm0.25.0.<lock>-py3-none-any.whl`: the tool with the",
        "+FROM vllm/vllm-openai:v0.25.0",
    ]
    # The archived fix's row is not the rebase's to change here (no row given for it).
    assert f"| `patches/{ARCHIVED}` |" in new


def test_the_changelog_follows_a_rebase_onto_0_25_0() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    new = set_unreleased_pin(changelog, "0.25.0", "ab" * 32)
    assert changed(changelog, new) == [
        "-- vllm **0.24.0** (sdist sha256 `0862453adc1f3339f1a0c9dca1179c34d6ed6e118f87b6e5bddd120af614ac66`).",
        f"+- vllm **0.25.0** (sdist sha256 `{'ab' * 32}`).",
    ]
    entry = "## [vllm-0.25.0] - 2026-12-03\n\n### Pin\n- vllm **0.25.0** (was 0.24.0).\n"
    inserted = insert_entry(new, entry)
    heads = [line for line in inserted.splitlines() if line.startswith("## ")]
    assert heads == ["## [Unreleased]", "## [vllm-0.25.0] - 2026-12-03"]
    assert inserted == new.rstrip("\n") + "\n\n" + entry  # newest first, under [Unreleased]
