"""`sync/project_files.py`: the rebase's edits of the project's files. Tables on small texts
(`pyproject.toml`'s pin and requirements, the GPU CI files' image tags, where CHANGELOG.md's
new section goes), then README.md and CHANGELOG.md as they are committed: the lines each edit
changes, exactly (the README's pin line, image tag, wheel name and patch table; the
CHANGELOG's `[Unreleased]` pin line and the new pin's section)."""

from __future__ import annotations

import difflib

import pytest
from support import REPO
from vllm_patchset.errors import BadInput
from vllm_patchset.sync.project_files import (
    insert_entry,
    set_ci_images,
    set_pin,
    set_readme,
    set_torch_comment,
    set_unreleased_pin,
    torch_of,
)

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


PYPROJECT = """\
[project]
name = "p"
# the GPU extras
[project.optional-dependencies]
gpu = ["torch==2.11.0", "vllm==0.24.0"]  # keep this comment

[tool.vllm-patchset]
pin = "0.24.0"  # the pin
package = "vllm"

[tool.other]
x = 1
"""
SET_PIN = [
    # (arguments, the lines that change: old -> new)
    (
        {"pin": "0.25.1"},
        {
            'pin = "0.24.0"  # the pin': 'pin = "0.25.1"  # the pin',
            'gpu = ["torch==2.11.0", "vllm==0.24.0"]  # keep this comment': 'gpu = ["torch==2.11.0", "vllm==0.25.1"]  # keep this comment',
        },
    ),
    (
        {"pin": "1.1", "ref": "v1.1", "commit": "c0ffee", "requirement": False},
        {
            'pin = "0.24.0"  # the pin': 'pin = "1.1"  # the pin\npin-ref = "v1.1"\npin-commit = "c0ffee"'
        },
    ),
    (
        {
            "pin": "1.1",
            "ref": "v1.1",
            "commit": "c0ffee",
            "git_url": "https://github.com/vllm-project/vllm",
            "requirement": False,
        },
        {
            'pin = "0.24.0"  # the pin': 'pin = "1.1"  # the pin\npin-git = "https://github.com/vllm-project/vllm"\npin-ref = "v1.1"\npin-commit = "c0ffee"'
        },
    ),
]


@pytest.mark.parametrize(("arguments", "changes"), SET_PIN)
def test_set_pin_keeps_the_rest_of_the_file(
    arguments: dict[str, object], changes: dict[str, str]
) -> None:
    pin = str(arguments.pop("pin"))
    expected = PYPROJECT
    for old, new in changes.items():
        expected = expected.replace(old, new)
    assert set_pin(PYPROJECT, pin, **arguments) == expected  # type: ignore[arg-type]
    # And back: a release pin drops the git keys again.
    assert set_pin(expected, "0.24.0") == PYPROJECT


REQUIREMENTS = """\
[project]
name = "p"
dependencies = ["gitpython", "vllm == 0.24.0"]

[project.optional-dependencies]
gpu = ["vllm>=0.20", "torch"]
cpu = ["vllm==0.24.0"]

[tool.vllm-patchset]
pin = "0.24.0"
"""
SET_PIN_MORE = [
    # (text, pin, requirement, expected)
    (  # every `vllm==` requirement follows (spaces or not), a range is left alone
        REQUIREMENTS,
        "0.25.0",
        True,
        REQUIREMENTS.replace('"vllm == 0.24.0"', '"vllm==0.25.0"')
        .replace('"vllm==0.24.0"', '"vllm==0.25.0"')
        .replace('pin = "0.24.0"', 'pin = "0.25.0"'),
    ),
    (REQUIREMENTS, "0.25.0", False, REQUIREMENTS.replace('pin = "0.24.0"', 'pin = "0.25.0"')),
    (  # a git pin becomes a release pin: its keys go, the others stay
        '[tool.vllm-patchset]\npin = "1.1"\npin-git = "x"\npin-ref = "v1.1"\npin-commit = "c"\n'
        'index-url = "u"\n',
        "0.25.0",
        True,
        '[tool.vllm-patchset]\npin = "0.25.0"\nindex-url = "u"\n',
    ),
]


@pytest.mark.parametrize(("text", "pin", "requirement", "expected"), SET_PIN_MORE)
def test_set_pin_requirements_and_git_keys(
    text: str, pin: str, requirement: bool, expected: str
) -> None:
    assert set_pin(text, pin, requirement=requirement) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[tool.other]\nx = 1\n", "pyproject.toml: no `pin` in [tool.vllm-patchset]"),
        ("[tool.vllm-patchset\npin = 1\n", "pyproject.toml: not valid TOML ("),
    ],
)
def test_set_pin_refuses(text: str, message: str) -> None:
    with pytest.raises(BadInput) as error:
        set_pin(text, "0.25.0")
    assert str(error.value).startswith(message)


CI = """\
jobs:
  cuda:
    name: CUDA (vLLM 0.24.0 image)
    container:
      image: vllm/vllm-openai:v0.24.0
  rocm:
    name: ROCm (vLLM 0.24.0 image)  # vLLM PR #46254 shipped untested on ROCm
    container:
      image: vllm/vllm-openai-rocm:v0.24.0
      plugin: docker#v5.12.0
"""


@pytest.mark.parametrize("version", ["0.25.1", "0.26.0rc1"])
def test_ci_images_follow_the_pin(version: str) -> None:
    assert set_ci_images(CI, version) == CI.replace("0.24.0", version)


CHANGELOG_CASES = [
    (
        "",
        "# Changelog\n\nAll notable changes to this patch set are documented in this file.\nThe format is based on [Keep a Changelog](https://keepachangelog.com/en/1.1.0/).\n\n## [Unreleased]\n\nE\n",
    ),
    ("# C\n\n## [Unreleased]\n\n- x\n", "# C\n\n## [Unreleased]\n\n- x\n\nE\n"),
    (
        "# C\n\n## [Unreleased]\n- x\n\n## [vllm-0.24.0] - d\n- y\n",
        "# C\n\n## [Unreleased]\n- x\n\nE\n\n## [vllm-0.24.0] - d\n- y\n",
    ),
    ("# C\n\n## [vllm-0.24.0] - d\n- y\n", "# C\n\nE\n\n## [vllm-0.24.0] - d\n- y\n"),
    ("# C\n\n## Unreleased\n- x", "# C\n\n## Unreleased\n- x\n\nE\n"),  # no brackets, no \n
    (
        "# C\n\n## [unreleased]\n\n## [vllm-1.0] - d\n",
        "# C\n\n## [unreleased]\n\nE\n\n## [vllm-1.0] - d\n",
    ),
    ("# C\n", "# C\n\nE\n"),  # no section yet
]


@pytest.mark.parametrize(("changelog", "expected"), CHANGELOG_CASES)
def test_changelog_entry_goes_after_unreleased(changelog: str, expected: str) -> None:
    assert insert_entry(changelog, "E\n") == expected


PYPROJECT_COMMENT = "# the one it is built for (0.24.0: torch 2.11.0), so a rebase moves\n"
CHANGELOG_PIN = (
    "# Changelog\n\n## [Unreleased]\n\n### Pin\n- vllm **0.24.0** (sdist sha256 `ab`).\n\n"
    "## [vllm-0.24.0] - 2026-06-27\n\n- vllm **0.24.0** (kept: a released section)\n"
)


def test_the_pins_other_mentions() -> None:
    cuda = "-r common.txt\n\n# NVIDIA\ntorch==2.14.0\ntorchaudio==2.11.0\n"
    assert torch_of(cuda) == "2.14.0"
    assert torch_of("numba == 0.65.0\n") is None
    assert set_torch_comment(PYPROJECT_COMMENT, "0.33.0", "2.14.0") == (
        "# the one it is built for (0.33.0: torch 2.14.0), so a rebase moves\n"
    )
    assert set_torch_comment(PYPROJECT_COMMENT, "0.34.0", None) == (
        "# the one it is built for (0.34.0: torch: see its requirements), so a rebase moves\n"
    )
    assert set_unreleased_pin(CHANGELOG_PIN, "0.25.0", "cd") == CHANGELOG_PIN.replace(
        "- vllm **0.24.0** (sdist sha256 `ab`).", "- vllm **0.25.0** (sdist sha256 `cd`)."
    )


README_TEXT = """\
The pin is **vllm 0.24.0** (`pyproject.toml`).

```dockerfile
FROM vllm/vllm-openai:v0.24.0
```

| patch | fixes | upstream | on 0.24.0 |
|---|---|---|---|
| `patches/0001-a.patch` | the bug | 0.25.0 | applies |
| `patches/0002-b.patch` | slow | — | applies |
| `patches/upstreamed/0001-c.patch` | old bug | 0.21.0 | upstream (kept as a guard) |
"""


def test_the_readme_follows_the_pin() -> None:
    rows = {
        "0001-a.patch": ("upstreamed/0001-a.patch", "0.25.0", "upstream"),
        "0002-b.patch": None,  # dropped
        "upstreamed/0001-c.patch": ("upstreamed/0001-c.patch", "0.21.0", "upstream"),
    }
    assert set_readme(README_TEXT, "0.24.0", "0.25.0", rows) == (
        README_TEXT.replace("0.24.0", "0.25.0")
        .replace(
            "| `patches/0001-a.patch` | the bug | 0.25.0 | applies |",
            "| `patches/upstreamed/0001-a.patch` | the bug | 0.25.0 | upstream |",
        )
        .replace("| `patches/0002-b.patch` | slow | — | applies |\n", "")
    )


GIT_PIN = {"ref": "v1.1", "commit": "c0ffee", "requirement": False}


def test_set_pin_places_the_git_keys_under_the_pin() -> None:
    """Through tomlkit's public API only (its private insertion left in 0.15.3, and with it
    the rebase's git pins): the git keys go under the pin line of [tool.vllm-patchset],
    however its name is quoted, not under another table's `pin`."""
    text = '[tool.other]\npin = 1\n\n[tool."vllm-patchset"]  # ours\npin = "0.24.0"\n\n# end\n'
    assert set_pin(text, "1.1", **GIT_PIN) == (  # type: ignore[arg-type]
        '[tool.other]\npin = 1\n\n[tool."vllm-patchset"]  # ours\npin = "1.1"\n'
        'pin-ref = "v1.1"\npin-commit = "c0ffee"\n\n# end\n'
    )


PINNED = {"pin": "1.1", "pin-ref": "v1.1", "pin-commit": "c0ffee"}
DECOY = "[tool.vllm-patchset]\npin = 1\n"
ELSEWHERE = [
    # (pyproject.toml, the document set_pin must give): no `pin =` line of the table to go under
    (  # dotted keys
        '[tool]\nvllm-patchset.pin = "0.24.0"\nx = 1\n',
        {"tool": {"vllm-patchset": PINNED, "x": 1}},
    ),
    (  # the table's header and a pin line inside another table's multi-line string first
        f'[tool.other]\nx = """\n{DECOY}"""\n\n[tool.vllm-patchset]\npin = "0.24.0"\n',
        {"tool": {"other": {"x": DECOY}, "vllm-patchset": PINNED}},
    ),
]


@pytest.mark.parametrize(("text", "document"), ELSEWHERE)
def test_set_pin_where_no_pin_line_is_found_adds_the_keys_as_tomlkit_does(
    text: str, document: dict[str, object]
) -> None:
    """Where the text search finds no pin line of the table, or a wrong one, the keys go where
    tomlkit adds them: the document a git pin means, every other value as it was."""
    import tomlkit

    got = tomlkit.parse(set_pin(text, "1.1", **GIT_PIN)).unwrap()  # type: ignore[arg-type]
    assert got == document
