"""The scratch pool that partial sums' segments land in: a buffer is handed out again only once it was
given back, never twice at once, never one the pool did not hand out (a result, a model), and the
pool keeps no more than its limits."""

import numpy as np
import pytest

from agents.scratch import ScratchPool

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
