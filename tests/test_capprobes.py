"""The uplink's passive samples (agents/capprobes.py) against a rate this test sets itself."""

import pytest

from agents.capprobes import UP, CapProbes

pytestmark = pytest.mark.unit

RATE = 500_000.0  # bytes/s: a 4 Mbit/s uplink
PIECE = 1500


class LaggingUplink:
    """An uplink writing PIECE bytes every PIECE/RATE s; a tick sees the writes up to its own time, or,
    every other tick, only those up to `lag` before it (a busy loop ran the tick before the writes
    that came due meanwhile)."""

    def __init__(self, lag: float) -> None:
        self.t, self.lag, self.ticks = 0.0, lag, 0

    def visible(self) -> float:
        return self.t - (self.lag if self.ticks % 2 else 0.0)

    def mark(self) -> tuple[float, int]:
        n = int(self.visible() * RATE / PIECE)  # pieces written by then
        return n * PIECE / RATE, n * PIECE


def uplink_samples(lag: float) -> list[list[float]]:
    up = LaggingUplink(lag)
    probes = CapProbes(0, lambda: up.t, up=True, down=False, rx_total=lambda: 0, tx_mark=up.mark,
                       sending=lambda: True, probe_bytes=PIECE, probe_num=1)
    for k in range(400):  # 4 s of ticks, 10 ms apart
        up.t, up.ticks = 0.01 * k, k
        probes.tick()
    return [s for s in probes.take() if s[0] == UP]


@pytest.mark.parametrize("lag", [0.0, 0.03])
def test_uplink_samples_read_the_rate_however_late_the_writes_are_seen(lag):
    """Timed by the writes a tick found, not by the tick: a tick 30 ms ahead of the writes would read
    4 Mbit/s as ~3.5 and ~4.5 by turns (0.25 s samples)."""
    samples = uplink_samples(lag)
    assert len(samples) >= 10
    for _, nbytes, seconds in samples:
        assert nbytes / seconds == pytest.approx(RATE, rel=0.02), samples
