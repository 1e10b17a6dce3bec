"""The agent process: one node of the overlay, driven by the scheduler, all state crossing the wire.

It registers, dials its neighbours, and for every round of a job: computes (or sleeps for the
configured compute time), asks which plan version the round uses, runs the chunk engine, checks
the result against the exact expected sum, and reports. Passive link samples are batched to the
scheduler; the fidelity guard's numbers go with each job's stats.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from emulation.link import MBIT, Downlink, LinkShaper, LinkSpec, Uplink
from emulation.topology import Topology
from emulation.trace import Trace
from overlay.auth import AuthError, Handshake, TlsFiles
from overlay.clock import SyncedClock
from overlay.control import ControlConn
from overlay.peers import Overlay
from scheduler.plan import Plan, PlanError, aux_from_wire

from .engine import ChunkEngine, RoundAborted
from .workload import contribution, expected

log = logging.getLogger("wansync.agent")

REPORT_EVERY_S = 0.25
CLOCK_EXCHANGES = 5
LAG_TICK_S = 0.01
# NetStorm's passive awareness: chunks above PROBE_CHUNK_SIZE bytes are probes; PROBE_CHUNK_NUM of
# them make one size-weighted estimate (sum of bytes / sum of seconds) per directed link
PROBE_CHUNK_BYTES = 2_000_000
PROBE_CHUNK_NUM = 4


class LoopLag:
    """How late the event loop wakes a 10 ms sleeper (a CPU-starved process shows it first), how much
    of a core the loop's thread used, and how long it waited for a CPU (the machine's run queue).

    Lag is also kept apart for the ticks during which `busy()` held (this node had traffic): only
    then does a late loop distort what a run measures."""

    def __init__(self, busy: Callable[[], bool] | None = None) -> None:
        self.samples: list[float] = []
        self.busy_samples: list[float] = []
        self._busy = busy
        self._task: asyncio.Task | None = None
        self._tid = threading.get_native_id()
        self._mark = self._clocks()

    def start(self) -> None:
        self._tid = threading.get_native_id()  # the loop's thread
        self._mark = self._clocks()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        busy = self._busy
        while True:
            t = time.perf_counter()
            was = busy is not None and busy()
            await asyncio.sleep(LAG_TICK_S)
            lag = time.perf_counter() - t - LAG_TICK_S
            self.samples.append(lag)
            if was or (busy is not None and busy()):
                self.busy_samples.append(lag)

    def _clocks(self) -> tuple[float, float, float, int]:
        """(wall, loop thread's CPU s, its run-queue wait s, times it ran) from /proc (Linux
        schedstat); elsewhere the wait and count are 0."""
        try:
            with open(f"/proc/self/task/{self._tid}/schedstat") as fh:
                run_ns, wait_ns, slices = (int(x) for x in fh.read().split()[:3])
            return time.perf_counter(), run_ns / 1e9, wait_ns / 1e9, slices
        except (OSError, ValueError):
            return time.perf_counter(), time.thread_time(), 0.0, 0

    def take(self) -> dict[str, float]:
        """The figures since the previous take (or start), and start over."""
        s, self.samples = self.samples, []
        b, self.busy_samples = self.busy_samples, []
        now, mark = self._clocks(), self._mark
        self._mark = now
        wall = max(1e-9, now[0] - mark[0])
        cpu, wait, runs = now[1] - mark[1], now[2] - mark[2], now[3] - mark[3]
        return {"loop_lag_p99_s": float(np.percentile(s, 99)) if s else 0.0,
                "loop_lag_max_s": max(s, default=0.0),
                "loop_lag_busy_p99_s": float(np.percentile(b, 99)) if b else 0.0,
                "loop_busy_ticks": len(b), "loop_ticks": len(s),
                "loop_cpu_share": cpu / wall, "runq_wait_share": wait / wall,
                "runq_wait_per_run_s": wait / runs if runs > 0 else 0.0}

    def take_p99(self) -> float:
        return self.take()["loop_lag_p99_s"]

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class Agent:
    def __init__(self, node: int, cluster: str, scheduler: tuple[str, int], topo: Topology, *,
                 trace: Trace | None = None, shaped: bool = True, host: str = "127.0.0.1",
                 listen_port: int = 0, probe_bytes: int = PROBE_CHUNK_BYTES, probe_num: int = PROBE_CHUNK_NUM,
                 primary_busy_bound: int = 2, aux_queue_length: int = 5, clock_skew: float = 0.0,
                 clock_sync: bool = True, relay_by_table: bool = False, rate_shaping: bool = True,
                 secret: bytes | None = None,
                 scheduler_wait_s: float = 30.0, tls: TlsFiles | None = None, hold_budget: int | None = None) -> None:
        """relay_by_table: relays route auxiliary chunks by their own tables instead of the source
        route, which is what NetStorm's protocol forbids (Fig. 10's loop; tests only).
        rate_shaping=False: the kernel shapes rates and applies the trace (tc backend); the
        application keeps only link delay and jitter (this kernel has no netem)."""
        self.rate_shaping = rate_shaping
        self.secret = secret  # cluster secret (overlay.auth); None: unauthenticated (--insecure)
        self.tls = tls
        self.node = node
        self.cluster = cluster
        self.scheduler = scheduler
        self.topo = topo
        self.trace = trace or Trace()
        self.host = host
        self.listen_port = listen_port
        routes = topo.routes()
        self.clock = SyncedClock(clock_skew)
        self.clock_sync = clock_sync
        self.engine = ChunkEngine(node, routes, primary_busy_bound=primary_busy_bound,
                                  aux_queue_length=aux_queue_length)
        if hold_budget is not None:
            self.engine.hold_budget = hold_budget
        self.probe_bytes = probe_bytes
        self.probe_num = probe_num
        self._probes: dict[tuple[int, int], list[tuple[float, float, int]]] = {}
        # node caps, each with the fidelity guard's books (emulation.link)
        self.uplink = (Uplink(topo.uplink_mbps[node] * MBIT)
                       if shaped and rate_shaping and node in topo.uplink_mbps else None)
        uplink = self.uplink
        self.shapers: dict[int, LinkShaper] = {}
        if shaped:
            self.shapers = {b: LinkShaper(s if rate_shaping else LinkSpec(math.inf, s.delay_s, s.jitter_s),
                                          uplink=uplink, seed=node * 1000 + b)
                            for (a, b), s in topo.links.items() if a == node}
        self.downlink = (Downlink(topo.downlink_mbps[node] * MBIT)
                         if shaped and rate_shaping and node in topo.downlink_mbps else None)
        downlink = self.downlink
        self._cap_mark: dict[str, dict[str, float]] = {}  # the caps' books at the previous STATS
        self.samples: list[list[float]] = []
        self.overlay = Overlay(node, cluster, self.engine, neighbors=topo.neighbors(node), pacers=self.shapers,
                               downlink=downlink, host=host, on_sample=self._sample, clock=self.clock.now,
                               secret=secret, tls=tls)
        self.engine.overlay = self.overlay
        if not rate_shaping:
            for b in self.shapers:
                self._set_link_rate(b, topo.links[(node, b)].rate_mbps)
        if relay_by_table:
            self.overlay.relay_by_table = self.engine.table_route
        self.plans: dict[int, Plan] = {}
        self.engine.plans = self.plans
        self.ctl: ControlConn | None = None
        self._replies: dict[tuple[int, int], asyncio.Future] = {}
        # the loop counts as busy while this node sends (a link backlogged) or receives against its cap
        self._lag = LoopLag(busy=lambda: any(sh.backlogged for sh in self.shapers.values())
                            or (self.downlink is not None and self.downlink.in_debt))
        self._trace_task: asyncio.Task | None = None
        self.params = None  # the model this agent keeps (updated with each round's result)
        self.epoch = self.overlay.epoch  # this process's incarnation: a restarted agent is a newer one
        self.live_peers: set[int] = set()
        self.scheduler_wait_s = scheduler_wait_s
        self._seen = (0, 0)  # highest job id and plan version seen (a restarted scheduler starts above)
        self._attempt: dict[tuple[int, int], int] = {}  # (job, round) -> attempt to run next
        self._applied: tuple[int, int, np.ndarray | None, int] = (-1, -1, None, 1)  # last round applied
        self._done_attempt: dict[tuple[int, int], int] = {}  # (job, round) -> attempt this node finished

    def _sample(self, src: int, dst: int, nbytes: int, seconds: float) -> None:
        """One chunk fully arrived over src->dst; every probe_num probes make one report.

        The estimate is bytes over the union of the probes' [send-start, receive-complete]
        intervals: chunks of several flows (trees) crossing one link at once each see only their
        share, but together they show what the link carried while busy."""
        if nbytes <= self.probe_bytes or seconds <= 0:
            return
        now = self.clock.now()
        probes = self._probes.setdefault((src, dst), [])
        probes.append((now - seconds, now, nbytes))
        if len(probes) >= self.probe_num:
            busy, end = 0.0, -math.inf
            for t_send, t_recv, _ in sorted(probes):
                if t_recv > end:
                    busy += t_recv - max(t_send, end)
                    end = t_recv
            self.samples.append([src, dst, sum(p[2] for p in probes), busy])
            del self._probes[(src, dst)]

    async def run(self) -> None:
        port = await self.overlay.listen(self.listen_port)
        self._lag.start()
        reporter = asyncio.create_task(self._report_loop())
        jobs: set[asyncio.Task] = set()
        ctl: ControlConn | None = None
        try:
            ctl = await self._connect(port)
            while (end := await self._serve_scheduler(ctl, jobs)) != "shutdown":
                # the scheduler went away (crashed, restarted), or declared this incarnation lost (it was
                # frozen, or starved): drop its jobs, wait for it, register again
                for task in jobs:
                    task.cancel()
                for st in list(self.engine.rounds.values()):
                    self.overlay.abort(st.job)
                    self.engine.abort(st.job, st.round, st.attempt)
                    self.engine.end_round(st)
                ctl.close()
                if end == "fenced":  # everyone refuses the old epoch now: come back as a new incarnation
                    self.epoch = self.overlay.new_incarnation()
                    log.warning("node %d: the scheduler declared us lost (silent too long); rejoining as "
                                "incarnation %d", self.node, self.epoch)
                else:
                    log.warning("node %d: lost the scheduler; waiting up to %.0f s for it", self.node,
                                self.scheduler_wait_s)
                ctl = await self._connect(port, wait_s=self.scheduler_wait_s)
                if ctl is None:
                    log.error("node %d: no scheduler for %.0f s; leaving", self.node, self.scheduler_wait_s)
                    break
        finally:
            reporter.cancel()
            for task in jobs:
                task.cancel()
            self._lag.stop()
            if self._trace_task is not None:
                self._trace_task.cancel()
            await self.overlay.close()
            if ctl is not None:
                ctl.close()

    async def _connect(self, port: int, wait_s: float | None = None) -> ControlConn | None:
        """Dial, authenticate, sync clocks, register. First time: fail loudly. After losing the
        scheduler: retry with backoff for up to wait_s, then give up (None)."""
        deadline, backoff = time.time() + (wait_s or 0.0), 0.1
        while True:
            try:
                ctl = await ControlConn.connect(*self.scheduler,
                                                ssl=self.tls.client_context() if self.tls else None)
            except (OSError, TimeoutError) as exc:
                if wait_s is None:
                    raise ConnectionError(f"node {self.node}: cannot reach the scheduler: {exc}") from None
                if time.time() > deadline:
                    return None
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)
                continue
            self.ctl = ctl
            try:  # HELLO both ways, then HMAC proofs both ways (overlay/auth.py)
                await ctl.handshake(Handshake(self.cluster, self.node, "agent", dialer=True, secret=self.secret,
                                              expect=-1, peer_role="scheduler", hello_extra={"epoch": self.epoch}))
            except (AuthError, TimeoutError) as exc:
                why = exc.reason if isinstance(exc, AuthError) else "no handshake reply in time"
                raise ConnectionError(f"node {self.node}: the scheduler refused us or failed authentication: "
                                      f"{why}") from None
            if self.clock_sync:
                await self._sync_clock(ctl)
            # a restarted scheduler numbers jobs and versions above what any agent has seen
            ctl.send({"t": "REGISTER", "node": self.node, "host": self.host, "port": port,
                      "neighbors": self.topo.neighbors(self.node), "pid": os.getpid(),
                      "seen_job": self._seen[0], "seen_version": max(self.plans, default=self._seen[1])})
            return ctl

    async def _serve_scheduler(self, ctl: ControlConn, jobs: set[asyncio.Task]) -> str:
        """Messages from the scheduler until it says SHUTDOWN ("shutdown"), fences this incarnation
        ("fenced") or the connection ends ("lost")."""
        while True:
            msg = await ctl.recv()
            if msg is None:
                return "lost"
            try:
                end = self._on_scheduler(msg, jobs)
            except (PlanError, ValueError, KeyError, TypeError) as exc:  # never half-alive: start over
                log.error("node %d: the scheduler's %s could not be used (%s: %s); reconnecting", self.node,
                          msg["t"], type(exc).__name__, exc)
                return "lost"
            if end is not None:
                return end

    def _on_scheduler(self, msg: dict[str, Any], jobs: set[asyncio.Task]) -> str | None:
        """One message from the scheduler; "shutdown", "fenced" or "lost" if the connection ends here."""
        t = msg["t"]
        if t == "SHUTDOWN":
            return "shutdown"
        if t == "PEERS":
            peers = {int(n): (v[0], v[1]) for n, v in msg["peers"].items()}
            self.live_peers = set(peers) & self.overlay.neighbors
            self.overlay.connect(peers)
        elif t == "FENCE" and msg["node"] == self.node:
            return "fenced" if msg["epoch"] == self.epoch else "lost"
        elif t == "FENCE":  # a lost agent's incarnation: cut it off, never accept it again
            self.live_peers.discard(msg["node"])
            self.overlay.fence(msg["node"], msg["epoch"])
        elif t == "JOB":
            self._seen = (max(self._seen[0], msg["job"]), self._seen[1])
            self.engine.open_job(msg["job"], msg.get("start", 0), msg.get("ahead", 1))
            task = asyncio.create_task(self._job(msg))
            jobs.add(task)
            task.add_done_callback(jobs.discard)
        elif t == "TOPO_REPLY":
            if "plan" in msg:  # checked here, where a bad one ends the connection, not the job
                msg["plan"] = Plan.from_wire(msg["plan"]).validate()
            fut = self._replies.pop((msg["job"], msg["round"]), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif t == "AUX_UPDATE":
            self.engine.set_aux(msg["version"], tuple(aux_from_wire(g) for g in msg["groups"]))
        elif t == "EMU":
            self._emu(msg)
        elif t == "ABORT":
            self._on_abort(msg["job"], msg["round"], msg["attempt"])
        return None

    def _emu(self, msg: dict[str, Any]) -> None:
        """A link fault on the application backend (emulation.faults.AppLinkControl): rate -> this
        node's shaper of src->dst; down -> cut and refuse the peer; blackhole -> hold our direction."""
        op, a, b = msg["op"], msg["src"], msg["dst"]
        if self.node not in (a, b):
            log.warning("node %d: EMU %s for link %d-%d, which is not ours", self.node, op, a, b)
            return
        peer = b if self.node == a else a
        if peer not in self.overlay.neighbors:
            log.warning("node %d: EMU %s: node %d is not a neighbour", self.node, op, peer)
            return
        if op == "down":
            self.overlay.suspend(peer, msg["on"])
            return
        shaper = self.shapers.get(peer)
        if shaper is None or not self.rate_shaping:
            log.warning("node %d: EMU %s on %d-%d ignored: the application does not shape this link",
                        self.node, op, a, b)
        elif op == "rate":
            if self.node == a:
                shaper.set_rate(msg["mbps"])
        else:
            shaper.blackhole(msg["on"])

    async def _sync_clock(self, ctl: ControlConn, exchanges: int = CLOCK_EXCHANGES) -> None:
        """Cristian: a few CLOCK round trips to the scheduler, keep the shortest."""
        got = []
        for _ in range(exchanges):
            t0 = self.clock.local()
            ctl.send({"t": "CLOCK", "t0": t0})
            reply = await ctl.recv()
            if reply is None or reply["t"] != "CLOCK" or "t1" not in reply:
                raise ConnectionError(f"node {self.node}: no clock reply from the scheduler")
            got.append((t0, reply["t1"], self.clock.local()))
        offset = self.clock.update(got)
        log.info("node %d: clock offset %+.6f s (+- %.6f)", self.node, offset, self.clock.error_bound)

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            self._heartbeat()
            self._flush_samples()
            self._send_counters()

    def _heartbeat(self) -> None:
        """Liveness and progress: bytes received tell the scheduler a round still moves."""
        if self.ctl is not None:
            rx = sum(m.bytes for m in self.overlay.meters_in.values())
            now = time.monotonic()
            waits = {b: s.stuck_s(now) for b, s in self.overlay.senders.items()}
            stuck = [[b, round(w, 3)] for b, w in waits.items() if w > 0]
            try:
                self.ctl.send({"t": "HEARTBEAT", "node": self.node, "time": self.clock.now(), "rx": rx,
                               "stuck": stuck})
            except ConnectionError:
                pass

    def _send_counters(self) -> None:
        """Cumulative bytes per outgoing link: the scheduler turns them into live throughput and metrics."""
        if self.ctl is not None:
            links = {b: s.meter.bytes for b, s in self.overlay.senders.items()}
            try:
                self.ctl.send({"t": "COUNTERS", "node": self.node, "time": self.clock.now(), "links": links})
            except ConnectionError:
                pass

    def _flush_samples(self) -> None:
        if self.samples and self.ctl is not None:
            batch, self.samples = self.samples, []
            try:
                self.ctl.send({"t": "REPORT", "node": self.node, "samples": batch})
            except ConnectionError:
                pass

    def _start_trace(self, t0: float) -> None:
        """Replay the shared trace from t0 for every job, so every scheme sees the same WAN."""
        if self._trace_task is not None:
            self._trace_task.cancel()
        for b in self.shapers:
            self._set_link_rate(b, self.topo.links[(self.node, b)].rate_mbps)
        mine = [e for e in self.trace.events if e.src == self.node and e.dst in self.shapers]
        if mine:
            self._trace_task = asyncio.create_task(self._apply_trace(t0, mine))

    async def _apply_trace(self, t0: float, events: list) -> None:
        for e in events:
            wait = t0 + e.t - self.clock.now()
            if wait > 0:
                await asyncio.sleep(wait)
            self._set_link_rate(e.dst, e.rate_mbps)

    def _set_link_rate(self, dst: int, mbps: float) -> None:
        """Our shaper paces the link; or, on the tc backend (the launcher applies the same trace to
        the kernel), the sender only sizes its queues from the rate (overlay.link)."""
        if self.rate_shaping:
            self.shapers[dst].set_rate(mbps)
        else:
            self.overlay.senders[dst].set_kernel_rate(mbps * MBIT)

    async def _job(self, msg: dict[str, Any]) -> None:
        assert self.ctl is not None
        job, rounds, nparams = msg["job"], msg["rounds"], msg["params"]
        await self.overlay.wait_connected(60, peers=self.live_peers)
        self._start_trace(msg.get("t0") or self.clock.now())
        cpu0, wall0 = _cpu_s(), time.time()
        guard0 = {b: sh.guard() for b, sh in self.shapers.items()}
        meter0 = {b: s.meter.snapshot() for b, s in self.overlay.senders.items()}
        self._lag.take_p99()
        aux0 = (self.engine.aux_bytes, self.engine.sent_bytes)
        self.params = np.zeros(nparams, dtype=np.float32)
        rnd = msg.get("start", 0)
        computed: dict[int, float] = {}
        while rnd < rounds:
            prev = (job, rnd - 1)
            if prev in self._done_attempt and self._attempt.get(prev, 0) > self._done_attempt[prev]:
                rnd -= 1  # the round we finished was aborted meanwhile (others had not): redo it
                self._undo_update()
                continue
            attempt = self._attempt.get((job, rnd), 0)
            # ~0.1 s per 2.5 M parameters: off the loop, which must keep heartbeats and relays going
            contrib = await asyncio.to_thread(contribution, rnd, 0, self.node, nparams)
            if rnd not in computed:  # a retried attempt reuses the round's gradient
                tc = time.time()
                if msg["compute_s"] > 0:
                    await asyncio.sleep(msg["compute_s"])
                computed[rnd] = time.time() - tc
            fut = asyncio.get_running_loop().create_future()
            self._replies[(job, rnd)] = fut
            t_ask = time.time()
            self.ctl.send({"t": "TOPO_REQUEST", "job": job, "round": rnd, "attempt": attempt,
                           "have": sorted(self.plans)})
            try:
                reply = await fut
            except RoundAborted:
                continue  # an attempt was aborted before this round started: ask again (or go back, above)
            t_wait = time.time() - t_ask
            if reply.get("skip"):  # rejoined after this round was frozen
                rnd += 1
                continue
            if "plan" in reply:
                self.plans[reply["version"]] = reply["plan"].with_version(reply["version"])
            self.engine.avoid_links(reply.get("avoid", ()))
            plan = self.plans[reply["version"]]
            self.overlay.forget_before(job, rnd - 1)
            self.engine.drop_stale(job, rnd)
            t_start = self.clock.now()
            st = self.engine.begin_round(job, rnd, attempt, plan, contrib)
            error = ""
            try:
                result = await st.done
                ok = True
            except RoundAborted:
                self.engine.end_round(st)
                continue  # retried under the attempt (and plan) the scheduler hands out next
            except Exception as exc:  # a RoundError: reported, never silently wrong
                result, ok, error = st.result, False, str(exc)
            t_end = self.clock.now()
            self.engine.end_round(st)
            if ok:
                # numpy and blake2b release the GIL: verify off the loop, which still forwards chunks
                ok, error = await asyncio.to_thread(self._verify_and_apply, result, rnd, plan, nparams)
            digest = await asyncio.to_thread(_digest, result)
            self._flush_samples()
            done = {"t": "ROUND_DONE", "node": self.node, "job": job, "round": rnd, "attempt": attempt,
                    "version": plan.version, "digest": digest, "ok": ok, "t_start": t_start, "t_end": t_end,
                    "t_compute": computed[rnd], "t_wait": t_wait}
            if error:
                done["error"] = error
            self.ctl.send(done)
            self._done_attempt[(job, rnd)] = attempt
            self._applied = (job, rnd, result.copy() if ok else None, len(plan.participants))
            rnd += 1
        self.ctl.send({"t": "STATS", "node": self.node, "job": job,
                       "stats": self._stats(cpu0, wall0, guard0, meter0, aux0)})

    def _on_abort(self, job: int, rnd: int, attempt: int) -> None:
        """ABORT: drop the attempt everywhere here; the job loop asks for the next attempt. If this
        node had already finished that round (others had not), it goes back and redoes it."""
        self._attempt[(job, rnd)] = max(self._attempt.get((job, rnd), 0), attempt + 1)
        self.overlay.abort(job, rnd, attempt)
        self.engine.abort(job, rnd, attempt)
        # wake the job loop if it waits to start this round, or (having finished it) the next one
        waiting = [rnd] + ([rnd + 1] if self._done_attempt.get((job, rnd), attempt + 1) <= attempt else [])
        for r in waiting:
            fut = self._replies.pop((job, r), None)
            if fut is not None and not fut.done():
                fut.set_exception(RoundAborted(f"job {job} round {rnd} attempt {attempt} aborted"))

    def _undo_update(self) -> None:
        """Undo this round's model update: its result is about to be computed again."""
        _, _, result, n = self._applied
        if result is not None and self.params is not None:
            self.params += np.float32(0.01 / n) * result
        self._applied = (-1, -1, None, 1)

    def _verify_and_apply(self, result: np.ndarray, rnd: int, plan: Plan, nparams: int) -> tuple[bool, str]:
        """Exact check against the closed-form sum, then this agent's own model update."""
        want = expected(rnd, 0, plan.participants, nparams, plan.weights)
        if not np.array_equal(result, want):
            error = f"{int(np.count_nonzero(result != want))} elements differ from the exact sum"
            log.error("node %d round %d: %s", self.node, rnd, error)
            return False, error
        self.params -= np.float32(0.01 / len(plan.participants)) * result
        return True, ""

    def _stats(self, cpu0: float, wall0: float, guard0: dict, meter0: dict, aux0: tuple[int, int]
               ) -> dict[str, Any]:
        """The job's figures, with the fidelity guard's: books per link and per node cap, and how
        the event loop fared (wansync.cluster.guard_verdict judges them)."""
        wall = time.time() - wall0
        links = {}
        for b, s in self.overlay.senders.items():
            m, m0 = s.meter.snapshot(), meter0[b]
            entry: dict[str, Any] = {k: m[k] - m0[k] for k in ("bytes", "chunks", "busy_s", "segments", "resent")}
            if b in self.shapers and self.rate_shaping:
                g, g0 = self.shapers[b].guard(), guard0[b]
                exp = g["expected_bytes"] - g0["expected_bytes"]
                sent = g["sent_bytes"] - g0["sent_bytes"]
                held = g["held_s"] - g0["held_s"]
                idle = g["idle_s"] - g0["idle_s"]
                # backlog_s: the time the link's own rate was the limit (not the uplink's holds, which
                # are the cap's, nor waits for data to send)
                entry.update(configured_mbps=g["rate_mbps"], backlog_s=g["busy_s"] - g0["busy_s"] - held - idle,
                             uplink_held_s=held, idle_s=idle, achieved_ratio=min(1.0, sent / exp) if exp > 0 else 1.0)
            links[str(b)] = entry
        caps: dict[str, Any] = {}
        for name, cap in (("uplink", self.uplink), ("downlink", self.downlink)):
            if cap is None:
                continue
            g, g0 = cap.guard(), self._cap_mark.get(name, {})  # since the previous job's STATS
            self._cap_mark[name] = g
            exp = g["expected_bytes"] - g0.get("expected_bytes", 0.0)
            sent = g["sent_bytes"] - g0.get("sent_bytes", 0.0)
            caps[name] = {"configured_mbps": g["rate_mbps"], "backlog_s": g["busy_s"] - g0.get("busy_s", 0.0),
                          "bytes": sent, "achieved_ratio": min(1.0, sent / exp) if exp > 0 else 1.0}
        return {"links": links, "caps": caps, **self._lag.take(),
                "cpu_s": _cpu_s() - cpu0, "wall_s": wall, "stashed_frames": self.engine.stashed_frames,
                "aux_bytes": self.engine.aux_bytes - aux0[0], "sent_bytes": self.engine.sent_bytes - aux0[1],
                "protocol_errors": len(self.overlay.errors),
                "app_rate_shaping": bool(self.shapers) and self.rate_shaping}


def _digest(result: np.ndarray) -> bytes:
    return hashlib.blake2b(memoryview(result).cast("B"), digest_size=16).digest()


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
