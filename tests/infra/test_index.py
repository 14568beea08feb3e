"""infra/index.py as a unit: the `file:` indexes pip reads (a folder per project with its
index.html, PEP 503 or PEP 691; a folder of the files; a flat folder), an https index behind a
private CA as pip's and uv's settings name it (PIP_CERT, pip.conf `cert`, REQUESTS_CA_BUNDLE,
SSL_CERT_FILE, a client certificate, trusted-host), and the limits' environment variables."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import shutil
import ssl
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_patchset.errors import DownloadFailed
from vllm_patchset.infra import index
from vllm_patchset.infra.indexsettings import resolve


def _sdist(version: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = f'__version__ = "{version}"\n'.encode()
        info = tarfile.TarInfo(f"vllm-{version}/vllm/__init__.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


SDISTS = {f"vllm-{v}.tar.gz": _sdist(v) for v in ("1.0", "1.1")}
SHAS = {name: hashlib.sha256(data).hexdigest() for name, data in SDISTS.items()}


def _html(links: dict[str, str]) -> str:
    anchors = "".join(f'<a href="{url}">{name}</a><br>' for name, url in links.items())
    return f"<!DOCTYPE html><html><body>{anchors}</body></html>"


def per_project_html(root: Path) -> None:
    """`pip download --index-url file:///root`'s layout: root/vllm/index.html (PEP 503)."""
    (root / "vllm").mkdir(parents=True)
    for name, data in SDISTS.items():
        (root / "vllm" / name).write_bytes(data)
    links = {name: f"{name}#sha256={SHAS[name]}" for name in SDISTS}
    (root / "vllm" / "index.html").write_text(_html(links))


def per_project_json(root: Path) -> None:
    (root / "files").mkdir(parents=True)
    (root / "vllm").mkdir()
    files = []
    for name, data in SDISTS.items():
        (root / "files" / name).write_bytes(data)
        files.append(
            {"filename": name, "url": f"../files/{name}", "hashes": {"sha256": SHAS[name]}}
        )
    doc = {"meta": {"api-version": "1.0"}, "name": "vllm", "files": files}
    (root / "vllm" / "index.html").write_text(json.dumps(doc))


def per_project_files(root: Path) -> None:
    (root / "vllm").mkdir(parents=True)
    for name, data in SDISTS.items():
        (root / "vllm" / name).write_bytes(data)


def flat(root: Path) -> None:
    """A flat folder (what `--find-links` reads), with another project's file beside."""
    root.mkdir(parents=True)
    for name, data in SDISTS.items():
        (root / name).write_bytes(data)
    (root / "vllm_flash-1.0.tar.gz").write_bytes(b"not ours")
    (root / "torch-2.0.tar.gz").write_bytes(b"not ours")


LAYOUTS = [per_project_html, per_project_json, per_project_files, flat]


@pytest.mark.parametrize("layout", LAYOUTS, ids=[f.__name__ for f in LAYOUTS])
def test_a_file_index_is_read_as_pip_reads_it(tmp_path: Path, layout: object) -> None:
    root = tmp_path / "index"
    layout(root)  # type: ignore[operator]
    found = index.files(root.as_uri(), "vllm")
    assert sorted(f.filename for f in found) == sorted(SDISTS)
    for entry in found:
        assert entry.local and entry.url.startswith("file:///")
        if layout in (per_project_html, per_project_json):
            assert entry.sha256 == SHAS[entry.filename]
        else:
            assert entry.sha256 is None  # the user's folder: hashed as it is copied
        got = index.fetch(entry, tmp_path / "sdists")
        assert got.read_bytes() == SDISTS[entry.filename]
    assert sorted(p.name for p in (tmp_path / "sdists").iterdir()) == sorted(SDISTS)


def test_a_killed_run_s_part_is_swept_a_running_one_s_kept(tmp_path: Path) -> None:
    """`.part`s are one a run (`<file>.<pid>.part`): a fetch removes those of runs that are
    gone (killed: nothing of theirs removed them), never a running one's, nor anything else."""
    root = tmp_path / "index"
    per_project_html(root)
    sdists = tmp_path / "sdists"
    sdists.mkdir()
    dead = sdists / "vllm-1.0.tar.gz.999999999.part"  # over any pid_max
    alive = sdists / f"vllm-1.0.tar.gz.{os.getppid()}.part"
    other = sdists / "vllm-1.0.tar.gz.notes.part"
    for path in (dead, alive, other):
        path.write_bytes(b"partial")
    (sdists / "vllm-1.1.tar.gz.999999999.part").symlink_to(alive)
    entry = next(f for f in index.files(root.as_uri(), "vllm") if f.filename == "vllm-1.0.tar.gz")
    index.fetch(entry, sdists)
    assert sorted(p.name for p in sdists.iterdir()) == sorted(
        ["vllm-1.0.tar.gz", alive.name, other.name, "vllm-1.1.tar.gz.999999999.part"]
    )


def test_a_file_index_with_a_wrong_sha256_keeps_nothing(tmp_path: Path) -> None:
    root = tmp_path / "index"
    per_project_html(root)
    (root / "vllm" / "vllm-1.0.tar.gz").write_bytes(b"altered")
    entry = next(f for f in index.files(root.as_uri(), "vllm") if f.filename == "vllm-1.0.tar.gz")
    with pytest.raises(DownloadFailed) as info:
        index.fetch(entry, tmp_path / "sdists")
    assert "does not match the index's" in str(info.value)
    assert list((tmp_path / "sdists").iterdir()) == []


def test_a_missing_file_index_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(DownloadFailed) as info:
        index.files(
            (tmp_path / "none").as_uri(), "vllm", unreachable=" and the release is not cached"
        )
    assert str(info.value) == (
        f"cannot read the package index {(tmp_path / 'none').as_uri()}: no folder"
        f" {tmp_path / 'none'} and the release is not cached"
    )


# -- TLS ------------------------------------------------------------------------------------------
def _openssl(folder: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private CA, a server certificate for 127.0.0.1 and a client certificate it signed."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make certificates")
    folder = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(folder, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=vllm-patchset test CA")  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for who in ("server", "client"):
        _openssl(folder, "req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr",
                 "-subj", f"/CN={who}")  # fmt: skip
        _openssl(folder, "x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey",
                 "ca.key", "-CAcreateserial", "-out", f"{who}.pem", "-days", "2",
                 "-extfile", "san.ext")  # fmt: skip
    client = (folder / "client.pem").read_text() + (folder / "client.key").read_text()
    (folder / "client-bundle.pem").write_text(client)
    return folder


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"meta": {"api-version": "1.0"}, "name": "vllm", "files": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(pki: Path, *, client_cert: bool) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    if client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(pki / "ca.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01})
    thread.daemon = True
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def https_index(pki: Path) -> Iterator[str]:
    yield from _serve(pki, client_cert=False)


@pytest.fixture
def mtls_index(pki: Path) -> Iterator[str]:
    yield from _serve(pki, client_cert=True)


def _env(tmp: Path, url: str, **values: str) -> dict[str, str]:
    return {"HOME": str(tmp), "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": url, **values}


@pytest.mark.parametrize(
    "setting", ["PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "pip.conf"]
)
def test_a_private_ca_the_pip_way(
    tmp_path: Path, pki: Path, https_index: str, setting: str
) -> None:
    values = {setting: str(pki / "ca.pem")}
    if setting == "pip.conf":
        conf = tmp_path / "pip.conf"
        conf.write_text(f"[global]\ncert = {pki / 'ca.pem'}\n")
        values = {"PIP_CONFIG_FILE": str(conf)}
    access = resolve(environ={**_env(tmp_path, https_index), **values})
    assert index.files(https_index, "vllm", auth=access) == []


def test_a_private_ca_through_ssl_cert_file(
    tmp_path: Path, pki: Path, https_index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uv's and Python's SSL_CERT_FILE: Python's defaults read it."""
    monkeypatch.setenv("SSL_CERT_FILE", str(pki / "ca.pem"))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    access = resolve(environ=_env(tmp_path, https_index))
    assert index.files(https_index, "vllm", auth=access) == []


def test_an_unknown_ca_is_one_line(
    tmp_path: Path, https_index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    access = resolve(environ=_env(tmp_path, https_index))
    with pytest.raises(DownloadFailed) as info:
        index.files(https_index, "vllm", auth=access)
    assert str(info.value) == (
        f"cannot read the package index {https_index}/vllm/ (TLS: CERTIFICATE_VERIFY_FAILED)"
    )


def test_a_trusted_host_is_read_unchecked_with_a_warning(
    tmp_path: Path, https_index: str, capsys: pytest.CaptureFixture[str]
) -> None:
    host = https_index.split("/")[2]
    access = resolve(environ=_env(tmp_path, https_index, PIP_TRUSTED_HOST=host))
    assert index.files(https_index, "vllm", auth=access) == []
    assert index.files(https_index, "vllm", auth=access) == []
    assert capsys.readouterr().err == (
        "vllm-patchset: warning: 127.0.0.1 is a trusted-host (PIP_TRUSTED_HOST): its TLS"
        " certificate is not checked\n"
    )


@pytest.mark.parametrize("setting", ["PIP_CLIENT_CERT", "SSL_CLIENT_CERT", "none"])
def test_a_client_certificate(tmp_path: Path, pki: Path, mtls_index: str, setting: str) -> None:
    values = {"PIP_CERT": str(pki / "ca.pem")}
    if setting != "none":
        values[setting] = str(pki / "client-bundle.pem")
    access = resolve(environ=_env(tmp_path, mtls_index, **values))
    if setting != "none":
        assert index.files(mtls_index, "vllm", auth=access) == []
        return
    with pytest.raises(DownloadFailed) as info:
        index.files(mtls_index, "vllm", auth=access)
    assert str(info.value).startswith(f"cannot read the package index {mtls_index}/vllm/ (")
