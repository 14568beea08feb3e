"""infra/transfer.py as a unit: the limits read from the environment, the redirects a
transfer follows or refuses, a failure in words (the transfers themselves, against real
servers: tests/infra/test_index.py and tests/test_hostile_index.py)."""

from __future__ import annotations

import http.client
import urllib.error

import pytest
from vllm_patchset.errors import BadInput
from vllm_patchset.infra import transfer


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VLLM_PATCHSET_INDEX_TIMEOUT", "0"),
        ("VLLM_PATCHSET_INDEX_TIMEOUT", "soon"),
        ("VLLM_PATCHSET_INDEX_MIN_RATE", "-5"),
        ("VLLM_PATCHSET_DOWNLOAD_LIMIT", "1.5"),
        ("VLLM_PATCHSET_DOWNLOAD_LIMIT", "inf"),
    ],
)
def test_a_bad_limit_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(BadInput) as info:
        transfer.Limits.from_env()
    assert str(info.value).startswith(f"{name}={value!r}: expected a positive number (e.g. ")


def test_limits_default_and_declared_size(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VLLM_PATCHSET_INDEX_TIMEOUT", "VLLM_PATCHSET_INDEX_MIN_RATE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("VLLM_PATCHSET_DOWNLOAD_LIMIT", raising=False)
    assert transfer.Limits.from_env() == transfer.Limits(60.0, 50_000.0, 2 << 30)
    assert transfer.Limits.from_env(declared=1234).size == 1234
    assert transfer.Limits.from_env(page=True).size == transfer.PAGE_LIMIT


# (the current URL, the Location header, the URL followed, or the refusal's words)
REDIRECTS = [
    ("https://pypi.test/simple/vllm/", "/files/v.tar.gz", "https://pypi.test/files/v.tar.gz"),
    ("https://pypi.test/simple/", " https://cdn.test/v.tar.gz ", "https://cdn.test/v.tar.gz"),
    ("https://pypi.test/a", "https://u:secret@cdn.test/v", "https://cdn.test/v"),
    ("http://pypi.test/a", "http://cdn.test/v", "http://cdn.test/v"),
    ("http://pypi.test/a", "https://cdn.test/v", "https://cdn.test/v"),
    ("https://pypi.test/a", "http://cdn.test/v", "a redirect from https to http: refused"),
    ("https://pypi.test/a", "ftp://cdn.test/v", "a redirect to a URL that is not http(s): refused"),
    (
        "https://pypi.test/a",
        "file:///etc/passwd",
        "a redirect to a URL that is not http(s): refused",
    ),
]


@pytest.mark.parametrize(("current", "location", "expected"), REDIRECTS)
def test_a_redirect_is_followed_or_refused(current: str, location: str, expected: str) -> None:
    try:
        got = transfer._redirect(current, location)
    except transfer.TransferFailed as exc:
        assert (exc.url, exc.why) == (current, expected)
    else:
        assert got == expected


SITES = [
    ("https://pypi.org/simple/", ("https", "pypi.org", None)),
    ("https://user:pw@PyPI.org:8443/simple/", ("https", "pypi.org", 8443)),
    ("file:///srv/index", ("file", "", None)),
    ("no scheme", ("", "", None)),
]


@pytest.mark.parametrize(("url", "site"), SITES)
def test_the_site_a_url_names(url: str, site: tuple[str, str, int | None]) -> None:
    assert transfer.site_of(url) == site


WORDS = [
    (TimeoutError(), "timed out"),
    (urllib.error.URLError(TimeoutError()), "timed out"),
    (
        urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")),
        "Connection refused",
    ),
    (urllib.error.URLError("no host given"), "URLError"),  # an OSError without strerror
    (ConnectionResetError(104, "Connection reset by peer"), "Connection reset by peer"),
    (
        http.client.IncompleteRead(b"ab"),
        "a broken HTTP answer (IncompleteRead: IncompleteRead(2 bytes read))",
    ),
    (
        http.client.BadStatusLine("\x1b[31mHTTP/9\nmore"),
        "a broken HTTP answer (BadStatusLine: ?[31mHTTP/9)",
    ),
    (ValueError("bad\x07 value"), "ValueError: bad? value"),
]


@pytest.mark.parametrize(("exc", "words"), WORDS)
def test_a_failure_in_words(exc: BaseException, words: str) -> None:
    assert transfer._words(exc) == words


def test_too_big_and_slow_name_their_bound() -> None:
    limits = transfer.Limits(timeout=2.0, rate=100.0, size=1000)
    assert transfer.too_big(limits) == (
        "more than 1000 bytes, the bound of a download (the index's declared size, else"
        " VLLM_PATCHSET_DOWNLOAD_LIMIT)"
    )
    assert transfer._slow(limits) == (
        "slower than 100 bytes/s for more than 2 s"
        " (VLLM_PATCHSET_INDEX_MIN_RATE, VLLM_PATCHSET_INDEX_TIMEOUT)"
    )
