"""The README's two lines are CI's run: `.ci/run` installs with line 1 and tests with line 2,
as written; the README stays a newcomer's read (under 250 lines) and names the extras that
pyproject.toml declares."""

from __future__ import annotations

import tomllib

from support import REPO

README = (REPO / "README.md").read_text()


def the_two_lines() -> list[str]:
    block = README.split("```sh\n", 1)[1].split("```", 1)[0]
    return block.splitlines()


def test_the_two_lines_are_ci_s_install_and_test_run() -> None:
    install, tests = the_two_lines()
    assert install == (
        "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/vllm-patchset overlay build"
    )
    assert tests == ".venv/bin/python -m pytest -q"
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert install in ci
    assert ci[-1] == tests
    # Nothing else installs: pip appears in line 1 only.
    assert [line for line in ci if "pip install" in line and not line.startswith("#")] == [install]


def test_the_readme_is_short_and_names_the_extras() -> None:
    assert len(README.splitlines()) < 250
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert sorted(extras) == ["dev", "gpu", "maintain"]
    for extra in extras:
        assert f"'.[{extra}]'" in README
    assert extras["dev"][0] == "vllm-patchset[maintain]"
    assert {"torch==2.13.0", "triton==3.9.0", "safetensors", "numpy"} <= set(extras["dev"])
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"] == [
        "packaging>=23"
    ]
