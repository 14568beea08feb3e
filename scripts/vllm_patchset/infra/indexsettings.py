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
import ssl
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


_WARNED: set[str] = set()  # the trusted-host warning: once a run (an index)


@dataclass(frozen=True)
class Tls:
    """How the index's TLS certificate is checked, as pip and uv let a user say it: a CA
    bundle (`cafile`: a file, or a folder of hashed certificates), a client certificate (a PEM
    with its key), or no check at all for a `trusted-host`."""

    cafile: str | None = None
    cafile_from: str = ""
    client_cert: str | None = None
    client_cert_from: str = ""
    trusted_from: str = ""  # the trusted-host setting that names the index's host

    def context(self) -> ssl.SSLContext:
        """The SSL context for the index's host (pip's rules: a CA bundle replaces the
        system's store; without one, the system's store and SSL_CERT_FILE, as Python reads
        them)."""
        for path, origin, what in (
            (self.cafile, self.cafile_from, "CA bundle"),
            (self.client_cert, self.client_cert_from, "client certificate"),
        ):
            if path is not None and not Path(path).exists():
                raise BadInput(f"{origin}: the {what} {path} does not exist")
        if self.trusted_from:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif self.cafile is not None and Path(self.cafile).is_dir():
            context = ssl.create_default_context(capath=self.cafile)
        else:
            context = ssl.create_default_context(cafile=self.cafile)
        if self.client_cert is not None:
            context.load_cert_chain(self.client_cert)
        return context


@dataclass(frozen=True)
class IndexSetting:
    """The index vLLM is fetched from, where that came from, and its credentials (never shown:
    not in repr, not in `describe`)."""

    url: str  # without credentials, without a trailing slash
    origin: str  # the setting, in words: "PIP_INDEX_URL", "/etc/pip.conf [global] index-url"
    ignored: tuple[str, ...] = ()  # extra-index settings seen and not used
    credentials_from: str = ""  # "the URL" or the netrc file, when there are credentials
    _auth: str | None = field(default=None, repr=False, compare=False)
    tls: Tls = field(default_factory=Tls)

    def headers(self, url: str) -> Mapping[str, str]:
        """The Authorization header for `url` when it is on the index's scheme, host and port."""
        if self._auth is None or _site(url) != _site(self.url):
            return {}
        return {"Authorization": self._auth}

    def context(self, url: str) -> ssl.SSLContext | None:
        """The SSL context for `url`: the index's settings on its own host, Python's defaults
        elsewhere (a redirect to a CDN)."""
        if _site(url)[1:] != _site(self.url)[1:]:
            return None
        if self.tls.trusted_from and self.url not in _WARNED:
            _WARNED.add(self.url)
            print(
                f"vllm-patchset: warning: {_site(self.url)[1]} is a trusted-host"
                f" ({self.tls.trusted_from}): its TLS certificate is not checked",
                file=sys.stderr,
            )
        return self.tls.context()

    def describe(self) -> str:
        """One line for `status --verbose`: the index and where it came from."""
        notes = [f"from {self.origin}"]
        if self.credentials_from:
            notes.append(f"credentials from {self.credentials_from}")
        if self.tls.cafile_from:
            notes.append(f"CA bundle from {self.tls.cafile_from}")
        if self.tls.client_cert_from:
            notes.append(f"client certificate from {self.tls.client_cert_from}")
        if self.tls.trusted_from:
            notes.append(f"TLS not checked: trusted-host in {self.tls.trusted_from}")
        if self.ignored:
            notes.append(f"ignored: {', '.join(self.ignored)}")
        return f"index: {self.url} ({'; '.join(notes)})"

    def as_json(self) -> dict[str, object]:
        return {
            "url": self.url,
            "from": self.origin,
            "credentials_from": self.credentials_from or None,
            "ignored": list(self.ignored),
            **{  # an https index's TLS settings, those given
                key: value
                for key, value in (
                    ("ca_bundle_from", self.tls.cafile_from),
                    ("client_cert_from", self.tls.client_cert_from),
                    ("trusted_host_from", self.tls.trusted_from),
                )
                if value
            },
        }


def _site(url: str) -> tuple[str, str, int | None]:
    found = split(url)
    if found is None:
        return "", "", None
    return found.scheme, found.host.lower(), found.port


@dataclass(frozen=True)
class Parts:
    """A URL split as pip splits an index URL: the userinfo ends at the LAST `@` before the
    host, so a password pasted unencoded (`/`, `#`, `?`, `@`, `:` in it) stays in the
    userinfo, never in the host, port or path (`urllib.parse` alone would end the netloc at
    the first `/`)."""

    scheme: str  # lower-case
    user: str | None = field(repr=False)  # percent-decoded; None without userinfo
    password: str | None = field(repr=False)
    host: str  # as written ("[::1]" with its brackets)
    port: int | None
    rest: str  # the path, query and fragment

    @property
    def public(self) -> str:
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.scheme}://{self.host}{port}{self.rest}"


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)\Z", re.S)
_HOSTPORT = re.compile(
    r"(?P<host>\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9._~-]+)?\]|[A-Za-z0-9._~%!$&'()*+,;=-]+)"
    r"(?::(?P<port>[0-9]{0,5}))?\Z"
)


def split(url: str) -> Parts | None:
    """`url` split (`Parts`), or None when it cannot be parsed (no scheme, no host, a port
    that is no number, an unclosed `[`): never an exception, never a guess that shows a
    password."""
    found = _SCHEME.match(url)
    if found is None or any(c in url for c in "\x00\r\n\t "):
        return None
    scheme, rest = found[1].lower(), found[2]
    if scheme == "file":
        host, sep, tail = rest.partition("/")
        return Parts(scheme, None, None, host, None, sep + tail)
    cut = _userinfo_end(rest)
    authority = re.split(r"[/?#]", rest[cut:], maxsplit=1)[0]
    tail = rest[cut + len(authority) :]
    hostport = _HOSTPORT.match(authority)
    if hostport is None:
        return None
    port_text = hostport["port"]
    port = int(port_text) if port_text else None
    if port is not None and port > 65535:
        return None
    user, password = _credentials(rest[: cut - 1] if cut else None)
    return Parts(scheme, user, password, hostport["host"], port, tail)


def _userinfo_end(rest: str) -> int:
    """Where the host of `rest` (a URL after its `scheme://`) starts: after the last `@` that
    leaves a user without `/`, `?` or `#` and a host[:port] after it (a password may hold
    `@`), else 0 (no userinfo)."""
    for at in [i for i, c in enumerate(rest) if c == "@"][::-1]:
        user = rest[:at].partition(":")[0]
        authority = re.split(r"[/?#]", rest[at + 1 :], maxsplit=1)[0]
        if not any(c in user for c in "/?#") and _HOSTPORT.match(authority):
            return at + 1
    return 0


def _credentials(userinfo: str | None) -> tuple[str | None, str | None]:
    """(user, password) of a URL's userinfo, percent-decoded: a user without `:` has the
    password "" (the keyring may know it); no userinfo, (None, None)."""
    if userinfo is None:
        return None, None
    raw_user, colon, raw_password = userinfo.partition(":")
    return urllib.parse.unquote(raw_user), urllib.parse.unquote(raw_password) if colon else ""


UNPARSEABLE = "(a URL that cannot be parsed)"


def public(url: str) -> str:
    """`url` without the user and password of its netloc (for what is printed or recorded);
    a URL that cannot be parsed is never shown (it may hold a password)."""
    found = split(url)
    return found.public if found is not None else UNPARSEABLE


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
    config = _pip_config(env)
    ignored += config.extras
    if chosen is None:
        chosen = config.index
    if chosen is None:
        origin = project_origin if project_url != DEFAULT else "the default"
        chosen = (project_url, origin)
    value, origin = chosen
    parts = split(value.rstrip("/"))
    if parts is None or parts.scheme not in ("http", "https", "file"):
        # The value is not shown: it may hold credentials.
        raise BadInput(f"{origin}: not an http, https or file URL (expected e.g. {DEFAULT})")
    if parts.scheme != "file" and not parts.host:
        raise BadInput(f"{origin}: the URL names no host (expected e.g. {DEFAULT})")
    tls = _tls(parts, config, env) if parts.scheme == "https" else Tls()  # http: no TLS
    return _with_credentials(parts, origin, tuple(ignored), env, tls)


def for_project(project: Project) -> IndexSetting:
    """The index for `project`'s fetches (its own `index-url` the last resort)."""
    return resolve(project.index_url, f"{project.pyproject} [tool.vllm-patchset] index-url")


def _with_credentials(
    parts: Parts, origin: str, ignored: tuple[str, ...], env: Mapping[str, str], tls: Tls
) -> IndexSetting:
    clean = parts.public
    if parts.scheme == "file":
        return IndexSetting(clean, origin, ignored, tls=tls)
    if parts.user is not None:
        password = parts.password or ""
        if not password:  # `https://token@host/`: the keyring may know the password
            known = _keyring(clean, parts.host, parts.user)
            password = known[1] if known else ""
        auth = _basic(parts.user, password)
        return IndexSetting(clean, origin, ignored, "the URL", auth, tls=tls)
    found = _netrc(parts.host.strip("[]"), env)
    if found is None:
        secret = _keyring(clean, parts.host, None)
        if secret is None:
            return IndexSetting(clean, origin, ignored, tls=tls)
        return IndexSetting(clean, origin, ignored, "the keyring", _basic(*secret), tls=tls)
    source, user, password = found
    return IndexSetting(clean, origin, ignored, source, _basic(user, password), tls=tls)


def _keyring(url: str, host: str, user: str | None) -> tuple[str, str] | None:
    """(user, password) the `keyring` package holds for the index (by its URL, then its
    host), as pip asks it when it is installed; None without keyring or an entry. Given a
    user, only that user's password."""
    try:
        import keyring  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    for service in (url, host):
        try:
            if user is None:
                found = keyring.get_credential(service, None)
                if found is not None and found.password:
                    return str(found.username), str(found.password)
            elif secret := keyring.get_password(service, user):
                return user, str(secret)
        except Exception:  # a broken keyring backend is passed over, as pip passes it over
            continue
    return None


def _tls(parts: Parts, config: PipConfig, env: Mapping[str, str]) -> Tls:
    """pip's and uv's TLS settings for the index: `PIP_CERT`, pip.conf `cert`, then
    `REQUESTS_CA_BUNDLE` / `CURL_CA_BUNDLE` (requests reads them for pip); a client certificate
    from `PIP_CLIENT_CERT`, pip.conf `client-cert`, then uv's `SSL_CLIENT_CERT`; the host in
    `PIP_TRUSTED_HOST`, pip.conf `trusted-host` or uv's `UV_INSECURE_HOST`. `SSL_CERT_FILE` and
    `SSL_CERT_DIR` (uv's and Python's) act through Python's defaults."""
    cafile = _first(
        env, ("PIP_CERT",), config.values.get("cert"), ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
    )
    client = _first(
        env, ("PIP_CLIENT_CERT",), config.values.get("client-cert"), ("SSL_CLIENT_CERT",)
    )
    trusted = ""
    if parts.scheme == "https":
        port = f":{parts.port}" if parts.port is not None else ""
        names = {parts.host.lower(), f"{parts.host.lower()}{port}"}
        candidates = [(env.get("PIP_TRUSTED_HOST", ""), "PIP_TRUSTED_HOST")]
        if "trusted-host" in config.values:
            candidates.append(config.values["trusted-host"])
        candidates.append((env.get("UV_INSECURE_HOST", ""), "UV_INSECURE_HOST"))
        for value, where in candidates:
            hosts = {h.strip().lower().removeprefix("https://").rstrip("/") for h in value.split()}
            if names & hosts:
                trusted = where
                break
    return Tls(
        cafile[0] if cafile else None,
        cafile[1] if cafile else "",
        client[0] if client else None,
        client[1] if client else "",
        trusted,
    )


def _first(
    env: Mapping[str, str],
    before: tuple[str, ...],
    configured: tuple[str, str] | None,
    after: tuple[str, ...],
) -> tuple[str, str] | None:
    """(value, origin) of the first setting given: the environment's `before`, the pip.conf
    value, the environment's `after`."""
    for name in before:
        if value := env.get(name, "").strip():
            return value, name
    if configured is not None:
        return configured
    for name in after:
        if value := env.get(name, "").strip():
            return value, name
    return None


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


TLS_KEYS = ("cert", "client-cert", "trusted-host")


@dataclass(frozen=True)
class PipConfig:
    """What pip's configuration files say for a download: the index (value, origin), the
    extra-index settings seen, and the TLS settings (key -> (value, origin))."""

    index: tuple[str, str] | None
    extras: list[str]
    values: dict[str, tuple[str, str]]


def _pip_config(env: Mapping[str, str]) -> PipConfig:
    """The index-url pip would download with and its origin, the extra-index settings seen, and
    `cert`, `client-cert` and `trusted-host`, each by pip's precedence."""
    best: dict[tuple[str, str], tuple[str, str]] = {}  # (key, section) -> (value, origin)
    extras: list[str] = []
    for path in config_files(env):
        for section, key, value in _read_config(path):
            if section not in SECTIONS:
                continue
            if key == "index-url" or key in TLS_KEYS:
                best[(key, section)] = (value, f"{path} [{section}] {key}")
            elif key in EXTRA_KEYS and f"pip.conf {key}" not in extras:
                extras.append(f"pip.conf {key}")
    chosen = {
        key: found
        for key in ("index-url", *TLS_KEYS)
        if (found := next((best[(key, s)] for s in SECTIONS if (key, s) in best), None))
    }
    return PipConfig(chosen.pop("index-url", None), extras, chosen)


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
