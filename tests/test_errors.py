"""`errors.py`: git's one meaningful line of its output, and a stdlib-only module's error
(kitparts' `KitError`, which carries its exit code) raised as the project's own."""

from __future__ import annotations

import pytest
from vllm_patchset.errors import (
    BadInput,
    Finding,
    PatchsetError,
    as_project_errors,
    meaningful_line,
)
from vllm_patchset.gpu.kitparts import KitError, KitUsage

MEANINGFUL = [
    ("fatal: repository 'x' does not exist\nand the repository exists.", "fatal: repository 'x' does not exist"),
    ("error: one\nerror: two\nhint: three", "error: two"),
    ("warning: a\n\n  last words  \n", "last words"),
    ("", "no output"),
]  # fmt: skip


@pytest.mark.parametrize(("detail", "line"), MEANINGFUL)
def test_meaningful_line(detail: str, line: str) -> None:
    assert meaningful_line(detail) == line


AS_OURS = [(KitError("part 01 is missing"), Finding, 1), (KitUsage("no kit.json"), BadInput, 2)]


@pytest.mark.parametrize(("raised", "ours", "code"), AS_OURS)
def test_a_kit_error_is_raised_as_the_project_s(
    raised: KitError, ours: type[PatchsetError], code: int
) -> None:
    with pytest.raises(PatchsetError) as caught, as_project_errors(KitError):
        raise raised
    assert (type(caught.value), str(caught.value), caught.value.exit_code) == (
        ours,
        str(raised),
        code,
    )
    assert caught.value.__suppress_context__


def test_other_errors_pass_through() -> None:
    with pytest.raises(ValueError, match=r"^not a kit's$"), as_project_errors(KitError):
        raise ValueError("not a kit's")
