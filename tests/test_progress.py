"""Multicast tasks, progress models (BSP, SSP, a ready queue) and compute models, over real TCP with
in-process agents; every delivery is compared with the exact tensor this test computes itself."""

import asyncio
import math
import statistics
from types import SimpleNamespace

import numpy as np
import pytest
from helpers.cluster import LocalNet, start_cluster, stop_cluster
from helpers.exact import assert_round_exact, exact_sum
from helpers.waiting import until

from core.compute import ComputeError, ComputeModel
from core.plan import Job
from emulation.link import LinkSpec
from emulation.topology import Topology, uniform
from scheduler.planners import multicast
from scheduler.progress import resolve as resolve_progress
from scheduler.view import NetworkView

PARAMS, CHUNK = 60_000, 6_000


def line(n: int, rate: float = 1000.0) -> Topology:
    links = {}
    for a in range(n - 1):
        links[(a, a + 1)] = links[(a + 1, a)] = LinkSpec(rate)
    return Topology("line", n, links)


# --- multicast ---------------------------------------------------------------------------------------------
@pytest.mark.loopback
@pytest.mark.parametrize("mode", ["l7", "l3"])
async def test_a_multicast_delivers_the_sources_tensor_exactly_to_every_receiver(mode):
    topo = line(5)
    plan = multicast.plan(NetworkView(topo.links), Job(PARAMS, CHUNK, (0,), {"receivers": [2, 4], "mode": mode}))
    plan = plan.with_version(1).validate(topo.links)
    if mode == "l3":  # replicated where routes part: node 1 and 3 pass it on without receiving
        assert plan.groups[0].children == {0: (1,), 1: (2,), 2: (3,), 3: (4,)}
        assert set(plan.nodes) - set(plan.receiver_set) - {0} == {1, 3}
    else:
        assert plan.groups[0].children == {0: (2, 4)}
    async with LocalNet(topo) as net:
        out = await net.run_round(plan, rnd=3)  # every receiver == the source's exact tensor
    assert sorted(out) == [2, 4]
    assert np.array_equal(out[2], exact_sum(3, (0,), PARAMS))


@pytest.mark.loopback
async def test_a_receiver_dropped_mid_transfer_applies_nothing_and_the_others_are_exact():
    topo = uniform(5, rate_mbps=20.0).scaled(0.2)
    sched, agents, tasks = await start_cluster(topo, cluster="drop", shaped=True)
    try:
        js = sched.open_tasks("mcast", params=400_000, chunk_params=20_000)  # 1.6 MB at 20 Mbit/s: ~0.7 s each
        run = asyncio.create_task(sched.run_task(js, (0,), receivers=(1, 2, 3, 4)))
        # mid-transfer: the dropped receiver already holds part of the tensor
        await until(lambda: js.tasks and js.tasks[0].started_t is not None
                    and agents[3].overlay.meters_in[0].bytes > 100_000, "node 3 to hold part of the tensor")
        assert agents[3].overlay.meters_in[0].bytes < 1_600_000
        sched.drop_receiver(js, 0, 3)
        rec = await asyncio.wait_for(run, 60)
        assert rec.ok and rec.attempt == 0 and rec.dropped == [3] and sorted(rec.digests) == [1, 2, 4]
        assert_round_exact(rec, sched.plans[rec.version])  # the others: exact, per this test's own sum
        # node 3: nothing of the task applied, its state gone, nothing it got kept
        await until(lambda: not agents[3].engine.tasks and not agents[3].engine.held_bytes(),
                    "node 3 to let the task go")
        assert not any(d.node == 3 for d in js.tasks[0].done.values())
        assert agents[3].overlay.meters_in[0].bytes < 1_600_000  # what was on its way to node 3 stopped too
        await asyncio.wait_for(sched.close_job(js), 30)
    finally:
        await stop_cluster(sched, tasks)


@pytest.mark.loopback
async def test_a_dropped_receiver_that_replicates_passes_the_tensor_on_and_applies_nothing():
    topo = line(5, rate=20.0).with_rates({(1, 2): 5.0})  # chunks queue at node 1 for node 2
    sched, agents, tasks = await start_cluster(topo, cluster="drop-l3", shaped=True)
    try:  # 0 -> 1 -> 2 -> 3 -> 4, replicated: node 2 receives and passes it on towards 4
        js = sched.open_tasks("mcast-l3", params=400_000, chunk_params=20_000)
        run = asyncio.create_task(sched.run_task(js, (0,), receivers=(2, 4)))
        await until(lambda: agents[2].overlay.meters_in[1].bytes > 100_000, "node 2 to hold part of the tensor")
        sched.drop_receiver(js, 0, 2)
        rec = await asyncio.wait_for(run, 60)
        assert rec.ok and rec.attempt == 0 and rec.dropped == [2]
        assert sorted(rec.digests) == [4]  # 2 reports no result of its own
        assert_round_exact(rec, sched.plans[rec.version])  # 4 holds node 0's exact tensor, through 2
        assert agents[4].overlay.meters_in[3].bytes >= 1_600_000
        await asyncio.wait_for(sched.close_job(js), 30)
    finally:
        await stop_cluster(sched, tasks)


# --- compute models ------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_compute_draws_are_seeded_per_node_and_iteration_and_the_same_for_everyone():
    a = ComputeModel("lognormal:mean=0.1,cv=0.5,spread=0.5", seed=7)
    b = ComputeModel("lognormal:mean=0.1,cv=0.5,spread=0.5", seed=7)
    draws = [a.draw(n, k) for n in range(4) for k in range(50)]
    assert draws == [b.draw(n, k) for n in range(4) for k in range(50)]  # launcher, agents, simulator agree
    assert len(set(draws)) == len(draws) and all(d > 0 for d in draws)
    means = [a.mean_of(n) for n in range(4)]
    assert len(set(means)) == 4 and all(0.05 <= m <= 0.15 for m in means)  # each node its own mean
    assert ComputeModel("constant:0.2").scaled(0.5).draw(3, 9) == pytest.approx(0.1)
    assert abs(np.mean([a.draw(0, k) for k in range(4000)]) / means[0] - 1) < 0.05  # the mean it says


@pytest.mark.unit
def test_a_compute_trace_repeats_per_node(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("node,iteration,seconds\n0,0,0.1\n0,1,0.3\n1,0,0.2\n")
    m = ComputeModel(f"csv:{f}")
    assert [m.draw(0, k) for k in range(4)] == [0.1, 0.3, 0.1, 0.3] and m.draw(1, 5) == 0.2


@pytest.mark.unit
@pytest.mark.parametrize("spec, message", [
    ("gamma:1", "kind must be"), ("normal:sd=1", "needs mean"), ("lognormal:mean=x", "not a number"),
    ("lognormal:mean=0.1,cv=-1", ">= 0"), ("normal:mean=1,spread=2", "spread"), ("normal:mean=1,bad=2", "unknown"),
])
def test_a_bad_compute_model_says_what_is_wrong(spec, message):
    with pytest.raises(ComputeError, match=message):
        ComputeModel(spec)


# --- progress models --------------------------------------------------------------------------------------
def readies(sched, job) -> list[tuple[float, int, int]]:
    return [(e["t"], e["node"], e["round"]) for e in sched.timeline if e["kind"] == "ready" and e["job"] == job]


class Recorder:
    """A Control that only writes down what a progress model asks for (the policy alone, no network)."""

    def __init__(self, workers: int) -> None:
        self.workers, self.gos, self.formed = list(range(workers)), [], []

    def alive(self):
        return self.workers

    def go(self, js, upto, node):
        self.gos.append((node, upto))

    def form(self, js, members, receivers, rnd, iters=None, options=None):
        self.formed.append((tuple(members), None if receivers is None else tuple(receivers), rnd, iters))

    def barrier_ready(self, js, rnd, node, have):
        raise AssertionError("ssp has no barrier")


@pytest.mark.unit
def test_the_ssp_policy_allows_exactly_the_bound_and_counts_what_breaks_it():
    ssp, ctl = resolve_progress("ssp", staleness=1), Recorder(3)
    js = SimpleNamespace(rounds=10)

    def over(node, k):  # node's iteration-k multicast is recorded
        ssp.task_done(ctl, js, SimpleNamespace(iters={node: k}))

    ssp.start(ctl, js)
    assert ctl.gos == [(0, 0), (1, 0), (2, 0)]  # iteration 0 for everyone
    for n in range(3):
        ssp.ready(ctl, js, n, 0, set())
    assert ctl.formed[-1] == ((2,), (0, 1), 0, {2: 0})  # 2's iteration-0 parameters, to the others
    assert len(ctl.gos) == 3  # nobody's multicast is over yet: nobody goes on
    over(0, 0)
    assert ctl.gos[-1] == (0, 1)  # its own multicast over, and 1 <= -1 + 1 + s
    ssp.ready(ctl, js, 0, 1, set())
    over(0, 1)
    assert ctl.gos[-1] == (0, 1)  # 2 > min(1, -1, -1) + 1 + s: held back by the slowest
    over(1, 0)
    assert ctl.gos[-1] == (1, 1)  # 1's own multicast is over; 1 <= -1 + 1 + s
    over(2, 0)
    assert ctl.gos[-2:] == [(0, 2), (2, 1)]  # the slowest did 0: up to 0 + 1 + s
    ssp.ready(ctl, js, 0, 2, set())
    over(0, 2)
    assert ssp.violations == 0 and ctl.gos[-1] == (2, 1)  # 0 may not do 3 > 0 + 1 + s
    ssp.ready(ctl, js, 0, 3, set())  # computed without a GO
    assert ssp.violations == 1
    ssp.lost(ctl, js, 1)
    ssp.lost(ctl, js, 2)  # only worker 0 is left: the slowest is itself
    assert ctl.gos[-1] == (0, 3)


@pytest.mark.loopback
async def test_ssp_never_lets_a_worker_run_more_than_s_ahead_and_blocks_when_it_must(tmp_path):
    s, rounds = 2, 8
    trace = tmp_path / "compute.csv"  # node 0 computes 10x slower than the others
    trace.write_text("\n".join(f"{n},0,{0.3 if n == 0 else 0.03}" for n in range(4)))
    sched, agents, tasks = await start_cluster(uniform(4), cluster="ssp")
    try:
        js = await asyncio.wait_for(sched.run_job("mcast", rounds=rounds, params=PARAMS, chunk_params=CHUNK,
                                                  progress="ssp", staleness=s, compute=f"csv:{trace}"), 120)
        # every multicast (a worker's parameters to the others) delivered exactly
        assert len(js.records) == 4 * rounds and all(r.ok for r in js.records)
        for rec in js.records:
            assert_round_exact(rec, sched.plans[rec.version])
        # the rule, checked here at every READY from the scheduler's own clock: an iteration k of
        # worker i was allowed only once i's multicast of k - 1 was over and k <= min_j done_j + 1 + s
        over = sorted((t.recorded_t, n, k) for t in js.tasks.values() for n, k in t.iters.items())
        seen = readies(sched, js.job)
        assert len(seen) == 4 * rounds
        for t, node, k in seen:
            done = {n: -1 for n in range(4)}
            for tr, n, kk in over:
                if tr < t:
                    done[n] = max(done[n], kk)
            assert done[node] >= k - 1 and k <= min(done.values()) + 1 + s, (node, k, done)
        assert js.progress.violations == 0
        # and it held the fast ones back: node 1 reported iteration k only after node 0's k - s - 1 was over
        t_ready = {(n, k): t for t, n, k in seen}
        t_over = {(n, k): t for t, n, k in over}
        for k in range(s + 1, rounds):
            assert t_ready[(1, k)] > t_over[(0, k - s - 1)]
        assert js.stats[1]["go_wait_s"] > 0
    finally:
        await stop_cluster(sched, tasks)


@pytest.mark.loopback
async def test_a_ready_queue_groups_the_first_p_ready_workers_under_lognormal_compute():
    p, rounds = 2, 5
    sched, agents, tasks = await start_cluster(uniform(5), cluster="queue")
    try:
        js = await asyncio.wait_for(sched.run_job("star", rounds=rounds, params=PARAMS, chunk_params=CHUNK,
                                                  progress="queue", group=p,
                                                  compute="lognormal:mean=0.05,cv=0.5,spread=0.6", seed=3), 120)
        assert js.records and all(r.ok and not r.aborted for r in js.records)
        for rec in js.records:
            assert_round_exact(rec, sched.plans[rec.version])  # each member's own iteration, summed exactly
        # every worker synchronized every iteration exactly once
        done = sorted((n, k) for rec in js.records for n, k in rec.iters.items())
        assert done == sorted((n, k) for n in range(5) for k in range(rounds))
        # groups are formed in READY order, p at a time (the last one with whoever is left)
        order = [(n, k) for _, n, k in readies(sched, js.job)]
        first = [sorted(rec.iters.items()) for rec in sorted(js.records, key=lambda r: r.task)]
        assert all(len(g) == p for g in first[:-1]) and 1 <= len(first[-1]) <= p
        assert sorted(order[:p]) == first[0]  # the first group: the first p READY
        assert len({round(ComputeModel("lognormal:mean=0.05,cv=0.5,spread=0.6", 3).mean_of(n), 6)
                    for n in range(5)}) == 5  # per-node means: the workers really ran at different paces
    finally:
        await stop_cluster(sched, tasks)


@pytest.mark.loopback
async def test_bsp_through_the_progress_interface_is_unchanged():
    sched, agents, tasks = await start_cluster(uniform(3), cluster="bsp")
    try:
        js = await asyncio.wait_for(sched.run_job("ring", rounds=3, params=PARAMS, chunk_params=CHUNK,
                                                  compute="constant:0.01"), 60)
        assert [r.round for r in sorted(js.records, key=lambda r: r.round)] == [0, 1, 2]
        # compute_s is the measured sleep: never shorter than the model's 10 ms, longer by a loaded
        # loop's lag; the median over the rounds is judged, so one stalled round cannot fail it
        assert all(r.participants == 3 and r.compute_s >= 0.01 - 1e-3 for r in js.records)
        assert math.isclose(statistics.median(r.compute_s for r in js.records), 0.01, abs_tol=0.05)
        for rec in js.records:
            assert_round_exact(rec, sched.plans[rec.version])
    finally:
        await stop_cluster(sched, tasks)
