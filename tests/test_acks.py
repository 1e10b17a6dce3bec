"""Acks: those of one turn of the event loop leave in one frame (ACKS), at the start of the next turn,
without the link's send loop; never inside another frame, never across an outage; and a peer's ACKS
is validated like any message (a huge or malformed key list is a ProtocolError, nothing acked)."""

import asyncio
import random

import numpy as np
import pytest
from helpers.cluster import LocalNet
from helpers.frames import FakeTransport, Recorder, Sink, feed, header
from helpers.topologies import line
from helpers.waiting import until

from emulation.link import LinkShaper, LinkSpec
from overlay.codec import FrameProtocol, encode
from overlay.link import WRITE_PIECE, LinkSender, Transfer
from overlay.messages import MAX_ACK_KEYS, MAX_NODE, ProtocolError, acked_keys, validate


class Wire:
    """A transport that keeps what is written, in order."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data) -> None:  # noqa: ANN001
        self.data += data

    def writelines(self, parts) -> None:  # noqa: ANN001
        for p in parts:
            self.data += p

    def is_closing(self) -> bool:
        return False

    def abort(self) -> None:
        pass

    def frames(self) -> list[tuple[dict, bytes | None]]:
        rec = Recorder()
        proto = FrameProtocol(rec, peer="wire")
        proto.transport = FakeTransport()
        feed(proto, bytes(self.data), random.Random(0))
        assert not rec.invalid, rec.invalid
        return rec.frames


def key(chunk: int) -> tuple:
    return (1, 0, 0, 1, chunk, "agg", 0, 1)


def attached(pacer=None) -> tuple[LinkSender, FrameProtocol, Wire]:  # noqa: ANN001
    sender = LinkSender(1, 0, pacer=pacer)
    proto = FrameProtocol(None, peer=0)
    wire = Wire()
    proto.transport = wire
    sender.attach(proto)
    return sender, proto, wire


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.mark.unit
async def test_the_acks_of_one_turn_leave_in_one_frame_without_the_send_loop():
    sender, _, wire = attached()  # never started: no send loop runs
    for c in range(3):
        sender.send_ack(key(c))
    assert not wire.data  # not within the turn that produced them ...
    await asyncio.sleep(0)
    frames = wire.frames()  # ... but at the start of the next one
    assert [h["t"] for h, _ in frames] == ["ACKS"] and acked_keys(frames[0][0]) == [key(c) for c in range(3)]
    sender.send_ack(key(7))  # one alone: a plain ACK
    await asyncio.sleep(0)
    assert [h["t"] for h, _ in wire.frames()] == ["ACKS", "ACK"] and acked_keys(wire.frames()[1][0]) == [key(7)]
    assert (sender.ack_frames, sender.acks_sent) == (2, 4)


@pytest.mark.unit
async def test_more_acks_than_a_frame_may_carry_go_in_several_frames():
    sender, _, wire = attached()
    n = 2 * MAX_ACK_KEYS + 5
    for c in range(n):
        sender.send_ack(key(c))
    await asyncio.sleep(0)
    frames = wire.frames()
    assert [len(h["keys"]) for h, _ in frames] == [MAX_ACK_KEYS, MAX_ACK_KEYS, 5]
    assert [k for h, _ in frames for k in acked_keys(h)] == [key(c) for c in range(n)]


@pytest.mark.unit
async def test_acks_never_cut_into_a_frame_being_written():
    """Unpaced, a large segment goes in pieces with a drain between them: acks wait for its last piece."""
    sender, proto, wire = attached()
    sender.start()
    try:
        payload = np.arange(3 * WRITE_PIECE // 4, dtype=np.float32)
        data = memoryview(payload).cast("B")
        h = header(chunk=9, origin=1, path=[1, 0], hop=0, total=len(data))
        proto.pause_writing()  # the transport is full: the send loop waits after the first piece
        sender.send(Transfer(key=key(9), header=h, payload=data, ready=len(data), flow=(1, 0)))
        await until(lambda: len(wire.data) > WRITE_PIECE, "the first piece to be written")
        written = len(wire.data)
        sender.send_ack(key(1))
        sender.send_ack(key(2))
        await turns()
        assert len(wire.data) == written  # held back: the frame is not whole yet
        proto.resume_writing()
        await until(lambda: len(wire.frames()) == 2, "the segment's last pieces, then the acks")
        (chunk_h, got), (ack_h, _) = wire.frames()
        assert chunk_h["t"] == "CHUNK" and got == data.tobytes()
        assert acked_keys(ack_h) == [key(1), key(2)]
    finally:
        await sender.close()


@pytest.mark.unit
async def test_no_ack_crosses_a_link_that_holds_every_byte():
    shaper = LinkShaper(LinkSpec(1000.0))
    sender, _, wire = attached(shaper)
    sender.start()
    try:
        await turns()  # the send loop has nothing to send: it waits for a wake-up
        shaper.blackhole(True)
        sender.send_ack(key(1))
        await turns(10)  # the turns in which an ack would leave, had the link let it
        assert not wire.data
        shaper.blackhole(False)  # then it goes, with nothing else to send on the link
        await until(lambda: bool(wire.data), "the held ack once the link carries bytes again")
        assert acked_keys(wire.frames()[0][0]) == [key(1)]
    finally:
        await sender.close()


ACKS_BAD = [
    [], [list(key(0))] * (MAX_ACK_KEYS + 1), "keys", {"a": 1}, None, [5], [[1, 0, 0, 1, 0, "agg", 0]],
    [[*key(0), 1]], [[-1, 0, 0, 1, 0, "agg", 0, 1]], [[1, True, 0, 1, 0, "agg", 0, 1]],
    [[1, 0, 0.0, 1, 0, "agg", 0, 1]], [[1, 0, 0, -1, 0, "agg", 0, 1]], [[1, 0, 0, 1, -1, "agg", 0, 1]],
    [[1, 0, 0, 1, 0, "sum", 0, 1]], [[1, 0, 0, 1, 0, b"agg", 0, 1]], [[1, 0, 0, 1, 0, "agg", MAX_NODE, 1]],
    [[1, 0, 0, 1, 0, "agg", 0, -1]], [[1, 0, 0, 1, 0, "agg", 0, "1"]], [list(key(0)), "x"],
    [list(key(0)), {0: 1, 1: 0, 2: 0, 3: 1, 4: 0, 5: "agg", 6: 0, 7: 1}], [[True, 0, 0, 1, 0, "agg", 0, 1]],
    [[1.0, 0, 0, 1, 0, "agg", 0, 1]], [[1, 0, 0, "1", 0, "agg", 0, 1]], [[1, 0, 0, 1, 1.0, "agg", 0, 1]],
    [[1, 0, 0, 1, 0, "agg", True, 1]], [[1, 0, 0, 1, 0, "agg", -1, 1]], [[1, 0, -1, 1, 0, "agg", 0, 1]],
    [[1, -1, 0, 1, 0, "agg", 0, 1]], [[1, 0, 0, 1, 0, "agg", 0, MAX_NODE]], [[1, 0, 0, 1, 0, None, 0, 1]],
]


@pytest.mark.unit
@pytest.mark.parametrize("keys", ACKS_BAD, ids=[str(i) for i in range(len(ACKS_BAD))])
def test_a_malformed_or_huge_key_list_is_refused(keys):
    with pytest.raises(ProtocolError) as e:
        validate({"t": "ACKS", "keys": keys})
    assert e.value.field == "keys" and e.value.msg_type == "ACKS"


@pytest.mark.unit
def test_acks_carry_no_payload_and_need_their_keys():
    for h, field in (({"t": "ACKS", "keys": [list(key(0))], "nbytes": 4}, "nbytes"), ({"t": "ACKS"}, "keys")):
        with pytest.raises(ProtocolError) as e:
            validate(h)
        assert e.value.field == field
    full = {"t": "ACKS", "keys": [list(key(c)) for c in range(MAX_ACK_KEYS)]}
    assert validate(full) is full and validate({"t": "ACKS", "keys": [key(1)]})


@pytest.mark.loopback
async def test_a_peers_acks_release_the_chunks_they_name_and_a_bad_list_releases_none():
    async with LocalNet(line(2)) as net:
        sink = net.overlays[1].sink = Sink()
        net.overlays[1].senders[0].send_ack = lambda key: None  # node 1 takes chunks and acks none itself
        sender = net.overlays[0].senders[1]
        data = memoryview(np.ones(1000, np.float32)).cast("B")
        trs = [net.overlays[0].send_chunk(header(chunk=c), data, (0, 1)) for c in range(4)]
        await until(lambda: len(sink.segments) == 4, "node 1 to receive the four chunks")
        conn = net.overlays[1]._conns[0]  # we speak for node 1 on its socket
        conn.write_raw(encode({"t": "ACKS", "keys": [trs[0].key, [*trs[1].key[:7], MAX_NODE]]}))
        conn.write_raw(encode({"t": "ACKS", "keys": [trs[2].key, trs[3].key]}))
        await until(lambda: trs[2].done.done() and trs[3].done.done(), "the good ACKS to release its two chunks")
        assert set(sender.unacked) == {trs[0].key, trs[1].key}  # the bad list released nothing
        assert any(e.field == "keys" and e.msg_type == "ACKS" for e in net.overlays[0].errors)
        await until(lambda: net.overlays[0].in_transit((0, 1)) == 2, "two chunks left in transit")


@pytest.mark.loopback
async def test_chunks_that_complete_in_one_read_are_acknowledged_in_fewer_frames():
    """Many small whole chunks in one write: the receiver takes them in a read or a few, and acks
    each read's in one frame; every chunk is acknowledged."""
    async with LocalNet(line(2)) as net:
        net.overlays[1].sink = Sink()
        data = memoryview(np.ones(64, np.float32)).cast("B")
        n = 60
        trs = [net.overlays[0].send_chunk(header(chunk=c), data, (0, 1)) for c in range(n)]
        await asyncio.wait_for(asyncio.gather(*(t.done for t in trs)), 30)
        back = net.overlays[1].senders[0]
        assert back.acks_sent == n and back.ack_frames < n
        assert net.overlays[0].senders[1].meter.acks == n
