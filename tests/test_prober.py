"""Active probes of idle links: which links the scheduler probes, within what budget, that the view learns
them (and re-learns a changed one), and that a probe's bytes never reach a task, let alone a sum."""

import asyncio
import dataclasses

import pytest
from helpers.exact import assert_job_exact
from helpers.topologies import line
from helpers.waiting import until

from agents import probes as agent_probes
from core.plan import Plan, make_layout, tree_group
from emulation.link import LinkSpec
from emulation.topology import Topology, uniform
from overlay.messages import (
    MAX_PROBE_BYTES,
    MAX_PROBE_CHUNK_BYTES,
    MAX_PROBE_CHUNKS,
    PROBE_JOB,
    ProtocolError,
    validate,
)
from overlay.peers import Overlay
from scheduler import prober as prober_mod
from scheduler.planners.onview import link_loads
from scheduler.prober import Prober, busy_links
from scheduler.view import KNOWN_S, NetworkView

MBIT = 1e6 / 8


def star_plan(nodes: int, root: int, params: int = 1000, chunk: int = 250) -> Plan:
    """Every node's chunks straight to `root` and back: a plan over the 2(n-1) links at `root`."""
    parent = {n: (None if n == root else root) for n in range(nodes)}
    layout = make_layout(params, chunk)
    return Plan(1, "star", tuple(range(nodes)), {n: 1.0 for n in range(nodes)}, layout,
                (tree_group(range(len(layout)), root, parent),))


def direct(a: int, b: int) -> tuple[int, ...]:
    return (a, b)


# --- which links a plan keeps busy ------------------------------------------------------------------------------
@pytest.mark.unit
def test_link_loads_count_each_tree_edge_once_per_direction():
    plan = star_plan(4, root=0, params=1000)
    loads = link_loads(plan, direct)
    # 1000 float32 up every child's edge and down again, written out here
    assert loads == {(n, 0): 4000.0 for n in (1, 2, 3)} | {(0, n): 4000.0 for n in (1, 2, 3)}


@pytest.mark.unit
def test_busy_links_are_those_near_the_plans_bottleneck_at_the_views_rates():
    view = NetworkView(uniform(4, rate_mbps=100.0).links)
    for (a, b) in view.links():
        view.g.edges[a, b].update(rate=100.0, measured=True)
    view.g.edges[3, 0]["rate"] = 10.0  # node 3's uplink to the root: the bottleneck
    view.g.edges[1, 0]["rate"] = 25.0  # 40 % of the bottleneck's time: not busy (BUSY_SHARE 0.5)
    view.g.edges[2, 0]["rate"] = 15.0  # 67 %: busy
    busy = busy_links([star_plan(4, 0)], view, direct)
    assert busy == {(3, 0), (2, 0)}


# --- what the prober orders -------------------------------------------------------------------------------------
class Orders:
    """What the prober sent to which agent (instead of a wire)."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, object]] = []
        self.down: set[int] = set()

    def send(self, node: int, msg: object) -> bool:
        if node in self.down:
            return False
        self.sent.append((node, msg))
        return True


def make_prober(view: NetworkView, plans: list[Plan] | None = None, **kw) -> tuple[Prober, Orders]:
    orders = Orders()
    p = Prober(view, send=orders.send, alive=lambda: view.nodes, running=lambda: plans or [],
               route=lambda: direct, **kw)
    return p, orders


def done(p: Prober, order, seconds: float = 0.1, ok: bool = True, now: float = 0.0):
    from overlay.messages import ProbeDone
    p.done(order.src, ProbeDone(node=order.src, id=order.id, dst=order.dst, sent=order.nbytes, seconds=seconds,
                                ok=ok), now=now)


@pytest.mark.unit
def test_a_running_plans_busy_links_are_never_probed_and_unknown_links_come_first():
    view = NetworkView(uniform(4).links)
    for k in [(1, 0), (2, 0), (3, 0), (0, 1), (0, 2), (0, 3)]:  # the star's links: known, loaded
        view.g.edges[k].update(rate=100.0, measured=True, t=0.0)
    p, orders = make_prober(view, [star_plan(4, 0)], at_once=100, budget=1.0)
    seen = set()
    now = 0.0
    for k in range(50):
        now += 0.2
        if k % 10 == 0:  # the star runs: every few seconds each of its links gives a passive sample
            for ln in [(1, 0), (2, 0), (3, 0), (0, 1), (0, 2), (0, 3)]:
                view.observe(*ln, int(100 * MBIT * 0.1), 0.1, now=now)
        for o in p.tick(now):
            seen.add((o.src, o.dst))
            assert (o.src, o.dst) not in {(1, 0), (2, 0), (3, 0), (0, 1), (0, 2), (0, 3)}
            done(p, o, now=now)
    assert seen == {(a, b) for a in (1, 2, 3) for b in (1, 2, 3) if a != b}  # every idle link, none busy
    # each order names the plans in force then (the view bench audits the rule against their bottlenecks)
    assert p.history and {h[4] for h in p.history} == {(1,)}, list(p.history)[:3]


@pytest.mark.unit
def test_a_link_with_a_passive_sample_just_now_is_busy_though_a_misread_link_hides_it():
    """A starved sender's samples read a link tenfold low: that link's time dwarfs the true bottleneck's
    at the view's rates, whose share then falls below BUSY_SHARE. The true bottleneck still gives passive
    samples while the plan keeps it backlogged: it is not probed until they stop for PASSIVE_BUSY_S."""
    view = NetworkView(uniform(4).links)
    for k in view.links():
        view.g.edges[k].update(rate=100.0, measured=True, t=0.0)
    view.g.edges[3, 0]["rate"] = 5.0  # misread: 20 x its true 100
    view.observe(2, 0, int(20 * MBIT * 0.2), 0.2, now=10.0)  # the plan's true bottleneck, 20 Mbit/s
    plan = star_plan(4, 0)
    assert (2, 0) not in busy_links([plan], view, direct)  # what the view's rates alone would say
    p, _ = make_prober(view, [plan], at_once=100, budget=1.0, refresh_s=0.5)  # stale after 0.5 s
    assert (2, 0) not in p.candidates(10.5, {0, 1, 2, 3}, p.busy_now(10.5))
    assert (2, 0) in p.candidates(10.0 + prober_mod.PASSIVE_BUSY_S + 0.1, {0, 1, 2, 3},
                                  p.busy_now(10.0 + prober_mod.PASSIVE_BUSY_S + 0.1))
    for o in p.tick(10.5):
        assert (o.src, o.dst) != (2, 0)


@pytest.mark.unit
def test_a_plan_link_that_stays_unknown_is_probed_once_its_passive_samples_fail_to_come():
    """A plan on nominal rates that moves one chunk a round over a link never gives it a passive sample
    (a busy period's first chunk does not count): busy and unknown for ever, the link kept its nominal
    rate and the plan with it. Unknown BLIND_S after it became busy, it is probed like an idle link;
    a known one stays busy, and so does a link that just became part of a plan."""
    view = NetworkView(uniform(4).links)
    for k in [(1, 0), (0, 1), (0, 2), (0, 3), (3, 0)]:
        view.g.edges[k].update(rate=100.0, measured=True, t=0.0)  # (2, 0) alone stays unknown
    plan = star_plan(4, 0)
    p, orders = make_prober(view, [plan], at_once=100, budget=1.0, refresh_s=1e9)
    assert {(2, 0), (3, 0)} <= p.busy_now(10.0)
    assert (2, 0) in p.busy_now(10.0 + prober_mod.BLIND_S - 0.1)
    later = 10.0 + prober_mod.BLIND_S + 0.1
    assert (2, 0) not in p.busy_now(later) and (3, 0) in p.busy_now(later)
    assert (2, 0) in p.candidates(later, {0, 1, 2, 3}, p.busy_now(later))
    p2, _ = make_prober(view, [], at_once=100, budget=1.0)
    p2.busy_now(later)  # no plan yet: nothing busy since then
    p2.running = lambda: [plan]
    assert (2, 0) in p2.busy_now(later + 1.0)  # busy from when the plan made it so


@pytest.mark.unit
def test_a_plan_link_whose_estimate_predates_a_move_of_its_port_is_probed():
    """A plan link loaded at the view's rate is busy, unless its estimate was taken before a port it
    crosses moved: then its load may be an artefact of the old port (the flipping trace: ring links read
    10 Mbit/s under binding ports kept it for 400 s after the ports loosened, fed too slowly by chords to
    give samples, and mst routed over the chords around them). A passive sample makes it busy again."""
    view = NetworkView(uniform(4).links)
    for node in range(4):
        view.set_cap(node, "up", 50.0)
    for k in view.links():
        view.g.edges[k].update(rate=100.0, measured=True, t=0.0)
    view.g.edges[2, 0].update(rate=10.0, t=8.0)  # the star's slowest link, as the view last saw it
    plan = star_plan(4, 0)
    assert (2, 0) in busy_links([plan], view, direct)
    p, _ = make_prober(view, [plan], at_once=100, budget=1.0, refresh_s=5.0)
    assert (2, 0) in p.busy_now(30.0)  # however old its estimate: busy while no port moved
    view.declare_cap(0, "up", 10_000.0, now=31.0)  # another node's uplink: not a port 2 -> 0 crosses
    assert (2, 0) in p.busy_now(31.5)
    view.declare_cap(2, "up", 10_000.0, now=32.0)  # its sender's uplink loosened
    assert (2, 0) not in p.busy_now(32.5) and (2, 0) in p.candidates(32.5, {0, 1, 2, 3}, p.busy_now(32.5))
    view.observe(2, 0, int(10 * MBIT * 0.2), 0.2, now=33.0)  # a passive sample: the plan keeps it busy
    assert (2, 0) in p.busy_now(33.5)


@pytest.mark.unit
def test_a_link_that_got_four_times_faster_is_relearnt_within_three_probes():
    """A re-probe sized at the old estimate (20 Mbit/s) takes too little busy time at 80 for the receiver
    to make a sample of it (agents/probes.py MIN_SAMPLE_S, the first chunk not counted): nothing would
    ever tell the view. The probe's own time shows the link faster; the next ones are sized for that."""
    view = NetworkView(uniform(2).links)
    for t in range(3):  # idle links, known from probes
        for k in ((0, 1), (1, 0)):
            view.observe(*k, int(20 * MBIT * 0.1), 0.1, now=float(t), probed=True)
    assert view.rate(0, 1) == pytest.approx(20.0)
    p, _ = make_prober(view, at_once=2, budget=1.0, refresh_s=5.0)
    now, probes = 10.0, 0
    while view.rate(0, 1) < 70.0 and probes < 3:
        orders = p.tick(now)
        now += prober_mod.TICK_S
        for o in orders:
            if (o.src, o.dst) != (0, 1):  # 1->0 did not change
                done(p, o, seconds=o.nbytes / (20 * MBIT), now=now)
                continue
            probes += 1
            takes = o.nbytes / (80 * MBIT)  # the link runs at 80 Mbit/s now
            busy = takes * (prober_mod.PROBE_CHUNKS - 1) / prober_mod.PROBE_CHUNKS
            if busy >= agent_probes.MIN_SAMPLE_S:  # what the receiver makes a sample of
                view.observe(0, 1, int(busy * 80 * MBIT), busy, now=now, probed=True)
            done(p, o, seconds=takes, now=now)
        if now > 60.0:
            break
    assert view.rate(0, 1) == pytest.approx(80.0, rel=0.02) and probes <= 3


@pytest.mark.unit
def test_one_probe_per_node_at_a_time_and_at_most_at_once():
    view = NetworkView(uniform(8).links)
    p, _ = make_prober(view, at_once=3, budget=1.0)
    orders = p.tick(1.0)
    assert len(orders) == 3
    ends = [n for o in orders for n in (o.src, o.dst)]
    assert len(ends) == len(set(ends))  # no node twice
    assert p.tick(1.1) == []  # all slots taken until a PROBE_DONE frees one
    done(p, orders[0], now=1.2)
    again = p.tick(1.3)
    assert len(again) == 1 and {again[0].src, again[0].dst}.isdisjoint({n for o in orders[1:] for n in (o.src, o.dst)})


@pytest.mark.unit
def test_the_budget_holds_each_node_to_its_share_of_the_window():
    view = NetworkView(uniform(2).links)
    p, _ = make_prober(view, budget=0.25, at_once=1, refresh_s=0.0)  # it would probe without pause
    now, busy = 0.0, 0.0
    while now < 60.0:
        for o in p.tick(now):
            takes = o.nbytes / (view.rate(o.src, o.dst) * MBIT)  # as long as the link's rate says
            now += takes
            busy += takes
            view.observe(o.src, o.dst, o.nbytes, takes, now=now, probed=True)
            done(p, o, seconds=takes, now=now)
        now += prober_mod.TICK_S
    # nodes 0 and 1 take part in every probe: no 5 s window holds more than a quarter of probing
    assert busy <= 0.25 * 60.0 + 1e-6
    assert busy >= 0.25 * 60.0 * 0.8  # and the budget is used, not wasted


@pytest.mark.unit
def test_a_link_whose_newest_sample_disagrees_is_probed_before_stale_ones():
    view = NetworkView(uniform(3).links)
    for k in view.links():
        view.g.edges[k].update(rate=100.0, measured=True, t=0.0, recent=((100.0, 0.1),))
    view.g.edges[1, 2]["recent"] = ((100.0, 0.1), (50.0, 0.1))  # it may have halved
    p, _ = make_prober(view, at_once=1, budget=1.0, refresh_s=5.0)
    assert p.candidates(10.0, {0, 1, 2}, set())[0] == (1, 2)
    assert p.candidates(1.0, {0, 1, 2}, set()) == [(1, 2)]  # nothing else is stale yet


@pytest.mark.unit
def test_probe_size_follows_the_estimate_and_grows_while_the_link_stays_unknown():
    view = NetworkView(uniform(2).links)
    view.g.edges[0, 1].update(rate=80.0, measured=True)
    p, _ = make_prober(view)
    assert p.probe_bytes(0, 1) == pytest.approx(80 * MBIT * prober_mod.REPROBE_S, rel=0.01)
    (o,) = [o for o in p.tick(0.0) if (o.src, o.dst) == (1, 0)]  # unknown: sized by the known links' rate
    assert o.nbytes == pytest.approx(80 * MBIT * prober_mod.PROBE_S, rel=0.01)
    done(p, o, seconds=0.01, now=0.1)  # it did not make the link known: twice as long next time
    assert p.probe_bytes(1, 0) >= 2 * o.nbytes - 4 * prober_mod.PROBE_CHUNKS
    assert p.probe_bytes(1, 0) <= MAX_PROBE_BYTES


@pytest.mark.unit
def test_a_stranger_done_or_a_failed_probe_frees_nothing_it_should_not():
    view = NetworkView(uniform(2).links)
    p, _ = make_prober(view, at_once=1)
    (o,) = p.tick(0.0)
    other = dataclasses.replace(o, src=o.dst, dst=o.src)
    done(p, other, now=0.1)  # the other end claims it: not its probe
    assert o.id in p.inflight
    done(p, o, ok=False, now=0.2)
    assert not p.inflight and p.stats.failed == 1 and p.stats.done == 0


# --- the view: how it knows, and a change it follows ----------------------------------------------------------
@pytest.mark.unit
def test_the_view_says_how_it_knows_a_link():
    view = NetworkView([(0, 1)])
    assert view.how(0, 1)["how"] == "nominal"
    view.observe(0, 1, int(50 * MBIT * 0.2), 0.2, now=1.0)
    assert view.known(0, 1) and view.how(0, 1)["how"] == "passive" and view.how(0, 1)["t"] == 1.0
    view.observe(0, 1, int(50 * MBIT * 0.2), 0.2, now=2.0, probed=True)
    h = view.how(0, 1)
    assert h["how"] == "probed" and h["samples"] == 2 and h["spread"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.unit
def test_two_agreeing_samples_far_off_move_the_estimate_at_once_one_does_not():
    view = NetworkView([(0, 1)])
    for t in range(5):
        view.observe(0, 1, int(100 * MBIT * 0.1), 0.1, now=t)
    view.observe(0, 1, int(50 * MBIT * 0.1), 0.1, now=5)
    assert view.rate(0, 1) == pytest.approx(100.0)  # one sample may be a late loop's
    view.observe(0, 1, int(50 * MBIT * 0.1), 0.1, now=6)
    assert view.rate(0, 1) == pytest.approx(50.0)  # two that agree: the rate changed
    short = KNOWN_S / 4  # ... but not from samples too short to trust
    view.observe(0, 1, int(200 * MBIT * short), short, now=7)
    view.observe(0, 1, int(200 * MBIT * short), short, now=8)
    assert view.rate(0, 1) == pytest.approx(50.0)


@pytest.mark.unit
def test_where_a_link_has_probed_and_passive_samples_the_probes_decide():
    view = NetworkView([(0, 1)])
    for t in range(4):  # a tree's inner link fed at 20 Mbit/s by its children: reads 20
        view.observe(0, 1, int(20 * MBIT * 0.1), 0.1, now=t)
    assert view.rate(0, 1) == pytest.approx(20.0)
    view.observe(0, 1, int(80 * MBIT * 0.15), 0.15, now=5, probed=True)  # a probe kept it backlogged: 80
    assert view.rate(0, 1) == pytest.approx(80.0) and view.how(0, 1)["how"] == "probed"
    view.observe(0, 1, int(20 * MBIT * 0.1), 0.1, now=6)  # the plan's pace again: not the link's rate
    assert view.rate(0, 1) == pytest.approx(80.0)


# --- the wire's bounds on probes --------------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("fields, field", [
    ({"size": MAX_PROBE_BYTES + 1}, "size"),
    ({"chunks": 0}, "chunks"),
    ({"chunks": MAX_PROBE_CHUNKS + 1}, "chunks"),
    ({"size": MAX_PROBE_CHUNK_BYTES * 2 + 8, "chunks": 2}, "chunks"),
])
def test_a_probe_order_beyond_the_wires_bounds_is_refused(fields, field):
    ok = {"t": "PROBE", "id": 1, "dst": 2, "size": 1 << 20, "chunks": 8}
    validate(ok)
    with pytest.raises(ProtocolError) as e:
        validate({**ok, **fields})
    assert e.value.field == field


@pytest.mark.unit
@pytest.mark.parametrize("change", [{"path": [0, 1, 2]}, {"job": 5}, {"total": MAX_PROBE_CHUNK_BYTES + 4}])
def test_a_probe_frame_crosses_one_link_of_the_probe_job_within_its_size(change):
    h = {"t": "CHUNK", "job": PROBE_JOB, "task": 1, "attempt": 0, "version": 0, "chunk": 0, "kind": "probe",
         "origin": 0, "contributors": b"\0", "t_send": 0.0, "path": [0, 1], "hop": 0, "off": 0, "total": 1024,
         "nbytes": 1024}
    validate(h)
    with pytest.raises(ProtocolError):
        validate({**h, **change})


@pytest.mark.unit
@pytest.mark.parametrize("sample", [[0, 1, 100, 0.1, 2], [0, 1, 100, 0.1, 0.5], [0, 1, 100, 0.1, 1, 1]])
def test_a_reports_probed_flag_is_0_or_1(sample):
    validate({"t": "REPORT", "node": 1, "samples": [[0, 1, 100, 0.1, 1]]})
    with pytest.raises(ProtocolError):
        validate({"t": "REPORT", "node": 1, "samples": [sample]})


# --- a probe's bytes never reach a task ------------------------------------------------------------------------
class Sink:
    """A chunk sink that records every call: a probe must make none."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def chunk_buffer(self, h):
        self.calls.append(f"buffer {h['kind']}")
        return None

    def chunk_segment(self, h, payload):
        self.calls.append(f"segment {h['kind']}")

    def admit_relay(self, h, peer):
        self.calls.append(f"relay {h['kind']}")


@pytest.mark.loopback
async def test_probe_frames_are_counted_timed_and_acknowledged_but_never_reach_the_sink():
    from agents.linkprobe import ProbeSender
    from overlay.messages import Probe

    sinks = [Sink(), Sink()]
    samples = []
    ovs = [Overlay(n, "t", sinks[n], neighbors=[1 - n], on_sample=lambda *s: samples.append(s)) for n in (0, 1)]
    replies = []
    try:
        ports = [await o.listen() for o in ovs]
        for n, o in enumerate(ovs):
            o.connect({1 - n: ("127.0.0.1", ports[1 - n])})
        await ovs[0].wait_connected(10)
        sender = ProbeSender(0, ovs[0], replies.append)
        sender.order(Probe(id=7, dst=1, size=8 * 40_000, chunks=8))
        await until(lambda: replies, "the probe's PROBE_DONE")
        (r,) = replies
        assert r.ok and r.sent == 8 * 40_000 and r.id == 7
        assert ovs[1].meters_in[0].bytes == 8 * 40_000 and ovs[1].meters_in[0].chunks == 8
        assert len(samples) == 8 and all(s[4] is True for s in samples)  # timed, marked as a probe's
        assert sinks[1].calls == []  # never offered to a task, so never summed
        sender.order(Probe(id=8, dst=5, size=1024, chunks=1))  # not a neighbour: said at once
        assert not replies[-1].ok and "not a neighbour" in replies[-1].error
    finally:
        for o in ovs:
            await o.close()


@pytest.mark.loopback
async def test_a_peer_may_hold_only_so_many_probe_chunks_open():
    ov = Overlay(1, "t", Sink(), neighbors=[0])
    h = {"t": "CHUNK", "job": PROBE_JOB, "task": 1, "attempt": 0, "version": 0, "kind": "probe", "origin": 0,
         "contributors": b"\0", "t_send": 0.0, "path": [0, 1], "hop": 0, "off": 0, "total": 1024, "nbytes": 4}
    for c in range(MAX_PROBE_CHUNKS):
        assert ov._on_chunk_header(0, {**h, "chunk": c})[0] == "probe"
    with pytest.raises(ProtocolError):
        ov._on_chunk_header(0, {**h, "chunk": MAX_PROBE_CHUNKS})
    await ov.close()


# --- live: idle links become known, a changed one is re-learnt, every round stays exact -------------------------
def two_speed_mesh() -> Topology:
    """Four nodes, every link shaped to 20 Mbit/s except 0->1 and 1->0 at 80: a ring over them leaves
    most links idle (rates an in-process cluster, four agents on one event loop, keeps up with)."""
    topo = uniform(4, rate_mbps=20.0, delay_s=0.0)
    links = dict(topo.links)
    for k in ((0, 1), (1, 0)):
        links[k] = LinkSpec(80.0, 0.0)
    return dataclasses.replace(topo, links=links)


@pytest.mark.loopback
async def test_idle_links_are_probed_and_known_and_rounds_stay_exact(cluster_of):
    topo = two_speed_mesh()
    # NetStorm's probe size follows the chunk (as `wansync run` sets it): the ring's own chunks are samples too
    c = await cluster_of(topo, "probe1", shaped=True, probe_bytes=10_000)
    sched = c.sched
    job = asyncio.create_task(sched.run_job("ring", rounds=1000, params=50_000, chunk_params=5_000))
    try:
        await until(lambda: sched.view.coverage() == 1.0, "every link known", timeout=60)
        ring = set(link_loads(sched.current.plan, direct))
        idle = [k for k in topo.links if k not in ring]
        assert len(idle) == 8
        for k in idle:  # learnt from probes alone, and right
            assert sched.view.how(*k)["how"] == "probed", k
            assert sched.view.rate(*k) == pytest.approx(topo.links[k].rate_mbps, rel=0.15), k
        assert sched.prober.stats.done > 0 and not sched.prober.stats.failed
        js = await c.stop(job)
    finally:
        job.cancel()
    assert_job_exact(sched, js)  # probes beside the ring's chunks (and their acks) changed no sum


@pytest.mark.loopback
async def test_an_idle_link_whose_rate_changes_is_relearnt(cluster_of):
    from overlay.messages import Emu

    topo = dataclasses.replace(line(3, rate=60.0), links={**line(3, rate=60.0).links, (0, 2): LinkSpec(60.0, 0.0),
                                                           (2, 0): LinkSpec(60.0, 0.0)})
    c = await cluster_of(topo, "probe2", shaped=True)
    sched = c.sched
    await until(lambda: sched.view.known(0, 2), "link 0->2 probed while idle", timeout=60)
    assert sched.view.rate(0, 2) == pytest.approx(60.0, rel=0.1)
    for node in (0, 2):  # the link's shaper at its sender (and its receiver's view of it) run at 20 now
        sched.registry.send_to(node, Emu(op="rate", src=0, dst=2, mbps=20.0))
    await until(lambda: abs(sched.view.rate(0, 2) - 20.0) <= 2.0, "the view to follow 0->2 down to 20 Mbit/s",
                timeout=60)
    assert sched.view.how(0, 2)["how"] == "probed"


@pytest.mark.unit
def test_a_slow_links_big_chunks_make_a_sample_though_reports_flush_between_them():
    """Chunks 94 ms apart (234 KB at 20 Mbit/s) with the agent's report flushing every 0.25 s: each
    flush falls between two chunks, yet the busy period goes on (a flush waits twice its pace)."""
    from agents.probes import LinkProbes

    clock, meter = [0.0], [0]
    probes = LinkProbes(lambda: clock[0], 10_000, 4, rx_bytes=lambda _src: meter[0])
    gap, size = 0.094, 234_372
    for i in range(8):
        clock[0] = 1.0 + i * gap
        meter[0] += size
        probes.sample(0, 2, size, gap + 0.01, True)  # sent before the previous one arrived: contiguous
        clock[0] += gap / 2
        probes.flush()  # the report loop runs between two chunks
    assert probes.samples, "no sample from a probe whose chunks came 94 ms apart"
    src, dst, nbytes, seconds, probed = probes.samples[0]
    assert (src, dst, probed) == (0, 2, 1)
    assert nbytes * 8 / seconds / 1e6 == pytest.approx(size * 8 / gap / 1e6, rel=0.01)


@pytest.mark.unit
def test_short_busy_periods_add_up_only_with_recent_ones():
    """Evidence older than ACC_MAX_AGE_S may describe another rate: it is not mixed into a new sample."""
    from agents.probes import ACC_MAX_AGE_S, LinkProbes

    clock, meter = [0.0], [0]
    probes = LinkProbes(lambda: clock[0], 40_000, 4, rx_bytes=lambda _src: meter[0])  # a 10 KB chunk: 1/4 probe

    def period(start: float, mbps: float) -> None:
        step = 10_000 * 8 / (mbps * 1e6)
        for i in range(12):  # 10 KB chunks back to back: 11 count, 2.75 probes
            clock[0] = start + i * step
            meter[0] += 10_000
            probes.sample(0, 1, 10_000, 1.5 * step)
        clock[0] += 1.0
        probes.flush()

    period(0.0, 40.0)  # at 40 Mbit/s: not a sample yet (2.75 of 4 probes)
    assert not probes.samples
    period(10.0 + ACC_MAX_AGE_S, 10.0)  # much later, at 10 Mbit/s
    period(11.5 + ACC_MAX_AGE_S, 10.0)  # ... and soon after: together one sample, not a 40/10 blend
    assert len(probes.samples) == 1
    _, _, nbytes, seconds = probes.samples[0]
    assert nbytes * 8 / seconds / 1e6 == pytest.approx(10.0, rel=0.02)


@pytest.mark.unit
def test_a_link_that_moved_fourfold_sends_its_nodes_other_links_up_the_queue():
    """A port that loosens moves every link of its node: when one link's estimate moves by NODE_MOVED, the
    other links at its two nodes, sampled before, come before merely stale ones; a small move does not."""
    view = NetworkView(uniform(4).links)
    for k in view.links():
        view.g.edges[k].update(rate=50.0, measured=True, t=0.0, recent=((50.0, 0.1),))
    p, _ = make_prober(view, at_once=1, budget=1.0, refresh_s=5.0)
    everyone = {0, 1, 2, 3}
    assert p.candidates(1.0, everyone, set()) == []  # nothing stale, nothing moved
    view.g.edges[0, 1].update(rate=50.0 * (1 + prober_mod.NODE_MOVED) / 2, t=1.5)  # a move below the factor
    assert p.candidates(2.0, everyone, set()) == []
    view.g.edges[0, 1].update(rate=200.0, t=2.5, recent=((200.0, 0.1),))  # its ports loosened fourfold
    first = p.candidates(3.0, everyone, {(0, 1)})
    at_0_or_1 = {ln for ln in view.links() if ln != (0, 1) and set(ln) & {0, 1}}
    assert set(first) == at_0_or_1  # (2, 3) touches neither node: it waits for refresh_s
    view.g.edges[1, 0].update(t=3.5)  # sampled after the move: known afresh, no longer wanted
    assert (1, 0) not in p.candidates(4.0, everyone, {(0, 1)})


@pytest.mark.unit
def test_a_port_that_moved_makes_its_links_samples_history_and_its_idle_links_wanted():
    """Samples of a link taken while its node's port bound are a share of that port: once the node
    declares the port moved (a trace loosened it), the link's next sample replaces them, even a short
    one the long old ones would outweigh; links through the node's other port keep theirs. Its idle
    links come before merely stale ones. (The auto bench's flipping trace kept ring links at their
    10 Mbit/s share of binding ports after the ports loosened to 10 Gbit/s.)"""
    view = NetworkView(uniform(3).links)
    for node in range(3):
        for kind in ("up", "down"):
            view.set_cap(node, kind, 50.0)
    for k in view.links():
        for t in range(4):  # 10 Mbit/s: a share of the binding ports, in samples of 0.5 s
            view.observe(*k, int(10 * MBIT * 0.5), 0.5, now=t)
    short = 0.8 * KNOWN_S  # what a scheme moving a little over a fast link gives (0.044 s seen)
    view.observe(0, 1, int(200 * MBIT * short), short, now=5)
    assert view.rate(0, 1) == pytest.approx(10.0)  # outweighed while the port stays as it was
    view.declare_cap(0, "up", 52.0, now=6)  # within MOVED: nothing happens
    view.observe(0, 1, int(200 * MBIT * short), short, now=7)
    assert view.rate(0, 1) == pytest.approx(10.0)
    p, _ = make_prober(view, at_once=1, budget=1.0, refresh_s=100.0)
    assert p.candidates(8.0, {0, 1, 2}, set()) == [(0, 1)]  # only the one whose newest sample disagreed
    view.declare_cap(0, "up", 10_000.0, now=9)  # the uplink loosened
    assert {(0, 2), (1, 0), (2, 0)} <= set(p.candidates(9.5, {0, 1, 2}, set()))  # node 0's idle links are wanted
    assert (1, 2) not in p.candidates(9.5, {0, 1, 2}, set())  # at neither node: waits for refresh_s
    view.observe(0, 1, int(200 * MBIT * short), short, now=10)
    assert view.rate(0, 1) == pytest.approx(200.0) and view.known(0, 1)  # the new port's sample decides
    view.observe(1, 0, int(200 * MBIT * short), short, now=10)  # into node 0: its downlink did not move
    assert view.rate(1, 0) == pytest.approx(10.0)


@pytest.mark.unit
def test_a_link_sampled_as_a_share_of_a_binding_port_keeps_what_it_carried_alone_for_predictions():
    """Under a binding port a link delivers its share: the view says so (`rate`), but the simulator, which
    applies the ports itself, is given what the link carried when no port bound it (`capacity`), so
    another plan's use of the link is predicted right. Samples no port bound teach both."""
    from scheduler.planners.onview import view_network

    view = NetworkView(uniform(3).links)
    for node in range(3):
        for kind in ("up", "down"):
            view.set_cap(node, kind, 10_000.0)  # loose ports
    for t in range(3):  # alone and unbound: 200 and 10 Mbit/s
        view.observe(0, 1, int(200 * MBIT * 0.25), 0.25, now=10 * t)
        view.observe(0, 2, int(10 * MBIT * 0.25), 0.25, now=10 * t + 5)
    assert view.capacity(0, 1) == pytest.approx(200.0) and view.capacity(0, 2) == pytest.approx(10.0)
    # the ports bind: the receiver's report of two shares comes in before the senders declare it
    view.observe(0, 1, int(25 * MBIT * 0.25), 0.25, now=99.6)
    view.observe(0, 1, int(25 * MBIT * 0.25), 0.25, now=99.8)
    for node in range(3):
        for kind in ("up", "down"):
            view.declare_cap(node, kind, 50.0, now=100)
    assert view.capacity(0, 1) == pytest.approx(200.0)  # samples so close to the move were not the link's
    for t in range(4):  # 0 -> 1 and 0 -> 2 busy together through node 0's 50 Mbit/s uplink: 25 each
        view.observe(0, 1, int(25 * MBIT * 0.25), 0.25, now=101 + t)
        view.observe(0, 2, int(25 * MBIT * 0.25), 0.25, now=101.1 + t)
    assert view.rate(0, 1) == pytest.approx(25.0)  # what it delivers there
    assert view.capacity(0, 1) == pytest.approx(200.0)  # ... and what it carries alone
    assert view_network(view).rates_mbps[(0, 1)] == pytest.approx(200.0)
    for t in range(3):  # 1 -> 2 alone, well below its port: a sample of the link itself
        view.observe(1, 2, int(30 * MBIT * 0.25), 0.25, now=110 + t)
    assert view.capacity(1, 2) == pytest.approx(30.0) == view.rate(1, 2)


@pytest.mark.unit
@pytest.mark.parametrize("port_mbps", [49.0, 20.0], ids=["port-full", "port-with-room"])
def test_a_port_that_ran_full_makes_its_links_samples_shares(port_mbps):
    """The port's own samples (all its links together) say whether it bound, where the neighbours'
    samples are not in yet (their receivers report later): a link read at 16 Mbit/s beside a full
    50 Mbit/s uplink delivered a share and keeps what it carried alone; beside one with room, 16 is
    its own rate."""
    view = NetworkView(uniform(3).links)
    for kind in ("up", "down"):
        view.set_cap(0, kind, 50.0)
    for t in range(3):
        view.observe(0, 1, int(40 * MBIT * 0.25), 0.25, now=float(t))
    assert view.capacity(0, 1) == pytest.approx(40.0)
    for t in (10.0, 10.3, 10.6):
        view.observe_cap(0, "up", int(port_mbps * MBIT * 0.25), 0.25, now=t - 0.1)
        view.observe(0, 1, int(16 * MBIT * 0.25), 0.25, now=t)
    assert view.rate(0, 1) == pytest.approx(16.0)
    assert view.capacity(0, 1) == pytest.approx(40.0 if port_mbps == 49.0 else 16.0)


@pytest.mark.unit
def test_what_a_link_carries_is_never_below_what_it_delivers():
    """An estimate from samples no port bound can be history: one low sample (a plan that fed the link
    slowly), then newer ones that came while a port moved (quarantined) are no evidence of the link
    alone, yet it delivered 200 Mbit/s through them. Its capacity is at least that: a link carries no
    more than it can (the flipping trace: one 59 Mbit/s sample taken 9 s before kept mst out)."""
    view = NetworkView(uniform(3).links)
    for node in range(3):
        for kind in ("up", "down"):
            view.set_cap(node, kind, 10_000.0)
    view.observe(0, 1, int(59 * MBIT * 0.1), 0.1, now=1.0)
    view.observe(0, 1, int(59 * MBIT * 0.1), 0.1, now=1.2)
    assert view.capacity(0, 1) == pytest.approx(59.0)
    for node in range(3):  # a trace resets the ports: what comes now may have run under either
        view.declare_cap(node, "up", 50.0, now=10.0)
        view.declare_cap(node, "up", 10_000.0, now=10.1)
    for t in (10.2, 10.4, 10.6):
        view.observe(0, 1, int(200 * MBIT * 0.1), 0.1, now=t)
    assert view.rate(0, 1) == pytest.approx(200.0)
    assert view.capacity(0, 1) == pytest.approx(200.0)


@pytest.mark.unit
def test_a_plan_link_let_be_probed_for_its_old_estimate_still_fills_its_port():
    """A plan link whose estimate predates a move of its port may be probed itself, but the plan's bytes
    cross that port all the same: once the port binds, no probe leaves through it (on the flipping trace
    a probe out of a node whose uplink had just bound slowed the first rounds of the ring auto switched to)."""
    view = NetworkView(uniform(4).links)
    for k in view.links():
        view.g.edges[k].update(rate=100.0, measured=True, t=0.0)
    for node in range(4):
        view.set_cap(node, "up", 10_000.0)
    p, _ = make_prober(view, [star_plan(4, 0)], at_once=100, budget=1.0, refresh_s=1.0)
    everyone = {0, 1, 2, 3}
    assert (2, 1) in p.candidates(5.0, everyone, p.busy_now(5.0))  # a loose uplink has room for a probe
    view.declare_cap(2, "up", 50.0, now=10.0)  # node 2's uplink binds; the estimate of 2 -> 0 is older
    busy = p.busy_now(10.5)
    assert (2, 0) not in busy  # exempt for itself...
    assert not [ln for ln in p.candidates(10.5, everyone, busy) if ln[0] == 2]  # ... but its port is full


@pytest.mark.unit
def test_a_port_is_full_by_what_its_plan_links_carry_alone_not_by_their_shares_of_it():
    """Under a binding port a plan link delivers a share of it (here 20 of a 50 Mbit/s uplink, under half
    the cap) though it carries 200 alone: the plan fills the port, and no probe leaves through it."""
    view = NetworkView(uniform(4).links)
    for k in view.links():
        view.g.edges[k].update(rate=100.0, measured=True, t=0.0)
    view.g.edges[2, 0].update(rate=20.0, capacity=200.0)
    for node in range(4):
        view.set_cap(node, "up", 50.0)
    p, _ = make_prober(view, [star_plan(4, 0)], at_once=100, budget=1.0, refresh_s=1.0)
    busy = p.busy_now(10.0)
    assert (2, 0) in busy and (2, "up") in p.busy_ports(busy)
    assert not [ln for ln in p.candidates(10.0, {0, 1, 2, 3}, busy) if ln[0] == 2]


@pytest.mark.unit
def test_no_probe_goes_through_a_capped_port_that_a_plans_busy_links_fill():
    """Under node caps a probe on an idle link takes its bytes from the plan's share of the ports it
    crosses: a link out of a node whose capped uplink the busy links fill, or into one whose capped
    downlink they fill, is not probed; a port with room (a loose cap) or without a cap is."""
    view = NetworkView(uniform(4).links)
    for k in view.links():
        view.g.edges[k].update(rate=50.0, measured=True, t=0.0, recent=((50.0, 0.1),))
    for node in range(4):
        for kind in ("up", "down"):
            view.set_cap(node, kind, 50.0)
    p, _ = make_prober(view, at_once=1, budget=1.0, refresh_s=1.0)
    everyone = {0, 1, 2, 3}
    busy = {(0, 1)}  # a plan fills 0's uplink and 1's downlink
    assert p.busy_ports(busy) == {(0, "up"), (1, "down")}
    open_ = p.candidates(10.0, everyone, busy)
    assert open_ and not [ln for ln in open_ if ln[0] == 0 or ln[1] == 1]
    assert (1, 0) in open_ and (2, 3) in open_
    view.declare_cap(0, "up", 10_000.0)  # the uplink loosened: its share is small now
    assert (0, 2) in p.candidates(10.0, everyone, busy)
    assert (2, 1) not in p.candidates(10.0, everyone, busy)
    uncapped = NetworkView(uniform(4).links)
    for k in uncapped.links():
        uncapped.g.edges[k].update(rate=50.0, measured=True, t=0.0, recent=((50.0, 0.1),))
    q, _ = make_prober(uncapped, at_once=1, budget=1.0, refresh_s=1.0)
    assert q.busy_ports(busy) == set() and (0, 2) in q.candidates(10.0, everyone, busy)
