"""Run tests/gpu against each vLLM tree of a manifest and check every red/green expectation.

Standard library only: ``vllm-patchset validate`` imports it, and ``vllm-patchset bundle``
ships it to GPU hosts that have torch but neither network nor vllm-patchset, where it runs as
``python3 gpurun.py BUNDLE_DIR``. Since it travels alone, it keeps its own standard-library
writes and children (the manifest, the logs, pytest runs) instead of the file-system layer
(``infra/fsio/``), which does not travel (but for ``interrupts.py``, standard library only,
which the bundle carries beside it); tests/test_fs_layer.py lets it. Ctrl-C or kill stop the
pytest run going on (its whole session: what it started too) and end in one line saying where
the logs and reports so far are.

The manifest (``manifest.json``) lists trees; each names the pytest selection to run and the
expected outcome of each regression test: ``red`` (fails: the bug is there) or ``green``
(passes). Every other test selected must pass or skip itself with a reason.

With ``--native SITE`` (an assembled native-ops kit, ``kitparts.py``), SITE goes on every run's
PYTHONPATH (the packages vLLM imports) and the trees marked ``native`` (the pin's) get SITE's
compiled vLLM extensions linked in beside their Python files, so that tests/gpu runs them with
vLLM's real ops (mode ``native``); the other trees keep the stand-ins.

With ``--part K/N`` each tree's selection is collected first (``pytest --collect-only``) and
only the K-th of N equal runs of its tests, in collection order, is run: a host whose commands
are cut after some minutes runs a tree in N calls. An expectation whose test falls in another
part is noted so (and counts as met in this call); one whose test is in no part stays unmet.
Where nothing is collected (every module skipped itself, as without a GPU) the part runs the
whole selection, whose report says why.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

try:
    from vllm_patchset.infra.fsio import interrupts
except ImportError:  # in a GPU bundle, without vllm-patchset: the file beside this one
    import interrupts  # type: ignore[import-not-found,no-redef]

MANIFEST = "manifest.json"
REPORT_ENV = "VLLM_PATCHSET_GPU_REPORT"  # tests/gpu/conftest.py writes outcomes there
TREE_ENV = "VLLM_PATCHSET_VLLM_TREE"
DID_NOT_FINISH = "pytest did not finish"  # no report: the tree did not import, or pytest died


@dataclass(frozen=True)
class Expectation:
    test: str  # a pytest node id without parameters: tests/gpu/test_x.py::test_y
    expect: str  # "red" or "green"
    why: str


@dataclass(frozen=True)
class TreeSpec:
    name: str
    path: str  # relative to the manifest's folder
    select: tuple[str, ...]  # pytest arguments (paths or node ids), relative to that folder
    expectations: tuple[Expectation, ...]
    native: bool = False  # the pin's tree: takes a native-ops kit's compiled extensions
    skipped: str = ""  # why the tree could not be built (then it is not there and not run)

    def expected_tests(self) -> frozenset[str]:
        return frozenset(e.test for e in self.expectations)


@dataclass(frozen=True)
class Row:
    tree: str
    mode: str
    vllm: str
    test: str
    expect: str  # red, green, or "green|skip" for tests without an expectation of their own
    got: str  # red, green, skip, error, not run
    met: bool
    note: str = ""  # a tree not built (why), or a test in another part


def load_manifest(root: Path) -> list[TreeSpec]:
    data = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    return [
        TreeSpec(
            name=t["name"],
            path=t["path"],
            select=tuple(t["select"]),
            expectations=tuple(Expectation(**e) for e in t["expectations"]),
            native=bool(t.get("native", False)),
            skipped=str(t.get("skipped", "")),
        )
        for t in data["trees"]
    ]


def write_manifest(root: Path, trees: list[TreeSpec]) -> None:
    data = {
        "trees": [
            {
                "name": t.name,
                "path": t.path,
                "select": list(t.select),
                "expectations": [e.__dict__ for e in t.expectations],
                "native": t.native,
                **({"skipped": t.skipped} if t.skipped else {}),
            }
            for t in trees
        ]
    }
    (root / MANIFEST).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def outcome_of(test: str, outcomes: dict[str, str]) -> str:
    """red, green, skip, error or "not run" for a test id, over all of its parametrizations.

    Red is a test that ran and failed; a module that does not import, or a fixture that
    breaks, is an error, which no expectation accepts."""
    mine = [o for node, o in outcomes.items() if node == test or node.startswith(test + "[")]
    if not mine:
        module = outcomes.get(test.split("::", 1)[0])  # a module that skipped or failed whole
        mine = [module] if module else []
    if not mine:
        return "not run"
    if "error" in mine:
        return "error"
    if "failed" in mine:
        return "red"
    if all(o == "skipped" for o in mine):
        return "skip"
    return "green"


def base_ids(outcomes: dict[str, str]) -> list[str]:
    """The test ids (without parameters) that ran or were collected."""
    return sorted({node.split("[", 1)[0] for node in outcomes if "::" in node})


def link_extensions(site: Path, tree: Path) -> list[str]:
    """Link every compiled extension of the vllm in `site` into the vllm tree `tree` (the
    folder holding vllm/) at the same path; return their paths. Existing files are kept."""
    linked = []
    for ext in sorted((site / "vllm").rglob("*.so")):
        rel = ext.relative_to(site)
        dest = tree / rel
        if dest.parent.is_dir() and not dest.exists():
            dest.symlink_to(ext.resolve())
            linked.append(rel.as_posix())
    return linked


@dataclass(frozen=True)
class Part:
    """The K-th (from 1) of N runs of a tree's collected tests."""

    k: int
    n: int

    def of(self, ids: list[str], whole: frozenset[str] = frozenset()) -> list[str]:
        """Its share of `ids`, in order: those from the (K-1)/N to the K/N point, where every
        parametrization of a test in `whole` (a test id without parameters) goes where the
        first one falls, so that its expectation is judged on all of them."""
        first: dict[str, int] = {}
        mine = []
        for i, node in enumerate(ids):
            base = node.split("[", 1)[0]
            at = first.setdefault(base, i) if base in whole else i
            if (self.k - 1) * len(ids) <= at * self.n < self.k * len(ids):
                mine.append(node)
        return mine

    def suffix(self) -> str:
        return f".part{self.k}of{self.n}"


def parse_part(text: str) -> Part | None:
    """K/N with 1 <= K <= N, else None."""
    k, slash, n = text.partition("/")
    if not (slash and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        return None
    return Part(int(k), int(n))


@dataclass(frozen=True)
class Split:
    """A tree's tests as `--part` divided them: all it collected, and the part's own."""

    part: Part
    collected: list[str]
    mine: list[str]

    def elsewhere(self) -> set[str]:
        """The tests (ids without parameters) collected in the other parts only."""
        mine = set(self.mine)
        bases = {node.split("[", 1)[0] for node in self.collected if node not in mine}
        return bases - {node.split("[", 1)[0] for node in mine}


def unfinished(why: str) -> dict[str, object]:
    """The report of a run that wrote none."""
    return {"vllm": {"mode": DID_NOT_FINISH}, "outcomes": {}, "why": why}


def collected_ids(log: Path) -> list[str]:
    """The node ids a `pytest --collect-only -q` run printed (its log)."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return [line for line in lines if line.split("::", 1)[0].endswith(".py") and "::" in line]


def _pytest(command: list[str], root: Path, env: dict[str, str], log_path: Path) -> None:
    """Run pytest to the end with its output in `log_path`."""
    with log_path.open("w", encoding="utf-8") as log:
        # A session of its own: stopped, this run kills pytest and what it started (compile
        # workers), which a kill of this process alone left running on the GPU.
        pytest = subprocess.Popen(
            command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            pytest.wait()
        finally:
            if pytest.returncode is None:
                os.killpg(pytest.pid, signal.SIGKILL)
                pytest.wait()


def run_tree(
    root: Path,
    tree: TreeSpec,
    out: Path,
    python: str,
    native: Path | None = None,
    part: Part | None = None,
) -> tuple[dict[str, object], float, Split | None]:
    """Run pytest on `tree`'s selection (or `part` of it) with that tree first on sys.path;
    return the report, the seconds and, with `part`, how the tests were divided."""
    name = tree.name + (part.suffix() if part else "")
    report_path = out / f"{name}.json"
    report_path.unlink(missing_ok=True)
    env = {**os.environ, TREE_ENV: str((root / tree.path).resolve()), REPORT_ENV: str(report_path)}
    if native is not None:
        if tree.native:
            link_extensions(native, root / tree.path)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(native), env.get("PYTHONPATH"))))
    options = [
        "--confcutdir",
        str(root / "tests" / "gpu"),  # tests/gpu stands alone: no CPU-test fixtures
        "-p",
        "no:cacheprovider",
    ]
    log_path = out / f"{name}.log"
    started = time.monotonic()
    select, split = list(tree.select), None
    if part is not None:
        collect_env = {k: v for k, v in env.items() if k != REPORT_ENV}
        _pytest([python, "-m", "pytest", *select, *options, "--collect-only", "-q"], root,
                collect_env, log_path)  # fmt: skip
        ids = collected_ids(log_path)
        split = Split(part, ids, part.of(ids, tree.expected_tests()))
        # Nothing collected (every module skipped itself, as without a GPU, or one did not
        # import): the whole selection runs, and its report says why.
        select = split.mine if ids else select
        if not select:
            why = f"part {part.k} of {part.n} of {len(ids)} tests is empty (the log: {log_path})"
            return unfinished(why), time.monotonic() - started, split
    command = [python, "-m", "pytest", *select, *options]
    # a hung capture prints its stacks instead of hanging silently
    command += ["-o", "faulthandler_timeout=300", "-rA"]
    _pytest(command, root, env, log_path)
    seconds = time.monotonic() - started
    if not report_path.is_file():
        return unfinished(f"{last_line(log_path)} (the log: {log_path})"), seconds, split
    return json.loads(report_path.read_text(encoding="utf-8")), seconds, split


def last_line(log: Path) -> str:
    """The last line of a pytest log that did not finish (pytest's INTERNALERROR prefix
    dropped): where a tree does not import, the error that stopped it."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    for line in reversed(lines):
        text = line.removeprefix("INTERNALERROR>").strip()
        if text:
            return text
    return "the log is empty"


def check_tree(tree: TreeSpec, report: dict[str, object], split: Split | None = None) -> list[Row]:
    """The tree's rows: each expectation, then every other test that ran. With `split`, an
    expectation whose test was collected in the other parts only is noted so."""
    vllm = report.get("vllm", {})
    assert isinstance(vllm, dict)
    outcomes = report.get("outcomes", {})
    assert isinstance(outcomes, dict)
    mode, version = str(vllm.get("mode", "?")), str(vllm.get("version", "?"))
    rows = []
    expected = {e.test: e for e in tree.expectations}
    elsewhere = split.elsewhere() if split else set()
    for e in tree.expectations:
        if split and e.test in elsewhere:
            note = f"in another part of {split.part.n}"
            rows.append(Row(tree.name, mode, version, e.test, e.expect, "not run", True, note))
            continue
        got = outcome_of(e.test, outcomes)
        rows.append(Row(tree.name, mode, version, e.test, e.expect, got, got == e.expect))
    for test in base_ids(outcomes):
        if test not in expected:
            got = outcome_of(test, outcomes)
            rows.append(
                Row(tree.name, mode, version, test, "green|skip", got, got in ("green", "skip"))
            )
    if mode == DID_NOT_FINISH:  # unmet even where the tree expects nothing of its own
        rows.append(Row(tree.name, mode, version, "pytest", "finished", "did not finish", False))
    return rows


def not_built(tree: TreeSpec) -> list[Row]:
    """A tree validate could not build: each expectation's row says so (and why), and counts
    as met; the rest of the run goes on."""
    note = f"not built: {tree.skipped}"
    return [
        Row(tree.name, "not built", "-", e.test, e.expect, "not run", True, note)
        for e in tree.expectations
    ]


def _verdict(row: Row) -> str:
    if row.note.startswith("not built"):
        return "skipped"
    if row.note:
        return "other part"
    return "ok" if row.met else "UNMET"


def table(rows: list[Row]) -> str:
    header = ("tree", "mode", "vllm", "test", "expected", "got", "")
    lines = [header] + [
        (r.tree, r.mode, r.vllm, r.test.split("/")[-1], r.expect, r.got, _verdict(r)) for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def run_all(
    root: Path,
    out: Path,
    python: str,
    only: tuple[str, ...] = (),
    native: Path | None = None,
    part: Part | None = None,
) -> list[Row]:
    out.mkdir(parents=True, exist_ok=True)
    interrupts.interrupt_leaves(f"the logs and reports of the trees run so far are in {out}")
    rows: list[Row] = []
    timings: dict[str, float] = {}
    for tree in load_manifest(root):
        if only and tree.name not in only:
            continue
        if tree.skipped:
            print(f"{tree.name}: not built: {tree.skipped}", flush=True)
            rows.extend(not_built(tree))
            continue
        report, seconds, split = run_tree(root, tree, out, python, native, part)
        timings[tree.name] = round(seconds, 1)
        print(f"{tree.name}: {report.get('vllm', {})} ({seconds:.0f} s)", flush=True)
        if split:
            counts = f"{len(split.mine)} of {len(split.collected)} tests"
            print(f"{tree.name}: part {split.part.k} of {split.part.n}: {counts}", flush=True)
        if "why" in report:
            print(f"{tree.name}: {report['why']}", flush=True)
        rows.extend(check_tree(tree, report, split))
    summary = {"rows": [r.__dict__ for r in rows], "seconds": timings}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return rows


def refusal(args: argparse.Namespace) -> str:
    """Why the command line cannot run (one line), or ""."""
    if not (args.root / MANIFEST).is_file():
        return f"no {MANIFEST} in {args.root}"
    names = [tree.name for tree in load_manifest(args.root)]
    unknown = [name for name in args.only if name not in names]
    if unknown:
        return f"no tree {unknown[0]} in {MANIFEST} (its trees: {', '.join(names)})"
    if args.part is not None and parse_part(args.part) is None:
        return f"--part takes K/N with 1 <= K <= N, not {args.part!r}"
    if args.native is not None and not (args.native / "vllm" / "__init__.py").is_file():
        return f"--native {args.native} holds no vllm/ package"
    return ""


def summary_line(rows: list[Row]) -> str:
    unmet = sum(1 for r in rows if not r.met)
    not_built = sum(1 for r in rows if r.note.startswith("not built"))
    elsewhere = sum(1 for r in rows if r.note) - not_built
    line = f"{len(rows) - unmet - not_built - elsewhere} expectations met, {unmet} unmet"
    line += f", {not_built} on trees not built" if not_built else ""
    return line + (f", {elsewhere} in other parts" if elsewhere else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, nargs="?", default=Path(__file__).resolve().parent)
    parser.add_argument("--out", type=Path, help="logs and reports (default: ROOT/results)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter with torch")
    parser.add_argument("--only", action="append", default=[], metavar="TREE")
    parser.add_argument("--native", type=Path, metavar="SITE", help="an assembled kit's site/")
    parser.add_argument("--part", metavar="K/N", help="run the K-th of N parts of each tree")
    args = parser.parse_args(argv)
    why = refusal(args)
    if why:
        print(f"gpurun: {why}", file=sys.stderr)
        return 2
    part = parse_part(args.part) if args.part is not None else None
    native = args.native.resolve() if args.native else None
    out = args.out or args.root / "results"
    rows = run_all(args.root, out, args.python, tuple(args.only), native, part)
    print(table(rows))
    print(summary_line(rows))
    return 1 if any(not r.met for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(interrupts.command(main, "gpurun"))
