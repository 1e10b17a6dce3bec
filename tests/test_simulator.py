"""The simulator on hand-made plans with hand-computed answers, plus the large-graph helpers.

Notation in the comments: tau = chunk bytes / link rate, d = one-way delay of one link.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy.sparse import csr_array
from scipy.sparse.csgraph import breadth_first_order

from emulation.link import LinkSpec
from emulation.simnet import MinHopRoutes, sim_network
from emulation.topology import Topology, internet2
from emulation.trace import RateEvent, Trace
from emulation.waxman import crew_mesh, from_spec, waxman
from overlay.routing import Routes
from scheduler.plan import Plan, make_layout, tree_group
from scheduler.simulator import MBIT, SimulationStalled, max_min_rates, simulate

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


def test_min_hop_routes_match_overlay_routing():
    for topo in (internet2(), waxman(60, seed=5)):
        ours = MinHopRoutes(topo.nodes, sorted(topo.links))
        theirs = Routes({n: set(topo.neighbors(n)) for n in range(topo.nodes)})
        for a in range(topo.nodes):
            for b in range(topo.nodes):
                assert ours(a, b) == theirs.route(a, b), (a, b)


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
