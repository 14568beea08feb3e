"""Verify, don't trust: the checkout's settings, the caller's environment, the package index,
archives and the tool's own journals, each tried as an attacker or an unlucky user would.

One table per class of input; every row states the damage, the command, its exit code and
its one line, and checks the type, mode and sha256 of every file it could have touched before
and after (`support.snapshot`). The rows run on the synthetic story (`tiny`), a fresh cache
and a local package index where a download is at stake, and on the real vllm 0.24.0 install
(`target`) for the deploy state and the start-up guard."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, cast

import pytest
from support import REPO, git, snapshot
from synthetic import MOE, STORY_FIX, LocalIndex, Story, sdist_bytes
from vllm_install import EDITED, EDITED_DIR, EDITED_MODULE, Overlay, Pristine, record_mismatches
from vllm_patchset.cli import main
from vllm_patchset.commands import status
from vllm_patchset.gpu import KIT_NAME, bundle, kitparts
from vllm_patchset.gpu.kitbuild import write_kit
from vllm_patchset.infra import archives, jsonfile
from vllm_patchset.infra.config import Project
from vllm_patchset.infra.fsio import OWNER_MARKER
from vllm_patchset.overlay.upstream import Mirror

STATE = ".vllm-patchset"
DEEP = b"[" * 200_000 + b"]" * 200_000  # json.loads would end in a RecursionError
SCHEMES = "https://, http://, ssh://, git://, file://"


@dataclass
class Case:
    """What a row does: the command line, the environment it adds, the exit code, stderr, and
    the folder whose every file must be as before (stdout is checked where it says)."""

    argv: list[str | Path]
    code: int
    err: str
    watch: Path
    env: dict[str, str] = field(default_factory=dict)
    out: str | None = ""
    process: bool = False  # in a process of its own (a FIFO could block; PATH changes)
    changed: set[str] = field(default_factory=set)  # entries below `watch` that may change


def run_case(
    case: Case, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> str:
    before = snapshot(case.watch)
    if case.process:
        done = subprocess.run(
            [sys.executable, "-m", "vllm_patchset", *map(str, case.argv)],
            capture_output=True,
            text=True,
            env={**os.environ, **case.env},
            timeout=60,
        )
        code, out, err = done.returncode, done.stdout, done.stderr
    else:
        for key, value in case.env.items():
            monkeypatch.setenv(key, value)
        code = main([str(a) for a in case.argv])
        out, err = capsys.readouterr()
    assert (code, err) == (case.code, case.err)
    if case.out is not None:
        assert out == case.out
    after = snapshot(case.watch)
    assert {k: v for k, v in after.items() if k not in case.changed} == {
        k: v for k, v in before.items() if k not in case.changed
    }
    return out


def run_in_project(
    project: Project,
    case: Case,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """``run_case`` with ``--project`` naming ``project`` unless the case names one itself."""
    if "--project" not in case.argv:
        case.argv = ["--project", project.root, *case.argv]
    return run_case(case, monkeypatch, capsys)


def _setting(project: Project, line: str, *, replace: str | None = None) -> Path:
    """pyproject.toml with `line` in [tool.vllm-patchset] (or in place of `replace`)."""
    text = project.pyproject.read_text()
    anchor = f'pin = "{project.pin}"\n'
    if replace is not None:
        text = text.replace(replace, line)
    else:
        text = text.replace(anchor, f"{anchor}{line}\n")
    project.pyproject.write_text(text)
    return project.pyproject


def _bad(pyproject: Path, key: str, value: str, why: str) -> str:
    return f"vllm-patchset: {pyproject}: [tool.vllm-patchset] {key} = {value}: {why}\n"


# -- 1. the checkout's settings --------------------------------------------------------------------
def overlay_beside_the_checkout(project: Project, tmp: Path) -> Case:
    """Was: `overlay = "../site"` made `overlay build` replace an installed vllm beside it."""
    site = tmp / "site" / "vllm"
    site.mkdir(parents=True)
    (site / "_C.abi3.so").write_bytes(b"\x7fELF compiled\n")
    pyproject = _setting(project, 'overlay = "../site"')
    why = "not a plain relative path inside the checkout"
    return Case(["overlay", "build"], 2, _bad(pyproject, "overlay", "'../site'", why), tmp)


def lock_outside_the_checkout(project: Project, tmp: Path) -> Case:
    """Was: `lock = "../victim.json"` with `--update-lock` overwrote a file outside."""
    (tmp / "victim.json").write_text('{"mine": true}\n')
    pyproject = _setting(project, 'lock = "../victim.json"')
    why = "not a plain relative path inside the checkout"
    message = _bad(pyproject, "lock", "'../victim.json'", why)
    return Case(["overlay", "build", "--update-lock"], 2, message, tmp)


def series_absolute(project: Project, tmp: Path) -> Case:
    pyproject = _setting(project, f'series = "{tmp}/elsewhere/series"')
    why = "not a plain relative path inside the checkout"
    return Case(["status"], 2, _bad(pyproject, "series", f"'{tmp}/elsewhere/series'", why), tmp)


def overlay_through_a_symlink(project: Project, tmp: Path) -> Case:
    (tmp / "elsewhere").mkdir()
    (tmp / "elsewhere" / "keep.txt").write_text("precious\n")
    (project.root / "generated").symlink_to(tmp / "elsewhere")
    pyproject = _setting(project, 'overlay = "generated/overlay"')
    link = project.root / "generated"
    return Case(
        ["overlay", "build"],
        2,
        f"vllm-patchset: {pyproject}: [tool.vllm-patchset] overlay: refusing {link}: it is a"
        f" symlink (to {tmp / 'elsewhere'}); the tool does not follow symlinks inside what it"
        " reads or writes\n",
        tmp,
    )


def pin_of_the_wrong_type(project: Project, tmp: Path) -> Case:
    """Was: a traceback (a wrong-typed value reached `str()` or a Path join)."""
    pyproject = _setting(project, "pin = 1.0", replace=f'pin = "{project.pin}"')
    return Case(["status"], 2, _bad(pyproject, "pin", "1.0", "expected a non-empty string"), tmp)


def overlay_of_the_wrong_type(project: Project, tmp: Path) -> Case:
    pyproject = _setting(project, "overlay = ['a']")
    return Case(
        ["status"], 2, _bad(pyproject, "overlay", "['a']", "expected a non-empty string"), tmp
    )


def pyproject_not_utf8(project: Project, tmp: Path) -> Case:
    """Was: a traceback (UnicodeDecodeError)."""
    text = project.pyproject.read_bytes()
    project.pyproject.write_bytes(text + b"# caf\xe9\n")
    return Case(
        ["status"],
        2,
        f"vllm-patchset: {project.pyproject}: not UTF-8 text (byte 0xe9 at offset"
        f" {len(text) + 5})\n",
        tmp,
    )


def pyproject_a_fifo(project: Project, tmp: Path) -> Case:
    """Was: `status --project DIR` hung on a FIFO pyproject.toml."""
    project.pyproject.unlink()
    os.mkfifo(project.pyproject)
    return Case(
        ["--project", project.root, "status"],
        2,
        f"vllm-patchset: refusing {project.pyproject}: it is a FIFO, not a regular file\n",
        tmp,
        process=True,
    )


def pin_git_an_option(project: Project, tmp: Path) -> Case:
    """Was: `pin-git = "--upload-pack=CMD;"` ran CMD on a plain `status`."""
    value = f"--upload-pack=touch {tmp}/pwned;"
    pyproject = _setting(project, f'pin-git = "{value}"\npin-ref = "main"')
    return Case(
        ["status"],
        2,
        f"vllm-patchset: {pyproject}: [tool.vllm-patchset] pin-git: {value!r} is not a URL"
        f" ({SCHEMES}), user@host:path or a local path\n",
        tmp,
    )


def pin_ref_an_option(project: Project, tmp: Path) -> Case:
    pyproject = _setting(project, f'pin-git = "{tmp}/up"\npin-ref = "--output={tmp}/x"')
    return Case(
        ["status"],
        2,
        f"vllm-patchset: {pyproject}: [tool.vllm-patchset] pin-ref: '--output={tmp}/x' is not a"
        " git ref or commit\n",
        tmp,
    )


def index_url_of_another_scheme(project: Project, tmp: Path) -> Case:
    old = f'index-url = "{project.index_url}"'
    pyproject = _setting(project, 'index-url = "ftp://example.com/simple"', replace=old)
    why = "not an http, https or file URL"
    return Case(["status"], 2, _bad(pyproject, "index-url", "'ftp://example.com/simple'", why), tmp)


SETTINGS = (
    overlay_beside_the_checkout,
    lock_outside_the_checkout,
    series_absolute,
    overlay_through_a_symlink,
    pin_of_the_wrong_type,
    overlay_of_the_wrong_type,
    pyproject_not_utf8,
    pyproject_a_fifo,
    pin_git_an_option,
    pin_ref_an_option,
    index_url_of_another_scheme,
)


@pytest.mark.parametrize("make", SETTINGS)
def test_settings_are_checked_before_use(
    tiny: Project,
    tmp_path: Path,
    make: Callable[[Project, Path], Case],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_in_project(tiny, make(tiny, tmp_path), monkeypatch, capsys)


# -- 2. the caller's environment and values that could read as options ------------------------------
@pytest.fixture
def user_repo(tmp_path: Path) -> Path:
    """The repository of a user whose git hook runs the tool (a linked worktree's hook: git
    exports GIT_DIR to it)."""
    repo = tmp_path / "user"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "work.txt").write_text("the user's work\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "work")
    git(repo, "tag", "v1.0")
    return repo


def _expected(tiny: Project, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["--project", str(tiny.root), *argv])
    return code, capsys.readouterr().out


def git_dir_of_a_hook(tiny: Project, repo: Path, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """Was: the mirror's git calls acted on the hook's repository (core.bare, tags moved)."""
    return ["fetch", "1.0"], {"GIT_DIR": str(repo / ".git")}


def git_work_tree_set(tiny: Project, repo: Path, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """Was: with GIT_WORK_TREE set, every command that uses the mirror failed."""
    return ["status"], {"GIT_WORK_TREE": str(repo)}


def git_object_directory_set(
    tiny: Project, repo: Path, tmp: Path
) -> tuple[list[str], dict[str, str]]:
    return ["status"], {"GIT_OBJECT_DIRECTORY": str(repo / ".git" / "objects")}


def git_config_injected(tiny: Project, repo: Path, tmp: Path) -> tuple[list[str], dict[str, str]]:
    hook = tmp / "hooks"
    hook.mkdir()
    env = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.bare"}
    return ["fetch", "1.0"], {**env, "GIT_CONFIG_VALUE_0": "false", "GIT_INDEX_FILE": str(hook)}


CALLER_ENV = (git_dir_of_a_hook, git_work_tree_set, git_object_directory_set, git_config_injected)


@pytest.mark.parametrize("make", CALLER_ENV)
def test_git_runs_without_the_callers_git_variables(
    tiny: Project,
    user_repo: Path,
    tmp_path: Path,
    make: Callable[..., tuple[list[str], dict[str, str]]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv, env = make(tiny, user_repo, tmp_path)
    code, out = _expected(tiny, capsys, *argv)  # what it answers in a clean environment
    case = Case(["--project", tiny.root, *argv], code, "", user_repo, env=env, out=out)
    run_case(case, monkeypatch, capsys)


OPTION_VALUES = [  # (fetch arguments, what the one line says)
    (
        ["--git=--upload-pack=touch {tmp}/pwned;", "--ref", "main"],
        "a git source '--upload-pack=touch {tmp}/pwned;' is not a URL ({schemes}), user@host:path"
        " or a local path",
    ),
    (
        ["--git", "ext::sh -c touch% {tmp}/pwned", "--ref", "main"],
        "a git source 'ext::sh -c touch% {tmp}/pwned' is not a URL ({schemes}), user@host:path or"
        " a local path",
    ),
    (
        ["--git", "{upstream}", "--ref=--output={tmp}/x"],
        "a git ref '--output={tmp}/x' is not a git ref or commit",
    ),
    (
        ["--git", "{upstream}", "--ref", "v1.0:refs/heads/x"],
        "a git ref 'v1.0:refs/heads/x' is not a git ref or commit",
    ),
    (
        ["--git", "ssh://-oProxyCommand=touch%20{tmp}/pwned/vllm.git", "--ref", "main"],
        "a git source 'ssh://-oProxyCommand=touch%20{tmp}/pwned/vllm.git' is not a URL"
        " ({schemes}), user@host:path or a local path",
    ),
]


@pytest.mark.parametrize(("argv", "why"), OPTION_VALUES)
def test_values_never_reach_git_as_options(
    tiny: Project,
    story: Story,
    tmp_path: Path,
    argv: list[str],
    why: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    names = {"tmp": tmp_path, "upstream": story.upstream.path, "schemes": SCHEMES}
    argv = [a.format(**names) for a in argv]
    message = f"vllm-patchset: {why.format(**names)}\n"
    run_case(
        Case(["--project", tiny.root, "fetch", *argv], 2, message, tmp_path), monkeypatch, capsys
    )
    assert not (tmp_path / "pwned").exists()


# -- 3. the package index ----------------------------------------------------------------------------
@pytest.fixture
def index(tmp_path: Path) -> Iterator[LocalIndex]:
    with LocalIndex(tmp_path / "index") as served:
        yield served


RELEASE = {"vllm/__init__.py": "", "vllm/layers/moe.py": "x = 1\n"}


def _page(index: LocalIndex, doc: object) -> None:
    (index.root / "simple" / "vllm" / "index.html").write_text(json.dumps(doc))


def index_without_hashes(index: LocalIndex) -> tuple[int, str]:
    """Was: an AssertionError traceback."""
    index.publish("vllm-1.0.tar.gz", sdist_bytes("1.0", RELEASE))
    _page(index, {"files": [{k: v for k, v in index.entries[0].items() if k != "hashes"}]})
    return 2, (
        "the package index gives no sha256 for vllm-1.0.tar.gz: it cannot be verified, nothing"
        " was downloaded"
    )


def index_sha256_not_hex(index: LocalIndex) -> tuple[int, str]:
    index.publish("vllm-1.0.tar.gz", sdist_bytes("1.0", RELEASE), sha256="not-a-digest")
    return 2, (
        "the package index gives no sha256 for vllm-1.0.tar.gz: it cannot be verified, nothing"
        " was downloaded"
    )


def index_relative_url(index: LocalIndex) -> tuple[int, str]:
    """Was: a traceback (urlopen of a relative URL); PEP 691 allows them."""
    index.publish("vllm-1.0.tar.gz", sdist_bytes("1.0", RELEASE))
    _page(index, {"files": [{**index.entries[0], "url": "../../files/vllm-1.0.tar.gz"}]})
    return 0, "downloaded vllm-1.0.tar.gz, sha256 verified"


def index_of_the_wrong_shape(index: LocalIndex) -> tuple[int, str]:
    """Was: a TypeError traceback."""
    _page(index, {"files": {"vllm-1.0.tar.gz": {}}})
    return 2, (
        f"the package index {index.url}/vllm/ answered no PEP 691 page ('files' is a JSON"
        " object, not a JSON array) and the release is not cached"
    )


def index_entry_not_an_object(index: LocalIndex) -> tuple[int, str]:
    _page(index, {"files": ["vllm-1.0.tar.gz"]})
    return 2, (
        f"the package index {index.url}/vllm/ answered no PEP 691 page (a file entry is not a"
        " JSON object) and the release is not cached"
    )


def index_not_json(index: LocalIndex) -> tuple[int, str]:
    (index.root / "simple" / "vllm" / "index.html").write_bytes(b"<html>\xff</html>")
    return 2, (
        f"the package index {index.url}/vllm/ answered no PEP 691 page (not UTF-8 (byte 0xff at"
        " offset 6)) and the release is not cached"
    )


def index_url_of_another_scheme_entry(index: LocalIndex) -> tuple[int, str]:
    index.publish("vllm-1.0.tar.gz", sdist_bytes("1.0", RELEASE))
    _page(index, {"files": [{**index.entries[0], "url": "ftp://example.com/vllm-1.0.tar.gz"}]})
    return 2, (
        f"the package index {index.url}/vllm/ answered no PEP 691 page (the URL of"
        " vllm-1.0.tar.gz is not http, https or file) and the release is not cached"
    )


def index_file_name_a_path(index: LocalIndex) -> tuple[int, str]:
    index.publish("vllm-1.0.tar.gz", sdist_bytes("1.0", RELEASE))
    _page(index, {"files": [{**index.entries[0], "filename": "../vllm-1.0.tar.gz"}]})
    return 2, (
        f"the package index {index.url}/vllm/ answered no PEP 691 page (file name"
        " '../vllm-1.0.tar.gz' is not a plain file name) and the release is not cached"
    )


INDEX_ANSWERS = (
    index_without_hashes,
    index_sha256_not_hex,
    index_relative_url,
    index_of_the_wrong_shape,
    index_entry_not_an_object,
    index_not_json,
    index_url_of_another_scheme_entry,
    index_file_name_a_path,
)


@pytest.mark.parametrize("make", INDEX_ANSWERS)
def test_the_index_answer_is_checked(
    tiny: Project,
    index: LocalIndex,
    tmp_path: Path,
    make: Callable[[LocalIndex], tuple[int, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, line = make(index)
    text = tiny.pyproject.read_text().replace(tiny.index_url, index.url)
    tiny.pyproject.write_text(text)
    cache = tmp_path / "fresh-cache"
    before = snapshot(tiny.root, skip_git=True)
    got = main(["--project", str(tiny.root), "--cache-dir", str(cache), "fetch", "1.0"])
    err = capsys.readouterr().err
    assert (got, err.splitlines()[0]) == (code, line if code == 0 else f"vllm-patchset: {line}")
    assert err.count("\n") == 1
    assert snapshot(tiny.root, skip_git=True) == before
    if code:
        assert Mirror(cache).repo.tags("*") == []


# -- 4. archives: sdists, kits, trees ----------------------------------------------------------------
def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def _member(name: str, data: bytes = b"", **attrs: object) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data) if attrs.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else 0
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, data


def _kit(folder: Path, stream: bytes) -> Path:
    """A kit folder whose parts are `stream` (a tar) compressed: the parts check out, so only
    the tool's own check of each member stands between the archive and the disk."""
    folder.mkdir()
    with (
        kitparts.PartWriter(folder, 4096) as parts,
        lzma.open(cast(BinaryIO, parts), "wb", preset=0) as xz,
    ):
        xz.write(stream)
    manifest = kitparts.Manifest(
        vllm="0.24.0",
        wheel="vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        wheel_sha256="ab" * 32,
        record_sha256="cd" * 32,
        site_files=1,
        wheels={},
        parts=tuple(parts.parts),
    )
    (folder / kitparts.MANIFEST).write_text(manifest.to_json())
    return folder


def kit_link_then_through_it(tmp: Path) -> tuple[list[tuple[tarfile.TarInfo, bytes]], str]:
    """CVE-2025-4517's shape: a link member, then a file written through it. On Python 3.11.7
    tarfile's data filter let such an archive write outside the folder before any check."""
    outside = tmp / "outside"
    members = [
        _member("site", type=tarfile.DIRTYPE, mode=0o755),
        _member("site/escape", type=tarfile.SYMTYPE, linkname=str(outside)),
        _member("site/escape/sitecustomize.py", b"import os  # run as root\n"),
    ]
    return (
        members,
        f"the kit's archive holds 'site/escape', a symbolic link to '{outside}': refused",
    )


def kit_dot_dot(tmp: Path) -> tuple[list[tuple[tarfile.TarInfo, bytes]], str]:
    members = [_member("site/../../evil.py", b"x\n")]
    return (
        members,
        "the kit's archive holds 'site/../../evil.py', not a plain relative path: refused",
    )


def kit_absolute(tmp: Path) -> tuple[list[tuple[tarfile.TarInfo, bytes]], str]:
    name = f"{tmp}/outside/evil.py"
    return [
        _member(name, b"x\n")
    ], f"the kit's archive holds {name!r}, not a plain relative path: refused"


def kit_hard_link(tmp: Path) -> tuple[list[tuple[tarfile.TarInfo, bytes]], str]:
    members = [
        _member("site/a.py", b"x\n"),
        _member("site/b.py", type=tarfile.LNKTYPE, linkname="/etc/passwd"),
    ]
    return members, "the kit's archive holds 'site/b.py', a hard link to '/etc/passwd': refused"


def kit_device(tmp: Path) -> tuple[list[tuple[tarfile.TarInfo, bytes]], str]:
    members = [_member("site/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3)]
    return members, "the kit's archive holds 'site/null', a device: refused"


def kit_outside_its_folders(tmp: Path) -> tuple[list[tuple[tarfile.TarInfo, bytes]], str]:
    return [
        _member("bin/run", b"x\n")
    ], "the kit's archive holds 'bin/run', outside site/, wheels/: refused"


def kit_a_member_twice(tmp: Path) -> tuple[list[tuple[tarfile.TarInfo, bytes]], str]:
    members = [_member("site/a.py", b"one\n"), _member("site/a.py", b"two\n")]
    return members, "the kit's archive holds 'site/a.py' twice: refused"


def kit_realpath_overflow(tmp: Path) -> tuple[list[tuple[tarfile.TarInfo, bytes]], str]:
    """CVE-2025-4517 itself: folders and links nested past PATH_MAX, where os.path.realpath
    stops resolving, so that tarfile's data filter sees `escape` inside the folder while the
    kernel resolves it outside. On this machine's Python 3.11.7, `extractall(filter="data")`
    of these members (without the `site/` prefix) writes `pwned.txt` beside the destination."""
    comp, steps = "d" * 247, "abcdefghijklmnop"
    members, path = [], "site"
    for step in steps:
        members.append(_member(f"{path}/{comp}", type=tarfile.DIRTYPE, mode=0o755))
        members.append(_member(f"{path}/{step}", type=tarfile.SYMTYPE, linkname=comp))
        path = f"{path}/{comp}"
    linkpath = "site/" + "/".join(steps) + "/" + "l" * 254
    members.append(_member(linkpath, type=tarfile.SYMTYPE, linkname="../" * len(steps)))
    escape = linkpath.removeprefix("site/") + "/../" * 2
    members.append(_member("site/escape", type=tarfile.SYMTYPE, linkname=escape))
    members.append(_member("site/escape/pwned.txt", b"pwned\n"))
    return members, f"the kit's archive holds 'site/a', a symbolic link to '{comp}': refused"


def kit_link_inside(tmp: Path) -> tuple[list[tuple[tarfile.TarInfo, bytes]], str]:
    """A link that stays inside: tarfile's data filter lets it through; a wheel has none."""
    members = [
        _member("site/b.py", b"x\n"),
        _member("site/a.py", type=tarfile.SYMTYPE, linkname="b.py"),
    ]
    return members, "the kit's archive holds 'site/a.py', a symbolic link to 'b.py': refused"


KIT_MEMBERS = (
    kit_realpath_overflow,
    kit_link_then_through_it,
    kit_link_inside,
    kit_dot_dot,
    kit_absolute,
    kit_hard_link,
    kit_device,
    kit_outside_its_folders,
    kit_a_member_twice,
)


@pytest.mark.parametrize("make", KIT_MEMBERS)
def test_kit_members_are_refused_before_extraction(
    tmp_path: Path,
    make: Callable[[Path], tuple[list[tuple[tarfile.TarInfo, bytes]], str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "outside").mkdir()
    members, why = make(tmp_path)
    kit = _kit(tmp_path / "kit", _tar(members))
    dest = tmp_path / "native"
    case = Case(["kit", "assemble", kit, "--dest", dest], 1, f"vllm-patchset: {why}\n", tmp_path)
    run_case(case, monkeypatch, capsys)
    assert not dest.exists() and not [p for p in tmp_path.iterdir() if ".partial" in p.name]
    assert not list(tmp_path.parent.glob("pwned.txt"))


@pytest.fixture
def real_kit(tmp_path: Path) -> Path:
    from kits import WHEEL_FILES, make_wheel

    wheel = make_wheel(tmp_path / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl", WHEEL_FILES)
    kit = tmp_path / "kit"
    write_kit(wheel, "ab" * 32, "0.24.0", kit, level=0)
    return kit


def test_an_assembled_kit_is_verified_file_by_file(
    real_kit: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Was: an existing --dest whose completion marker matched was trusted, its files unread."""
    dest = tmp_path / "native"
    assert main(["kit", "assemble", str(real_kit), "--dest", str(dest)]) == 0
    capsys.readouterr()
    altered = dest / "site" / "vllm" / "__init__.py"
    altered.write_text("import os; os.system('id')\n")
    message = (
        f"vllm-patchset: {dest} was assembled from this kit, but {altered} is not as assembled:"
        " remove the folder and assemble again\n"
    )
    run_case(
        Case(["kit", "assemble", real_kit, "--dest", dest], 2, message, tmp_path),
        monkeypatch,
        capsys,
    )


def test_a_killed_assembly_is_swept(
    real_kit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: a killed `kit assemble` left its `.partial-PID` folder forever."""
    child = subprocess.Popen(["true"])
    child.wait()
    left = tmp_path / f".native.partial-{child.pid}-x1y2"
    (left / "site").mkdir(parents=True)
    mine = tmp_path / f".native.partial-{os.getpid()}-live"  # a live run's: left alone
    mine.mkdir()
    assert main(["kit", "assemble", str(real_kit), "--dest", str(tmp_path / "native")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if ".partial" in p.name) == [mine.name]
    assert capsys.readouterr().err == ""


def test_run_sh_makes_its_folders_with_mktemp() -> None:
    """Was: fixed /tmp/vllm-patchset-site and /tmp/vllm-patchset-native, which another user of
    a shared GPU host could create first (with a sitecustomize.py run as root)."""
    script = bundle.RUN_SH.format(kit=KIT_NAME)
    assert "/tmp/vllm-patchset-" not in script
    assert script.count('$(mktemp -d "$TMP/vllm-patchset-') == 2


def _sdist(version: str, members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(_tar(members))
    return out.getvalue()


def _release(version: str, extra: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    base = [_member(f"vllm-{version}/{path}", text.encode()) for path, text in RELEASE.items()]
    return _sdist(version, [*base, *extra])


def sdist_member_too_large(index: LocalIndex, cache: Path) -> tuple[int, str]:
    """Was: a 2 GiB member was read whole (2.1 GB RSS). Its header alone is refused here (the
    archive ends after it: its 300 MiB are never there, nor read)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, text in RELEASE.items():
            info, data = _member(f"vllm-1.0/{path}", text.encode())
            tar.addfile(info, io.BytesIO(data))
        end = tar.offset
    big, _ = _member("vllm-1.0/vllm/big.py")
    big.size = 300 << 20
    header = big.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    raw = out.getvalue()[:end] + header + b"x" * 512
    index.publish("vllm-1.0.tar.gz", gzip.compress(raw, mtime=0))
    return 2, (
        f"{cache}/sdists/vllm-1.0.tar.gz holds 'vllm-1.0/vllm/big.py' of {300 << 20} bytes, over"
        " the bound of 268435456 a member: refused"
    )


def sdist_member_leads_out(index: LocalIndex, cache: Path) -> tuple[int, str]:
    index.publish(
        "vllm-1.0.tar.gz", _release("1.0", [_member("vllm-1.0/vllm/../../../evil.py", b"x\n")])
    )
    return 2, (
        f"{cache}/sdists/vllm-1.0.tar.gz holds 'vllm-1.0/vllm/../../../evil.py', not a plain"
        " relative path: refused"
    )


def sdist_member_twice(index: LocalIndex, cache: Path) -> tuple[int, str]:
    twice = _member("vllm-1.0/vllm/layers/moe.py", b"y = 2\n")
    index.publish("vllm-1.0.tar.gz", _release("1.0", [twice]))
    return 2, f"{cache}/sdists/vllm-1.0.tar.gz holds 'vllm-1.0/vllm/layers/moe.py' twice: refused"


SDISTS = (sdist_member_too_large, sdist_member_leads_out, sdist_member_twice)


@pytest.mark.parametrize("make", SDISTS)
def test_sdist_members_are_checked_and_bounded(
    tiny: Project,
    index: LocalIndex,
    tmp_path: Path,
    make: Callable[[LocalIndex, Path], tuple[int, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    cache = tmp_path / "fresh-cache"
    code, line = make(index, cache)
    tiny.pyproject.write_text(tiny.pyproject.read_text().replace(tiny.index_url, index.url))
    got = main(["--project", str(tiny.root), "--cache-dir", str(cache), "fetch", "1.0"])
    err = capsys.readouterr().err.splitlines()
    assert (got, err) == (
        code,
        ["downloaded vllm-1.0.tar.gz, sha256 verified", f"vllm-patchset: {line}"],
    )
    assert Mirror(cache).repo.tags("*") == []


def test_gitattributes_in_an_sdist_change_no_stored_byte(
    tiny: Project, index: LocalIndex, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: a `.gitattributes` inside an sdist changed the bytes the mirror stored."""
    crlf = b"x = 1\r\ny = 2\r\n"
    attributes = b"*.py text eol=lf\n* ident\n"
    extra = [
        _member("vllm-1.0/vllm/.gitattributes", attributes),
        _member("vllm-1.0/vllm/win.py", crlf),
    ]
    index.publish("vllm-1.0.tar.gz", _release("1.0", extra))
    tiny.pyproject.write_text(tiny.pyproject.read_text().replace(tiny.index_url, index.url))
    cache = tmp_path / "fresh-cache"
    assert main(["--project", str(tiny.root), "--cache-dir", str(cache), "fetch", "1.0"]) == 0
    capsys.readouterr()
    mirror = Mirror(cache)
    commit = mirror.release("1.0").commit
    assert mirror.repo.read_blob(commit, "vllm/win.py") == crlf
    assert mirror.repo.read_blob(commit, "vllm/.gitattributes") == attributes


# -- 5. the tool's own files: locks, records, journals, kit.json ---------------------------------------
def lock_nested_deep(project: Project, tmp: Path) -> Case:
    """Was: a RecursionError traceback."""
    project.lock_path.write_bytes(DEEP)
    why = "nested deeper than 32 levels"
    return Case(
        ["overlay", "build"],
        2,
        f"vllm-patchset: {project.lock_path}: not a valid overlay lock ({why})\n",
        tmp,
    )


def lock_not_utf8(project: Project, tmp: Path) -> Case:
    project.lock_path.write_bytes(b'{"schema": "\xff"}')
    why = "not UTF-8 (byte 0xff at offset 12)"
    return Case(
        ["overlay", "build"],
        2,
        f"vllm-patchset: {project.lock_path}: not a valid overlay lock ({why})\n",
        tmp,
    )


def lock_a_fifo(project: Project, tmp: Path) -> Case:
    project.lock_path.unlink()
    os.mkfifo(project.lock_path)
    message = f"vllm-patchset: refusing {project.lock_path}: it is a FIFO, not a regular file\n"
    return Case(["--project", project.root, "overlay", "build"], 1, message, tmp, process=True)


def kit_json_nested_deep(project: Project, tmp: Path) -> Case:
    (tmp / "kit").mkdir()
    (tmp / "kit" / "kit.json").write_bytes(DEEP)
    message = f"vllm-patchset: {tmp}/kit/kit.json is malformed (nested deeper than 32 levels)\n"
    return Case(["kit", "verify", tmp / "kit"], 1, message, tmp)


def kit_json_not_utf8(project: Project, tmp: Path) -> Case:
    (tmp / "kit").mkdir()
    (tmp / "kit" / "kit.json").write_bytes(b'{"format": 1, "vllm": "\xe9"}')
    message = (
        f"vllm-patchset: {tmp}/kit/kit.json is malformed (not UTF-8 (byte 0xe9 at offset 23))\n"
    )
    return Case(["kit", "verify", tmp / "kit"], 1, message, tmp)


def kit_json_a_fifo(project: Project, tmp: Path) -> Case:
    (tmp / "kit").mkdir()
    os.mkfifo(tmp / "kit" / "kit.json")
    message = (
        f"vllm-patchset: {tmp}/kit/kit.json is malformed (not a regular file (a link, FIFO,"
        " device or folder))\n"
    )
    return Case(["kit", "verify", tmp / "kit"], 1, message, tmp, process=True)


OWN_FILES = (
    lock_nested_deep,
    lock_not_utf8,
    lock_a_fifo,
    kit_json_nested_deep,
    kit_json_not_utf8,
    kit_json_a_fifo,
)


@pytest.mark.parametrize("make", OWN_FILES)
def test_the_tools_own_files_are_checked(
    tiny: Project,
    tmp_path: Path,
    make: Callable[[Project, Path], Case],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_in_project(tiny, make(tiny, tmp_path), monkeypatch, capsys)


REBASE_JOURNALS = [  # (how the journal is damaged, what the one line says of it)
    (
        lambda doc: {**doc, "moves": ["../outside.txt"]},
        "a move '../outside.txt' is not a plain path inside the checkout",
    ),
    (
        lambda doc: {**doc, "moves": [".git/config"]},
        "a move '.git/config' is not a plain path inside the checkout",
    ),
    (
        lambda doc: {**doc, "moves": ["/etc/passwd"]},
        "a move '/etc/passwd' is not a plain path inside the checkout",
    ),
    (None, "nested deeper than 32 levels"),
]


@pytest.mark.parametrize(("damage", "why"), REBASE_JOURNALS)
def test_a_tampered_rebase_journal_is_refused(
    tiny: Project,
    tmp_path: Path,
    damage: Callable[[dict[str, object]], dict[str, object]] | None,
    why: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Was: `.rebase/state.json` "moves" were not checked: `rebase --continue` replaced a file
    beside the checkout."""
    (tmp_path / "outside.txt").write_text("the user's\n")
    assert main(["--project", str(tiny.root), "rebase", "--onto", "1.1"]) == 1  # a conflict
    capsys.readouterr()
    state = tiny.root / ".rebase" / "state.json"
    doc = json.loads(state.read_text())
    state.write_bytes(DEEP if damage is None else json.dumps(damage(doc)).encode())
    message = (
        f"vllm-patchset: {state} is damaged ({why}): `vllm-patchset rebase --abort` restores the"
        " checkout as it was before the rebase\n"
    )
    run_case(
        Case(["--project", tiny.root, "rebase", "--continue"], 2, message, tmp_path),
        monkeypatch,
        capsys,
    )


# -- 6. build outputs: nothing the tool did not create is removed --------------------------------------
def _kit_in_build(project: Project, tmp: Path) -> Path:
    """`kit build`'s default output, as it leaves it (in the build folder it marked)."""
    from kits import WHEEL_FILES, make_wheel

    build = project.root / "build"
    build.mkdir()
    (build / OWNER_MARKER).write_text("made by vllm-patchset\n")
    wheel = make_wheel(tmp / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl", WHEEL_FILES)
    write_kit(wheel, "ab" * 32, "0.24.0", build / "vllm-patchset-kit", level=0)
    return build / "vllm-patchset-kit"


def test_bundle_never_touches_its_kit(
    tiny: Project,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Was: `kit build` then `bundle --kit build/vllm-patchset-kit` (the README's order) deleted
    its own input, then failed with `no kit.json`."""
    from support import export_committed

    export_committed(["tests/gpu"], tiny.root)
    kit = _kit_in_build(tiny, tmp_path)
    before = snapshot(kit)
    argv = ["--project", str(tiny.root), "bundle", "--no-wheels", "--level", "0", "--kit", str(kit)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == f"wrote {kit} (the kit's parts: copy them beside it)"
    assert snapshot(kit) == before


def build_a_symlink(project: Project, tmp: Path) -> tuple[list[str], Path]:
    """Was: `kit build` and `validate --build-only` removed through a symlinked build/."""
    (tmp / "mine" / "vllm-patchset-kit").mkdir(parents=True)
    (tmp / "mine" / "vllm-patchset-kit" / "notes.txt").write_text("precious\n")
    (tmp / "mine" / "gpu").mkdir()
    (project.root / "build").symlink_to(tmp / "mine")
    build = project.root / "build"
    return [f"the build folder {build} is a symlink (to {tmp / 'mine'}): give a real dir"], tmp


def build_holds_user_files(project: Project, tmp: Path) -> tuple[list[str], Path]:
    build = project.root / "build"
    (build / "gpu").mkdir(parents=True)
    (build / "gpu" / "notes.txt").write_text("precious\n")
    return [
        f"the build folder {build} is not empty and was not made by vllm-patchset (no"
        f" {OWNER_MARKER} in it): give a new or empty directory; nothing was written"
    ], tmp


def build_a_file(project: Project, tmp: Path) -> tuple[list[str], Path]:
    build = project.root / "build"
    build.write_text("a file\n")
    return [f"the build folder {build} is a regular file, not a directory"], tmp


BUILD_DIRS = (build_a_symlink, build_holds_user_files, build_a_file)
BUILDERS = (["kit", "build"], ["validate", "--build-only"], ["bundle", "--no-wheels"])


@pytest.mark.parametrize("argv", BUILDERS, ids=" ".join)
@pytest.mark.parametrize("make", BUILD_DIRS)
def test_build_outputs_are_replaced_only_where_the_tool_made_them(
    tiny: Project,
    tmp_path: Path,
    make: Callable[[Project, Path], tuple[list[str], Path]],
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (line,), watch = make(tiny, tmp_path)
    case = Case(["--project", tiny.root, *argv], 2, f"vllm-patchset: {line}\n", watch)
    run_case(case, monkeypatch, capsys)


# -- 7. the deploy state and the start-up guard (the real vllm 0.24.0 install) -------------------------
def deploy(overlay: Overlay, *args: str | Path) -> list[str | Path]:
    project = overlay.project
    return ["--project", project.root, "--cache-dir", project.cache_dir, "overlay", *args]


def record_nested_deep(target: Path) -> tuple[str, int, str]:
    """Was: a RecursionError traceback, and under STRICT vLLM started anyway."""
    record = target / STATE / "applied.json"
    record.write_bytes(DEEP)
    return (
        "status",
        2,
        f"{record}: not a valid record (nested deeper than 32 levels); move it away to continue",
    )


def record_not_utf8(target: Path) -> tuple[str, int, str]:
    record = target / STATE / "applied.json"
    record.write_bytes(b'{"schema": 1, "x": "\xff"}')
    why = "not UTF-8 (byte 0xff at offset 20)"
    return "status", 2, f"{record}: not a valid record ({why}); move it away to continue"


def journal_not_utf8(target: Path) -> tuple[str, int, str]:
    journal = target / STATE / "journal.jsonl"
    journal.write_bytes(b'{"op": "apply\xff"}\n')
    why = "not UTF-8 (byte 0xff at offset 13)"
    return "status", 2, f"{journal}: unreadable journal ({why}): check the files, then remove it"


def journal_step_of_the_wrong_type(target: Path) -> tuple[str, int, str]:
    journal = target / STATE / "journal.jsonl"
    journal.write_text(json.dumps({"op": "apply", "id": "x", "files": [{"path": 1}]}) + "\n")
    why = "files[0]: 'path' is a JSON number, not a JSON string"
    return "status", 2, f"{journal}: unreadable journal ({why}): check the files, then remove it"


def state_lock_a_fifo(target: Path) -> tuple[str, int, str]:
    """Was: a FIFO where .vllm-patchset/lock was hung `overlay verify`."""
    lock = target / STATE / "lock"
    lock.unlink()
    os.mkfifo(lock)
    return "verify", 1, f"refusing {lock}: it is a FIFO, not a regular file"


def stale_pyc_a_directory(target: Path) -> tuple[str, int, str]:
    """Was: `apply` stopped half-way, then status, revert and apply --force all exited 1."""
    shutil.rmtree(target / STATE, ignore_errors=True)
    pycache = target / EDITED_DIR / "__pycache__"
    pyc = pycache / f"{EDITED_MODULE}.cpython-311.pyc"
    pyc.mkdir(parents=True)
    return (
        "apply",
        1,
        (
            f"cannot remove the stale bytecode {pyc} (it is a directory): remove it, then apply;"
            " nothing was changed"
        ),
    )


DEPLOY_STATE = (
    record_nested_deep,
    record_not_utf8,
    journal_not_utf8,
    journal_step_of_the_wrong_type,
    state_lock_a_fifo,
    stale_pyc_a_directory,
)


@pytest.mark.parametrize("make", DEPLOY_STATE)
def test_deploy_state_is_checked(
    overlay: Overlay,
    target: Path,
    make: Callable[[Path], tuple[str, int, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([str(a) for a in deploy(overlay, "apply", "--target", target)]) == 0
    capsys.readouterr()
    if make is stale_pyc_a_directory:  # from a pristine target: apply must refuse up front
        assert main([str(a) for a in deploy(overlay, "revert", "--target", target)]) == 0
        capsys.readouterr()
    command, code, line = make(target)
    case = Case(
        deploy(overlay, command, "--target", target),
        code,
        f"vllm-patchset: {line}\n",
        target,
        process=make is state_lock_a_fifo,  # a FIFO could block: in a process of its own
    )
    run_case(case, monkeypatch, capsys)


GUARD = (
    "import logging, sys\n"
    "logging.basicConfig(stream=sys.stdout, format='%(levelname)s %(message)s', level=logging.INFO)\n"
    "from vllm_patchset.deploy.guard import register\nregister()\nprint('vLLM goes on')\n"
)


def start_guard(target: Path, *, strict: bool) -> tuple[int, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PATCHSET_STRICT"}
    env["PYTHONPATH"] = os.pathsep.join([str(target), env.get("PYTHONPATH", "")])
    if strict:
        env["VLLM_PATCHSET_STRICT"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", GUARD], capture_output=True, text=True, env=env, timeout=60
    )
    lines = done.stdout.splitlines() + done.stderr.strip().splitlines()[-1:]
    return done.returncode, lines


def test_strict_stops_on_every_failure_to_confirm(
    overlay: Overlay, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: VLLM_PATCHSET_STRICT=1 was bypassed when the record could not be read (a
    RecursionError): vLLM started."""
    assert main([str(a) for a in deploy(overlay, "apply", "--target", target)]) == 0
    capsys.readouterr()
    record = target / STATE / "applied.json"
    record.write_bytes(DEEP)
    message = (
        f"vllm-patchset: unreadable record {record} (nested deeper than 32 levels): the overlay"
        " cannot be confirmed (run `vllm-patchset overlay status`)"
    )
    assert start_guard(target, strict=True) == (
        1,
        [f"vllm_patchset.deploy.guard.OverlayNotActive: {message} [VLLM_PATCHSET_STRICT=1]"],
    )
    assert start_guard(target, strict=False) == (0, [f"WARNING {message}", "vLLM goes on"])


def test_guard_reads_an_install_made_of_links(
    overlay: Overlay, target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """uv's `--link-mode symlink`: the installed files are links to its cache. The guard reads
    through them (read only) where the target is a regular file; a link to a FIFO is not read."""
    assert main([str(a) for a in deploy(overlay, "apply", "--target", target)]) == 0
    capsys.readouterr()
    cached = tmp_path / "uv-cache" / "moe.py"
    cached.parent.mkdir()
    shutil.copyfile(target / EDITED, cached)
    (target / EDITED).unlink()
    (target / EDITED).symlink_to(cached)
    code, lines = start_guard(target, strict=True)
    assert (code, lines[0].split(":")[0]) == (0, "INFO vllm-patchset")
    assert "overlay active on vllm 0.24.0" in lines[0]
    cached.unlink()
    os.mkfifo(cached)
    code, lines = start_guard(target, strict=False)
    assert code == 0 and "is PARTIAL" in lines[0]


def test_the_state_is_readable_by_all_whatever_the_umask(overlay: Overlay, target: Path) -> None:
    """Was: `apply` under umask 077 left the state folder 0700 and the lock 0600: the guard of a
    serving user who is not root could not confirm the overlay."""
    argv = " ".join(
        f"'{a}'"
        for a in [
            sys.executable,
            "-m",
            "vllm_patchset",
            *map(str, deploy(overlay, "apply", "--target", target)),
        ]
    )
    done = subprocess.run(
        ["sh", "-c", f"umask 077 && exec {argv}"], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr) == (0, "")
    modes = {rel: entry[1] for rel, entry in snapshot(target / STATE).items()}
    assert modes and all(mode in (0o755, 0o644) for mode in modes.values()), modes
    assert os.stat(target / STATE).st_mode & 0o777 == 0o755


# -- 8. one error boundary --------------------------------------------------------------------------
def test_no_git_on_path_is_one_line(tiny: Project, tmp_path: Path) -> None:
    """Was: GitPython's ImportError, 60 lines, exit 1 (the code of a finding)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}
    done = subprocess.run(
        [sys.executable, "-m", "vllm_patchset", "--project", str(tiny.root), "status"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("vllm-patchset: git is not installed or not on PATH (")
    assert done.stderr.endswith(
        "): install git (the deploy commands, `overlay apply|verify|revert|status`, need none)\n"
    )
    assert done.stderr.count("\n") == 1


INTERNAL = [  # (what a bug raises, the words of the one line)
    (RuntimeError("boom\nsecond line"), "RuntimeError: boom"),
    (KeyError("files"), "KeyError: no key files"),
    (
        RecursionError("maximum recursion depth exceeded"),
        "RecursionError: maximum recursion depth exceeded",
    ),
    (FileNotFoundError(2, "No such file or directory"), None),  # an OSError: as before
]


@pytest.mark.parametrize(("exc", "words"), INTERNAL)
@pytest.mark.parametrize("as_json", [False, True])
def test_an_internal_error_is_one_line_and_exit_3(
    tiny: Project,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    exc: BaseException,
    words: str | None,
    as_json: bool,
) -> None:
    def broken(args: object) -> int:
        raise exc

    monkeypatch.setattr(status, "cmd_status", broken)
    code = main(["--project", str(tiny.root), "status", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    if words is None:  # what no check foresaw, from the OS: its words, the same exit code
        expected, line = 3, "No such file or directory"
    else:
        expected = 3
        line = f"internal error: {words} (a bug of vllm-patchset: --verbose shows the traceback)"
    assert (code, err) == (expected, f"vllm-patchset: {line}\n")
    if as_json:
        assert json.loads(out) == {
            "ok": False,
            "command": "status",
            "exit_code": expected,
            "error": line,
        }
    else:
        assert out == ""


def test_exit_3_is_named_in_help_readme_and_the_sync_workflow(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "  3        an internal error: a bug of vllm-patchset" in capsys.readouterr().out
    assert "exit 3" in (REPO / "README.md").read_text()
    assert "3) " in (REPO / ".github" / "workflows" / "upstream-sync.yml").read_text()


def test_the_deep_json_reader_is_cheap() -> None:
    """The bound is checked without recursion: 200,000 levels are refused in well under the
    time a test may take (no assertion on time; the guard reads the record at every start)."""
    from vllm_patchset.infra import jsonfile

    with pytest.raises(jsonfile.BadJson, match=r"^nested deeper than 32 levels$"):
        jsonfile.parse(DEEP)
    deep_ok = b"[" * 32 + b"]" * 32
    assert jsonfile.parse(deep_ok, expect=list) == json.loads(deep_ok)
    assert hashlib.sha256(DEEP).hexdigest()  # the bytes are what the rows above write


# -- 9. patches whose headers say one thing and do another ----------------------------------------------
def headers_disagree(project: Project, tmp: Path) -> tuple[list[str], int, str]:
    """`+++ b/...` names another file than `diff --git`: one line, never a traceback."""
    patch = project.patches_dir / STORY_FIX.name
    patch.write_text(patch.read_text().replace(f"+++ b/{MOE}", "+++ b/vllm/other.py", 1))
    return (
        ["status"],
        2,
        f"{MOE}: '+++ b/vllm/other.py' names another file than its 'diff --git' line",
    )


def symlink_out_of_the_tree(project: Project, tmp: Path) -> tuple[list[str], int, str]:
    """Was: `tree DEST` for a patch that creates a symlink out ended in a traceback."""
    patch = project.patches_dir / STORY_FIX.name
    text = patch.read_text()
    link = (
        "diff --git a/vllm/evil b/vllm/evil\nnew file mode 120000\nindex 0000000..1111111\n"
        "--- /dev/null\n+++ b/vllm/evil\n@@ -0,0 +1 @@\n+/etc\n\\ No newline at end of file\n"
    )
    at = text.index("diff --git")
    patch.write_text(text[:at] + link + text[at:])
    return (
        ["tree", str(tmp / "dest")],
        2,
        "vllm/evil: new file mode 120000: a link or a submodule, refused",
    )


def symlink_pristine_tree(project: Project, tmp: Path) -> tuple[list[str], int, str]:
    """The pristine tree needs no patch: it is written whatever the series holds."""
    symlink_out_of_the_tree(project, tmp)
    return ["tree", "--pristine", str(tmp / "dest")], 0, ""


PATCH_HEADERS = (headers_disagree, symlink_out_of_the_tree, symlink_pristine_tree)


@pytest.mark.parametrize("make", PATCH_HEADERS)
def test_patches_that_lead_out_are_one_line(
    tiny: Project,
    tmp_path: Path,
    make: Callable[[Project, Path], tuple[list[str], int, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv, code, tail = make(tiny, tmp_path)
    before = snapshot(tmp_path, skip_git=True)
    got = main(["--project", str(tiny.root), *argv])
    out, err = capsys.readouterr()
    assert got == code
    if code == 0:
        assert (err, out) == ("", f"wrote pristine tree to {tmp_path / 'dest'}\n")
        assert not any(p.is_symlink() for p in (tmp_path / "dest").rglob("*"))
        return
    assert (out, err.count("\n")) == ("", 1)
    assert err.startswith("vllm-patchset: ") and tail in err
    assert snapshot(tmp_path, skip_git=True) == before


KIT_DISK_FULL = """\
import os, subprocess, sys
folder, kitparts, kit = sys.argv[1:4]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", folder], check=True)
done = subprocess.run([sys.executable, "-I", kitparts, "assemble", kit, "--dest",
                       os.path.join(folder, "native")], capture_output=True, text=True)
print(done.returncode, os.listdir(folder))
print(done.stderr, end="")
"""


def test_kitparts_on_a_full_disk_is_one_line(tmp_path: Path) -> None:
    """Was: kitparts.py (run on GPU hosts without vllm-patchset) ended in a traceback."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip(
            "a full disk is a small tmpfs mounted in a private namespace: needs root and unshare(1)"
        )
    big = _member("site/vllm/_C.abi3.so", os.urandom(3 << 20))
    kit = _kit(tmp_path / "kit", _tar([big]))
    script = tmp_path / "script"  # kitparts.py with the two modules it imports, as a bundle has
    script.mkdir()
    for module in (kitparts, archives, jsonfile):
        shutil.copy2(Path(module.__file__ or ""), script)
    folder = tmp_path / "small"
    folder.mkdir()
    done = subprocess.run(
        ["unshare", "--mount", sys.executable, "-c", KIT_DISK_FULL, str(folder),
         str(script / "kitparts.py"), str(kit)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    first, *rest = done.stdout.splitlines()
    assert first == "1 []"  # nothing left on the full disk: the staging folder is removed
    assert len(rest) == 1
    assert rest[0].startswith(f"kitparts: cannot assemble the kit in {folder / 'native'}: No space")


def test_an_unremovable_pyc_never_wedges_the_target(
    overlay: Overlay, target: Path, pristine: Pristine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: a directory where a stale pyc was made `apply` stop half-way; then status, revert,
    revert --force and apply --force all exited 1. Now revert restores every original it holds
    and says what it could not remove; apply refuses before it changes anything."""
    assert main([str(a) for a in deploy(overlay, "apply", "--target", target)]) == 0
    capsys.readouterr()
    pyc = target / EDITED_DIR / "__pycache__" / f"{EDITED_MODULE}.cpython-311.pyc"
    pyc.mkdir(parents=True)
    for command in ("revert", "revert --force"):
        if command == "revert --force":  # once more from an applied target, with --force
            os.rmdir(pyc)
            assert main([str(a) for a in deploy(overlay, "apply", "--target", target)]) == 0
            pyc.mkdir()
        code = main([str(a) for a in deploy(overlay, *command.split(), "--target", target)])
        out, err = capsys.readouterr()
        assert (code, err) == (0, "")
        assert out.splitlines()[-1] == f"  note: could not remove {pyc}: remove it by hand"
        assert record_mismatches(target, pristine.record) == []
        assert not (target / STATE).exists()
    before = snapshot(target)
    code = main([str(a) for a in deploy(overlay, "apply", "--target", target)])
    assert (code, capsys.readouterr().err) == (
        1,
        f"vllm-patchset: cannot remove the stale bytecode {pyc} (it is a directory): remove it,"
        " then apply; nothing was changed\n",
    )
    assert snapshot(target) == before
    assert main([str(a) for a in deploy(overlay, "status", "--target", target)]) == 0
