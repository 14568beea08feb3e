"""infra/installed.py as a unit: a RECORD's rows, names as PEP 503 compares them, the one
dist-info beside a package and its version, and the answer of another interpreter's probe."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from vllm_patchset.errors import BadInput
from vllm_patchset.infra.installed import (
    _answer,
    canonical_name,
    dist_info,
    installed_record,
    installed_version,
    parse_record,
    path_parts,
    probe,
)

RECORDS = [
    ("", {}),
    (
        "vllm/__init__.py,sha256=abc,12\nvllm-0.24.0.dist-info/RECORD,,\n",
        {"vllm/__init__.py": "sha256=abc", "vllm-0.24.0.dist-info/RECORD": ""},
    ),
    ('"vllm/a,b.py",sha256=x,1\r\n\n', {"vllm/a,b.py": "sha256=x"}),  # CSV quoting, blank rows
    ("a-row-with-no-hash-field\nvllm/x.py,sha256=y\n", {"vllm/x.py": "sha256=y"}),
]


@pytest.mark.parametrize(("text", "rows"), RECORDS)
def test_parse_record(text: str, rows: dict[str, str]) -> None:
    assert parse_record(text) == rows


@pytest.mark.parametrize(
    ("name", "canonical"),
    [("vllm", "vllm"), ("VLLM", "vllm"), ("Foo.Bar_baz", "foo-bar-baz"), ("a_-_b", "a-b")],
)
def test_canonical_name(name: str, canonical: str) -> None:
    assert canonical_name(name) == canonical


DIST_INFOS = [
    # (the folders beside the package, the one found or the refusal's words)
    (["vllm-0.24.0.dist-info"], "vllm-0.24.0.dist-info"),
    (["VLLM-0.24.0.dist-info", "torch-2.9.dist-info"], "VLLM-0.24.0.dist-info"),
    ([], "{root}: no vllm-*.dist-info beside the package"),
    (
        ["vllm-0.24.0.dist-info", "vllm-0.25.0.dist-info"],
        "{root}: 2 vllm-*.dist-info beside the package",
    ),
]


@pytest.mark.parametrize(("names", "expected"), DIST_INFOS)
def test_the_one_dist_info(tmp_path: Path, names: list[str], expected: str) -> None:
    for name in names:
        (tmp_path / name).mkdir()
    if expected.startswith("{root}"):
        with pytest.raises(BadInput) as error:
            dist_info(tmp_path, "vllm")
        assert str(error.value) == expected.format(root=tmp_path)
    else:
        assert dist_info(tmp_path, "vllm") == tmp_path / expected


METADATA = [
    # (METADATA, the version or the refusal's words)
    ("Metadata-Version: 2.1\nName: vllm\nVersion: 0.24.0\n\nbody", "0.24.0"),
    ("Name: vllm\n\nVersion: 9.9\n", "{info}/METADATA: no Version header"),
    ("Name: vllm\n", "{info}/METADATA: no Version header"),
]


@pytest.mark.parametrize(("text", "expected"), METADATA)
def test_installed_version(tmp_path: Path, text: str, expected: str) -> None:
    info = tmp_path / "vllm-0.24.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(text)
    if "{info}" in expected:
        with pytest.raises(BadInput) as error:
            installed_version(tmp_path, "vllm")
        assert str(error.value) == expected.format(info=info)
    else:
        assert installed_version(tmp_path, "vllm") == expected


def test_installed_record_and_its_refusals(tmp_path: Path) -> None:
    info = tmp_path / "vllm-0.24.0.dist-info"
    info.mkdir()
    with pytest.raises(BadInput) as error:
        installed_record(tmp_path, "vllm")
    assert str(error.value) == f"{info / 'RECORD'} is missing"
    (info / "RECORD").write_bytes(b"vllm/a.py,sha256=x,1\n")
    assert installed_record(tmp_path, "vllm") == {"vllm/a.py": "sha256=x"}
    (info / "RECORD").write_bytes(b"vllm/\xff.py,,\n")
    with pytest.raises(BadInput) as error:
        installed_record(tmp_path, "vllm")
    assert str(error.value).startswith(f"{info / 'RECORD'}: not UTF-8 (")


@pytest.mark.parametrize(
    ("rel", "parts"),
    [("vllm/a.py", ("vllm", "a.py")), ("vllm", None), ("torch/a.py", None), ("vllm/../a", None)],
)
def test_path_parts(rel: str, parts: tuple[str, ...] | None) -> None:
    assert path_parts("vllm", rel) == parts


ANSWER = {"origin": "/s/vllm/__init__.py", "version": "0.24.0", "record": "r", "dirs": ["/s"]}
ANSWERS = [
    # (what the probe printed, the answer read or None)
    (
        f"vllm-patchset-probe {json.dumps(ANSWER)}\n",
        ("/s/vllm/__init__.py", "0.24.0", "r", ("/s",)),
    ),
    (
        f"noise\nvllm-patchset-probe {json.dumps(ANSWER)}\nmore",
        ("/s/vllm/__init__.py", "0.24.0", "r", ("/s",)),
    ),
    (
        'vllm-patchset-probe {"origin": null, "version": null, "record": null, "dirs": []}',
        (None, None, None, ()),
    ),
    ("", None),
    ("vllm-patchset-probe not json", None),
    ("vllm-patchset-probe []", None),
    ('vllm-patchset-probe {"origin": 1, "version": null, "record": null, "dirs": []}', None),
    ('vllm-patchset-probe {"origin": null, "version": null, "record": null}', None),
]


@pytest.mark.parametrize(("printed", "expected"), ANSWERS)
def test_the_probe_answer(printed: str, expected: tuple[object, ...] | None) -> None:
    found = _answer(printed.encode())
    got = None if found is None else (found.origin, found.version, found.record, found.site_dirs)
    assert got == expected


def test_probe_of_this_interpreter_and_of_no_interpreter(tmp_path: Path) -> None:
    found = probe(sys.executable, "pytest")
    assert found.origin is not None and found.origin.endswith("__init__.py")
    with pytest.raises(BadInput) as error:
        probe(str(tmp_path / "python9"), "vllm")
    assert (
        str(error.value) == f"cannot run --python {tmp_path / 'python9'}: No such file or directory"
    )
