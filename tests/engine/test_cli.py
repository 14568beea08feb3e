"""The engine check's command line on the CPU: setup with a kit, the overlay on its site, the
order of `all`, `rounds` and `numerics`, and what a command refuses."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_check import cli, host
from engine_results import run_result, speed_result


def test_report_without_results_writes_nothing(tmp_path: Path) -> None:
    """`report` on a work folder with no run results (a mistyped --work): one line, and no
    report written over the one at --out."""
    out = tmp_path / "out" / "report"
    out.parent.mkdir()
    out.with_suffix(".md").write_text("kept\n")
    (tmp_path / "work" / "results").mkdir(parents=True)
    (tmp_path / "work" / "results" / "deploy-apply.json").write_text("{}")
    for work in (tmp_path / "work", tmp_path / "missing"):
        with pytest.raises(SystemExit, match=r"^no run results in .*: nothing to report$"):
            cli.main(["report", "--work", str(work), "--out", str(out)])
    assert sorted(p.name for p in out.parent.iterdir()) == ["report.md"]
    assert out.with_suffix(".md").read_text() == "kept\n"


@pytest.mark.parametrize(
    ("gpu", "name", "title"),
    [
        ("NVIDIA H200", "engine_e2e_h200", "NVIDIA H200"),
        ("NVIDIA H100 80GB HBM3", "engine_e2e_h100_80gb_hbm3", "NVIDIA H100 80GB HBM3"),
        ("AMD Instinct MI300X", "engine_e2e_instinct_mi300x", "AMD Instinct MI300X"),
        (None, "engine_e2e_gpu", "GPU"),  # results of runs from before they recorded it
    ],
)
def test_report_named_for_the_gpu_the_runs_ran_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: str | None, name: str, title: str
) -> None:
    """`report` without --out or --title names the report for the GPU the runs recorded (a
    run on an H100 wrote engine_e2e_h200, over the H200's report): each rank's, here two
    runs, one of two ranks."""
    monkeypatch.setattr(cli, "RESULTS", tmp_path / "reports")
    results = tmp_path / "work" / "results"
    results.mkdir(parents=True)
    ran_on = {"gpu": gpu} if gpu else {}
    runs = {
        "pristine-emulation-L2": run_result("pristine-emulation-L2", **ran_on),
        "overlay-ep2-L2": {"ranks": [run_result("r0", **ran_on), run_result("r1", **ran_on)]},
    }
    for run, result in runs.items():
        (results / f"{run}.json").write_text(json.dumps(result))
    assert cli.main(["report", "--work", str(tmp_path / "work")]) == 0
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == [
        f"{name}.json",
        f"{name}.md",
    ]
    first = (tmp_path / "reports" / f"{name}.md").read_text().splitlines()[0]
    assert first == f"# {cli.DEFAULT_TITLE}, {title}"


def test_report_of_runs_on_several_gpus_needs_a_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs recorded on two GPUs: no default name fits both; one line, nothing written, unless
    the report is named (then written where named)."""
    monkeypatch.setattr(cli, "RESULTS", tmp_path / "reports")
    results = tmp_path / "work" / "results"
    results.mkdir(parents=True)
    for run, gpu in (("a", "NVIDIA H200"), ("b", "NVIDIA H100 80GB HBM3")):
        (results / f"{run}.json").write_text(json.dumps(run_result(run, gpu=gpu)))
    work = str(tmp_path / "work")
    expected = (
        r"^runs of several GPUs in the results \(NVIDIA H100 80GB HBM3, NVIDIA H200\):"
        r" name the report \(--out and --title\)$"
    )
    for named in ([], ["--out", str(tmp_path / "mine")], ["--title", "T"]):
        with pytest.raises(SystemExit, match=expected):
            cli.main(["report", "--work", work, *named])
    assert not (tmp_path / "reports").exists() and not list(tmp_path.glob("mine*"))
    assert (
        cli.main(["report", "--work", work, "--out", str(tmp_path / "mine"), "--title", "T"]) == 0
    )
    assert sorted(p.name for p in tmp_path.glob("mine*")) == ["mine.json", "mine.md"]


def test_report_without_matplotlib_writes_json_and_markdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`report` of rounds (a figure to draw) on a host without matplotlib, such as this
    project's CPU set-up: the JSON and Markdown written, the PNG left out with one line, exit
    0 (a traceback after writing them, before)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    results = tmp_path / "work" / "results"
    results.mkdir(parents=True)
    for run, value in (("overlay-emulation-L48-r1", 303.0), ("pristine-marlin-L48-r1", 233.0)):
        (results / f"{run}.json").write_text(
            json.dumps(speed_result(run, {"1": value}, {"1": 1.0}))
        )
    out = tmp_path / "report"
    assert cli.main(["report", "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.glob("report*")) == ["report.json", "report.md"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"no matplotlib here: {out}.png not written (run report where it is)"
    assert "| 48 | 1 | 303 / 233 (1.30x) |" in out.with_suffix(".md").read_text()


# -- setup and the overlay on a kit's site (the README's engine check, on a host with torch only)
def test_setup_with_a_kit_and_the_packed_wheel_then_overlay_apply(
    overlay: Any,
    pristine: Any,
    cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`setup --kit KIT --project WHEEL`, then `overlay apply`: the site's vllm-patchset (the
    packed wheel) deploys the overlay it carries, not the checkout's (which a GPU host without
    network has not built: here a checkout with no overlay at all), with only the kit's wheels
    beside it (the tool's dependencies among them)."""
    import hashlib

    from test_pack import dependency_wheels
    from vllm_install import OVERLAID
    from vllm_patchset.cli import main
    from vllm_patchset.gpu.kitbuild import write_kit

    dist = tmp_path / "dist"
    assert (
        main(["--project", str(overlay.project.root), "overlay", "pack", "--out", str(dist)]) == 0
    )
    wheel = next(dist.glob("*.whl"))
    kit = tmp_path / "kit"
    digest = hashlib.sha256(pristine.wheel.read_bytes()).hexdigest()
    write_kit(pristine.wheel, digest, "0.24.0", kit, wheels=dependency_wheels(cache_dir), level=0)
    work = tmp_path / "work"
    capsys.readouterr()

    assert cli.main(["setup", "--work", str(work), "--kit", str(kit), "--project", str(wheel)]) == 0
    site = work / "native" / "site"
    assert capsys.readouterr().out == f"vLLM with its compiled ops and vllm-patchset in {site}\n"
    assert host.host_of(work).packed()
    monkeypatch.setattr(host, "REPO", tmp_path / "unbuilt-checkout")  # no overlay built there

    assert cli.main(["overlay", "apply", "--work", str(work)]) == 0
    for rel in OVERLAID:
        assert (site / rel).read_bytes() == overlay.patched(rel)
    report = json.loads((work / "results" / "deploy-apply.json").read_text())
    assert (report["outcome"], report["target"]) == ("applied", str(site / "vllm"))
    assert host.host_of(work).state() == "overlay"
    assert cli.main(["overlay", "revert", "--work", str(work)]) == 0
    assert host.host_of(work).state() == "pristine"


def test_all_stops_after_a_failed_apply(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`all`: no overlay phase runs once `overlay apply` failed (they would measure the
    pristine install under the overlay's name); the revert still runs, no report is written."""
    calls: list[object] = []

    def called(value: object, code: int = 0) -> int:
        calls.append(value)
        return code

    monkeypatch.setattr(cli, "cmd_checkpoints", lambda args: 0)
    monkeypatch.setattr(host.Host, "state", lambda self: "pristine")
    monkeypatch.setattr(cli, "run_phases", lambda host, names, gpus: called(tuple(names)))
    monkeypatch.setattr(
        cli, "cmd_overlay", lambda args: called(args.action, int(args.action == "apply"))
    )
    monkeypatch.setattr(cli, "cmd_report", lambda args: called("report"))
    with pytest.raises(SystemExit, match=r"^overlay apply failed \(above\): no overlay runs$"):
        cli.main(["all", "--work", str(tmp_path), "--gpus", "1"])
    assert calls == [("emulation", "baselines"), "apply", "revert"]


def test_rounds_interleave_the_overlay_and_marlin(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`rounds`: apply, the overlay's run, revert, Marlin's run, round after round, each run
    named for its round; a failed apply stops before its run."""
    calls: list[object] = []
    applies: list[int] = []

    def overlay(args: Any) -> int:
        calls.append(args.action)
        if args.action == "apply":
            applies.append(1)
            return int(len(applies) == 3)  # the third apply fails
        return 0

    def engine(host: Any, run: Any, state: str, gpus: list[int]) -> dict[str, Any]:
        calls.append(f"{state}-{run.name}")
        return run_result(f"{state}-{run.name}")

    monkeypatch.setattr(host.Host, "state", lambda self: "pristine")
    monkeypatch.setattr(cli, "cmd_overlay", overlay)
    monkeypatch.setattr(cli, "run_engine", engine)
    for bad in (["--rounds", "0"], ["--first", "-1"], ["--rounds", "two"]):
        with pytest.raises(SystemExit) as exit_info:  # argparse: one line on stderr, exit 2
            cli.main(["rounds", "--work", str(tmp_path), *bad])
        assert exit_info.value.code == 2
    with pytest.raises(SystemExit, match=r"^no checkpoint .*/models/nvfp4-L12: run `checkpoints"):
        cli.main(["rounds", "--work", str(tmp_path)])
    assert calls == []
    (tmp_path / "models" / "nvfp4-L12").mkdir(parents=True)
    (tmp_path / "models" / "nvfp4-L48").mkdir()
    assert cli.main(["rounds", "--work", str(tmp_path), "--rounds", "2"]) == 0
    assert calls == [
        "apply",
        "overlay-emulation-L12-r1",
        "revert",
        "pristine-marlin-L12-r1",
        "apply",
        "overlay-emulation-L12-r2",
        "revert",
        "pristine-marlin-L12-r2",
    ]
    calls.clear()
    with pytest.raises(SystemExit, match=r"^overlay apply failed \(above\): no more rounds$"):
        cli.main(["rounds", "--work", str(tmp_path), "--rounds", "1"])
    assert calls == ["apply"]
    calls.clear()  # a later call adds round 3 on the 48-layer model
    args = ["rounds", "--work", str(tmp_path), "--model", "nvfp4-L48", "--rounds", "1"]
    assert cli.main([*args, "--first", "3"]) == 0
    assert calls == ["apply", "overlay-emulation-L48-r3", "revert", "pristine-marlin-L48-r3"]


def test_reference_needs_the_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"^no checkpoint .*/models/nvfp4-L2: run `checkpoints"):
        cli.main(["reference", "--work", str(tmp_path)])


def test_numerics_repeats_the_three_engines(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`numerics`: per run the overlay's engine (applied, then reverted), the pristine
    emulation's and Marlin's, teacher-forced logprobs only, each named for its run."""
    calls: list[object] = []

    def overlay(args: Any) -> int:
        calls.append(args.action)
        return 0

    def engine(host: Any, run: Any, state: str, gpus: list[int]) -> dict[str, Any]:
        calls.append((f"{state}-{run.name}", run.backend, run.logprobs, run.batches))
        return run_result(f"{state}-{run.name}")

    monkeypatch.setattr(host.Host, "state", lambda self: "pristine")
    monkeypatch.setattr(cli, "cmd_overlay", overlay)
    monkeypatch.setattr(cli, "run_engine", engine)
    (tmp_path / "models" / "nvfp4-L2").mkdir(parents=True)
    assert cli.main(["numerics", "--work", str(tmp_path), "--runs", "2", "--first", "2"]) == 0
    assert calls == [
        "apply",
        ("overlay-emulation-L2-n2", "emulation", True, ()),
        "revert",
        ("pristine-emulation-L2-n2", "emulation", True, ()),
        ("pristine-marlin-L2-n2", "marlin", True, ()),
        "apply",
        ("overlay-emulation-L2-n3", "emulation", True, ()),
        "revert",
        ("pristine-emulation-L2-n3", "emulation", True, ()),
        ("pristine-marlin-L2-n3", "marlin", True, ()),
    ]


def test_layers_runs_the_three_engines_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`layers`: the overlay's emulation (applied, then reverted), the pristine emulation's and
    Marlin's, on the 2-layer model, each comparing its MoE layer calls and nothing else."""
    calls: list[object] = []

    def overlay(args: Any) -> int:
        calls.append(args.action)
        return 0

    def engine(host: Any, run: Any, state: str, gpus: list[int]) -> dict[str, Any]:
        calls.append((f"{state}-{run.name}", run.model, run.backend, run.layers, run.logprobs))
        return run_result(f"{state}-{run.name}")

    monkeypatch.setattr(host.Host, "state", lambda self: "pristine")
    monkeypatch.setattr(cli, "cmd_overlay", overlay)
    monkeypatch.setattr(cli, "run_engine", engine)
    (tmp_path / "models" / "nvfp4-L2").mkdir(parents=True)
    assert cli.main(["layers", "--work", str(tmp_path)]) == 0
    assert calls == [
        "apply",
        ("overlay-emulation-L2-layers", "nvfp4-L2", "emulation", True, False),
        "revert",
        ("pristine-emulation-L2-layers", "nvfp4-L2", "emulation", True, False),
        ("pristine-marlin-L2-layers", "nvfp4-L2", "marlin", True, False),
    ]
