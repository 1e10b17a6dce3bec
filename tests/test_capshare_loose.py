"""The scheduler's split of node caps (core.capshare) paces no flow for a cap that cannot fill: one at
least the summed rate of its node's links that way (the view's, live; the network's, in the simulator).
Split between many flows, such a cap would only hold each below its own link's share."""

from __future__ import annotations

import pytest

from core.capshare import CapSharing
from core.plan import ChunkGroup, Plan, make_layout
from scheduler.view import NetworkView

pytestmark = pytest.mark.unit


def star_plan() -> Plan:
    """Node 0 sends two classed trees' chunks to 1, 2 and 3 (a broadcast from root 0)."""
    layout = make_layout(2000, 1000)
    agg, bcast = {0: None, 1: 0, 2: 0, 3: 0}, {0: (1, 2, 3)}
    plan = Plan(1, "file", (0, 1, 2, 3), {n: 1.0 for n in range(4)}, layout,
                (ChunkGroup((0,), 0, agg, bcast, own_class=True), ChunkGroup((1,), 0, agg, bcast, own_class=True)),
                receivers=(0, 1, 2, 3))
    plan.validate()
    return plan


def rows(sent: dict) -> dict[tuple[int, int, int], float]:
    return {(tree, a, b): mbps for per in sent.values() for rs in per.values() for tree, a, b, mbps in rs}


@pytest.mark.parametrize("links", [30.0, 100.0])
def test_a_cap_paces_its_flows_only_where_the_links_behind_it_could_fill_it(links):
    cs = CapSharing()
    cs.set_caps(0, 150.0, None)  # node 0's uplink: 150 Mbit/s before three links of `links` each
    sent = rows(cs.start(0, 0, star_plan(), 0.0, lambda a, b: (a, b), lambda node, kind: 3 * links))
    out_of_0 = {k: v for k, v in sent.items() if k[1] == 0}
    if 3 * links <= 150.0:  # 90 Mbit/s of links can never fill 150: no flow is paced for it
        assert out_of_0 == {}
    else:  # 300 Mbit/s of links can: six flows (two trees x three children) share it equally
        assert len(out_of_0) == 6 and all(v == pytest.approx(25.0) for v in out_of_0.values())


def test_the_view_sums_a_nodes_links_each_way():
    view = NetworkView([(0, 1), (1, 0), (0, 2), (2, 0)], nominal_mbps=100.0)
    assert view.links_mbps(0, "up") == pytest.approx(200.0)
    assert view.links_mbps(0, "down") == pytest.approx(200.0)
    assert view.links_mbps(1, "up") == pytest.approx(100.0) and view.links_mbps(2, "down") == pytest.approx(100.0)
    assert view.links_mbps(9, "up") == 0.0
