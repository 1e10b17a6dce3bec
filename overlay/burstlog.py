"""One log line per burst of the same kind of event, not one per occurrence; every burst is seen.

A peer (or an attacker) can make the same thing happen thousands of times a second, and vary what it
sends each time: the key of a burst is therefore what the defender chooses — the kind of event (a
constant of the code) and the peer's address or node where known — never text or numbers the peer
sent, which would give it one line (and one table entry) per variation.

The first event of a burst is logged at once; the following ones within `every_s` are counted, and
the window ends with one summary line (the count, the first and the last reason). A key quiet for a
whole window is forgotten, so the next burst of the same kind is logged again at the normal level:
rate-limited per kind, never silenced per process. The table is bounded in size (`max_keys`; beyond
it new peers share one key per kind) and in age (a key lives one quiet window at most).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

EVERY_S = 10.0  # a burst's window: one summary line per window, and this long quiet ends a burst
REASON_CHARS = 300  # what a burst remembers of a reason (its first and last): the peer may send long text
MAX_KEYS = 256  # (kind, peer) pairs tracked at once; beyond, new peers share the key (kind, None)


@dataclass
class _Burst:
    start: float  # when its current window began
    last_at: float  # when its latest event came
    first: str  # the reason that opened the burst (logged at once)
    last: str = ""  # the latest reason held back in this window
    held: int = 0  # events in this window not logged on their own
    total: int = 1  # events of the burst so far
    level: int = logging.WARNING


class BurstLog:
    def __init__(self, logger: logging.Logger, every_s: float = EVERY_S, *, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """clock: seconds, monotonic (tests pass a fake one and advance it instead of sleeping)."""
        self.logger = logger
        self.every_s = every_s
        self.max_keys = max_keys
        self.clock = clock
        self.lines = 0  # lines written (a test or a benchmark may count them)
        self._bursts: OrderedDict[Hashable, _Burst] = OrderedDict()  # oldest window first
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._bursts)

    def log(self, level: int, kind: str, msg: str, peer: Hashable = None) -> None:
        """An event of `kind` (a constant chosen here, not by the peer) from `peer` (an address or
        a node id we know, or None); `msg` says what happened, and may quote what the peer sent."""
        now = self.clock()
        self._expire(now)
        key = (kind, peer)
        if key not in self._bursts and len(self._bursts) >= self.max_keys:
            key = (kind, None)  # many peers at once: they share one line per kind
        b = self._bursts.get(key)
        if b is not None and now - b.last_at >= self.every_s:  # quiet that long: a new burst
            del self._bursts[key]
            self._end(key, b)
            b = None
        if b is None and len(self._bursts) >= self.max_keys + 64:  # kinds are few: this never grows
            self._end(*self._bursts.popitem(last=False))
        if b is None:
            self._bursts[key] = _Burst(start=now, last_at=now, first=msg[:REASON_CHARS], level=level)
            self._write(level, "%s", msg)
            self._arm(now)
            return
        b.held += 1
        b.total += 1
        b.last_at = now
        b.last = msg[:REASON_CHARS]
        b.level = max(b.level, level)
        self._arm(now)

    def flush(self) -> None:
        """Write the summary of every window that ended by now (the timer does this on a loop)."""
        self._expire(self.clock())

    def _expire(self, now: float) -> None:
        while self._bursts:
            key, b = next(iter(self._bursts.items()))
            if now - b.start < self.every_s:
                return
            self._end(key, b)
            if now - b.last_at < self.every_s:  # the burst goes on: a new window, at the back of the line
                b.start, b.held, b.last = now, 0, ""
                self._bursts.move_to_end(key)
            else:  # quiet a whole window: the burst is over, and the next event of its kind is logged again
                del self._bursts[key]

    def _end(self, key: Hashable, b: _Burst) -> None:
        if b.held:
            self._summary(key, b)

    def _summary(self, key: Hashable, b: _Burst) -> None:
        kind, peer = key if isinstance(key, tuple) else (key, None)
        where = f" from {peer}" if peer is not None else ""
        self._write(b.level, "%s%s: %d more in the last %.0f s (%d in this burst); first: %s; last: %s",
                    kind, where, b.held, self.every_s, b.total, b.first, b.last)

    def _write(self, level: int, fmt: str, *args: object) -> None:
        self.lines += 1
        self.logger.log(level, fmt, *args)

    def _arm(self, now: float) -> None:
        """One timer per log, on the running loop, for the oldest window's end (no loop: the summary
        comes with the next event, or flush())."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._timer is not None and self._timer_loop is loop and not self._timer.cancelled():
            return
        first = next(iter(self._bursts.values()))
        delay = min(self.every_s, max(0.0, first.start + self.every_s - now))
        self._timer, self._timer_loop = loop.call_later(delay, self._on_timer), loop

    def _on_timer(self) -> None:
        self._timer = self._timer_loop = None
        now = self.clock()
        self._expire(now)
        if self._bursts:  # summaries still to write, or keys to forget once their quiet window ends
            self._arm(now)
