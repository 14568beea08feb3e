"""The project's settings, read from `[tool.vllm-patchset]` in pyproject.toml."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_patchset.errors import BadInput, PatchsetError
from vllm_patchset.infra.fsio import no_symlink_below, plain_parts, read_regular
from vllm_patchset.infra.gitargs import check_rev, check_source


def default_cache_dir() -> Path:
    if env := os.environ.get("VLLM_PATCHSET_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vllm-patchset"


@dataclass(frozen=True)
class Project:
    root: Path
    pin: str
    package: str
    index_url: str
    series_file: Path
    upstreamed_file: Path
    parked_file: Path  # patches kept but not applied, each with the reason
    overlay_dir: Path
    lock_path: Path
    cache_dir: Path
    # A pin on a git ref instead of a PyPI release (set by `rebase --onto-git`): the ref and
    # the repository's commit, and the repository only when it is a URL others can fetch.
    pin_git: str | None = None
    pin_ref: str | None = None
    pin_commit: str | None = None

    @property
    def patches_dir(self) -> Path:
        return self.series_file.parent

    @property
    def pyproject(self) -> Path:
        return self.root / "pyproject.toml"

    @staticmethod
    def discover(start: Path) -> Path | None:
        """The checkout at or above `start`: the first dir whose pyproject.toml has
        [tool.vllm-patchset]. A pyproject.toml that is not a regular file (a FIFO) is passed
        over, never opened."""
        for folder in (start, *start.parents):
            try:
                data = read_regular(folder / "pyproject.toml", limit=MAX_PYPROJECT)
            except (PatchsetError, OSError):
                continue
            if data is not None and b"[tool.vllm-patchset]" in data:
                return folder
        return None

    @staticmethod
    def find_root(start: Path) -> Path:
        root = Project.discover(start)
        if root is None:
            raise BadInput(
                f"not in a vllm-patchset checkout (no pyproject.toml with [tool.vllm-patchset]"
                f" at or above {start}): run it in one, or pass --project DIR"
            )
        return root

    @staticmethod
    def load(root: Path | None = None, cache_dir: Path | None = None) -> Project:
        root = Project.find_root(Path.cwd()) if root is None else root.resolve()
        pyproject = root / "pyproject.toml"
        settings = _settings(pyproject)
        values = _Values(pyproject, settings)
        pin_commit = values.optional("pin-commit")
        if pin_commit is not None and not re.fullmatch(r"[0-9a-f]{40}", pin_commit):
            raise values.bad("pin-commit", "not a full git commit id (40 hex digits)")
        pin_git = values.optional("pin-git")
        pin_ref = values.optional("pin-ref")
        try:
            if pin_git is not None:
                check_source(pin_git, "pin-git:")
            if pin_ref is not None:
                check_rev(pin_ref, "pin-ref:")
        except BadInput as exc:
            raise BadInput(f"{pyproject}: [tool.vllm-patchset] {exc}") from None
        package = values.string("package", "vllm")
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", package):
            raise values.bad("package", "not a package name")
        index_url = values.string("index-url", "https://pypi.org/simple").rstrip("/")
        if not re.match(r"(https?|file)://[^\s]+$", index_url):
            raise values.bad("index-url", "not an http, https or file URL")
        return Project(
            root=root,
            pin=values.string("pin"),
            package=package,
            index_url=index_url,
            series_file=values.path("series", "patches/series"),
            upstreamed_file=values.path("upstreamed", "patches/upstreamed/series"),
            parked_file=values.path("parked", "patches/parked/series"),
            overlay_dir=values.path("overlay", "overlay"),
            lock_path=values.path("lock", "overlay/overlay.lock.json"),
            cache_dir=cache_dir or default_cache_dir(),
            pin_git=pin_git,
            pin_ref=pin_ref,
            pin_commit=pin_commit,
        )


MAX_PYPROJECT = 4 << 20


def _settings(pyproject: Path) -> dict[str, Any]:
    """`[tool.vllm-patchset]` of `pyproject`, read as a regular file (a FIFO is refused, never
    opened), UTF-8 and TOML; one line naming the file otherwise."""
    try:
        data = read_regular(pyproject, limit=MAX_PYPROJECT + 1)
    except PatchsetError as exc:  # it names the file
        raise BadInput(str(exc)) from None
    if data is None:
        raise BadInput(f"{pyproject} is missing: not a vllm-patchset checkout")
    if len(data) > MAX_PYPROJECT:
        raise BadInput(f"{pyproject} is larger than {MAX_PYPROJECT} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(
            f"{pyproject}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    import tomllib  # here: the deploy commands import this module on Python 3.10

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{pyproject}: not valid TOML ({exc})") from None
    tool = doc.get("tool")
    settings = tool.get("vllm-patchset") if isinstance(tool, dict) else None
    if not isinstance(settings, dict):
        raise BadInput(f"{pyproject}: no [tool.vllm-patchset] table")
    return settings


class _Values:
    """The typed, checked values of `[tool.vllm-patchset]`."""

    def __init__(self, pyproject: Path, settings: dict[str, Any]) -> None:
        self.pyproject, self.settings, self.root = pyproject, settings, pyproject.parent

    def bad(self, key: str, why: str) -> BadInput:
        value = self.settings.get(key)
        return BadInput(f"{self.pyproject}: [tool.vllm-patchset] {key} = {value!r}: {why}")

    def optional(self, key: str) -> str | None:
        value = self.settings.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise self.bad(key, "expected a non-empty string")
        return value

    def string(self, key: str, default: str | None = None) -> str:
        if key not in self.settings and default is not None:
            return default
        if key not in self.settings:
            raise BadInput(f"{self.pyproject}: [tool.vllm-patchset] has no {key!r}")
        value = self.optional(key)
        assert value is not None
        return value

    def path(self, key: str, default: str) -> Path:
        """A path inside the checkout: plain and relative (no `..`, no absolute path), with no
        symlink on the way below the checkout (nothing is written or removed through one)."""
        rel = self.string(key, default).rstrip("/")
        parts = plain_parts(rel)
        if parts is None:
            raise self.bad(key, "not a plain relative path inside the checkout")
        try:
            return no_symlink_below(self.root, parts)
        except PatchsetError as exc:
            raise BadInput(f"{self.pyproject}: [tool.vllm-patchset] {key}: {exc}") from None
