"""Passive link measurement: the chunks this node receives are the probes (NetStorm's awareness).

No probe traffic is sent. A sample of a directed link is what it delivered while it was continuously
busy, timed on the receiver's clock alone:

- a *busy period* is a run of chunks over the link, each sent (its sender's `t_send`) before the
  previous one had fully arrived here: the link never went idle in between (several flows, trees or
  relays sharing the link count together: they share its rate);
- what arrived up to its first chunk's arrival is not counted: a link that was idle starts with a
  full token bucket (a real shaper's burst), its one-way delay and its sender's scheduling lead,
  none of which is rate;
- the sample is the bytes the link delivered (the overlay's receive meter: every flow's segments,
  relayed ones too, so chunks that shared the link round-robin and completed together count for
  the time they took together) from the first chunk's arrival to the last one's, both on this
  node's clock: no clock offset between two hosts enters it (the sender's clock only decides
  whether the link stayed busy, with CONTIGUOUS_S of slack);
- periods shorter than MIN_PERIOD_S say nothing reliable (a delay line flushes pieces at ms grain,
  an event loop wakes ms late; two chunks read in one go look infinitely fast) and are dropped;
  the others add up (bytes, seconds) until they hold `probe_num` probes and MIN_SAMPLE_S, which
  makes one sample; a long period is cut into samples of SAMPLE_S.

Why: with a sample per chunk from its sender's `t_send` to its arrival, chunks that fit the token
bucket's burst (20 KB at --scale 0.005 against a 2 ms burst of 37 KB at 150 Mbit/s) arrived one
delay after they were sent and read 400-900 Mbit/s on 20-155 Mbit/s links, while chunks queued
behind others included up to 20 ms of the sender's lookahead and read a quarter of the rate.
A chunk of `probe_bytes` or more counts as one probe toward `probe_num` (NetStorm's PROBE_CHUNK_SIZE
and _NUM: an estimate needs that many, besides each period's first); a smaller one counts as its
fraction of a probe, so plans of many small chunks (tree packing's thin trees) are measured once
their chunks add up to as many bytes. The agent sends the samples in REPORT messages; the scheduler's view
(scheduler/view.py) weighs them by their duration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from overlay.messages import Report

# NetStorm's passive awareness: chunks above PROBE_CHUNK_SIZE bytes are probes; PROBE_CHUNK_NUM of
# them (besides a busy period's first chunk) make one estimate (both in core.dispatch, as the run sets them)
MIN_PERIOD_S = 0.010  # shorter busy periods are dropped (ms-grain flushes and wake-ups)
MIN_SAMPLE_S = 0.040  # a sample covers at least this much busy time (its periods added up)
SAMPLE_S = 0.25  # a long busy period is cut into samples this long, so the view follows rate changes
ACC_MAX_AGE_S = 2.0  # short periods add up into one sample only within this long (older ones are dropped)
# A chunk continues the busy period if its sender stamped it (t_send: when it picked the chunk's first
# segment) no later than the previous chunk arrived here: one that waited behind the previous chunk
# was picked while that one still had pieces and the link's delay to go; one picked after the link
# went idle can pass only if the gap was within the delay and a late read (a small underestimate).
# Stricter (-0.5 ms) cut short, lumpy periods at --scale 0.005 and read worse (measured)
CONTIGUOUS_S = 0.0


@dataclass
class _Period:
    """One busy period of a link, as seen here: from the arrival of its first chunk."""

    start: float  # arrival of the first chunk (not counted)
    last: float  # arrival of the latest chunk
    nbytes: int = 0  # bytes the link delivered since the first chunk's arrival
    probes: float = 0.0  # probes after the first chunk: one per chunk of probe_bytes, smaller ones pro rata
    base: int = 0  # the receive meter at the first chunk's arrival
    probed: bool = False  # an active probe's chunks kept the link busy (scheduler/prober.py)
    pace: float = 0.0  # how far apart its chunks come: the longest gap so far, or the first chunk's transit


class LinkProbes:
    def __init__(self, now: Callable[[], float], probe_bytes: int, probe_num: int, *,
                 min_sample_s: float = MIN_SAMPLE_S, sample_s: float = SAMPLE_S, contiguous_s: float = CONTIGUOUS_S,
                 rx_bytes: Callable[[int], int] | None = None) -> None:
        """now: the synced clock (a chunk's t_send was stamped by its sender on the same clock).
        rx_bytes(src): bytes received so far over src->this node (the overlay's meter; without one,
        the bytes of the chunks after a period's first, which undercounts chunks that interleaved)."""
        self.now = now
        self.rx_bytes = rx_bytes
        self.probe_bytes = probe_bytes
        self.probe_num = probe_num
        self.min_sample_s = min_sample_s
        self.sample_s = sample_s
        self.contiguous_s = contiguous_s
        self.samples: list[list[float]] = []  # not yet reported
        self._periods: dict[tuple[int, int], _Period] = {}
        # per link: bytes, seconds, probes, probed?, and when: busy periods not yet a sample
        self._acc: dict[tuple[int, int], list[float]] = {}

    def sample(self, src: int, dst: int, nbytes: int, seconds: float, probe: bool = False) -> None:
        """One chunk fully arrived over src->dst `seconds` after its sender's t_send (the overlay's
        on_sample): it continues the link's busy period, or ends it and starts the next one. A chunk of
        an active probe counts as one whole probe whatever its size: the scheduler sized the probe to
        make one sample."""
        if nbytes <= 0:
            return
        now = self.now()
        key = (src, dst)
        meter = self.rx_bytes(src) if self.rx_bytes is not None else 0
        p = self._periods.get(key)
        if p is not None and now - seconds <= p.last + self.contiguous_s and now >= p.last:
            p.pace = max(p.pace, now - p.last)
            p.last = now
            p.nbytes = meter - p.base if self.rx_bytes is not None else p.nbytes + nbytes
            p.probes += 1.0 if probe or self.probe_bytes <= 0 else min(1.0, nbytes / self.probe_bytes)
            p.probed = p.probed or probe
            if p.last - p.start >= self.sample_s:  # long: report this much, go on from here
                self._emit(key, p)
                self._periods[key] = _Period(now, now, base=meter, probed=probe, pace=p.pace)
            return
        if p is not None:
            self._emit(key, p)
        self._periods[key] = _Period(now, now, base=meter, probed=probe, pace=seconds)

    def _emit(self, key: tuple[int, int], p: _Period) -> None:
        """A busy period ended (or was cut): add it to the link's evidence; enough makes a sample."""
        seconds = p.last - p.start
        if seconds < MIN_PERIOD_S or p.nbytes <= 0:
            return
        acc = self._acc.get(key)
        if acc is None or p.start - acc[4] > ACC_MAX_AGE_S:  # evidence that old may describe another rate
            acc = self._acc[key] = [0.0, 0.0, 0.0, 0, p.start]
        acc[0] += p.nbytes
        acc[1] += seconds
        acc[2] += p.probes
        acc[3] = acc[3] or int(p.probed)
        if acc[1] >= self.min_sample_s and acc[2] >= self.probe_num - 1e-9:
            self.samples.append([key[0], key[1], int(acc[0]), acc[1], *([1] if acc[3] else [])])
            del self._acc[key]

    def flush(self) -> None:
        """End every busy period that has been quiet for a while (the next chunk would start anew):
        their samples go out now instead of with the link's next traffic. Quiet means longer than
        twice its chunks' pace: on a slow link big chunks come 100 ms apart, and a period cut between
        two of them would only ever hold one (each period's first chunk does not count)."""
        now = self.now()
        for key, p in list(self._periods.items()):
            if now - p.last > max(self.min_sample_s, 2 * self.contiguous_s, 2 * p.pace):
                self._emit(key, p)
                del self._periods[key]

    def report(self, node: int) -> Report | None:
        """The samples not yet reported, as one REPORT (None if there are none)."""
        self.flush()
        if not self.samples:
            return None
        batch, self.samples = self.samples, []
        return Report(node=node, samples=batch)
