"""Classes of upstream change, not cases: one synthetic upstream per family (a revert, a revert
that leaves the fixed text in a comment, a string or a dead branch, copies of the bug, moves,
renames, a package split, a symlink, a deep expression), each applied to every patch of a
series shaped like the real one (the archived fix, fix 0001, the local 0002). The truth is read
from the built tree's code by one reader (`live_bugs`: `ast`, dead branches and strings left
out): wherever the bug is live in the tree the walk builds, the verdict is a stop that names
every place, and its decisions never leave the bug live as the only way out.

One upstream for the module: release 1.0 (the pin) and one release per (family, patch), each
the pin's tree plus one commit; projects pinned to 1.0, built once.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import cli, git, rebase_json
from synthetic import PatchSpec, SyntheticUpstream, make_project
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.build import patches_for, walk
from vllm_patchset.overlay.upstream import Mirror
from vllm_patchset.series.verdict import Verdict
from vllm_patchset.sync.rebase_rules import options
from vllm_patchset.sync.rebase_state import Choice, Section

ORACLE = "vllm/oracle/nvfp4.py"
TRITON = "vllm/experts/triton_moe.py"
EMU = "vllm/experts/emulation.py"
MK = "vllm/modular_kernel.py"
LINEAR = "vllm/linear.py"  # unrelated code that shares the bugs' lines: never "the bug"

ORACLE_BUG = "        table.val = table.val.to(layer.weight.device)\n"
ORACLE_FIX = "        table.val = table.val.to(w13.device)\n"
ORACLE_TEXT = f'''\
"""The NVFP4 oracle."""


def make_table():
    return Table()


def convert_to_kernel_format(layer, w13, backend):
    """Convert the weights to the kernel's format."""
    table = make_table()
    if backend == "native":
        return w13
    elif backend == "emulation":
        # Move the table to the device now: `.to(device)` is not allowed
        # during CUDA graph capture.
{ORACLE_FIX}
        if layer.a13_scale is None:
            raise ValueError("no scale")
    return w13
'''
TRITON_BUG = "                self.a1_scale or self.a1_gscale,\n"
TRITON_FIX = "                self.a1_scale,\n"
TRITON_TEXT = f'''\
"""The Triton experts."""

import vllm.modular_kernel as mk
from vllm.lora import LoRAExpertsMixin


def quantize_input(hidden, scale, dtype):
    return hidden * scale, dtype


class TritonExperts(LoRAExpertsMixin, mk.ExpertsModular):
    """The Triton experts."""

    def __init__(self, a1_scale=None, a1_gscale=1.0):
        self.a1_scale = a1_scale
        self.a1_gscale = a1_gscale
        self.quant_dtype = "fp8"

    def apply(self, hidden):
        if self.quant_dtype is not None:
            hidden, a1q_scale = quantize_input(
                hidden,
{TRITON_BUG}                self.quant_dtype,
            )
        return hidden

    def name(self):
        return "triton"
'''
EMU_BUG = (
    "        out = [dequantize(h) for h in hidden]\n        out = [round(h, 3) for h in out]\n"
)
EMU_FIX = "        out = fused_emulation(hidden, digits=3)\n"
EMU_TEXT = f'''\
"""NVFP4 emulation."""

from vllm.experts.triton_moe import TritonExperts


class EmulationExperts(TritonExperts):
    """Experts that emulate NVFP4."""

    def apply(self, hidden):
        self.calls = 1
{EMU_BUG}        return super().apply(out)

    def name(self):
        return "emulation"
'''
MK_TEXT = '''\
"""The modular kernel."""


class ExpertsBase:
    """The base of every experts class."""

    def finalize(self, out):
        return out


class ExpertsModular(ExpertsBase):
    """Experts of the modular kernel."""

    def workspace(self, n):
        return [0] * n
'''
LINEAR_TEXT = '''\
"""Linear layers: their a1_scale is a tensor attribute, or None."""


class LinearMethod:
    def process_weights(self, layer):
        table = load()
        table.val = table.val.to(layer.weight.device)
        scale = self.a1_scale or self.a1_gscale
        return table, scale
'''
BASE = {
    "vllm/__init__.py": "",
    ORACLE: ORACLE_TEXT,
    TRITON: TRITON_TEXT,
    EMU: EMU_TEXT,
    MK: MK_TEXT,
    LINEAR: LINEAR_TEXT,
    "vllm/lora.py": "class LoRAExpertsMixin:\n    pass\n",
}


@dataclasses.dataclass(frozen=True)
class Fix:
    """A patch of the series, as the families see it: its file, scope, bug and fix lines,
    and the bug as an expression the truth reader looks for."""

    key: str
    path: str
    scope: tuple[str, ...]  # the class and method (or function) of the bug
    bug: str  # the lines the patch removes
    fix: str  # the lines it adds
    expression: str  # the bug, as `ast.unparse` writes it
    statement: str = ""  # the first line of the statement that holds it (default: the bug's)

    @property
    def before(self) -> str:
        return self.statement or self.bug.splitlines(keepends=True)[0]

    def text(self) -> str:
        return BASE[self.path]


ARCHIVED = Fix(
    "upstreamed/0001-oracle-device-from-w13.patch",
    ORACLE,
    ("convert_to_kernel_format",),
    ORACLE_BUG,
    ORACLE_FIX,
    "layer.weight.device",
)
FIX1 = Fix(
    "0001-triton-no-tensor-truthiness.patch",
    TRITON,
    ("TritonExperts", "apply"),
    TRITON_BUG,
    TRITON_FIX,
    "self.a1_scale or self.a1_gscale",
    "            hidden, a1q_scale = quantize_input(\n",
)
LOCAL = Fix(
    "0002-emulation-fused.patch",
    EMU,
    ("EmulationExperts", "apply"),
    EMU_BUG,
    EMU_FIX,
    "[dequantize(h) for h in hidden]",
)
FIXES = (ARCHIVED, FIX1, LOCAL)
SPECS = {
    ARCHIVED.key: PatchSpec(
        ARCHIVED.key.split("/")[1],
        {ORACLE: (ORACLE_BUG, ORACLE_FIX)},
        subject="oracle: the device from w13",
        introduced_in="0.9",
        applied_upstream="1.0",
        base="0.9",
    ),
    FIX1.key: PatchSpec(
        FIX1.key, {TRITON: (TRITON_BUG, TRITON_FIX)}, subject="triton: no tensor truthiness"
    ),
    LOCAL.key: PatchSpec(
        LOCAL.key,
        {EMU: (EMU_BUG, EMU_FIX)},
        subject="emulation: fused",
        upstream_pr="none (local)",
        introduced_by="none",
    ),
}


# -- the families: the pin's files, changed for one patch -----------------------------------------
def buggy(fix: Fix) -> str:
    """The patch's file with its bug live (the archived fix's bug is fixed on the pin)."""
    return fix.text().replace(fix.fix, fix.bug) if fix is ARCHIVED else fix.text()


def fixed(fix: Fix) -> str:
    return fix.text() if fix is ARCHIVED else fix.text().replace(fix.bug, fix.fix)


def _commented(lines: str) -> str:
    return "".join(
        f"{line[: len(line) - len(line.lstrip())]}# was: {line.strip()}\n"
        for line in lines.splitlines()
    )


def _indented(lines: str, by: int) -> str:
    return "".join(" " * by + line + "\n" for line in lines.splitlines())


def _method(text: str, scope: tuple[str, ...]) -> str:
    """The source lines of the scope's (last) function, as they are in `text`."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == scope[-1]:
            lines = text.splitlines(keepends=True)
            return "".join(lines[node.lineno - 1 : node.end_lineno])
    raise AssertionError(scope)


Changes = dict[str, str | None]


def revert(fix: Fix) -> Changes:
    return {fix.path: buggy(fix)}


def revert_fix_in_a_comment(fix: Fix) -> Changes:
    return {fix.path: buggy(fix).replace(fix.bug, _commented(fix.fix) + fix.bug)}


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def revert_fix_in_a_string(fix: Fix) -> Changes:
    indent = _indent(fix.before)
    note = f'{indent}"""The fix, for later:\n\n{fix.fix}{indent}"""\n'
    return {fix.path: buggy(fix).replace(fix.before, note + fix.before)}


def revert_fix_in_dead_code(fix: Fix) -> Changes:
    indent = _indent(fix.before)
    delta = len(_indent(fix.fix)) - len(indent)
    body = "".join(f"{indent}    {line[delta:]}\n" for line in fix.fix.splitlines())
    dead = f"{indent}if False:  # the fix, off for now\n{body}"
    return {fix.path: buggy(fix).replace(fix.before, dead + fix.before)}


def revert_in_other_words(fix: Fix) -> Changes:
    """The bug back, written otherwise (a name of its own), the fix only in a comment."""
    other = f"{_indent(fix.before)}bug = {fix.expression}\n"
    reworded = fix.bug.replace(fix.expression, "bug")
    anchor = fix.statement or reworded.splitlines(keepends=True)[0]
    text = buggy(fix).replace(fix.bug, _commented(fix.fix) + reworded)
    return {fix.path: text.replace(anchor, other + anchor)}


def copy_in_the_same_file(fix: Fix) -> Changes:
    """The bug's function copied under another name, in the same file (the site as it was)."""
    text = buggy(fix) if fix is ARCHIVED else fix.text()
    method = _method(text, fix.scope)
    copy = method.replace(f"def {fix.scope[-1]}(", f"def {fix.scope[-1]}_reference(")
    return {fix.path: text.replace(method, method + "\n" + copy)}


def copy_in_another_file(fix: Fix) -> Changes:
    """Fixed in its file; the whole buggy file copied into a new module."""
    return {fix.path: fixed(fix), fix.path.replace(".py", "_v2.py"): buggy(fix)}


def copy_beside_an_upstream_fix(fix: Fix) -> Changes:
    """Fixed where it was; the buggy function copied beside it in the same file."""
    text = fixed(fix)
    method = _method(buggy(fix), fix.scope)
    copy = method.replace(f"def {fix.scope[-1]}(", f"def {fix.scope[-1]}_legacy(")
    mine = _method(text, fix.scope)
    return {fix.path: text.replace(mine, mine + "\n" + copy)}


def _helper(fix: Fix) -> tuple[str, str]:
    """The bug's first line as a call of a helper, and the helper (a method)."""
    line = fix.bug.splitlines()[0]
    indent = line[: len(line) - len(line.lstrip())]
    call = line.replace(fix.expression, "self._bug()")
    helper = f"    def _bug(self):\n        return {fix.expression}\n\n"
    rest = fix.bug[len(line) + 1 :]
    del indent
    return call + "\n" + rest, helper


def move_to_a_helper(fix: Fix) -> Changes:
    call, helper = _helper(fix)
    text = buggy(fix).replace(fix.bug, call)
    if len(fix.scope) == 1:  # a module function: a module helper
        helper = "def _bug(layer):\n    return layer.weight.device\n\n\n"
        text = text.replace("self._bug()", "_bug(layer)").replace(
            f"def {fix.scope[0]}(", helper + f"def {fix.scope[0]}("
        )
        return {fix.path: text}
    first = f"    def {fix.scope[-1]}("
    return {fix.path: text.replace(first, helper + first)}


def move_to_a_base_class(fix: Fix) -> Changes:
    """The bug moved into a helper of the base class of the base class (modular_kernel.py)."""
    if len(fix.scope) == 1:
        return move_to_a_helper(fix)
    call, helper = _helper(fix)
    base = MK_TEXT.replace("    def finalize(", helper + "    def finalize(")
    return {fix.path: buggy(fix).replace(fix.bug, call), MK: base}


FAMILIES: dict[str, Callable[[Fix], Changes]] = {
    "revert": revert,
    "revert, fix in a comment": revert_fix_in_a_comment,
    "revert, fix in a string": revert_fix_in_a_string,
    "revert, fix in dead code": revert_fix_in_dead_code,
    "revert in other words": revert_in_other_words,
    "copy in the same file": copy_in_the_same_file,
    "copy in another file": copy_in_another_file,
    "copy beside an upstream fix": copy_beside_an_upstream_fix,
    "move to a helper": move_to_a_helper,
    "move to a base class": move_to_a_base_class,
    "rename": lambda fix: {},
    "package split": lambda fix: {},
}
# git mv, done before the changes (git's rename detection sees them; `matrix` does not ask).
RENAMES: dict[str, Callable[[Fix], dict[str, str]]] = {
    "rename": lambda fix: {fix.path: fix.path.replace(".py", "_impl.py")},
    "package split": lambda fix: {fix.path: fix.path.removesuffix(".py") + "/__init__.py"},
}
CASES = [(family, fix) for family in FAMILIES for fix in FIXES]
# A generated 1,200-term expression: past the readers' bounds (before: a RecursionError).
DEEP = "TABLE = " + " + ".join(["1"] * 1200) + "\n"
DEEP_ELSEWHERE = {"vllm/tables.py": f'"""Generated: or self.a1_gscale."""\n\n{DEEP}'}


def version_of(family: str, fix: Fix) -> str:
    return f"2.{list(FAMILIES).index(family)}.{FIXES.index(fix)}"


# -- the truth, from the built tree -------------------------------------------------------------
def _dead(node: ast.If) -> bool:
    test = node.test
    if isinstance(test, ast.Constant) and not test.value:
        return True
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", "")
    return name == "TYPE_CHECKING"


def live_bugs(files: dict[str, str], expression: str) -> list[str]:
    """`path:line (scope)` of every live place of `expression` in the tree's code (dead
    branches and strings are not code that runs; the unrelated linear module is left out)."""
    places: list[str] = []

    def visit(node: ast.AST, path: str, scope: tuple[str, ...]) -> Iterator[str]:
        if isinstance(node, ast.If) and _dead(node):
            for branch in node.orelse:
                yield from visit(branch, path, scope)
            return
        if isinstance(node, ast.expr) and ast.unparse(node) == expression:
            yield f"{path}:{node.lineno} ({'.'.join(scope) or '<module>'})"
            return
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, ast.ClassDef | ast.FunctionDef):
                inner = (*scope, child.name)
            yield from visit(child, path, inner)

    for path, text in sorted(files.items()):
        if path.endswith(".py") and path != LINEAR:
            places += visit(ast.parse(text), path, ())
    return places


@dataclasses.dataclass(frozen=True)
class World:
    upstream: SyntheticUpstream
    cache: Path
    project: Path  # pinned to 1.0: the archived fix, 0001 and 0002


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    folder = tmp_path_factory.mktemp("families")
    upstream = SyntheticUpstream(folder / "upstream")
    upstream.release("0.9", {**BASE, ORACLE: buggy(ARCHIVED)})
    upstream.release("1.0", BASE)
    for family, fix in CASES:
        renames = RENAMES[family](fix) if family in RENAMES else {}
        upstream.release(
            version_of(family, fix), FAMILIES[family](fix), base="1.0", renames=renames
        )
    for fix in FIXES:
        upstream.release(f"3.0.{FIXES.index(fix)}", {fix.path: fixed(fix) + DEEP}, base="1.0")
    upstream.release("3.1", DEEP_ELSEWHERE, base="1.0")
    cache = tmp_path_factory.getbasetemp() / "synthetic-cache"
    cache.mkdir(exist_ok=True)
    project = make_project(
        folder / "project",
        cache,
        upstream,
        "1.0",
        series=[SPECS[FIX1.key], SPECS[LOCAL.key]],
        upstreamed=[SPECS[ARCHIVED.key]],
    )
    tests = project.root / "tests" / "gpu"
    tests.mkdir(parents=True)
    (tests / "test_synthetic.py").write_text("def test_fix():\n    pass\n")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "regression tests")
    return World(upstream, cache, project.root)


def built(world: World, version: str) -> tuple[dict[str, Verdict], dict[str, str]]:
    """Every patch's verdict on the release and the built tree's Python files (the overlay
    walk: the tree `overlay build` and `tree` write)."""
    project = Project.load(world.project, world.cache)
    mirror = Mirror(world.cache)
    base = mirror.git_ref(str(world.upstream.path), f"v{version}")
    result = walk(mirror, base, patches_for(project))
    files = {}
    for path in mirror.repo.list_files(result.tree, "vllm/"):
        blob = mirror.repo.read_blob(result.tree, path)
        if blob is not None and path.endswith(".py"):
            files[path] = blob.decode()
    return {v.patch: v for v in result.verdicts}, files


def named(verdict: Verdict) -> str:
    return " ".join((*verdict.warnings, *verdict.candidates))


@pytest.mark.parametrize(("family", "fix"), CASES, ids=[f"{f}-{x.key[:13]}" for f, x in CASES])
def test_a_live_bug_is_a_stop_naming_every_place(world: World, family: str, fix: Fix) -> None:
    verdicts, files = built(world, version_of(family, fix))
    verdict = verdicts[fix.key]
    truth = live_bugs(files, fix.expression)
    section = Section.UPSTREAMED if fix is ARCHIVED else Section.SERIES
    patch = next(
        p for p in patches_for(Project.load(world.project, world.cache)) if p.key == fix.key
    )
    choices = options(section, verdict, patch)
    if not truth:  # the tree the walk builds has no live bug: the fix is there (or carried)
        assert verdict.state.value in ("applies", "upstream"), (verdict.words, verdict.warnings)
        return
    assert (verdict.state.value, verdict.bug_present) == ("conflict", True), (
        verdict.words,
        verdict.warnings,
    )
    for place in truth:
        assert place in named(verdict), (place, verdict.warnings, verdict.candidates)
    # Never only decisions that leave the bug live, never "fixed upstream".
    assert Choice.RESOLVE_UPSTREAM not in choices
    safe = Choice.KEEP if fix is ARCHIVED else Choice.PORT
    assert safe in choices, choices


# -- the rebase on the families -------------------------------------------------------------------
def copy(world: World, tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(world.project, root, symlinks=True)
    return root


def onto(world: World, family: str, fix: Fix) -> tuple[str, ...]:
    return ("--onto-git", str(world.upstream.path), "--ref", f"v{version_of(family, fix)}")


def checkout(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] not in (".git", ".rebase")
    }


def overlaid(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root / "overlay").as_posix(): p.read_text()
        for p in (root / "overlay" / "vllm").rglob("*.py")
    }


def decisions(doc: dict[str, object]) -> list[tuple[str, str, list[str]]]:
    found = doc["decisions"]
    assert isinstance(found, list)
    return [(d["patch"], d["verdict"], d["options"]) for d in found]


def port_by_hand(worktree: Path, path: str, bug: str, fix: str) -> None:
    """What a maintainer does at a `--port` stop: the fix carried to every place, the patch's
    commit made (`git am --continue`) or amended (it applied as it was)."""
    text = (worktree / path).read_text()
    if "<<<<<<<" in text:  # the conflict: upstream's side, then the fix on it
        text = re.sub(r"<<<<<<< .*?\n(.*?)=======\n.*?>>>>>>> .*?\n", r"\1", text, flags=re.S)
    (worktree / path).write_text(text.replace(bug, fix))
    git(worktree, "add", path)
    if (worktree / ".git" / "rebase-apply").is_dir():
        git(worktree, "am", "--continue")
    else:
        git(worktree, "commit", "-q", "--amend", "--no-edit")


def test_a_copy_beside_an_upstream_fix_is_ported_by_hand(
    world: World, tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `git format-patch failed: bad revision`, exit 2, .rebase/ stuck in "running"."""
    family = "copy beside an upstream fix"
    root = copy(world, tmp_path)
    before = checkout(root)
    doc = rebase_json(capsys, root, *onto(world, family, FIX1), code=1)
    assert decisions(doc) == [
        (FIX1.key, "ambiguous", ["--port 0001", "--keep 0001", "--drop 0001"])
    ]
    warning = doc["patches"][FIX1.key]["warnings"][0]  # type: ignore[index]
    assert warning == (
        f"the bug (`or self.a1_gscale`) is live at {TRITON}:32 (TritonExperts.apply_legacy);"
        f" its fix is live at {TRITON}:23 (TritonExperts.apply)"
    )
    assert checkout(root) == before
    # --port: the patch taken by `git am -3` in the worktree, then a stop for the hand port.
    doc = rebase_json(capsys, root, *onto(world, family, FIX1), "--port", "0001", code=1)
    assert doc["conflict"]["patch"] == FIX1.key  # type: ignore[index]
    assert checkout(root) == before
    port_by_hand(root / ".rebase" / "worktree", TRITON, FIX1.expression, "self.a1_scale")
    doc = rebase_json(capsys, root, "--continue")
    assert doc["status"] == "done"
    assert live_bugs(overlaid(root), FIX1.expression) == []
    assert cli(capsys, root, "check")[0] == 0


def test_an_archived_fix_reverted_with_its_fix_in_a_comment_is_kept(
    world: World, tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before (in other words): "neither its fix nor the code it changes is there", only
    `--drop` offered, which finished "done" with the bug live."""
    family = "revert in other words"
    root = copy(world, tmp_path)
    doc = rebase_json(capsys, root, *onto(world, family, ARCHIVED), code=1)
    assert decisions(doc) == [
        (ARCHIVED.key, "ambiguous", ["--keep upstreamed/0001", "--drop upstreamed/0001"])
    ]
    assert doc["patches"][ARCHIVED.key]["warnings"][0] == (  # type: ignore[index]
        f"the bug (`layer.weight.device`) is live at {ORACLE}:17 (convert_to_kernel_format);"
        f" its fix is only in a comment at {ORACLE}:16 (convert_to_kernel_format) (not live"
        " code)"
    )
    # --keep: carried again, ported by hand (the bug is in other words there).
    doc = rebase_json(
        capsys, root, *onto(world, family, ARCHIVED), "--keep", "upstreamed/0001", code=1
    )
    assert doc["conflict"]["patch"] == ARCHIVED.key  # type: ignore[index]
    port_by_hand(root / ".rebase" / "worktree", ORACLE, ARCHIVED.expression, "w13.device")
    doc = rebase_json(capsys, root, "--continue")
    assert doc["status"] == "done"
    assert live_bugs(overlaid(root), ARCHIVED.expression) == []


def test_a_bug_moved_into_a_base_class_is_never_resolved_upstream(
    world: World, tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: "neither fix nor code is there", no place named; `--resolve-upstream 0001`
    finished with the bug live in the helper."""
    family = "move to a base class"
    root = copy(world, tmp_path)
    before = checkout(root)
    assert cli(
        capsys, root, "rebase", *onto(world, family, FIX1), "--resolve-upstream", "0001"
    ) == (
        2,
        "",
        f"vllm-patchset: --resolve-upstream {FIX1.key}: not an option for a patch conflict on"
        f" git:v{version_of(family, FIX1)} (its options: --port, --keep, --drop)\n",
    )
    assert checkout(root) == before
    doc = rebase_json(capsys, root, *onto(world, family, FIX1), code=1)
    steps = doc["patches"]  # type: ignore[assignment]
    assert f"{MK}:8 (ExpertsBase._bug)" in steps[FIX1.key]["warnings"][0]  # type: ignore[index]


def test_dropping_a_live_bug_says_so(
    world: World, tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    family = "copy in another file"
    root = copy(world, tmp_path)
    doc = rebase_json(capsys, root, *onto(world, family, FIX1), "--drop", "0001")
    assert doc["status"] == "done"
    assert doc["patches"][FIX1.key]["notes"] == [  # type: ignore[index]
        f"--drop: the bug stays live ({TRITON.replace('.py', '_v2.py')}:23 (TritonExperts.apply)):"
        " nothing carries its fix now"
    ]


# -- bounded readers ------------------------------------------------------------------------------
@pytest.mark.parametrize("fix", FIXES, ids=[f.key[:13] for f in FIXES])
def test_a_file_of_the_patch_past_the_bounds_is_a_stop_naming_it(world: World, fix: Fix) -> None:
    """Before: `internal error: RecursionError` in series/locate.py."""
    verdicts, _ = built(world, f"3.0.{FIXES.index(fix)}")
    verdict = verdicts[fix.key]
    assert (verdict.words, verdict.candidates, verdict.warnings) == (
        "conflict (unreadable)",
        (fix.path,),
        (
            f"{fix.path} on git:v3.0.{FIXES.index(fix)} is past what the reader reads (nested"
            " deeper than the 200 levels read): look at it by hand, then decide",
        ),
    )
    section = Section.UPSTREAMED if fix is ARCHIVED else Section.SERIES
    patch = next(
        p for p in patches_for(Project.load(world.project, world.cache)) if p.key == fix.key
    )
    assert Choice.RESOLVE_UPSTREAM not in options(section, verdict, patch)


def test_a_file_past_the_bounds_elsewhere_is_skipped_with_a_warning(world: World) -> None:
    verdicts, _ = built(world, "3.1")
    assert verdicts[FIX1.key].words == "applies"
    assert verdicts[FIX1.key].warnings == (
        "vllm/tables.py: skipped in the search for copies of the bug (past what the reader reads)",
    )
    assert verdicts[LOCAL.key].warnings == ()


# -- no half-done rebase ----------------------------------------------------------------------------
def test_git_failing_inside_a_rebase_is_an_internal_error_and_abort_restores(
    world: World, tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: git's failure was bad input (exit 2), .rebase/ stuck."""
    family = "copy beside an upstream fix"
    root = copy(world, tmp_path)
    before = checkout(root)
    rebase_json(capsys, root, *onto(world, family, FIX1), "--port", "0001", code=1)
    shutil.rmtree(root / ".rebase" / "worktree" / ".git")  # the worktree's git is gone
    code, out, err = cli(capsys, root, "rebase", "--continue")
    assert (code, out) == (3, "")
    assert err.startswith("vllm-patchset: git ")
    assert err.endswith(
        "; the rebase changed nothing in patches/, pyproject.toml, the lock or CHANGELOG.md"
        " yet; `rebase --abort` removes .rebase/ (or `rebase --continue`)\n"
    )
    assert checkout(root) == before
    assert cli(capsys, root, "rebase", "--abort")[0] == 0
    assert checkout(root) == before
    assert not (root / ".rebase").exists()


def test_a_missing_extra_is_said_before_anything_is_written(world: World, tmp_path: Path) -> None:
    """Before: `internal error: ModuleNotFoundError: No module named 'ruamel'`, exit 3,
    .rebase/ stuck in "running" (after a plain `pip install -e .`)."""
    root = copy(world, tmp_path)
    before = checkout(root)
    hide = "import sys; sys.modules['ruamel'] = None; from vllm_patchset.cli import main; "
    argv = ["--project", str(root), "rebase", *onto(world, "revert", FIX1)]
    run = subprocess.run(
        [sys.executable, "-c", hide + f"sys.exit(main({argv!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (run.returncode, run.stdout, run.stderr) == (
        2,
        "",
        "vllm-patchset: rebase needs the 'maintain' extra (missing: ruamel.yaml):"
        " `pip install 'vllm-patchset[maintain]'`\n",
    )
    assert checkout(root) == before
    assert not (root / ".rebase").exists()


def test_a_relative_onto_git_is_the_callers_path(
    world: World,
    tmp_path: Path,
    synthetic_cache: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: `--onto-git ../up` was "not a git repository" (read from the mirror's dir)."""
    root = copy(world, tmp_path)
    here = tmp_path / "a" / "b" / "c" / "d"  # not as deep as the mirror
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    relative = os.path.relpath(world.upstream.path, here)
    doc = rebase_json(capsys, root, "--onto-git", relative, "--ref", "v2.0.1", code=0)
    assert doc["status"] == "done"
