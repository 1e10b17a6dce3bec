"""The rounds of a job on one node: JOB -> (compute, TOPO_REQUEST, engine round, verify, ROUND_DONE)* -> STATS.

For every round the node computes its contribution (or sleeps for the configured compute time), asks
the scheduler which plan version the round uses (the first request freezes it for everyone), runs
the chunk engine, checks the result against the exact expected sum, applies it to its model and
reports. An ABORT ends an attempt here; the loop asks for the next one, and if this node had already
finished the aborted round (others had not) it goes back, undoes its model update and redoes it.
The job's figures, with the fidelity guard's books, go to the scheduler in STATS at the end.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import resource
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from overlay.clock import SyncedClock
from overlay.messages import Job, Record, RoundDone, Stats, TopoReply, TopoRequest
from overlay.peers import Overlay
from scheduler.plan import Plan

from .engine import ChunkEngine, RoundAborted
from .looplag import LoopLag
from .wan import NodeWan
from .workload import contribution, expected

log = logging.getLogger("wansync.agent")


class RoundLoop:
    """Runs this node's jobs round by round, all state crossing the wire; one per agent."""

    def __init__(self, node: int, engine: ChunkEngine, overlay: Overlay, wan: NodeWan, lag: LoopLag,
                 clock: SyncedClock, plans: dict[int, Plan], *, send: Callable[[Record], None],
                 flush_samples: Callable[[], None], live_peers: Callable[[], set[int]]) -> None:
        """send: a message to the scheduler; flush_samples: report link samples now (before a
        ROUND_DONE, so the view has them when it plans the next round); live_peers: the neighbours
        the scheduler says are up (a job waits for connections to them)."""
        self.node = node
        self.engine = engine
        self.overlay = overlay
        self.wan = wan
        self.lag = lag
        self.clock = clock
        self.plans = plans  # every version this node holds (shared with the engine)
        self.send = send
        self.flush_samples = flush_samples
        self.live_peers = live_peers
        self.params: np.ndarray | None = None  # the model this agent keeps (updated with each round's result)
        self.tasks: set[asyncio.Task] = set()  # running jobs
        self._replies: dict[tuple[int, int], asyncio.Future] = {}  # (job, round) -> its TOPO_REPLY
        self._attempt: dict[tuple[int, int], int] = {}  # (job, round) -> attempt to run next
        self._applied: tuple[int, int, np.ndarray | None, int] = (-1, -1, None, 1)  # last round applied
        self._done_attempt: dict[tuple[int, int], int] = {}  # (job, round) -> attempt this node finished

    # --- what the scheduler says -----------------------------------------------------------------------
    def start(self, msg: Job) -> None:
        """JOB: run it (the engine was told to expect its traffic)."""
        task = asyncio.create_task(self._job(msg))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def on_reply(self, msg: TopoReply, plan: Plan | None) -> None:
        """TOPO_REPLY, with its plan already checked (None: the reply carries no plan)."""
        fut = self._replies.pop((msg.job, msg.round), None)
        if fut is not None and not fut.done():
            fut.set_result((msg, plan))

    def on_abort(self, job: int, rnd: int, attempt: int) -> None:
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

    def cancel(self) -> None:
        """Stop every job (the scheduler is gone, or the agent ends)."""
        for task in self.tasks:
            task.cancel()

    def abandon(self) -> None:
        """The scheduler went away or fenced us: stop every job and drop its rounds in flight."""
        self.cancel()
        for st in list(self.engine.rounds.values()):
            self.overlay.abort(st.job)
            self.engine.abort(st.job, st.round, st.attempt)
            self.engine.end_round(st)

    # --- the loop ------------------------------------------------------------------------------------
    async def _job(self, msg: Job) -> None:
        job, rounds, nparams = msg.job, msg.rounds, msg.params
        await self.overlay.wait_connected(60, peers=self.live_peers())
        self.wan.start_trace(msg.t0 or self.clock.now())
        cpu0, wall0 = _cpu_s(), time.time()
        guard0 = self.wan.link_marks()
        meter0 = {b: s.meter.snapshot() for b, s in self.overlay.senders.items()}
        self.lag.take_p99()
        aux0 = (self.engine.aux_bytes, self.engine.sent_bytes)
        self.params = np.zeros(nparams, dtype=np.float32)
        rnd = msg.start or 0
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
                if msg.compute_s > 0:
                    await asyncio.sleep(msg.compute_s)
                computed[rnd] = time.time() - tc
            fut = asyncio.get_running_loop().create_future()
            self._replies[(job, rnd)] = fut
            t_ask = time.time()
            self.send(TopoRequest(job=job, round=rnd, have=sorted(self.plans), attempt=attempt))
            try:
                reply, new_plan = await fut
            except RoundAborted:
                continue  # an attempt was aborted before this round started: ask again (or go back, above)
            t_wait = time.time() - t_ask
            if reply.skip:  # rejoined after this round was frozen
                rnd += 1
                continue
            if new_plan is not None:
                self.plans[reply.version] = new_plan.with_version(reply.version)
            self.engine.avoid_links(reply.avoid or ())
            plan = self.plans[reply.version]
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
            self.flush_samples()
            self.send(RoundDone(node=self.node, job=job, round=rnd, attempt=attempt, version=plan.version,
                                digest=digest, ok=ok, t_start=t_start, t_end=t_end, t_compute=computed[rnd],
                                t_wait=t_wait, error=error or None))
            self._done_attempt[(job, rnd)] = attempt
            self._applied = (job, rnd, result.copy() if ok else None, len(plan.participants))
            rnd += 1
        self.send(Stats(node=self.node, job=job, stats=self._stats(cpu0, wall0, guard0, meter0, aux0)))

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
        assert self.params is not None
        self.params -= np.float32(0.01 / len(plan.participants)) * result
        return True, ""

    def _stats(self, cpu0: float, wall0: float, guard0: dict, meter0: dict, aux0: tuple[int, int]
               ) -> dict[str, Any]:
        """The job's figures, with the fidelity guard's: books per link and per node cap, and how
        the event loop fared (wansync.guard.guard_verdict judges them)."""
        wall = time.time() - wall0
        links = {}
        for b, s in self.overlay.senders.items():
            m, m0 = s.meter.snapshot(), meter0[b]
            entry: dict[str, Any] = {k: m[k] - m0[k] for k in ("bytes", "chunks", "busy_s", "segments", "resent")}
            entry.update(self.wan.link_books(b, guard0))
            links[str(b)] = entry
        caps = self.wan.cap_books()
        return {"links": links, "caps": caps, **self.lag.take(),
                "cpu_s": _cpu_s() - cpu0, "wall_s": wall, "stashed_frames": self.engine.stashed_frames,
                "aux_bytes": self.engine.aux_bytes - aux0[0], "sent_bytes": self.engine.sent_bytes - aux0[1],
                "protocol_errors": len(self.overlay.errors),
                "app_rate_shaping": self.wan.app_rate_shaping}


def _digest(result: np.ndarray) -> bytes:
    return hashlib.blake2b(memoryview(result).cast("B"), digest_size=16).digest()


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
