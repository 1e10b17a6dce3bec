"""The blind prediction of a round never holds the scheduler: rounds are recorded (and their `task`
events go out) while it is simulated, each prediction follows as a `prediction` event, the results
file writes a round once its prediction is known, and a job ends only after them (or after
PREDICTION_WAIT_S without them).

Found live: tree packing under node caps with a rate trace took tens of CPU-seconds to simulate per
round, on the scheduler's loop, and the run froze (no heartbeat read, no abort)."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from helpers.exact import assert_job_exact
from helpers.waiting import until

from core.plan import Job
from emulation.topology import uniform
from scheduler import planners, records
from wansync.predict import RoundPredictor, oracle_view
from wansync.results import Recorder, Results

PARAMS, CHUNK, ROUNDS = 20_000, 2_000, 4


@pytest.mark.loopback
async def test_rounds_go_on_while_their_predictions_are_simulated(cluster_of):
    c = await cluster_of(uniform(3, 400.0, 0.0), "pred")
    asked: list[Future] = []

    def predict(plan, start_s):  # a simulator that answers only when the test says so
        fut: Future = Future()
        asked.append(fut)
        return fut
    c.sched.records.predict = predict
    job = asyncio.create_task(c.sched.run_job("ring", rounds=ROUNDS, params=PARAMS, chunk_params=CHUNK))
    await until(lambda: c.sched.current is not None and len(c.sched.current.records) == ROUNDS,
                "every round to be recorded while no prediction is known")
    js = c.sched.current
    await until(lambda: js.job in c.sched.records._draining, "the job to wait for its predictions")
    # every round counted at once (its event drives faults, progress, tests), its prediction pending
    assert [t["round"] for t in c.kinds("task")] == list(range(ROUNDS))
    assert all(t["prediction_pending"] and t["prediction_s"] is None for t in c.kinds("task"))
    assert c.kinds("prediction") == [] and not job.done()  # the job waits for its predictions
    assert len(asked) == ROUNDS
    for i in reversed(range(ROUNDS)):
        asked[i].set_result(10.0 + i)
    js = await asyncio.wait_for(job, 30)
    told = {p["round"]: p["prediction_s"] for p in c.kinds("prediction")}
    assert told == {i: 10.0 + i for i in range(ROUNDS)}
    assert {r.round: r.prediction_s for r in js.records} == told
    assert_job_exact(c.sched, js)


@pytest.mark.unit
def test_the_results_file_writes_a_round_once_its_prediction_is_known(tmp_path):
    out = tmp_path / "r.jsonl"
    results = Results(out)
    handlers = []
    Recorder(results, SimpleNamespace(subscribe=handlers.append), SimpleNamespace(listeners=[]))
    [on_event] = handlers
    rec = {"type": "task", "job": 1, "task": 0, "attempt": 0, "round": 0, "round_s": 1.1, "prediction_s": None}
    on_event("task", {**rec, "prediction_pending": True})
    on_event("task", {**rec, "task": 1, "round": 1, "prediction_s": 2.0, "round_s": 2.2})
    results.close()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["task"] for line in lines] == [1]  # the known one at once; the pending one held
    results = Results(out)
    handlers.clear()
    Recorder(results, SimpleNamespace(subscribe=handlers.append), SimpleNamespace(listeners=[]))
    [on_event] = handlers
    on_event("task", {**rec, "prediction_pending": True})
    on_event("prediction", {"job": 1, "task": 0, "attempt": 0, "round": 0, "prediction_s": 1.0})
    results.close()
    [line] = [json.loads(x) for x in out.read_text().splitlines() if json.loads(x).get("task") == 0]
    assert line["prediction_s"] == 1.0 and line["prediction_err_pct"] == pytest.approx(10.0)
    assert "prediction_pending" not in line


@pytest.mark.loopback
async def test_a_prediction_that_never_comes_does_not_hold_the_job_for_ever(cluster_of, monkeypatch):
    monkeypatch.setattr(records, "PREDICTION_WAIT_S", 0.5)
    c = await cluster_of(uniform(3, 400.0, 0.0), "pred-late")
    c.sched.records.predict = lambda plan, start_s: Future()  # never answered
    js = await asyncio.wait_for(c.sched.run_job("ring", rounds=2, params=PARAMS, chunk_params=CHUNK), 30)
    assert [t["round"] for t in c.kinds("task")] == [0, 1]
    assert [(p["round"], p["prediction_s"]) for p in c.kinds("prediction")] == [(0, None), (1, None)]
    assert all(r.ok for r in js.records)


@pytest.mark.loopback
def test_the_predictor_simulates_in_its_own_process_and_skips_when_behind():
    topo = uniform(4, 100.0, 0.0)
    spec = planners.resolve("ring")
    plan = spec.plan(oracle_view(topo), Job(PARAMS, CHUNK, tuple(range(4)), dict(spec.options))).with_version(1)
    here = RoundPredictor(topo, None).round_s(plan)
    p = RoundPredictor(topo, None)
    p.MAX_QUEUED = 1
    try:
        first = p.submit(plan)
        other = p.submit(plan.with_version(2))  # a second plan while the first is queued: skipped
        assert first.result(timeout=120) == pytest.approx(here)
        assert other.done() and other.result() is None and p.skipped == 1
        assert p.submit(plan) is first  # known: the same answer, not simulated again
    finally:
        p.close()
