"""The fidelity guard: its verdict (valid / invalid / unjudged) on synthetic job statistics, the books
of links and node caps on a fake clock, the agents' STATS over real TCP, a real short `wansync run`
that must come out unjudged (never valid), and the CLI's --chunk / --secret-file / --hold-budget-mb."""

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.cluster import start_cluster, stop_cluster

from agents.workload import expected
from emulation.link import MBIT, RESUME_GAP_S, Downlink, LinkShaper, LinkSpec, Uplink
from emulation.topology import Topology
from overlay.auth import SECRET_ENV
from overlay.peers import _receive_pacer
from scheduler.live import LiveState
from scheduler.service import Scheduler
from wansync.backend import agent_command
from wansync.cluster import agent_options_file, run_secret
from wansync.guard import (
    GUARD_MAX_LAG_S,
    GUARD_MIN_BACKLOG_S,
    GUARD_MIN_LAG_TICKS,
    GUARD_MIN_RATIO,
    fidelity_cell,
    guard_verdict,
    live_guard,
)
from wansync.options import Options
from wansync.runspec import parse_chunk, resolve

ROOT = Path(__file__).resolve().parents[1]


# --- verdicts on synthetic STATS ----------------------------------------------------------------------------
def link(ratio=1.0, backlog=1.0):
    return {"bytes": 1_000_000, "configured_mbps": 50.0, "backlog_s": backlog, "achieved_ratio": ratio}


def node(links=None, caps=None, lag=0.002, ticks=200, cpu=0.10, runq=0.05, per_run=0.0002, wall=3.0):
    """One agent's job STATS, as agents/agent.py sends them: by default a healthy, well-judged node."""
    return {"links": {"1": link()} if links is None else links, "caps": caps or {},
            "loop_lag_p99_s": lag, "loop_lag_busy_p99_s": lag, "loop_busy_ticks": ticks, "loop_ticks": 300,
            "loop_cpu_share": cpu, "runq_wait_share": runq, "runq_wait_per_run_s": per_run,
            "cpu_s": cpu * wall, "wall_s": wall, "app_rate_shaping": True}


@pytest.mark.unit
def test_valid_needs_something_judged_and_everything_fine():
    g = guard_verdict({0: node(), 1: node(links={"0": link(0.99)})}, participants=[0, 1])
    assert g.verdict == "valid" and g.valid is True and g.reasons == []
    assert g.judged == 2 and g.worst_ratio == pytest.approx(0.99)


@pytest.mark.unit
@pytest.mark.parametrize("ratio, verdict", [(GUARD_MIN_RATIO, "valid"), (GUARD_MIN_RATIO - 0.001, "invalid"),
                                            (0.90, "invalid")])
def test_a_backlogged_link_below_97_percent_is_invalid(ratio, verdict):
    g = guard_verdict({0: node(links={"1": link(ratio)}), 1: node()})
    assert g.verdict == verdict
    if verdict == "invalid":
        assert g.valid is False and g.bad == [f"0->1 {ratio:.1%}"] and "0->1" in g.reasons[0]


@pytest.mark.unit
def test_a_link_backlogged_too_briefly_is_not_judged():
    short = link(0.50, backlog=GUARD_MIN_BACKLOG_S - 0.01)
    g = guard_verdict({0: node(links={"1": short}), 1: node()})
    assert g.verdict == "valid" and g.judged == 1  # node 1's link only


@pytest.mark.unit
@pytest.mark.parametrize("cap", ["uplink", "downlink"])
def test_a_node_cap_below_97_percent_is_invalid_even_when_every_link_is_fine(cap):
    caps = {cap: {"configured_mbps": 40.0, "backlog_s": 2.0, "bytes": 9e6, "achieved_ratio": 0.90}}
    g = guard_verdict({0: node(caps=caps), 1: node()})
    assert g.verdict == "invalid" and g.bad == [f"{cap} of 0 90.0%"]


@pytest.mark.unit
def test_a_cap_only_topology_is_judged_by_its_caps():
    """Links whose time was all the uplink's (backlog 0) are not judged; the caps are."""
    caps = {"uplink": {"configured_mbps": 40.0, "backlog_s": 3.0, "bytes": 1.5e7, "achieved_ratio": 0.995},
            "downlink": {"configured_mbps": 40.0, "backlog_s": 2.0, "bytes": 1e7, "achieved_ratio": 1.0}}
    stats = {n: node(links={"1": link(0.2, backlog=0.0)}, caps=caps) for n in range(3)}
    g = guard_verdict(stats)
    assert g.verdict == "valid" and g.judged == 6


@pytest.mark.unit
def test_event_loop_lag_while_busy_makes_a_run_invalid_even_with_perfect_books():
    g = guard_verdict({0: node(lag=GUARD_MAX_LAG_S * 1.5), 1: node()})
    assert g.verdict == "invalid" and g.bad == [] and "lag" in g.reasons[0] and "node 0" in g.reasons[0]
    assert guard_verdict({0: node(lag=GUARD_MAX_LAG_S * 0.9), 1: node()}).verdict == "valid"


@pytest.mark.unit
def test_lag_over_too_few_busy_ticks_is_not_judged():
    g = guard_verdict({0: node(lag=0.050, ticks=GUARD_MIN_LAG_TICKS - 1), 1: node()})
    assert g.verdict == "valid"


@pytest.mark.unit
def test_an_event_loop_thread_near_a_full_core_is_invalid():
    g = guard_verdict({0: node(cpu=0.97), 1: node()})
    assert g.verdict == "invalid" and "busy 97%" in g.reasons[0]


@pytest.mark.unit
def test_a_loop_starved_by_the_machines_run_queue_is_invalid():
    g = guard_verdict({0: node(cpu=0.10, runq=0.30, per_run=0.004), 1: node()})
    assert g.verdict == "invalid" and "waited for a CPU" in g.reasons[0]
    # waiting as long as running, but briefly per wake-up (a busy machine, timers still on time): fine
    assert guard_verdict({0: node(cpu=0.10, runq=0.30, per_run=0.0005), 1: node()}).verdict == "valid"


@pytest.mark.unit
def test_a_run_too_short_to_judge_is_unjudged_never_valid():
    short = {"1": link(0.80, backlog=0.2)}  # even a poor ratio: too short to mean anything
    g = guard_verdict({0: node(links=short, ticks=10), 1: node(links=short, ticks=10)}, participants=[0, 1])
    assert g.verdict == "unjudged" and g.valid is None and g.judged == 0 and g.worst_ratio is None
    assert "too short" in g.reasons[0]
    assert guard_verdict({}).verdict == "unjudged"


@pytest.mark.unit
def test_missing_stats_or_kernel_shaping_are_unjudged():
    g = guard_verdict({0: node()}, participants=[0, 1])
    assert g.verdict == "unjudged" and "node(s) 1" in g.reasons[0]
    tc = {n: {**node(links={"1": {"bytes": 5}}), "app_rate_shaping": False} for n in (0, 1)}
    g = guard_verdict(tc)
    assert g.verdict == "unjudged" and "kernel" in g.reasons[0]
    # a starved loop is invalid even when the books cannot be judged
    assert guard_verdict({0: {**tc[0], "loop_cpu_share": 0.99}, 1: tc[1]}).verdict == "invalid"


class _Job:
    """The part of a JobState the guard and the benchmarks' summary read."""

    def __init__(self, scheme, stats, participants=(0, 1)):
        self.scheme, self.stats = scheme, stats

        class _Plan:
            pass
        self.plan = _Plan()
        self.plan.participants = tuple(participants)


@pytest.mark.unit
def test_benchmarks_live_guard_is_true_only_if_every_run_was_valid():
    ok = _Job("mst", {0: node(), 1: node()})
    short = _Job("ring", {0: node(links={"1": link(backlog=0.1)}), 1: node(links={"0": link(backlog=0.1)})})
    bad = _Job("star", {0: node(links={"1": link(0.5)}), 1: node()})
    assert live_guard([ok, ok]) == {"live_guard_valid": True,
                                    "live_guard_verdicts": {"valid": 2, "invalid": 0, "unjudged": 0}}
    out = live_guard([ok, short])
    assert out["live_guard_valid"] is False and "ring: too short" in out["live_guard_reason"]
    assert live_guard([ok, bad])["live_guard_verdicts"]["invalid"] == 1
    assert live_guard([])["live_guard_valid"] is False
    assert live_guard([ok], reason="kernel shaped")["live_guard_valid"] is False


@pytest.mark.unit
def test_table_cell_says_unjudged_and_invalid_distinctly():
    base = {"guard_worst_ratio": None, "guard_judged": 0}
    assert "UNJUDGED" in fidelity_cell({**base, "guard_verdict": "unjudged", "guard_reasons": ["too short"]})
    assert "INVALID" in fidelity_cell({**base, "guard_verdict": "invalid", "guard_reasons": ["x"]})
    assert fidelity_cell({"guard_verdict": "valid", "guard_reasons": [], "guard_worst_ratio": 0.99,
                          "guard_judged": 3}).startswith("ok")


@pytest.mark.unit
async def test_dashboard_and_metrics_report_unjudged_as_not_valid():
    from prometheus_client import generate_latest

    sched = Scheduler("g", 2)
    live = LiveState(sched)
    sched.note_event("guard", scheme="mst", valid=True, verdict="valid", worst_ratio=0.99, bad_links=[])
    assert live.cluster()["guard_valid"] is True and live.cluster()["guard_verdict"] == "valid"
    sched.note_event("guard", scheme="ring", valid=None, verdict="unjudged", worst_ratio=None, bad_links=[],
                     reasons=["too short"])
    c = live.cluster()
    assert c["guard_valid"] is None and c["guard_verdict"] == "unjudged"
    text = generate_latest(live.registry).decode()
    assert 'wansync_guard_valid{scheme="ring"} 0.0' in text
    assert 'wansync_guard_verdict{scheme="ring",verdict="unjudged"} 1.0' in text
    assert 'wansync_guard_verdict{scheme="mst",verdict="valid"} 1.0' in text
    assert "wansync_run_guard_valid 0.0" in text
    sched.note_event("guard", scheme="star", valid=False, verdict="invalid", worst_ratio=0.8, bad_links=["0->1"])
    assert live.cluster()["guard_valid"] is False and live.cluster()["guard_verdict"] == "invalid"


# --- the books, on a fake clock ------------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def drive(shapers, pieces, clock, *, speed=None):
    """What the overlay's sender does, on a fake clock: schedule every piece (release_in), write each
    when due (wrote), close each link's backlog (wire_busy). speed: the writer cannot write faster than
    this many bytes/s in all (a CPU-starved loop falling behind), else every piece goes out on time."""
    due = []
    for k in range(pieces):
        for dst, sh in shapers.items():
            n = sh.max_write
            due.append((clock.now + sh.release_in(n), k, dst, n))
    due.sort()
    first, last, t = {}, {}, clock.now
    for when, _, dst, n in due:
        t = max(t, when) if speed is None else max(when, t + n / speed)
        clock.now = t
        shapers[dst].wrote(n)
        first.setdefault(dst, when)
        last[dst] = (t, n)
    for dst, sh in shapers.items():
        sh.wire_busy(first[dst], last[dst][0], last[dst][1])


@pytest.mark.unit
def test_link_books_see_a_writer_that_falls_behind():
    clock = Clock()
    sh = LinkShaper(LinkSpec(50.0), clock=clock)
    drive({1: sh}, 2000, clock)
    assert sh.guard()["achieved_ratio"] >= GUARD_MIN_RATIO
    slow = LinkShaper(LinkSpec(50.0), clock=clock)
    drive({1: slow}, 2000, clock, speed=0.9 * 50 * MBIT)
    assert slow.guard()["achieved_ratio"] == pytest.approx(0.9, abs=0.01)


def backlog_across_step(before_mbps, after_mbps, clock, *, speeds=(None, None), pieces=400):
    """One backlog on one link whose rate a trace moves from `before_mbps` to `after_mbps` halfway
    (pieces scheduled as the sender does, each phase's written when due or, at speeds[i] bytes/s, late):
    the link's books after the backlog closed."""
    sh = LinkShaper(LinkSpec(before_mbps, delay_s=0.01), clock=clock)
    first, t, n = None, clock.now, 0
    for phase, speed in enumerate(speeds):
        if phase:
            sh.set_rate(after_mbps)
        due = [clock.now + sh.release_in(sh.max_write) for _ in range(pieces)]
        n = sh.max_write
        for when in due:
            t = max(t, when) if speed is None else max(when, t + n / speed)
            clock.now = t
            first = when if first is None else first
            sh.wrote(n)
    sh.wire_busy(first, t, n)
    return sh.guard()


@pytest.mark.unit
def test_link_books_hold_each_part_of_a_backlog_to_the_rate_it_had():
    """A random trace redraws a busy link's rate mid-backlog. Booked against the rate at its end, a
    link raised from 20 to 155 Mbit/s read 56 % on time (invalid for nothing; internet2 under
    `redraw` read 93 %), and one lowered hid a writer too slow for the fast part."""
    g = backlog_across_step(20.0, 155.0, Clock())
    assert g["achieved_ratio"] >= 0.995
    late = backlog_across_step(20.0, 155.0, Clock(), speeds=(None, 0.8 * 155 * MBIT))
    assert late["achieved_ratio"] < GUARD_MIN_RATIO
    down = backlog_across_step(155.0, 20.0, Clock(), speeds=(0.8 * 155 * MBIT, None))
    assert down["achieved_ratio"] < GUARD_MIN_RATIO
    assert backlog_across_step(155.0, 20.0, Clock())["achieved_ratio"] >= 0.995


def kernel_backlog_across_step(before_mbps, after_mbps, clock, *, speeds=(1.0, 1.0), pieces=400):
    """The tc backend's books (the kernel shapes the rate, the shaper keeps none): one backlog whose
    kernel rate a trace moves halfway; the sender hands the kernel each piece as it drains the one
    before, or at speeds[i] x its rate (a starved sender). The link's books after the backlog closed."""
    sh = LinkShaper(LinkSpec(math.inf), clock=clock)
    sh.set_kernel_rate(before_mbps * MBIT)
    n, first, last = 16_384, None, clock.now
    for phase, speed in enumerate(speeds):
        if phase:
            sh.set_kernel_rate(after_mbps * MBIT)
        for _ in range(pieces):
            first = clock.now + sh.release_in(n) if first is None else first
            sh.wrote(n)
            last = clock.now
            clock.now += n / ((after_mbps if phase else before_mbps) * MBIT * speed)
    sh.wire_busy(first, last, n)
    return sh.guard()


@pytest.mark.unit
def test_kernel_books_hold_each_part_of_a_backlog_to_the_rate_it_had():
    assert kernel_backlog_across_step(20.0, 155.0, Clock())["achieved_ratio"] >= 0.995
    assert kernel_backlog_across_step(20.0, 155.0, Clock(), speeds=(1.0, 0.8))["achieved_ratio"] < GUARD_MIN_RATIO
    assert kernel_backlog_across_step(155.0, 20.0, Clock(), speeds=(0.8, 1.0))["achieved_ratio"] < GUARD_MIN_RATIO
    assert kernel_backlog_across_step(155.0, 20.0, Clock())["achieved_ratio"] >= 0.995


@pytest.mark.unit
def test_a_link_fed_slower_than_its_rate_is_not_blamed_for_waiting():
    """A relay forwarding what a 50 Mbit/s link brings onto a 54 Mbit/s one (ring on internet2: 2->0->1):
    every 40 KB segment is scheduled as it arrives, and with the pieces of the previous one still in
    the delay line the overlay's backlog never closes. The link went idle between segments for want
    of data, not of CPU: its books must not count those gaps (they did: 50/54 = 93 %, INVALID)."""
    clock = Clock()
    sh = LinkShaper(LinkSpec(54.0, delay_s=0.003), clock=clock)
    seg, every = 40_000, 40_000 / (50 * MBIT)
    lines, first = [], None
    last = None
    for k in range(301):  # 2 s of upstream-paced segments
        arrival = 100.0 + k * every
        while lines and lines[0][0] <= arrival:  # every piece written when due (on time)
            clock.now, n = lines.pop(0)
            first = clock.now if first is None else first
            last = (clock.now, n)
            sh.wrote(n)
        assert lines or k == 0  # the delay line never empties between segments: one long backlog
        clock.now = arrival
        for off in range(0, seg, sh.max_write):
            n = min(sh.max_write, seg - off)
            lines.append((clock.now + sh.release_in(n), n))
    assert last is not None
    sh.wire_busy(first, last[0], last[1])  # (the last segment's pieces stay unwritten: not booked)
    g = sh.guard()
    assert g["busy_s"] > 1.5 and g["idle_s"] > 0.1
    assert g["achieved_ratio"] >= GUARD_MIN_RATIO


@pytest.mark.unit
def test_uplink_books_judge_the_cap_and_links_are_not_blamed_for_it():
    """Two 400 Mbit/s links under a 40 Mbit/s uplink: the uplink binds. On time, its books show its
    rate and the links' books (their own time only) are fine; a writer at 90 % shows in the uplink's."""
    clock = Clock()
    up = Uplink(40 * MBIT, clock=clock)
    shapers = {b: LinkShaper(LinkSpec(400.0), uplink=up, clock=clock) for b in (1, 2)}
    drive(shapers, 1000, clock)
    g = up.guard()
    assert g["busy_s"] > 1.0 and g["achieved_ratio"] >= 0.99
    for sh in shapers.values():
        lg = sh.guard()
        assert lg["held_s"] > 0.8 * lg["busy_s"]  # nearly all of the links' backlog was the uplink's
        assert lg["achieved_ratio"] >= GUARD_MIN_RATIO

    clock2 = Clock()
    up2 = Uplink(40 * MBIT, clock=clock2)
    slow = {b: LinkShaper(LinkSpec(400.0), uplink=up2, clock=clock2) for b in (1, 2)}
    drive(slow, 1000, clock2, speed=0.9 * 40 * MBIT)
    assert up2.guard()["achieved_ratio"] == pytest.approx(0.9, abs=0.02)


@pytest.mark.unit
def test_uplink_books_forget_pieces_never_written():
    """A dropped connection's pieces (released, never written) leave the books instead of pinning them."""
    clock = Clock()
    up = Uplink(10 * MBIT, clock=clock)
    sh = LinkShaper(LinkSpec(100.0), uplink=up, clock=clock)
    for _ in range(50):
        sh.release_in(sh.max_write)
    clock.now += 10.0
    sh.release_in(sh.max_write)  # a new backlog after the drop
    sh.wrote(sh.max_write)
    assert not sh._inflight and not up._unsettled


def downlink_reads(dl, clock, nbytes, reads, late=0.0, waiting=True):
    """Each read comes when the previous debt is paid (+ late), the paused connection resuming with data
    waiting (a receiver the cap holds back) or not (the senders' next data arrives `late` after)."""
    for _ in range(reads):
        wait = dl.delay_for(nbytes, allow_large=True)
        clock.now += wait + late
        dl.resumed(waiting)


@pytest.mark.unit
def test_downlink_books_see_late_resumes_and_ignore_a_cap_that_does_not_bind():
    clock = Clock()
    dl = Downlink(40 * MBIT, clock=clock)
    downlink_reads(dl, clock, 64 * 1024, 400)
    g = dl.guard()
    assert g["busy_s"] > 4.0 and g["achieved_ratio"] >= 0.99
    # a loop that resumes reading 15 ms late (more than the 16 KiB burst holds) loses rate
    dl2 = Downlink(40 * MBIT, clock=clock)
    downlink_reads(dl2, clock, 64 * 1024, 400, late=0.015)
    assert dl2.guard()["achieved_ratio"] < GUARD_MIN_RATIO
    # as late, but nothing was waiting when reading resumed: the senders' next data came late, not the
    # reader; each read begins a backlog of its own, without loss
    dl5 = Downlink(40 * MBIT, clock=clock)
    downlink_reads(dl5, clock, 64 * 1024, 400, late=0.015, waiting=False)
    assert dl5.guard()["achieved_ratio"] >= 0.99 and dl5.guard()["busy_s"] > 0.4
    # small reads well under the cap: never in debt, no backlog at all
    dl3 = Downlink(40 * MBIT, clock=clock)
    for _ in range(200):
        dl3.delay_for(4096, allow_large=True)
        clock.now += 0.01
    assert dl3.guard()["busy_s"] == 0.0
    # the senders pause longer than RESUME_GAP_S: the backlog ends when the debt was paid, no loss
    dl4 = Downlink(40 * MBIT, clock=clock)
    for _ in range(20):
        downlink_reads(dl4, clock, 64 * 1024, 20)
        clock.now += RESUME_GAP_S * 2
    assert dl4.guard()["achieved_ratio"] >= 0.99


class _CappedSink(asyncio.Protocol):
    """The receiving end of a real TCP connection under a node's downlink cap (the overlay's pacer)."""

    def __init__(self, dl: Downlink, want: int, stall: tuple[float, float] | None = None) -> None:
        self.dl, self.want, self.got, self.stall = dl, want, 0, stall
        self.transport: asyncio.Transport | None = None
        self.done = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.on_bytes = _receive_pacer(self, self.dl)  # type: ignore[arg-type]
        if self.stall is not None:
            self._starve()

    def hold_reading(self, why: str) -> None:  # the pacer's side of overlay.codec.FrameProtocol
        assert self.transport is not None
        self.transport.pause_reading()

    def release_reading(self, why: str) -> None:
        assert self.transport is not None
        self.transport.resume_reading()

    def _starve(self) -> None:
        """A loop starved of CPU: it runs nothing for stall[0] s every stall[1] s."""
        if not self.done.done():
            time.sleep(self.stall[0])
            asyncio.get_running_loop().call_later(self.stall[1], self._starve)

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        self.on_bytes(len(data))
        if self.got >= self.want and not self.done.done():
            self.done.set_result(None)


async def _capped_transfer(bursts: int, burst: int, gap_s: float, stall: tuple[float, float] | None) -> dict:
    """`bursts` x `burst` bytes from a sender thread (a pause of gap_s after each) into a 40 Mbit/s
    downlink over loopback TCP; the downlink's books."""
    dl = Downlink(40 * MBIT)
    loop = asyncio.get_running_loop()
    sink = _CappedSink(dl, bursts * burst, stall)
    server = await loop.create_server(lambda: sink, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    def send() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            for _ in range(bursts):
                s.sendall(b"x" * burst)
                if gap_s:
                    time.sleep(gap_s)  # the senders' pace: the next task's data comes later

    sender = threading.Thread(target=send)
    sender.start()
    try:
        await asyncio.wait_for(sink.done, 60)
    finally:
        sender.join(60)
        server.close()
    return dl.guard()


@pytest.mark.loopback
async def test_downlink_books_over_tcp_tell_late_senders_from_a_late_reader():
    """Real TCP: bursts 30 ms apart (the senders' next task), under RESUME_GAP_S, are not the reader's
    loss (nothing was waiting when it resumed); a reader whose loop stalls while data waits is."""
    assert RESUME_GAP_S > 0.03
    paced = await _capped_transfer(20, 64 * 1024, 0.03, None)
    assert paced["busy_s"] > 0.1 and paced["achieved_ratio"] >= 0.9, paced
    starved = await _capped_transfer(1, 3_000_000, 0.0, (0.04, 0.01))
    assert starved["busy_s"] > 0.4 and starved["achieved_ratio"] < GUARD_MIN_RATIO, starved


# --- agents over real TCP ----------------------------------------------------------------------------------
CAPS = Topology("caps3", 3, {(a, b): LinkSpec(400.0, 0.002) for a in range(3) for b in range(3) if a != b},
                uplink_mbps={n: 40.0 for n in range(3)}, downlink_mbps={n: 40.0 for n in range(3)})


@pytest.mark.loopback
async def test_agents_report_cap_books_and_loop_figures_in_their_stats():
    # probes off: the books below count the ring's own bytes (a probe of an idle link would add its own)
    sched, agents, tasks = await start_cluster(CAPS, cluster="caps", shaped=True, probe=False)
    params = 300_000
    try:
        js = await asyncio.wait_for(sched.run_job("ring", rounds=2, params=params, chunk_params=25_000), 90)
        for r in js.records:
            assert r.ok and r.digests_agree and r.versions_agree
        # the exact sum, computed here: each agent applied -0.01/n x sum every round
        want = np.zeros(params, dtype=np.float32)
        for rnd in range(2):
            want -= np.float32(0.01 / 3) * expected(rnd, 0, range(3), params)
        for a in agents:
            assert np.array_equal(a.params, want)
        for st in js.stats.values():
            assert set(st["caps"]) == {"uplink", "downlink"}
            up = st["caps"]["uplink"]
            assert up["configured_mbps"] == 40.0 and up["backlog_s"] > 0 and up["bytes"] > 0
            assert 0 <= up["achieved_ratio"] <= 1
            # ring: each node sends 2 x (n-1)/n of the tensor per round; the books count no more than that
            assert up["bytes"] <= 2 * 2 * (2 / 3) * params * 4 * 1.05
            for key in ("loop_lag_busy_p99_s", "loop_busy_ticks", "loop_cpu_share", "runq_wait_share"):
                assert key in st
            assert st["loop_busy_ticks"] > 0  # it sent: its loop was busy some of the time
            for lk in st["links"].values():  # the links' own time excludes the uplink's holds and waits
                assert lk["backlog_s"] >= -1e-9 and lk["uplink_held_s"] >= 0 and lk["idle_s"] >= 0
        # 400 Mbit/s links under 40 Mbit/s uplinks: the uplink held the links' pieces back
        assert sum(lk["uplink_held_s"] for st in js.stats.values() for lk in st["links"].values()) > 0
        assert guard_verdict(js.stats, js.plan.participants).verdict in ("valid", "invalid", "unjudged")
    finally:
        await stop_cluster(sched, tasks)


# --- the CLI -------------------------------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("text, params", [("200KB", 50_000), ("4MiB", 1 << 20), ("200000B", 50_000),
                                          ("1.5MB", 375_000), ("250000", 250_000), (" 8 kib ", 2048)])
def test_chunk_accepts_bytes_with_a_unit_or_a_parameter_count(text, params):
    assert parse_chunk(text) == params


@pytest.mark.unit
@pytest.mark.parametrize("text, says", [("3B", "multiple of 4"), ("0", "> 0"), ("-4KB", "positive"),
                                        ("10XB", "unknown unit"), ("1.5", "whole number"), ("KB", "not a number"),
                                        ("0.0001KB", "whole number")])
def test_chunk_rejects_what_is_not_a_whole_number_of_parameters(text, says):
    with pytest.raises(ValueError, match=says):
        parse_chunk(text)


@pytest.mark.unit
def test_run_config_honours_the_chunk_override_and_agents_get_the_options(tmp_path):
    cfg = resolve(Options.make(topology="internet2", schemes=["mst"], scale=0.05, rounds=1))
    assert cfg.chunk == 50_000  # the scaled default
    cfg = resolve(cfg.options.replace(chunk="200KB", hold_budget_mb=32.0))
    assert cfg.chunk == 50_000 and parse_chunk("200KB") == 50_000
    cfg = resolve(cfg.options.replace(chunk="4MiB"))
    assert cfg.chunk == 1 << 20
    got = Options.read(agent_options_file(cfg, "c"))
    assert got.agents["hold_budget_mb"] == 32.0 and got.agents["gc"] == "tuned" and got.cluster["name"] == "c"
    assert got.agents["probe_bytes"] == (1 << 20) * 4 // 2  # probes stay half a chunk
    got = Options.read(agent_options_file(resolve(cfg.options.replace(agents__gc="default")), "c"))
    assert got.agents["gc"] == "default"
    # --secret-file: that secret for the scheduler and in the agents' environment, never in argv or options
    (tmp_path / "s").write_bytes(b"s" * 20)
    cfg = resolve(cfg.options.replace(secret_file=str(tmp_path / "s")), secret=b"s" * 20)
    secret, env = run_secret(cfg)
    path = agent_options_file(cfg, "c")
    assert secret == b"s" * 20 and env[SECRET_ENV] == "s" * 20 and "s" * 20 not in path.read_text()
    assert "s" * 20 not in agent_command(path, 0, "127.0.0.1:1")
    cfg.secret = bytes(range(200, 232))  # not text: the agents read the file themselves
    secret, env = run_secret(cfg)
    assert secret == cfg.secret and SECRET_ENV not in env
    assert Options.read(agent_options_file(cfg, "c")).security["secret_file"] == str(tmp_path / "s")
    cfg.secret = None
    secret, env = run_secret(cfg)
    assert len(secret) >= 32 and env[SECRET_ENV] == secret.decode()  # a fresh one per run


def wansync(*args, timeout=150):
    return subprocess.run([sys.executable, "-m", "wansync.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.loopback
def test_cli_errors_are_clear_before_anything_starts(tmp_path):
    res = wansync("run", "--chunk", "3B", "--no-http")
    assert res.returncode != 0 and "multiple of 4" in res.stderr
    res = wansync("simulate", "--chunk", "10XB")
    assert res.returncode != 0 and "unknown unit" in res.stderr
    weak = tmp_path / "weak"
    weak.write_text("short\n")
    res = wansync("run", "--secret-file", str(weak), "--no-http")
    assert res.returncode != 0 and "at least 16" in res.stderr
    res = wansync("run", "--help")
    assert "star,ring,mst,ktree,netstorm,packing,auto" in res.stdout and "parameter count" in res.stdout


@pytest.mark.loopback
def test_simulate_honours_the_chunk():
    a = wansync("simulate", "--schemes", "mst", "--scale", "0.05", "--chunk", "200KB")
    b = wansync("simulate", "--schemes", "mst", "--scale", "0.05", "--chunk", "2MB")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout.split("mst", 1)[1].split()[1] != b.stdout.split("mst", 1)[1].split()[1]  # round s differs


@pytest.mark.loopback
def test_a_short_real_run_is_unjudged_not_valid(tmp_path):
    """A few milliseconds of traffic per link: nothing is backlogged long enough to judge, so the
    verdict must be unjudged (it was `valid` by construction before). Also --chunk, --secret-file and
    --hold-budget-mb end to end: the run uses that chunk, its agents that secret and budget."""
    out = tmp_path / "r.jsonl"
    secret = tmp_path / "secret"
    secret.write_text("a-secret-for-a-tool-outside-the-launcher\n")
    os.chmod(secret, 0o640)  # group-readable: a warning, not an error
    res = wansync("run", "--topology", "uniform:50", "--nodes", "3", "--schemes", "ring,netstorm", "--rounds", "1",
                  "--warmup", "0", "--scale", "0.002", "--chunk", "16KB", "--secret-file", str(secret),
                  "--hold-budget-mb", "32", "--no-http", "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stderr.count("readable by group or others") == 1  # the launcher's, not once per agent
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    run = next(r for r in recs if r["type"] == "run")
    assert run["chunk_params"] == 4000 and run["chunk_override"] is True
    jobs = [r for r in recs if r["type"] == "job"]
    assert [j["scheme"] for j in jobs] == ["ring", "netstorm"]
    for j in jobs:
        assert j["all_exact"]
        assert j["guard_verdict"] == "unjudged", j["guard_reasons"]
        assert j["guard_valid"] is None and j["guard_judged"] == 0 and "too short" in j["guard_reasons"][0]
    assert "UNJUDGED" in res.stdout + res.stderr
    events = [r for r in recs if r["type"] == "event" and r["kind"] == "guard"]
    assert [e["data"]["verdict"] for e in events] == ["unjudged", "unjudged"]
