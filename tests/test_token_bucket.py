"""Token bucket on a fake clock: exact long-run rate and the burst bound, no wall-clock assertions."""

import pytest

from emulation.token_bucket import MIN_BURST, TokenBucket, burst_for

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    async def sleep(self, dt):
        self.now += dt


@pytest.mark.parametrize("rate", [5e6 / 8, 50e6 / 8, 500e6 / 8])
async def test_long_run_rate_is_exact(rate):
    clk = FakeClock()
    b = TokenBucket(rate, clock=clk, sleep=clk.sleep)
    piece = b.burst
    sent = 0
    while clk.now < 10.0:
        await b.consume(piece)
        sent += piece
    # everything sent by time T is at most burst + rate*T and at least rate*T - one piece
    assert rate * clk.now - piece <= sent - b.burst <= rate * clk.now + 1e-6


async def test_oversleeping_loses_no_rate():
    clk = FakeClock()

    async def late_sleep(dt):
        clk.now += dt + 0.0007  # the event loop wakes us late every time

    b = TokenBucket(1e6, clock=clk, sleep=late_sleep)
    sent = 0
    while clk.now < 20.0:
        await b.consume(b.burst)
        sent += b.burst
    assert sent / clk.now == pytest.approx(1e6, rel=0.01)


async def test_burst_bound_holds_in_every_window():
    clk = FakeClock()
    rate = 10e6
    b = TokenBucket(rate, clock=clk, sleep=clk.sleep)
    log = []
    for _ in range(2000):
        await b.consume(4096)
        log.append((clk.now, 4096))
    for i in range(0, len(log), 97):
        t0 = log[i][0]
        for j in range(i, len(log)):
            window = log[j][0] - t0
            sent = sum(n for _, n in log[i:j + 1])
            assert sent <= b.burst + rate * window + 4096


def test_burst_rule():
    assert burst_for(1e3) == MIN_BURST
    assert burst_for(500e6 / 8) == int(0.002 * 500e6 / 8)


async def test_no_single_write_above_the_burst():
    b = TokenBucket(1e6)
    with pytest.raises(ValueError, match="exceeds the burst"):
        await b.consume(b.burst + 1)


async def test_rate_change_takes_effect_mid_transfer():
    clk = FakeClock()
    b = TokenBucket(1e6, clock=clk, sleep=clk.sleep)
    sent = 0
    while clk.now < 5.0:
        await b.consume(b.burst)
        sent += b.burst
    b.set_rate(4e6)
    t0, s0 = clk.now, sent
    while clk.now < 10.0:
        await b.consume(b.burst)
        sent += b.burst
    assert (sent - s0) / (clk.now - t0) == pytest.approx(4e6, rel=0.01)


def test_rejects_nonpositive_rate():
    with pytest.raises(ValueError):
        TokenBucket(0)


async def test_reserve_keeps_early_writes_within_the_burst_bound():
    """A writer that may write `reserve_s` early still never exceeds burst_for(rate) + rate*t."""
    clk = FakeClock()
    rate = 100e6 / 8
    b = TokenBucket(rate, reserve_s=0.0005, clock=clk, sleep=clk.sleep)
    assert b.burst == burst_for(rate) - int(0.0005 * rate)
    due = [b.delay_for(b.burst) for _ in range(500)]  # release times, scheduled ahead (clock frozen)
    early = [d - 0.0005 for d in due]
    for i, t0 in enumerate(early):
        for j in range(i, min(i + 50, len(early))):
            assert (j - i + 1) * b.burst <= burst_for(rate) + rate * (early[j] - t0) + 1e-6
