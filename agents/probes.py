"""Passive link measurement: the chunks this node receives are the probes (NetStorm's awareness).

No probe traffic is sent: every chunk above `probe_bytes` that fully arrived over a link is a probe,
and every `probe_num` of them make one sample [src, dst, bytes, seconds] of that directed link. The
agent sends the samples to the scheduler in REPORT messages, whose network view learns from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from overlay.messages import Report

# NetStorm's passive awareness: chunks above PROBE_CHUNK_SIZE bytes are probes; PROBE_CHUNK_NUM of
# them make one size-weighted estimate (sum of bytes / sum of seconds) per directed link
PROBE_CHUNK_BYTES = 2_000_000
PROBE_CHUNK_NUM = 4


class LinkProbes:
    def __init__(self, now: Callable[[], float], probe_bytes: int = PROBE_CHUNK_BYTES,
                 probe_num: int = PROBE_CHUNK_NUM) -> None:
        """now: the synced clock (a probe's send time was stamped by its sender on the same clock)."""
        self.now = now
        self.probe_bytes = probe_bytes
        self.probe_num = probe_num
        self.samples: list[list[float]] = []  # not yet reported
        self._probes: dict[tuple[int, int], list[tuple[float, float, int]]] = {}

    def sample(self, src: int, dst: int, nbytes: int, seconds: float) -> None:
        """One chunk fully arrived over src->dst (the overlay's on_sample); every probe_num probes
        make one sample.

        The estimate is bytes over the union of the probes' [send-start, receive-complete]
        intervals: chunks of several flows (trees) crossing one link at once each see only their
        share, but together they show what the link carried while busy."""
        if nbytes <= self.probe_bytes or seconds <= 0:
            return
        now = self.now()
        probes = self._probes.setdefault((src, dst), [])
        probes.append((now - seconds, now, nbytes))
        if len(probes) >= self.probe_num:
            busy, end = 0.0, -math.inf
            for t_send, t_recv, _ in sorted(probes):
                if t_recv > end:
                    busy += t_recv - max(t_send, end)
                    end = t_recv
            self.samples.append([src, dst, sum(p[2] for p in probes), busy])
            del self._probes[(src, dst)]

    def report(self, node: int) -> Report | None:
        """The samples not yet reported, as one REPORT (None if there are none)."""
        if not self.samples:
            return None
        batch, self.samples = self.samples, []
        return Report(node=node, samples=batch)
