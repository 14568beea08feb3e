"""`vllm-patchset validate`: prove each patch red/green on a GPU.

Trees, each a pure-Python `vllm/` package with the metadata vLLM's platform detection reads:
- `pristine-<pin>` and `overlay-<pin>` run all of tests/gpu. On the pristine pin, the regression
  tests of every series patch that the pin needs must fail (red); on the overlay, every
  regression test must pass (green); every other test must pass or skip itself.
- for each patch that upstream merged (`patches/upstreamed/`): `buggy-<n>`, the release that
  merged it with the patch reversed (the code that still had the bug: for fix 1, v0.21.0 with
  vLLM PR #41630 reverted, a faithful nightly), where its regression tests must fail, and
  `fixed-<n>`, that tree with the patch applied, where they must pass. A patch that does not
  reverse on that release (upstream fixed the bug in other words: `rebase --resolve-upstream`
  archives such patches) has no buggy tree: the manifest and the report name the tree as not
  built, with that reason, and the run goes on.

The run itself is gpurun.py (standard library only), so that `vllm-patchset bundle` can ship
the same trees, manifest and checker to a GPU host without network. With `--kit DIR` (a
native-ops kit, `vllm-patchset kit build`), the pin's two trees run with vLLM's compiled ops
from the pin's wheel (mode `native` in the report) instead of the stand-ins.
"""

from __future__ import annotations

import shlex
import shutil
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_patchset import versions
from vllm_patchset.errors import BadInput
from vllm_patchset.gpu import gpurun
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.build import TREE_INFO, TreeInfo, export_tree, patches_for, walk
from vllm_patchset.overlay.upstream import Mirror, Upstream, mirror_for, pin_base
from vllm_patchset.series.patches import Patch
from vllm_patchset.series.verdict import State

TESTS = "tests/gpu"
# The module patch 0002 adds: the fused NVFP4 kernels, the portable path among them. Not
# nvfp4_emulation_moe.py, which patch 0001 touches too: the first patch touching that file
# was named as the one whose code the tests below test.
NVFP4_KERNELS = "vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_kernels.py"
# GPU tests of code that a series patch brings, which no Regression-test trailer names: red on
# the pristine pin wherever a patch that applies there touches the file (the code they test is
# not there), green on the overlay. (test, file, why red.) Every other test must pass or skip.
NEW_PATH_TESTS = (
    (
        f"{TESTS}/test_batch_invariance.py::test_portable_batch_invariant",
        NVFP4_KERNELS,
        "the fused portable NVFP4 path is the patch's (the pin dequantizes every expert)",
    ),
    (
        f"{TESTS}/test_batch_invariance.py::test_portable_matches_reference",
        NVFP4_KERNELS,
        "the fused portable NVFP4 path is the patch's (the pin dequantizes every expert)",
    ),
)


@dataclass(frozen=True)
class BuiltTrees:
    root: Path  # holds trees/, tests/gpu and manifest.json
    specs: tuple[gpurun.TreeSpec, ...]


def _short(patch: Patch) -> str:
    return patch.name.split("-", 1)[0]


def _add_metadata(tree: Path, version: str) -> None:
    """vLLM's platform detection reads its version with importlib.metadata (a pure tree has no
    dist-info): give the tree the METADATA an installed vllm has."""
    info = tree / f"vllm-{version}.dist-info"
    fsio.make_dir(info, exist_ok=True)
    fsio.write_file(info / "METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")


def _pytest_ini(project: Project) -> str:
    """The project's pytest settings, so that the run's rootdir (and its node ids, as the
    manifest and the patches' trailers name them) is the run's folder wherever it lies;
    without pytest-xdist's options (`serial`). Read before anything is written: an `addopts`
    that is no command line is one line of BadInput."""
    settings = tomllib.loads(project.pyproject.read_text("utf-8"))
    # A project without pytest settings of its own runs tests/gpu with pytest's defaults.
    options = settings.get("tool", {}).get("pytest", {}).get("ini_options", {})
    addopts = options.get("addopts", "")
    try:
        kept = serial(addopts)
    except ValueError as exc:
        raise BadInput(
            f"{project.pyproject}: [tool.pytest.ini_options] addopts {addopts!r}: {exc}"
        ) from None
    lines = ["[pytest]", f"addopts = {kept}"]
    for key in ("markers", "filterwarnings"):
        lines.append(f"{key} =")
        lines.extend(f"    {value}" for value in options.get(key, ()))
    return "\n".join(lines) + "\n"


# pytest-xdist's options, each with its value (the CPU suite's workers): a GPU run is one
# pytest process per tree on one GPU, where pytest-xdist may not be installed.
XDIST_OPTIONS = ("-n", "--numprocesses", "--maxprocesses", "--dist")


def serial(addopts: object) -> str:
    """`addopts` (a command line, or its words as pyproject.toml may list them) without
    pytest-xdist's options (`-n 2`, `-nauto`, `--dist=loadfile`...); ValueError where it is
    neither."""
    if isinstance(addopts, str):
        words = shlex.split(addopts)
    elif isinstance(addopts, list) and all(isinstance(w, str) for w in addopts):
        words = addopts
    else:
        raise ValueError("not a string or a list of strings")
    kept: list[str] = []
    rest = iter(words)
    for word in rest:
        name, eq, _ = word.partition("=")
        if name in XDIST_OPTIONS:
            if not eq:
                next(rest, None)
        elif not (word.startswith("-n") and word[2:] and not word.startswith("--")):
            kept.append(word)
    return shlex.join(kept)


def _write_tree(mirror: Mirror, git_tree: str, dest: Path, info: TreeInfo) -> None:
    fsio.make_dir(dest, parents=True)
    mirror.repo.archive_to(git_tree, dest)
    fsio.write_file(dest / TREE_INFO, info.to_json())


def build_trees(project: Project, root: Path) -> BuiltTrees:
    """Write every tree under `root`/trees, tests/gpu beside them, and the manifest."""
    ini = _pytest_ini(project)
    mirror = mirror_for(project)
    pin = pin_base(project, mirror)
    patches = patches_for(project)
    if root.exists():
        raise BadInput(f"{root} exists already: give a new folder")
    trees = root / "trees"
    specs: list[gpurun.TreeSpec] = []

    states = {v.patch: v.state for v in walk(mirror, pin, patches).verdicts}
    version = pin.version or pin.label
    pristine_expect, overlay_expect = pin_expectations(patches, states, version)
    for name, pristine, expect in (
        (f"pristine-{version}", True, pristine_expect),
        (f"overlay-{version}", False, overlay_expect),
    ):
        export_tree(project, None, trees / name, pristine=pristine)
        _add_metadata(trees / name, version)
        spec = gpurun.TreeSpec(name, f"trees/{name}", (TESTS,), tuple(expect), native=True)
        specs.append(spec)

    for patch in patches:
        if patch.key.startswith("upstreamed/"):
            specs.extend(_upstreamed_trees(mirror, pin, patch, trees))

    fsio.copy_tree(project.root / TESTS, root / TESTS, ignore=shutil.ignore_patterns("__pycache__"))
    fsio.write_file(root / "pytest.ini", ini)
    gpurun.write_manifest(root, specs)
    return BuiltTrees(root, tuple(specs))


def pin_expectations(
    patches: Sequence[Patch], states: Mapping[str, State], version: str
) -> tuple[list[gpurun.Expectation], list[gpurun.Expectation]]:
    """What the pin's pristine tree and its overlay tree expect of each test: a patch's
    regression tests red on the pristine pin where the patch applies there (else green), green
    on the overlay; and the tests of NEW_PATH_TESTS that no trailer names, where a patch that
    applies brings their file."""
    pristine_expect: list[gpurun.Expectation] = []
    overlay_expect: list[gpurun.Expectation] = []
    for patch in patches:
        state = states[patch.key]
        for test in patch.trailers.regression_tests:
            red = state == State.APPLIES
            why = f"{patch.key}: {state.value} on {version}"
            pristine_expect.append(gpurun.Expectation(test, "red" if red else "green", why))
            # The overlay carries only the patches that apply: an upstream fix is the pin's own.
            applied = f"{patch.key} applied" if red else why
            overlay_expect.append(gpurun.Expectation(test, "green", applied))
    named = {e.test for e in pristine_expect}
    for test, path, why in NEW_PATH_TESTS:
        brings = [p for p in patches if states[p.key] == State.APPLIES and path in p.paths]
        if brings and test not in named:
            pristine_expect.append(gpurun.Expectation(test, "red", f"{brings[0].key}: {why}"))
            overlay_expect.append(gpurun.Expectation(test, "green", f"{brings[0].key} applied"))
    return pristine_expect, overlay_expect


def _upstreamed_trees(
    mirror: Mirror, pin: Upstream, patch: Patch, trees: Path
) -> list[gpurun.TreeSpec]:
    release = patch.trailers.applied_upstream
    if not versions.is_version(release):
        raise BadInput(f"{patch.key}: Applied-upstream {release!r} is not a release version")
    # Right after a rebase archives a fix, the release that merged it is the pin itself.
    merged: Upstream = pin if pin.version == release else mirror.release(release)
    tests = patch.trailers.regression_tests
    released = mirror.repo.tree_of(merged.commit)
    reverses, _ = mirror.repo.check_apply(released, patch.raw, reverse=True)
    if not reverses:
        # Upstream fixed the bug in other words (`rebase --resolve-upstream` archives such a
        # patch): there is no tree with the bug to show the regression tests red on.
        name = f"buggy-{_short(patch)}-{release}"
        why = (
            f"{patch.key} does not reverse on {release} (upstream fixed the bug in other"
            " words): no tree with the bug to run its regression tests on"
        )
        expectations = tuple(gpurun.Expectation(t, "red", why) for t in tests)
        return [gpurun.TreeSpec(name, f"trees/{name}", tests, expectations, skipped=why)]
    buggy = mirror.repo.apply_to_tree(released, patch.raw, reverse=True)
    fixed = mirror.repo.apply_to_tree(buggy, patch.raw)
    specs = []
    for kind, git_tree, expect, applied in (
        ("buggy", buggy, "red", []),
        ("fixed", fixed, "green", [patch.key]),
    ):
        name = f"{kind}-{_short(patch)}-{release}"
        info = TreeInfo(
            version=release,
            label=f"{release} with {patch.key} reversed",
            source=merged.source,
            kind="nightly-like" if kind == "buggy" else "nightly-like+fix",
            patches=tuple(applied),
        )
        _write_tree(mirror, git_tree, trees / name, info)
        _add_metadata(trees / name, release)
        why = (
            f"{release} without {patch.trailers.upstream_pr} still has the bug"
            if kind == "buggy"
            else f"{patch.key} fixes it"
        )
        expectations = tuple(gpurun.Expectation(t, expect, why) for t in tests)
        specs.append(gpurun.TreeSpec(name, f"trees/{name}", tests, expectations))
    return specs


def tree_names(project: Project) -> list[str]:
    """The names `build_trees` gives its trees, without building them."""
    mirror = mirror_for(project)
    pin = pin_base(project, mirror)
    version = pin.version or pin.label
    names = [f"pristine-{version}", f"overlay-{version}"]
    for patch in patches_for(project):
        if patch.key.startswith("upstreamed/"):
            release = patch.trailers.applied_upstream
            names += [f"{kind}-{_short(patch)}-{release}" for kind in ("buggy", "fixed")]
    return names


def require_torch(python: str) -> None:
    """One line, before anything is built, where `python` cannot import torch."""
    try:
        done = fsio.run_child([python, "-c", "import torch"], capture_output=True, text=True)
    except OSError as exc:
        raise BadInput(f"validate: cannot run --python {python}: {exc.strerror}") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        raise BadInput(
            f"validate needs torch (and a GPU): {python} cannot import it ({lines[-1]}); run it"
            " where they are (--python EXE), or take the trees there with `vllm-patchset bundle`"
        )
