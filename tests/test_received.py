"""How a worker applies the models multicast to it (agents/received.py): the newest per sender, only
those within the staleness bound, uniformly weighted with its own."""

import numpy as np
import pytest

from agents.received import Inbox

pytestmark = pytest.mark.unit


def vec(v: float) -> np.ndarray:
    return np.full(4, v, np.float32)


def test_fresh_models_are_summed_with_the_workers_own_and_weighted_uniformly():
    box = Inbox(node=0, staleness=1)
    box.put(1, 5, vec(1.0))
    box.put(2, 4, vec(2.0))  # one behind: within s = 1
    c = box.combine(5, vec(10.0))
    assert c.applied == {1: 5, 2: 4} and c.weight == 3.0
    np.testing.assert_array_equal(c.total, vec(13.0))
    assert box.combine(6, vec(1.0)).applied == {}  # the inbox emptied: nothing applied twice


def test_a_model_older_than_the_bound_is_dropped_unapplied():
    box = Inbox(node=0, staleness=1)
    box.put(1, 3, vec(1.0))  # k - t = 2 > s
    box.put(2, 5, vec(2.0))
    c = box.combine(5, vec(10.0))
    assert c.applied == {2: 5} and c.weight == 2.0 and box.stale_dropped == 1
    np.testing.assert_array_equal(c.total, vec(12.0))
    assert box.stats()["applied"] == [5, 2, 5] and box.stats()["combined"] == [5]


def test_only_the_newest_model_of_a_sender_counts_and_bsp_takes_only_its_round():
    box = Inbox(node=3, staleness=0)
    box.put(1, 2, vec(1.0))
    box.put(1, 1, vec(100.0))  # late and older: ignored
    box.put(3, 2, vec(100.0))  # its own: never
    c = box.combine(2, vec(0.0))
    assert c.applied == {1: 2} and box.superseded == 1
    np.testing.assert_array_equal(c.total, vec(1.0))
    box.put(1, 2, vec(1.0))
    assert box.combine(3, vec(0.0)).applied == {}  # s = 0: a model of the round before is stale
