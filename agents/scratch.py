"""Buffers for partial sums as they arrive, used again: a segment of a partial sum lands in a scratch
buffer and is added into the accumulator at once, so the buffer is free again right after. A fresh
multi-MB numpy array per segment costs its page faults (zeroed huge pages) on every first touch, and
glibc gives memory this size back to the kernel when it is freed; a few kept buffers avoid both."""

from __future__ import annotations

import weakref

import numpy as np

KEEP_PER_SIZE = 4  # free buffers kept per size (about one per connection delivering at once)
KEEP_BYTES = 64 << 20  # free buffers kept in all: never more memory than this is held for reuse


class ScratchPool:
    """Float32 buffers by byte size: `take` one for a segment, `give` it back once its bytes are added.
    Only buffers this pool handed out come back to it; one that is never given back (its frame was cut
    off, its task aborted) is simply collected."""

    def __init__(self, keep_per_size: int = KEEP_PER_SIZE, keep_bytes: int = KEEP_BYTES) -> None:
        self.keep_per_size = keep_per_size
        self.keep_bytes = keep_bytes
        self._free: dict[int, list[np.ndarray]] = {}
        self._kept = 0
        self._out: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
        self.reused = 0  # buffers handed out again (a figure for whoever profiles the data plane)

    def take(self, nbytes: int) -> memoryview:
        free = self._free.get(nbytes)
        if free:
            arr = free.pop()
            self._kept -= nbytes
            self.reused += 1
        else:
            arr = np.empty(nbytes // 4, np.float32)
        self._out[id(arr)] = arr
        return memoryview(arr).cast("B")

    def give(self, payload: memoryview) -> None:
        """The segment's bytes were used: its buffer may serve the next one (if it is one of ours)."""
        arr = payload.obj
        if not isinstance(arr, np.ndarray) or self._out.get(id(arr)) is not arr:
            return
        del self._out[id(arr)]
        nbytes = arr.nbytes
        free = self._free.setdefault(nbytes, [])
        if len(free) < self.keep_per_size and self._kept + nbytes <= self.keep_bytes:
            free.append(arr)
            self._kept += nbytes
