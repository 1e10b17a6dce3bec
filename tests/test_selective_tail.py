"""The end of a selective-reduce job (core/selective.py): once nobody else can come, the workers still
queued sync together, also when exactly p are left and the paper's trigger waits for more than p."""

import pytest

from core.selective import Controller, SelectiveConfig

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("scheme", ["sr", "pa", "pr"])
def test_the_last_p_queued_go_once_the_others_are_gone(scheme):
    c = Controller(SelectiveConfig(scheme=scheme, p=3, dt=0.01, v_mbit=1.0, warm=False), range(4),
                   dict.fromkeys(range(4), 100.0))
    assert c.lost(3, 0.5) == []  # three still training: nothing queued yet
    launched = c.ready(0, 0, 1.0) + c.ready(1, 0, 1.1)
    assert launched == []  # worker 2 may still come
    launched = c.ready(2, 0, 1.2)  # p queued and nobody else left: under the strict trigger (> p) too
    assert [sorted(L.members) for L in launched] == [[0, 1, 2]]
