"""`deploy/operations.py` where the package is gone but an overlay's state is left (`pip
uninstall vllm` leaves `.vllm-patchset/`): status says so and how to remove it, revert removes
it. The commands on a real vLLM, killed at every write point, are test_deploy.py's."""

from __future__ import annotations

from pathlib import Path

from vllm_patchset.deploy.operations import orphaned
from vllm_patchset.deploy.report import Report


def test_status_of_an_orphaned_state(tmp_path: Path) -> None:
    (tmp_path / ".vllm-patchset").mkdir()
    left = f"no vllm in {tmp_path}, but {tmp_path / '.vllm-patchset'} is left from an overlay"
    note = (
        f"{left} (vllm uninstalled?): `vllm-patchset overlay revert --target {tmp_path}` removes it"
    )
    report = orphaned(tmp_path, "vllm", None, "status", f"no vllm in {tmp_path}")
    assert report == Report(
        "status", "orphaned state", False, str(tmp_path / "vllm"), None, "", (), (), (note,), ()
    )


def test_revert_of_an_orphaned_state_removes_it(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / ".vllm-patchset").mkdir(parents=True)
    report = orphaned(site, "vllm", None, "revert", f"no vllm in {site}")
    assert (report.outcome, report.ok) == ("orphaned state removed", True)
    assert list(site.iterdir()) == []
