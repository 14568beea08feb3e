"""A one-line fix of a tiny module, and the trees it is classified on (upstream fixed it,
joined its line, moved its module, copied its bug, rewrote it...), made from texts in one bare
repository: the unit tests of the classification's modules (tests/series/) share them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from vllm_patchset.infra.gitrepo import Repo, init_bare
from vllm_patchset.series.patches import Patch, parse_patch_bytes

TRAILERS = (
    "Upstream-PR: https://github.com/vllm-project/vllm/pull/1\nIntroduced-by: abc\n"
    "Introduced-in: 1.0\nApplied-upstream:\nRegression-test: tests/t.py::t\n"
)
MOE = "vllm/moe.py"
OTHER = "vllm/other.py"
BUG = "self.a1_scale or self.a1_gscale"
BASE = f"""\
class Experts:
    def apply(self, x):
        scale = {BUG}
        return x * scale

    def name(self):
        return "experts"
"""
FIXED = BASE.replace(BUG, "self.a1_scale")
SUBCLASS = f"""\
from vllm.moe import Experts


class Emulated(Experts):
    def apply(self, x):
        scale = {BUG}
        return x / scale
"""
GONE = BASE.replace(f"        scale = {BUG}\n        return x * scale\n", "        return x\n")
# The trees the fix is classified on, by name: its file(s) and their texts.
ON: dict[str, dict[str, str]] = {
    "pin": {MOE: BASE},
    "fixed": {MOE: FIXED},
    "joined": {MOE: BASE.replace(BUG, "self.a1_scale \\\n            or self.a1_gscale")},
    "commented": {
        MOE: FIXED.replace("        scale =", f"        # scale = {BUG}\n        scale =")
    },
    "changed": {MOE: BASE.replace("return x * scale", "return x * scale * 2")},
    "moved": {"vllm/layers/moe.py": BASE},
    "gone": {MOE: GONE},
    "copied": {MOE: BASE, OTHER: SUBCLASS},
    "helper": {MOE: GONE, OTHER: SUBCLASS},
    "twice": {MOE: BASE + BASE.replace("class Experts:", "\n\nclass Experts2:")},
}


class Trees:
    """A bare repository that makes trees of texts, and patches between two of them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.repo: Repo = init_bare(root / "repo.git")
        self.made: dict[str, str] = {}

    def tree(self, files: Mapping[str, str]) -> str:
        folder = self.root / f"tree-{len(self.made)}"
        for path, text in files.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(text)
        tree = self.repo.tree_from_directory(folder)
        self.made[folder.name] = tree
        return tree

    def on(self, name: str) -> str:
        """The tree `ON[name]`."""
        return self.tree(ON[name])

    def patch(
        self, before: Mapping[str, str], after: Mapping[str, str], trailers: str = TRAILERS
    ) -> Patch:
        """The patch that makes `after` of `before` (its message: a subject, why, `trailers`)."""
        old = self.repo.commit_tree(self.tree(before), "base")
        new = self.repo.commit_tree(self.tree(after), f"x: a fix\n\nWhy.\n\n{trailers}", old)
        ((name, raw),) = self.repo.format_patches(old, new)
        return parse_patch_bytes(raw, Path(name))

    def fix(self) -> Patch:
        """The one-line fix of `BASE`."""
        return self.patch({MOE: BASE}, {MOE: FIXED})
