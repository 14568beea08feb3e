"""`deploy/target.py`: a lock entry's path in the target, anything that could lead out of the
package refused in one line before it is used."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_patchset.deploy.target import Target
from vllm_patchset.infra.fsio import UnsafePath

REFUSED = ["../x.py", "other/x.py", "/etc/x", "vllm/../x.py", "vllm"]


def test_a_lock_path_inside_the_package(tmp_path: Path) -> None:
    target = Target(tmp_path, "vllm", "0.24.0")
    assert target.path("vllm/a/x.py") == tmp_path / "vllm" / "a" / "x.py"
    assert target.where == str(tmp_path / "vllm")
    assert target.state_path("applied.json") == tmp_path / ".vllm-patchset" / "applied.json"


@pytest.mark.parametrize("rel", REFUSED)
def test_a_lock_path_out_of_the_package_is_refused(tmp_path: Path, rel: str) -> None:
    message = (
        f"refusing lock path {rel!r}: only relative paths inside the vllm package are deployed"
    )
    with pytest.raises(UnsafePath) as refused:
        Target(tmp_path, "vllm", "0.24.0").path(rel)
    assert str(refused.value) == message


def test_a_linked_folder_on_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "a").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePath):
        Target(tmp_path, "vllm", "0.24.0").path("vllm/a/x.py")
