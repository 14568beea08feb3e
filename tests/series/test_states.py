"""Per-patch states on the synthetic story (tests/synthetic.py): each of the four states and
the finer verdicts, text and trailers disagreeing, releases and git refs, `status` and `check`
on the pin. Today's real states are pinned in test_real_series.py."""

from __future__ import annotations

import json

import pytest
from synthetic import STORY_ARCHIVED, STORY_FIX, STORY_LOCAL, Story
from vllm_patchset.cli import main
from vllm_patchset.infra.config import Project

ARCHIVED = f"upstreamed/{STORY_ARCHIVED.name}"
FIX = STORY_FIX.name
LOCAL = STORY_LOCAL.name
GONE = (
    "text says absent, trailers say applies: the code it changes is gone (rewritten or removed"
    " upstream)"
)
# 0.9 predates the MoE code (the fix: never there) and has the clamp bug (the archived fix
# applies); 1.0 is the pin; 1.1 has the MoE fix and changed the label line the local patch
# changes; 1.2 rewrote the MoE function both patches change. (state, verdict) per patch:
STORY_STATES = [
    ("0.9", ("applies", "applies"), ("absent", "never-there"), ("conflict", "conflict")),
    ("1.0", ("upstream", "upstream"), ("applies", "applies"), ("applies", "applies")),
    ("1.1", ("upstream", "upstream"), ("upstream", "upstream"), ("conflict", "conflict")),
    ("1.2", ("upstream", "upstream"), ("conflict", "rewritten"), ("conflict", "rewritten")),
]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(list(argv)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def test_matrix_states_on_releases(tiny: Project, capsys: pytest.CaptureFixture[str]) -> None:
    versions = [v for v, *_ in STORY_STATES]
    # Given in any order, the columns come in PEP 440 order.
    doc = run_json(capsys, "--project", str(tiny.root), "matrix", *versions[::-1], "--json")
    assert list(doc["versions"]) == versions  # type: ignore[call-overload]
    assert doc["versions"] == {
        v: {ARCHIVED: s1[0], FIX: s2[0], LOCAL: s3[0]} for v, s1, s2, s3 in STORY_STATES
    }
    details = doc["details"]
    assert isinstance(details, dict)
    assert {
        v: tuple(details[v][p]["verdict"] for p in (ARCHIVED, FIX, LOCAL)) for v in versions
    } == {v: (s1[1], s2[1], s3[1]) for v, s1, s2, s3 in STORY_STATES}
    # Where the text and the trailers disagree in a way that changes a decision: a warning.
    assert {
        (v, p): details[v][p]["warnings"]
        for v in versions
        for p in (ARCHIVED, FIX, LOCAL)
        if details[v][p]["warnings"]
    } == {
        # 0.9: the label line the local patch changes is there (its surroundings are not).
        ("0.9", LOCAL): [
            'the bug (`label = "experts"`) is live at vllm/layers/moe.py:23 (Experts.name);'
            " its fix is nowhere in vllm/layers/moe.py"
        ],
        ("1.2", FIX): [GONE],
        ("1.2", LOCAL): [GONE],
    }
    # A cosmetic one (the patch's comment is its own; upstream's code is the same) is noted.
    on_11 = details["1.1"][FIX]
    assert (on_11["text_state"], on_11["trailer_state"]) == ("upstream", "applies")
    assert on_11["disagreements"] == [
        "hunk 1 (vllm/layers/moe.py): code matches upstream, comment lines differ"
    ]
    on_09 = details["0.9"][FIX]
    assert (on_09["text_state"], on_09["trailer_state"], on_09["disagreements"]) == (
        "absent",
        "absent",
        [],
    )
    assert [h["offset"] for h in details["1.0"][FIX]["hunks"]] == [0]


def test_matrix_on_git_refs(
    tiny: Project, story: Story, capsys: pytest.CaptureFixture[str]
) -> None:
    """Columns of git refs, in the order given; a ref named like a release has its version
    (the trailers count), one that is not (`nightly`) has none and is classified against the
    pin, as the rebase does (before: `absent (not-found)` for code that was there)."""
    doc = run_json(
        capsys,
        *("--project", str(tiny.root), "matrix", "--json", "--git", str(story.upstream.path)),
        *("--ref", "v1.2", "--ref", "v0.9", "--ref", "nightly"),
    )
    assert doc["versions"] == {
        "git:v1.2": {ARCHIVED: "upstream", FIX: "conflict", LOCAL: "conflict"},
        "git:v0.9": {ARCHIVED: "applies", FIX: "absent", LOCAL: "conflict"},
        "git:nightly": {ARCHIVED: "upstream", FIX: "conflict", LOCAL: "conflict"},
    }
    details = doc["details"]
    assert isinstance(details, dict)
    verdicts = {ref: tuple(details[ref][p]["verdict"] for p in (FIX, LOCAL)) for ref in details}
    assert verdicts == {
        "git:v1.2": ("rewritten", "rewritten"),
        "git:v0.9": ("never-there", "conflict"),
        # The same tree as v1.2, no version: both applied on the pin, their code is gone.
        "git:nightly": ("rewritten", "rewritten"),
    }


def test_status_and_check_on_the_pin(tiny: Project, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--project", str(tiny.root), "status", "--json")
    assert doc == {
        "ok": True,
        "command": "status",
        "exit_code": 0,
        "pin": "1.0",
        "patches": {ARCHIVED: "upstream", FIX: "applies", LOCAL: "applies"},
        "warnings": {ARCHIVED: [], FIX: [], LOCAL: []},
        "disagreements": {ARCHIVED: [], FIX: [], LOCAL: []},
        "parked": {},
        "lock": "fresh",
    }
    assert main(["--project", str(tiny.root), "check"]) == 0
    assert capsys.readouterr().out == "check: 3 patches, 0 problem(s)\n"
