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

Every transfer is bounded in time, size and redirects (`transfer.py`). Every HTTP, TLS or
socket failure is one line (DownloadFailed, exit 2); a failed or interrupted download leaves no
`.part`.
"""

from __future__ import annotations

import os
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from vllm_patchset.errors import BadInput, DownloadFailed
from vllm_patchset.infra import fsio, jsonfile, transfer
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
_SHA256_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str  # absolute, without userinfo
    sha256: str | None  # lower-case hex, None when the index gives none
    yanked: bool
    size: int | None = None  # PEP 700's size, when the index gives one
    local: bool = False  # from a `file:` index (the user's own folder)


# -- pages ----------------------------------------------------------------------------------------
def files(
    index_url: str,
    package: str,
    *,
    unreachable: str = "",
    auth: transfer.Access | transfer.Auth | None = None,
) -> list[IndexFile]:
    """The files the index lists for `package`; DownloadFailed (ending with `unreachable`)
    when it cannot be read, or answers something that is not a PEP 691 or 503 page."""
    access = transfer.access_for(index_url, auth)
    url = f"{index_url}/{package}/"
    if transfer.site_of(index_url)[0] == "file":
        return _local_files(index_url, package, unreachable)
    limits = transfer.Limits.from_env(page=True)
    chunks: list[bytes] = []
    try:
        with transfer.get(url, access, limits, ACCEPT) as (page, response, watch):
            kind = (response.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            transfer.read_body(response, chunks.append, page, watch)
    except transfer.TransferFailed as exc:
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
    local = transfer.site_of(page)[0] == "file"
    try:
        if json_page:
            doc = jsonfile.parse(data, limit=transfer.PAGE_LIMIT)
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
        data = fsio.read_regular(page, limit=transfer.PAGE_LIMIT + 1, follow=True)
    except BadInput as exc:
        raise DownloadFailed(f"cannot read the package index: {exc}{unreachable}") from None
    if data is not None:
        if len(data) > transfer.PAGE_LIMIT:
            raise DownloadFailed(f"{page}: larger than {transfer.PAGE_LIMIT} bytes{unreachable}")
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
def fetch(
    entry: IndexFile, folder: Path, auth: transfer.Access | transfer.Auth | None = None
) -> Path:
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
        if pid is not None and fsio.is_regular(path) and not fsio.process_alive(pid):
            fsio.remove_file(path)


def download(
    url: str,
    dest: Path,
    name: str,
    auth: transfer.Access | transfer.Auth | None = None,
    *,
    size: int | None = None,
) -> None:
    """Download `url` to `dest` (made here, never through a link), bounded (`transfer.Limits`), with
    its bytes and speed on stderr on a terminal. A `file:` URL is copied."""
    from vllm_patchset.console import progress

    limits = transfer.Limits.from_env(declared=size)
    access = transfer.access_for(url, auth)
    with fsio.writing(dest, exclusive=True) as out:
        if transfer.site_of(url)[0] == "file":
            _copy_local(url, out, limits)
            return
        try:
            with transfer.get(url, access, limits) as (final, response, watch):
                declared = response.headers.get("Content-Length")
                total = int(declared) if declared and declared.strip().isdigit() else None
                with progress(f"downloading {name}", total, unit="bytes") as step:

                    def sink(chunk: bytes) -> None:
                        out.write(chunk)
                        step.advance(len(chunk))

                    transfer.read_body(response, sink, final, watch)
        except transfer.TransferFailed as exc:
            raise DownloadFailed(f"download of {exc.url} failed: {exc.why}") from None


def _copy_local(url: str, out: BinaryIO, limits: transfer.Limits) -> None:
    path = _local_path(url)
    got = 0
    try:
        for chunk in fsio.read_chunks(path, follow=True):
            got += len(chunk)
            if got > limits.size:
                raise transfer.TransferFailed(url, transfer.too_big(limits))
            out.write(chunk)
    except (FileNotFoundError, NotADirectoryError):
        raise DownloadFailed(f"{path}: no such file in the local index") from None
