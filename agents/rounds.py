"""The rounds of a job on one node: JOB -> (compute, READY, wait for the round's task, apply)* -> STATS.

For every round the node computes its contribution (or sleeps for the configured compute time),
says READY (under BSP the round's task forms once every member did, and the first READY freezes
the plan version), and waits for the outcome of that task (agents/tasks.py runs it and reports).
Then it applies the result to its model. An ABORT ends an attempt; the loop says READY again for
the next one, and if this node had already finished the aborted round (others had not) it goes
back, undoes its model update and redoes it. A training script's job (workload "handoff") takes its
contributions from the script's steps: READY once the script called step(), padded up to the compute
model's draw when the run has one; under a multicast progress model each step's result is the script's
model combined with the fresh ones it received (agents/received.py). A job of mode "tasks" has no rounds of its own: the
scheduler forms the tasks, and this node only serves them. The job's figures, with the fidelity
guard's books, go to the scheduler in STATS at the end.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from core.compute import ComputeModel
from core.plan import Plan
from overlay.clock import SyncedClock
from overlay.messages import Job, Leave, Ready, Record, Stats
from overlay.peers import Overlay

from .engine import ChunkEngine
from .handoff import Handoff
from .looplag import LoopLag
from .received import Inbox
from .scratch import KEEP_ARRAYS_PER_SIZE
from .taskpart import TaskAborted
from .tasks import Outcome, Prepared, Skipped, TaskRunner
from .training import Trainer, TrainingSpec, WorkloadError, check_result
from .wan import NodeWan
from .workload import contribution

LEARNING_RATE = 0.01
HANDOFF = "handoff"  # a job's workload: contributions from the training script attached to each agent


class RoundLoop:
    """Runs this node's jobs round by round, all state crossing the wire; one per agent."""

    def __init__(self, node: int, engine: ChunkEngine, overlay: Overlay, wan: NodeWan, lag: LoopLag,
                 clock: SyncedClock, plans: dict[int, Plan], runner: TaskRunner, *,
                 send: Callable[[Record], None], live_peers: Callable[[], set[int]]) -> None:
        """send: a message to the scheduler; live_peers: the neighbours the scheduler says are up (a
        job waits for connections to them)."""
        self.node = node
        self.engine = engine
        self.overlay = overlay
        self.wan = wan
        self.lag = lag
        self.clock = clock
        self.plans = plans  # every version this node holds (shared with the engine)
        self.runner = runner
        self.send = send
        self.live_peers = live_peers
        self.params: np.ndarray | None = None  # the model this agent keeps (updated with each round's result)
        self.tasks: set[asyncio.Task] = set()  # running jobs
        self._applied: tuple[int, int, np.ndarray | None, int] = (-1, -1, None, 1)  # last round applied
        self.trainer: Trainer | None = None  # a real-training job's model and data (agents.training)
        self.handoff: Handoff | None = None  # a training script's channel (workload "handoff")
        self.script = False  # the running job's contributions come from the attached script
        self.inbox: Inbox | None = None  # a multicast job's received models (agents/received.py)
        self.padded_s = 0.0  # the compute model's padding on top of the script's own step times

    def start(self, msg: Job) -> None:
        """JOB: run it (the engine was told to expect its traffic)."""
        task = asyncio.create_task(self._job(msg))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def cancel(self) -> None:
        """Stop every job (the scheduler is gone, or the agent ends)."""
        for task in self.tasks:
            task.cancel()

    def abandon(self) -> None:
        """The scheduler went away or fenced us: stop every job and drop its tasks in flight."""
        self.cancel()
        self.runner.abandon()

    # --- the loop ------------------------------------------------------------------------------------
    async def _job(self, msg: Job) -> None:
        job, nparams = msg.job, msg.params
        # before the first await: results may arrive while this agent waits
        if msg.workload == HANDOFF and self.handoff is not None:
            self._script_receiving(msg)
        spec = self._trainer_receiving(msg) if msg.workload and msg.workload != HANDOFF else None
        await self.overlay.wait_connected(60, peers=self.live_peers())
        self.wan.start_trace(msg.t0 or self.clock.now())
        cpu0, wall0 = _cpu_s(), time.time()
        guard0 = self.wan.link_marks()
        meter0 = {b: s.meter.snapshot() for b, s in self.overlay.senders.items()}
        self.lag.take_p99()
        aux0 = (self.engine.aux_bytes, self.engine.sent_bytes)
        self.params = np.zeros(nparams, dtype=np.float32)
        self.script = msg.workload == HANDOFF
        # the rounds' accumulators and results, ready before the first round; a barrier job's results land
        # in the training script's region, so its rounds take accumulators only
        await self.engine.arrays.prefault(nparams, 2 if self.script and msg.barrier else KEEP_ARRAYS_PER_SIZE)
        # back in a running job (this agent restarted, or was declared lost) with no script: it sits the
        # job out until one attaches (the scheduler then sends the job again)
        idle = bool(self.script and msg.start and self.handoff is not None
                    and not (self.handoff.script or self.handoff.attaching))
        if idle:
            self.send(Leave(node=self.node, why=f"node {self.node} has no training script attached"))
        elif self.script:
            await self._script(msg)
        self.trainer = await self._trainer(spec) if spec is not None else None
        reported = False

        def report() -> None:
            """STATS: this node's figures for the job (again, if it redid its last round meanwhile)."""
            nonlocal reported
            reported = True
            stats = self._stats(cpu0, wall0, guard0, meter0, aux0)
            if self.trainer is not None:
                stats["training"] = self.trainer.stats()
            elif self.script and self.handoff is not None:
                stats["training"] = {**self.handoff.stats(), "padded_s": self.padded_s,
                                     **({"received": self.inbox.stats()} if self.inbox is not None else {})}
            self.send(Stats(node=self.node, job=job, stats=stats))

        if msg.mode != "tasks" and not idle:
            await self._rounds(msg, report)
        else:
            await self.runner.job_over(job)
        self.runner.received.pop(job, None)  # the job's inbox (its last models) goes with it
        if not reported:
            report()

    def _trainer_receiving(self, msg: Job) -> TrainingSpec:
        """A real-training job's results are checked within float32 rounding (agents.training) from the
        moment the job is known, as a script job's are (`_script_receiving`): its data set loads for
        seconds, and a task of it may complete here meanwhile."""
        assert msg.workload is not None
        spec = TrainingSpec.parse(msg.workload)
        if spec.vector_params != msg.params:
            raise WorkloadError(f"params: job {msg.job} moves {msg.params} parameters, workload {msg.workload!r} "
                                f"contributes {spec.vector_params}")
        self.runner.verifiers[msg.job] = lambda result, plan: check_result(spec, result, len(plan.participants))
        return spec

    async def _trainer(self, spec: TrainingSpec) -> Trainer:
        """A real-training job: this worker's model and shard (the data set loads off the loop)."""
        trainer = await asyncio.to_thread(Trainer, spec, self.node)
        await asyncio.to_thread(trainer.maybe_evaluate, self.clock.now(), -1)  # the untrained model's accuracy
        return trainer

    async def _script(self, msg: Job) -> None:
        """A training script's job: its agent must have the script attached (it is, when the launcher
        starts the job), moving the values the script's layout says."""
        if self.handoff is None:
            raise WorkloadError(f"job {msg.job} trains through the hand-off channel, which this agent does not "
                                "serve (started without --handoff-dir)")
        script = await asyncio.wait_for(self.handoff.attached(), 60)
        if script.values != msg.params:
            raise WorkloadError(f"params: job {msg.job} moves {msg.params} values, the attached script "
                                f"{script.values}")
        handoff = self.handoff
        # round = step + offset: a script that (re)joins mid-job takes its step 0 at the job's start round;
        # steps an earlier job took (the launcher's attach broadcast) come before it
        handoff.offset = (msg.start or 0) - (script.delivered + 1)
        self.runner.resyncers[msg.job] = lambda rnd, _source: handoff.share(rnd)
        self.padded_s = 0.0

    def _script_receiving(self, msg: Job) -> None:
        """A script job's results are checked by the script's check, and other workers' multicasts go to
        its inbox, from the moment the job is known: a task of it can complete here while this agent still
        waits for its connections or its script (a loaded machine: the synthetic workload's closed-form
        check then judged a script's sum and called every element wrong)."""
        handoff = self.handoff
        assert handoff is not None
        self.runner.verifiers[msg.job] = lambda result, plan: handoff.check(result, len(plan.participants))
        self.inbox = None
        if msg.rule == "bound":  # other workers' multicasts come to this one: combined after each step
            self.inbox = Inbox(self.node, msg.staleness or 0)
            self.runner.received[msg.job] = self.inbox.put

    async def _rounds(self, msg: Job, report: Callable[[], None]) -> None:
        """Iterations: compute (the job's compute model), READY, then wait as the job's rule says — for
        the result of the task holding this iteration's contribution (BSP, a ready queue), or for a GO
        that allows the next iteration (SSP: the slowest worker plus the staleness bound). With every
        round done here it reports (STATS) and stays until the scheduler ends the job (JOB_END): a node
        lost before the others had the last round's sum aborts that round, which this one then redoes."""
        job, rounds, nparams = msg.job, msg.rounds, msg.params
        runner = self.runner
        bound = msg.rule == "bound"
        model = (ComputeModel(msg.compute, msg.seed or 1, msg.compute_scale or 1.0) if msg.compute
                 else ComputeModel(f"constant:{msg.compute_s}"))
        rnd = msg.start or 0
        computed: dict[int, float] = {}
        trained: dict[int, np.ndarray] = {}  # a training job's contribution per round (a retry reuses it)
        trainer = self.trainer
        shifted: set[int] = set()  # rounds that handed the model to a rejoining script: our steps moved on
        stop = runner.ending(job)  # JOB_END: the job's time is up (a ready queue stops at a budget)
        t_free = time.time()  # the script computes from here (its previous result, or the job's start)
        def back() -> bool:
            """The round we finished was aborted meanwhile (others had not): step back to redo it."""
            nonlocal rnd
            prev = (job, rnd - 1)
            if (bound or prev not in runner.done_attempt or rnd <= (msg.start or 0)
                    or runner.next_attempt.get(prev, 0) <= runner.done_attempt[prev]):
                return False
            rnd -= 1
            self._undo_update()
            if rnd in shifted and self.handoff is not None:
                shifted.discard(rnd)
                self.handoff.offset -= 1
            return True

        while not stop.done():
            if back():
                continue
            if rnd >= rounds:  # every round done here
                if bound:
                    break
                # the others may still wait for the last round, and a node lost before they had its sum
                # aborts it: until JOB_END, that ABORT sends us back to redo it (back(), above)
                report()
                after = runner.outcome(job, rounds)  # an ABORT of the round we finished wakes this (on_abort)
                await asyncio.wait({after, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not after.done():
                    runner.forget(job, rounds)
                    break  # JOB_END: the job is over everywhere
                if after.exception() is None:
                    break  # nothing forms a task for a round past the last; an outcome for it ends the wait
                continue
            if self.script:  # the script's step: its own compute, its own pace
                assert self.handoff is not None
                got = await _first(self.handoff.contribution(rnd), stop)
                if got is None:
                    break  # the script detached (or the job ended)
                contrib = got
                if rnd not in computed:  # READY when the script's step is in, padded up to the compute model's
                    own = time.time() - t_free
                    pad = model.draw(self.node, rnd) - own if msg.compute else 0.0
                    if pad > 0:
                        await _first(asyncio.sleep(pad), stop)
                        self.padded_s += pad
                    computed[rnd] = own + max(pad, 0.0)
            # ~0.1 s per 2.5 M parameters: off the loop, which must keep heartbeats and relays going
            elif trainer is None:
                contrib = await asyncio.to_thread(contribution, rnd, 0, self.node, nparams)
            if rnd not in computed:  # a retried attempt reuses the round's gradient
                tc = time.time()
                if trainer is not None:  # real SGD steps, then a sleep up to the drawn compute time
                    trained[rnd] = await asyncio.to_thread(trainer.step, rnd)
                if (s := model.draw(self.node, rnd) - (time.time() - tc)) > 0:
                    nap = asyncio.ensure_future(asyncio.sleep(s))
                    await asyncio.wait({nap, stop}, return_when=asyncio.FIRST_COMPLETED)
                    nap.cancel()
                computed[rnd] = time.time() - tc
            if trainer is not None:
                contrib = trained[rnd]
            if stop.done():
                break
            # again, with no await from here to READY: an ABORT of the round we finished may have come
            # while this one computed, when no outcome of ours waited to hear it (runner.on_abort wakes
            # only those); READY for this round then would wait for a task the scheduler never forms
            if back():
                continue
            attempt = runner.next_attempt.get((job, rnd), 0)
            if msg.mode != "tasks" and not bound:  # tasks are the rounds: older ones are over everywhere
                self.overlay.forget_before(job, rnd - 1)
                self.engine.drop_stale(job, rnd)
            # a barrier job's sum lands in the script's result region as it is received (no copy back):
            # no one reads that region while the next round is summed there (agents/handoff.py)
            into = self.handoff.result_region() if self.script and msg.barrier and self.handoff is not None else None
            runner.prepared[(job, rnd)] = Prepared(contrib, time.time(), computed[rnd], into)
            fut = None if bound else runner.outcome(job, rnd)
            self.send(Ready(job=job, round=rnd, attempt=attempt, have=sorted(self.plans)))
            if bound:
                if rnd + 1 < rounds:  # blocks while this worker is `s` ahead of the slowest
                    await runner.allowed(job, rnd + 1)
                if self.script and self.handoff is not None and self.inbox is not None:
                    self._combine(rnd, contrib)
                    t_free = time.time()
                rnd += 1
                continue
            assert fut is not None
            await asyncio.wait({fut, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not fut.done():
                break  # the job ended while this round waited for its task
            try:
                out: Outcome = fut.result()
            except TaskAborted:
                continue  # an attempt was aborted: ready again (or go back, above)
            except Skipped:  # rejoined after this round's task formed
                runner.prepared.pop((job, rnd), None)
                rnd += 1
                continue
            runner.prepared.pop((job, rnd), None)
            trained.pop(rnd - 1, None)  # kept one round more: an abort after we finished redoes it
            if self.script and out.resync and self.node not in out.resync[1:] and self.handoff is not None:
                self.handoff.offset += 1  # the round carried the model to a rejoining rank: our step is next
                shifted.add(rnd)
                rnd += 1
                continue
            if self.script and self.handoff is not None:  # the sum goes back to the script
                members = list(out.plan.participants)
                self.handoff.deliver(rnd, out.result if out.ok else None,
                                     sum(out.plan.weights.values()), members, "" if out.ok else out.error,
                                     weights=[float(out.plan.weights[m]) for m in members])
                t_free = time.time()
            elif out.ok and trainer is not None:  # the group's weighted average is this worker's model now
                trainer.apply(out.result, dict(out.plan.weights))
                self.params = trainer.model
                await asyncio.to_thread(trainer.maybe_evaluate, self.clock.now(), rnd)
            elif out.ok:
                # off the loop (it relays for others meanwhile), in place: no model-sized temporary
                await asyncio.to_thread(_step, self.params, -LEARNING_RATE / len(out.plan.participants), out.result)
            # the result's own array (a task's, never written again): no copy of the model per round
            self._applied = (job, rnd, out.result if out.ok else None, len(out.plan.participants))
            rnd += 1
        if bound:  # the last iterations' contributions still travel: wait until their tasks are done here
            await runner.idle(job)

    def _combine(self, rnd: int, own: np.ndarray) -> None:
        """A multicast job's step result: this worker's model with the fresh ones it received, uniformly
        weighted (agents/received.py says which and why)."""
        assert self.handoff is not None and self.inbox is not None
        c = self.inbox.combine(rnd, own)
        members = sorted([self.node, *c.applied])
        self.handoff.deliver(rnd, c.total, c.weight, members, weights=[1.0] * len(members))

    def _undo_update(self) -> None:
        """Undo this round's model update: its result is about to be computed again."""
        _, _, result, n = self._applied
        if self.trainer is not None:
            self.trainer.undo()
            self.params = self.trainer.model
        elif result is not None and self.params is not None:
            _step(self.params, LEARNING_RATE / n, result)
        self._applied = (-1, -1, None, 1)

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
                "go_wait_s": self.runner.go_wait_s,
                "aux_bytes": self.engine.aux_bytes - aux0[0], "sent_bytes": self.engine.sent_bytes - aux0[1],
                "protocol_errors": self.overlay.error_count,
                "app_rate_shaping": self.wan.app_rate_shaping}


async def _first(work: Any, stop: asyncio.Future) -> Any:
    """`work`'s result, or None if `stop` is done first (work is cancelled then)."""
    task = asyncio.ensure_future(work)
    await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        return None
    return task.result()


def _step(params: np.ndarray, k: float, result: np.ndarray) -> None:
    """params += k * result, in place, a block at a time: no temporary the size of the model."""
    block = 1 << 20
    scratch = np.empty(min(block, params.size), np.float32)
    for i in range(0, params.size, block):
        part = scratch[:min(block, params.size - i)]
        np.multiply(result[i:i + block], np.float32(k), out=part)
        params[i:i + block] += part


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
