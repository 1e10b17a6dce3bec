"""CHUNK and ACK, the data plane's hot headers, are checked by inlined rules first (overlay.messages):
every rule of their records must still refuse what it refused, naming the same field, and the inlined
check must never accept what the generic path refuses."""

import math

import pytest
from helpers.frames import chunk
from hypothesis import given, settings
from hypothesis import strategies as st

from core.classes import MAX_WEIGHT
from overlay.messages import (
    MAX_CHUNK_BYTES,
    MAX_ITEMS,
    MAX_NODE,
    MAX_PROBE_CHUNK_BYTES,
    PROBE_JOB,
    ProtocolError,
    _ack_ok,
    _chunk_ok,
    _validate,
    validate,
)

pytestmark = pytest.mark.unit

ACK = {"t": "ACK", "job": 1, "task": 0, "attempt": 0, "version": 1, "chunk": 3, "kind": "agg", "origin": 0, "dst": 1}
MISSING = object()
INTS = ("job", "task", "attempt", "version", "chunk", "hop", "off", "total", "nbytes")


def changed(h: dict, change: dict) -> dict:
    out = dict(h)
    for k, v in change.items():
        if v is MISSING:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def refused_field(h: dict) -> str | None:
    try:
        validate(h, peer="p")
    except ProtocolError as e:
        return e.field
    return None


CHUNK_BAD = [
    *[({f: v}, f) for f in INTS for v in (-1, True, 1.0, "1", None, MISSING)],
    *[({"origin": v}, "origin") for v in (-1, MAX_NODE, True, 0.0, MISSING)],
    *[({"kind": v}, "kind") for v in ("sum", 5, None, MISSING)],
    *[({"contributors": v}, "contributors") for v in (b"\xff" * (MAX_NODE // 8 + 1), "ab", 3, MISSING)],
    *[({"t_send": v}, "t_send") for v in (math.inf, -math.inf, math.nan, "x", True, None, MISSING)],
    *[({"path": v}, "path") for v in ([0], [], [0, 1, 0], [0, MAX_NODE], [0, -1], [0, True], [0, 1.0], "01",
                                      b"\x00\x01", {0: 1, 1: 2}, (0, 1.0), None,
                                      [0, 1] + list(range(2, MAX_ITEMS + 1)), MISSING)],
    ({"off": -4}, "off"),  # a multiple of 4 that still fits the chunk
    ({"hop": 1}, "hop"),
    ({"path": [0, 1, 2], "hop": 2}, "hop"),
    ({"nbytes": 0, "total": 8}, "nbytes"),
    ({"off": 8, "nbytes": 8, "total": 8}, "off"),
    ({"off": 4, "nbytes": 8, "total": 8}, "off"),
    ({"nbytes": 6, "total": 6}, "nbytes"),
    ({"off": 2, "nbytes": 4, "total": 8}, "nbytes"),
    ({"nbytes": 8, "total": 10}, "nbytes"),
    ({"nbytes": 8, "total": MAX_CHUNK_BYTES + 4}, "total"),
    ({"kind": "probe", "path": [0, 1, 2]}, "path"),
    ({"kind": "probe", "job": PROBE_JOB, "path": [0, 1, 2]}, "path"),
    ({"kind": "probe", "job": PROBE_JOB + 1}, "path"),
    ({"kind": "probe", "job": PROBE_JOB, "nbytes": 8, "total": MAX_PROBE_CHUNK_BYTES + 4}, "path"),
    *[({"cls": v}, "cls") for v in (
        None, [0, 1.0, 0], [0, 1.0, 0, -1.0, 0], "x", {0: 0, 1: 0, 2: 0, 3: 0}, b"\x00\x01\x00\x00",
        [-1, 1.0, 0, -1.0], [MAX_ITEMS, 1.0, 0, -1.0],
        [True, 1.0, 0, -1.0], [0.0, 1.0, 0, -1.0], [0, 0.0, 0, -1.0], [0, -1.0, 0, -1.0], [0, MAX_WEIGHT * 2, 0, -1.0],
        [0, math.inf, 0, -1.0], [0, math.nan, 0, -1.0], [0, True, 0, -1.0], [0, "1", 0, -1.0], [0, 1.0, 8, -1.0],
        [0, 1.0, -1, -1.0], [0, 1.0, 1.0, -1.0], [0, 1.0, True, -1.0], [0, 1.0, 0, -0.5], [0, 1.0, 0, -2],
        [0, 1.0, 0, math.nan], [0, 1.0, 0, math.inf], [0, 1.0, 0, "x"], [0, 1.0, 0, None])],
]


@pytest.mark.parametrize("change, field", CHUNK_BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(CHUNK_BAD)])
def test_every_chunk_rule_still_refuses_and_names_its_field(change, field):
    assert refused_field(changed(chunk(8), change)) == field


ACK_BAD = [
    *[({f: v}, f) for f in ("job", "task", "attempt", "version", "chunk") for v in (-1, True, 1.0, None, MISSING)],
    *[({f: v}, f) for f in ("origin", "dst") for v in (-1, MAX_NODE, True, 1.0, MISSING)],
    *[({"kind": v}, "kind") for v in ("nope", 1, None, MISSING)],
    ({"nbytes": 4}, "nbytes"),
    ({"nbytes": True}, "nbytes"),
]


@pytest.mark.parametrize("change, field", ACK_BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(ACK_BAD)])
def test_every_ack_rule_still_refuses_and_names_its_field(change, field):
    assert refused_field(changed(ACK, change)) == field


@pytest.mark.parametrize("h", [
    chunk(8), chunk(4, path=[4, 2, 9], hop=1, off=4, total=12, t_send=3),
    chunk(8, cls=[0, 1.0, 7, 12.5]), chunk(8, cls=[3, 2, 0, -1]), chunk(8, cls=[0, MAX_WEIGHT, 0, 0.0]),
    chunk(MAX_CHUNK_BYTES, off=0), chunk(8, origin=MAX_NODE - 1, contributors=b"\xff" * (MAX_NODE // 8)),
    chunk(MAX_PROBE_CHUNK_BYTES, kind="probe", job=PROBE_JOB, cls=[0, 0.25, 0, -1.0]),
])
def test_the_inlined_check_takes_the_well_formed_chunks(h):
    assert _chunk_ok(h) and validate(h) is h and _validate(h, None) is h


def test_the_inlined_check_takes_the_well_formed_acks():
    for kind in ("agg", "bcast", "mcast", "probe"):
        h = ACK | {"kind": kind, "origin": MAX_NODE - 1, "dst": 0}
        assert _ack_ok(h) and validate(h) is h


# Values around every bound and of every type a msgpack header can hold.
EDGES = [0, 1, -1, 2, 3, 4, 8, 12, MAX_NODE - 1, MAX_NODE, MAX_ITEMS, MAX_CHUNK_BYTES, MAX_CHUNK_BYTES + 4, True,
         False, 0.0, 1.5, -1.0, math.inf, math.nan, "agg", "probe", "x", b"", b"\x01", None, [], [0, 1], [1, 0],
         [0, 1, 2], [0, 0], [0, 1.0, 0, -1.0], [0, 1.0, 0, 2.0], {"a": 1}, MISSING]


@settings(max_examples=3000, deadline=None)
@given(base=st.sampled_from(["chunk", "chunk_cls", "ack"]),
       changes=st.dictionaries(st.sampled_from([*INTS, "origin", "dst", "kind", "contributors", "t_send", "path",
                                                "cls", "t"]), st.sampled_from(EDGES), max_size=3))
def test_the_inlined_check_never_accepts_what_the_generic_path_refuses(base, changes):
    h = changed({"chunk": chunk(8), "chunk_cls": chunk(8, cls=[0, 1.0, 0, -1.0]), "ack": ACK}[base], changes)
    try:
        _validate(h, None)
        generic = None
    except ProtocolError as e:
        generic = e.field
    assert refused_field(h) == generic
