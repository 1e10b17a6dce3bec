"""`wansync reproduce`'s campaign loop on a tiny registered experiment (pure simulation: selective reduce's
simulated run at n = 8): runs recorded as JSON lines, a second invocation resumes, invalid runs listed and
never summarized, committed summaries recomputed from the lines (a tampered one is caught), README markers
checked against their results file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from wansync.reproduce import registry, runlog
from wansync.reproduce.benches import bench
from wansync.reproduce.readme_marks import marks
from wansync.reproduce.registry import Experiment, register
from wansync.reproduce.runner import reproduce
from wansync.reproduce.verify import mismatched

pytestmark = pytest.mark.unit
PAPER = "toy-selective"
CALLS: list[tuple[int, int]] = []


def toy(cell: dict, seed: int) -> dict:
    """SR and PR simulated at n = 8 for 5 s; seed 3 is declared invalid (as a failed guard would be)."""
    CALLS.append((cell["n"], seed))
    sr = bench("selreduce")
    out: dict = {"valid": seed != 3, "live": False, "reason": "" if seed != 3 else "declared invalid"}
    for sch in ("sr", "pr"):
        s = sr.run_sim(replace(sr.SimCase(cell["n"], seed, sch), compute="cnn:mean=0.05"))
        out[f"{sch}_sync_s"] = s["mean_sync_s"]
    return out


if not registry._REGISTRY.get(PAPER):  # once per session
    register(Experiment(PAPER, "toy", "a toy", toy, [{"n": 8}], "n", ("sr_sync_s+pr_sync_s", "pr_over_sr"),
                        ratios=(("pr_over_sr", "pr_sync_s", "sr_sync_s"),)))


@pytest.fixture(autouse=True)
def fast_sim(monkeypatch):
    monkeypatch.setattr(bench("selreduce"), "SIM_BUDGET_S", 5.0)
    CALLS.clear()


def campaign(out: Path, seeds: int = 7) -> list[dict]:
    assert reproduce(PAPER, seeds=seeds, out=out) == 0
    return runlog.read(out / "runs.jsonl")


def test_every_run_is_one_line_and_a_second_invocation_runs_nothing_again(tmp_path):
    runs = campaign(tmp_path, seeds=4)
    assert [(r["experiment"], r["cell"], r["seed"]) for r in runs] == [("toy", {"n": 8}, s) for s in (1, 2, 3, 4)]
    assert all(r["commit"] and r["machine"] and "sr_sync_s" in r["figures"] for r in runs)
    assert len(CALLS) == 4
    CALLS.clear()
    assert campaign(tmp_path, seeds=4) == runs  # resumed: nothing left to do
    assert CALLS == []
    assert campaign(tmp_path, seeds=6)[:4] == runs  # more seeds: only the new ones run
    assert CALLS == [(8, 5), (8, 6)]
    assert (tmp_path / "toy.png").stat().st_size > 0 and (tmp_path / "index.md").exists()


def test_a_line_cut_short_by_an_interruption_is_run_again(tmp_path):
    campaign(tmp_path, seeds=2)
    path = tmp_path / "runs.jsonl"
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])  # killed while writing seed 2
    CALLS.clear()
    with path.open("a") as f:
        f.write("\n")
    campaign(tmp_path, seeds=2)
    assert CALLS == [(8, 2)]


def test_invalid_runs_are_listed_and_never_summarized(tmp_path):
    runs = campaign(tmp_path, seeds=7)
    s = json.loads((tmp_path / "summary.json").read_text())["experiments"]["toy"]
    assert s["invalid"] == [{"cell": {"n": 8}, "seed": 3, "reason": "declared invalid"}]
    (cell,) = s["cells"]
    assert cell["seeds"] == [1, 2, 4, 5, 6, 7]
    valid = sorted(r["figures"]["pr_sync_s"] / r["figures"]["sr_sync_s"] for r in runs if r["seed"] != 3)
    f = cell["figures"]["pr_over_sr"]  # paired per seed, then summarized: 6 seeds -> [min, max], 96.9 %
    assert (f["lo"], f["hi"], f["n"]) == (valid[0], valid[-1], 6)
    assert f["median"] == pytest.approx((valid[2] + valid[3]) / 2)
    assert f["interval"] == "[min, max] of 6: 96.9 %" and f["meets_target"]
    assert "declared invalid" in (tmp_path / "index.md").read_text()


def test_committed_summaries_are_recomputed_from_the_lines_and_tampering_is_caught(tmp_path):
    campaign(tmp_path, seeds=6)
    assert mismatched(PAPER, tmp_path) == []
    path = tmp_path / "summary.json"
    doc = json.loads(path.read_text())
    doc["experiments"]["toy"]["cells"][0]["figures"]["pr_over_sr"]["median"] *= 1.01
    path.write_text(json.dumps(doc))
    assert mismatched(PAPER, tmp_path) == ["toy"]
    doc["experiments"]["toy"]["cells"][0]["figures"]["pr_over_sr"]["median"] /= 1.01
    doc["experiments"]["toy"]["invalid"] = []  # an invalid run hidden
    path.write_text(json.dumps(doc))
    assert mismatched(PAPER, tmp_path) == ["toy"]


def test_a_readme_figure_that_no_longer_matches_its_results_file_is_caught(tmp_path):
    campaign(tmp_path / PAPER, seeds=6)
    doc = json.loads((tmp_path / PAPER / "summary.json").read_text())
    f = doc["experiments"]["toy"]["cells"][0]["figures"]["pr_over_sr"]
    ref = f"{PAPER}/toy?n=8"
    readme = (f"| ratio | {f['median']:.2f} <!-- result {ref} pr_over_sr.median --> "
              f"[{f['lo']:.2f}-{f['hi']:.3f} <!-- result {ref} pr_over_sr.hi -->] |\n")
    got = marks(readme, tmp_path)
    assert [m.ok for m in got] == [True, True] and got[0].actual == f["median"]
    changed = readme.replace(f"{f['median']:.2f}", f"{f['median'] + 0.02:.2f}", 1)
    assert [m.ok for m in marks(changed, tmp_path)] == [False, True]
    wrong_cell = readme.replace("?n=8", "?n=9")
    assert not any(m.ok for m in marks(wrong_cell, tmp_path))  # a figure its file does not hold
