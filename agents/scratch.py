"""Buffers used again instead of allocated afresh. A fresh multi-MB numpy array costs its page faults
(zeroed pages) on every first touch, because glibc gives memory this size back to the kernel when it is
freed: ~15 ms per 100 MB, every round, for a task part's accumulator and its result alike.

- ScratchPool: a segment of a partial sum lands in a scratch buffer and is added into the accumulator at
  once, so the buffer is given back right after.
- RecycledArrays: a task part's model-sized accumulator and result, handed out again once nothing refers
  to them any more (their users never say when: a result outlives its task in the workload's hands).
  A job's are faulted in before its first round (`prefault`), so no round pays for them."""

from __future__ import annotations

import asyncio
import sys
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


KEEP_ARRAY_BYTES = 1 << 30  # model-sized arrays kept in all (in use or free): beyond it, fresh ones as before
KEEP_ARRAYS_PER_SIZE = 4  # an accumulator and a result, for the task running and the next one
MIN_RECYCLED_BYTES = 1 << 20  # smaller arrays come from glibc's heap, where freeing them costs nothing


def _free_refs() -> int:
    """The reference count sys.getrefcount reports for an array only a list holds (CPython's, measured
    here rather than assumed)."""
    probe = [np.empty(1, np.float32)]
    return sys.getrefcount(probe[0])


_FREE_REFS = _free_refs()


class RecycledArrays:
    """Float32 arrays by length, each handed out again once nothing but this pool refers to it. CPython's
    reference count says so: a view or slice of an array, a memoryview of it (a receive target, a write
    queued on a transport), a result a workload kept, each holds a reference, so an array still in use
    anywhere is never handed out twice. Contents are stale, as np.empty's are undefined."""

    def __init__(self, keep_bytes: int = KEEP_ARRAY_BYTES, keep_per_size: int = KEEP_ARRAYS_PER_SIZE) -> None:
        self.keep_bytes, self.keep_per_size = keep_bytes, keep_per_size
        self._kept: dict[int, list[np.ndarray]] = {}
        self._bytes = 0
        self.reused = 0  # arrays handed out again (a figure for whoever profiles the data plane)

    def empty(self, n: int) -> np.ndarray:
        """An uninitialized float32 array of n values: a kept one nothing refers to, or a fresh one."""
        if n * 4 < MIN_RECYCLED_BYTES:
            return np.empty(n, np.float32)
        kept = self._kept.setdefault(n, [])
        for i in range(len(kept)):
            if sys.getrefcount(kept[i]) == _FREE_REFS:
                self.reused += 1
                return kept[i]
        arr = np.empty(n, np.float32)
        if len(kept) < self.keep_per_size and self._room(arr.nbytes):
            kept.append(arr)
            self._bytes += arr.nbytes
        return arr

    async def prefault(self, n: int, count: int = KEEP_ARRAYS_PER_SIZE) -> int:
        """Fault in, before a job's first round, the arrays of n values its rounds will take from this pool
        (up to `count`, within the pool's limits), so they are kept ready. Otherwise the first rounds
        allocate them, and pay their page faults: an unshaped 100 MB ring on 4 agents ran its first measured
        round in 0.4-0.7 s against 0.2 later. The pages are written in a thread, off the loop; returns
        how many arrays were added."""
        if n * 4 < MIN_RECYCLED_BYTES:
            return 0
        want = min(count, self.keep_per_size) - len(self._kept.get(n, ()))
        while want > 0 and not self._room(want * n * 4):  # fault in only what the pool will keep
            want -= 1
        if want <= 0:
            return 0
        fresh = await asyncio.to_thread(_faulted, n, want)
        kept = self._kept.setdefault(n, [])  # again: the loop ran while the thread wrote
        added = 0
        for arr in fresh:
            if len(kept) < self.keep_per_size and self._room(arr.nbytes):
                kept.append(arr)
                self._bytes += arr.nbytes
                added += 1
        return added

    def _room(self, nbytes: int) -> bool:
        """Make room for nbytes more by letting go of kept arrays nothing refers to (another size's: a
        job that ended); False if there is none."""
        for kept in self._kept.values():
            i = 0
            while self._bytes + nbytes > self.keep_bytes and i < len(kept):
                if sys.getrefcount(kept[i]) == _FREE_REFS:
                    self._bytes -= kept.pop(i).nbytes
                else:
                    i += 1
        return self._bytes + nbytes <= self.keep_bytes

    @property
    def kept_bytes(self) -> int:
        return self._bytes


def _faulted(n: int, count: int) -> list[np.ndarray]:
    """`count` float32 arrays of n values with every page touched (np.zeros would map them lazily)."""
    out = []
    for _ in range(count):
        arr = np.empty(n, np.float32)
        arr.fill(0.0)
        out.append(arr)
    return out
