"""The chunk engine's contributor checks, with an in-memory wire under one engine: a contributor bitmap
overlapping what it already summed, a root's sum missing a participant, a final value whose bitmap is
not everyone, a partial sum holding a non-participant; leaf chunks going out in slices.

Each test here fails if the check it names is removed or weakened (issue 12 found that such a
breakage passed the whole suite): it drives the real code path with inputs only that check can refuse,
and computes the right answer by itself, never through the product (own sums with numpy).
Forged frames over real TCP are in test_forged_frames.py.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from helpers.waiting import until
from helpers.wire import RecordingWire

from agents.engine import ChunkEngine
from agents.taskpart import LEAF_SLICE, TaskAborted, TaskError, TaskPart
from agents.workload import contribution
from core.plan import Plan, make_layout, tree_group
from emulation.topology import uniform
from overlay.messages import bitmap, validate

pytestmark = pytest.mark.unit

JOB, RND = 1, 0
PARAMS = 3_000


# --- the chunk engine's contributor checks -------------------------------------------------------------
def tree_plan(parent: dict[int, int | None], params: int = PARAMS, chunk: int = PARAMS) -> Plan:
    """One group (one chunk by default) whose broadcast tree mirrors the aggregation tree."""
    root = next(n for n, p in parent.items() if p is None)
    layout = make_layout(params, chunk)
    parts = tuple(sorted(parent))
    return Plan(1, "hand", parts, {n: 1.0 for n in parts}, layout,
                (tree_group(range(len(layout)), root, parent),)).validate()


STAR = {2: None, 0: 2, 1: 2}  # root 2, children 0 and 1
CHAIN = {2: None, 1: 2, 0: 1}  # 0 -> 1 -> 2 (root)


def contrib(n: int) -> np.ndarray:
    return contribution(RND, 0, n, PARAMS)


def own_sum(nodes: list[int]) -> np.ndarray:
    """The exact sum, computed here in int64 (the contributions are small integers)."""
    return np.sum([contrib(n).astype(np.int64) for n in nodes], axis=0).astype(np.float32)


def engine(node: int, plan: Plan) -> tuple[ChunkEngine, TaskPart, RecordingWire]:
    eng = ChunkEngine(node, uniform(3).routes())
    wire = RecordingWire()
    eng.overlay = wire  # type: ignore[assignment]
    st = eng.begin_task(JOB, RND, 0, plan, contrib(node))
    return eng, st, wire


async def test_leaf_chunks_go_out_in_slices_and_stop_when_their_task_is_aborted():
    plan = tree_plan(STAR, chunk=PARAMS // 30)  # 30 chunks; node 0 is a leaf of every one
    eng, st, wire = engine(0, plan)
    first = len(wire.sent)
    assert first == LEAF_SLICE < len(plan.layout)  # begin_task sends one slice, the loop the rest
    eng.abort(JOB, RND, 0)
    turn_done = asyncio.Event()  # queued behind the next slice's turn: set once that turn has run
    asyncio.get_running_loop().call_soon(turn_done.set)
    await turn_done.wait()
    assert len(wire.sent) == first  # nothing more of an aborted task goes out
    with pytest.raises(TaskAborted):
        await st.done
    eng, st, wire = engine(0, plan)  # left alone: every leaf chunk once, in order
    await until(lambda: len(wire.sent) >= len(plan.layout), "every leaf chunk to go out")
    assert [h["chunk"] for h, _ in wire.sent] == list(range(len(plan.layout)))


def deliver(eng: ChunkEngine, *, kind: str, origin: int, contributors: list[int], data: np.ndarray,
            chunk: int = 0) -> None:
    """What the overlay does with one whole chunk addressed to this node: a validated header, the bytes
    written where chunk_buffer says, then chunk_segment."""
    raw = memoryview(np.ascontiguousarray(data, dtype=np.float32)).cast("B")
    h = validate({"t": "CHUNK", "job": JOB, "task": RND, "attempt": 0, "version": 1, "chunk": chunk,
                  "kind": kind, "origin": origin, "contributors": bitmap(contributors), "t_send": 0.0,
                  "path": [origin, eng.node], "hop": 0, "off": 0, "total": len(raw), "nbytes": len(raw)})
    dest = eng.chunk_buffer(h)
    if dest is None:
        eng.chunk_segment(h, raw)
    else:
        dest[:] = raw
        eng.chunk_segment(h, dest)


def assert_failed_not_summed(st: TaskPart, want: np.ndarray) -> None:
    """The round must end in TaskError; a result (right or wrong) means the forged frame was taken."""
    assert st.done.done(), "the forged frame neither failed the round nor was refused"
    if st.done.exception() is None:
        got = st.done.result()
        verdict = "the exact sum by luck" if np.array_equal(got, want) else "a WRONG sum"
        raise AssertionError(f"the round completed with {verdict} instead of failing")
    assert isinstance(st.done.exception(), TaskError), repr(st.done.exception())


@pytest.mark.parametrize(("second", "doubled"), [([0, 1], "sibling 0"), ([1, 2], "the root itself")],
                         ids=["doubles-sibling", "doubles-root"])
async def test_engine_refuses_a_bitmap_overlapping_what_it_already_summed(second, doubled):
    """Check `theirs & st.contributors[c]`: child 1's partial sum claims a contribution already summed."""
    eng, st, wire = engine(2, tree_plan(STAR))
    deliver(eng, kind="agg", origin=0, contributors=[0], data=contrib(0))
    assert not st.done.done()
    forged = own_sum(second)  # a plausible partial sum that doubles `doubled`
    deliver(eng, kind="agg", origin=1, contributors=second, data=forged)
    assert_failed_not_summed(st, own_sum([0, 1, 2]))
    assert not wire.sent, f"the root broadcast a value that doubles {doubled}"


@pytest.mark.parametrize(("plan", "child", "bits"), [
    (CHAIN, 1, [1]),  # the middle node forgot its child 0
    (STAR, 1, []),  # child 1 claims to hold nothing (and 0 came in right)
], ids=["chain-child-forgot-its-child", "star-child-holds-nothing"])
async def test_root_refuses_a_sum_missing_a_participant(plan, child, bits):
    """Check `st.contributors[c] != st.everyone` at the root: every participant must be in its sum."""
    eng, st, wire = engine(2, tree_plan(plan))
    if plan is STAR:
        deliver(eng, kind="agg", origin=0, contributors=[0], data=contrib(0))
    deliver(eng, kind="agg", origin=child, contributors=bits, data=own_sum(bits) if bits else contrib(1))
    assert_failed_not_summed(st, own_sum([0, 1, 2]))
    assert not wire.sent, "the root broadcast a sum that misses a participant"


@pytest.mark.parametrize("bits", [[0, 2], [0, 1, 2, 5]], ids=["misses-1", "adds-5"])
async def test_a_final_value_whose_bitmap_is_not_everyone_is_refused(bits):
    """Check the bcast bitmap: a final value holding contributors other than exactly the participants."""
    eng, st, _ = engine(0, tree_plan(STAR))
    deliver(eng, kind="bcast", origin=2, contributors=bits, data=own_sum([n for n in bits if n < 3]))
    assert_failed_not_summed(st, own_sum([0, 1, 2]))


async def test_a_partial_sum_holding_a_non_participant_fails_where_it_lands():
    """Check `theirs & ~st.everyone` on its own: the middle node (not the root, which would catch the
    bitmap later) must fail at once and forward nothing."""
    eng, st, wire = engine(1, tree_plan(CHAIN))
    deliver(eng, kind="agg", origin=0, contributors=[0, 5], data=contrib(0))
    assert_failed_not_summed(st, own_sum([0, 1, 2]))
    assert not wire.sent, "the middle node forwarded a partial sum naming a non-participant"


async def test_the_same_frames_with_honest_bitmaps_complete_exactly():
    """The counter-test: the deliveries above, honest, end with the exact sum (so the refusals are
    about the bitmaps, not about how the frames are fed in)."""
    eng, st, wire = engine(2, tree_plan(STAR))
    deliver(eng, kind="agg", origin=0, contributors=[0], data=contrib(0))
    deliver(eng, kind="agg", origin=1, contributors=[1], data=contrib(1))
    assert st.done.done() and np.array_equal(st.done.result(), own_sum([0, 1, 2]))
    assert sorted(path[-1] for _, path in wire.sent) == [0, 1]
    mid, st1, wire1 = engine(1, tree_plan(CHAIN))
    deliver(mid, kind="agg", origin=0, contributors=[0], data=contrib(0))
    [(h, path)] = wire1.sent
    assert path[-1] == 2 and h["contributors"] == bitmap([0, 1])
    leaf, st0, _ = engine(0, tree_plan(STAR))
    deliver(leaf, kind="bcast", origin=2, contributors=[0, 1, 2], data=own_sum([0, 1, 2]))
    assert np.array_equal(st0.done.result(), own_sum([0, 1, 2]))


async def test_a_result_given_a_place_is_received_there_and_let_go_when_its_part_ends():
    """`into` (a training script's result region): the final value is received straight into it, and
    once the part ends (here: aborted before it) the engine tells the overlay to let go of it, so a
    frame half read into it lands no further byte there. A part without one keeps its own array."""
    plan = tree_plan(STAR)
    eng = ChunkEngine(0, uniform(3).routes())
    wire = RecordingWire()
    eng.overlay = wire  # type: ignore[assignment]
    region = np.full(PARAMS, -1.0, np.float32)
    st = eng.begin_task(JOB, RND, 0, plan, contrib(0), into=region)
    deliver(eng, kind="bcast", origin=2, contributors=[0, 1, 2], data=own_sum([0, 1, 2]))
    assert st.done.result() is region and np.array_equal(region, own_sum([0, 1, 2]))
    eng.end_task(st)
    assert wire.let_go_of == [region]
    st = eng.begin_task(JOB, RND + 1, 0, plan, contrib(0), into=region)  # aborted before its value came
    eng.abort(JOB, RND + 1, 0)
    with pytest.raises(TaskAborted):
        await st.done
    eng.end_task(st)
    assert wire.let_go_of == [region, region]
    own = eng.begin_task(JOB, RND + 2, 0, plan, contrib(0))
    assert own.result is not region and not own.external
    eng.end_task(own)
    assert wire.let_go_of == [region, region]
