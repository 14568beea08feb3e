"""The one package-index client, shared by the upstream mirror (sdists) and the kit (the pin's
wheel): every index pip reads, each answer checked before use, and downloads verified against
the sha256 the index gives.

The indexes: the simple API over http(s), as JSON (PEP 691) or HTML (PEP 503), negotiated as
pip negotiates it (an `Accept` header listing both, JSON first) and told apart by the answer's
`Content-Type`; and a `file:` index, as `pip download --index-url file:///…` reads it: a folder
per project holding `index.html`, or a folder of the files themselves. The pages are parsed by
`pypi-simple` (the `maintain` extra): file name, URL (relative ones resolved against the page),
hashes, yanked, and PEP 700's size.

Each file is checked: a plain file name; an http(s) URL, or a `file:` URL only when the index is
itself a `file:` URL (a remote index never reads this machine's files). A file without a
sha256 is listed, never downloaded (nothing unverified is used), except from a `file:` index,
the user's own folder, whose files are hashed as they are copied.

Every transfer is bounded (the HTTP stack is the standard library's `urllib`, with our own
handlers; see `_Transfer`):
- in time: the headers within `VLLM_PATCHSET_INDEX_TIMEOUT` seconds (default 60), and the body
  never slower than `VLLM_PATCHSET_INDEX_MIN_RATE` bytes a second (default 50000) for longer
  than that: a transfer ends at the latest at timeout + size / rate;
- in size: the index's declared size (PEP 700) where it gives one, else
  `VLLM_PATCHSET_DOWNLOAD_LIMIT` bytes (default 2 GiB); a page at most 64 MiB;
- in redirects: at most 10, each to http(s) only, never from https to http, the index's
  credentials and TLS settings never after a hop that left its scheme, host and port.
Every HTTP, TLS or socket failure is one line (DownloadFailed, exit 2); a failed or interrupted
download leaves no `.part`.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from vllm_patchset.errors import BadInput, DownloadFailed
from vllm_patchset.infra import fsio, jsonfile
from vllm_patchset.infra.hashes import sha256_file
from vllm_patchset.infra.indexsettings import public, split

# pip's Accept header: JSON preferred, HTML understood.
ACCEPT = (
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.1,"
    " text/html;q=0.01"
)
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_TYPES = ("application/vnd.pypi.simple.v1+html", "text/html")
SCHEMES = ("https", "http", "file")
PAGE_LIMIT = 64 << 20  # pypi.org's page of vllm is a few MB
MAX_REDIRECTS = 10
TIMEOUT_ENV = "VLLM_PATCHSET_INDEX_TIMEOUT"
RATE_ENV = "VLLM_PATCHSET_INDEX_MIN_RATE"
LIMIT_ENV = "VLLM_PATCHSET_DOWNLOAD_LIMIT"
DEFAULT_TIMEOUT = 60.0
DEFAULT_RATE = 50_000.0
DEFAULT_LIMIT = 2 << 30
CHUNK = 1 << 20
_SHA256_HEX = frozenset("0123456789abcdef")
# What a failed transfer raises, below urllib: all of it becomes one line.
_NET_ERRORS = (urllib.error.URLError, http.client.HTTPException, OSError, ValueError)
# The headers a URL is fetched with (the index's credentials, for its own host only:
# `indexsettings.IndexSetting.headers`).
Auth = Callable[[str], Mapping[str, str]]


class Access(Protocol):
    """What the index's settings give a request (`indexsettings.IndexSetting`)."""

    def headers(self, url: str) -> Mapping[str, str]: ...

    def context(self, url: str) -> ssl.SSLContext | None: ...


@dataclass(frozen=True)
class _Plain:
    """Access with credentials only (a bare `Auth`), or none."""

    url: str
    auth: Auth | None = None

    def headers(self, url: str) -> Mapping[str, str]:
        return self.auth(url) if self.auth else {}

    def context(self, url: str) -> ssl.SSLContext | None:
        return None


def _access(index_url: str, access: Access | Auth | None) -> Access:
    if access is None or callable(access):
        return _Plain(index_url, access)
    return access


class TransferFailed(DownloadFailed):
    """A transfer that failed: the URL (public) and why, in words."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"{public(url)}: {why}")
        self.url = public(url)
        self.why = why


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str  # absolute, without userinfo
    sha256: str | None  # lower-case hex, None when the index gives none
    yanked: bool
    size: int | None = None  # PEP 700's size, when the index gives one
    local: bool = False  # from a `file:` index (the user's own folder)


# -- limits ---------------------------------------------------------------------------------------
def _number(name: str, default: float, *, whole: bool = False) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(int(raw)) if whole else float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        example = int(default) if whole else f"{default:g}"
        raise BadInput(f"{name}={raw!r}: expected a positive number (e.g. {example})")
    return value


@dataclass(frozen=True)
class Limits:
    timeout: float  # seconds: the headers, any one read, and the lag behind `rate`
    rate: float  # bytes a second
    size: int  # bytes

    @staticmethod
    def from_env(declared: int | None = None, page: bool = False) -> Limits:
        size = int(_number(LIMIT_ENV, DEFAULT_LIMIT, whole=True))
        if declared is not None:
            size = declared
        if page:
            size = min(size, PAGE_LIMIT)
        return Limits(_number(TIMEOUT_ENV, DEFAULT_TIMEOUT), _number(RATE_ENV, DEFAULT_RATE), size)


# -- the transfer ---------------------------------------------------------------------------------
class _Watch:
    """Shuts the transfer's sockets down when it falls behind its limits, checked four times a
    second from a thread of its own: a read that the socket's own timeout does not end (a
    header or chunk-size line sent a byte a second) ends then too."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.sockets: list[socket.socket] = []
        self.expired = False
        self.start = time.monotonic()
        self.got: int | None = None  # None until the headers are in
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def late(self) -> bool:
        elapsed = time.monotonic() - self.start
        allowed = self.limits.timeout + (self.got or 0) / self.limits.rate
        return elapsed > allowed

    def _run(self) -> None:
        while not self._done.wait(0.25):
            if self.late():
                self.expired = True
                for sock in list(self.sockets):
                    with suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def _opener(watch: _Watch, context: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    """urllib's opener with the environment's proxies, no redirect followed (`_open` follows
    them itself, checked), and every socket watched."""

    class Http(http.client.HTTPConnection):
        def connect(self) -> None:
            super().connect()
            watch.sockets.append(self.sock)

    class Https(http.client.HTTPSConnection):
        def connect(self) -> None:
            super().connect()
            watch.sockets.append(self.sock)

    class HttpHandler(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(Http, req)

    class HttpsHandler(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(Https, req, context=context)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    return urllib.request.build_opener(HttpHandler(), HttpsHandler(), NoRedirect())


def _site(url: str) -> tuple[str, str, int | None]:
    found = split(url)
    return (found.scheme, found.host.lower(), found.port) if found else ("", "", None)


@contextmanager
def _open(
    url: str, access: Access, limits: Limits, accept: str | None = None
) -> Iterator[tuple[str, http.client.HTTPResponse, _Watch]]:
    """The response to GET `url` (its final URL, the response, the transfer's watch),
    redirects followed and checked; DownloadFailed for anything but a 200, for a transfer over
    its limits, and for every HTTP or socket failure."""
    watch = _Watch(limits)
    first = _site(url)
    current, trusted = url, True
    try:
        for _ in range(MAX_REDIRECTS + 1):
            trusted = trusted and _site(current) == first
            headers = {"User-Agent": "vllm-patchset", **({"Accept": accept} if accept else {})}
            request = urllib.request.Request(current, headers=headers)
            for name, value in (access.headers(current) if trusted else {}).items():
                request.add_unredirected_header(name, value)
            context = access.context(current) if trusted else None
            try:
                response = _opener(watch, context).open(request, timeout=limits.timeout)
            except urllib.error.HTTPError as exc:
                exc.close()
                moved = exc.code in (301, 302, 303, 307, 308)
                location = exc.headers.get("Location") if moved else None
                if location is None:
                    raise
                current = _redirect(current, location)
                continue
            with response:
                watch.got = 0
                yield current, response, watch
            return
        raise TransferFailed(url, f"more than {MAX_REDIRECTS} redirects: refused")
    except _NET_ERRORS as exc:
        raise TransferFailed(current, _slow(limits) if watch.expired else _words(exc)) from None
    finally:
        watch.stop()


def _slow(limits: Limits) -> str:
    return (
        f"slower than {limits.rate:g} bytes/s for more than {limits.timeout:g} s"
        f" ({RATE_ENV}, {TIMEOUT_ENV})"
    )


def _redirect(current: str, location: str) -> str:
    target = urllib.parse.urljoin(current, location.strip())
    parts = split(target)
    if parts is None or parts.scheme not in ("http", "https"):
        raise TransferFailed(current, "a redirect to a URL that is not http(s): refused")
    if _site(current)[0] == "https" and parts.scheme == "http":
        raise TransferFailed(current, "a redirect from https to http: refused")
    return parts.public


def _read(
    response: http.client.HTTPResponse, sink: Callable[[bytes], None], url: str, watch: _Watch
) -> int:
    """The body of `response` into `sink`, within the watch's limits; the bytes read."""
    limits = watch.limits
    declared = response.headers.get("Content-Length")
    length = int(declared) if declared and declared.strip().isdigit() else None
    if length is not None and length > limits.size:
        raise TransferFailed(url, _too_big(limits))
    got = 0
    while chunk := response.read1(CHUNK):
        got += len(chunk)
        if got > limits.size:
            raise TransferFailed(url, _too_big(limits))
        watch.got = got
        if watch.late():
            raise TransferFailed(url, _slow(limits))
        sink(chunk)
    if watch.expired:
        raise TransferFailed(url, _slow(limits))
    if length is not None and got != length:
        raise TransferFailed(url, f"truncated ({got} of {length} bytes)")
    return got


def _too_big(limits: Limits) -> str:
    return (
        f"more than {limits.size} bytes, the bound of a download (the index's declared size,"
        f" else {LIMIT_ENV})"
    )


def _printable(text: object, limit: int = 120) -> str:
    """What a server sent (a status line, a reason), shown: its first line, at most `limit`
    characters, each control character (a terminal's escape sequence) as `?`."""
    line = str(text).splitlines()[0] if str(text) else ""
    return "".join(c if c.isprintable() else "?" for c in line[:limit])


def _words(exc: BaseException) -> str:
    """An error of urllib, http.client, ssl or the OS, in words (one line, no URL)."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {_printable(exc.reason)}"
    reason = getattr(exc, "reason", None)
    if isinstance(exc, urllib.error.URLError) and isinstance(reason, BaseException):
        exc = reason
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "timed out"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    if isinstance(exc, http.client.HTTPException):
        detail = _printable(exc)
        return f"a broken HTTP answer ({type(exc).__name__}{': ' + detail if detail else ''})"
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    if reason is not None:
        return _printable(reason, 200)
    return f"{type(exc).__name__}: {_printable(exc, 200)}"


# -- pages ----------------------------------------------------------------------------------------
def files(
    index_url: str,
    package: str,
    *,
    unreachable: str = "",
    auth: Access | Auth | None = None,
) -> list[IndexFile]:
    """The files the index lists for `package`; DownloadFailed (ending with `unreachable`)
    when it cannot be read, or answers something that is not a PEP 691 or 503 page."""
    access = _access(index_url, auth)
    url = f"{index_url}/{package}/"
    if _site(index_url)[0] == "file":
        return _local_files(index_url, package, unreachable)
    limits = Limits.from_env(page=True)
    chunks: list[bytes] = []
    try:
        with _open(url, access, limits, ACCEPT) as (page, response, watch):
            kind = (response.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            _read(response, chunks.append, page, watch)
    except TransferFailed as exc:
        raise DownloadFailed(
            f"cannot read the package index {exc.url} ({exc.why}){unreachable}"
        ) from None
    data = b"".join(chunks)
    if kind == JSON_TYPE or kind == "application/json":
        return _parse(package, data, page, json_page=True, where=url, unreachable=unreachable)
    if kind in HTML_TYPES:
        return _parse(package, data, page, json_page=False, where=url, unreachable=unreachable)
    raise DownloadFailed(
        f"the package index {url} answered {kind or 'no content type'}, not a PEP 691 (JSON) or"
        f" PEP 503 (HTML) page{unreachable}"
    )


def _parse(
    package: str, data: bytes, page: str, *, json_page: bool, where: str, unreachable: str
) -> list[IndexFile]:
    """The files of a PEP 691 (JSON) or PEP 503 (HTML) page; DownloadFailed, naming what is
    wrong, for a page that is neither or lists a file the rules refuse."""
    kind = "PEP 691" if json_page else "PEP 503"
    local = _site(page)[0] == "file"
    try:
        if json_page:
            doc = jsonfile.parse(data, limit=PAGE_LIMIT)
            entries = jsonfile.field(doc, "files", list)
            return [_json_entry(page, entry, local=local) for entry in entries]
        return [_html_entry(found, local=local) for found in _html_packages(package, data, page)]
    except ValueError as exc:
        raise DownloadFailed(
            f"the package index {where} answered no {kind} page ({exc}){unreachable}"
        ) from None


def _html_packages(package: str, data: bytes, page: str) -> list[Any]:
    """The links of a PEP 503 page, read by pypi-simple (its `<base>`, `#sha256=` fragments,
    `data-yanked`, as pip reads them)."""
    try:
        from pypi_simple import ProjectPage
    except ImportError:
        raise BadInput(
            "reading a PEP 503 (HTML) package index needs the 'maintain' extra (missing:"
            " pypi-simple): pip install 'vllm-patchset[maintain]'"
        ) from None
    try:
        return list(ProjectPage.from_html(package, data, base_url=page).packages)
    except Exception as exc:  # what pypi-simple or its HTML parser raise: a page it cannot read
        why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise jsonfile.BadJson(f"not an HTML page pypi-simple reads: {why}") from None


def _checked(name: str, url: str, *, local: bool) -> str:
    """`url` (absolute) of the file `name`, when the rules allow them: a plain file name; an
    http(s) URL, or a file: one from a file: index only. Without userinfo."""
    if fsio.plain_parts(name) is None or "/" in name:
        raise jsonfile.BadJson(f"file name {name!r} is not a plain file name")
    parts = split(url)
    if parts is None or parts.scheme not in SCHEMES:
        raise jsonfile.BadJson(f"the URL of {name} is not http, https or file")
    if parts.scheme == "file" and not local:
        raise jsonfile.BadJson(
            f"the URL of {name} is a file: URL, and a remote index never reads this machine's files"
        )
    return parts.public


def _sha256(value: object) -> str | None:
    if isinstance(value, str) and len(value) == 64 and set(value.lower()) <= _SHA256_HEX:
        return value.lower()
    return None


def _json_entry(page: str, entry: object, *, local: bool) -> IndexFile:
    if not isinstance(entry, dict):
        raise jsonfile.BadJson("a file entry is not a JSON object")
    name = jsonfile.field(entry, "filename", str)
    url = _checked(name, urllib.parse.urljoin(page, jsonfile.field(entry, "url", str)), local=local)
    hashes = entry.get("hashes", {})
    sha = _sha256(hashes.get("sha256") if isinstance(hashes, dict) else None)
    size = entry.get("size")
    declared = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
    return IndexFile(name, url, sha, bool(entry.get("yanked")), declared, local)


def _html_entry(package: Any, *, local: bool) -> IndexFile:
    name = str(package.filename)
    url = _checked(name, str(package.url), local=local)
    sha = _sha256((package.digests or {}).get("sha256"))
    return IndexFile(name, url, sha, bool(package.is_yanked), None, local)


def _local_path(url: str) -> Path:
    return Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))


def _local_files(index_url: str, package: str, unreachable: str) -> list[IndexFile]:
    """A `file:` index as pip reads one: `<root>/<package>/index.html` (a PEP 503 page, or a
    PEP 691 JSON one), else the files of `<root>/<package>/`, else the files of `<root>/`
    (a flat folder) whose names begin with the package's."""
    root = _local_path(index_url)
    folder = root / package
    page = folder / "index.html"
    try:
        data = fsio.read_regular(page, limit=PAGE_LIMIT + 1, follow=True)
    except BadInput as exc:
        raise DownloadFailed(f"cannot read the package index: {exc}{unreachable}") from None
    if data is not None:
        if len(data) > PAGE_LIMIT:
            raise DownloadFailed(f"{page}: larger than {PAGE_LIMIT} bytes{unreachable}")
        return _parse(
            package,
            data,
            page.as_uri(),
            json_page=data.lstrip()[:1] == b"{",
            where=str(page),
            unreachable=unreachable,
        )
    for where in (folder, root):
        if where.is_dir():
            prefix = package.replace("-", "_").lower()
            return [
                IndexFile(path.name, path.as_uri(), None, False, None, True)
                for path in sorted(where.iterdir())
                if path.name.replace("-", "_").lower().startswith(prefix + "-")
                or path.name.lower().startswith(prefix + "-")
            ]
    raise DownloadFailed(
        f"cannot read the package index {public(index_url)}: no folder {root}{unreachable}"
    )


# -- downloads ------------------------------------------------------------------------------------
def fetch(entry: IndexFile, folder: Path, auth: Access | Auth | None = None) -> Path:
    """`entry`'s file in `folder`, downloaded once: a cached copy is used when its sha256 is the
    index's; a download only when its sha256 is (else nothing is kept). A file of a `file:`
    index without a sha256 is copied as it is (the user's own folder)."""
    if entry.sha256 is None and not entry.local:
        raise DownloadFailed(
            f"the package index gives no sha256 for {entry.filename}: it cannot be verified,"
            " nothing was downloaded"
        )
    fsio.no_symlink_below(folder.parent, (folder.name,))  # a cache's folder, not a link out
    target = folder / entry.filename
    if entry.sha256 and fsio.is_regular(target) and sha256_file(target) == entry.sha256:
        return target
    fsio.make_dirs(folder)
    _sweep_parts(folder, entry.filename)
    # One `.part` a run (its pid in the name): two runs downloading the same file never write
    # into one; the last to finish moves its whole, verified file in place.
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")
    try:
        download(entry.url, partial, entry.filename, auth, size=entry.size)
        got = sha256_file(partial)
        if entry.sha256 is not None and got != entry.sha256:
            raise DownloadFailed(
                f"{entry.filename}: sha256 {got} does not match the index's {entry.sha256}"
                " (truncated or altered download; nothing was imported)"
            )
        fsio.move(partial, target)
        verified = "sha256 verified" if entry.sha256 else "copied from the local index"
        print(f"downloaded {entry.filename}, {verified}", file=sys.stderr)
    finally:
        fsio.remove_file(partial)
    return target


def part_pid(name: str, filename: str) -> int | None:
    """The pid in `name` when it is a `.part` of `filename` (`<filename>.<pid>.part`)."""
    pid = name.removeprefix(f"{filename}.").removesuffix(".part")
    if name == f"{filename}.{pid}.part" and pid.isdigit():
        return int(pid)
    return None


def _sweep_parts(folder: Path, filename: str) -> None:
    """Remove the `.part`s of `filename` that killed runs left (SIGKILL: nothing of theirs
    ran to remove them): regular files only, of a pid that is gone."""
    for path in folder.iterdir():
        pid = part_pid(path.name, filename)
        if pid is None or not fsio.is_regular(path):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            fsio.remove_file(path)
        except PermissionError:
            continue


def download(
    url: str,
    dest: Path,
    name: str,
    auth: Access | Auth | None = None,
    *,
    size: int | None = None,
) -> None:
    """Download `url` to `dest` (made here, never through a link), bounded (`Limits`), with
    its bytes and speed on stderr on a terminal. A `file:` URL is copied."""
    from vllm_patchset.console import progress

    limits = Limits.from_env(declared=size)
    access = _access(url, auth)
    with fsio.writing(dest, exclusive=True) as out:
        if _site(url)[0] == "file":
            _copy_local(url, out, limits)
            return
        try:
            with _open(url, access, limits) as (final, response, watch):
                declared = response.headers.get("Content-Length")
                total = int(declared) if declared and declared.strip().isdigit() else None
                with progress(f"downloading {name}", total, unit="bytes") as step:

                    def sink(chunk: bytes) -> None:
                        out.write(chunk)
                        step.advance(len(chunk))

                    _read(response, sink, final, watch)
        except TransferFailed as exc:
            raise DownloadFailed(f"download of {exc.url} failed: {exc.why}") from None


def _copy_local(url: str, out: BinaryIO, limits: Limits) -> None:
    path = _local_path(url)
    got = 0
    try:
        for chunk in fsio.read_chunks(path, follow=True):
            got += len(chunk)
            if got > limits.size:
                raise TransferFailed(url, _too_big(limits))
            out.write(chunk)
    except (FileNotFoundError, NotADirectoryError):
        raise DownloadFailed(f"{path}: no such file in the local index") from None
