"""infra/config.py as a unit: `[tool.vllm-patchset]` read into a Project (defaults, paths
inside the checkout, a git pin), each bad value refused in one line naming the file and key,
and the checkout found at or above a folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from vllm_patchset.errors import BadInput
from vllm_patchset.infra.config import Project, default_cache_dir

PIN = 'pin = "0.24.0"\n'
COMMIT = "c" * 40
REFUSED = [
    # (the table's lines, the words after "{pyproject}")
    ("", ": [tool.vllm-patchset] has no 'pin'"),
    ('pin = ""\n', ": [tool.vllm-patchset] pin = '': expected a non-empty string"),
    ("pin = 24\n", ": [tool.vllm-patchset] pin = 24: expected a non-empty string"),
    (PIN + 'package = "vl lm"\n', ": [tool.vllm-patchset] package = 'vl lm': not a package name"),
    (
        PIN + 'index-url = "ftp://x"\n',
        ": [tool.vllm-patchset] index-url = 'ftp://x': not an http, https or file URL",
    ),
    (
        PIN + 'series = "../elsewhere"\n',
        ": [tool.vllm-patchset] series = '../elsewhere': not a plain relative path inside the"
        " checkout",
    ),
    (
        PIN + 'lock = "/etc/lock.json"\n',
        ": [tool.vllm-patchset] lock = '/etc/lock.json': not a plain relative path inside the"
        " checkout",
    ),
    (
        PIN + 'pin-commit = "abc"\n',
        ": [tool.vllm-patchset] pin-commit = 'abc': not a full git commit id (40 hex digits)",
    ),
    (
        PIN + 'pin-git = "--upload-pack=x"\n',
        ": [tool.vllm-patchset] pin-git: '--upload-pack=x' is not a URL (https://, http://,"
        " ssh://, git://, file://), user@host:path or a local path",
    ),
    (
        PIN + 'pin-ref = "-x"\n',
        ": [tool.vllm-patchset] pin-ref: '-x' is not a git ref or commit",
    ),
]


def checkout(tmp_path: Path, table: str) -> Path:
    root = tmp_path / "checkout"
    root.mkdir(exist_ok=True)
    (root / "pyproject.toml").write_text(f"[project]\nname = 'x'\n\n[tool.vllm-patchset]\n{table}")
    return root


@pytest.mark.parametrize(("table", "words"), REFUSED)
def test_a_bad_setting_is_one_line(tmp_path: Path, table: str, words: str) -> None:
    root = checkout(tmp_path, table)
    with pytest.raises(BadInput) as error:
        Project.load(root, tmp_path / "cache")
    assert str(error.value) == f"{root / 'pyproject.toml'}{words}"


def test_the_defaults_and_a_git_pin(tmp_path: Path) -> None:
    root = checkout(
        tmp_path, PIN + f'pin-git = "https://g/v"\npin-ref = "main"\npin-commit = "{COMMIT}"\n'
    )
    project = Project.load(root, tmp_path / "cache")
    assert project == Project(
        root=root,
        pin="0.24.0",
        package="vllm",
        index_url="https://pypi.org/simple",
        series_file=root / "patches" / "series",
        upstreamed_file=root / "patches" / "upstreamed" / "series",
        parked_file=root / "patches" / "parked" / "series",
        overlay_dir=root / "overlay",
        lock_path=root / "overlay" / "overlay.lock.json",
        cache_dir=tmp_path / "cache",
        pin_git="https://g/v",
        pin_ref="main",
        pin_commit=COMMIT,
    )
    assert (project.patches_dir, project.pyproject) == (root / "patches", root / "pyproject.toml")


def test_a_path_setting_through_a_symlink_is_refused(tmp_path: Path) -> None:
    root = checkout(tmp_path, PIN)
    (root / "patches").symlink_to(tmp_path)
    with pytest.raises(BadInput) as error:
        Project.load(root, tmp_path / "cache")
    assert str(error.value).startswith(
        f"{root / 'pyproject.toml'}: [tool.vllm-patchset] series: refusing {root / 'patches'}:"
        " it is a symlink"
    )


UNREADABLE = [
    # (the pyproject's bytes, the words after "{pyproject}")
    (None, " is missing: not a vllm-patchset checkout"),
    (
        b"[tool.vllm-patchset\n",
        ": not valid TOML (Expected ']' at the end of a table declaration (at line 1, column 20))",
    ),
    (b"[tool.other]\n", ": no [tool.vllm-patchset] table"),
    (b"\xff", ": not UTF-8 text (byte 0xff at offset 0)"),
]


@pytest.mark.parametrize(("data", "words"), UNREADABLE)
def test_an_unreadable_pyproject_is_one_line(
    tmp_path: Path, data: bytes | None, words: str
) -> None:
    if data is not None:
        (tmp_path / "pyproject.toml").write_bytes(data)
    with pytest.raises(BadInput) as error:
        Project.load(tmp_path)
    assert str(error.value) == f"{tmp_path / 'pyproject.toml'}{words}"


def test_the_checkout_at_or_above(tmp_path: Path) -> None:
    root = checkout(tmp_path, PIN)
    (root / "a" / "b").mkdir(parents=True)
    os.mkfifo(root / "a" / "pyproject.toml")  # passed over, never opened
    assert Project.discover(root / "a" / "b") == root
    assert Project.find_root(root) == root
    assert Project.discover(tmp_path) is None
    with pytest.raises(BadInput) as error:
        Project.find_root(tmp_path)
    assert str(error.value) == (
        "not in a vllm-patchset checkout (no pyproject.toml with [tool.vllm-patchset] at or"
        f" above {tmp_path}): run it in one, or pass --project DIR"
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"VLLM_PATCHSET_CACHE": "/c", "XDG_CACHE_HOME": "/x"}, "/c"),
        ({"XDG_CACHE_HOME": "/x"}, "/x/vllm-patchset"),
    ],
)
def test_default_cache_dir(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    monkeypatch.delenv("VLLM_PATCHSET_CACHE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert default_cache_dir() == Path(expected)
