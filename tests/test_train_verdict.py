"""The baseline's fairness check (wansync.train.baseline_verdict): a DDP run whose bytes did not cross
the shaped links, or whose ranks were starved of CPU, is invalid, not beaten."""

from __future__ import annotations

import pytest

from wansync.train import TrainRun, baseline_verdict

pytestmark = pytest.mark.unit

NODES, STEPS, FLAT = 3, 10, 1000
RING = STEPS * 2 * (NODES - 1) * FLAT * 4  # what a ring all-reduce moves over all links, bytes


def run(link_bytes: int, cpu: float = 1.0, runq: float = 0.1, runs: float = 1000.0) -> TrainRun:
    ends = {r: [{"rank": r, "steps": STEPS, "flat": FLAT, "cpu_s": cpu, "runq_s": runq, "runs": runs}]
            for r in range(NODES)}
    return TrainRun("ddp", ends, 0.0, 1.0, link_bytes=link_bytes)


def test_a_fair_baseline_is_valid():
    assert baseline_verdict(run(RING), NODES) == (True, "valid")


def test_bytes_that_did_not_cross_the_shaped_links_make_it_invalid():
    ok, why = baseline_verdict(run(int(0.8 * RING)), NODES)
    assert ok is False and "crossed the shaped links" in why


def test_ranks_starved_of_cpu_make_it_invalid():
    ok, why = baseline_verdict(run(RING, cpu=1.0, runq=3.0, runs=100.0), NODES)
    assert ok is False and "waited for a CPU" in why


def test_ranks_that_reported_nothing_leave_it_unjudged():
    r = run(RING)
    del r.metrics[2]
    assert baseline_verdict(r, NODES)[0] is None


def test_time_to_accuracy_and_the_sync_share_leave_evaluation_out():
    """A script that spent 2 s of its 10 evaluating (its running total, eval_s) reached 0.9 after 5.5 s of
    training, though 7 s had passed; it synced 4 s of 8 training seconds, not 4 of 10."""
    r = TrainRun("wansync", {0: [{"t": 100.0 + 4.0, "accuracy": 0.5, "eval_s": 1.0},
                                 {"t": 100.0 + 7.0, "accuracy": 0.9, "eval_s": 1.5},
                                 {"t": 100.0 + 10.0, "accuracy": 0.95, "eval_s": 2.0},
                                 {"t": 100.0 + 10.0, "steps": 20, "sync_s": 4.0, "wall_s": 10.0}]}, 100.0, 110.0)
    assert r.time_to(0.9) == pytest.approx(5.5)
    assert r.series()[0] == (pytest.approx(3.0), 0.5)
    assert r.sync_share() == pytest.approx(0.5)
