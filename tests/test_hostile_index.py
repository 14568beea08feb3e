"""The package index as a hostile network meets the tool (infra/index.py, infra/indexsettings.py):
a server on 127.0.0.1 that misbehaves in each way of a table (slow, endless, truncated, malformed,
redirecting, oversized, wrong type, local files listed), and passwords spelt with every URL-
reserved character in every setting the index comes from.

Every case ends in seconds (the index client's limits are made small through its environment
variables), is one line on stderr with exit 2, leaves no `.part`, and changes no file of the
cache (its manifest, path and sha256, before and after). The server bounds itself too: no
answer runs longer than SERVE_SECONDS or writes more than SERVE_BYTES, so a failing run can
neither hang nor fill the disk."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import socket
import socketserver
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import cli
from vllm_patchset.infra.config import Project
from vllm_patchset.overlay.upstream import Mirror

RELEASE = "7.0"
NAME = f"vllm-{RELEASE}.tar.gz"
SERVE_SECONDS = 8.0
SERVE_BYTES = 8 << 20
LIMITS = {  # the client's limits for these cases: each case ends within a few seconds
    "VLLM_PATCHSET_INDEX_TIMEOUT": "1",
    "VLLM_PATCHSET_INDEX_MIN_RATE": "100000",
    "VLLM_PATCHSET_DOWNLOAD_LIMIT": str(1 << 20),
}


def _sdist() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = b'__version__ = "7.0"\n'
        info = tarfile.TarInfo(f"vllm-{RELEASE}/vllm/__init__.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


SDIST = _sdist()
SHA = hashlib.sha256(SDIST).hexdigest()


# -- the server -----------------------------------------------------------------------------------
Answer = Callable[["_Conn"], None]


@dataclass
class _Conn:
    """One request: its path and headers, and a bounded way to answer it."""

    sock: socket.socket
    path: str
    headers: dict[str, str]
    server: Hostile
    sent: int = 0
    began: float = field(default_factory=time.monotonic)

    def send(self, data: bytes) -> bool:
        """Send `data` unless the answer is over its bounds (or the client left)."""
        if self.sent + len(data) > SERVE_BYTES or time.monotonic() - self.began > SERVE_SECONDS:
            return False
        if self.server.stopping.is_set():
            return False
        try:
            self.sock.sendall(data)
        except OSError:
            return False
        self.sent += len(data)
        return True

    def answer(self, status: str, headers: dict[str, str], body: bytes) -> None:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.send(f"HTTP/1.1 {status}\r\n{head}Connection: close\r\n\r\n".encode() + body)

    def trickle(self, data: bytes, pause: float) -> None:
        for i in range(len(data)):
            if not self.send(data[i : i + 1]) or self.server.stopping.wait(pause):
                return


class Hostile:
    """A threaded HTTP/1.1 server on 127.0.0.1 whose answers are the functions in `routes`
    (by path); `seen` holds each request's (path, Authorization header)."""

    def __init__(self, routes: dict[str, Answer]) -> None:
        self.routes = routes
        self.seen: list[tuple[str, str | None]] = []
        self.stopping = threading.Event()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(SERVE_SECONDS)
                raw = b""
                try:
                    while b"\r\n\r\n" not in raw and len(raw) < 65536:
                        chunk = self.request.recv(4096)
                        if not chunk:
                            return
                        raw += chunk
                except OSError:
                    return
                lines = raw.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else "/"
                headers = dict(
                    (k.strip().lower(), v.strip())
                    for k, _, v in (line.partition(":") for line in lines[1:])
                )
                outer.seen.append((path, headers.get("authorization")))
                conn = _Conn(self.request, path, headers, outer)
                route = outer.routes.get(path, not_found)
                route(conn)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{self.base}/simple"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def not_found(conn: _Conn) -> None:
    conn.answer("404 Not Found", {"Content-Length": "0"}, b"")


def page_json(files: list[dict[str, object]]) -> Answer:
    body = json.dumps({"meta": {"api-version": "1.1"}, "name": "vllm", "files": files}).encode()

    def answer(conn: _Conn) -> None:
        headers = {
            "Content-Type": "application/vnd.pypi.simple.v1+json",
            "Content-Length": str(len(body)),
        }
        conn.answer("200 OK", headers, body)

    return answer


def listing(url: str, **extra: object) -> Answer:
    return page_json([{"filename": NAME, "url": url, "hashes": {"sha256": SHA}, **extra}])


def body(data: bytes, content_type: str = "application/octet-stream") -> Answer:
    def answer(conn: _Conn) -> None:
        headers = {"Content-Type": content_type, "Content-Length": str(len(data))}
        conn.answer("200 OK", headers, data)

    return answer


def raw(data: bytes) -> Answer:
    def answer(conn: _Conn) -> None:
        conn.send(data)

    return answer


def slow_body(conn: _Conn) -> None:
    conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nContent-Type: text/html\r\n\r\n")
    conn.trickle(b"x" * 100, 2.0)


def slow_headers(conn: _Conn) -> None:
    conn.send(b"HTTP/1.1 200 OK\r\n")
    conn.trickle(b"X-Slow: " + b"y" * 1000, 0.3)


def endless(conn: _Conn) -> None:
    conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n")
    block = bytes(64 << 10)
    while conn.send(block):
        pass


def chunked_endless(conn: _Conn) -> None:
    conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    block = b"10000\r\n" + bytes(0x10000) + b"\r\n"
    while conn.send(block):
        pass


def truncated(conn: _Conn) -> None:
    conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + b"z" * 10)


def bad_chunk(conn: _Conn) -> None:
    conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n")


def reset(conn: _Conn) -> None:
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.sock.close()


def redirect(location: str) -> Answer:
    return lambda conn: conn.answer("302 Found", {"Location": location, "Content-Length": "0"}, b"")


def html_page(url: str, content_type: str = "text/html") -> Answer:
    page = f'<!DOCTYPE html><html><body><a href="{url}#sha256={SHA}">{NAME}</a></body></html>'
    return body(page.encode(), content_type)


PAGE = "/simple/vllm/"
FILE = f"/files/{NAME}"


# -- the table ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str
    routes: Callable[[str], dict[str, Answer]]  # the server's base URL -> its answers
    command: tuple[str, ...]  # `releases` reads the page; `fetch` the file too
    error: str  # what the one line says ({base}: the server's base URL)


def _file_case(name: str, answer: Answer, error: str, **extra: object) -> Case:
    return Case(
        name,
        lambda base: {PAGE: listing(f"{base}{FILE}", **extra), FILE: answer},
        ("fetch", RELEASE),
        error,
    )


def _page_case(name: str, answer: Answer, error: str) -> Case:
    return Case(name, lambda base: {PAGE: answer}, ("releases",), error)


NOT_CACHED = " and the release is not cached"
SLOW = "slower than 100000 bytes/s for more than 1 s (VLLM_PATCHSET_INDEX_MIN_RATE, VLLM_PATCHSET_INDEX_TIMEOUT)"
BIG = "more than {size} bytes, the bound of a download (the index's declared size, else VLLM_PATCHSET_DOWNLOAD_LIMIT)"
CASES = [
    _page_case("page-1-byte-every-2-s", slow_body, f"({SLOW}){NOT_CACHED}"),
    _page_case("headers-1-byte-every-0.3-s", slow_headers, f"({SLOW}){NOT_CACHED}"),
    _page_case("page-endless", endless, f"({BIG.format(size=1 << 20)}){NOT_CACHED}"),
    _page_case("page-truncated", truncated, f"(truncated (10 of 5000 bytes)){NOT_CACHED}"),
    _page_case(
        "malformed-status-line",
        raw(b"HTTX/1.1 200 OK\r\n\r\n"),
        f"(a broken HTTP answer (BadStatusLine: HTTX/1.1 200 OK)){NOT_CACHED}",
    ),
    _page_case(
        "more-than-100-headers",
        raw(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(101)) + b"\r\n"),
        f"(a broken HTTP answer (HTTPException: got more than 100 headers)){NOT_CACHED}",
    ),
    _page_case(
        "overlong-header-line",
        raw(b"HTTP/1.1 200 OK\r\nX-Long: " + b"y" * 70000 + b"\r\n\r\n"),
        f"(a broken HTTP answer (LineTooLong: got more than 65536 bytes when reading header"
        f" line)){NOT_CACHED}",
    ),
    _page_case(
        "bad-chunk",
        bad_chunk,
        f"(a broken HTTP answer (IncompleteRead: IncompleteRead(0 bytes read))){NOT_CACHED}",
    ),
    _page_case(
        "status-line-with-escapes",
        raw(b"HTTP/1.1 500 \x1b]0;owned\x07\x1b[2J\r\nContent-Length: 0\r\n\r\n"),
        f"(HTTP 500 ?]0;owned??[2J){NOT_CACHED}",
    ),
    _page_case("connection-reset", reset, f"(Connection reset by peer){NOT_CACHED}"),
    _page_case(
        "closed-without-answer",
        raw(b""),
        f"(a broken HTTP answer (RemoteDisconnected: Remote end closed connection without"
        f" response)){NOT_CACHED}",
    ),
    _page_case("redirect-loop", redirect(PAGE), f"(more than 10 redirects: refused){NOT_CACHED}"),
    _page_case(
        "redirect-to-a-local-file",
        redirect("file:///etc/hostname"),
        f"(a redirect to a URL that is not http(s): refused){NOT_CACHED}",
    ),
    _page_case(
        "wrong-content-type",
        body(b"{}", "application/octet-stream"),
        "application/octet-stream, not a PEP 691 (JSON) or PEP 503 (HTML) page" + NOT_CACHED,
    ),
    _page_case(
        "json-lists-dev-zero",
        listing("file:///dev/zero"),
        f"(the URL of {NAME} is a file: URL, and a remote index never reads this machine's"
        f" files){NOT_CACHED}",
    ),
    _page_case(
        "html-lists-etc-hostname",
        html_page("file:///etc/hostname"),
        f"(the URL of {NAME} is a file: URL, and a remote index never reads this machine's"
        f" files){NOT_CACHED}",
    ),
    Case(  # a captive portal's HTML page: read as a PEP 503 page listing nothing
        "captive-portal-html",
        lambda base: {PAGE: body(b"<html><body>Log in to the Wi-Fi</body></html>", "text/html")},
        ("fetch", RELEASE),
        f"vllm {RELEASE} is not available from http://127.0.0.1:",
    ),
    _file_case("file-1-byte-every-2-s", slow_body, SLOW),
    _file_case("file-endless", endless, BIG.format(size=1 << 20)),
    _file_case("file-endless-chunked", chunked_endless, BIG.format(size=1 << 20)),
    _file_case(
        "file-over-its-declared-size",
        body(SDIST + b"x"),
        BIG.format(size=len(SDIST)),
        size=len(SDIST),
    ),
    _file_case(
        "file-declared-10-GB",
        raw(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n"),
        BIG.format(size=1 << 20),
    ),
    _file_case("file-truncated", truncated, "truncated (10 of 5000 bytes)"),
    _file_case("file-reset", reset, "Connection reset by peer"),
    _file_case(
        "file-redirect-to-dev-zero",
        redirect("file:///dev/zero"),
        "a redirect to a URL that is not http(s): refused",
    ),
]


def manifest(root: Path) -> dict[str, str]:
    """Every file under `root` (links and special files by kind): path -> sha256."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = f"link to {path.readlink()}"
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    Mirror(cache)  # the mirror and the cache's lock made: what a case may not change
    monkeypatch.setenv("VLLM_PATCHSET_CACHE", str(cache))
    for name, value in LIMITS.items():
        monkeypatch.setenv(name, value)
    return cache


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_misbehaving_index_is_one_line_in_seconds(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tiny: Project,
    fresh_cache: Path,
    case: Case,
) -> None:
    server = Hostile({})
    try:
        server.routes.update(case.routes(server.base))
        monkeypatch.setenv("PIP_INDEX_URL", server.url)
        before = manifest(fresh_cache)
        began = time.monotonic()
        code, out, err = cli(capsys, tiny.root, *case.command)
        took = time.monotonic() - began
    finally:
        server.close()
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("vllm-patchset: "), err
    assert case.error in err, err
    assert "internal error" not in err and "Traceback" not in err
    assert took < 6, took
    assert manifest(fresh_cache) == before
    assert not list(fresh_cache.rglob("*.part"))


@pytest.mark.parametrize("content_type", ["text/html", "application/vnd.pypi.simple.v1+html"])
def test_a_pep_503_html_index_is_read_as_pip_reads_it(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tiny: Project,
    fresh_cache: Path,
    content_type: str,
) -> None:
    """A private index that serves HTML (PEP 503): asked as pip asks (JSON preferred, HTML
    understood), its page read, the sdist verified by the page's `#sha256=` and imported."""
    server = Hostile({})
    try:
        server.routes[PAGE] = html_page(f"../../files/{NAME}", content_type)
        server.routes[FILE] = body(SDIST)
        monkeypatch.setenv("PIP_INDEX_URL", server.url)
        assert cli(capsys, tiny.root, "releases") == (0, f"{RELEASE}\n", "")
        code, out, err = cli(capsys, tiny.root, "fetch", RELEASE)
    finally:
        server.close()
    assert (code, err) == (0, f"downloaded {NAME}, sha256 verified\n")
    assert f"pypi:{NAME} sha256:{SHA} {server.base}{FILE})" in out
    assert (fresh_cache / "sdists" / NAME).read_bytes() == SDIST


def test_pip_s_accept_header() -> None:
    """pip's content negotiation: JSON first, then PEP 503 HTML, then any HTML."""
    from vllm_patchset.infra import index

    seen: list[str] = []

    def record(conn: _Conn) -> None:
        seen.append(conn.headers.get("accept", ""))
        page_json([])(conn)

    server = Hostile({PAGE: record})
    try:
        assert index.files(server.url, "vllm") == []
    finally:
        server.close()
    assert seen == [
        "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.1,"
        " text/html;q=0.01"
    ]


def test_credentials_never_follow_a_redirect_to_another_host(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tiny: Project,
    fresh_cache: Path,
) -> None:
    """The index (127.0.0.1) redirects its file to `localhost` (another host for the rules),
    which redirects back: neither of the last two gets the credentials."""
    server = Hostile({})
    try:
        port = server.base.rpartition(":")[2]
        other = f"http://localhost:{port}"
        server.routes.update(
            {
                PAGE: listing(f"{server.base}/moved"),
                "/moved": redirect(f"{other}/back"),
                "/back": redirect(f"{server.base}{FILE}"),
                FILE: body(SDIST),
            }
        )
        monkeypatch.setenv("PIP_INDEX_URL", server.url.replace("//", "//u:p%2Fw@"))
        code, _, err = cli(capsys, tiny.root, "fetch", RELEASE)
    finally:
        server.close()
    assert (code, err) == (0, f"downloaded {NAME}, sha256 verified\n")
    basic = "Basic " + base64.b64encode(b"u:p/w").decode()
    assert server.seen == [(PAGE, basic), ("/moved", basic), ("/back", None), (FILE, None)]


# -- secrets --------------------------------------------------------------------------------------
CANARY = "CANARYpw"
RESERVED = "/#?@:[]%!$&'()*+,;="


def passwords() -> list[str]:
    """A password with each URL-reserved character, unencoded, where people paste it (before,
    inside and after the canary), and one percent-encoded."""
    found = [f"ab{c}{CANARY}" for c in RESERVED] + [f"{CANARY}{c}" for c in "/#?@:"]
    return [*found, f"{CANARY}%2F%40x", f"a/b#c?d@{CANARY}"]


def _settings(url_with: Callable[[str], str], tmp: Path) -> list[tuple[str, dict[str, str], str]]:
    """(setting, environment, origin) of each place an index URL comes from."""
    conf = tmp / "pip.conf"
    conf.write_text(f"[global]\nindex-url = {url_with('pip.conf')}\n")
    return [
        ("PIP_INDEX_URL", {"PIP_INDEX_URL": url_with("")}, "PIP_INDEX_URL"),
        ("UV_INDEX_URL", {"UV_INDEX_URL": url_with("")}, "UV_INDEX_URL"),
        ("UV_DEFAULT_INDEX", {"UV_DEFAULT_INDEX": f"corp={url_with('')}"}, "UV_DEFAULT_INDEX"),
        ("pip.conf", {"PIP_CONFIG_FILE": str(conf)}, f"{conf} [global] index-url"),
    ]


# Every password through the commands that read the index page; the first three through every
# command (status, fetch too: their cost is the story's tree).
CHEAP = [("releases", "--verbose"), ("--json", "releases", "--verbose")]
COMMANDS = [
    ("status", "--verbose"),
    ("--json", "status", "--verbose"),
    ("releases", "--verbose"),
    ("--json", "releases", "--verbose"),
    ("fetch", "--verbose", RELEASE),
    ("--json", "fetch", RELEASE),
]


@pytest.mark.parametrize("password", passwords())
def test_no_password_is_ever_printed(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tiny: Project,
    fresh_cache: Path,
    password: str,
) -> None:
    """Each password in each setting (the environment's, pip.conf, the project's pyproject,
    netrc), through every command that reads the index, with --json and --verbose: the canary
    is in no output, no file of the cache and no lock; the URL is either used (without its
    userinfo in what is shown) or refused in one line naming the setting."""
    server = Hostile({FILE: body(SDIST)})
    server.routes[PAGE] = listing(f"{server.base}{FILE}")
    outputs: list[str] = []
    try:
        url = server.url.replace("//", f"//user:{password}@")
        pyproject = tiny.root / "pyproject.toml"
        text = pyproject.read_text()
        settings = _settings(lambda _: url, tmp_path)
        settings.append(("pyproject", {}, f"{pyproject} [tool.vllm-patchset] index-url"))
        netrc = tmp_path / "netrc"
        netrc.write_text(f'machine 127.0.0.1 login user password "{password}"\n')
        settings.append(("netrc", {"NETRC": str(netrc), "PIP_INDEX_URL": server.url}, ""))
        for setting, env, origin in settings:
            with monkeypatch.context() as patch:
                for name, value in env.items():
                    patch.setenv(name, value)
                if setting == "pyproject":
                    pyproject.write_text(
                        re.sub(r'index-url = "[^"]*"', f'index-url = "{url}"', text)
                    )
                for command in COMMANDS if password in passwords()[:3] else CHEAP:
                    code, out, err = cli(capsys, tiny.root, *command)
                    outputs.append(f"{setting} {command}: {code}\n{out}{err}")
                    assert code in (0, 1, 2), (setting, command, err)
                    assert "internal error" not in err
                    if code == 2 and origin and "not an http" in err:
                        assert err.startswith(f"vllm-patchset: {origin}: "), err
                pyproject.write_text(text)
    finally:
        server.close()
    everything = "\n".join(outputs)
    assert CANARY not in everything
    for path in fresh_cache.rglob("*"):
        assert CANARY not in str(path)
        if path.is_file() and not path.is_symlink() and "objects" not in path.parts:
            assert CANARY.encode() not in path.read_bytes(), path
    lock = tiny.root / "overlay" / "overlay.lock.json"
    assert CANARY not in lock.read_text()
    messages = subprocess.run(  # the mirror's tags: where each tree came from
        ["git", "--git-dir", str(fresh_cache / "mirror.git"), "log", "--all", "--format=%B"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert CANARY not in messages.stdout


UNPARSEABLE = [
    f"http://user:{CANARY}@[::1/simple",
    f"http://user:ab/{CANARY}@[::1]x/simple",
    f"http://user:{CANARY}@host:99999/simple",
    f"http://user:{CANARY}@host:port/simple",
    f"http://:{CANARY}@/simple",
    f"http://user:p {CANARY}@host/simple",
]


@pytest.mark.parametrize("url", UNPARSEABLE)
def test_an_unparseable_url_is_one_line_naming_its_setting(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tiny: Project,
    url: str,
) -> None:
    for _, env, origin in _settings(lambda _: url, tmp_path):
        with monkeypatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            for command in (("releases",), ("--json", "status", "--verbose")):
                code, out, err = cli(capsys, tiny.root, *command)
                assert code == 2, err
                line = (
                    f"vllm-patchset: {origin}: not an http, https or file URL (expected e.g."
                    " https://pypi.org/simple)\n"
                )
                assert err.endswith(line)  # after the traceback of --verbose
                assert "Traceback" in err if "--verbose" in command else err == line
                assert CANARY not in out + err


def test_bad_limits_are_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tiny: Project,
    fresh_cache: Path,
) -> None:
    server = Hostile({PAGE: page_json([])})
    try:
        monkeypatch.setenv("PIP_INDEX_URL", server.url)
        monkeypatch.setenv("VLLM_PATCHSET_INDEX_MIN_RATE", "fast")
        assert cli(capsys, tiny.root, "releases") == (
            2,
            "",
            "vllm-patchset: VLLM_PATCHSET_INDEX_MIN_RATE='fast': expected a positive number"
            " (e.g. 50000)\n",
        )
    finally:
        server.close()
