"""`overlay/build.py` on a release whose package holds symlinks (git stores one as a blob of
mode 120000 whose bytes are the relative target): `tree` and `overlay build` read a link that
stays inside the package through to its file, as the installed package does, and write that
file patched as a regular file; a link out of the package, an absolute link, a link to no file
and a loop are refused with one line that names the path, nothing written."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import bare_patch, cli, git
from synthetic import (
    BASE,
    MOE,
    MOE_TEXT,
    STORY_FIX,
    STORY_LOCAL,
    UTILS_TEXT,
    SyntheticUpstream,
    make_project,
)
from vllm_patchset.errors import BadInput
from vllm_patchset.overlay.build import without

IMPL = "vllm/layers/experts/moe_impl.py"
LINK_HOPS = 8  # the most links overlay/build.py follows from one path
PATCHED = MOE_TEXT.replace(*STORY_FIX.edits[MOE]).replace(*STORY_LOCAL.edits[MOE])


@dataclass(frozen=True)
class World:
    upstream: Path
    cache: Path
    project: Path  # pinned to 1.0, the series 0001 and 0002 (both edit MOE)


def link_release(upstream: SyntheticUpstream, version: str, links: dict[str, str]) -> None:
    """Tag `v<version>`: release 1.0 with IMPL a copy of MOE and each path of `links` made a
    symlink to its target (as written, relative or absolute)."""
    git(upstream.path, "checkout", "-q", "--detach", "v1.0")
    (upstream.path / IMPL).parent.mkdir(parents=True, exist_ok=True)
    (upstream.path / IMPL).write_text(MOE_TEXT)
    for path, target in links.items():
        (upstream.path / path).unlink(missing_ok=True)
        os.symlink(target, upstream.path / path)
    git(upstream.path, "add", "-A")
    git(upstream.path, "commit", "-q", "-m", f"vllm {version}")
    git(upstream.path, "tag", f"v{version}")


# version -> the release's links
INSIDE = {
    "1.1": {MOE: "experts/moe_impl.py"},
    # two links, the second through `..`: still inside the package
    "1.2": {MOE: "moe_link.py", "vllm/layers/moe_link.py": "../layers/experts/moe_impl.py"},
}
# version -> (the release's links, the one line that refuses it)
REFUSED = {
    "2.0": (
        {MOE: "../../setup.py"},
        "git:v2.0 holds 'vllm/layers/moe.py', a symbolic link to '../../setup.py',"
        " outside vllm/: refused",
    ),
    "2.1": (
        {MOE: "/etc/passwd"},
        "git:v2.1 holds 'vllm/layers/moe.py', a symbolic link to '/etc/passwd',"
        " an absolute path: refused",
    ),
    "2.2": (
        {MOE: "moe_b.py", "vllm/layers/moe_b.py": "moe.py"},
        "git:v2.2 holds 'vllm/layers/moe.py', a symbolic link in a loop"
        f" (over {LINK_HOPS} links): refused",
    ),
    "2.3": (
        {MOE: "experts"},
        "git:v2.3 holds 'vllm/layers/moe.py', a symbolic link to 'experts',"
        " no file of git:v2.3: refused",
    ),
    # a chain of LINK_HOPS + 1 links, no loop: refused as one (the bound is the number of hops)
    "2.4": (
        {
            **{f"vllm/l{i}.py": f"l{i + 1}.py" for i in range(LINK_HOPS)},
            f"vllm/l{LINK_HOPS}.py": "layers/experts/moe_impl.py",
        },
        f"git:v2.4 holds 'vllm/l0.py', a symbolic link in a loop (over {LINK_HOPS} links): refused",
    ),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    folder = tmp_path_factory.mktemp("links")
    upstream = SyntheticUpstream(folder / "upstream")
    upstream.release("1.0", BASE)
    for version, links in INSIDE.items():
        link_release(upstream, version, links)
    for version, (links, _) in REFUSED.items():
        link_release(upstream, version, links)
    cache = folder / "cache"
    cache.mkdir()
    project = make_project(
        folder / "project", cache, upstream, "1.0", series=[STORY_FIX, STORY_LOCAL]
    )
    return World(upstream.path, cache, project.root)


def run(capsys: pytest.CaptureFixture[str], world: World, *args: str) -> tuple[int, str, str]:
    return cli(capsys, world.project, "--cache-dir", str(world.cache), *args)


def on(world: World, version: str) -> tuple[str, ...]:
    return ("--git", str(world.upstream), "--ref", f"v{version}")


def files(root: Path) -> dict[str, tuple[bool, str]]:
    """Every path under `root`: (is a symlink, text)."""
    return {
        p.relative_to(root).as_posix(): (p.is_symlink(), p.read_text())
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


@pytest.mark.parametrize("version", list(INSIDE))
def test_tree_reads_a_link_inside_the_package_through(
    world: World, version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The walk places the patches on the file the link leads to (`moved`); every link to it
    is written as a regular file with its text, patched or pristine. Before: refused (`the
    tree ... holds 'vllm/layers/moe.py', a symbolic link to 'experts/moe_impl.py'`)."""
    for kind, text in (("patched", PATCHED), ("pristine", MOE_TEXT)):
        dest = tmp_path / kind
        argv = ("tree", *(["--pristine"] if kind == "pristine" else []), str(dest))
        assert run(capsys, world, *argv, *on(world, version)) == (
            0,
            f"wrote {kind} tree to {dest}\n",
            "",
        )
        got = files(dest / "vllm")
        assert {path: got[path] for path in linked(version)} == {
            path: (False, text) for path in linked(version)
        }
        assert got["utils.py"] == (False, UTILS_TEXT)
        assert not any(link for link, _ in got.values())


def linked(version: str) -> list[str]:
    """The paths under vllm/ of the linked file and of the links to it."""
    return sorted(p.removeprefix("vllm/") for p in (IMPL, *INSIDE[version]))


@pytest.mark.parametrize("version", list(INSIDE))
def test_overlay_build_writes_each_link_as_the_patched_file(
    world: World, version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The installed package (a wheel holds no link) has each link as a file of its own: the
    overlay patches the linked file and every link to it. Before: only the linked file."""
    out = tmp_path / "out"
    sha = hashlib.sha256(PATCHED.encode()).hexdigest()
    keys = f"{STORY_FIX.name}, {STORY_LOCAL.name}"
    assert run(capsys, world, "overlay", "build", "--out", str(out), *on(world, version)) == (
        0,
        f"overlay for vllm {version}: {len(linked(version))} file(s) in {out}\n"
        + "".join(f"  vllm/{path} {sha[:12]} <- {keys}\n" for path in linked(version)),
        "",
    )
    assert files(out / "vllm") == {path: (False, PATCHED) for path in linked(version)}
    built = json.loads((out / "overlay.lock.json").read_text())["files"]
    pinned = json.loads((world.project / "overlay" / "overlay.lock.json").read_text())["files"]
    assert built == {f"vllm/{path}": pinned[MOE] for path in linked(version)}


@pytest.mark.parametrize("command", [("tree",), ("overlay", "build", "--out")])
@pytest.mark.parametrize("version", list(REFUSED))
def test_a_link_out_absolute_dangling_or_looping_is_one_line(
    world: World,
    version: str,
    command: tuple[str, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dest = tmp_path / "dest"
    assert run(capsys, world, *command, str(dest), *on(world, version)) == (
        2,
        "",
        f"vllm-patchset: {REFUSED[version][1]}\n",
    )
    assert not dest.exists()


SERIES = (bare_patch("patches/0001-a.patch"), bare_patch("patches/upstreamed/0002-b.patch"))
WITHOUT = [
    ((), ("patches/0001-a.patch", "patches/upstreamed/0002-b.patch")),
    (("0001-a.patch",), ("patches/upstreamed/0002-b.patch",)),  # by name
    (("patches/upstreamed/0002-b.patch",), ("patches/0001-a.patch",)),  # by key
    (("0001-a.patch", "0002-b.patch"), ()),
]


@pytest.mark.parametrize(("skip", "kept"), WITHOUT)
def test_without(skip: tuple[str, ...], kept: tuple[str, ...]) -> None:
    assert tuple(p.key for p in without(SERIES, skip)) == kept


def test_without_an_unknown_patch_is_one_line() -> None:
    with pytest.raises(BadInput) as caught:
        without(SERIES, ("0001-a.patch", "0009-z.patch"))
    assert str(caught.value) == "--skip 0009-z.patch: no such patch in the series or the archive"
