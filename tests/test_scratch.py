"""The scratch pool that partial sums' segments land in: a buffer is handed out again only once it was
given back, never twice at once, never one the pool did not hand out (a result, a model), and the
pool keeps no more than its limits. The recycled model-sized arrays: handed out again only once
nothing refers to them, whatever holds them (a slice, a memoryview, the array itself)."""

import asyncio
import resource

import numpy as np
import pytest

from agents.scratch import MIN_RECYCLED_BYTES, RecycledArrays, ScratchPool

pytestmark = pytest.mark.unit


def test_a_buffer_given_back_serves_the_next_segment_of_its_size():
    pool = ScratchPool()
    a = pool.take(4096)
    a_arr = a.obj
    pool.give(a)
    b = pool.take(4096)
    assert b.obj is a_arr and pool.reused == 1
    c = pool.take(8192)  # another size: a buffer of its own
    assert c.obj is not a_arr and len(c) == 8192


def test_a_buffer_given_back_twice_is_handed_out_once():
    pool = ScratchPool()
    a = pool.take(4096)
    pool.give(a)
    pool.give(a)  # a second give of the same buffer: ignored
    x, y = pool.take(4096), pool.take(4096)
    assert not np.shares_memory(np.frombuffer(x, np.uint8), np.frombuffer(y, np.uint8))


def test_memory_the_pool_did_not_hand_out_is_never_handed_out():
    pool = ScratchPool()
    result = np.arange(1024, dtype=np.float32)
    pool.give(memoryview(result).cast("B"))  # a result's bytes (a final value lands there): not ours
    pool.give(memoryview(bytearray(4096)))  # a stashed frame's copy
    got = pool.take(4096)
    assert not np.shares_memory(np.frombuffer(got, np.uint8), result)
    assert pool.reused == 0


def reused_after_giving_back(pool: ScratchPool, n: int, nbytes: int = 4096) -> int:
    """Hand out n buffers, give them all back, take n again: how many of those were kept for reuse."""
    first = [pool.take(nbytes) for _ in range(n)]
    ids = [b.obj for b in first]
    for b in first:
        pool.give(b)
    again = [pool.take(nbytes).obj for _ in range(n)]
    return sum(any(a is i for i in ids) for a in again)


def test_the_pool_keeps_no_more_than_its_limits():
    assert reused_after_giving_back(ScratchPool(keep_per_size=2, keep_bytes=3 * 4096), 5) == 2  # per size
    assert reused_after_giving_back(ScratchPool(keep_per_size=8, keep_bytes=3 * 4096), 5) == 3  # in bytes


N = MIN_RECYCLED_BYTES // 4  # the smallest length the recycler keeps


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_an_array_nothing_refers_to_is_handed_out_again():
    arrays = RecycledArrays()
    a = arrays.empty(N)
    a[:] = 7.0
    first = address(a)
    del a
    b = arrays.empty(N)
    assert address(b) == first and arrays.reused == 1
    assert address(arrays.empty(N)) != first  # b is still held: the next one is another array


def holder(a: np.ndarray, hold: str) -> object:
    if hold == "slice":  # a chunk being summed into
        return a[100:200]
    if hold == "memoryview":  # a receive target, a write queued on a transport
        return memoryview(a).cast("B")[400:800]
    if hold == "frombuffer":
        return np.frombuffer(memoryview(a).cast("B"), np.float32)
    return a  # a result the workload kept


@pytest.mark.parametrize("hold", ["array", "slice", "memoryview", "frombuffer"])
def test_an_array_anything_still_refers_to_is_never_handed_out(hold):
    arrays = RecycledArrays()
    a = arrays.empty(N)
    kept = holder(a, hold)
    del a
    b = arrays.empty(N)
    assert not np.shares_memory(b, np.frombuffer(kept, np.uint8) if isinstance(kept, memoryview) else kept)
    assert arrays.reused == 0


def test_small_arrays_are_not_kept_and_the_recycler_keeps_no_more_than_its_limits():
    arrays = RecycledArrays(keep_bytes=3 * N * 4, keep_per_size=2)
    assert arrays.empty(N - 1).size == N - 1 and arrays.kept_bytes == 0  # small: glibc's heap serves it
    held = [arrays.empty(N) for _ in range(3)]  # only two of one size are kept
    assert arrays.kept_bytes == 2 * N * 4
    other = arrays.empty(2 * N)  # no room for it while both kept arrays are in use: not kept
    assert arrays.kept_bytes == 2 * N * 4
    del held, other
    arrays.empty(2 * N)  # now the unused ones of the other size make room
    assert arrays.kept_bytes <= 3 * N * 4 and arrays._kept[2 * N]


def test_prefaulted_arrays_are_the_next_ones_handed_out_within_the_limits(monkeypatch):
    import agents.scratch as scratch
    faulted: list[int] = []
    real = scratch._faulted
    monkeypatch.setattr(scratch, "_faulted", lambda n, count: faulted.append(count) or real(n, count))
    arrays = RecycledArrays(keep_bytes=3 * N * 4, keep_per_size=4)
    assert asyncio.run(arrays.prefault(N, 4)) == 3  # the byte limit holds: three fit
    assert faulted == [3]  # and no fourth is faulted in only to be dropped
    assert arrays.kept_bytes == 3 * N * 4
    ready = {address(a) for a in arrays._kept[N]}
    got = [arrays.empty(N) for _ in range(3)]
    assert {address(a) for a in got} == ready and arrays.reused == 3
    assert asyncio.run(arrays.prefault(N, 4)) == 0  # all three in use and no room for a fourth
    assert asyncio.run(RecycledArrays().prefault(N - 1)) == 0  # small: glibc's heap serves those
    assert asyncio.run(RecycledArrays(keep_per_size=2).prefault(N, 4)) == 2


def test_a_prefaulted_array_takes_no_page_fault_when_a_round_writes_it():
    """The point of prefault: the pages are mapped before the round. 64 MiB: above glibc's largest mmap
    threshold, so a fresh array is always new pages (the control, which shows the count works). A fault
    maps 4 KiB, or 2 MiB where the kernel gives transparent huge pages: at least 32 for 64 MiB."""
    n = (64 << 20) // 4

    def faults_writing(a: np.ndarray) -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a.fill(1.0)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    fresh = faults_writing(np.empty(n, np.float32))
    assert fresh >= (n * 4 >> 21) // 2
    arrays = RecycledArrays()
    assert asyncio.run(arrays.prefault(n, 1)) == 1
    assert faults_writing(arrays.empty(n)) <= fresh // 10
