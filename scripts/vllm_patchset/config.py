"""The project's settings, read from `[tool.vllm-patchset]` in pyproject.toml."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from vllm_patchset.errors import BadInput


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
        [tool.vllm-patchset]."""
        for folder in (start, *start.parents):
            pyproject = folder / "pyproject.toml"
            if pyproject.is_file() and "[tool.vllm-patchset]" in pyproject.read_text("utf-8"):
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
        try:
            settings = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))["tool"][
                "vllm-patchset"
            ]
            return Project(
                root=root,
                pin=str(settings["pin"]),
                package=str(settings.get("package", "vllm")),
                index_url=str(settings.get("index-url", "https://pypi.org/simple")).rstrip("/"),
                series_file=root / settings.get("series", "patches/series"),
                upstreamed_file=root / settings.get("upstreamed", "patches/upstreamed/series"),
                parked_file=root / settings.get("parked", "patches/parked/series"),
                overlay_dir=root / settings.get("overlay", "overlay"),
                lock_path=root / settings.get("lock", "overlay/overlay.lock.json"),
                cache_dir=cache_dir or default_cache_dir(),
                pin_git=settings.get("pin-git"),
                pin_ref=settings.get("pin-ref"),
                pin_commit=settings.get("pin-commit"),
            )
        except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
            raise BadInput(
                f"{root / 'pyproject.toml'}: bad [tool.vllm-patchset] ({exc!r})"
            ) from None
