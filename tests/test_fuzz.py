"""Fuzzing the receive path: hypothesis streams into the real BufferedProtocol with real handlers.

Every example builds a fresh FrameProtocol on a fake transport with one of the real handlers (the
overlay's handshake, an authenticated neighbour's _PeerConn feeding a real ChunkEngine that runs a
round, the control plane's ControlConn before and after authentication) and feeds it a stream made
of valid frames with mutated fields, random headers drawn from the schemas, truncated frames, huge
length prefixes and garbage, cut into random read sizes exactly as asyncio would deliver them
(get_buffer, then buffer_updated). Nothing but ProtocolError/FramingError may escape, every
invalid message must reach the handler typed, no loop callback may fail, and every example must
finish within its deadline: nothing hangs.
"""

import asyncio
import struct
from datetime import timedelta

import numpy as np
import pytest
from helpers.secret import SECRET
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.engine import ChunkEngine
from agents.workload import contribution
from core.plan import Job
from emulation.topology import uniform
from overlay.codec import MAX_HEADER, FrameProtocol
from overlay.control import ControlConn, control_protocol
from overlay.messages import CHUNK_KINDS, SCHEMAS, ProtocolError, bitmap
from overlay.peers import Overlay, _Handshake, _PeerConn
from scheduler.planners import star
from scheduler.view import NetworkView

pytestmark = pytest.mark.unit

CLUSTER = "fz"
CHUNK_PARAMS = 64  # 256-byte chunks: segments land, complete and get forwarded within one example
PARAMS = 3 * CHUNK_PARAMS
MAX_FRAME = 1 << 20  # what the fuzzed connections accept per frame (bounds allocations per example)
EXAMPLES = 2000


class FakeTransport:
    """What FrameProtocol and its handlers use of a transport; writes are kept, never sent."""

    def __init__(self) -> None:
        self.closing = False
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def writelines(self, parts: list) -> None:
        self.written += sum(len(p) for p in parts)

    def abort(self) -> None:
        self.closing = True

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


# --- strategies --------------------------------------------------------------------------------------------
ints = st.one_of(st.integers(-3, 8), st.integers(-2**63, 2**64 - 1))
nodes = st.sampled_from([0, 1, 2, 7, -1])
values = {
    int: ints,
    float: st.floats(allow_nan=True, allow_infinity=True),
    str: st.text(max_size=12),
    bytes: st.binary(max_size=40),
    list: st.lists(st.integers(-2, 9), max_size=6),
    tuple: st.lists(st.integers(-2, 9), max_size=6),
    dict: st.dictionaries(st.text(max_size=4), st.integers(-2, 9), max_size=4),
    bool: st.booleans(),
    object: st.none(),
}
any_value = st.one_of(*values.values())


def field_value(types: tuple[type, ...]) -> st.SearchStrategy:
    return st.one_of(*(values[t] for t in types))


CONTROL_TYPES = ("HELLO", "AUTH", "REGISTER", "PEERS", "HEARTBEAT", "REPORT", "JOB", "READY", "TASK",
                 "AUX_UPDATE", "TASK_DONE", "ABORT", "CLOCK", "STATS", "SHUTDOWN")


@st.composite
def schema_header(draw, types: tuple[str, ...] | None = None) -> dict:
    """A header of a known type with every field drawn from its schema types (optional ones or not)."""
    t = draw(st.sampled_from(sorted(types or SCHEMAS)))
    h: dict = {"t": t}
    for name, (kinds, required) in SCHEMAS[t].items():
        if required or draw(st.booleans()):
            h[name] = draw(field_value(kinds))
    return h


@st.composite
def valid_chunk(draw) -> tuple[dict, bytes]:
    """A well-formed segment node 1 may really get from neighbour 0: an aggregation child's partial
    sum (direct, or node 2's relayed through 0), or one to relay on to node 2; some for a later round."""
    path, hop = draw(st.sampled_from([([0, 1], 0), ([0, 1], 0), ([2, 0, 1], 1), ([0, 1, 2], 0)]))
    total = CHUNK_PARAMS * 4
    off = draw(st.sampled_from([0, 64, 128, 192]))
    nbytes = draw(st.sampled_from([64, 128, total - off]))
    nbytes = min(nbytes, total - off)
    h = {"t": "CHUNK", "job": 1, "task": draw(st.sampled_from([0, 0, 0, 1])), "attempt": 0, "version": 1,
         "chunk": draw(st.integers(0, 2)), "kind": "agg" if path[-1] == 1 else draw(st.sampled_from(CHUNK_KINDS)),
         "origin": path[0], "contributors": bitmap([path[0]]), "t_send": 0.0, "path": path, "hop": hop,
         "off": off, "total": total, "nbytes": nbytes}
    payload = np.arange(nbytes // 4, dtype=np.float32).tobytes()
    return h, payload


@st.composite
def chunk_header(draw) -> dict:
    """A CHUNK with every field drawn near its valid values: most fail one check or another."""
    h, _ = draw(valid_chunk())
    for name, choices in (("job", [1, 2]), ("task", [0, 5]), ("attempt", [0, 1]), ("version", [1, 2]),
                          ("chunk", [-1, 3, 1 << 40]), ("kind", [*CHUNK_KINDS, "zz"]), ("origin", [0, 1, 2, 7]),
                          ("total", [128, 1 << 20, 1 << 31]), ("nbytes", [0, 4, 6, 512]), ("off", [-4, 2, 256]),
                          ("hop", [1, 2, -1]), ("path", [[0], [0, 1, 0], [0, 2, 1], [2, 1], [0, 1, 7]]),
                          ("contributors", [b"", b"\x07", b"\xff" * 9])):
        if draw(st.integers(0, 9)) == 0:
            h[name] = draw(st.sampled_from(choices))
    return h


def segments(h: dict, seg: int) -> bytes:
    return b"".join(frame_bytes(dict(h, off=off, nbytes=seg), np.full(seg // 4, 1.0, np.float32).tobytes())
                    for off in range(0, h["total"], seg))


@st.composite
def whole_chunk(draw) -> bytes:
    """Every segment of one chunk in order, so chunks complete: acks, forwarding, round completion."""
    h, _ = draw(valid_chunk())
    return segments(h, draw(st.sampled_from([64, 128, 256])))


@st.composite
def both_children(draw) -> bytes:
    """One chunk from both of the hub's children (node 2's relayed through 0): the hub aggregates it,
    and broadcasts the result (or, for round 1, holds or refuses it)."""
    h, _ = draw(valid_chunk())
    h = dict(h, kind="agg")
    seg = draw(st.sampled_from([64, 256]))
    return (segments(dict(h, path=[0, 1], hop=0, origin=0, contributors=bitmap([0])), seg)
            + segments(dict(h, path=[2, 0, 1], hop=1, origin=2, contributors=bitmap([2])), seg))


@st.composite
def handshake_header(draw) -> dict:
    """Handshake messages close to what a real neighbour sends (it lacks only the secret)."""
    t = draw(st.sampled_from(["HELLO", "HELLO", "AUTH", "CHALLENGE"]))
    if t == "HELLO":
        return {"t": "HELLO", "node": draw(st.sampled_from([0, 0, 2, 1, 7])),
                "cluster": draw(st.sampled_from([CLUSTER, CLUSTER, CLUSTER, "other"])),
                "role": draw(st.sampled_from(["agent", "agent", "agent", "scheduler"])),
                "nonce": draw(st.one_of(st.binary(min_size=32, max_size=32), st.binary(max_size=70)))}
    if t == "AUTH":
        return {"t": "AUTH", "mac": draw(st.binary(min_size=31, max_size=33))}
    return {"t": "CHALLENGE", "nonce": draw(st.binary(max_size=40))}


@st.composite
def mutated(draw, base: st.SearchStrategy) -> dict:
    """A valid-looking header with one field dropped, retyped or added."""
    h = dict(draw(base))
    op = draw(st.sampled_from(["keep", "keep", "drop", "retype", "add"]))
    key = draw(st.sampled_from(sorted(h)))
    if op == "drop":
        del h[key]
    elif op == "retype":
        h[key] = draw(any_value)
    elif op == "add":
        h[draw(st.text(max_size=6))] = draw(any_value)
    return h


def frame_bytes(h: dict, payload: bytes | None = None) -> bytes:
    import msgpack

    body = msgpack.packb(h, use_bin_type=True)
    n = h.get("nbytes", 0)
    if payload is None:
        payload = b"\0" * n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 4096 else b""
    return struct.pack("!I", len(body)) + body + payload


HEADERS = {
    "peer": st.one_of(mutated(chunk_header()), chunk_header(), mutated(schema_header()), schema_header()),
    "handshake": st.one_of(handshake_header(), handshake_header(), mutated(handshake_header()), schema_header()),
    "control": st.one_of(schema_header(CONTROL_TYPES), schema_header(CONTROL_TYPES),
                         mutated(schema_header(CONTROL_TYPES)), schema_header()),
}


@st.composite
def piece(draw, target: str) -> bytes:
    headers = HEADERS[target.split("-")[0]]
    data = ["valid"] * 3 + ["whole"] * 2 + ["both"] * 2 + ["any_payload"] if target.startswith("peer") else []
    kind = draw(st.sampled_from(["frame"] * 6 + data + ["truncated", "huge", "zero", "garbage", "garbage_header"]))
    if kind == "frame":
        return frame_bytes(draw(headers))
    if kind == "valid":
        return frame_bytes(*draw(valid_chunk()))
    if kind == "whole":
        return draw(whole_chunk())
    if kind == "both":
        return draw(both_children())
    if kind == "any_payload":  # a well-formed segment whose float32 payload is any bytes (NaN, inf)
        h, _ = draw(valid_chunk())
        return frame_bytes(h, draw(st.binary(min_size=h["nbytes"], max_size=h["nbytes"])))
    if kind == "truncated":
        data = frame_bytes(draw(headers))
        return data[:draw(st.integers(0, max(0, len(data) - 1)))]
    if kind == "huge":
        return struct.pack("!I", draw(st.integers(MAX_HEADER + 1, 2**32 - 1))) + draw(st.binary(max_size=64))
    if kind == "zero":
        return b"\0\0\0\0"
    if kind == "garbage_header":
        junk = draw(st.binary(min_size=1, max_size=200))
        return struct.pack("!I", len(junk)) + junk
    return draw(st.binary(max_size=300))


@st.composite
def stream(draw, target: str) -> bytes:
    """Mostly-sane openings (a stream that dies on its first bytes tests little), then anything."""
    first = frame_bytes(draw(HEADERS[target.split("-")[0]]))
    return first + b"".join(draw(st.lists(piece(target), max_size=7)))


TARGETS = ("handshake", "peer", "control", "control-authenticated")
cases = st.sampled_from(TARGETS).flatmap(lambda t: st.tuples(st.just(t), stream(t)))
splits = st.lists(st.integers(1, 4096), min_size=1, max_size=16)


# --- the real handlers, fresh for every example ------------------------------------------------------------
def build(target: str) -> tuple[FrameProtocol, list[ProtocolError]]:
    """A FrameProtocol wired to a real handler; `errors` collects what the handler was told."""
    seen: list[ProtocolError] = []
    if target.startswith("control"):
        proto = control_protocol("fuzz")
        conn = ControlConn(proto)
        conn.authenticated = target == "control-authenticated"
        _connect(proto)
        _spy(conn, seen)
        return proto, seen
    eng = ChunkEngine(1, ROUTES)
    eng.hold_budget = 256  # one chunk: further frames for a later round are refused
    ov = Overlay(1, CLUSTER, eng, neighbors=[0, 2], secret=SECRET, max_payload=MAX_FRAME)
    eng.overlay = ov
    proto = FrameProtocol(peer=None, max_payload=MAX_FRAME)
    proto.handler = _Handshake(ov, proto, expect=None)
    _connect(proto)
    if target.startswith("peer"):
        eng.open_job(1, 0)
        eng.begin_task(1, 0, 0, PLAN, contribution(0, 0, 1, PLAN.params))
        ov._attach(0, proto)  # as if node 0 had just authenticated
        assert isinstance(proto.handler, _PeerConn)
    _spy(proto.handler, seen)
    ov_errors.append(ov.errors)
    return proto, seen


def _connect(proto: FrameProtocol) -> None:
    proto.connection_made(FakeTransport())  # type: ignore[arg-type]


def _spy(handler: object, seen: list[ProtocolError]) -> None:
    inner = handler.on_invalid  # type: ignore[attr-defined]

    def on_invalid(error: ProtocolError) -> None:
        seen.append(error)
        inner(error)

    handler.on_invalid = on_invalid  # type: ignore[attr-defined]


ov_errors: list[list] = []
ROUTES = uniform(3).routes()
PLAN = star.plan(NetworkView(uniform(3).links),
                 Job(PARAMS, CHUNK_PARAMS, (0, 1, 2), {"hub": 1})).with_version(1)


def feed(proto: FrameProtocol, data: bytes, sizes: list[int]) -> None:
    """Deliver `data` the way an asyncio transport does, in reads of the given sizes (cycled)."""
    i, k = 0, 0
    while i < len(data) and not proto.transport.is_closing():
        buf = proto.get_buffer(-1)
        assert len(buf) > 0, "get_buffer returned an empty buffer: asyncio would fail the connection"
        n = min(len(buf), len(data) - i, sizes[k % len(sizes)])
        buf[:n] = data[i:i + n]
        proto.buffer_updated(n)
        i, k = i + n, k + 1


LOOP_ERRORS: list[dict] = []


def _run(coro_fn) -> None:  # noqa: ANN001
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, ctx: LOOP_ERRORS.append(ctx)
                               if "exception was never retrieved" not in ctx.get("message", "") else None)
    try:
        loop.run_until_complete(coro_fn())
    finally:
        loop.close()


def check_one(target: str, data: bytes, sizes: list[int]) -> None:
    async def go() -> None:
        ov_errors.clear()
        proto, seen = build(target)
        try:
            feed(proto, data, sizes)
        except ProtocolError:
            pass  # typed: allowed to escape (FrameProtocol catches these itself, so none do)
        proto.connection_lost(None)  # the peer hangs up mid-whatever: handlers must cope
        await asyncio.sleep(0)  # run what the handlers scheduled
        assert all(isinstance(e, ProtocolError) for e in seen), seen
        for errs in ov_errors:
            assert all(isinstance(e, ProtocolError) for e in errs), errs

    LOOP_ERRORS.clear()
    with np.errstate(all="ignore"):  # fuzzed payloads are NaN and inf as often as not
        _run(go)
    assert not LOOP_ERRORS, LOOP_ERRORS


@settings(max_examples=EXAMPLES, deadline=timedelta(seconds=2), database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases, sizes=splits)
def test_fuzzed_streams_raise_nothing_but_typed_protocol_errors(case, sizes):
    check_one(case[0], case[1], sizes)


@settings(max_examples=300, deadline=timedelta(seconds=2), database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(target=st.sampled_from(TARGETS), pieces=st.lists(st.binary(max_size=64), max_size=40))
def test_unstructured_bytes_in_tiny_reads(target, pieces):
    """Pure noise, one to a few bytes per read: the parser's state machine at every boundary."""
    check_one(target, b"".join(pieces), [1, 2, 3, 1, 7])


def test_a_valid_round_still_completes_through_the_fuzz_harness():
    """The harness is not vacuous: well-formed segments from both children complete the hub's chunks."""
    seen_done = {}

    async def go() -> None:
        eng = ChunkEngine(1, ROUTES)
        ov = Overlay(1, CLUSTER, eng, neighbors=[0, 2], secret=SECRET)
        eng.overlay = ov
        eng.open_job(1, 0)
        rs = eng.begin_task(1, 0, 0, PLAN, contribution(0, 0, 1, PLAN.params))
        for child in (0, 2):
            proto = FrameProtocol(peer=None)
            proto.handler = _Handshake(ov, proto, expect=None)
            _connect(proto)
            ov._attach(child, proto)
            want = contribution(0, 0, child, PLAN.params)
            data = b""
            for c, (off, n) in enumerate(PLAN.layout):
                h = {"t": "CHUNK", "job": 1, "task": 0, "attempt": 0, "version": 1, "chunk": c, "kind": "agg",
                     "origin": child, "contributors": bitmap([child]), "t_send": 0.0, "path": [child, 1],
                     "hop": 0, "off": 0, "total": n * 4, "nbytes": n * 4}
                data += frame_bytes(h, want[off:off + n].tobytes())
            feed(proto, data, [5, 77, 1000])
            assert not proto.transport.is_closing() and not ov.errors, ov.errors
        seen_done["done"] = rs.done.done() and not rs.done.exception()
        expect = sum(contribution(0, 0, n, PLAN.params) for n in (0, 1, 2))
        assert np.array_equal(rs.result, expect)

    _run(go)
    assert seen_done["done"]
