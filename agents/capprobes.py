"""Passive measurement of this node's caps (a big switch's ports): what all of its traffic moved while busy.

No probe traffic, as for links (probes.py). Downlink: every chunk arriving here, from any neighbour,
feeds one busy-period tracker keyed (PORT, node) — the same rules as a link's (a chunk continues the
period if its sender stamped it before the previous chunk, from anyone, had arrived; the first
chunk's bytes are not counted, so no token bucket's burst reads as rate), counting the bytes of the
overlay's receive meters of all links together. Uplink: the sender's side, ticked every TICK_S: while
any of this node's links has data waiting (its shapers' backlog count, on both backends), the bytes
its links wrote to the wire, from the third tick that found it busy (the bucket's burst is through by
then; not counted) to the last, over the time between the writes those ticks found latest — not the
ticks' own times: a tick that a busy loop runs before the writes that came due meanwhile would count
their time without their bytes, and the next sample their bytes without their time (on a loaded
machine, 4 Mbit/s read 3.6 and 4.4 by turns). Samples cover CAP_SAMPLE_S of busy time at least
and go out as [kind, bytes, seconds] (kind 0 = uplink, 1 = downlink) in the REPORT's `caps`.

An aggregate reaches the cap only while the cap binds; the scheduler's view keeps a high quantile of
a cap's latest samples (scheduler/view.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from .looplag import IDLE_TICK_S
from .probes import MIN_PERIOD_S, SAMPLE_S, LinkProbes

TICK_S = 0.01
CAP_SAMPLE_S = 0.15  # busy time per uplink sample: a tick's grain (10 ms) is a few % of it
# ... per downlink sample: a throttled receiver reads in gulps (a 64 KiB read is 80 ms at 6 Mbit/s)
DOWN_SAMPLE_S = 0.6
SKIP_TICKS = 2  # a busy period counts from its third tick: a cap's burst (16 KiB: 13 ms at 10 Mbit/s) is through
UP, DOWN = 0, 1
PORT = -1


class CapProbes:
    def __init__(self, node: int, now: Callable[[], float], *, up: bool, down: bool, rx_total: Callable[[], int],
                 tx_mark: Callable[[], tuple[float, int]], sending: Callable[[], bool], probe_bytes: int,
                 probe_num: int) -> None:
        """up/down: whether the node has that cap; rx_total: bytes received over all links so far (the
        overlay's meters); tx_mark: (when the latest piece was written, bytes written over all links so
        far); sending: some link of this node has data waiting."""
        self.node, self.now = node, now
        self.up, self.down = up, down
        self.tx_mark, self.sending = tx_mark, sending
        self._down = LinkProbes(now, probe_bytes, probe_num, rx_bytes=lambda _src: rx_total(),
                                min_sample_s=DOWN_SAMPLE_S)
        self._period: list[float] | None = None  # uplink: [start, last, bytes at start, bytes at last] (write times)
        self._acc = [0.0, 0.0]  # uplink bytes, seconds not yet a sample
        self._busy_ticks = 0  # consecutive ticks that found the uplink busy
        self.samples: list[list[float]] = []
        self._task: asyncio.Task | None = None

    def chunk(self, src: int, dst: int, nbytes: int, seconds: float) -> None:
        """A chunk fully arrived here (the overlay's on_sample, as for the links' probes)."""
        if self.down:
            self._down.sample(PORT, dst, nbytes, seconds)

    def start(self) -> None:
        if self.up and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._ticks())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _ticks(self) -> None:
        """Every TICK_S while the uplink is busy or a period is open, IDLE_TICK_S while idle (as the
        loop-lag ticker: an idle agent's ticks were most of its CPU)."""
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                idle = self._period is None and self._busy_ticks == 0 and not self.sending()
                await asyncio.sleep(IDLE_TICK_S if idle else TICK_S)
                self.tick()

    def tick(self) -> None:
        """The uplink's busy period goes on, starts or ends (called every TICK_S)."""
        busy = self.sending()
        p = self._period
        if busy:
            self._busy_ticks += 1
            if self._busy_ticks <= SKIP_TICKS:  # an idle cap starts with a full bucket: its burst is no rate
                return
            at, tx = self.tx_mark()
            if p is None:
                self._period = [at, at, tx, tx]
                return
            if at > p[1]:
                p[1], p[3] = at, tx
            if p[1] - p[0] >= SAMPLE_S:  # a long period: report this much, go on from here
                self._emit(p)
                self._period = [p[1], p[1], p[3], p[3]]
        else:
            self._busy_ticks = 0
            if p is not None:
                self._emit(p)
                self._period = None

    def _emit(self, p: list[float]) -> None:
        seconds, nbytes = p[1] - p[0], p[3] - p[2]
        if seconds < MIN_PERIOD_S or nbytes <= 0:
            return
        self._acc[0] += nbytes
        self._acc[1] += seconds
        if self._acc[1] >= CAP_SAMPLE_S:
            self.samples.append([UP, int(self._acc[0]), self._acc[1]])
            self._acc = [0.0, 0.0]

    def take(self) -> list[list[float]]:
        """The samples not yet reported (for a REPORT's `caps`)."""
        self._down.flush()
        out = [[DOWN, int(b), s] for _, _, b, s in self._down.samples] + self.samples
        self._down.samples, self.samples = [], []
        return out
