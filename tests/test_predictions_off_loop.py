"""The blind prediction of a round never holds the scheduler: rounds go on while it is simulated, the
rounds' records reach the event stream in order once their predictions are known, and a job ends
only after them (or after PREDICTION_WAIT_S without them).

Found live: tree packing under node caps with a rate trace took tens of CPU-seconds to simulate per
round, on the scheduler's loop, and the run froze (no heartbeat read, no abort)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest
from helpers.exact import assert_job_exact
from helpers.waiting import until

from core.plan import Job
from emulation.topology import uniform
from scheduler import planners, records
from wansync.predict import RoundPredictor, oracle_view

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
    assert c.kinds("task") == [] and not job.done()  # nothing announced without its prediction
    assert len(asked) == ROUNDS
    for i in reversed(range(ROUNDS)):  # the last round's prediction first: announced in round order anyway
        asked[i].set_result(10.0 + i)
    js = await asyncio.wait_for(job, 30)
    tasks = c.kinds("task")
    assert [t["round"] for t in tasks] == list(range(ROUNDS))
    assert [t["prediction_s"] for t in tasks] == [10.0 + i for i in range(ROUNDS)]
    assert [r.prediction_s for r in sorted(js.records, key=lambda r: r.round)] == [10.0 + i for i in range(ROUNDS)]
    assert_job_exact(c.sched, js)


@pytest.mark.loopback
async def test_a_prediction_that_never_comes_does_not_hold_the_job_for_ever(cluster_of, monkeypatch):
    monkeypatch.setattr(records, "PREDICTION_WAIT_S", 0.5)
    c = await cluster_of(uniform(3, 400.0, 0.0), "pred-late")
    c.sched.records.predict = lambda plan, start_s: Future()  # never answered
    js = await asyncio.wait_for(c.sched.run_job("ring", rounds=2, params=PARAMS, chunk_params=CHUNK), 30)
    tasks = c.kinds("task")
    assert [t["round"] for t in tasks] == [0, 1] and all(t["prediction_s"] is None for t in tasks)
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
