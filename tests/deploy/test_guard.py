"""The runtime guard (a vLLM general plugin) on a real vllm 0.24.0 install: overlay active,
missing, partial, for another version; VLLM_PATCHSET_STRICT=1; and that nothing else it meets
stops vLLM. Each case runs `register()` in a fresh interpreter, as vLLM would at start: the
logging set up the way vLLM's is (a handler on the "vllm" logger)."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from killable import KILL_ENV
from vllm_install import (
    CHANGED,
    EDITED,
    EDITED_MODULE,
    KILLED_MID_APPLY,
    OVERLAID,
    PATCHES,
    Overlay,
    Pristine,
    cli_command,
    replace_file,
    run_cli,
)
from vllm_patchset.deploy import guard

STARTUP = """\
import logging, sys
handler = logging.StreamHandler(sys.stdout)
handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
vllm_logger = logging.getLogger("vllm")
vllm_logger.addHandler(handler)
vllm_logger.setLevel(logging.INFO)
vllm_logger.propagate = False
{prelude}
from vllm_patchset.deploy.guard import register
register()
print("vLLM goes on")
"""


def start(
    target: Path | None, *, strict: bool = False, prelude: str = ""
) -> tuple[int, list[str], str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", guard.STRICT_ENV)}
    if target is not None:
        env["PYTHONPATH"] = str(target)
    if strict:
        env[guard.STRICT_ENV] = "1"
    done = subprocess.run(
        [sys.executable, "-c", STARTUP.format(prelude=prelude)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return done.returncode, done.stdout.splitlines(), done.stderr


def applied(overlay: Overlay, target: Path) -> Path:
    assert run_cli(overlay, "apply", "--target", str(target)).returncode == 0
    return target


def test_entry_point_is_declared_in_the_vllm_general_plugins_group() -> None:
    (point,) = importlib.metadata.entry_points(
        group="vllm.general_plugins", name="vllm_patchset_guard"
    )
    assert point.value == "vllm_patchset.deploy.guard:register"
    assert point.load() is guard.register


def test_active_overlay_logs_one_info_line(overlay: Overlay, target: Path) -> None:
    applied(overlay, target)
    message = (
        f"vllm-patchset: overlay active on vllm 0.24.0: {', '.join(PATCHES)}"
        f" ({len(OVERLAID)} files)"
    )
    for strict in (False, True):
        assert start(target, strict=strict) == (
            0,
            [f"INFO vllm.vllm_patchset: {message}", "vLLM goes on"],
            "",
        )


def missing(target: Path, overlay: Overlay | None = None) -> str:
    return (
        f"vllm-patchset: NO overlay applied to vllm 0.24.0 at {target / 'vllm'}: its fixes are NOT"
        " active (run `vllm-patchset overlay apply`)"
    )


def partial(target: Path, overlay: Overlay) -> str:
    applied(overlay, target)
    replace_file(target / EDITED, (target / ".vllm-patchset/originals" / EDITED).read_bytes())
    return (
        f"vllm-patchset: the overlay on vllm 0.24.0 at {target / 'vllm'} is PARTIAL: 1 of"
        f" {len(OVERLAID)} files are not patched ({EDITED_MODULE}.py): its fixes are NOT active (run"
        " `vllm-patchset overlay status`, then apply)"
    )


def reinstalled(target: Path, overlay: Overlay) -> str:
    applied(overlay, target)
    for rel in CHANGED:  # `pip install --force-reinstall vllm==0.24.0` (it leaves added files)
        replace_file(target / rel, (target / ".vllm-patchset/originals" / rel).read_bytes())
    return (
        f"vllm-patchset: the overlay applied to vllm 0.24.0 at {target / 'vllm'} is GONE (vllm"
        " reinstalled?): its fixes are NOT active (run `vllm-patchset overlay apply`)"
    )


def upgraded(target: Path, overlay: Overlay) -> str:
    applied(overlay, target)
    meta = target / "vllm-0.24.0.dist-info" / "METADATA"  # `pip install -U vllm`, in short
    replace_file(meta, meta.read_bytes().replace(b"\nVersion: 0.24.0\n", b"\nVersion: 0.25.0\n"))
    (target / "vllm-0.24.0.dist-info").rename(target / "vllm-0.25.0.dist-info")
    return (
        f"vllm-patchset: the overlay was applied to vllm 0.24.0, but vllm 0.25.0 is installed at"
        f" {target / 'vllm'} now (upgraded?): its fixes are NOT active (rebase the patch set onto"
        " 0.25.0 and apply it)"
    )


def unreadable_record(target: Path, overlay: Overlay) -> str:
    applied(overlay, target)
    replace_file(target / ".vllm-patchset/applied.json", b"{}")
    return (
        f"vllm-patchset: unreadable record {target / '.vllm-patchset/applied.json'} (KeyError):"
        " the overlay cannot be confirmed (run `vllm-patchset overlay status`)"
    )


def interrupted(target: Path, overlay: Overlay) -> str:
    killed = run_cli(
        overlay,
        "apply",
        "--target",
        str(target),
        env={KILL_ENV: str(KILLED_MID_APPLY)},
    )
    assert killed.returncode == -signal.SIGKILL
    return (
        f"vllm-patchset: an interrupted `overlay apply` left {target / 'vllm'} half-done: run"
        f" `vllm-patchset overlay status --target {target}`"
    )


NOT_ACTIVE = (missing, partial, reinstalled, upgraded, unreadable_record, interrupted)


@pytest.mark.parametrize("situation", NOT_ACTIVE)
def test_overlay_not_active_warns_loudly_or_stops_under_strict(
    overlay: Overlay, target: Path, situation: object
) -> None:
    assert callable(situation)
    message = situation(target, overlay)
    assert start(target) == (0, [f"WARNING vllm.vllm_patchset: {message}", "vLLM goes on"], "")
    code, out, err = start(target, strict=True)
    assert (code, out) == (1, [])
    assert err.splitlines()[-1] == (
        f"vllm_patchset.deploy.guard.OverlayNotActive: {message} [VLLM_PATCHSET_STRICT=1]"
    )


def test_the_guards_own_failures_never_stop_vllm(target: Path) -> None:
    # A `vllm` module whose location cannot even be read: the guard logs and lets vLLM go on;
    # under strict mode an overlay it cannot confirm, whatever the reason, stops the start.
    prelude = (
        "import types\n"
        "class Odd(types.ModuleType):\n"
        "    @property\n"
        "    def __file__(self): raise RuntimeError('no location')\n"
        "sys.modules['vllm'] = Odd('vllm')"
    )
    message = "vllm-patchset: could not check the overlay (RuntimeError: no location)"
    assert start(target, prelude=prelude) == (
        0,
        [f"WARNING vllm.vllm_patchset: {message}", "vLLM goes on"],
        "",
    )
    code, out, err = start(target, strict=True, prelude=prelude)
    assert (code, out) == (1, [])
    assert err.splitlines()[-1] == (
        f"vllm_patchset.deploy.guard.OverlayNotActive: {message} [{guard.STRICT_ENV}=1]"
    )


def test_pristine_vllm_found_through_sys_modules_like_inside_vllm(
    target: Path, pristine: Pristine
) -> None:
    # Inside vLLM, `vllm` is in sys.modules already: the guard checks that very package.
    init = str(target / "vllm" / "__init__.py")
    prelude = (
        f"import types\nm = types.ModuleType('vllm')\nm.__file__ = {init!r}\n"
        "sys.modules['vllm'] = m"
    )
    assert start(None, prelude=prelude) == (
        0,
        [f"WARNING vllm.vllm_patchset: {missing(target)}", "vLLM goes on"],
        "",
    )


SKIPPED = (
    "the start-up guard will not run here: VLLM_PLUGINS={value!r} is set and does not name"
    " vllm_patchset_guard (vLLM loads only the plugins it names), so no line says whether the"
    " overlay is active and VLLM_PATCHSET_STRICT=1 cannot stop vLLM: add vllm_patchset_guard"
    " to VLLM_PLUGINS (comma-separated, no spaces) or unset it"
)
# VLLM_PLUGINS as vLLM 0.24.0 reads it (envs.py: unset -> None, else split at commas, nothing
# stripped; vllm/plugins/__init__.py: a plugin loads when None or its name is in the list).
PLUGINS = [
    ({}, None),
    ({"VLLM_PLUGINS": "vllm_patchset_guard"}, None),
    ({"VLLM_PLUGINS": "lora_resolver,vllm_patchset_guard"}, None),
    ({"VLLM_PLUGINS": ""}, SKIPPED.format(value="")),
    ({"VLLM_PLUGINS": "lora_resolver"}, SKIPPED.format(value="lora_resolver")),
    (
        {"VLLM_PLUGINS": "lora_resolver, vllm_patchset_guard"},
        SKIPPED.format(value="lora_resolver, vllm_patchset_guard"),
    ),
]


@pytest.mark.parametrize(("environ", "note"), PLUGINS)
def test_vllm_plugins_that_skip_the_guard(environ: dict[str, str], note: str | None) -> None:
    assert guard.skipped_by(environ) == note


def test_overlay_status_warns_when_vllm_plugins_skips_the_guard(
    overlay: Overlay, target: Path
) -> None:
    applied(overlay, target)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    quiet = subprocess.run(
        cli_command(overlay, "status", "--target", str(target)),
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert (quiet.returncode, "VLLM_PLUGINS" in quiet.stdout) == (0, False)
    done = run_cli(overlay, "status", "--target", str(target), env={"VLLM_PLUGINS": "other"})
    assert done.returncode == 0
    assert done.stdout.splitlines()[-1] == f"  note: {SKIPPED.format(value='other')}"
