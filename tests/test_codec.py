"""Frame codec: round trips in any split, and every malformed-frame case, on the real BufferedProtocol."""

import asyncio
import random
import struct

import msgpack
import numpy as np
import pytest
from helpers.frames import FakeTransport, Recorder, chunk, feed
from helpers.waiting import until

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


# --- reading gives way: one connection at memory speed must not hold the loop ----------------------------------
def holding(proto: FrameProtocol) -> bool:
    return not proto.transport.reading


async def test_reading_pauses_after_a_turns_bytes_and_resumes_on_the_next_turn():
    rec = Recorder()
    proto = make(rec)
    proto.read_turn = 100_000
    payload = bytes(40_000)
    feed(proto, (encode(chunk(len(payload))) + payload) * 2, random.Random(3))
    assert not holding(proto)  # 80 KB: under a turn's worth
    feed(proto, encode(chunk(len(payload))) + payload, random.Random(4))
    assert holding(proto)  # the loop goes round before this connection is read again
    await asyncio.sleep(0)
    assert not holding(proto)
    assert len(rec.frames) == 3  # nothing read was dropped meanwhile


async def test_reading_resumes_only_once_every_reason_to_hold_it_is_released():
    """The downlink cap holds a connection for its debt; a turn that ends meanwhile must not resume it."""
    proto = make(Recorder())
    proto.read_turn = 10_000
    proto.hold_reading("cap")
    feed(proto, encode(chunk(20_000)) + bytes(20_000), random.Random(5))
    await asyncio.sleep(0)  # the turn ends: its own hold is released, the cap's is not
    assert holding(proto)
    proto.hold_reading("inbox")
    proto.release_reading("cap")
    assert holding(proto)
    proto.release_reading("inbox")
    assert not holding(proto)
    proto.release_reading("inbox")  # released twice: nothing to do
    assert not holding(proto)


@pytest.mark.loopback
def test_a_connection_with_megabytes_waiting_lets_the_loop_go_round_every_turn():
    """uvloop reads a readable socket up to 32 times per wake-up while each read fills its buffer: a
    peer writing at memory speed held the loop in one connection for tens of ms, and the scheduler's
    TASK on another socket waited behind it. Here a real uvloop loop finds megabytes of 16 KB frames
    waiting in the kernel at once; the bytes read between two consecutive loop turns are counted."""
    uvloop = pytest.importorskip("uvloop")
    import fcntl
    import socket
    import termios
    import threading

    from overlay.codec import SCRATCH

    frame, turn, count, queued = 16 * 1024, 128 * 1024, 200, 1 << 20
    stream = b"".join(encode(chunk(frame, chunk=i)) + bytes(frame) for i in range(count))
    rec = Recorder()
    per_turn: list[int] = []

    def waiting(proto: FrameProtocol) -> int:
        fd = proto.transport.get_extra_info("socket").fileno()
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        protos: list[FrameProtocol] = []

        class Held(FrameProtocol):
            def connection_made(self, transport) -> None:  # noqa: ANN001
                super().connection_made(transport)
                transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
                # the bytes pile up in the kernel first (uvloop starts reading after connection_made)
                asyncio.get_running_loop().call_soon(self.hold_reading, "test")

        def made() -> FrameProtocol:
            p = Held(rec, peer="flood")
            p.read_turn = turn
            protos.append(p)
            return p

        server = await loop.create_server(made, "127.0.0.1", 0)
        sock = socket.create_connection(("127.0.0.1", server.sockets[0].getsockname()[1]))
        writer = threading.Thread(target=sock.sendall, args=(stream,), daemon=True)
        writer.start()
        await until(lambda: protos and waiting(protos[0]) >= queued, "a megabyte queued in the kernel", timeout=60)
        done = asyncio.Event()
        last = 0

        def probe() -> None:
            nonlocal last
            per_turn.append(protos[0].bytes_in - last)
            last = protos[0].bytes_in
            if len(rec.frames) < count:
                loop.call_soon(probe)
            else:
                done.set()

        last = protos[0].bytes_in  # what came before the hold took effect is not this turn's
        protos[0].release_reading("test")
        loop.call_soon(probe)
        try:
            await asyncio.wait_for(done.wait(), 120)
        finally:
            writer.join(30)
            sock.close()
            server.close()

    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert len(rec.frames) == count and not rec.invalid
    # a turn reads up to the limit and at most one read more (a read fills at most the 64 KiB scratch)
    assert max(per_turn) <= turn + SCRATCH + 1024, max(per_turn)
