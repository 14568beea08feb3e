"""infra/indexsettings.py as a unit: URLs split as pip splits them (the userinfo ends at the
LAST `@`), whatever the password holds; a URL that cannot be parsed refused in one line naming
its setting; the credentials' header for the index's own site only; pip's and uv's TLS
settings (CA bundle, client certificate, trusted-host) by their precedence; the keyring."""

from __future__ import annotations

import base64
import itertools
import os
import sys
import types
import urllib.parse
from pathlib import Path

import pytest
from vllm_patchset.errors import BadInput
from vllm_patchset.infra import indexsettings
from vllm_patchset.infra.indexsettings import Tls, resolve, split

# (URL, what is shown, user, password)
SPLITS = [
    ("https://pypi.org/simple", "https://pypi.org/simple", None, None),
    ("http://user:ab/SECRET@127.0.0.1:9/simple", "http://127.0.0.1:9/simple", "user", "ab/SECRET"),
    ("http://user:a#b@host/simple", "http://host/simple", "user", "a#b"),
    ("http://user:a?b@host/simple?x=1", "http://host/simple?x=1", "user", "a?b"),
    ("http://user:a@b@host:8080/s", "http://host:8080/s", "user", "a@b"),
    ("http://user:a:b@host/s", "http://host/s", "user", "a:b"),
    ("http://us%40er:p%2Fw@host/s", "http://host/s", "us@er", "p/w"),
    ("http://token@host/s", "http://host/s", "token", ""),
    ("http://[::1]:8080/simple", "http://[::1]:8080/simple", None, None),
    ("http://u:p@[fe80::1%25eth0]/s", "http://[fe80::1%25eth0]/s", "u", "p"),
    ("http://host/a@b/simple", "http://host/a@b/simple", None, None),  # an @ in the path
    ("HTTPS://Host.Example/simple/", "https://Host.Example/simple/", None, None),
    ("file:///srv/index", "file:///srv/index", None, None),
]


@pytest.mark.parametrize(("url", "shown", "user", "password"), SPLITS)
def test_urls_are_split_as_pip_splits_them(
    url: str, shown: str, user: str | None, password: str | None
) -> None:
    parts = split(url)
    assert parts is not None
    assert (parts.public, parts.user, parts.password) == (shown, user, password)
    assert "user=" not in repr(parts) and "password=" not in repr(parts)


UNPARSEABLE = [
    "http://user:S@[::1/simple",
    "http://[::1/simple",
    "http://host:99999/simple",
    "http://host:port/simple",
    "http:///simple",
    "http://user:pw@/simple",
    "http://ho st/simple",
    "pypi.org/simple",
    "http://host/sim\nple",
]


@pytest.mark.parametrize("url", UNPARSEABLE)
def test_a_url_that_cannot_be_parsed_is_none_and_never_shown(url: str) -> None:
    assert split(url) is None
    assert indexsettings.public(url) == indexsettings.UNPARSEABLE


RESERVED = "/#?@:[]!$&'()*+,;= "


def generated_passwords() -> list[str]:
    """Every pair of URL-reserved characters around and inside a word."""
    pairs = ["".join(p) for p in itertools.product(RESERVED.strip(), repeat=2)]
    return [f"{a[0]}x{a[1]}" for a in pairs] + [f"pw{a}" for a in pairs]


def test_generated_passwords_stay_in_the_userinfo() -> None:
    """However the password is spelt (unencoded), the host, port and path are the index's and
    the password is the one given; the shown URL and the repr never hold it."""
    for password in generated_passwords():
        url = f"https://ci-bot:{password}@index.example:8443/simple"
        parts = split(url)
        assert parts is not None, password
        assert (parts.host, parts.port, parts.rest) == ("index.example", 8443, "/simple")
        assert (parts.user, parts.password) == ("ci-bot", urllib.parse.unquote(password))
        assert password not in parts.public and password not in repr(parts)


def _env(tmp: Path, **values: str) -> dict[str, str]:
    return {"HOME": str(tmp), "PIP_CONFIG_FILE": os.devnull, **values}


@pytest.mark.parametrize("setting", ["PIP_INDEX_URL", "UV_INDEX_URL", "UV_DEFAULT_INDEX"])
@pytest.mark.parametrize("url", UNPARSEABLE[:6])
def test_an_unparseable_setting_is_one_line_naming_it(
    tmp_path: Path, setting: str, url: str
) -> None:
    with pytest.raises(BadInput) as info:
        resolve(environ=_env(tmp_path, **{setting: url}))
    assert str(info.value) == (
        f"{setting}: not an http, https or file URL (expected e.g. https://pypi.org/simple)"
    )


def test_an_unparseable_pip_conf_value_names_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = http://user:S@[::1/simple\n")
    with pytest.raises(BadInput) as info:
        resolve(environ=_env(tmp_path, PIP_CONFIG_FILE=str(conf)))
    assert str(info.value).startswith(f"{conf} [global] index-url: not an http, https or file URL")
    assert "S@" not in str(info.value)


def test_credentials_go_to_the_index_s_own_site_only(tmp_path: Path) -> None:
    setting = resolve(environ=_env(tmp_path, PIP_INDEX_URL="https://u:p/w#x@idx.example/simple"))
    assert setting.url == "https://idx.example/simple"
    assert setting.credentials_from == "the URL"
    basic = "Basic " + base64.b64encode(b"u:p/w#x").decode()
    assert setting.headers("https://idx.example/files/a.tar.gz") == {"Authorization": basic}
    for other in (
        "https://files.example/a.tar.gz",
        "http://idx.example/a.tar.gz",
        "https://idx.example:444/a.tar.gz",
    ):
        assert setting.headers(other) == {}
    assert "p/w" not in repr(setting) and "p/w" not in setting.describe()
    assert "p/w" not in str(setting.as_json())


# (environment, pip.conf [global] lines, expected (cafile, its origin, client cert, its origin,
# trusted-host origin)); `{ca}`, `{ca2}`, `{client}` are files, `{conf}` the pip.conf.
TLS = [
    ("nothing", {}, "", Tls()),
    ("PIP_CERT", {"PIP_CERT": "{ca}"}, "", Tls("{ca}", "PIP_CERT")),
    ("pip.conf cert", {}, "cert = {ca2}", Tls("{ca2}", "{conf} [global] cert")),
    ("PIP_CERT beats pip.conf", {"PIP_CERT": "{ca}"}, "cert = {ca2}", Tls("{ca}", "PIP_CERT")),
    (
        "pip.conf beats REQUESTS_CA_BUNDLE",
        {"REQUESTS_CA_BUNDLE": "{ca}"},
        "cert = {ca2}",
        Tls("{ca2}", "{conf} [global] cert"),
    ),
    ("REQUESTS_CA_BUNDLE", {"REQUESTS_CA_BUNDLE": "{ca}"}, "", Tls("{ca}", "REQUESTS_CA_BUNDLE")),
    ("CURL_CA_BUNDLE", {"CURL_CA_BUNDLE": "{ca}"}, "", Tls("{ca}", "CURL_CA_BUNDLE")),
    (
        "client cert",
        {"PIP_CLIENT_CERT": "{client}"},
        "",
        Tls(client_cert="{client}", client_cert_from="PIP_CLIENT_CERT"),
    ),
    (
        "pip.conf client-cert",
        {},
        "client-cert = {client}",
        Tls(client_cert="{client}", client_cert_from="{conf} [global] client-cert"),
    ),
    (
        "uv's SSL_CLIENT_CERT",
        {"SSL_CLIENT_CERT": "{client}"},
        "",
        Tls(client_cert="{client}", client_cert_from="SSL_CLIENT_CERT"),
    ),
    (
        "trusted host",
        {"PIP_TRUSTED_HOST": "other idx.example"},
        "",
        Tls(trusted_from="PIP_TRUSTED_HOST"),
    ),
    ("trusted host:port", {"PIP_TRUSTED_HOST": "idx.example:443"}, "", Tls()),
    (
        "uv insecure host",
        {"UV_INSECURE_HOST": "idx.example"},
        "",
        Tls(trusted_from="UV_INSECURE_HOST"),
    ),
    (
        "pip.conf trusted-host",
        {},
        "trusted-host =\n    a.example\n    idx.example",
        Tls(trusted_from="{conf} [global] trusted-host"),
    ),
]


@pytest.mark.parametrize(("env", "conf", "expected"), [c[1:] for c in TLS], ids=[c[0] for c in TLS])
def test_tls_settings_as_pip_and_uv_read_them(
    tmp_path: Path, env: dict[str, str], conf: str, expected: Tls
) -> None:
    names = {"ca": tmp_path / "ca.pem", "ca2": tmp_path / "ca2.pem", "client": tmp_path / "c.pem"}
    for path in names.values():
        path.write_text("")
    conf_path = tmp_path / "pip.conf"
    fill = {**{k: str(v) for k, v in names.items()}, "conf": str(conf_path)}
    conf_path.write_text("[global]\n" + conf.format(**fill) + "\n")
    environ = {k: v.format(**fill) for k, v in env.items()}
    environ = _env(tmp_path, PIP_INDEX_URL="https://idx.example/simple", **environ)
    if conf:  # pip also reads the machine's /etc/pip.conf then: only what this file sets counts
        environ["PIP_CONFIG_FILE"] = str(conf_path)
    got = resolve(environ=environ).tls
    want = Tls(
        expected.cafile.format(**fill) if expected.cafile else None,
        expected.cafile_from.format(**fill),
        expected.client_cert.format(**fill) if expected.client_cert else None,
        expected.client_cert_from.format(**fill),
        expected.trusted_from.format(**fill),
    )
    if conf and "cert =" not in conf.replace("client-cert =", ""):
        got, want = (
            Tls(None, "", t.client_cert, t.client_cert_from, t.trusted_from) for t in (got, want)
        )
    assert got == want


def test_tls_settings_are_not_used_for_an_http_index(tmp_path: Path) -> None:
    environ = _env(tmp_path, PIP_INDEX_URL="http://idx.example/simple", PIP_CERT="/nowhere.pem")
    assert resolve(environ=environ).tls == Tls()


def test_a_missing_ca_bundle_is_one_line_when_used(tmp_path: Path) -> None:
    """Only a transfer needs it: `status` reads no index."""
    environ = _env(tmp_path, PIP_INDEX_URL="https://idx.example/simple", PIP_CERT="/nowhere.pem")
    setting = resolve(environ=environ)
    with pytest.raises(BadInput) as info:
        setting.context(setting.url)
    assert str(info.value) == "PIP_CERT: the CA bundle /nowhere.pem does not exist"


def test_the_keyring_gives_credentials_where_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyring that knows the index (by its URL), as pip asks one when it is installed."""
    asked: list[tuple[str, str | None]] = []

    def get_credential(service: str, user: str | None) -> object | None:
        asked.append((service, user))
        if service == "https://idx.example/simple":
            return types.SimpleNamespace(username="kr-user", password="kr/pass")
        return None

    def get_password(service: str, user: str) -> str | None:
        asked.append((service, user))
        return "kr-only" if service == "idx.example" else None

    fake = types.ModuleType("keyring")
    fake.get_credential = get_credential  # type: ignore[attr-defined]
    fake.get_password = get_password  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "keyring", fake)
    setting = resolve(environ=_env(tmp_path, PIP_INDEX_URL="https://idx.example/simple"))
    basic = "Basic " + base64.b64encode(b"kr-user:kr/pass").decode()
    assert (setting.credentials_from, setting.headers(setting.url)) == (
        "the keyring",
        {"Authorization": basic},
    )
    token = resolve(environ=_env(tmp_path, PIP_INDEX_URL="https://tok@idx.example/simple"))
    basic = "Basic " + base64.b64encode(b"tok:kr-only").decode()
    assert token.headers(token.url) == {"Authorization": basic}
    assert asked == [
        ("https://idx.example/simple", None),
        ("https://idx.example/simple", "tok"),
        ("idx.example", "tok"),
    ]
