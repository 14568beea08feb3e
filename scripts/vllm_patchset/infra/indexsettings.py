"""Where the package index comes from: uv's and pip's settings, then the project's.

The tool fetches vLLM (the pin's sdist for the mirror, its wheel for the kit) from ONE index,
the first of (highest first):

1. `UV_DEFAULT_INDEX`, then its older name `UV_INDEX_URL` (uv's default index);
2. `PIP_INDEX_URL`;
3. `index-url` in pip's configuration files, read as pip reads them for a download: the file
   `PIP_CONFIG_FILE` names (when it exists, the user's files are not read; `os.devnull` turns
   every file off), then the site file (`sys.prefix/pip.conf`), the user's
   (`$XDG_CONFIG_HOME/pip/pip.conf`, then `~/.pip/pip.conf`) and the global ones (`/etc/pip.conf`,
   then `$XDG_CONFIG_DIRS/pip/pip.conf`); a `[download]` (then `[install]`) section in any file
   before `[global]` in any file, as pip lets a command's section override `[global]`;
4. `index-url` under `[tool.vllm-patchset]` in pyproject.toml;
5. https://pypi.org/simple.

Extra indexes (`PIP_EXTRA_INDEX_URL`, `extra-index-url`, `UV_INDEX`, `UV_EXTRA_INDEX_URL`) and
`find-links` are never used: vLLM comes from the one index above, so a file of the same name on a
second index (CI's torch CPU wheels, a dependency-confusion upload) cannot stand in for it. They
are named as ignored in `status --verbose`.

Credentials: the index URL's own (`https://user:token@host/simple`), else the netrc file's entry
for its host (`$NETRC`, else `~/.netrc`), as pip (through requests) and uv read them. They are
sent as HTTP Basic auth to that scheme, host and port only (never on a redirect elsewhere), and
are kept out of every URL the tool prints, records or uses as a cache path.
"""

from __future__ import annotations

import base64
import configparser
import netrc
import os
import re
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vllm_patchset.errors import BadInput
from vllm_patchset.infra import fsio
from vllm_patchset.infra.config import Project

DEFAULT = "https://pypi.org/simple"
MAIN_ENV = ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL")
EXTRA_ENV = ("PIP_EXTRA_INDEX_URL", "UV_INDEX", "UV_EXTRA_INDEX_URL", "PIP_FIND_LINKS")
EXTRA_KEYS = ("extra-index-url", "find-links")
SECTIONS = ("download", "install", "global")  # highest first
CONFIG_LIMIT = 1 << 20
_URL = re.compile(r"(https?|file)://[^\s]+$")
_NAMED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*=(?=[a-z]+://)")  # uv's `name=url`


@dataclass(frozen=True)
class IndexSetting:
    """The index vLLM is fetched from, where that came from, and its credentials (never shown:
    not in repr, not in `describe`)."""

    url: str  # without credentials, without a trailing slash
    origin: str  # the setting, in words: "PIP_INDEX_URL", "/etc/pip.conf [global] index-url"
    ignored: tuple[str, ...] = ()  # extra-index settings seen and not used
    credentials_from: str = ""  # "the URL" or the netrc file, when there are credentials
    _auth: str | None = field(default=None, repr=False, compare=False)

    def headers(self, url: str) -> Mapping[str, str]:
        """The Authorization header for `url` when it is on the index's scheme, host and port."""
        if self._auth is None or _site(url) != _site(self.url):
            return {}
        return {"Authorization": self._auth}

    def describe(self) -> str:
        """One line for `status --verbose`: the index and where it came from."""
        notes = [f"from {self.origin}"]
        if self.credentials_from:
            notes.append(f"credentials from {self.credentials_from}")
        if self.ignored:
            notes.append(f"ignored: {', '.join(self.ignored)}")
        return f"index: {self.url} ({'; '.join(notes)})"

    def as_json(self) -> dict[str, object]:
        return {
            "url": self.url,
            "from": self.origin,
            "credentials_from": self.credentials_from or None,
            "ignored": list(self.ignored),
        }


def _site(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.scheme, (parts.hostname or "").lower(), port


def public(url: str) -> str:
    """`url` without the user and password of its netloc (for what is printed or recorded)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def resolve(
    project_url: str = DEFAULT,
    project_origin: str = "[tool.vllm-patchset] index-url",
    environ: Mapping[str, str] | None = None,
) -> IndexSetting:
    """The index to fetch vLLM from, by the precedence in this module's docstring."""
    env = os.environ if environ is None else environ
    ignored = [name for name in EXTRA_ENV if env.get(name, "").strip()]
    chosen: tuple[str, str] | None = None
    for name in MAIN_ENV:
        if value := env.get(name, "").strip():
            chosen = (_NAMED.sub("", value, count=1), name)
            break
    config, extras = _pip_config(env)
    ignored += extras
    if chosen is None:
        chosen = config
    if chosen is None:
        origin = project_origin if project_url != DEFAULT else "the default"
        chosen = (project_url, origin)
    value, origin = chosen
    if not _URL.match(value):
        # The value is not shown: it may hold credentials.
        raise BadInput(f"{origin}: not an http, https or file URL (expected e.g. {DEFAULT})")
    return _with_credentials(value.rstrip("/"), origin, tuple(ignored), env)


def for_project(project: Project) -> IndexSetting:
    """The index for `project`'s fetches (its own `index-url` the last resort)."""
    return resolve(project.index_url, f"{project.pyproject} [tool.vllm-patchset] index-url")


def _with_credentials(
    url: str, origin: str, ignored: tuple[str, ...], env: Mapping[str, str]
) -> IndexSetting:
    parts = urllib.parse.urlsplit(url)
    clean = public(url)
    if parts.scheme == "file":
        return IndexSetting(clean, origin, ignored)
    if "@" in parts.netloc:
        user, _, password = parts.netloc.rpartition("@")[0].partition(":")
        user, password = urllib.parse.unquote(user), urllib.parse.unquote(password)
        return IndexSetting(clean, origin, ignored, "the URL", _basic(user, password))
    found = _netrc(parts.hostname or "", env)
    if found is None:
        return IndexSetting(clean, origin, ignored)
    source, user, password = found
    return IndexSetting(clean, origin, ignored, source, _basic(user, password))


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def _netrc(host: str, env: Mapping[str, str]) -> tuple[str, str, str] | None:
    """(file, login, password) of the netrc entry for `host` (or its `default`), as requests
    reads it for pip: `$NETRC`, else `~/.netrc`; an unreadable or malformed file is passed over,
    as pip passes it over."""
    path = Path(env["NETRC"]) if env.get("NETRC") else Path(env.get("HOME", "~")) / ".netrc"
    path = path.expanduser()
    if not host or not path.is_file():  # a FIFO is never opened
        return None
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (netrc.NetrcParseError, OSError, UnicodeDecodeError):
        return None
    if entry is None:
        return None
    login, _, password = entry
    return str(path), login or "", password or ""


def config_files(env: Mapping[str, str]) -> list[Path]:
    """pip's configuration files on POSIX, lowest precedence first (global, user, site, the
    file of PIP_CONFIG_FILE); none when PIP_CONFIG_FILE is os.devnull."""
    named = env.get("PIP_CONFIG_FILE")
    if named == os.devnull:
        return []
    home = Path(env.get("HOME", "~")).expanduser()
    dirs = (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)
    files = [Path(d) / "pip" / "pip.conf" for d in dirs if d] + [Path("/etc/pip.conf")]
    if not (named and Path(named).exists()):
        xdg = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
        files += [home / ".pip" / "pip.conf", xdg / "pip" / "pip.conf"]
    files.append(Path(sys.prefix) / "pip.conf")
    if named:
        files.append(Path(named))
    return files


def _pip_config(env: Mapping[str, str]) -> tuple[tuple[str, str] | None, list[str]]:
    """(the index-url pip would download with and its origin, the extra-index settings seen)."""
    best: dict[str, tuple[str, str]] = {}  # section -> (value, origin), later files winning
    extras: list[str] = []
    for path in config_files(env):
        for section, key, value in _read_config(path):
            if key == "index-url" and section in SECTIONS:
                best[section] = (value, f"{path} [{section}] index-url")
            elif key in EXTRA_KEYS and section in SECTIONS and f"pip.conf {key}" not in extras:
                extras.append(f"pip.conf {key}")
    found = next((best[s] for s in SECTIONS if s in best), None)
    return found, extras


def _read_config(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) of a pip configuration file, keys named as pip names them
    (`index_url`, `--index-url` and `index-url` are one), empty values left out as pip leaves
    them out; a file that is not there gives nothing."""
    try:  # through a symlink too (dotfiles are often links); a FIFO is refused unopened
        data = b"".join(fsio.read_chunks(path, follow=True))
    except (FileNotFoundError, NotADirectoryError):
        return []
    if len(data) > CONFIG_LIMIT:
        raise BadInput(f"{path}: larger than {CONFIG_LIMIT} bytes, not a pip configuration file")
    parser = configparser.RawConfigParser()
    try:
        parser.read_string(data.decode("utf-8"), source=str(path))
    except (configparser.Error, UnicodeDecodeError) as exc:
        why = str(exc).splitlines()[0]
        raise BadInput(f"{path}: not a pip configuration file pip can read ({why})") from None
    return [
        (section, key.lower().replace("_", "-").removeprefix("--"), value.strip())
        for section in parser.sections()
        for key, value in parser.items(section)
        if value.strip()
    ]
