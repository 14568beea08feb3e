"""Where the package index comes from (infra/indexsettings.py), as a user meets it: uv's and
pip's environment, pip.conf files, netrc credentials reaching a local index on 127.0.0.1 (HTTP
Basic auth) and never the output, the extra index that must not leak, `status --verbose`.

The conftest's autouse fixture clears the machine's settings (PIP_CONFIG_FILE=os.devnull, no
PIP_INDEX_URL / UV_* / NETRC, HOME and XDG_CONFIG_HOME in tmp): each case sets its own."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import cli
from synthetic import LocalIndex, sdist_bytes
from vllm_patchset.infra.config import Project

USER, SECRET = "ci-bot", "s3cret-Token"
BASIC = "Basic Y2ktYm90OnMzY3JldC1Ub2tlbg=="  # base64 of USER:SECRET
PRIVATE_RELEASE = "7.0"  # only the private index has it; the story's index has 0.9 .. 1.2
SDIST = sdist_bytes(PRIVATE_RELEASE, {"vllm/__init__.py": '__version__ = "7.0"\n'})
STORY_RELEASES = "0.9\n1.0\n1.0.1\n1.1\n1.2\n"


@pytest.fixture(autouse=True)
def _no_extra_indexes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's extra-index settings (kept by the conftest for the pip runs of other
    tests) are this module's cases to give: status --verbose names them."""
    for name in ("PIP_EXTRA_INDEX_URL", "UV_INDEX", "UV_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalIndex]:
    """A company mirror: a release of its own, every request without credentials refused."""
    with LocalIndex(tmp_path_factory.mktemp("private") / "index", auth=(USER, SECRET)) as index:
        index.publish(f"vllm-{PRIVATE_RELEASE}.tar.gz", SDIST)
        yield index


@pytest.fixture(scope="module")
def public(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalIndex]:
    """An open index with the private release too (the case where any index would do)."""
    with LocalIndex(tmp_path_factory.mktemp("public") / "index") as index:
        index.publish(f"vllm-{PRIVATE_RELEASE}.tar.gz", SDIST)
        yield index


@pytest.fixture
def netrc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "netrc"
    path.write_text(f"machine 127.0.0.1 login {USER} password {SECRET}\n")
    monkeypatch.setenv("NETRC", str(path))
    return path


def _git(cache: Path, *args: str) -> str:
    mirror = str(cache / "mirror.git")
    done = subprocess.run(["git", "--git-dir", mirror, *args], capture_output=True, check=True)
    return done.stdout.decode()


def _conf(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    return path


def _index_line(capsys: pytest.CaptureFixture[str], project: Project) -> str:
    """The last line of `status --verbose` (the index and where it came from)."""
    code, out, err = cli(capsys, project.root, "status", "--verbose")
    assert (code, err) == (0, "")
    return out.splitlines()[-1]


# Which setting wins: each case's environment and pip.conf files (`{url}` is the open index's
# URL, `{story}` the project's own index-url, `{cfg}` $XDG_CONFIG_HOME, `{tmp}` a tmp folder),
# the setting named, and the index used ("url" lists 7.0 only, "story" the story's releases).
PRECEDENCE = [
    ("pip-env", {"PIP_INDEX_URL": "{url}"}, {}, "PIP_INDEX_URL", "url"),
    (
        "uv-default",
        {"UV_DEFAULT_INDEX": "{url}", "PIP_INDEX_URL": "{story}"},
        {},
        "UV_DEFAULT_INDEX",
        "url",
    ),
    ("uv-named", {"UV_DEFAULT_INDEX": "corp={url}"}, {}, "UV_DEFAULT_INDEX", "url"),
    ("uv-older", {"UV_INDEX_URL": "{url}/", "PIP_INDEX_URL": "{story}"}, {}, "UV_INDEX_URL", "url"),
    (
        "pip-config-file",
        {"PIP_CONFIG_FILE": "{tmp}/pip.conf"},
        {"{tmp}/pip.conf": "[global]\nindex-url = {url}\n"},
        "{tmp}/pip.conf [global] index-url",
        "url",
    ),
    (
        "user-file",
        {"PIP_CONFIG_FILE": ""},
        {"{cfg}/pip/pip.conf": "[global]\nindex_url = {url}\n"},
        "{cfg}/pip/pip.conf [global] index-url",
        "url",
    ),
    (
        "config-file-hides-user-files",  # pip reads no user file when PIP_CONFIG_FILE exists
        {"PIP_CONFIG_FILE": "{tmp}/pip.conf"},
        {
            "{tmp}/pip.conf": "[global]\nindex-url = {story}\n",
            "{cfg}/pip/pip.conf": "[download]\nindex-url = {url}\n",
        },
        "{tmp}/pip.conf [global] index-url",
        "story",
    ),
    (
        "command-section-beats-global",
        {"PIP_CONFIG_FILE": ""},
        {"{cfg}/pip/pip.conf": "[global]\nindex-url = {story}\n[download]\nindex-url = {url}\n"},
        "{cfg}/pip/pip.conf [download] index-url",
        "url",
    ),
    (
        "env-beats-file",
        {"PIP_CONFIG_FILE": "{tmp}/pip.conf", "PIP_INDEX_URL": "{url}"},
        {"{tmp}/pip.conf": "[global]\nindex-url = {story}\n"},
        "PIP_INDEX_URL",
        "url",
    ),
]


@pytest.mark.parametrize(
    ("env", "files", "origin", "used"), [c[1:] for c in PRECEDENCE], ids=[c[0] for c in PRECEDENCE]
)
def test_the_index_setting_that_wins(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tiny: Project,
    public: LocalIndex,
    env: dict[str, str],
    files: dict[str, str],
    origin: str,
    used: str,
) -> None:
    """`releases` lists what the winning index has; `status --verbose` names it and the
    setting it came from."""
    cfg = Path.home() / ".config"
    values = {"url": public.url, "story": tiny.index_url, "tmp": str(tmp_path), "cfg": str(cfg)}
    for path, body in files.items():
        _conf(Path(path.format(**values)), body.format(**values))
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(**values))
    listed = STORY_RELEASES if used == "story" else f"{PRIVATE_RELEASE}\n"
    assert cli(capsys, tiny.root, "releases") == (0, listed, "")
    url = values[used]
    assert _index_line(capsys, tiny) == f"index: {url} (from {origin.format(**values)})"


def test_the_extra_index_does_not_leak(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tiny: Project,
    public: LocalIndex,
) -> None:
    """CI's PIP_EXTRA_INDEX_URL (torch's CPU wheels), uv's UV_INDEX and a pip.conf's
    extra-index-url are never where vLLM comes from: the project's index is, and the status
    line names what it ignored."""
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", public.url)
    monkeypatch.setenv("UV_INDEX", f"torch={public.url}")
    monkeypatch.setenv(
        "PIP_CONFIG_FILE",
        str(_conf(Path.home() / "pip.conf", f"[global]\nextra-index-url = {public.url}\n")),
    )
    code, out, err = cli(capsys, tiny.root, "releases")
    assert (code, out, err) == (0, STORY_RELEASES, "")
    assert _index_line(capsys, tiny) == (
        f"index: {tiny.index_url} (from {tiny.pyproject} [tool.vllm-patchset] index-url;"
        " ignored: PIP_EXTRA_INDEX_URL, UV_INDEX, pip.conf extra-index-url)"
    )


def test_netrc_credentials_reach_the_index_and_nothing_else(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tiny: Project,
    private: LocalIndex,
    netrc: Path,
) -> None:
    """The netrc entry for 127.0.0.1 is sent as Basic auth to the index (the page and the
    sdist), and appears in no output, no JSON, no recorded source and no cache path."""
    monkeypatch.setenv("PIP_INDEX_URL", private.url)
    code, out_json, err_json = cli(capsys, tiny.root, "status", "--verbose", "--json")
    assert (code, err_json) == (0, "")
    index = json.loads(out_json)["index"]
    assert index == {
        "url": private.url,
        "from": "PIP_INDEX_URL",
        "credentials_from": str(netrc),
        "ignored": [],
    }
    cache = tmp_path / "cache"
    monkeypatch.setenv("VLLM_PATCHSET_CACHE", str(cache))
    del private.seen[:]
    code, out, err = cli(capsys, tiny.root, "fetch", PRIVATE_RELEASE)
    assert (code, err) == (0, f"downloaded vllm-{PRIVATE_RELEASE}.tar.gz, sha256 verified\n")
    commit = _git(cache, "rev-parse", "refs/tags/v7.0").strip()
    digest = hashlib.sha256(SDIST).hexdigest()
    source = f"pypi:vllm-7.0.tar.gz sha256:{digest} {private.base}/files/vllm-7.0.tar.gz"
    assert out == f"7.0: v7.0 {commit[:12]} ({source})\n"
    assert private.seen == [BASIC, BASIC]  # the page, then the sdist
    sources = _git(cache, "log", "--all", "--format=%B")
    assert source in sources
    everything = out + err + out_json + err_json + sources + "\n".join(map(str, cache.rglob("*")))
    assert SECRET not in everything and USER not in everything


def test_credentials_stay_on_the_index_host(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tiny: Project,
    public: LocalIndex,
    netrc: Path,
) -> None:
    """An index whose file lives on another host and port (as pypi.org's files live on
    files.pythonhosted.org): the page is asked with the credentials, the file without."""
    with LocalIndex(tmp_path / "index", auth=(USER, SECRET)) as pages:
        name = f"vllm-{PRIVATE_RELEASE}.tar.gz"
        digest = hashlib.sha256(SDIST).hexdigest()
        url = f"{public.base}/files/{name}"
        pages.list_only({"filename": name, "url": url, "hashes": {"sha256": digest}})
        monkeypatch.setenv("PIP_INDEX_URL", pages.url)
        monkeypatch.setenv("VLLM_PATCHSET_CACHE", str(tmp_path / "cache"))
        del public.seen[:]
        code, out, err = cli(capsys, tiny.root, "fetch", PRIVATE_RELEASE)
        assert (code, err) == (0, f"downloaded {name}, sha256 verified\n")
        assert out.endswith(f" (pypi:{name} sha256:{digest} {url})\n")
        assert (pages.seen, public.seen) == ([BASIC], [None])


def test_credentials_in_the_url_are_sent_and_never_shown(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tiny: Project,
    private: LocalIndex,
) -> None:
    """`https://user:token@host/simple` (pip's and uv's form): the credentials go to the
    index as Basic auth; the status line shows the URL without them."""
    monkeypatch.setenv("UV_DEFAULT_INDEX", private.url.replace("//", f"//{USER}:{SECRET}@"))
    del private.seen[:]
    code, out, err = cli(capsys, tiny.root, "releases")
    assert (code, out, err) == (0, f"{PRIVATE_RELEASE}\n", "")
    assert private.seen == [BASIC]
    line = f"index: {private.url} (from UV_DEFAULT_INDEX; credentials from the URL)"
    assert _index_line(capsys, tiny) == line


def test_without_credentials_the_error_names_the_index(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tiny: Project,
    private: LocalIndex,
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", private.url)
    code, out, err = cli(capsys, tiny.root, "releases")
    assert (code, out) == (2, "")
    assert err == (
        f"vllm-patchset: cannot read the package index {private.url}/vllm/ (HTTP 401"
        " Unauthorized) and the release is not cached\n"
    )


BAD = [
    ("PIP_INDEX_URL", "user:pw@host/simple", "PIP_INDEX_URL"),
    ("UV_DEFAULT_INDEX", "ftp://host/simple", "UV_DEFAULT_INDEX"),
]


@pytest.mark.parametrize(("name", "value", "origin"), BAD)
def test_a_bad_setting_is_one_line_without_its_value(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tiny: Project,
    name: str,
    value: str,
    origin: str,
) -> None:
    monkeypatch.setenv(name, value)
    assert cli(capsys, tiny.root, "releases") == (
        2,
        "",
        f"vllm-patchset: {origin}: not an http, https or file URL (expected e.g."
        " https://pypi.org/simple)\n",
    )


def test_an_unreadable_pip_conf_names_the_file(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tiny: Project,
) -> None:
    conf = _conf(tmp_path / "pip.conf", "index-url = x\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    code, out, err = cli(capsys, tiny.root, "releases")
    assert (code, out) == (2, "")
    assert err.startswith(f"vllm-patchset: {conf}: not a pip configuration file pip can read (")
