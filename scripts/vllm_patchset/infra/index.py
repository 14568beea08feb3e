"""The one package-index client, shared by the upstream mirror (sdists) and the kit (the pin's
wheel): the JSON simple API of PEP 691 (as pypi.org/simple answers), checked before use, and
downloads verified against the sha256 the index gives.

Every answer is checked: a JSON object (`jsonfile`) whose `files` is a list of objects, each
with a plain file name and a URL; a relative URL (PEP 691 allows them) is resolved against the
page's own URL, and only http, https and file URLs are followed. A file without a sha256 in
`hashes` is listed, but never downloaded: nothing unverified is used.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from vllm_patchset.errors import DownloadFailed
from vllm_patchset.infra import fsio, jsonfile
from vllm_patchset.infra.hashes import sha256_file

ACCEPT = "application/vnd.pypi.simple.v1+json"
SCHEMES = ("https", "http", "file")
PAGE_LIMIT = 64 << 20  # pypi.org's page of vllm is a few MB
_SHA256_HEX = frozenset("0123456789abcdef")
# The headers a URL is fetched with (the index's credentials, for its own host only:
# `indexsettings.IndexSetting.headers`); never sent on a redirect.
Auth = Callable[[str], Mapping[str, str]]


def _request(
    url: str, auth: Auth | None, headers: Mapping[str, str] | None = None
) -> urllib.request.Request:
    request = urllib.request.Request(url, headers=dict(headers or {}))
    for name, value in (auth(url) if auth else {}).items():
        request.add_unredirected_header(name, value)
    return request


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str  # absolute
    sha256: str | None  # lower-case hex, None when the index gives none
    yanked: bool


def _words(exc: BaseException) -> str:
    """An error of urllib or the OS, in words (not `<urlopen error …>`)."""
    reason = getattr(exc, "reason", None)
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(reason, OSError):
        return reason.strerror or str(reason)
    if reason is not None:
        return str(reason)
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def files(
    index_url: str, package: str, *, unreachable: str = "", auth: Auth | None = None
) -> list[IndexFile]:
    """The files the index lists for `package`; DownloadFailed (ending with `unreachable`)
    when it cannot be read, or answers something that is not a PEP 691 page."""
    url = f"{index_url}/{package}/"
    request = _request(url, auth, {"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            page = response.geturl()
            data = response.read(PAGE_LIMIT + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DownloadFailed(
            f"cannot read the package index {url} ({_words(exc)}){unreachable}"
        ) from None
    try:
        doc = jsonfile.parse(data, limit=PAGE_LIMIT)
        entries = jsonfile.field(doc, "files", list)
        return [_entry(page, entry) for entry in entries]
    except ValueError as exc:
        raise DownloadFailed(
            f"the package index {url} answered no PEP 691 page ({exc}){unreachable}"
        ) from None


def _entry(page: str, entry: object) -> IndexFile:
    if not isinstance(entry, dict):
        raise jsonfile.BadJson("a file entry is not a JSON object")
    name = jsonfile.field(entry, "filename", str)
    if fsio.plain_parts(name) is None or "/" in name:
        raise jsonfile.BadJson(f"file name {name!r} is not a plain file name")
    url = urllib.parse.urljoin(page, jsonfile.field(entry, "url", str))
    if urllib.parse.urlsplit(url).scheme not in SCHEMES:
        raise jsonfile.BadJson(f"the URL of {name} is not http, https or file")
    hashes = entry.get("hashes", {})
    sha = hashes.get("sha256") if isinstance(hashes, dict) else None
    if not (isinstance(sha, str) and len(sha) == 64 and set(sha.lower()) <= _SHA256_HEX):
        sha = None
    return IndexFile(name, url, sha.lower() if sha else None, bool(entry.get("yanked")))


def fetch(entry: IndexFile, folder: Path, auth: Auth | None = None) -> Path:
    """`entry`'s file in `folder`, downloaded once: a cached copy is used when its sha256 is the
    index's; a download only when its sha256 is (else nothing is kept)."""
    if entry.sha256 is None:
        raise DownloadFailed(
            f"the package index gives no sha256 for {entry.filename}: it cannot be verified,"
            " nothing was downloaded"
        )
    target = folder / entry.filename
    if fsio.is_regular(target) and sha256_file(target) == entry.sha256:
        return target
    fsio.make_dirs(folder)
    partial = target.with_name(target.name + ".part")
    try:
        download(entry.url, partial, entry.filename, auth)
        got = sha256_file(partial)
        if got != entry.sha256:
            raise DownloadFailed(
                f"{entry.filename}: sha256 {got} does not match the index's {entry.sha256}"
                " (truncated or altered download; nothing was imported)"
            )
        fsio.move(partial, target)
        print(f"downloaded {entry.filename}, sha256 verified", file=sys.stderr)
    finally:
        fsio.remove_file(partial)
    return target


def download(url: str, dest: Path, name: str, auth: Auth | None = None) -> None:
    """Download `url` to `dest`, with its bytes and speed on stderr on a terminal."""
    from vllm_patchset.console import progress

    try:
        request = _request(url, auth)
        with urllib.request.urlopen(request, timeout=120) as response, fsio.writing(dest) as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with progress(f"downloading {name}", total, unit="bytes") as step:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    step.advance(len(chunk))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DownloadFailed(f"download of {url} failed: {_words(exc)}") from None
