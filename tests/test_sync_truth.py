"""The code is the truth: synthetic upstreams tagged as releases (so the patches' trailers come
into play: the fix's `Applied-upstream: 1.1` says "upstream" on every case release), on which
upstream reverts, reformats, moves or duplicates the code a patch touches. Each case asserts
the state and the built tree's code: the fix in the right class of the right file, or a stop
that names where the code is. Before: most cases were `upstream` (the trailers' word over the
text), or the fix landed in the wrong class.

One upstream for the module: release 1.0 (the pin) and one release per case, each from 1.0
(1.x) or from 1.1 (2.x, the fix merged upstream, then reverted); one project pinned to 1.0
(both patches in the series) and one pinned to 1.1 (the fix archived), built once.
"""

from __future__ import annotations

import ast
import dataclasses
import shutil
from pathlib import Path

import pytest
from support import cli, git, rebase_json
from synthetic import PatchSpec, SyntheticUpstream, make_project
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.build import patches_for, walk
from vllm_patchset.overlay.upstream import Mirror
from vllm_patchset.series import locate
from vllm_patchset.series.verdict import Verdict

MOE = "vllm/layers/moe.py"
EMU = "vllm/layers/emulation.py"
MOE_TEXT = '''\
"""A tiny MoE layer."""


def quantize(x, scale, dtype):
    """Scale, then round."""
    return round(x * scale, 3), dtype


class Experts:
    """The experts of one layer."""

    def __init__(self, a1_scale=None, a1_gscale=1.0):
        self.a1_scale = a1_scale
        self.a1_gscale = a1_gscale
        self.dtype = "fp8"

    def apply(self, hidden):
        hidden, scale = quantize(
            hidden,
            self.a1_scale or self.a1_gscale,
            self.dtype,
        )
        return hidden * scale

    def name(self):
        return "experts"
'''
BUG = "            self.a1_scale or self.a1_gscale,\n"
FIX_LINE = "            self.a1_scale,\n"
EMU_CLASS = '''\
class EmulationExperts(Experts):
    """Experts that emulate the quantization."""

    @property
    def expects_unquantized_inputs(self):
        return True

    @staticmethod
    def supports(kind):
        return kind == "nvfp4"

    def describe(self):
        label = "emulation"
        return label
'''
EMU_TEXT = '"""Quantization emulation."""\n\nfrom vllm.layers.moe import Experts\n\n\n' + EMU_CLASS
ANCHOR = "        return True\n\n"
PROPERTY = "    @property\n    def a1_scale(self):\n        return self.a1_gscale\n\n"
BASE = {"vllm/__init__.py": "", MOE: MOE_TEXT, EMU: EMU_TEXT}

FIX = PatchSpec(
    "0001-moe-no-tensor-truthiness.patch",
    {EMU: (ANCHOR, ANCHOR + PROPERTY), MOE: (BUG, FIX_LINE)},
    subject="moe: no tensor truthiness",
    applied_upstream="1.1",
)
LOCAL = PatchSpec(
    "0002-emulation-say-so.patch",
    {EMU: ('        label = "emulation"\n', '        label = "emulated experts"\n')},
    subject="emulation: say so",
    upstream_pr="none (local)",
)
FIXED_MOE = MOE_TEXT.replace(BUG, FIX_LINE)
FIXED_EMU = EMU_TEXT.replace(ANCHOR, ANCHOR + PROPERTY)

# -- the case releases ---------------------------------------------------------------------------
HELPER_MOE = MOE_TEXT.replace(
    "            self.a1_scale or self.a1_gscale,\n",
    "            self._scale(),\n",
).replace(
    "    def name(self):\n",
    "    def _scale(self):\n"
    "        scale = self.a1_scale or self.a1_gscale\n"
    "        return scale\n\n"
    "    def name(self):\n",
)
MIXIN = "vllm/layers/mixins.py"
MIXIN_TEXT = '''\
"""Mixins of the experts."""


class ScaleMixin:
    def _scale(self):
        scale = self.a1_scale or self.a1_gscale
        return scale
'''
MIXIN_MOE = (
    MOE_TEXT.replace(
        "            self.a1_scale or self.a1_gscale,\n", "            self._scale(),\n"
    )
    .replace("class Experts:", "class Experts(ScaleMixin):")
    .replace(
        '"""A tiny MoE layer."""\n',
        '"""A tiny MoE layer."""\n\nfrom vllm.layers.mixins import ScaleMixin\n',
    )
)
SPLIT_HEAD, SPLIT_TAIL = MOE_TEXT.split("\n\n\nclass Experts")
SPLIT_EXPERTS = "vllm/layers/experts.py"
SPLIT: dict[str, str | None] = {
    MOE: SPLIT_HEAD + "\n",
    SPLIT_EXPERTS: '"""The experts."""\n\nfrom vllm.layers.moe import quantize\n\n\nclass Experts'
    + SPLIT_TAIL,
    EMU: EMU_TEXT.replace("vllm.layers.moe import", "vllm.layers.experts import"),
}
JOINED_MOE = MOE_TEXT.replace(
    "        hidden, scale = quantize(\n"
    "            hidden,\n"
    "            self.a1_scale or self.a1_gscale,\n"
    "            self.dtype,\n"
    "        )\n",
    "        hidden, scale = quantize(hidden, self.a1_scale or self.a1_gscale, self.dtype)\n",
)
NARROW_MOE = (
    MOE_TEXT.replace(
        "    def __init__(self, a1_scale=None, a1_gscale=1.0):\n",
        "    def __init__(\n        self,\n        a1_scale=None,\n        a1_gscale=1.0,\n    ):\n",
    )
    .replace(
        "            self.a1_scale or self.a1_gscale,\n",
        "            self.a1_scale\n            or self.a1_gscale,\n",
    )
    .replace('"experts"', "'experts'")
    .replace('"fp8"', "'fp8'")
)
SIBLING_EMU = EMU_TEXT.replace(
    EMU_CLASS,
    EMU_CLASS.replace("class EmulationExperts", "class ReferenceExperts").replace(
        "Experts that emulate the quantization.", "The reference for the emulation."
    )
    + "\n\n"
    + EMU_CLASS,
)
LINEAR = "vllm/layers/linear.py"
LINEAR_TEXT = '''\
"""A linear layer: a1_scale is a tensor attribute here, or None."""


class LinearKernel:
    def process(self, x):
        scale = quantize(
            x,
            self.a1_scale or self.a1_gscale,
            "fp16",
        )
        return scale
'''
COPIED_MOE = FIXED_MOE.replace(
    "    def name(self):\n",
    "    def _reference_scale(self):\n"
    "        return quantize(\n"
    "            1.0,\n"
    "            self.a1_scale or self.a1_gscale,\n"
    "            self.dtype,\n"
    "        )\n\n"
    "    def name(self):\n",
)
# version: (what it changes from its base, its base)
RELEASES: dict[str, tuple[dict[str, str | None], str]] = {
    "1.1": ({MOE: FIXED_MOE, EMU: FIXED_EMU}, "1.0"),  # upstream merged the fix
    "1.3": ({MOE: HELPER_MOE}, "1.0"),  # the buggy call moved into a helper method
    "1.4": ({MOE: MIXIN_MOE, MIXIN: MIXIN_TEXT}, "1.0"),  # ... into a mixin in a new module
    "1.5": (SPLIT, "1.0"),  # the module split in two
    "1.6": ({MOE: JOINED_MOE}, "1.0"),  # reformatted: the call joined onto one line
    "1.7": ({MOE: NARROW_MOE}, "1.0"),  # reformatted: a shorter line length, other quotes
    "1.8": ({EMU: SIBLING_EMU}, "1.0"),  # a sibling class, the same methods, before the target
    "1.9": ({EMU: None}, "1.0"),  # the module the property goes to removed; the bug stays
    "1.10": ({EMU: FIXED_EMU}, "1.0"),  # partly upstream: the property only
    "1.11": ({MOE: FIXED_MOE}, "1.0"),  # partly upstream: the call only
    "1.12": ({MOE: FIXED_MOE, EMU: FIXED_EMU, LINEAR: LINEAR_TEXT}, "1.0"),  # fixed; a copy
    # of the line in unrelated code (another class, other surroundings)
    "1.13": ({MOE: COPIED_MOE, EMU: FIXED_EMU}, "1.0"),  # fixed, the bug copied into a helper
    "2.1": ({MOE: JOINED_MOE, EMU: EMU_TEXT}, "1.1"),  # 1.1's fix reverted, and reformatted
    "2.2": ({MOE: JOINED_MOE}, "1.1"),  # ... the call only (the property kept)
}


@dataclasses.dataclass(frozen=True)
class World:
    upstream: SyntheticUpstream
    cache: Path
    on_1_0: Path  # the project pinned to 1.0: the fix and the local patch in the series
    on_1_1: Path  # pinned to 1.1: the fix archived (merged in 1.1), the local patch


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    folder = tmp_path_factory.mktemp("truth")
    upstream = SyntheticUpstream(folder / "upstream")
    upstream.release("1.0", BASE)
    for version, (changes, base) in RELEASES.items():
        upstream.release(version, changes, base=base)
    cache = tmp_path_factory.getbasetemp() / "synthetic-cache"
    cache.mkdir(exist_ok=True)
    on_1_0 = make_project(folder / "on-1.0", cache, upstream, "1.0", series=[FIX, LOCAL])
    archived = dataclasses.replace(FIX, base="1.0")
    on_1_1 = make_project(
        folder / "on-1.1", cache, upstream, "1.1", series=[LOCAL], upstreamed=[archived]
    )
    return World(upstream, cache, on_1_0.root, on_1_1.root)


def copy(world: World, which: Path, tmp_path: Path) -> Path:
    root = tmp_path / which.name
    shutil.copytree(which, root, symlinks=True)
    return root


def on(world: World, root: Path, version: str) -> tuple[dict[str, Verdict], dict[str, str]]:
    """Every patch's verdict on the release, and the built tree's files the patches touch
    (the overlay walk: the tree `overlay build` and `tree` write)."""
    project = Project.load(root, world.cache)
    mirror = Mirror(world.cache)
    base = mirror.git_ref(str(world.upstream.path), f"v{version}")
    result = walk(mirror, base, patches_for(project))
    files = {}
    for path in (MOE, EMU, MIXIN, SPLIT_EXPERTS):
        blob = mirror.repo.read_blob(result.tree, path)
        if blob is not None:
            files[path] = blob.decode()
    return {v.patch: v for v in result.verdicts}, files


def methods(text: str) -> dict[str, list[str]]:
    """class -> the names it defines (the fix in the right class)."""
    return {
        node.name: [n.name for n in node.body if isinstance(n, ast.FunctionDef)]
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ClassDef)
    }


def source_of(text: str, cls: str, method: str) -> str:
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return ast.unparse(item)
    raise AssertionError(f"no {cls}.{method}")


FIXED_APPLY = source_of(FIXED_MOE, "Experts", "apply")
BUGGY_APPLY = source_of(MOE_TEXT, "Experts", "apply")


# -- the verdicts and the built trees ------------------------------------------------------------
# version -> (state and verdict of the fix, its candidates' places)
STOPS = [
    ("1.3", ("conflict", "ambiguous"), (f"{MOE}:26 (Experts._scale)",)),
    ("1.4", ("conflict", "ambiguous"), (f"{MIXIN}:6 (ScaleMixin._scale)",)),
    ("1.13", ("conflict", "ambiguous"), (f"{MOE}:28 (Experts._reference_scale)",)),
]


@pytest.mark.parametrize(("version", "words", "places"), STOPS)
def test_the_bug_elsewhere_is_a_stop_naming_it(
    world: World, tmp_path: Path, version: str, words: tuple[str, str], places: tuple[str, ...]
) -> None:
    """The bug moved (a helper, a mixin in a new module) or copied: the fix is needed, never
    `upstream` (its trailers say so); the verdict names where the bug is."""
    verdicts, files = on(world, world.on_1_0, version)
    fix = verdicts[FIX.name]
    assert (fix.state.value, fix.reason.value) == words
    assert fix.candidates == places
    assert fix.bug_present
    assert fix.trailer_state is not None and fix.trailer_state.value == "upstream"
    # Not applied: the built tree holds upstream's code as it is (no half-applied patch).
    assert files[MOE] == world.upstream.files(version)[MOE]


def test_module_split_is_followed(world: World) -> None:
    verdicts, files = on(world, world.on_1_0, "1.5")
    fix = verdicts[FIX.name]
    assert (fix.state.value, fix.reason.value, fix.moved_to) == (
        "applies",
        "moved",
        ((MOE, SPLIT_EXPERTS),),
    )
    assert source_of(files[SPLIT_EXPERTS], "Experts", "apply") == FIXED_APPLY
    assert methods(files[EMU])["EmulationExperts"] == [
        "expects_unquantized_inputs",
        "a1_scale",
        "supports",
        "describe",
    ]
    assert files[MOE] == SPLIT[MOE]


@pytest.mark.parametrize(
    ("version", "line"),
    [
        ("1.6", "        hidden, scale = quantize(hidden, self.a1_scale, self.dtype)\n"),
        ("1.7", "            self.a1_scale,\n            self.dtype,\n"),
    ],
)
def test_reformatted_code_gets_a_refreshed_patch(world: World, version: str, line: str) -> None:
    verdicts, files = on(world, world.on_1_0, version)
    fix = verdicts[FIX.name]
    assert (fix.state.value, fix.reason.value) == ("applies", "refreshed")
    assert line in files[MOE]
    assert "or self.a1_gscale" not in files[MOE]
    # The refreshed patch gives the old post-image's tokens; upstream's layout is kept.
    assert locate.words(files[MOE]) == locate.words(FIXED_MOE)
    # Upstream's layout elsewhere is kept (1.7's narrow signature and quotes).
    pristine = world.upstream.files(version)[MOE]
    assert files[MOE].split("    def apply")[0] == pristine.split("    def apply")[0]
    assert verdicts[LOCAL.name].state.value == "applies"


def test_a_sibling_class_with_the_same_methods(world: World) -> None:
    """Before: the property landed in the first class with the same context (the sibling)."""
    verdicts, files = on(world, world.on_1_0, "1.8")
    fix = verdicts[FIX.name]
    assert (fix.state.value, fix.reason.value) == ("applies", "refreshed")
    assert methods(files[EMU]) == {
        "ReferenceExperts": ["expects_unquantized_inputs", "supports", "describe"],
        "EmulationExperts": ["expects_unquantized_inputs", "a1_scale", "supports", "describe"],
    }
    assert source_of(files[MOE], "Experts", "apply") == FIXED_APPLY


def test_another_patchs_module_removed_the_bug_stays(world: World) -> None:
    verdicts, files = on(world, world.on_1_0, "1.9")
    fix, local = verdicts[FIX.name], verdicts[LOCAL.name]
    assert (fix.state.value, fix.reason.value, fix.bug_present) == ("conflict", "rewritten", True)
    assert fix.warnings[0] == (
        "hunk(s) 1: the code they change is gone from git:v1.9, while the code the others fix"
        f" is still there ({MOE}:17 (Experts.apply)): port the patch by hand (queue import) or"
        " decide"
    )
    assert (local.state.value, local.reason.value) == ("conflict", "rewritten")
    assert source_of(files[MOE], "Experts", "apply") == BUGGY_APPLY


@pytest.mark.parametrize(
    ("version", "left_out"),
    [("1.10", f"hunk 1 ({EMU})"), ("1.11", f"hunk 2 ({MOE})")],
)
def test_partly_upstream_carries_the_rest(world: World, version: str, left_out: str) -> None:
    verdicts, files = on(world, world.on_1_0, version)
    fix = verdicts[FIX.name]
    assert (fix.state.value, fix.reason.value) == ("applies", "refreshed")
    assert (
        f"{left_out}: its change is there already (partly upstream); the refreshed patch leaves"
        " it out"
    ) in fix.warnings
    assert source_of(files[MOE], "Experts", "apply") == FIXED_APPLY
    assert methods(files[EMU])["EmulationExperts"] == [
        "expects_unquantized_inputs",
        "a1_scale",
        "supports",
        "describe",
    ]


def test_a_copy_in_unrelated_code_is_not_the_bug(world: World) -> None:
    """Upstream fixed it; a linear layer has the same expression in other surroundings (as
    vLLM's linear NVFP4 emulation has fix 1's line): still upstream."""
    verdicts, files = on(world, world.on_1_0, "1.12")
    fix = verdicts[FIX.name]
    assert (fix.state.value, fix.reason.value, fix.bug_present) == ("upstream", "upstream", False)
    assert files[MOE] == FIXED_MOE


@pytest.mark.parametrize("version", ["2.1", "2.2"])
def test_an_archived_fix_reverted_is_needed_again(world: World, version: str) -> None:
    """1.1 merged the fix (archived here); a later release reverts it, reformatted (so it
    does not apply as it is), whole or the call only."""
    verdicts, files = on(world, world.on_1_1, version)
    fix = verdicts[f"upstreamed/{FIX.name}"]
    assert (fix.state.value, fix.reason.value, fix.bug_present) == ("applies", "refreshed", True)
    assert fix.warnings[-1] == (
        "text says applies, trailers say upstream: the bug is back (a revert?); the text decides"
    )
    assert "or self.a1_gscale" not in files[MOE]
    assert "a1_scale" in methods(files[EMU])["EmulationExperts"]


# -- the rebase ----------------------------------------------------------------------------------
def onto(world: World, version: str) -> tuple[str, ...]:
    return ("--onto-git", str(world.upstream.path), "--ref", f"v{version}")


def test_rebase_stops_naming_the_helper(
    world: World, tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: archived as "merged in 1.1", the CHANGELOG saying so, the bug in the tree."""
    root = copy(world, world.on_1_0, tmp_path)
    doc = rebase_json(capsys, root, *onto(world, "1.3"), code=1)
    assert (doc["status"], doc["started"]) == ("stopped", False)
    assert doc["decisions"] == [
        {
            "patch": FIX.name,
            "state": "conflict",
            "verdict": "ambiguous",
            "options": ["--port 0001", "--keep 0001", "--drop 0001"],
            "means": [
                "take it with `git am -3` in .rebase/worktree and stop there to port it by hand"
                " (`rebase --continue` carries it)",
                "park it in patches/parked/ (kept, not applied; port it later)",
                "remove it",
            ],
        }
    ]
    # The text shows the bug: --resolve-upstream is refused, with what is allowed.
    code, _, err = cli(capsys, root, "rebase", *onto(world, "1.3"), "--resolve-upstream", "0001")
    assert (code, err) == (
        2,
        f"vllm-patchset: --resolve-upstream {FIX.name}: not an option for a patch conflict"
        " (ambiguous) on git:v1.3 (its options: --port, --keep, --drop)\n",
    )
    assert not (root / ".rebase").exists()


def test_rebase_onto_a_reformatted_release(
    world: World, tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy(world, world.on_1_0, tmp_path)
    doc = rebase_json(capsys, root, *onto(world, "1.6"))
    fix = doc["patches"][FIX.name]  # type: ignore[index]
    assert (fix["verdict"], fix["action"], fix["range_diff"]) == (
        "refreshed",
        "refreshed",
        "content changed",
    )
    overlaid = (root / "overlay" / MOE).read_text()
    assert overlaid == JOINED_MOE.replace("self.a1_scale or self.a1_gscale", "self.a1_scale")
    assert cli(capsys, root, "check") == (0, "check: 2 patches, 0 problem(s)\n", "")


def test_rebase_carries_a_reverted_archived_fix_again(
    world: World, tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy(world, world.on_1_1, tmp_path)
    key = f"upstreamed/{FIX.name}"
    doc = rebase_json(capsys, root, *onto(world, "2.1"), code=1)
    assert [d["options"] for d in doc["decisions"]] == [  # type: ignore[attr-defined]
        ["--keep upstreamed/0001", "--drop upstreamed/0001"]
    ]
    doc = rebase_json(capsys, root, *onto(world, "2.1"), "--keep", "upstreamed/0001")
    assert doc["patches"][key]["action"] == "unarchived"  # type: ignore[index]
    assert (root / "patches" / "series").read_text() == f"{FIX.name}\n{LOCAL.name}\n"
    overlaid = (root / "overlay" / MOE).read_text()
    assert "or self.a1_gscale" not in overlaid
    assert "a1_scale" in methods((root / "overlay" / EMU).read_text())["EmulationExperts"]
    assert cli(capsys, root, "check") == (0, "check: 2 patches, 0 problem(s)\n", "")


def test_git_history(world: World) -> None:
    """Every case release is a tag of the one synthetic upstream."""
    tags = git(world.upstream.path, "tag").split()
    assert sorted(tags) == sorted(f"v{v}" for v in ("1.0", *RELEASES))


# -- check: a linter -----------------------------------------------------------------------------
TRAILERS = [
    # (a trailer line of 0001, as written, the problem `check` lists for it)
    ("Introduced-in: banana", "Introduced-in: 'banana' is not a PEP 440 version or `nightly`"),
    ("Introduced-in: 1.5", "Applied-upstream: 1.1 is before Introduced-in: 1.5"),
    (
        "Applied-upstream: 1.0",
        "Applied-upstream: 1.0 on a patch of the series is not a release after the pin 1.0"
        " (archive it, or empty it)",
    ),
    ("Applied-upstream: soon", "Applied-upstream: 'soon' is not a PEP 440 version"),
    ("Upstream-PR: none", "Upstream-PR: `none` without its reason (e.g. `none (local)`)"),
    (
        "Upstream-PR: see the PR",
        "Upstream-PR: 'see the PR' is not a pull request URL or number, nor `none (why)`",
    ),
    (
        "Regression-test: tests/gpu/test_synthetic.py::test_nothing",
        "Regression-test: tests/gpu/test_synthetic.py::test_nothing does not exist in tests/",
    ),
    (
        "Regression-test: banana",
        "Regression-test: 'banana' is not a test id (tests/<file>.py::<test>)",
    ),
]


@pytest.mark.parametrize(("line", "problem"), TRAILERS)
def test_check_validates_every_trailer(
    world: World,
    tmp_path: Path,
    synthetic_cache: Path,
    capsys: pytest.CaptureFixture[str],
    line: str,
    problem: str,
) -> None:
    """Before: `Introduced-in: banana` passed (and changed the states), as did a version after
    the fix's."""
    root = copy(world, world.on_1_0, tmp_path)
    (root / "tests" / "gpu").mkdir(parents=True)
    (root / "tests" / "gpu" / "test_synthetic.py").write_text("def test_fix():\n    pass\n")
    path = root / "patches" / FIX.name
    key = line.split(":", 1)[0] + ":"
    lines = path.read_text().split("\n")
    number = next(i for i, text in enumerate(lines) if text.startswith(key))
    lines[number] = line
    path.write_text("\n".join(lines))
    code, out, err = cli(capsys, root, "check")
    assert (code, out) == (1, "check: 2 patches, 1 problem(s)\n")
    # The line of the trailer the problem is about.
    about = problem.split(":", 1)[0] + ":"
    at = next(i for i, text in enumerate(lines) if text.startswith(about)) + 1
    assert err == f"{path}:{at}: {problem}\n"


def test_check_lists_every_problem_of_every_patch(
    world: World, tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed patch is one finding among the others (exit 1), not the end of `check`."""
    root = copy(world, world.on_1_0, tmp_path)
    fix, local = root / "patches" / FIX.name, root / "patches" / LOCAL.name
    fix.write_text(fix.read_text().replace("Introduced-in: 1.0", "Introduced-in: 0.99.x"))
    local.write_text(local.read_text().replace("\r", "").replace("diff --git", "diff --nope"))
    code, out, err = cli(capsys, root, "check")
    assert (code, out) == (1, "check: 2 patches, 2 problem(s)\n")
    assert err.splitlines() == [
        f"{fix}:{fix.read_text().split(chr(10)).index('Introduced-in: 0.99.x') + 1}:"
        " Introduced-in: '0.99.x' is not a PEP 440 version or `nightly`",
        f"{local}:1: malformed patch {local}: no `diff --git` section",
    ]


# -- downgrades -----------------------------------------------------------------------------------
def test_a_downgrade_needs_saying_so(
    world: World, tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy(world, world.on_1_1, tmp_path)
    assert cli(capsys, root, "rebase", *onto(world, "1.0")) == (
        2,
        "",
        "vllm-patchset: git:v1.0 is older than the pin 1.1: a downgrade (say so with"
        " --allow-downgrade)\n",
    )
    doc = rebase_json(capsys, root, *onto(world, "1.0"), "--allow-downgrade", code=1)
    # On 1.0 the archived fix's bug is there: a decision, as for a revert.
    assert [d["patch"] for d in doc["decisions"]] == [f"upstreamed/{FIX.name}"]  # type: ignore[attr-defined]


def test_parking_the_other_patch_archives_nothing(
    world: World, tmp_path: Path, synthetic_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """1.9 removed the module the local patch (and the fix's property) goes to; the bug stays
    in moe.py. Before: once the maintainer parked the local patch, the fix was archived as
    upstream (its trailers), the bug in the tree."""
    root = copy(world, world.on_1_0, tmp_path)
    before = (root / "patches" / "series").read_text()
    doc = rebase_json(capsys, root, *onto(world, "1.9"), "--keep", "0002", code=1)
    assert (doc["status"], doc["started"]) == ("stopped", False)
    assert [(d["patch"], d["verdict"], d["options"]) for d in doc["decisions"]] == [  # type: ignore[attr-defined]
        (FIX.name, "rewritten", ["--port 0001", "--keep 0001", "--drop 0001"])
    ]
    assert (root / "patches" / "series").read_text() == before
    assert not (root / "patches" / "upstreamed" / FIX.name).exists()
