"""Link sharing between traffic classes on real sockets: weighted shares, strict priority, deadlines,
per-flow rates, kept by relays too; judged in bytes delivered at the receiver, never by a clock."""

import asyncio
import dataclasses

import pytest
from helpers.cluster import LocalNet, start_cluster, stop_cluster
from helpers.exact import assert_round_exact
from helpers.frames import header
from helpers.shares import shares_at
from helpers.topologies import big_switch, line, shaped_line
from helpers.waiting import until

from core.capshare import Flow, assign
from core.classes import NO_DEADLINE
from core.plan import Job, Plan, PlanError, with_sharing
from overlay.messages import ProtocolError, validate
from scheduler.planners import PLANNERS
from scheduler.view import NetworkView

CHUNK = 128 * 1024
CHUNKS = 24  # per class: 3 MiB, about 0.6 s alone on a 40 Mbit/s link


class ClassSink:
    """Bytes delivered per tree (the class's first field), and what the others held when one completed."""

    def __init__(self, totals: dict[int, int]):
        self.totals = totals
        self.got = dict.fromkeys(totals, 0)
        self.at_done: dict[int, dict[int, int]] = {}  # tree -> everyone's bytes when its last byte came
        self.at_first: dict[int, dict[int, int]] = {}  # tree -> everyone's bytes when its first byte came

    def chunk_buffer(self, h):
        return None

    def chunk_segment(self, h, payload):
        tree = h["cls"][0] if "cls" in h else -1
        if self.got[tree] == 0:
            self.at_first[tree] = dict(self.got)
        self.got[tree] += len(payload)
        if self.got[tree] == self.totals[tree]:
            self.at_done[tree] = dict(self.got)

    def done(self) -> bool:
        return all(self.got[t] == n for t, n in self.totals.items())


def send_class(ov, tree: int | None, *, weight=1.0, prio=0, deadline=NO_DEADLINE, path=(0, 1), rate_Bps=None,
               chunks=CHUNKS, first=0, kind="agg"):
    data = memoryview(bytearray(CHUNK))
    extra = {} if tree is None else {"cls": [tree, weight, prio, deadline]}
    return [ov.send_chunk(header(chunk=first + i, task=0 if tree is None else tree, kind=kind, **extra), data, path,
                          rate_Bps=rate_Bps)
            for i in range(chunks)]


@pytest.mark.loopback
@pytest.mark.parametrize("path", [(0, 1), (0, 1, 2)], ids=["one hop", "relayed"])
async def test_weights_3_to_1_share_the_link_3_to_1_in_bytes(path):
    """Relayed: the bottleneck is the relay's link 1->2, so the relay must keep the classes too."""
    rates = {(0, 1): 40.0} if len(path) == 2 else {(0, 1): 400.0, (1, 2): 40.0}
    async with LocalNet(shaped_line(len(path), rates), shaped=True) as net:
        sink = ClassSink({0: CHUNK * CHUNKS, 1: CHUNK * CHUNKS})
        net.overlays[path[-1]].sink = sink
        if len(path) == 3:
            net.engines[1].open_job(1)  # the relay expects job 1's traffic
        trs = send_class(net.overlays[0], 0, weight=3.0, path=path) + send_class(net.overlays[0], 1, path=path)
        await until(sink.done, "both classes delivered")
        await asyncio.wait_for(asyncio.gather(*(t.done for t in trs)), 30)
        heavy, light = sink.at_done[0][0], sink.at_done[0][1]  # when the heavy class's last byte came
        assert abs(heavy / light / 3 - 1) <= 0.10, sink.at_done


@pytest.mark.loopback
async def test_a_trees_aggregation_and_broadcast_on_one_link_are_two_classes_of_its_weight():
    """Tree packing counts a tree's weight once for each of its stages on a link both use: tree 0
    (weight 1) sends partial sums and final values over 0->1, tree 1 (weight 2) only partial sums, so
    the three flows share 1:1:2 and tree 0 gets half the link (one class for tree 0 would give it a third)."""
    async with LocalNet(shaped_line(2, {(0, 1): 40.0}), shaped=True) as net:
        sink = ClassSink({0: 2 * CHUNK * CHUNKS, 1: CHUNK * CHUNKS})
        net.overlays[1].sink = sink
        ov = net.overlays[0]
        trs = (send_class(ov, 0, kind="agg") + send_class(ov, 0, kind="bcast", first=CHUNKS)
               + send_class(ov, 1, weight=2.0, kind="agg"))
        await until(sink.done, "all three flows delivered")
        await asyncio.wait_for(asyncio.gather(*(t.done for t in trs)), 30)
        tree0, tree1 = sink.at_done[1][0], sink.at_done[1][1]  # when tree 1's last byte came
        assert abs(tree0 / tree1 - 1) <= 0.10, sink.at_done


@pytest.mark.loopback
async def test_strict_priority_starves_the_low_class_while_the_high_one_has_data_and_not_after():
    async with LocalNet(shaped_line(2, {(0, 1): 40.0}), shaped=True) as net:
        sink = ClassSink({0: CHUNK * CHUNKS, 1: CHUNK * CHUNKS})
        net.overlays[1].sink = sink
        low = send_class(net.overlays[0], 0, prio=0)
        # the low class alone first: it has the link
        await until(lambda: sink.got[0] >= 4 * CHUNK, "the low class to send alone")
        high = send_class(net.overlays[0], 1, prio=3)
        await until(lambda: 1 in sink.at_done, "the high class delivered")
        # from the high class's first byte to its last, the low one got at most what was already
        # below the scheduler (in the emulated wire) when the high one arrived
        during = sink.at_done[1][0] - sink.at_first[1][0]
        assert during <= 2 * CHUNK, (during, sink.at_first, sink.at_done)
        assert sink.at_done[1][0] < CHUNK * CHUNKS  # the low class was not finished: it was held back
        await until(sink.done, "the low class to finish once the high one is done")
        await asyncio.wait_for(asyncio.gather(*(t.done for t in low + high)), 30)


@pytest.mark.loopback
async def test_earliest_deadline_goes_first_among_equal_priorities():
    async with LocalNet(shaped_line(2, {(0, 1): 40.0}), shaped=True) as net:
        sink = ClassSink({0: CHUNK * CHUNKS, 1: CHUNK * CHUNKS})
        net.overlays[1].sink = sink
        trs = (send_class(net.overlays[0], 0, weight=5.0, deadline=2000.0)
               + send_class(net.overlays[0], 1, deadline=1000.0))  # later deadline but heavier: EDF wins
        await until(sink.done, "both classes delivered")
        await asyncio.wait_for(asyncio.gather(*(t.done for t in trs)), 30)
        assert sink.at_done[1][0] <= CHUNK, sink.at_done  # the late one waited for the early one


@pytest.mark.loopback
async def test_a_paced_flow_keeps_to_its_rate_and_leaves_the_rest_to_others():
    """A class paced to 4 Mbit/s beside an unpaced one on a 40 Mbit/s link: about a tenth of the
    bytes while both send (unpaced, it would take half)."""
    async with LocalNet(shaped_line(2, {(0, 1): 40.0}), shaped=True) as net:
        sink = ClassSink({-1: CHUNK * CHUNKS, 0: CHUNK * CHUNKS // 2})
        net.overlays[1].sink = sink
        paced = send_class(net.overlays[0], 0, chunks=CHUNKS // 2, rate_Bps=4e6 / 8)
        free = send_class(net.overlays[0], None, first=100)
        await until(lambda: -1 in sink.at_done, "the unpaced class delivered")
        share = sink.at_done[-1][0] / (sink.at_done[-1][0] + sink.at_done[-1][-1])
        assert share <= 0.2, sink.at_done
        await asyncio.wait_for(asyncio.gather(*(t.done for t in paced + free)), 60)


@pytest.mark.unit
@pytest.mark.parametrize("cls, field_bad", [
    ([0, 0.0, 0, NO_DEADLINE], "weight"), ([0, 2e6, 0, NO_DEADLINE], "weight"), ([0, 1.0, 8, NO_DEADLINE], "priority"),
    ([0, 1.0, -1, NO_DEADLINE], "priority"), ([0, 1.0, 0, -5.0], "deadline"), ([0, 1.0, 0], "tree, weight"),
    ([-1, 1.0, 0, NO_DEADLINE], "tree"), ([0, True, 0, NO_DEADLINE], "weight"), ([0, 1.0, 0, float("nan")], "deadline"),
])
def test_a_malformed_traffic_class_is_refused(cls, field_bad):
    h = header(path=[0, 1], hop=0, off=0, total=4, nbytes=4, t_send=0.0, cls=cls)
    with pytest.raises(ProtocolError, match=field_bad) as err:
        validate(h, peer=0)
    assert err.value.field == "cls"
    validate(header(path=[0, 1], hop=0, off=0, total=4, nbytes=4, t_send=0.0, cls=[0, 3.0, 7, 12.5]), peer=0)


@pytest.mark.unit
def test_plan_sharing_is_validated_and_survives_the_wire():
    topo = line(4)
    base = PLANNERS["mst"](NetworkView(topo.links), Job(4000, 1000, (0, 1, 2, 3))).with_version(1)
    g = base.groups[0]
    edge = next((n, p) for n, p in g.parent.items() if p is not None)
    good = dataclasses.replace(base, groups=(dataclasses.replace(g, weight=3.0, priority=2, deadline_s=1.5,
                                                                 rates={edge: 12.0}),))
    good.validate(topo.links)
    back = Plan.from_wire(good.to_wire())
    assert back == good and back.groups[0].classed
    assert "weight" not in base.to_wire()["groups"][0]  # plain round-robin: the wire form is as before
    for bad, why in [({"weight": 0.0}, "weight"), ({"weight": float("inf")}, "weight"), ({"priority": 8}, "priority"),
                     ({"priority": 1.5}, "priority"), ({"deadline_s": 0.0}, "deadline"),
                     ({"rates": {(0, 3): 5.0}}, "not a tree edge"), ({"rates": {edge: -1.0}}, "rate")]:
        with pytest.raises(PlanError, match=why):
            dataclasses.replace(base, groups=(dataclasses.replace(g, **bad),)).validate(topo.links)
    assert all(x.weight == 2.0 and x.priority == 1 for x in with_sharing(base, weight=2.0, priority=1).groups)


@pytest.mark.loopback
async def test_a_classed_plan_sums_exactly_and_its_chunks_carry_their_class():
    """Two trees of one all-reduce weighted 3:1: the round is exact (the harness checks every
    receiver against its own sum) and every chunk on the wire said its tree's class."""
    topo = line(3, rate=200.0)
    async with LocalNet(topo, shaped=True) as net:
        base = PLANNERS["mst"](NetworkView(topo.links), Job(200_000, 10_000, (0, 1, 2))).with_version(1)
        g = base.groups[0]
        half = len(g.chunks) // 2
        plan = dataclasses.replace(base, groups=(
            dataclasses.replace(g, chunks=g.chunks[:half], weight=3.0),
            dataclasses.replace(g, chunks=g.chunks[half:], priority=1, deadline_s=5.0)))
        plan.validate(topo.links)
        seen: list[list] = []
        for ov in net.overlays.values():
            for s in ov.senders.values():
                orig = s.send

                def spy(tr, orig=orig):
                    seen.append(tr.header.get("cls"))
                    orig(tr)
                s.send = spy
        await net.run_round(plan)
        assert seen and all(c is not None for c in seen)
        assert {(c[0], c[1], c[2]) for c in seen} == {(0, 3.0, 0), (1, 1.0, 1)}
        assert all(c[3] == NO_DEADLINE for c in seen if c[0] == 0) and all(c[3] > 0 for c in seen if c[0] == 1)


@pytest.mark.unit
@pytest.mark.parametrize("beside", [{1: 5}, {1: [5]}, {1: [-1, 5]}, {-2: [0, 5]}, {1: [0, 1.5]}])
def test_a_task_done_with_malformed_shares_is_refused(beside):
    h = {"t": "TASK_DONE", "node": 1, "job": 1, "task": 0, "attempt": 0, "version": 1, "ok": True,
         "t_start": 0.0, "t_end": 1.0, "t_compute": 0.0}
    validate(dict(h, beside={3: [0, 4096]}), peer=1)
    with pytest.raises(ProtocolError) as err:
        validate(dict(h, beside=beside), peer=1)
    assert err.value.field == "beside"


# --- where senders meet: a receiver's downlink, shared by the scheduler's per-flow rates -------------------------
@pytest.mark.loopback
async def test_weights_3_to_1_hold_at_a_receivers_downlink_shared_by_two_senders():
    """Two senders, one receiver: no sender sees the other, the scheduler's rates share the cap. Judged
    in bytes node 2 received while both tasks were backlogged: from both past their first 512 KiB (a
    start skew and the first rates through) to the heavy one three quarters through, read at the
    receiver at two instants (over a whole task, a loaded machine's start skew read as share)."""
    sched, agents, tasks = await start_cluster(big_switch(), shaped=True)
    try:
        assert sched.cap_sharing.caps == {(2, "down"): 40.0}  # the agents said their caps
        params = 1 << 21
        js = sched.open_tasks("mcast", params=params, chunk_params=1 << 16, in_flight=4)
        recv = agents[2].engine

        def received() -> dict[int, int]:  # source -> bytes of its task node 2 received so far
            return {st.plan.participants[0]: st.rx_bytes for st in recv.tasks.values()}
        runs = [asyncio.ensure_future(sched.run_task(js, (src,), receivers=(2,), sharing={"weight": w}))
                for src, w in ((0, 3), (1, 1))]
        def both_past(nbytes: int) -> dict[int, int] | None:
            r = received()
            return r if len(r) == 2 and min(r.values()) >= nbytes else None

        def heavy_past(nbytes: int) -> dict[int, int] | None:
            r = received()
            return r if len(r) == 2 and r[0] >= nbytes else None
        first = await until(lambda: both_past(512 * 1024), "both tasks' first 512 KiB at node 2")
        last = await until(lambda: heavy_past(3 * params), "the heavy task three quarters through at node 2")
        heavy, light = await asyncio.wait_for(asyncio.gather(*runs), 60)
        for rec in (heavy, light):
            assert rec.ok
            assert_round_exact(rec, sched.plans[rec.version])  # the source's exact tensor, computed here
        assert heavy.t_end < light.t_end
        h, lt = last[0] - first[0], last[1] - first[1]
        assert abs(h / lt / 3 - 1) <= 0.10, (h, lt, first, last)
        await asyncio.wait_for(sched.close_job(js), 30)
    finally:
        await stop_cluster(sched, tasks)


@pytest.mark.loopback
async def test_priority_at_a_receivers_downlink_holds_the_low_sender_while_the_high_task_runs_and_not_after():
    sched, agents, tasks = await start_cluster(big_switch(), shaped=True)
    try:
        js = sched.open_tasks("mcast", params=1 << 20, chunk_params=1 << 16, in_flight=4)
        low = asyncio.create_task(sched.run_task(js, (1,), receivers=(2,), sharing={"priority": 0}))
        recv = agents[2].engine
        await until(lambda: any(st.rx_bytes >= 512 * 1024 for st in recv.tasks.values()), "the low task to send alone")
        high = await asyncio.wait_for(sched.run_task(js, (0,), receivers=(2,), sharing={"priority": 3}), 60)
        low_rec = await asyncio.wait_for(low, 60)
        for rec in (high, low_rec):
            assert rec.ok
            assert_round_exact(rec, sched.plans[rec.version])
        _, during = shares_at(high, low_rec.task, 2)
        # what the low sender had already written (socket and emulated wire) when it was held
        assert during <= 512 * 1024, during
        assert during < high.bytes / 4
        await asyncio.wait_for(sched.close_job(js), 30)
    finally:
        await stop_cluster(sched, tasks)


@pytest.mark.unit
def test_cap_rates_by_level_then_weight():
    """The scheduler's split of caps, by hand: a priority flow takes what its caps allow first,
    the rest goes 3:1; a lower level at a full cap is held (0)."""
    inf = float("inf")
    flows = [Flow((0, 0, 0, 1, 3), ((3, "down"),), 3.0, (0, inf)),
             Flow((1, 0, 0, 2, 3), ((3, "down"),), 1.0, (0, inf)),
             Flow((2, 0, 0, 4, 3), ((3, "down"), (4, "up")), 1.0, (-1, inf)),
             Flow((3, 0, 0, 5, 6), ((6, "down"),), 1.0, (0, inf)),
             Flow((4, 0, 0, 7, 6), ((6, "down"),), 1.0, (-2, inf))]
    got = assign(flows, {(3, "down"): 100.0, (4, "up"): 30.0, (6, "down"): 50.0})
    assert got == pytest.approx({(2, 0, 0, 4, 3): 30.0, (0, 0, 0, 1, 3): 52.5, (1, 0, 0, 2, 3): 17.5,
                                 (4, 0, 0, 7, 6): 50.0, (3, 0, 0, 5, 6): 0.0})
    # an earlier deadline is a level of its own, before later ones of the same priority
    got = assign([Flow((0, 0, 0, 1, 3), ((3, "down"),), 1.0, (0, 5.0)),
                  Flow((1, 0, 0, 2, 3), ((3, "down"),), 9.0, (0, 9.0))], {(3, "down"): 10.0})
    assert got == pytest.approx({(0, 0, 0, 1, 3): 10.0, (1, 0, 0, 2, 3): 0.0})


@pytest.mark.unit
@pytest.mark.parametrize("rates, why", [([[0, 1, 1, 5.0]], "two nodes"), ([[0, 1, 2, -1.0]], "rate"),
                                        ([[0, 1, 2, float("inf")]], "rate"), ([[0, 1, 2]], "tree, a, b"),
                                        ([[-1, 1, 2, 5.0]], "tree"), ([[0, 1, 1 << 20, 5.0]], "node id")])
def test_malformed_rates_are_refused(rates, why):
    validate({"t": "RATES", "job": 1, "task": 0, "attempt": 0, "rates": [[0, 1, 2, 0.0], [1, 3, 2, 12.5]]}, peer=-1)
    with pytest.raises(ProtocolError, match=why) as err:
        validate({"t": "RATES", "job": 1, "task": 0, "attempt": 0, "rates": rates}, peer=-1)
    assert err.value.field == "rates"


@pytest.mark.unit
async def test_rates_for_tasks_that_never_begin_are_bounded_and_only_this_nodes_flows_are_kept():
    from agents.engine import MAX_RATE_TABLES, ChunkEngine
    from overlay.routing import Routes
    eng = ChunkEngine(1, Routes({0: {1}, 1: {0}}))
    for task in range(MAX_RATE_TABLES + 500):
        eng.set_rates(1, task, 0, [[0, 1, 0, 5.0], [0, 0, 1, 7.0]])
    assert len(eng.rate_tables) == MAX_RATE_TABLES
    assert eng.rate_tables[(1, MAX_RATE_TABLES + 499, 0)] == {(0, 1, 0): 5.0 * 1e6 / 8}  # not node 0's flow


@pytest.mark.unit
def test_trees_of_one_task_at_different_levels_never_hold_each_other_at_a_cap():
    """A plan read from a file may give its trees different priorities: at a cap they take the task's
    most urgent level together (held behind its own other tree, one would wait for its task's end,
    which needs it)."""
    from core.capshare import CapSharing
    from core.plan import ChunkGroup, make_layout
    layout = make_layout(2000, 1000)
    agg = {0: 2, 1: 2, 2: None}
    plan = Plan(1, "file", (0, 1, 2), {0: 1.0, 1: 1.0, 2: 1.0}, layout, (
        ChunkGroup((0,), 2, agg, {}, priority=2, weight=3.0),
        ChunkGroup((1,), 2, agg, {}, priority=0, own_class=True)), receivers=(2,))
    plan.validate()
    cs = CapSharing()
    cs.set_caps(2, None, 40.0)
    sent = cs.start(0, 0, plan, 0.0, lambda a, b: (a, b))
    rows = [r for per in sent.values() for rs in per.values() for r in rs]
    into2 = {(tree, a): mbps for tree, a, b, mbps in rows if b == 2}
    assert into2 == pytest.approx({(0, 0): 15.0, (0, 1): 15.0, (1, 0): 5.0, (1, 1): 5.0})  # 3:1, none held
