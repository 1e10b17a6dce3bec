"""The scheduler's view: links out of planning while suspected dead or while an end is lost."""

import pytest

from scheduler.view import DisconnectedView, NetworkView

pytestmark = pytest.mark.unit

RING = [(0, 1), (1, 2), (2, 3), (3, 0)]


def test_a_lost_node_takes_its_links_out_until_it_registers_again():
    v = NetworkView(RING)
    v.observe(1, 2, 1_000_000, 0.1)
    v.node_down(1)
    assert (0, 1) not in v.links() and (2, 1) not in v.links()
    assert v.unusable() == [[0, 1], [1, 2]]
    v.require_connected([0, 2, 3])  # the survivors are still joined through 3
    v.add_link(1, 2)  # a neighbour's registration does not bring it back
    assert (1, 2) not in v.links()
    v.node_up(1)
    assert len(v.links()) == 8 and v.unusable() == []
    assert v.g.edges[1, 2]["measured"] and v.rate(1, 2) == 80.0  # what was measured survives


def test_suspicion_and_loss_overlap_in_either_order():
    v = NetworkView(RING)
    assert v.suspend(0, 1)
    v.node_down(1)
    assert v.unusable() == [[0, 1], [1, 2]]
    v.node_up(1)  # 0-1 is still suspected
    assert (0, 1) not in v.links() and (1, 2) in v.links()
    v.node_down(1)
    v.unsuspend(0, 1)  # suspicion over, but node 1 is still lost
    assert (0, 1) not in v.links() and v.unusable() == [[0, 1], [1, 2]]
    v.node_up(1)
    assert len(v.links()) == 8


def test_a_suspicion_that_would_cut_off_a_living_node_is_refused_even_with_a_node_lost():
    v = NetworkView(RING)
    v.node_down(1)
    assert not v.suspend(2, 3)  # 2's only living neighbour is 3
    assert not v.suspend(0, 3)  # 0's only living neighbour is 3
    w = NetworkView([*RING, (0, 2)])
    w.node_down(1)
    assert w.suspend(0, 3)  # 0 keeps 2, and 2 keeps 3


def test_a_loss_trusts_again_the_suspected_links_the_living_need():
    v = NetworkView([*RING, (0, 2)])
    v.observe(2, 3, 1_000_000, 0.1)
    assert v.suspend(2, 3)
    assert v.node_down(0) == [(2, 3)]  # without 0, node 3's only way in is 2-3
    assert (2, 3) in v.links() and v.rate(2, 3) == 80.0 and not v.suspended
    v.require_connected([1, 2, 3])


def test_a_lost_cut_vertex_leaves_no_plan_until_it_returns():
    v = NetworkView([(0, 1), (1, 2)])
    assert v.node_down(1) == []
    with pytest.raises(DisconnectedView):
        v.require_connected([0, 2])
    v.node_up(1)
    v.require_connected([0, 2])
