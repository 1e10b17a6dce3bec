"""Transport benchmark: one overlay link against a plain blocking socket, two processes each.

Baseline: `sock.sendall(memoryview)` in one process, `recv_into` a preallocated buffer in another.
Ours: the full overlay path — an Overlay (node 0) in one process sends chunks with `send_chunk`
(segments, codec, hop acks, meters, a LinkShaper at an effectively unlimited rate) to an Overlay
(node 1) in another, whose sink places every payload straight into a preallocated numpy array.
A measurement times a fixed byte total from the first send until the sender learns the last byte
landed (socket: a 1-byte reply; overlay: the last hop ack). Baseline and overlay measurements are
interleaved in pairs; each overlay measurement is divided by the baseline measured just before it.
Prints a table; the last stdout line is one JSON object.

    python scripts/bench/transport.py [--quick] [--pairs N] [--total-mib MIB] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
from bench_common import commit, cpu_s, die_with_parent, exit_on_sigterm, reap, recv, recv_exact

from emulation.link import LinkShaper, LinkSpec
from overlay.link import SEGMENT_BYTES
from overlay.peers import Overlay
from wansync.loops import DEFAULT_LOOP, resolve_loop

MIB = 1 << 20
FRAMES = (1 * MIB, 4 * MIB)
LOOPS = ("asyncio", "uvloop")
UNLIMITED_MBPS = 1e9  # 125 TB/s: the token bucket never makes anyone wait
CLUSTER = "bench"
REPLY_TIMEOUT_S = 60.0
CTX = mp.get_context("fork")  # the parent holds no threads or loops; fork starts children fast


# --- helpers shared by the children ---------------------------------------------------------------




def _run_loop(loop_name: str, main: Callable[[], Any]) -> None:
    if loop_name == "uvloop":
        import uvloop
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    else:
        factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())




@contextlib.contextmanager
def _profiled(path: str | None) -> Iterator[None]:
    if not path:
        yield
        return
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        prof.dump_stats(path)


# --- baseline: blocking sockets -----------------------------------------------------------------
_HDR = struct.Struct("!QQ")  # total bytes, frame bytes (total 0 = stop)


def socket_rx(ctrl: Connection) -> None:
    die_with_parent()
    srv = socket.create_server(("127.0.0.1", 0))
    ctrl.send(srv.getsockname()[1])
    sock, _ = srv.accept()
    buf = memoryview(bytearray(max(FRAMES)))
    hdr = memoryview(bytearray(_HDR.size))
    while True:
        recv_exact(sock, hdr)
        total, frame = _HDR.unpack(hdr)
        if total == 0:
            break
        c0 = cpu_s()
        left = total
        while left:
            want, got = min(frame, left), 0
            while got < want:
                n = sock.recv_into(buf[got:want])
                if n == 0:
                    raise ConnectionError("sender closed mid-frame")
                got += n
            left -= want
        sock.sendall(b"k")
        ctrl.send(cpu_s() - c0)
    sock.close()


def socket_tx(ctrl: Connection, port: int) -> None:
    die_with_parent()
    sock = socket.create_connection(("127.0.0.1", port))
    payload = memoryview(np.arange(max(FRAMES) // 4, dtype=np.float32)).cast("B")
    ack = memoryview(bytearray(1))
    ctrl.send("ready")
    while (cmd := ctrl.recv()) is not None:
        frame, total, _ = cmd
        c0, t0 = cpu_s(), time.perf_counter()
        sock.sendall(_HDR.pack(total, frame))
        view = payload[:frame]
        for _ in range(total // frame):
            sock.sendall(view)
        recv_exact(sock, ack)
        ctrl.send((time.perf_counter() - t0, cpu_s() - c0))
    sock.sendall(_HDR.pack(0, 0))
    sock.close()


# --- ours: two overlays ---------------------------------------------------------------------------
class ArraySink:
    """Chunk engine stand-in: every chunk's bytes land in one preallocated numpy array."""

    def __init__(self, nbytes: int) -> None:
        self.array = np.zeros(nbytes // 4, dtype=np.float32)
        self.view = memoryview(self.array).cast("B")
        self.got = 0
        self.want = -1
        self.done: Callable[[], None] | None = None

    def chunk_buffer(self, header: dict[str, Any]) -> memoryview | None:
        off = header["off"]
        return self.view[off:off + header["nbytes"]]

    def chunk_segment(self, header: dict[str, Any], payload: memoryview) -> None:
        self.got += header["nbytes"]
        if self.got == self.want and self.done is not None:
            self.done()


def _pacers(peer: int, shaped: bool) -> dict[int, LinkShaper] | None:
    """The link's shaper at an effectively unlimited rate (or none at all, for comparison)."""
    return {peer: LinkShaper(LinkSpec(UNLIMITED_MBPS))} if shaped else None


def overlay_rx(ctrl: Connection, loop_name: str, segment: int, shaped: bool, profile: str | None) -> None:
    die_with_parent()
    with _profiled(profile):
        _run_loop(loop_name, lambda: _overlay_rx(ctrl, segment, shaped))


async def _overlay_rx(ctrl: Connection, segment: int, shaped: bool) -> None:
    sink = ArraySink(max(FRAMES))
    ov = Overlay(1, CLUSTER, sink, neighbors=[0], segment_bytes=segment, pacers=_pacers(0, shaped))
    ctrl.send(await ov.listen())
    await ov.wait_connected(30)
    c0 = 0.0

    def finished() -> None:
        ctrl.send(cpu_s() - c0)

    sink.done = finished
    while (cmd := await recv(ctrl)) is not None:
        total, rnd = cmd
        ov.forget_before(1, rnd)
        sink.got, sink.want, c0 = 0, total, cpu_s()
        ctrl.send("armed")
    await ov.close()


def overlay_tx(ctrl: Connection, port: int, loop_name: str, segment: int, shaped: bool,
               profile: str | None) -> None:
    die_with_parent()
    with _profiled(profile):
        _run_loop(loop_name, lambda: _overlay_tx(ctrl, port, segment, shaped))


async def _overlay_tx(ctrl: Connection, port: int, segment: int, shaped: bool) -> None:
    ov = Overlay(0, CLUSTER, ArraySink(4), neighbors=[1], segment_bytes=segment, pacers=_pacers(1, shaped))
    await ov.listen()
    ov.connect({1: ("127.0.0.1", port)})
    await ov.wait_connected(30)
    payload = memoryview(np.arange(max(FRAMES) // 4, dtype=np.float32)).cast("B")
    ctrl.send("ready")
    while (cmd := await recv(ctrl)) is not None:
        frame, total, rnd = cmd
        ov.forget_before(1, rnd)
        view = payload[:frame]
        c0, t0 = cpu_s(), time.perf_counter()
        transfers = [ov.send_chunk({"t": "CHUNK", "job": 1, "task": rnd, "attempt": 0, "version": 0,
                                    "chunk": i, "kind": "bcast", "origin": 0, "contributors": b"\x01",
                                    "t_send": 0.0}, view, (0, 1))
                     for i in range(total // frame)]
        await asyncio.gather(*(tr.done for tr in transfers))
        ctrl.send((time.perf_counter() - t0, cpu_s() - c0))
    await ov.close()


# --- the parent ------------------------------------------------------------------------------------
@dataclass
class Pair:
    """A sender and a receiver process that stay connected across measurements."""

    name: str
    kind: str  # "socket" or "overlay"
    loop: str = "-"
    segment: int = 0
    shaped: bool = True
    procs: list[Any] = field(default_factory=list)
    tx: Connection | None = None
    rx: Connection | None = None
    gbps: dict[int, list[float]] = field(default_factory=dict)  # frame -> one entry per measurement
    cpu: dict[int, list[float]] = field(default_factory=dict)  # frame -> CPU s/GB of both processes

    def start(self, profile_dir: str | None = None) -> None:
        rx_parent, rx_child = CTX.Pipe()
        tx_parent, tx_child = CTX.Pipe()
        self.rx, self.tx = rx_parent, tx_parent

        def prof(side: str) -> str | None:
            return os.path.join(profile_dir, f"{self.name}-{side}.prof") if profile_dir else None

        if self.kind == "socket":
            rx = CTX.Process(target=socket_rx, args=(rx_child,), daemon=True)
        else:
            rx = CTX.Process(target=overlay_rx, args=(rx_child, self.loop, self.segment, self.shaped, prof("rx")),
                             daemon=True)
        self.procs.append(rx)
        rx.start()
        port = self._reply(self.rx)
        if self.kind == "socket":
            tx = CTX.Process(target=socket_tx, args=(tx_child, port), daemon=True)
        else:
            tx = CTX.Process(target=overlay_tx,
                             args=(tx_child, port, self.loop, self.segment, self.shaped, prof("tx")), daemon=True)
        self.procs.append(tx)
        tx.start()
        if self._reply(self.tx) != "ready":
            raise RuntimeError(f"{self.name}: sender did not start")

    def _reply(self, conn: Connection | None) -> Any:
        assert conn is not None
        if not conn.poll(REPLY_TIMEOUT_S):
            raise TimeoutError(f"{self.name}: no reply within {REPLY_TIMEOUT_S} s")
        return conn.recv()

    def measure(self, frame: int, total: int, rnd: int) -> float:
        """One timed transfer of `total` bytes in `frame`-byte frames; returns Gbit/s."""
        assert self.tx is not None and self.rx is not None
        if self.kind == "overlay":
            self.rx.send((total, rnd))
            if self._reply(self.rx) != "armed":
                raise RuntimeError(f"{self.name}: receiver not armed")
        self.tx.send((frame, total, rnd))
        elapsed, cpu_tx = self._reply(self.tx)
        cpu_rx = self._reply(self.rx)
        gbps = total * 8 / elapsed / 1e9
        self.gbps.setdefault(frame, []).append(gbps)
        self.cpu.setdefault(frame, []).append((cpu_tx + cpu_rx) / (total / 1e9))
        return gbps

    def all_gbps(self) -> list[float]:
        return [g for f in FRAMES for g in self.gbps.get(f, [])]

    def all_cpu(self) -> list[float]:
        return [c for f in FRAMES for c in self.cpu.get(f, [])]

    def stop(self) -> None:
        for conn in (self.tx, self.rx):
            with contextlib.suppress(Exception):
                if conn is not None:
                    conn.send(None)
        reap(self.procs)






def _seg_name(segment: int) -> str:
    return "64KiB" if segment == SEGMENT_BYTES else "=frame"




def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 pairs of 256 MiB")
    ap.add_argument("--pairs", type=int, default=None, help="interleaved pairs per configuration (default 7)")
    ap.add_argument("--total-mib", type=int, default=None, help="bytes per measurement (default 768 MiB)")
    ap.add_argument("--budget-s", type=float, default=110.0,
                    help="start no new round after this many seconds (once 3 rounds are done)")
    ap.add_argument("--no-shaper", action="store_true", help="pacer=None instead of an unlimited LinkShaper")
    ap.add_argument("--profile", metavar="DIR", help="cProfile every overlay process into DIR/<config>-{tx,rx}.prof")
    ap.add_argument("--segment-sweep", action="store_true",
                    help="also measure segment_bytes = frame size (single-hop transfers already use ~10 ms of "
                         "link time per segment, so this is the same code path unless relays are involved)")
    args = ap.parse_args(argv)
    pairs = args.pairs or (3 if args.quick else 7)
    total = (args.total_mib or (256 if args.quick else 1536)) * MIB
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    signal.signal(signal.SIGTERM, exit_on_sigterm)

    base = Pair("socket", "socket")
    ours = [Pair(f"overlay {lp} segment{_seg_name(seg)}", "overlay", lp, seg, not args.no_shaper)
            for seg in ((SEGMENT_BYTES, max(FRAMES)) if args.segment_sweep else (SEGMENT_BYTES,)) for lp in LOOPS]
    ratios: dict[str, dict[int, list[float]]] = {p.name: {} for p in ours}
    t0 = time.monotonic()
    done = 0
    try:
        for p in [base, *ours]:
            p.start(args.profile)
        rnd = 0
        for _ in range(pairs):
            if done >= 3 and time.monotonic() - t0 > args.budget_s:
                print(f"time budget reached after {done} rounds", file=sys.stderr)
                break
            for frame in FRAMES:
                for p in ours:  # baseline, ours, baseline, ours ...
                    rnd += 1
                    b = base.measure(frame, total, rnd)
                    ratios[p.name].setdefault(frame, []).append(p.measure(frame, total, rnd) / b)
            done += 1
    finally:
        for p in [base, *ours]:
            p.stop()
    return report(base, ours, ratios, done, total, time.monotonic() - t0, not args.no_shaper)


def report(base: Pair, ours: list[Pair], ratios: dict[str, dict[int, list[float]]], done: int, total: int,
           wall: float, shaped: bool) -> int:
    """Print the table and the closing JSON line; the headline picks loop and segment size."""
    med = statistics.median
    pacer = f"LinkShaper(LinkSpec(rate_mbps={UNLIMITED_MBPS:g}))" if shaped else "pacer=None"
    print(f"transport: {done} interleaved pairs (socket, overlay) per row, {total // MIB} MiB per measurement, "
          f"shaper: {pacer}")
    print("segment64KiB = Overlay's default segment_bytes; segment=frame = segment_bytes of 4 MiB (one per frame)")
    print(f"{'configuration':<29}{'frame':>6}{'Gbit/s med':>11}{'min':>7}{'max':>7}{'CPU s/GB':>9}"
          f"{'ratio med':>10}{'min':>7}{'max':>7}")
    for p in [base, *ours]:
        for frame in FRAMES:
            g, c = p.gbps[frame], p.cpu[frame]
            rr = ratios.get(p.name, {}).get(frame)
            rtxt = f"{med(rr):>10.3f}{min(rr):>7.3f}{max(rr):>7.3f}" if rr else f"{'-':>10}{'':>14}"
            print(f"{p.name:<29}{frame // MIB:>4}Mi{med(g):>11.2f}{min(g):>7.2f}{max(g):>7.2f}{med(c):>9.3f}{rtxt}")

    def pair_ratios(p: Pair) -> list[float]:
        return [r for f in FRAMES for r in ratios[p.name].get(f, [])]

    summary = {p.name: med(pair_ratios(p)) for p in ours}
    by_seg: dict[int, dict[str, Pair]] = {}
    for p in ours:
        by_seg.setdefault(p.segment, {})[p.loop] = p

    def best_loop(seg: int) -> str:
        cands = by_seg[seg]
        if "uvloop" in cands and summary[cands["uvloop"].name] > summary[cands["asyncio"].name]:
            return "uvloop"
        return "asyncio"

    # the headline is what agents run: the default loop and the default segment size
    head = default = by_seg[SEGMENT_BYTES][resolve_loop(DEFAULT_LOOP, "app")]
    loop = best_loop(SEGMENT_BYTES)
    for seg, cands in by_seg.items():
        txt = ", ".join(f"{lp} {summary[p.name]:.3f}" for lp, p in cands.items())
        print(f"segment {_seg_name(seg):>6}: median ratio {txt} -> faster loop here: {best_loop(seg)}")
    print(f"headline: {head.name} (the agents' default loop and segment size); wall {wall:.1f} s")
    rr = pair_ratios(head)
    out = {
        "ratio_vs_socket": round(med(rr), 4),
        "ratio_min": round(min(rr), 4),
        "ratio_max": round(max(rr), 4),
        "overlay_gbps": round(med(head.all_gbps()), 3),
        "socket_gbps": round(med(base.all_gbps()), 3),
        "cpu_s_per_gb": round(med(head.all_cpu()), 3),
        "socket_cpu_s_per_gb": round(med(base.all_cpu()), 3),
        "default_loop_recommendation": loop,
        "headline": head.name,
        "headline_segment_bytes": SEGMENT_BYTES,
        "ratio_default_segment": round(summary[default.name], 4),
        "ratio_by_config": {k: round(v, 4) for k, v in summary.items()},
        "pacer": pacer,
        "pairs": done,
        "mib_per_measurement": total // MIB,
        "wall_s": round(wall, 1),
        "commit": commit(),
        # its figures are CPU-bound throughput on purpose (an unlimited link, no emulated rate to keep),
        # so the fidelity guard has nothing to judge: no live emulation figure here is guard-valid
        "live_guard_valid": False,
        "live_guard_reason": "transport measures CPU-bound throughput on an unshaped link: no emulated rate "
                             "to judge (not an emulation figure)",
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
