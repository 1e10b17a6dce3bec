"""The committed campaigns under docs/results and the README figures taken from them: every marked README
figure still matches its results file, and every committed summary is what its raw lines give. A figure
typed into the README by hand, or a summary edited after its campaign, fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from wansync.reproduce.readme_marks import marks
from wansync.reproduce.verify import mismatched

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAPERS = sorted(p.name for p in RESULTS.iterdir() if (p / "summary.json").exists())


def test_every_marked_readme_figure_matches_its_results_file():
    got = marks((ROOT / "README.md").read_text(), RESULTS)
    assert len(got) >= 10
    stale = [f"{m.paper}/{m.experiment} {m.cell} {m.figure}.{m.stat}: README {m.shown}, file {m.actual}"
             for m in got if not m.ok]
    assert not stale, stale


@pytest.mark.parametrize("paper", PAPERS)
def test_every_committed_summary_is_what_its_raw_lines_give(paper):
    assert mismatched(paper, RESULTS / paper) == []
