"""Frame codec: round trips in any split, and every malformed-frame case, on the real BufferedProtocol."""

import random
import struct

import msgpack
import numpy as np
import pytest
from helpers.frames import FakeTransport, Recorder, chunk, feed

from overlay.codec import MAX_HEADER, FrameProtocol, encode
from overlay.messages import FramingError, ProtocolError, validate

pytestmark = pytest.mark.unit


def make(rec) -> FrameProtocol:
    p = FrameProtocol(rec, peer="peer-x")
    p.transport = FakeTransport()
    return p


@pytest.mark.parametrize("seed", range(5))
async def test_round_trip_random_splits(seed):
    rng = random.Random(seed)
    rec = Recorder()
    proto = make(rec)
    sent, stream = [], b""
    for i in range(40):
        if rng.random() < 0.5:
            payload = np.arange(rng.randint(1, 50_000), dtype=np.float32).tobytes()
            h = chunk(len(payload), chunk=i)
        else:
            payload, h = b"", {"t": "HEARTBEAT", "node": i, "time": 0.5}
        sent.append((h, payload))
        stream += encode(h) + payload
    feed(proto, stream, rng)
    assert not rec.invalid and not proto.transport.aborted
    assert [(h, p) for h, p in sent] == [(h, p or b"") for h, p in rec.frames]


async def test_payload_lands_in_the_handlers_buffer():
    dest = np.zeros(1000, np.float32)
    rec = Recorder(dest)
    proto = make(rec)
    data = np.arange(1000, dtype=np.float32)
    feed(proto, encode(chunk(4000)) + data.tobytes(), random.Random(1))
    assert np.array_equal(dest, data)


async def test_a_payload_let_go_lands_no_further_byte_in_its_owners_memory():
    """An aborted task's result region is the training script's again: the rest of a frame half read into it
    goes to the codec's own buffer, and the frame is still delivered whole (its handler drops it)."""
    dest = np.zeros(1000, np.float32)
    rec = Recorder(dest)
    proto = make(rec)
    data = np.arange(1, 1001, dtype=np.float32)
    stream = encode(chunk(4000)) + data.tobytes()
    head = len(stream) - 4000 + 1600  # the header and 400 values in
    buf = proto.get_buffer(-1)
    buf[:head] = stream[:head]
    proto.buffer_updated(head)
    assert np.array_equal(dest[:400], data[:400]) and not dest[400:].any()
    assert not proto.let_go(np.zeros(3, np.float32))  # another owner's memory: nothing changes
    assert proto.let_go(dest)
    feed(proto, stream[head:], random.Random(2))
    assert not dest[400:].any()  # not one byte more
    assert len(rec.frames) == 1 and len(rec.frames[0][1]) == 4000
    assert not proto.let_go(dest)  # nothing is being read into it now


@pytest.mark.parametrize("prefix", [struct.pack("!I", 0), struct.pack("!I", MAX_HEADER + 1), b"\xff\xff\xff\xff"])
async def test_bad_length_closes_the_connection(prefix):
    rec = Recorder()
    proto = make(rec)
    feed(proto, prefix + b"x" * 100, random.Random(0))
    assert proto.transport.aborted
    assert isinstance(rec.invalid[0], FramingError)


async def test_oversize_payload_closes_the_connection():
    rec = Recorder()
    proto = make(rec)
    proto.max_payload = 1024
    feed(proto, encode(chunk(4096)), random.Random(0))
    assert proto.transport.aborted and isinstance(rec.invalid[0], FramingError)


async def test_truncated_frame_is_reported_on_close():
    rec = Recorder()
    proto = make(rec)
    feed(proto, (encode(chunk(4000)) + b"\0" * 4000)[:-10], random.Random(0))
    proto.connection_lost(None)
    assert isinstance(rec.closed[0], FramingError) and "middle of a frame" in str(rec.closed[0])


@pytest.mark.parametrize("header, field", [
    ({"t": "NOPE"}, "t"),
    ({"t": "HEARTBEAT"}, "node"),
    ({"t": "HEARTBEAT", "node": "3", "time": 1.0}, "node"),
    ({"t": "HEARTBEAT", "node": True, "time": 1.0}, "node"),
    ({"t": "HEARTBEAT", "node": 1, "time": 1.0, "nbytes": 8}, "nbytes"),
    ({"t": "ACK", "job": 1, "task": 0, "attempt": 0, "version": 1, "chunk": 0, "kind": "zzz", "origin": 0,
      "dst": 1}, "kind"),
    ({"nope": 1}, "t"),
])
async def test_invalid_message_is_a_typed_error_and_the_stream_continues(header, field):
    rec = Recorder()
    proto = make(rec)
    body = msgpack.packb(header)
    bad = struct.pack("!I", len(body)) + body + (b"\0" * header.get("nbytes", 0))
    good = encode({"t": "HEARTBEAT", "node": 7, "time": 2.0})
    feed(proto, bad + good, random.Random(0))
    assert len(rec.invalid) == 1 and rec.invalid[0].field == field
    assert rec.invalid[0].peer == "peer-x" and "peer-x" in str(rec.invalid[0])
    assert rec.frames == [({"t": "HEARTBEAT", "node": 7, "time": 2.0}, None)]
    assert not proto.transport.aborted


async def test_garbage_header_is_a_protocol_error_not_a_crash():
    rec = Recorder()
    proto = make(rec)
    feed(proto, struct.pack("!I", 5) + b"\xc1\xc1\xc1\xc1\xc1" + encode({"t": "SHUTDOWN"}), random.Random(0))
    assert len(rec.invalid) == 1 and isinstance(rec.invalid[0], ProtocolError)
    assert rec.frames == [({"t": "SHUTDOWN"}, None)]


async def test_too_many_invalid_messages_disconnect_the_peer():
    rec = Recorder()
    proto = make(rec)
    bad = encode({"t": "HEARTBEAT"} | {"node": "x", "time": 0})
    feed(proto, bad * 20, random.Random(0))
    assert proto.transport.aborted and len(rec.invalid) == proto.max_invalid


@pytest.mark.parametrize("change, field", [
    ({"path": [0]}, "path"), ({"path": [0, 1, 0]}, "path"), ({"hop": 1}, "hop"),
    ({"off": 8, "nbytes": 8, "total": 8}, "off"), ({"nbytes": 6, "total": 6}, "nbytes"),
    ({"kind": "sum"}, "kind"), ({"contributors": 3}, "contributors"),
])
def test_chunk_validation_names_the_field(change, field):
    with pytest.raises(ProtocolError) as e:
        validate(chunk(8) | change, peer="p")
    assert e.value.field == field
