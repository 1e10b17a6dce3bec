"""The simulator on hand-made plans with hand-computed answers, plus the large-graph helpers.

Notation in the comments: tau = chunk bytes / link rate, d = one-way delay of one link.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy.sparse import csr_array
from scipy.sparse.csgraph import breadth_first_order

from core.dispatch import Dispatch
from core.maxmin import max_min_rates
from core.plan import ChunkGroup, Job, Plan, make_layout, tree_group
from emulation.link import LinkSpec
from emulation.simnet import sim_network
from emulation.topology import Topology, internet2
from emulation.trace import RateEvent, Trace
from emulation.tracetypes import PORT
from emulation.waxman import crew_mesh, from_spec, waxman
from overlay.routing import Routes, adjacency
from scheduler.planners import netstorm
from sim import MBIT, SimulationStalled, simulate
from wansync.predict import oracle_view

pytestmark = pytest.mark.unit

RATE = 80.0  # Mbit/s = 10 MB/s
DELAY = 0.01
SEG = 65536
MODES = ("exact", "fluid")


def line(nodes: int, rate: float = RATE, delay: float = DELAY) -> Topology:
    links = {}
    for a in range(nodes - 1):
        links[(a, a + 1)] = LinkSpec(rate, delay)
        links[(a + 1, a)] = LinkSpec(rate, delay)
    return Topology("line", nodes, links)


def plan_of(parent: dict[int, int | None], chunks: int = 1, chunk_params: int = 4 * SEG // 4) -> Plan:
    """One tree group over the parent map (broadcast = reversed aggregation tree)."""
    root = next(v for v, p in parent.items() if p is None)
    layout = make_layout(chunks * chunk_params, chunk_params)
    parts = tuple(sorted(parent))
    return Plan(1, "hand", parts, {v: 1.0 for v in parts}, layout,
                (tree_group(range(chunks), root, parent),)).validate()


def tau(plan: Plan, rate: float = RATE) -> float:
    return plan.layout[0][1] * 4 / (rate * MBIT)


@pytest.mark.parametrize("mode", MODES)
def test_one_link_up_and_back(mode):
    plan = plan_of({0: 1, 1: None})
    t = tau(plan)
    pred = simulate(plan, sim_network(line(2)), mode=mode)
    assert pred.mode == mode
    assert pred.node_done_s[1] == pytest.approx(t + DELAY)  # root holds the sum on arrival
    assert pred.node_done_s[0] == pytest.approx(2 * (t + DELAY))  # then it is broadcast back
    assert pred.round_s == pytest.approx(2 * (t + DELAY))
    assert pred.link_bytes == {(0, 1): SEG * 4, (1, 0): SEG * 4}
    assert pred.link_busy_s[(0, 1)] == pytest.approx(t)


@pytest.mark.parametrize("mode", MODES)
def test_chain_store_and_forward_pipelines_chunks(mode):
    # 0 -> 1 -> 2 (root), two chunks. Node 1 forwards chunk c only once it fully arrived, so
    # c0 leaves 1 at tau+d; c1 arrives at 1 at 2tau+d, when (1,2) just freed up: no queueing.
    plan = plan_of({0: 1, 1: 2, 2: None}, chunks=2)
    t, d = tau(plan), DELAY
    pred = simulate(plan, sim_network(line(3)), mode=mode)
    assert pred.node_done_s[2] == pytest.approx(3 * t + 2 * d)
    assert pred.node_done_s[1] == pytest.approx(4 * t + 3 * d)
    assert pred.node_done_s[0] == pytest.approx(5 * t + 4 * d)
    assert pred.link_bytes[(1, 2)] == 2 * SEG * 4


def test_chain_waits_for_slow_child():
    # 0 -> 1 at 40 Mbit/s, 1 -> 2 at 80: node 1 is starved and sends each chunk when it arrives
    topo = line(3).with_rates({(0, 1): RATE / 2})
    plan = plan_of({0: 1, 1: 2, 2: None}, chunks=3)
    t, d = tau(plan), DELAY
    pred = simulate(plan, sim_network(topo), mode="exact")
    # chunk 2 reaches 1 at 3 * 2tau + d, then one tau on (1,2)
    assert pred.node_done_s[2] == pytest.approx(6 * t + d + t + d)


@pytest.mark.parametrize("mode", MODES)
def test_two_flows_share_a_link_and_relay(mode):
    # line 0-1-2, root 0: node 2's chunk is relayed by 1 over (2,1),(1,0) and shares (1,0) with
    # node 1's own chunk, so each runs at half rate: both finish at 2tau. The relayed one arrives
    # a delay and one segment (at its rate R/2) later. The broadcast shares (0,1) the same way.
    plan = plan_of({0: None, 1: 0, 2: 0})
    t, d = tau(plan), DELAY
    seg_t = SEG / (RATE / 2 * MBIT)
    pred = simulate(plan, sim_network(line(3)), mode=mode)
    final = 2 * t + 2 * d + seg_t
    assert pred.node_done_s[0] == pytest.approx(final)
    assert pred.node_done_s[1] == pytest.approx(final + 2 * t + d)
    assert pred.node_done_s[2] == pytest.approx(final + 2 * t + 2 * d + seg_t)
    assert pred.link_bytes[(1, 0)] == 2 * SEG * 4  # its own chunk and the relayed one
    assert pred.link_bytes[(2, 1)] == SEG * 4
    assert pred.link_busy_s[(1, 0)] == pytest.approx(2 * t)


@pytest.mark.parametrize("mode", MODES)
def test_relay_over_sparse_line(mode):
    # only 0 and 2 take part; 1 just forwards (cut-through, one segment of store per relay)
    plan = plan_of({0: None, 2: 0}, chunk_params=SEG // 4 // 2)  # half a segment: relay waits for all of it
    t, d = tau(plan), DELAY
    one_way = t + 2 * d + t
    pred = simulate(plan, sim_network(line(3)), mode=mode)
    assert pred.node_done_s[0] == pytest.approx(one_way)
    assert pred.round_s == pytest.approx(2 * one_way)
    assert set(pred.node_done_s) == {0, 2}
    assert pred.link_bytes == {(2, 1): SEG // 2, (1, 0): SEG // 2, (0, 1): SEG // 2, (1, 2): SEG // 2}


@pytest.mark.parametrize("mode", MODES)
def test_rate_step_mid_transfer(mode):
    plan = plan_of({0: 1, 1: None})
    t, d = tau(plan), DELAY
    trace = Trace((RateEvent(t / 2, 0, 1, RATE / 2),))  # half the bytes at R, the rest at R/2
    pred = simulate(plan, sim_network(line(2), trace), mode=mode)
    assert pred.node_done_s[1] == pytest.approx(t / 2 + t + d)
    assert pred.node_done_s[0] == pytest.approx(1.5 * t + d + t + d)


def test_trace_before_start_is_the_starting_state():
    plan = plan_of({0: 1, 1: None})
    t, d = tau(plan), DELAY
    trace = Trace((RateEvent(1.0, 0, 1, RATE / 4), RateEvent(5.0, 1, 0, RATE / 2)))
    pred = simulate(plan, sim_network(line(2), trace), start_s=2.0)
    assert pred.node_done_s[1] == pytest.approx(2.0 + 4 * t + d)
    assert pred.round_s == pytest.approx(4 * t + d + t + d)


@pytest.mark.parametrize("mode", MODES)
def test_uplink_cap_is_shared(mode):
    # full mesh of 3, node 0 (root) capped at one link's rate: its two broadcasts get half each
    links = {(a, b): LinkSpec(RATE, DELAY) for a in range(3) for b in range(3) if a != b}
    topo = Topology("mesh", 3, links, uplink_mbps={0: RATE})
    plan = plan_of({0: None, 1: 0, 2: 0})
    t, d = tau(plan), DELAY
    pred = simulate(plan, sim_network(topo), mode=mode)
    assert pred.node_done_s[0] == pytest.approx(t + d)
    assert pred.node_done_s[1] == pytest.approx(t + d + 2 * t + d)


@pytest.mark.parametrize("mode", MODES)
def test_a_cap_that_cannot_fill_changes_nothing_and_one_just_below_its_links_binds(mode):
    # node 0 broadcasts on its two links: a cap at their sum or above can never fill (the engine drops
    # it from the max-min, sim/sharing.py), one a little below must still slow both broadcasts
    links = {(a, b): LinkSpec(RATE, DELAY) for a in range(3) for b in range(3) if a != b}
    plan = plan_of({0: None, 1: 0, 2: 0})
    free = simulate(plan, sim_network(Topology("mesh", 3, links)), mode=mode)
    for cap in (2 * RATE, 40 * RATE):
        loose = simulate(plan, sim_network(Topology("mesh", 3, links, uplink_mbps={0: cap})), mode=mode)
        assert loose.node_done_s == pytest.approx(free.node_done_s, rel=1e-12)
    tight = simulate(plan, sim_network(Topology("mesh", 3, links, uplink_mbps={0: 1.5 * RATE})), mode=mode)
    t, d = tau(plan), DELAY
    assert tight.node_done_s[1] == pytest.approx(t + d + t / 0.75 + d)  # each broadcast at 0.75 RATE
    # loose as configured, but a trace tightens it before the broadcasts: it binds from then on
    later = Trace((RateEvent(t / 2, 0, PORT, 1.5 * RATE),))
    traced = simulate(plan, sim_network(Topology("mesh", 3, links, uplink_mbps={0: 40 * RATE}), later), mode=mode)
    assert traced.node_done_s == pytest.approx(tight.node_done_s, rel=1e-9)


def test_zero_rate_for_good_stalls():
    plan = plan_of({0: 1, 1: None})
    trace = Trace((RateEvent(0.0, 0, 1, 0.0),))
    with pytest.raises(SimulationStalled):
        simulate(plan, sim_network(line(2), trace), mode="exact")


def test_max_min_rates_by_hand():
    # flows: A uses r0; B uses r0, r1; C uses r1. cap r0 = 10, r1 = 4 -> B = C = 2, A = 8
    flow = np.array([0, 1, 1, 2])
    res = np.array([0, 0, 1, 1])
    assert max_min_rates(flow, res, np.array([10.0, 4.0]), 3).tolist() == pytest.approx([8, 2, 2])


def random_tree_plan(n: int, chunks: int, seed: int, arity: int = 3) -> Plan:
    """A k-ary tree over a random order of the nodes, the kind that ignores the topology."""
    perm = list(range(n))
    random.Random(seed).shuffle(perm)
    parent = {perm[i]: (None if i == 0 else perm[(i - 1) // arity]) for i in range(n)}
    return plan_of(parent, chunks=chunks, chunk_params=SEG // 4)


def test_fluid_close_to_exact_when_trees_share_links():
    # fluid re-solves shares per time slice from its previous pass's activity: within a few
    # percent of the event-driven engine for one tree (measured +2 % here)
    topo = waxman(20, seed=3)
    plan = random_tree_plan(20, chunks=60, seed=4)
    net = sim_network(topo)
    exact = simulate(plan, net, mode="exact")
    fluid = simulate(plan, net, mode="fluid")
    assert exact.link_bytes == fluid.link_bytes
    assert exact.round_s * 0.97 <= fluid.round_s <= exact.round_s * 1.08


def reference_min_hop_tree(adj: dict[int, set[int]], src: int) -> dict[int, int | None]:
    """The rule written out in pure Python (the router before it used scipy): BFS by layers, each
    layer ranked by (rank of its best predecessor, node id), which orders equal-length paths
    lexicographically."""
    pred: dict[int, int | None] = {src: None}
    rank = {src: 0}
    layer = [src]
    while layer:
        best: dict[int, int] = {}
        for u in layer:
            for v in adj.get(u, ()):
                if v not in pred and (v not in best or rank[u] < rank[best[v]]):
                    best[v] = u
        nxt = sorted(best, key=lambda v: (rank[best[v]], v))
        for i, v in enumerate(nxt):
            pred[v] = best[v]
            rank[v] = i
        layer = nxt
    return pred


def test_min_hop_routes_match_a_reference_bfs():
    for topo in (internet2(), waxman(60, seed=5), waxman(300, seed=9)):
        adj = adjacency(topo.links)
        ours = Routes(adj)
        for a in range(topo.nodes):
            tree = reference_min_hop_tree(adj, a)
            for b in range(topo.nodes):
                path = [b]
                while path[-1] != a:
                    path.append(tree[path[-1]])
                assert ours.route(a, b) == tuple(reversed(path)), (a, b)


def test_waxman_and_crew_generators():
    a, b = waxman(200, seed=7), waxman(200, seed=7)
    assert a.links == b.links and a != waxman(200, seed=8)
    assert 2.7 <= len(a.links) / a.nodes <= 3.6  # mean degree (links are listed both ways)
    assert all(20 <= s.rate_mbps <= 155 and s.delay_s <= 0.05 for s in a.links.values())
    mesh = crew_mesh(12, seed=1)
    assert mesh.full_mesh
    assert {s.rate_mbps for s in mesh.links.values()} <= {25.0 * k for k in range(1, 11)}
    assert from_spec("waxman:50:seed=2").links == waxman(50, seed=2).links


def test_smoke_1000_node_waxman():
    topo = waxman(1000, seed=1)
    a, b = np.array(topo.undirected()).T
    graph = csr_array((np.ones(len(a)), (a, b)), shape=(1000, 1000))
    _, pred = breadth_first_order(graph, 0, directed=False, return_predecessors=True)
    parent = {v: (None if v == 0 else int(pred[v])) for v in range(1000)}
    plan = plan_of(parent, chunks=20, chunk_params=SEG // 4)
    net = sim_network(topo)
    exact = simulate(plan, net, mode="exact")
    assert len(exact.node_done_s) == 1000
    assert exact.round_s > 0
    assert sum(exact.link_bytes.values()) == 2 * 999 * 20 * SEG  # tree edges are links: no relays
    # no two keys share a link, so static shares are exact
    fluid = simulate(plan, net, mode="fluid")
    assert fluid.round_s == pytest.approx(exact.round_s)
    assert fluid.node_done_s == pytest.approx(exact.node_done_s)


# --- NetStorm auxiliary routes: the dispatch the agents' chunk engine sends by (core.dispatch) -----
# Triangle a=0, b=1, c=2, every link both ways at RATE with delay d. An auxiliary transfer is
# relayed cut-through (one flow over both its links, 2d, plus one segment sigma at the relay); its
# hop ack is back one link delay after the first hop got the last byte (d + d after it left).
A, B, C = 0, 1, 2


def triangle() -> Topology:
    return Topology("triangle", 3, {(x, y): LinkSpec(RATE, DELAY) for x in range(3) for y in range(3) if x != y})


def aux_plan(parent: dict[int, int | None], children: dict[int, tuple[int, ...]], chunks: int,
             aux: dict[tuple[int, int], tuple[tuple[int, ...], ...]]) -> Plan:
    root = next(v for v, p in parent.items() if p is None)
    parts = tuple(sorted(parent))
    group = ChunkGroup(tuple(range(chunks)), root, parent, children, aux)
    return Plan(1, "hand", parts, {v: 1.0 for v in parts}, make_layout(chunks * SEG, SEG), (group,)).validate()


def chain_with_aux(aux: bool = True) -> Plan:
    # aggregation c -> a -> b (root), broadcast b -> a and b -> c directly, so that no broadcast
    # shares a link with a's sends; a's edge to b has the auxiliary route a -> c -> b
    return aux_plan({C: A, A: B, B: None}, {B: (A, C)}, 4, {(A, B): ((A, C, B),)} if aux else {})


def test_aux_alternates_with_primary():
    # busy bound 0: every send tries the auxiliary route first; queue length 1: it takes one
    # chunk at a time. Chunk k reaches a from c at (k+1)tau + d.
    #   k=0 at tau+d: aux free -> aux, runs [tau+d, 2tau+d], acked at 2tau+3d, at b 2tau+3d+sigma
    #   k=1 at 2tau+d: aux unacked -> primary [2tau+d, 3tau+d], at b 3tau+2d
    #   k=2 at 3tau+d: aux acked (2d < tau) -> aux [3tau+d, 4tau+d], acked 4tau+3d, at b 4tau+3d+sigma
    #   k=3 at 4tau+d: aux unacked -> primary [4tau+d, 5tau+d], at b 5tau+2d
    # b broadcasts in arrival order, back to back on b->a: 0 at 2tau+3d+sigma, 1 waits for it
    # (3tau+2d < 3tau+3d+sigma), 2 and 3 too: the last ends at 6tau+3d+sigma, lands at 6tau+4d+sigma
    plan = chain_with_aux()
    t, d = tau(plan), DELAY
    sigma = SEG / (RATE * MBIT)
    assert 2 * d < t and d + sigma < t  # the regime the comment walks through
    pred = simulate(plan, sim_network(triangle()), mode="exact",
                    dispatch=Dispatch(primary_busy_bound=0, aux_queue_length=1))
    chunk = SEG * 4
    assert pred.aux_bytes == 2 * chunk
    assert pred.link_bytes == {(C, A): 4 * chunk, (A, B): 2 * chunk, (A, C): 2 * chunk, (C, B): 2 * chunk,
                               (B, A): 4 * chunk, (B, C): 4 * chunk}
    assert pred.node_done_s[B] == pytest.approx(5 * t + 2 * d)
    assert pred.node_done_s[A] == pytest.approx(6 * t + 4 * d + sigma)
    assert pred.round_s == pytest.approx(6 * t + 4 * d + sigma)
    assert pred.link_busy_s[(A, C)] == pytest.approx(2 * t)


def test_aux_unused_when_primary_never_busy():
    # a's chunk k leaves on its primary at (k+1)tau + d, lands at b at (k+2)tau + 2d, and b's
    # broadcasts run back to back: the last lands at 6tau + 3d, with or without auxiliary routes
    t, d = tau(chain_with_aux()), DELAY
    net = sim_network(triangle())
    without = simulate(chain_with_aux(aux=False), net)
    for mode in ("exact", "auto"):
        pred = simulate(chain_with_aux(), net, mode=mode, dispatch=Dispatch(primary_busy_bound=10**6))
        assert pred.mode == "exact"
        assert pred.aux_bytes == 0
        assert pred.round_s == pytest.approx(6 * t + 3 * d)
        assert pred.round_s == without.round_s and pred.node_done_s == without.node_done_s
        assert pred.link_bytes == without.link_bytes
    assert (A, C) not in without.link_bytes


def test_aux_spills_queued_chunks_and_keeps_its_own_fifo():
    # The live engine hands a leaf's chunks out at once and counts queued ones as in transit, so
    # with the defaults (busy bound 2, queue length 5) a's chunks 0, 1 take the primary and 2, 3
    # the auxiliary route a->c->b at t=0. The FIFO key includes the first hop: the auxiliary
    # transfers do not wait behind the primary ones (same flow key a->b, different link).
    #   primary: 0 [0, tau] at b tau+d, 1 [tau, 2tau] at b 2tau+d
    #   aux:     2 [0, tau] at b tau+2d+sigma, 3 [tau, 2tau] at b 2tau+2d+sigma
    # b broadcasts to a with auxiliary route b->c->a (disjoint from a->c->b): 0 at tau+d and 2 at
    # tau+2d+sigma take the primary (0 is unacked until 2tau+3d, so at 2tau+d and 2tau+2d+sigma
    # (sigma < d) the count is 2): 1 and 3 go over c. Primary: 0 [tau+d, 2tau+d], 2 [2tau+d, 3tau+d]
    # lands 3tau+2d; aux: 1 [2tau+d, 3tau+d], 3 [3tau+d, 4tau+d] lands 4tau+3d+sigma.
    plan = aux_plan({A: B, B: None}, {B: (A,)}, 4, {(A, B): ((A, C, B),), (B, A): ((B, C, A),)})
    t, d = tau(plan), DELAY
    sigma = SEG / (RATE * MBIT)
    assert sigma < d and d + sigma < t
    pred = simulate(plan, sim_network(triangle()))
    chunk = SEG * 4
    assert pred.mode == "exact"
    assert pred.aux_bytes == 4 * chunk
    assert pred.link_bytes == {(A, B): 2 * chunk, (A, C): 2 * chunk, (C, B): 2 * chunk,
                               (B, A): 2 * chunk, (B, C): 2 * chunk, (C, A): 2 * chunk}
    assert pred.node_done_s[B] == pytest.approx(2 * t + 2 * d + sigma)
    assert pred.round_s == pytest.approx(4 * t + 3 * d + sigma)
    # without the auxiliary routes b's broadcasts to a are the bottleneck: 5tau + 2d
    plain = simulate(aux_plan({A: B, B: None}, {B: (A,)}, 4, {}), sim_network(triangle()))
    assert plain.round_s == pytest.approx(5 * t + 2 * d)


def test_fluid_refuses_aux_routes():
    with pytest.raises(NotImplementedError):
        simulate(chain_with_aux(), sim_network(triangle()), mode="fluid")


def test_plans_without_aux_unchanged():
    # golden numbers from the simulator before auxiliary dispatch existed (multi-group NetStorm
    # plan on internet2); the dispatch parameters must not matter without auxiliary routes
    topo = internet2().scaled(0.05)
    plan = netstorm.plan(oracle_view(topo), Job(1_140_600, 20_000, tuple(range(9))))
    net = sim_network(topo)
    exact = simulate(plan, net, mode="exact")
    assert exact.round_s == pytest.approx(0.9213374883642216, rel=1e-12)
    assert exact.node_done_s[0] == pytest.approx(0.6541012863440191, rel=1e-12)
    assert sum(exact.link_bytes.values()) == 72998400 and exact.aux_bytes == 0
    fluid = simulate(plan, net, mode="fluid")
    assert fluid.round_s == pytest.approx(1.023090548346651, rel=1e-12)
    assert fluid.node_done_s[0] == pytest.approx(0.8033814052734177, rel=1e-12)
    other = simulate(plan, net, mode="exact", dispatch=Dispatch(primary_busy_bound=0, aux_queue_length=1))
    assert other.round_s == exact.round_s and other.node_done_s == exact.node_done_s


def test_netstorm_aux_plan_dispatches_a_share():
    topo = internet2().scaled(0.05)
    job = Job(1_140_600, 20_000, tuple(range(9)), {"aux": True, "aux_mode": "per_pair_disjoint"})
    plan = netstorm.plan(oracle_view(topo), job).with_version(1).validate(topo.links)
    net = sim_network(topo)
    pred = simulate(plan, net)
    logical = 2 * 8 * plan.params * 4  # every chunk crosses 8 tree edges up and 8 down
    assert pred.mode == "exact"
    assert 0 < pred.aux_bytes < logical
    assert sum(pred.link_bytes.values()) > logical  # relayed bytes count on every link they cross
    never = simulate(plan, net, dispatch=Dispatch(primary_busy_bound=10**6))
    assert never.aux_bytes == 0 and sum(never.link_bytes.values()) == logical


def test_aux_routes_with_one_first_hop_share_a_fifo():
    # Two auxiliary routes a->c->b and a->c->d->b leave on the same link: live they are one FIFO
    # (flow key a->b on link a->c), so they take turns at full rate instead of sharing it.
    # Busy bound 0, queue length 1, three chunks ready at t=0 at leaf a: 0 -> a->c->b, 1 ->
    # a->c->d->b (the first is full), 2 -> primary (both full).
    #   0: [0, tau] lands at b tau+2d+sigma; 1: [tau, 2tau] lands 2tau+3d+2sigma; 2: [0, tau] at tau+d
    # b broadcasts 2 [tau+d, 2tau+d], 0 [2tau+d, 3tau+d], 1 from 2tau+3d+2sigma (2d+2sigma > tau),
    # which lands at a at 3tau+4d+2sigma.
    D = 3
    topo = Topology("mesh4", 4, {(x, y): LinkSpec(RATE, DELAY) for x in range(4) for y in range(4) if x != y})
    plan = aux_plan({A: B, B: None}, {B: (A,)}, 3, {(A, B): ((A, C, B), (A, C, D, B))})
    t, d = tau(plan), DELAY
    sigma = SEG / (RATE * MBIT)
    assert 2 * d + 2 * sigma > t > d + sigma
    pred = simulate(plan, sim_network(topo), dispatch=Dispatch(primary_busy_bound=0, aux_queue_length=1))
    chunk = SEG * 4
    assert pred.aux_bytes == 2 * chunk
    assert pred.link_bytes == {(A, B): chunk, (A, C): 2 * chunk, (C, B): chunk, (C, D): chunk, (D, B): chunk,
                               (B, A): 3 * chunk}
    assert pred.node_done_s[B] == pytest.approx(2 * t + 3 * d + 2 * sigma)
    assert pred.round_s == pytest.approx(3 * t + 4 * d + 2 * sigma)
    assert pred.link_busy_s[(A, C)] == pytest.approx(2 * t)


@pytest.mark.parametrize("mode", MODES)
def test_multicast_plan_through_a_replicating_node(mode):
    # source 0 sends once to 1, which keeps a copy and replicates to 2: the receivers and the
    # replicating node are not members (only the source is), yet they hold and move the bytes.
    layout = make_layout(SEG // 4 * 4, SEG // 4 * 4)
    group = ChunkGroup((0,), 0, {0: None}, {0: (1,), 1: (2,)})
    plan = Plan(0, "mcast-l3", (0,), {0: 1.0}, layout, (group,), receivers=(1, 2))
    t, d = tau(plan), DELAY
    pred = simulate(plan, sim_network(line(3)), mode=mode)
    assert pred.node_done_s[1] == pytest.approx(t + d)
    assert pred.node_done_s[2] == pytest.approx(2 * (t + d))
    assert pred.link_bytes == {(0, 1): SEG * 4, (1, 2): SEG * 4}
