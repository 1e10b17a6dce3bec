"""The simulator replaying concurrent tasks (sharing classes, arrivals, multicast, partial reduces) and
driving jobs (BSP, SSP, ready queue), each checked against times worked out by hand.

Notation: C = link rate in bytes/s, B = a task's bytes, d = one-way delay, tau = one chunk's bytes / C.
"""

from __future__ import annotations

import dataclasses

import pytest

from core.compute import ComputeModel
from core.plan import ChunkGroup, Job, Plan, make_layout, tree_group, with_sharing
from emulation.link import LinkSpec
from emulation.topology import Topology
from scheduler.planners import multicast
from sim import MBIT, TaskRun, make_network, simulate, simulate_tasks
from sim.job import Bsp, Queue, Ssp, simulate_job
from wansync.predict import oracle_view

pytestmark = pytest.mark.unit

RATE = 80.0  # Mbit/s
C = RATE * MBIT  # 10 MB/s
SEG = 65536
CHUNK = 250_000  # float32s: 1 MB
B = 10 * CHUNK * 4  # ten chunks: 10 MB, 1 s alone on a link


def line(n: int, rate: float = RATE, delay: float = 0.0, **caps):
    links = {}
    for a in range(n - 1):
        links[(a, a + 1)] = links[(a + 1, a)] = rate
    return make_network(links, {k: delay for k in links}, **caps)


def send(src: int, dst: int, chunks: int = 10, chunk: int = CHUNK) -> Plan:
    """A one-way task: src's tensor to dst (a multicast to one receiver)."""
    layout = make_layout(chunks * chunk, chunk)
    group = ChunkGroup(tuple(range(len(layout))), src, {src: None}, {src: (dst,)})
    return Plan(0, "send", (src,), {src: 1.0}, layout, (group,), receivers=(dst,)).validate()


def ends(pred) -> dict:
    return {k: t.end_s for k, t in pred.tasks.items()}


# --- sharing classes on one link ------------------------------------------------------------------

def test_weights_3_to_1_on_one_link():
    # both backlogged: the heavy one at 3/4 C until its B is through (B / 0.75C = 4/3 s); the light
    # one then has B/3 through and sends the rest at full rate: 4/3 + (2B/3)/C = 2 s
    net = line(2)
    pred = simulate_tasks([TaskRun("heavy", with_sharing(send(0, 1), weight=3.0)),
                           TaskRun("light", with_sharing(send(0, 1), weight=1.0))], net)
    assert ends(pred) == pytest.approx({"heavy": B / (0.75 * C), "light": 2 * B / C})
    assert pred.tasks["heavy"].link_bytes == {(0, 1): B}
    assert pred.link_bytes == {(0, 1): 2 * B}


def test_weights_are_per_class_not_per_flow():
    # class a has two flows on link 0->1 (0->1 and 0->2 via 1), class b one flow, weights 1:1: b gets
    # C/2, a's two flows C/4 each. b (B) ends at 2 s; a's flows have B/2 through then and finish
    # the other B/2 each at C/2 on their own: 2 + 1 = 3 s (the relay's one segment at C/2 on top for 2)
    net = line(3)
    a0 = send(0, 1)
    g = ChunkGroup(a0.groups[0].chunks, 0, {0: None}, {0: (1, 2)}, weight=2.0)
    a = dataclasses.replace(a0, groups=(g,), receivers=(1, 2)).validate()
    b = with_sharing(send(0, 1), weight=2.0)
    pred = simulate_tasks([TaskRun("a", a), TaskRun("b", b)], net)
    assert pred.tasks["b"].end_s == pytest.approx(2 * B / C)
    assert pred.tasks["a"].receiver_done_s[1] == pytest.approx(3 * B / C)
    assert pred.tasks["a"].receiver_done_s[2] == pytest.approx(3 * B / C + SEG / (C / 2))


def test_a_small_transfer_of_an_idle_class_goes_first_whatever_its_weight():
    # start-time fair queuing (overlay.classes): a class idle on the link starts at the link's virtual
    # time, so its one-segment chunk is sent next at C, not at its weight's 1/10 of C (10 S / C)
    net = line(2)
    small = 4096  # float32s: S = 16 KiB, one segment
    s_bytes = small * 4
    pred = simulate_tasks([TaskRun("heavy", with_sharing(send(0, 1), weight=9.0)),
                           TaskRun("light", with_sharing(send(0, 1, chunks=1, chunk=small), weight=1.0), 0.5)], net)
    assert ends(pred) == pytest.approx({"light": 0.5 + s_bytes / C, "heavy": (B + s_bytes) / C})
    # a second chunk of the same class right behind it waits its weighted turn: 1/10 of C
    pred = simulate_tasks([TaskRun("heavy", with_sharing(send(0, 1), weight=9.0)),
                           TaskRun("light", with_sharing(send(0, 1, chunks=2, chunk=small), weight=1.0), 0.5)], net)
    assert pred.tasks["light"].end_s == pytest.approx(0.5 + s_bytes / C + 10 * s_bytes / C)


def test_strict_priority_starves_the_low_class_then_gives_it_all():
    # high: B, low: B/2 on one link. Strict priority: high alone at C (ends B/C), then low at full
    # rate (ends B/C + (B/2)/C). Fair sharing would end low first (at B/C) and high at 1.5 B/C.
    net = line(2)
    pred = simulate_tasks([TaskRun("low", send(0, 1, chunks=5)),
                           TaskRun("high", with_sharing(send(0, 1), priority=3))], net)
    assert ends(pred) == pytest.approx({"high": B / C, "low": 1.5 * B / C})


def test_earliest_deadline_first_then_no_deadline_last():
    # same priority: deadlines are absolute (start + deadline_s). late starts at 0 with 10 s, soon
    # starts at 0.5 s with 1 s (due 1.5 s), none has no deadline. 0..0.5 s: late alone (none comes
    # after every deadline) sends 5 MB; soon then takes the link: ends 1.5 s; late sends its other
    # 5 MB: ends 2 s; none last: 3 s.
    net = line(2)
    pred = simulate_tasks([TaskRun("late", with_sharing(send(0, 1), deadline_s=10.0)),
                           TaskRun("none", with_sharing(send(0, 1), weight=2.0)),
                           TaskRun("soon", with_sharing(send(0, 1), deadline_s=1.0), start_s=0.5)], net)
    assert ends(pred) == pytest.approx({"late": 2.0, "soon": 1.5, "none": 3.0})


def test_rate_cap_paces_one_tree_and_leaves_the_rest():
    # capped at 20 Mbit/s (2.5 MB/s) the capped task takes 4 s; the other gets 60 Mbit/s (7.5 MB/s)
    # meanwhile: ends at B / 7.5 MB/s
    net = line(2)
    g = send(0, 1).groups[0]
    capped = dataclasses.replace(send(0, 1), groups=(dataclasses.replace(g, rates={(0, 1): 20.0}),))
    pred = simulate_tasks([TaskRun("capped", capped), TaskRun("free", send(0, 1))], net)
    assert ends(pred) == pytest.approx({"capped": B / (20 * MBIT), "free": B / (60 * MBIT)})


def test_priority_holds_at_a_receivers_downlink_by_the_schedulers_rates():
    # 0->2 and 1->2 on their own links meet only at 2's downlink (80 Mbit/s), where no sender sees the
    # other: the scheduler's cap rates decide (core.capshare), per task, for classed trees only.
    net = make_network({(0, 2): RATE, (1, 2): RATE}, downlink_mbps={2: RATE})
    high = with_sharing(send(0, 2), priority=5)
    # low unclassed: no rate of its own, so it takes its max-min half of the cap; high gets 40 of its 80
    pred = simulate_tasks([TaskRun("high", high), TaskRun("low", send(1, 2))], net)
    assert ends(pred) == pytest.approx({"high": 2 * B / C, "low": 2 * B / C})
    # low classed: held at 0 while high is in flight, which has the whole cap (B/C), then the cap
    pred = simulate_tasks([TaskRun("high", high), TaskRun("low", with_sharing(send(1, 2)))], net)
    assert ends(pred) == pytest.approx({"high": B / C, "low": 2 * B / C})
    # a planner's rate (20 Mbit/s) is overridden by the scheduler's (0, then 80), as the agents do;
    # without cap rates it paces low and leaves high 60 Mbit/s
    g = send(1, 2).groups[0]
    paced = dataclasses.replace(send(1, 2), groups=(dataclasses.replace(g, rates={(1, 2): 20.0}),))
    pred = simulate_tasks([TaskRun("high", high), TaskRun("low", paced)], net)
    assert ends(pred) == pytest.approx({"high": B / C, "low": 2 * B / C})
    pred = simulate_tasks([TaskRun("high", high), TaskRun("low", paced)], net, cap_rates=False)
    assert pred.tasks["high"].end_s == pytest.approx(B / (60 * MBIT))


# --- the scheduler's cap rates in a big switch: senders meet only at a node cap ----------------------

CAP = 40.0  # Mbit/s: B = 80 Mbit takes 2 s alone at the cap
FASTR = 1000.0  # Mbit/s: links far above the cap


def big_switch(kind: str):
    """0->2 and 1->2 meeting at 2's downlink, or 0->1 and 0->2 leaving through 0's uplink."""
    if kind == "down":
        return make_network({(0, 2): FASTR, (1, 2): FASTR}, downlink_mbps={2: CAP}), ((0, 2), (1, 2))
    return make_network({(0, 1): FASTR, (0, 2): FASTR}, uplink_mbps={0: CAP}), ((0, 1), (0, 2))


@pytest.mark.parametrize("kind", ["down", "up"])
def test_cap_rates_weights_3_to_1_then_the_whole_cap(kind):
    # both in flight: 30 and 10 Mbit/s. heavy's 80 Mbit end at 8/3 s, light has 80/3 through; the
    # scheduler splits again at heavy's end, light alone at 40: the other 160/3 in 4/3 s, ends 4 s
    net, ((a, b), (c, d)) = big_switch(kind)
    tasks = [TaskRun("heavy", with_sharing(send(a, b), weight=3.0)), TaskRun("light", with_sharing(send(c, d)))]
    pred = simulate_tasks(tasks, net)
    assert ends(pred) == pytest.approx({"heavy": 80 / 30, "light": 4.0})
    # without the scheduler's rates the cap's token bucket serves both alike: 20 each, both at 4 s
    assert ends(simulate_tasks(tasks, net, cap_rates=False)) == pytest.approx({"heavy": 4.0, "light": 4.0})


def test_cap_rates_hold_the_low_task_while_the_high_one_runs():
    # low starts alone at 0 with the whole cap: 40 Mbit by 1 s. high starts at 1 s and gets the whole
    # cap: ends 1 + 2 = 3 s; low makes no progress meanwhile, then sends its other 40 Mbit: 4 s.
    # (Shared alike from 1 s, low would end at 3 s and high at 4 s.)
    net, _ = big_switch("down")
    pred = simulate_tasks([TaskRun("low", with_sharing(send(1, 2))),
                           TaskRun("high", with_sharing(send(0, 2), priority=2), start_s=1.0)], net)
    assert ends(pred) == pytest.approx({"low": 4.0, "high": 3.0})


def test_cap_rates_hold_for_the_whole_high_task_not_just_its_flow_at_the_cap():
    # high multicasts B from 0 to 2 (through 2's downlink, 2 s at 40) and to 3 (a 20 Mbit/s link, no
    # cap: 4 s); the scheduler re-splits only at task ends, so low (1->2) stays held until 4 s although
    # high has nothing left for the cap after 2 s: low ends 4 + 2 = 6 s
    net = make_network({(0, 2): FASTR, (1, 2): FASTR, (0, 3): 20.0}, downlink_mbps={2: CAP})
    layout = make_layout(10 * CHUNK, CHUNK)
    group = ChunkGroup(tuple(range(len(layout))), 0, {0: None}, {0: (2, 3)}, priority=1)
    high = Plan(0, "mcast", (0,), {0: 1.0}, layout, (group,), receivers=(2, 3)).validate()
    pred = simulate_tasks([TaskRun("high", high), TaskRun("low", with_sharing(send(1, 2)))], net)
    assert pred.tasks["high"].receiver_done_s == pytest.approx({2: 2.0, 3: 4.0})
    assert pred.tasks["low"].end_s == pytest.approx(6.0)


def test_unclassed_tasks_at_a_cap_get_no_rates_and_share_it_equally():
    # no classed tree: the scheduler assigns nothing; the cap's 40 Mbit/s go 20/20, both end at 4 s
    net, _ = big_switch("down")
    pred = simulate_tasks([TaskRun("a", send(0, 2)), TaskRun("b", send(1, 2))], net)
    assert ends(pred) == pytest.approx({"a": 4.0, "b": 4.0})


# --- arrivals, multicast, partial reduces ---------------------------------------------------------

def test_a_task_arriving_mid_way_shares_from_then_on():
    # two classes of equal weight; b starts at 0.4 s, when a has 4 MB through; then C/2 each: a's
    # other 6 MB end at 0.4 + 1.2 = 1.6 s, b has 6 MB through then and sends 4 MB alone: 2.0 s
    net = line(2)
    pred = simulate_tasks([TaskRun("a", with_sharing(send(0, 1), weight=2.0)),
                           TaskRun("b", with_sharing(send(0, 1), weight=2.0), start_s=0.4)], net)
    assert ends(pred) == pytest.approx({"a": 1.6, "b": 2.0})
    assert pred.tasks["b"].round_s == pytest.approx(1.6)


def test_unclassed_tasks_share_one_fifo_per_route():
    # the default class: one FIFO per (origin, destination), so b's chunks, ready at 0.4 s, queue
    # behind a's (all ready at 0): a ends at B/C, b right after
    net = line(2)
    pred = simulate_tasks([TaskRun("a", send(0, 1)), TaskRun("b", send(0, 1), start_s=0.4)], net)
    assert ends(pred) == pytest.approx({"a": 1.0, "b": 2.0})


@pytest.mark.parametrize("mode", ["l7", "l3"])
def test_multicast_l7_star_and_l3_replication(mode):
    # line 0-1-2, source 0, receivers 1 and 2, one chunk of 4 segments (tau = 4 SEG / C), d per link.
    # l7: unicasts 0->1 and 0->2 (relayed by 1) share link 0->1 at C/2: both take 2 tau, and 2 is one
    #     link and one relayed segment later;
    # l3: 0 sends once to 1, which replicates to 2 (store-and-forward): tau + d, then 2 (tau + d).
    d = 0.01
    topo = Topology("line", 3, {(a, b): LinkSpec(RATE, d) for a, b in ((0, 1), (1, 0), (1, 2), (2, 1))})
    plan = multicast.plan(oracle_view(topo), Job(4 * SEG // 4, 4 * SEG // 4, (0,),
                                                  {"receivers": [1, 2], "mode": mode}))
    tau = 4 * SEG / C
    pred = simulate_tasks([TaskRun("m", plan)], line(3, delay=d))
    done = pred.tasks["m"].receiver_done_s
    if mode == "l7":
        assert done == pytest.approx({1: 2 * tau + d, 2: 2 * tau + 2 * d + SEG / (C / 2)})
        assert pred.link_bytes == {(0, 1): 2 * 4 * SEG, (1, 2): 4 * SEG}
    else:
        assert done == pytest.approx({1: tau + d, 2: 2 * (tau + d)})
        assert pred.link_bytes == {(0, 1): 4 * SEG, (1, 2): 4 * SEG}
    marked = dataclasses.replace(plan, multicast={0: (1, 2)})  # SelMcast's field set: simulated the same
    assert simulate(marked, line(3, delay=d)).node_done_s[2] == pytest.approx(done[2])


def test_partial_reduce_through_a_non_contributing_aggregator():
    # line 0-1-2: members 0 and 2; 1 only sums (it contributes nothing and receives nothing), root 2.
    # One chunk of 4 segments: 0->1 tau + d, 1->2 another tau + d: 2 holds the sum at 2 (tau + d).
    # The result goes 2->0 through relay 1 (cut-through): tau + 2d + one segment more.
    # With 2's own contribution ready only at 1 s, everything after it shifts to 1 s.
    d = 0.01
    layout = make_layout(4 * SEG // 4, 4 * SEG // 4)
    group = ChunkGroup((0,), 2, {0: 1, 1: 2, 2: None}, {2: (0,)})
    plan = Plan(0, "partial", (0, 2), {0: 1.0, 2: 1.0}, layout, (group,)).validate()
    tau = 4 * SEG / C
    pred = simulate_tasks([TaskRun("p", plan)], line(3, delay=d))
    t = pred.tasks["p"]
    assert t.receiver_done_s == pytest.approx({2: 2 * (tau + d), 0: 3 * tau + 4 * d + SEG / C})
    assert t.end_s == pytest.approx(3 * tau + 4 * d + SEG / C)
    assert 1 not in t.node_done_s  # it never holds the result
    late = simulate_tasks([TaskRun("p", plan, ready_s={2: 1.0})], line(3, delay=d)).tasks["p"]
    assert late.receiver_done_s == pytest.approx({2: 1.0, 0: 1.0 + tau + 2 * d + SEG / C})


def test_one_task_replay_equals_simulate():
    net = line(3, delay=0.01)
    plan = Plan(1, "hand", (0, 1, 2), {0: 1.0, 1: 1.0, 2: 1.0}, make_layout(8 * CHUNK, CHUNK),
                (tree_group(range(4), 1, {0: 1, 2: 1, 1: None}), tree_group(range(4, 8), 0, {1: 0, 2: 1, 0: None})))
    one = simulate(plan.validate(), net, mode="exact", start_s=0.25)
    many = simulate_tasks([TaskRun("x", plan, start_s=0.25)], net)
    assert many.tasks["x"].end_s - 0.25 == pytest.approx(one.round_s)
    assert many.tasks["x"].node_done_s == one.node_done_s
    assert many.link_bytes == one.link_bytes


def test_fluid_refuses_what_it_cannot_model_and_auto_picks_exact():
    plan = with_sharing(send(0, 1), priority=2)
    with pytest.raises(NotImplementedError, match="exact"):
        simulate(plan, line(2), mode="fluid")
    assert simulate(plan, line(2)).mode == "exact"


# --- job mode ---------------------------------------------------------------------------------------

def reduce_at_min(members: tuple[int, ...], receivers: tuple[int, ...], params: int = CHUNK) -> Plan:
    """One chunk, summed at the lowest member (a star), sent from there to the other receivers."""
    root = min(members)
    kids = tuple(r for r in receivers if r != root)
    group = ChunkGroup((0,), root, {m: None if m == root else root for m in members}, {root: kids} if kids else {})
    return Plan(0, "star", members, dict.fromkeys(members, 1.0), make_layout(params, params), (group,),
                receivers=receivers).validate()


def tiny(members, receivers):
    return reduce_at_min(members, receivers, 1000)


FAST = make_network({(a, b): 8e6 for a in range(3) for b in range(3) if a != b})  # 4 KB in 4 ns


def per_node(tmp_path, seconds: dict[int, float]) -> ComputeModel:
    path = tmp_path / "compute.csv"
    path.write_text("".join(f"{n},0,{s}\n" for n, s in seconds.items()))
    return ComputeModel(f"csv:{path}")


def test_bsp_job_by_hand():
    # 2 workers on one link, 1 MB (tau = 0.1 s), compute 0.2 s. Round k's task starts once both are
    # READY, at 0.2 + 0.4k: root 0 holds the sum tau later, 1 the result 2 tau later, and each computes
    # on from there; 1 is READY last, so rounds are 0.4 s apart. Within 1.95 s: 0 holds results at
    # 0.3 + 0.4k (k = 0..4), 1 at 0.4 + 0.4k (k = 0..3); the fifth task is under way.
    pred = simulate_job(Bsp(), reduce_at_min, ComputeModel("constant:0.2"), [0, 1], line(2), 1.95)
    assert pred.iterations == {0: 5, 1: 4}
    assert pred.computed == {0: 5, 1: 5}
    assert [t.start_s for t in pred.tasks] == pytest.approx([0.2, 0.6, 1.0, 1.4, 1.8])
    assert [t.end_s for t in pred.tasks[:4]] == pytest.approx([0.4, 0.8, 1.2, 1.6])
    assert pred.tasks[4].end_s is None


@pytest.mark.parametrize(("staleness", "fast_iters"), [(0, 4), (1, 5)])
def test_ssp_job_by_hand(tmp_path, staleness, fast_iters):
    # worker 0 computes 1 s per iteration, worker 1 0.1 s; multicasts take ~0. Slow 0's iterations
    # are done at 1, 2, 3 s. s = 0 (lockstep): 1 does iteration 0 at 0.1, then k at k + 0.1 once 0's
    # k - 1 is done: 0.1, 1.1, 2.1, 3.1 -> 4 by 3.5 s. s = 1: 1 may run one ahead of 0's done count:
    # 0.1, 0.2, then 1.1, 2.1, 3.1 -> 5.
    pred = simulate_job(Ssp(staleness), tiny, per_node(tmp_path, {0: 1.0, 1: 0.1}), [0, 1], FAST, 3.5)
    assert pred.iterations == {0: 3, 1: fast_iters}
    assert all(t.members != t.receivers and len(t.members) == 1 for t in pred.tasks)  # multicasts to the other


def test_queue_job_by_hand(tmp_path):
    # p = 2; computing takes 0.1, 0.2, 0.35 s (workers 0, 1, 2); reduces take ~0. READY order: 0 (0.1),
    # 1 (0.2) -> {0,1}; 0 (0.3), 2 (0.35) -> {0,2}; 1 (0.4), 0 (0.45) -> {0,1}; 0 (0.55), 1 (0.65)
    # -> {0,1}; 2 (0.7), 0 (0.75) -> {0,2}. Within 0.8 s: 0 in 5 reduces, 1 in 3, 2 in 2.
    pred = simulate_job(Queue(2), tiny, per_node(tmp_path, {0: 0.1, 1: 0.2, 2: 0.35}), [0, 1, 2], FAST, 0.8)
    assert [t.members for t in pred.tasks] == [(0, 1), (0, 2), (0, 1), (0, 1), (0, 2)]
    assert [t.start_s for t in pred.tasks] == pytest.approx([0.2, 0.35, 0.45, 0.65, 0.75])
    assert pred.iterations == {0: 5, 1: 3, 2: 2}
    # one round each: 0 and 1 go together; 2, the last to come, goes alone rather than wait for ever
    last = simulate_job(Queue(2), tiny, per_node(tmp_path, {0: 0.1, 1: 0.2, 2: 0.35}), [0, 1, 2], FAST, 1.0,
                        rounds=1)
    assert [t.members for t in last.tasks] == [(0, 1), (2,)]
    assert last.iterations == {0: 1, 1: 1, 2: 1}


def test_ssp_worker_waits_for_its_own_multicast(tmp_path):
    # worker 1 computes 0.1 s, its multicast to 0 takes tau = 0.1 s (1 MB on 80 Mbit/s); 0 computes
    # 10 s, so with s = 5 only 1's own multicasts hold it: one iteration per 0.2 s, done at 0.2, 0.4,
    # ..., 1.0 -> 5 within 1.05 s (computing back to back it would have 6 multicasts over by 0.7 s)
    pred = simulate_job(Ssp(5), reduce_at_min, per_node(tmp_path, {0: 10.0, 1: 0.1}), [0, 1], line(2), 1.05)
    assert pred.iterations == {0: 0, 1: 5}
    assert [t.end_s for t in pred.tasks] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
