"""Every task this node has a part in, several at once: TASK in, the chunk engine, TASK_DONE out.

A TASK names the members (they contribute), the receivers (they get the result) and the plan
version; this node may be any of them, or only aggregate, replicate or relay. A member contributes
what the BSP loop prepared for that iteration, or else the synthetic workload's contribution for
it; a receiver checks its result against the exact (weighted) sum of the members' contributions.
Each task is exact or aborted on its own: an ABORT ends only its attempt here.

The BSP loop (agents/rounds.py) waits on `outcome(job, round)` for the task that synchronizes its
round; tasks nobody waits for (partial reduces the scheduler forms, a node that only aggregates)
just run and report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
import xxhash

from core.plan import Plan
from overlay.clock import SyncedClock
from overlay.messages import Record, Task, TaskDone
from overlay.peers import Overlay

from .engine import ChunkEngine
from .taskpart import TaskAborted, TaskPart, outcome_future
from .workload import contribution, expected_period, mismatches

log = logging.getLogger("wansync.agent")


class Skipped(Exception):
    """The task for this round formed without this node (it rejoined too late for it)."""


@dataclass
class Outcome:
    """What a receiver holds when its part of a task is done."""

    task: int
    attempt: int
    plan: Plan
    result: np.ndarray
    ok: bool
    error: str
    resync: tuple[int, ...] = ()  # [source, *joining]: the round handed the current model to joining members


@dataclass
class Prepared:
    """What the BSP loop readied for a round: its contribution and when it said READY."""

    contribution: np.ndarray
    t_ready: float
    t_compute: float
    into: np.ndarray | None = None  # where its task's result should land (TaskPart), first attempt only


@dataclass(frozen=True)
class _Begun:
    """A part begun in the engine, and what its TASK_DONE will say of how it began."""

    st: TaskPart
    t_start: float
    missing: str  # why the sum holds zeros for this member ("" if it does not)
    t_wait: float | None
    t_compute: float


class TaskRunner:
    def __init__(self, node: int, engine: ChunkEngine, overlay: Overlay, clock: SyncedClock,
                 plans: dict[int, Plan], *, send: Callable[[Record], None],
                 flush_samples: Callable[[], None]) -> None:
        self.node = node
        self.engine = engine
        self.overlay = overlay
        self.clock = clock
        self.plans = plans  # every version this node holds (shared with the engine)
        self.send = send
        self.flush_samples = flush_samples
        self.prepared: dict[tuple[int, int], Prepared] = {}  # (job, round) -> the loop's contribution
        self._waiting: dict[tuple[int, int], asyncio.Future] = {}  # (job, round) -> the loop's outcome
        self._running: dict[tuple[int, int], asyncio.Task] = {}  # (job, task) -> this node's part
        self._round_of: dict[tuple[int, int], int] = {}  # (job, task) -> the round it synchronizes
        self.done_attempt: dict[tuple[int, int], int] = {}  # (job, task) -> attempt this node finished
        self.next_attempt: dict[tuple[int, int], int] = {}  # (job, task) -> attempt to run next
        self._ended: dict[int, asyncio.Future] = {}  # job -> set by JOB_END
        self.go: dict[int, int] = {}  # job -> highest iteration a GO allows (SSP)
        self._go_event: dict[int, asyncio.Event] = {}
        self.go_wait_s = 0.0  # time this worker waited for a GO (SSP's bound holding it back)
        self.dropped: dict[tuple[int, int], set[int]] = {}  # (job, task) -> receivers dropped from it
        # job -> how a receiver checks its result, when the job's workload is not the synthetic one
        # (agents.training: real training, checked within float32 rounding by its own trailer)
        self.verifiers: dict[int, Callable[[np.ndarray, Plan], tuple[bool, str]]] = {}
        # job -> this node's contribution to a round that hands the current model to joining members
        # (TASK resync: the source's model, zeros from everyone else), where the job's workload has one
        self.resyncers: dict[int, Callable[[int, int], Awaitable[np.ndarray | None]]] = {}
        # job -> where a receiver puts another worker's checked multicast (sender, its iteration, values):
        # a training script's job under a multicast progress model (agents/received.py)
        self.received: dict[int, Callable[[int, int, np.ndarray], None]] = {}

    async def allowed(self, job: int, rnd: int) -> None:
        """Until a GO allows iteration `rnd` (SSP); counts the time this worker waited."""
        if self.go.get(job, -1) >= rnd:
            return
        t = time.time()
        ev = self._go_event.setdefault(job, asyncio.Event())
        while self.go.get(job, -1) < rnd:
            ev.clear()
            await ev.wait()
        self.go_wait_s += time.time() - t

    def on_go(self, job: int, upto: int) -> None:
        self.go[job] = max(self.go.get(job, -1), upto)
        ev = self._go_event.get(job)
        if ev is not None:
            ev.set()

    async def idle(self, job: int) -> None:
        """Until no task of `job` runs here (this worker's last contributions have left)."""
        while running := [t for (j, _), t in self._running.items() if j == job]:
            await asyncio.wait(running)

    def on_drop(self, job: int, task: int, attempt: int, node: int, replicates: bool) -> None:
        """DROP: `node` leaves the receivers of a running task. Here: if this is that node, nothing of
        the task is applied (it keeps replicating for others if it must); if this node sends or
        relays to it, it stops — unless it replicates for others."""
        self.dropped.setdefault((job, task), set()).add(node)
        for st in self.engine.tasks.values():
            if st.key[:3] == (job, task, attempt):
                self.engine.drop_receiver(st, node)
        if node != self.node and not replicates:
            self.overlay.abort_to(job, task, node)

    async def job_over(self, job: int) -> None:
        """Until the scheduler ends a job whose tasks it formed (JOB_END)."""
        fut = self._ended.setdefault(job, asyncio.get_running_loop().create_future())
        await fut

    def ending(self, job: int) -> asyncio.Future:
        """Done once the scheduler ends the job (JOB_END): a job of rounds stops at its time budget."""
        return self._ended.setdefault(job, asyncio.get_running_loop().create_future())

    def end_job(self, job: int) -> None:
        fut = self._ended.setdefault(job, asyncio.get_running_loop().create_future())
        if not fut.done():
            fut.set_result(None)

    # --- what the BSP loop asks -----------------------------------------------------------------------
    def outcome(self, job: int, rnd: int) -> asyncio.Future:
        """The future result of the task for `rnd` (TaskAborted, Skipped or an Outcome); an abort that
        lands after its awaiter was cancelled (the agent stopping) is nobody's, not "never retrieved"."""
        fut = outcome_future()
        self._waiting[(job, rnd)] = fut
        return fut

    def forget(self, job: int, rnd: int) -> None:
        """Nobody waits for `rnd`'s outcome any more (the job ended)."""
        self._waiting.pop((job, rnd), None)

    # --- what the scheduler says ----------------------------------------------------------------------
    def on_task(self, msg: Task, plan: Plan | None) -> None:
        """TASK, with its plan already checked (None: this node holds that version)."""
        if msg.skip:
            self._wake(msg.job, msg.round, Skipped(f"round {msg.round} formed without node {self.node}"))
            return
        if plan is not None:
            self.plans[msg.version] = plan.with_version(msg.version)
        if msg.settled is not None:  # tasks below it are over everywhere: their duplicate keys are of no use
            self.overlay.forget_before(msg.job, msg.settled - 1)
        self.engine.avoid_links(msg.avoid or ())
        self.engine.note_task(msg.job, msg.task, msg.settled)
        if self.node not in self.plans[msg.version].nodes:
            return  # only a relay on a route the plan's edges take: the overlay passes its frames on
        key = (msg.job, msg.task)
        self._round_of[key] = msg.round
        old = self._running.pop(key, None)
        if old is not None:
            old.cancel()
        plan = self.plans[msg.version]
        # this node's part begins here, in the TASK's own callback, unless its contribution must be
        # awaited: the loop's next reads (peers that began first already send to us) then land in place
        # instead of in buffers of their own, and the part does not wait two more loop turns for a task
        # to start; on a loaded host each turn read megabytes (start skew 10-60 ms a round, 4 agents on 2 cores)
        begun = self._begin(msg, plan, *ready) if (ready := self._ready_contribution(msg, plan)) is not None else None
        if ready is not None and begun is None:
            return  # the plan gives this node no part (logged)
        t = asyncio.create_task(self._run(msg, plan, begun), name=f"task {key}")
        self._running[key] = t
        t.add_done_callback(lambda _t, key=key: self._running.pop(key, None) if self._running.get(key) is _t
                            else None)

    def on_abort(self, job: int, task: int, attempt: int) -> None:
        """ABORT: drop the attempt everywhere here. The BSP loop asks again; if this node had already
        finished that round (others had not), it goes back and redoes it."""
        key = (job, task)
        self.next_attempt[key] = max(self.next_attempt.get(key, 0), attempt + 1)
        self.overlay.abort(job, task, attempt)
        self.engine.abort(job, task, attempt)
        rnd = self._round_of.get(key, task)
        # wake the job loop if it waits for this round, or (having finished it) for the next one
        waiting = [rnd] + ([rnd + 1] if self.done_attempt.get(key, attempt + 1) <= attempt else [])
        for r in waiting:
            self._wake(job, r, TaskAborted(f"job {job} task {task} attempt {attempt} aborted"))

    def abandon(self) -> None:
        """The scheduler went away or fenced us: every task in flight is dropped."""
        for t in list(self._running.values()):
            t.cancel()
        for st in list(self.engine.tasks.values()):
            self.overlay.abort(st.job)
            self.engine.abort(st.job, st.task, st.attempt)
            self.engine.end_task(st)
        for fut in self._waiting.values():
            if not fut.done():
                fut.cancel()

    # --- one task, this node's part -------------------------------------------------------------------
    def _ready_contribution(self, msg: Task, plan: Plan) -> tuple[np.ndarray | None, str] | None:
        """This node's contribution to the task and why it is missing ("" if it is not), where no
        waiting is needed (a member with what the BSP loop prepared, or not a member); else None."""
        if self.node not in plan.participants:
            return None, ""
        mine = (msg.iters or {}).get(self.node, msg.round)  # the iteration this node's contribution comes from
        prep = self.prepared.get((msg.job, mine))
        if msg.resync and msg.job in self.resyncers:
            return None
        if prep is None and msg.job in self.verifiers:  # a real workload has nothing to stand in for it
            missing = f"node {self.node} has no contribution of iteration {mine} for task {msg.task}"
            log.error("%s", missing)
            return np.zeros(plan.params, np.float32), missing
        return (prep.contribution, "") if prep is not None else None

    async def _contribution(self, msg: Task, plan: Plan) -> np.ndarray:
        """A member's contribution that must be awaited: the source's model for a resync (zeros from
        the others), or the synthetic workload's, drawn off the loop."""
        if msg.resync and msg.job in self.resyncers:
            contrib = await self.resyncers[msg.job](msg.round, msg.resync[0]) if self.node == msg.resync[0] else None
            return np.zeros(plan.params, np.float32) if contrib is None else contrib
        mine = (msg.iters or {}).get(self.node, msg.round)
        return await asyncio.to_thread(contribution, mine, 0, self.node, plan.params)

    def _begin(self, msg: Task, plan: Plan, contrib: np.ndarray | None, missing: str) -> _Begun | None:
        """Start this node's part in the engine; None where the plan gives it none (logged)."""
        job, key = msg.job, (msg.job, msg.task)
        mine = (msg.iters or {}).get(self.node, msg.round)
        prep = self.prepared.get((job, mine)) if self.node in plan.participants else None
        t_start = self.clock.now()
        try:
            # a retry's result gets an array of its own: a frame of the aborted attempt may still be read
            # into `into`, and a retry after the script had the first result must not change it under it
            into = prep.into if prep is not None and msg.attempt == 0 and not msg.resync else None
            st = self.engine.begin_task(job, msg.task, msg.attempt, plan, contrib, into)
        except ValueError as exc:  # the plan gives this node no part: the scheduler's bug, said plainly
            log.error("node %d: task %d of job %d: %s", self.node, msg.task, job, exc)
            return None
        for gone in self.dropped.get(key, ()):  # dropped before this node began its part
            self.engine.drop_receiver(st, gone)
        return _Begun(st, t_start, missing,
                      t_wait=time.time() - prep.t_ready if prep is not None else None,  # READY -> TASK: the barrier
                      t_compute=prep.t_compute if prep is not None else 0.0)

    async def _run(self, msg: Task, plan: Plan, begun: _Begun | None) -> None:
        job, key = msg.job, (msg.job, msg.task)
        member = self.node in plan.participants
        mine = (msg.iters or {}).get(self.node, msg.round)  # the iteration this node's contribution comes from
        if begun is None:  # its contribution had to be awaited
            begun = self._begin(msg, plan, await self._contribution(msg, plan), "")
            if begun is None:
                return
        st, t_start, missing, t_wait, t_compute = begun.st, begun.t_start, begun.missing, begun.t_wait, begun.t_compute
        error = missing
        try:
            result = await st.done
            ok = True
        except TaskAborted:
            self.engine.end_task(st)
            return  # the scheduler hands out the next attempt (or the loop asks again)
        except Exception as exc:  # a TaskError: reported, never silently wrong
            result, ok, error = st.result if st.receiver else None, False, str(exc)
        t_end = self.clock.now()
        self.engine.end_task(st)
        digest = None
        ok = ok and not missing  # said plainly: the sum holds zeros for this member
        if st.receiver and result is not None:  # numpy and zlib release the GIL: off the loop, which forwards
            ok, error, digest = await asyncio.to_thread(self._check, ok, error, result, msg, plan)
        if member and ok:
            self.prepared.pop((job, mine), None)  # its contribution is in (a retry would draw it again)
        take = self.received.get(job)
        if take is not None and ok and result is not None and st.receiver and not member \
                and len(plan.participants) == 1:  # in the inbox before TASK_DONE: before the GO it allows
            src = plan.participants[0]
            take(src, (msg.iters or {}).get(src, msg.round), result)
        self.flush_samples()
        self.send(TaskDone(node=self.node, job=job, task=msg.task, attempt=msg.attempt, version=plan.version,
                           ok=ok, t_start=t_start, t_end=t_end, t_compute=t_compute, digest=digest, t_wait=t_wait,
                           error=error or None, beside=st.beside or None))
        self.done_attempt[key] = msg.attempt
        if st.receiver and result is not None:
            self._wake(job, mine if member else msg.round, Outcome(msg.task, msg.attempt, plan, result, ok, error,
                                                                   tuple(msg.resync or ())))

    def _check(self, ok: bool, error: str, result: np.ndarray, msg: Task, plan: Plan) -> tuple[bool, str, bytes]:
        """A receiver's result: the exact check (where the sum has not already failed), then its digest;
        in one call off the loop."""
        if ok:
            ok, error = self._verify(result, msg, plan)
        return ok, error, _digest(result)

    def _verify(self, result: np.ndarray, msg: Task, plan: Plan) -> tuple[bool, str]:
        """Exact check against the closed-form (weighted) sum of the members' contributions, each from
        its own iteration; or the job's own check (a real-training workload's)."""
        check = self.verifiers.get(msg.job)
        if check is not None:
            ok, error = check(result, plan)
            if not ok:
                log.error("node %d task %d: %s", self.node, msg.task, error)
            return ok, error
        iters = msg.iters or {}
        want = expected_period(msg.round, 0, plan.participants, plan.weights,
                               iters={m: iters.get(m, msg.round) for m in plan.participants})
        if result.shape != (plan.params,):
            error = f"a result of shape {result.shape}, not the plan's {plan.params} parameters"
            log.error("node %d task %d: %s", self.node, msg.task, error)
            return False, error
        if bad := mismatches(result, want):
            error = f"{bad} elements differ from the exact sum"
            log.error("node %d task %d: %s", self.node, msg.task, error)
            return False, error
        return True, ""

    def _wake(self, job: int, rnd: int, what: Outcome | Exception) -> None:
        fut = self._waiting.pop((job, rnd), None)
        if fut is None or fut.done():
            return
        if isinstance(what, Exception):
            fut.set_exception(what)
        else:
            fut.set_result(what)


def _digest(result: np.ndarray) -> bytes:
    """What receivers compare (the scheduler's digests_agree): the XXH3-64 of the result's float32
    bytes (xxhash's canonical, big-endian). Each receiver's exact check is its own; this only says that
    they hold the same bytes. It is on the round's critical path: 8.5 ms per 100 MB here, where zlib's
    CRC-32 took 45 ms (13 % of an agent's samples in an unshaped 100 MB ring) and blake2b 200 ms."""
    return xxhash.xxh3_64_digest(memoryview(result).cast("B"))
