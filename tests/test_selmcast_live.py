"""SelMcast live: multicast progress models with receiver selection on a big switch, over real TCP with
in-process agents (application shaping, node caps). Every delivery is judged against the source's
exact tensor computed here (tests/helpers/exact.py); SSP's bound is checked from the scheduler's timeline;
a receiver SSP's shrink-only rule drops applies nothing; node caps reach the view, declared and measured."""

import asyncio

import pytest
from helpers.cluster import start_cluster, stop_cluster
from helpers.exact import assert_job_exact, assert_round_exact
from helpers.waiting import until

from emulation.link import LinkSpec
from emulation.topology import Topology, build
from emulation.trace import PORT, RateEvent, Trace

pytestmark = pytest.mark.loopback

PARAMS, CHUNK = 100_000, 10_000
CAP_SAMPLES = 4  # a cap estimate is judged on this many samples at least (see the node caps test)


def caps_mesh(up: list[float], down: list[float], name: str = "caps") -> Topology:
    """A big switch by hand: a full mesh whose links never bind, congestion only at the node caps."""
    n = len(up)
    fast = 4 * max(up + down)
    links = {(a, b): LinkSpec(fast) for a in range(n) for b in range(n) if a != b}
    return Topology(name, n, links, dict(enumerate(up)), dict(enumerate(down)))


@pytest.mark.parametrize("select", ["selmcast", "orpheus"])
async def test_mcast_bsp_rounds_are_exact_in_lockstep_and_logged(select):
    topo = build("bigswitch:5:bw=40:seed=3")
    sched, agents, tasks = await start_cluster(topo, cluster=f"bsp-{select}", shaped=True)
    try:
        js = await asyncio.wait_for(sched.run_job("mcast", rounds=3, params=PARAMS, chunk_params=CHUNK,
                                                  progress="mcast-bsp", progress_options={"select": select}), 90)
        assert_job_exact(sched, js)  # every receiver: the source's exact tensor, as this test computes it
        pol = js.progress
        assert [r.round for r in pol.rounds] == [0, 1, 2] and pol.violations == 0
        recs = {r.task: r for r in js.records}
        for log in pol.rounds:
            assert sorted(log.receivers) == list(range(5)) and all(len(r) >= 2 for r in log.receivers.values())
            assert log.completion_s is not None and log.completion_s > 0
            for tid, src in log.tasks.items():  # each sender's task carries its own round's tensor
                assert recs[tid].members == [src] and recs[tid].iters == {src: log.round}
                assert recs[tid].receivers == sorted(log.receivers[src])
            if select == "orpheus":
                assert all(len(r) == 2 for r in log.receivers.values())  # p = round(0.3 * 5), no forced yet
        for a, b in zip(pol.rounds, pol.rounds[1:], strict=False):  # BSP: round r+1 only after all of r
            assert min(recs[t].t_start for t in b.tasks) >= max(recs[t].t_end for t in a.tasks) - 0.01
        assert [e["round"] for e in sched.timeline if e["kind"] == "mcast_round"] == [0, 1, 2]
    finally:
        await stop_cluster(sched, tasks)
    assert not sched.errors


async def test_mcast_ssp_never_lets_a_worker_run_more_than_ssp_iterations_ahead(tmp_path):
    s, rounds = 1, 8
    trace = tmp_path / "compute.csv"  # node 0 much faster than the others: it meets the bound
    trace.write_text("node,iteration,seconds\n0,0,0.0\n1,0,0.15\n2,0,0.2\n3,0,0.25\n")
    topo = build("bigswitch:4:bw=80:seed=1")
    sched, agents, tasks = await start_cluster(topo, cluster="ssp-bound", shaped=True)
    try:
        js = await asyncio.wait_for(sched.run_job("mcast", rounds=rounds, params=PARAMS // 2, chunk_params=CHUNK,
                                                  progress="mcast-ssp", staleness=s, compute=f"csv:{trace}",
                                                  progress_options={"select": "selmcast"}), 120)
        assert_job_exact(sched, js)
        assert js.progress.violations == 0
        # replay the rule on the scheduler's clock: READY(k) of worker w needs w's own multicast of k - 1
        # over and k <= min_u d_u + 1 + s, d_u the last iteration of u whose multicast was over
        done = {n: -1 for n in range(4)}
        over = sorted((t.recorded_t, n, k) for t in js.tasks.values() for n, k in t.iters.items())
        readies = [(e["t"], e["node"], e["round"]) for e in sched.timeline if e["kind"] == "ready"
                   and e.get("job") == js.job]
        assert len(readies) == 4 * rounds
        ahead, i = [], 0
        for t, node, k in sorted(readies):
            while i < len(over) and over[i][0] <= t:
                done[over[i][1]] = max(done[over[i][1]], over[i][2])
                i += 1
            assert done[node] >= k - 1, f"worker {node} computed {k} before its own multicast of {k - 1} was over"
            ahead.append(k - (min(done.values()) + 1))
        assert max(ahead) <= s and max(ahead) == s  # the bound held, and it was reached
    finally:
        await stop_cluster(sched, tasks)
    assert not sched.errors


async def test_a_receiver_dropped_by_the_shrink_only_rule_stops_receiving_and_applies_nothing(tmp_path):
    """Worker 0 multicasts 2 MB first; Algorithm 2 (p = 1, eta = 0: nothing sticky) lets it take both fast
    downlinks, 2 and 3. Worker 1 becomes ready 0.3 s later; its task takes one of them, so 0's task keeps
    one receiver (at any progress and any tie order: test_selection) and the other is dropped mid-transfer."""
    topo = caps_mesh([32.0, 8.0, 8.0, 8.0], [4.0, 2.0, 8.0, 8.0], "drop")
    trace = tmp_path / "compute.csv"
    trace.write_text("node,iteration,seconds\n0,0,0.0\n1,0,0.3\n2,0,2.0\n3,0,2.0\n")
    params = 500_000
    sched, agents, tasks = await start_cluster(topo, cluster="ssp-drop", shaped=True)
    try:
        js = await asyncio.wait_for(sched.run_job(
            "mcast", rounds=1, params=params, chunk_params=20_000, progress="mcast-ssp", staleness=4,
            compute=f"csv:{trace}", progress_options={"select": "selmcast", "p": 1, "eta": 0.0, "k": None}), 120)
        first = next(r for r in js.records if r.members == [0])
        assert len(first.dropped) == 1 and sorted(first.receivers + first.dropped) == [2, 3], first
        gone, kept = first.dropped[0], first.receivers  # the record's receivers: those still in it
        assert sorted(first.digests) == kept
        assert_round_exact(first, sched.plans[first.version])  # the one kept: node 0's exact tensor
        assert_job_exact(sched, js)
        assert agents[gone].overlay.meters_in[0].bytes < params * 4  # what was on its way stopped
        await until(lambda: not agents[gone].engine.tasks and not agents[gone].engine.held_bytes(),
                    f"node {gone} to let node 0's multicast go")
        assert gone not in js.tasks[first.task].done  # it reported no result of its own
        assert js.progress.tasks[0]["dropped"] == [gone]  # the policy's own record: not delivered (c grows)
    finally:
        await stop_cluster(sched, tasks)
    assert not sched.errors


async def test_node_caps_reach_the_view_declared_and_measured():
    """Node 0's uplink (4 Mbit/s) binds its multicast to 2, node 1's downlink (4 Mbit/s) the one from 2;
    the trace lowers node 2's uplink to 8 Mbit/s 0.2 s into the job, which node 2 declares.

    The view's estimate of a cap is the 0.75 quantile of its latest samples, weighted by their busy
    time, and a short downlink sample that a stalled event loop read in a gulp reads high: judged on
    the two samples that make a cap known, such a sample was the estimate on a loaded machine (5.78
    for 4 Mbit/s). Judged on CAP_SAMPLES samples or more, one short sample weighs under a quarter of
    the busy time and cannot be it; the multicast into node 1 is long enough for them.
    """
    topo = caps_mesh([4.0, 40.0, 40.0], [40.0, 4.0, 40.0])
    trace = Trace((RateEvent(0.2, 2, PORT, 8.0),))
    sched, agents, tasks = await start_cluster(topo, cluster="caps", shaped=True, trace=trace,
                                               probe_bytes=CHUNK * 4 // 2)
    try:
        assert sched.view.cap(0, "up") == 4.0 and not sched.view.cap_known(0, "up")  # registered: nominal
        js = sched.open_tasks("mcast", params=250_000, chunk_params=CHUNK)
        await asyncio.wait_for(sched.run_task(js, (0,), receivers=(2,)), 60)
        await asyncio.wait_for(sched.close_job(js), 30)
        # 7.2 s at 4 Mbit/s: CAP_SAMPLES downlink samples of DOWN_SAMPLE_S busy time, however the loaded
        # receiver's loop cut them (measured there: 0.8-1.1 s each)
        js = sched.open_tasks("mcast", params=900_000, chunk_params=CHUNK)
        await asyncio.wait_for(sched.run_task(js, (2,), receivers=(1,)), 90)
        caps = ((0, "up"), (1, "down"))
        try:
            await until(lambda: all(sched.view.cap_known(*c) and sched.view.caps[c]["n"] >= CAP_SAMPLES for c in caps),
                        f"{CAP_SAMPLES} samples of node 0's uplink and of node 1's downlink")
        except AssertionError as exc:  # say what the view had
            raise AssertionError(f"{exc}: {[sched.view.caps[c]['recent'] for c in caps]}") from None
        assert sched.view.cap(0, "up", "measured") == pytest.approx(4.0, rel=0.1)
        assert sched.view.cap(1, "down", "measured") == pytest.approx(4.0, rel=0.1)
        await until(lambda: sched.view.cap(2, "up") == 8.0, "node 2 to declare its new uplink")
        await asyncio.wait_for(sched.close_job(js), 30)
    finally:
        await stop_cluster(sched, tasks)
    assert not sched.errors


async def test_a_node_declares_a_port_its_trace_moved_at_once_not_at_its_next_report(monkeypatch):
    """A re-plan after a trace moved the ports waits until every node's declaration is in, so each node
    declares a move when it happens: here no periodic report comes during the test (an hour apart, and the
    scheduler told not to count the agents lost for the missing heartbeats), yet node 2's new uplink, 0.1 s
    into the job, reaches the view, and node 1's untouched caps stay as registered."""
    import agents.agent

    monkeypatch.setattr(agents.agent, "REPORT_EVERY_S", 3600.0)
    topo = caps_mesh([40.0, 40.0, 40.0], [40.0, 40.0, 40.0])
    trace = Trace((RateEvent(0.1, 2, PORT, 8.0), RateEvent(0.1, PORT, 2, 12.0)))
    sched, agents_, tasks = await start_cluster(topo, cluster="declare", shaped=True, trace=trace)
    sched.heartbeat_timeout = 3600.0
    try:
        assert sched.view.cap(2, "up") == 40.0
        js = sched.open_tasks("mcast", params=PARAMS, chunk_params=CHUNK)
        await until(lambda: (sched.view.cap(2, "up"), sched.view.cap(2, "down")) == (8.0, 12.0),
                    "node 2 to declare the ports its trace moved")
        assert (sched.view.cap(1, "up"), sched.view.cap(1, "down")) == (40.0, 40.0)
        await asyncio.wait_for(sched.close_job(js), 30)
    finally:
        await stop_cluster(sched, tasks)
    assert not sched.errors


@pytest.mark.parametrize("mode", ["l3", "l7"])
async def test_through_the_switch_node_l3_injects_each_byte_once_and_l7_once_per_receiver(mode):
    """bigswitch:N:switch: node N is the switch, an agent that replicates (L3: the tree src -> N ->
    receivers) or relays (L7: one unicast per receiver over src -> N). Every receiver exact; the
    sender's port (its link to the switch) carries the tensor once (L3) or once per receiver (L7)."""
    topo = build("bigswitch:4:bw=200:seed=1:switch")
    sched, agents, tasks = await start_cluster(topo, cluster=f"switch-{mode}", shaped=True)
    try:
        js = sched.open_tasks("mcast-l3" if mode == "l3" else "mcast", params=PARAMS, chunk_params=CHUNK)
        rec = await asyncio.wait_for(sched.run_task(js, (1,), receivers=(0, 2, 3)), 60)
        assert_round_exact(rec, sched.plans[rec.version])
        plan = sched.plans[rec.version]
        if mode == "l3":
            assert plan.groups[0].children == {1: (4,), 4: (0, 2, 3)} and 4 in rec.aggregators
        sent = agents[1].overlay.senders[4].meter.bytes
        copies = 1 if mode == "l3" else 3
        assert copies * PARAMS * 4 <= sent < copies * PARAMS * 4 * 1.05  # payload, plus frame headers
        await asyncio.wait_for(sched.close_job(js), 30)
    finally:
        await stop_cluster(sched, tasks)
    assert not sched.errors
