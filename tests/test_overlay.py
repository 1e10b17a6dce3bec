"""The overlay on real sockets: duplicates and resends are dropped, cut connections lose nothing."""

import asyncio

import numpy as np
import pytest
from helpers.cluster import LocalNet
from helpers.frames import Sink, header
from helpers.topologies import line
from helpers.waiting import until

from core.plan import Job
from emulation.topology import internet2, uniform
from overlay.codec import encode
from overlay.messages import chunk_key
from scheduler.planners import PLANNERS
from scheduler.view import NetworkView

pytestmark = pytest.mark.loopback


async def test_relay_delivers_once_and_every_hop_acks():
    async with LocalNet(line(3)) as net:
        sink = Sink()
        net.overlays[2].sink = sink
        net.engines[1].open_job(1)  # the relay expects job 1's traffic (unknown jobs are refused)
        data = np.arange(50_000, dtype=np.float32)
        tr = net.overlays[0].send_chunk(header(), memoryview(data).cast("B"), (0, 1, 2))
        await asyncio.wait_for(tr.done, 30)  # node 1 acked; node 2 acks to node 1 in its own time
        await until(lambda: sum(len(p) for *_, p in sink.segments) >= data.nbytes
                    and not net.overlays[1].senders[2].unacked, "node 2 to receive the chunk and ack it")
        got = b"".join(p for _, _, p in sorted(sink.segments, key=lambda s: s[1]))
        assert got == data.tobytes()
        assert len(sink.segments) == -(-data.nbytes // (64 * 1024))
        assert not net.overlays[0].senders[1].unacked and not net.overlays[1].senders[2].unacked


async def test_duplicate_and_resent_frames_are_dropped():
    async with LocalNet(line(2)) as net:
        sink = Sink()
        net.overlays[1].sink = sink
        payload = np.ones(1000, np.float32).tobytes()
        h = header(path=[0, 1], hop=0, off=0, total=len(payload), nbytes=len(payload), t_send=0.0)
        conn = net.overlays[0]._conns[1]
        for _ in range(3):  # the same frame three times, as a resend after a lost ack would
            conn.write_raw(encode(h))
            conn.write_raw(payload)
        # then a real transfer on the same connection: once it is acked, node 1 has read the three
        # frames before it and node 0 every ack node 1 sent for them
        marker = net.overlays[0].send_chunk(header(chunk=1), memoryview(payload), (0, 1))
        await asyncio.wait_for(marker.done, 30)
        assert [s[0] for s in sink.segments].count(chunk_key(h)) == 1
        assert net.overlays[0].senders[1].meter.acks == 1  # the marker's: acks for unknown transfers are ignored


@pytest.mark.parametrize("scheme", ["star", "ring"])
async def test_cut_connections_mid_round_lose_nothing_and_double_nothing(scheme):
    topo = internet2().scaled(0.1)
    async with LocalNet(topo, shaped=True) as net:
        plan = PLANNERS[scheme](NetworkView(topo.links), Job(400_000, 30_000, tuple(range(9)))).with_version(1)
        cuts = [(5, 3), (5, 6), (0, 1)]
        senders = [net.overlays[x].senders[y] for a, b in cuts for x, y in ((a, b), (b, a))]
        rnd = asyncio.ensure_future(net.run_round(plan))  # asserts the exact sum everywhere
        hits = 0
        for _ in range(4):  # each cut while bytes of a chunk are on the way over a cut link
            await until(lambda: rnd.done() or any(tr.sent for s in senders for tr in s.unacked.values()),
                        "a chunk part-sent over a link to cut")
            if rnd.done():
                break
            before = [s.conn for s in senders]
            for a, b in cuts:
                net.overlays[a].drop_connection(b)
            hits += 1
            await until(lambda before=before: rnd.done() or all(s.conn is not None and s.conn is not c
                                                                for s, c in zip(senders, before, strict=True)),
                        "the cut links to reconnect")
        await asyncio.wait_for(rnd, 60)
        assert hits > 0
        resent = sum(s.meter.resent for ov in net.overlays.values() for s in ov.senders.values())
        assert resent > 0  # the cuts really hit transfers in flight


async def test_wrong_cluster_neighbour_is_refused():
    topo = uniform(2)
    async with LocalNet(topo, cluster="a") as net:
        from overlay.peers import Overlay
        intruder = Overlay(1, "b", Sink(), neighbors=[0])
        await intruder.listen()
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(lambda: intruder._protocol(0), "127.0.0.1", net.overlays[0].port)
        proto.write({"t": "HELLO", "node": 1, "cluster": "b", "role": "agent"})
        await asyncio.wait_for(proto.closed, 5)
        assert any("cluster 'b'" in str(e) for e in net.overlays[0].errors)
        await intruder.close()


async def test_shaped_link_meets_its_rate_with_delay_pipelined():
    """100 Mbit/s, 30 ms: back-to-back frames must not wait for the delay one after another.

    Judged by Little's law, not by a clock: a link meets its rate over a delay only if it keeps a
    bandwidth-delay product in flight, which the sender's delay line shows however loaded the
    machine (waiting out the delay per frame would keep one piece in flight). How close a run comes
    to the rate is a speed figure: scripts/bench/shaper.py measures it."""
    topo = line(2, rate=100.0, delay=0.030)
    async with LocalNet(topo, shaped=True) as net:
        sink = Sink()
        net.overlays[1].sink = sink
        sender = net.overlays[0].senders[1]
        peak = 0
        wire = sender.line
        put = wire._put  # every run of pieces enters the line here

        def spy(*args, **kw):
            nonlocal peak
            put(*args, **kw)
            peak = max(peak, wire.bytes)
        wire._put = spy
        data = memoryview(bytearray(64 * 1024))
        trs = [net.overlays[0].send_chunk(header(chunk=i, origin=0), data, (0, 1)) for i in range(40)]
        await asyncio.wait_for(asyncio.gather(*(t.done for t in trs)), 60)
        shaper = sender.pacer
        bdp = shaper.rate_Bps * shaper.delay_s  # 375 KB
        assert peak >= 0.9 * bdp, (peak, bdp)
        assert sum(len(p) for *_, p in sink.segments) == 40 * len(data)


async def test_single_hop_and_relayed_flows_share_a_link_fairly_in_bytes():
    """Deficit round-robin: big single-hop segments do not crowd out 64 KiB relayed ones."""
    topo = line(3, rate=200.0)
    async with LocalNet(topo, shaped=True) as net:
        for n in (1, 2):
            net.overlays[n].sink = Sink()
        data = memoryview(bytearray(512 * 1024))
        direct = [net.overlays[0].send_chunk(header(chunk=i, origin=0), data, (0, 1)) for i in range(12)]
        relayed = [net.overlays[0].send_chunk(header(chunk=i, origin=0), data, (0, 1, 2)) for i in range(12)]
        first, _ = await asyncio.wait([asyncio.ensure_future(asyncio.gather(*(t.done for t in g)))
                                       for g in (direct, relayed)], return_when=asyncio.FIRST_COMPLETED)
        sent = {name: sum(t.sent for t in g) for name, g in (("direct", direct), ("relayed", relayed))}
        assert min(sent.values()) / max(sent.values()) > 0.8, sent
        await asyncio.wait_for(asyncio.gather(*(t.done for t in direct + relayed)), 30)


@pytest.mark.parametrize("first, second", [(48 * 1024, 20 * 1024), (20 * 1024, 48 * 1024)])
async def test_a_resend_cut_into_other_segments_adds_every_byte_exactly_once(first, second):
    """After a reconnect the sender starts again at byte 0, and its segments need not fall where
    they fell before (relays forward what is ready; the segment size follows the link's rate).
    The receiver keeps a contiguous prefix and passes on only the new tail of an overlapping segment."""
    topo = line(3, rate=20.0)
    async with LocalNet(topo, shaped=True, segment_bytes=first) as net:
        plan = PLANNERS["star"](NetworkView(topo.links), Job(300_000, 300_000, (0, 1, 2), {"hub": 2})).with_version(1)

        async def cut():
            # mid-chunk: node 1 holds a prefix of node 0's 1.2 MB chunk (it takes ~0.5 s per hop at 20 Mbit/s)
            held = await until(lambda: net.overlays[1].meters_in[0].bytes >= 2 * first and
                               net.overlays[1].meters_in[0].bytes, "node 1 to hold part of node 0's chunk")
            assert held < 300_000 * 4 and net.overlays[0].senders[1].unacked, "the chunk ended before the cut"
            for ov in net.overlays.values():
                for s in ov.senders.values():
                    s.segment_bytes = second
            net.overlays[0].drop_connection(1)
            net.overlays[1].drop_connection(2)
        cutter = asyncio.create_task(cut())
        await net.run_round(plan)  # asserts the exact sum everywhere: a doubled byte would show
        await cutter
        resent = sum(s.meter.resent for ov in net.overlays.values() for s in ov.senders.values())
        assert resent > 0
