"""One log line per burst of the same event, not one per occurrence.

A peer (or an attacker) can make the same thing happen hundreds of times a second: 200 idle
connections must not write 200 lines. The first occurrence of a key is logged at once; the
following ones within `every_s` are counted and written as one summary line when the window ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable


class BurstLog:
    def __init__(self, logger: logging.Logger, every_s: float = 10.0) -> None:
        self.logger = logger
        self.every_s = every_s
        self._last: dict[Hashable, float] = {}  # key -> when its last line was written
        self._held: dict[Hashable, tuple[int, int, str]] = {}  # key -> (suppressed count, level, last message)

    def log(self, level: int, key: Hashable, msg: str) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is None or now - last >= self.every_s:
            self._flush(key)
            self._last[key] = now
            self.logger.log(level, "%s", msg)
            return
        n, _, _ = self._held.get(key, (0, level, msg))
        self._held[key] = (n + 1, level, msg)
        if n == 0:
            try:
                asyncio.get_running_loop().call_later(self.every_s - (now - last), self._flush, key)
            except RuntimeError:  # no loop: the summary comes with the next line of this key
                pass

    def _flush(self, key: Hashable) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            n, level, msg = held
            self._last[key] = time.monotonic()
            self.logger.log(level, "%s (%d more like this in the last %.0f s)", msg, n, self.every_s)
        if len(self._last) > 4096:  # keys are per peer and reason; forget the oldest, never grow without bound
            for k in sorted(self._last, key=self._last.__getitem__)[:2048]:
                if k not in self._held:
                    del self._last[k]
