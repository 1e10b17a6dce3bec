"""Checks that must bite: each test here fails if the check it names is removed or weakened.

Issue 12 found that these breakages passed the whole suite: the chunk engine accepting a contributor
bitmap that overlaps what it already summed, the root not checking that everyone is in its sum, a
final value's bitmap not checked, Plan.validate() accepting a chunk outside the layout or an auxiliary
route that repeats a node, a MAC compared on its first byte only, NetStorm's shares by quality replaced
by equal shares. Each test below drives the real code path with inputs that only that check can refuse,
and computes what the right answer is by itself (own sums with numpy, own shortest paths, own
allocation), never through the product. Forged frames over real TCP are in test_forged_frames.py.
"""

from __future__ import annotations

import asyncio
import math
import time
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from waiting import until

from agents.engine import LEAF_SLICE, ChunkEngine, TaskAborted, TaskError, TaskState
from agents.workload import contribution
from core.plan import ChunkGroup, Job, Plan, PlanError, make_layout, tree_group
from emulation.topology import uniform
from overlay.auth import AuthError, Handshake
from overlay.messages import bitmap, validate
from scheduler.planners import netstorm
from scheduler.view import NetworkView

SECRET = b"checks-bite-secret-0123456789abcdef"
JOB, RND = 1, 0
PARAMS = 3_000


# --- the chunk engine's contributor checks -------------------------------------------------------------
class _Wire:
    """Stands in for the overlay under one engine: records what the engine sends, delivers nothing."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, Any], tuple[int, ...]]] = []
        self.clock = time.time

    def send_chunk(self, header: dict[str, Any], payload: memoryview, path: tuple[int, ...], *,
                   rate_Bps: float | None = None) -> None:
        self.sent.append((dict(header), tuple(path)))

    def in_transit(self, path: tuple[int, ...]) -> int:
        return 0

    def drop_connection(self, peer: int) -> None:
        pass


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


def engine(node: int, plan: Plan) -> tuple[ChunkEngine, TaskState, _Wire]:
    eng = ChunkEngine(node, uniform(3).routes())
    wire = _Wire()
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


def assert_failed_not_summed(st: TaskState, want: np.ndarray) -> None:
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


# --- Plan.validate() ----------------------------------------------------------------------------------
def base_plan(aux: dict[tuple[int, int], tuple[tuple[int, ...], ...]] | None = None,
              chunks: tuple[int, ...] = (0, 1, 2)) -> Plan:
    """4 participants, 3 chunks, one group rooted at 0 (a star), optional auxiliary routes."""
    parent: dict[int, int | None] = {0: None, 1: 0, 2: 0, 3: 0}
    g = tree_group(chunks, 0, parent)
    g = ChunkGroup(g.chunks, g.root, g.parent, g.children, aux or {})
    return Plan(1, "hand", (0, 1, 2, 3), {n: 1.0 for n in range(4)}, make_layout(300, 100), (g,))


LINKS = list(uniform(4).links)


def test_the_hand_made_plans_are_valid():
    base_plan().validate(LINKS)
    base_plan({(1, 0): ((1, 2, 0), (1, 3, 2, 0)), (0, 3): ((0, 2, 3),)}).validate(LINKS)


@pytest.mark.parametrize("extra", [3, 4, -1, 99])
def test_validate_refuses_a_chunk_index_outside_the_layout(extra):
    """Every layout chunk is in the group, so only the range check can refuse the extra index."""
    with pytest.raises(PlanError, match=f"chunk {extra} is not in the layout"):
        base_plan(chunks=(0, 1, 2, extra)).validate(LINKS)


@pytest.mark.parametrize("route", [(1, 2, 1, 0), (1, 2, 3, 2, 0), (1, 3, 2, 3, 0)])
@pytest.mark.parametrize("with_links", [True, False])
def test_validate_refuses_an_auxiliary_route_that_repeats_a_node(route, with_links):
    """Each route starts at the child, ends at the parent, is long enough and uses only links: it is
    wrong only in visiting a node twice (a relay loop)."""
    plan = base_plan({(1, 0): ((1, 2, 0), route)})
    with pytest.raises(PlanError, match="not a simple relay path"):
        plan.validate(LINKS if with_links else None)


# --- the handshake's MAC comparison --------------------------------------------------------------------
def tamper(mac: bytes, how: str) -> bytes:
    b = bytearray(mac)
    if how == "last byte":
        b[-1] ^= 0x01
    elif how == "first byte":
        b[0] ^= 0x80
    elif how == "middle byte":
        b[len(b) // 2] ^= 0xFF
    elif how == "only the first byte":
        del b[1:]
    elif how == "one byte appended":
        b.append(0)
    out = bytes(b)
    assert out != mac
    return out


HOW = ["last byte", "first byte", "middle byte", "only the first byte", "one byte appended"]


def opened() -> tuple[Handshake, Handshake, dict[str, Any]]:
    """A dialer and an acceptor with the same secret, run up to the dialer's AUTH (not yet delivered)."""
    d = Handshake("bite", 0, "agent", dialer=True, secret=SECRET, expect=1, peer_role="agent")
    a = Handshake("bite", 1, "agent", dialer=False, secret=SECRET, peer_role="agent")
    [hello_a] = a.receive(d.start())
    [auth_d] = d.receive(hello_a)
    assert auth_d["t"] == "AUTH" and len(auth_d["mac"]) == 32
    return d, a, auth_d


@pytest.mark.parametrize("how", HOW)
def test_the_acceptor_refuses_a_mac_wrong_in_one_byte(how):
    """Deterministic: the MAC is the genuine one except for one byte (or its length), so a comparison
    of a prefix only (say the first byte) lets it through every time."""
    d, a, auth_d = opened()
    with pytest.raises(AuthError, match="does not verify"):
        a.receive({"t": "AUTH", "mac": tamper(auth_d["mac"], how)})
    assert not a.done
    [auth_a] = a.receive(auth_d)  # the genuine proof, same exchange: accepted, so only the byte mattered
    assert a.done and auth_a["t"] == "AUTH"


@pytest.mark.parametrize("how", HOW)
def test_the_dialer_refuses_an_acceptor_mac_wrong_in_one_byte(how):
    d, a, auth_d = opened()
    [auth_a] = a.receive(auth_d)
    with pytest.raises(AuthError, match="does not verify"):
        d.receive({"t": "AUTH", "mac": tamper(auth_a["mac"], how)})
    assert not d.done
    assert d.receive(auth_a) == [] and d.done


# --- NetStorm: shares proportional to quality ---------------------------------------------------------
# A hub (0) with fast links to every leaf, and one slow leaf-leaf link. By hand: T_0 has delay 1/100
# (q = 100); a leaf's tree waits for the other leaves' two hops through the hub, 2/100 (q = 50; the
# slow 1-2 link is never on a shortest path). Shares by quality are 0.4 / 0.2 / 0.2 / 0.2 (or 2/3 and
# 1/3 for two roots), far from equal shares.
HUB_RATES = {(0, 1): 100, (0, 2): 100, (0, 3): 100, (1, 2): 25}  # Mbit/s, both directions
NS_PARAMS, NS_CHUNK = 40_702, 1_000  # 41 chunks, the last one of 702: shares are counted in parameters


def hub_view() -> tuple[NetworkView, dict[tuple[int, int], int]]:
    rates = {**HUB_RATES, **{(b, a): r for (a, b), r in HUB_RATES.items()}}
    view = NetworkView(rates)
    for (a, b), mbps in rates.items():
        view.observe(a, b, mbps * 125_000, 1.0)  # one sample: exactly `mbps`
    return view, rates


def exact_quality(rates: dict[tuple[int, int], int], nodes: list[int]) -> dict[int, Fraction]:
    """q_r = 1 / w(T_r), w(T_r) the largest shortest-path delay toward r under w(e) = 1/rate(e)
    (Floyd-Warshall on exact fractions: independent of the planner's networkx Dijkstra)."""
    d = {(a, b): Fraction(0) if a == b else (Fraction(1, rates[(a, b)]) if (a, b) in rates else None)
         for a in nodes for b in nodes}
    for k in nodes:
        for i in nodes:
            for j in nodes:
                via = None if d[(i, k)] is None or d[(k, j)] is None else d[(i, k)] + d[(k, j)]
                if via is not None and (d[(i, j)] is None or via < d[(i, j)]):
                    d[(i, j)] = via
    return {r: 1 / max(d[(n, r)] for n in nodes) for r in nodes}  # type: ignore[type-var]  # all reachable


def paper_allocation(layout: tuple[tuple[int, int], ...], roots: list[int],
                     q: dict[int, Fraction]) -> dict[int, list[int]]:
    """Digest 002 §2.5, written out again: quota[r] = ceil(q_r / sum q * P) parameters, chunks handed
    out round-robin over the roots, skipping roots whose quota is filled."""
    total = sum(n for _, n in layout)
    qsum = sum(q[r] for r in roots)
    quota = {r: math.ceil(q[r] / qsum * total) for r in roots}
    filled = dict.fromkeys(roots, 0)
    owner: dict[int, list[int]] = {r: [] for r in roots}
    k = 0
    for c, (_, n) in enumerate(layout):
        while filled[roots[k % len(roots)]] >= quota[roots[k % len(roots)]]:
            k += 1
        r = roots[k % len(roots)]
        owner[r].append(c)
        filled[r] += n
        k += 1
    return owner


@pytest.mark.parametrize("n_roots", [4, 2])
def test_netstorm_gives_each_root_the_chunks_its_quality_earns(n_roots):
    view, rates = hub_view()
    q = exact_quality(rates, [0, 1, 2, 3])
    assert q == {0: 100, 1: 50, 2: 50, 3: 50}  # the hand computation above
    roots = sorted(q, key=lambda r: (-q[r], r))[:n_roots]
    layout = make_layout(NS_PARAMS, NS_CHUNK)
    # exact quotas are not integers, so the planner's float arithmetic cannot round them differently
    assert all((q[r] / sum(q[x] for x in roots) * NS_PARAMS).denominator != 1 for r in roots)
    want = paper_allocation(layout, roots, q)
    equal = paper_allocation(layout, roots, dict.fromkeys(roots, Fraction(1)))
    counts = {r: len(want[r]) for r in roots}
    # by hand for 4 roots: quotas 16281 / 8141 / 8141 / 8141; nine rounds of the round-robin fill the
    # leaves (9000 >= 8141), the five chunks left go to the hub: 14 / 9 / 9 / 9 (equal shares: 11 / 10 ...)
    assert counts == ({0: 14, 1: 9, 2: 9, 3: 9} if n_roots == 4 else {0: 27, 1: 14})
    assert counts != {r: len(equal[r]) for r in roots}  # the test can tell the two rules apart

    state: dict = {}
    plan = netstorm.plan(view, Job(NS_PARAMS, NS_CHUNK, (0, 1, 2, 3), {"roots": n_roots}), state)
    plan.validate(view.links())
    got = {g.root: list(g.chunks) for g in plan.groups}
    assert {r: len(c) for r, c in got.items()} == counts, "chunks per root do not follow q_r = 1/w(T_r)"
    assert got == want  # and which chunks: round-robin in model order
