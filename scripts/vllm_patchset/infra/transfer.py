"""One bounded HTTP(S) GET, as the package index client (`index.py`) makes it: the standard
library's `urllib` with handlers of our own, every failure one line (`TransferFailed`).

Bounded:
- in time: the headers within `VLLM_PATCHSET_INDEX_TIMEOUT` seconds (default 60), and the body
  never slower than `VLLM_PATCHSET_INDEX_MIN_RATE` bytes a second (default 50000) for longer
  than that (`Limits`, kept by a thread of its own: `Watch`): a transfer ends at the latest at
  timeout + size / rate;
- in size: the index's declared size (PEP 700) where it gives one, else
  `VLLM_PATCHSET_DOWNLOAD_LIMIT` bytes (default 2 GiB); a page at most 64 MiB;
- in redirects: at most 10, each to http(s) only, never from https to http, the index's
  credentials and TLS settings (`Access`) never after a hop that left its scheme, host and
  port.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Protocol

from vllm_patchset.errors import BadInput, DownloadFailed
from vllm_patchset.infra.indexsettings import public, split

PAGE_LIMIT = 64 << 20  # pypi.org's page of vllm is a few MB
MAX_REDIRECTS = 10
TIMEOUT_ENV = "VLLM_PATCHSET_INDEX_TIMEOUT"
RATE_ENV = "VLLM_PATCHSET_INDEX_MIN_RATE"
LIMIT_ENV = "VLLM_PATCHSET_DOWNLOAD_LIMIT"
DEFAULT_TIMEOUT = 60.0
DEFAULT_RATE = 50_000.0
DEFAULT_LIMIT = 2 << 30
CHUNK = 1 << 20
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


def access_for(index_url: str, access: Access | Auth | None) -> Access:
    if access is None or callable(access):
        return _Plain(index_url, access)
    return access


class TransferFailed(DownloadFailed):
    """A transfer that failed: the URL (public) and why, in words."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"{public(url)}: {why}")
        self.url = public(url)
        self.why = why


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
class Watch:
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


def _opener(watch: Watch, context: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    """urllib's opener with the environment's proxies, no redirect followed (`get` follows
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


def site_of(url: str) -> tuple[str, str, int | None]:
    found = split(url)
    return (found.scheme, found.host.lower(), found.port) if found else ("", "", None)


@contextmanager
def get(
    url: str, access: Access, limits: Limits, accept: str | None = None
) -> Iterator[tuple[str, http.client.HTTPResponse, Watch]]:
    """The response to GET `url` (its final URL, the response, the transfer's watch),
    redirects followed and checked; DownloadFailed for anything but a 200, for a transfer over
    its limits, and for every HTTP or socket failure."""
    watch = Watch(limits)
    first = site_of(url)
    current, trusted = url, True
    try:
        for _ in range(MAX_REDIRECTS + 1):
            trusted = trusted and site_of(current) == first
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
    if site_of(current)[0] == "https" and parts.scheme == "http":
        raise TransferFailed(current, "a redirect from https to http: refused")
    return parts.public


def read_body(
    response: http.client.HTTPResponse, sink: Callable[[bytes], None], url: str, watch: Watch
) -> int:
    """The body of `response` into `sink`, within the watch's limits; the bytes read."""
    limits = watch.limits
    declared = response.headers.get("Content-Length")
    length = int(declared) if declared and declared.strip().isdigit() else None
    if length is not None and length > limits.size:
        raise TransferFailed(url, too_big(limits))
    got = 0
    while chunk := response.read1(CHUNK):
        got += len(chunk)
        if got > limits.size:
            raise TransferFailed(url, too_big(limits))
        watch.got = got
        if watch.late():
            raise TransferFailed(url, _slow(limits))
        sink(chunk)
    if watch.expired:
        raise TransferFailed(url, _slow(limits))
    if length is not None and got != length:
        raise TransferFailed(url, f"truncated ({got} of {length} bytes)")
    return got


def too_big(limits: Limits) -> str:
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
