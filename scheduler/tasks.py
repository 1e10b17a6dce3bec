"""A job and the life of each of its tasks, as objects: what the scheduler knows of a task from its
forming to its record.

A task is: an id, the members that contribute (with weights), the receivers of the result, the
nodes that only aggregate, replicate or relay, a plan and its version. Under BSP the task for round
r (id r) forms at the round's barrier: members say READY, the first READY freezes the version, and
once every member did, the task starts. A task the scheduler forms itself (a partial reduce on a
subset) starts at once. Started, then done: every receiver's TASK_DONE, then its record. An abort
ends the attempt: everything of it is forgotten at once, and the next attempt forms again. Each
task is exact or aborted on its own. Nothing here talks to agents; the scheduler does.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.plan import Job, Plan
from overlay.messages import TaskDone

from .planners import PlannerSpec


@dataclass
class TaskRecord:
    job: int
    scheme: str
    task: int
    round: int  # the iteration its members' contributions come from (BSP: the task is round r)
    version: int
    round_s: float  # from the first node starting its part to the last receiver holding the result
    compute_s: float
    ok: bool
    digests_agree: bool
    versions_agree: bool  # every node ran the frozen version: the task mixed none
    t_start: float
    t_end: float
    warmup: bool
    errors: list[str]
    trp_wait_s: float = 0.0  # longest time a member waited from READY to its TASK (BSP: the barrier)
    coverage: float = 0.0  # share of directed links the view has measured, when the task ended
    prediction_s: float | None = None  # filled in by whoever knows the configured network
    attempt: int = 0  # > 0: earlier attempts were aborted (a lost agent, a stall) and retried
    participants: int = 0  # members
    # receiver -> hex XXH3-64 of its result's bytes: lets anyone check it against a sum of their own
    digests: dict[int, str] = field(default_factory=dict)
    members: list[int] = field(default_factory=list)
    receivers: list[int] = field(default_factory=list)
    aggregators: list[int] = field(default_factory=list)  # tree nodes that neither contribute nor receive
    bytes: int = 0  # the tensor's size
    aborted: bool = False  # no attempt could end exact (no plan left for its members): recorded, not retried
    # node -> [start, end] of its part (agents' synced clocks): which tasks overlapped where
    spans: dict[int, list[float]] = field(default_factory=dict)
    iters: dict[int, int] = field(default_factory=dict)  # member -> the iteration its contribution came from
    dropped: list[int] = field(default_factory=list)  # receivers that left while it ran (a multicast shrinks)
    # node -> task -> [bytes of that task the node had received when this one's first byte came, when
    # its part of this one was done]
    beside: dict[int, dict[int, list[int]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"type": "task", **{k: v for k, v in self.__dict__.items()}}


RoundRecord = TaskRecord  # a BSP round's record is its task's


@dataclass
class Task:
    """One task: its current attempt's barrier (BSP), version, start and results; when it was recorded."""

    id: int
    round: int  # the iteration whose contributions it sums
    barrier: bool = True  # BSP: it starts once every member said READY; False: the scheduler formed it
    members: tuple[int, ...] = ()  # fixed when the scheduler forms it; under BSP the frozen plan's
    receivers: tuple[int, ...] | None = None
    options: dict[str, Any] = field(default_factory=dict)  # planner options (formed tasks)
    attempt: int = 0
    version: int | None = None  # frozen for the current attempt (by its first READY under BSP)
    involved: frozenset[int] = frozenset()  # every node with a part in the current attempt, relays included
    asked: dict[int, set[int]] | None = None  # at the barrier: node -> plan versions it holds
    barrier_t: float | None = None  # the current attempt's first READY
    blocked: str | None = None  # why no plan exists for its members yet
    blocked_t: float | None = None  # since when
    started_t: float | None = None  # past the barrier, not complete
    done: dict[int, TaskDone] = field(default_factory=dict)  # node -> its TASK_DONE
    recorded_t: float | None = None  # when its last receiver's TASK_DONE came (the task is over)
    aborted: int = 0  # attempts aborted so far
    finished: asyncio.Future | None = None  # formed tasks: resolved with the record
    iters: dict[int, int] = field(default_factory=dict)  # member -> its iteration, where not `round`
    dropped: set[int] = field(default_factory=set)  # receivers that left while it ran

    @property
    def number(self) -> int:
        return self.id

    @property
    def frozen(self) -> bool:
        return self.version is not None

    def ask(self, node: int, have: set[int], now: float) -> None:
        if self.asked is None:
            self.asked, self.barrier_t = {}, now
        self.asked[node] = have

    def start(self, now: float) -> None:
        """Everyone asked and was answered: the barrier is passed."""
        self.asked, self.barrier_t = None, None
        self.started_t = now

    def abort(self) -> int:
        """The current attempt ends (it cannot end exact); returns its number. The next one forms
        anew, with a version frozen anew."""
        att = self.attempt
        self.attempt += 1
        self.aborted += 1
        self.version = None
        self.asked, self.barrier_t, self.blocked, self.blocked_t, self.started_t = None, None, None, None, None
        self.done = {}
        self.involved = frozenset()
        return att

    def receivers_of(self, plan: Plan) -> tuple[int, ...]:
        """Who must hold the result for the task to be over: the plan's receivers still in it."""
        return tuple(n for n in plan.receiver_set if n not in self.dropped)

    def record(self, js: JobState, plan: Plan, coverage: float) -> TaskRecord:
        """Every receiver reported: the task's record (times from the agents' synced clocks)."""
        got = self.done
        receivers = self.receivers_of(plan)
        tell = [got[n] for n in receivers if n in got]
        starts = [m.t_start for m in got.values()]
        ends = [m.t_end for m in tell]
        version = -1 if self.version is None else self.version
        members, recv = set(plan.participants), set(receivers)
        return TaskRecord(
            job=js.job, scheme=js.scheme, task=self.id, round=self.round, version=version,
            round_s=max(ends) - min(starts), compute_s=statistics.median(m.t_compute for m in tell),
            ok=all(m.ok for m in got.values()), digests_agree=len({m.digest for m in tell}) == 1,
            versions_agree={m.version for m in got.values()} == {version},
            t_start=min(starts), t_end=max(ends), warmup=self.round < js.warmup and self.barrier,
            errors=[m.error for m in got.values() if m.error],
            trp_wait_s=max((m.t_wait or 0.0) for m in tell), coverage=coverage,
            attempt=self.attempt, participants=len(plan.participants),
            digests={n: m.digest.hex() for n, m in sorted(got.items()) if m.digest is not None},
            members=sorted(members), receivers=sorted(recv),
            aggregators=sorted(set(plan.nodes) - members - recv), bytes=plan.params * 4,
            spans={n: [m.t_start, m.t_end] for n, m in sorted(got.items())},
            beside={n: {int(k): list(v) for k, v in m.beside.items()} for n, m in sorted(got.items()) if m.beside},
            iters={m: self.iters.get(m, self.round) for m in plan.participants}, dropped=sorted(self.dropped))


@dataclass
class JobState:
    """One scheme's run on the agents — `rounds` synchronized rounds (BSP), or the tasks the scheduler
    forms — and what its planner keeps."""

    job: int
    scheme: str
    rounds: int
    spec: Job
    plan: Plan
    warmup: int
    planner: PlannerSpec | None = None
    memory: dict[str, Any] = field(default_factory=dict)  # what the planner keeps between its plans
    stats: dict[int, dict[str, Any]] = field(default_factory=dict)
    records: list[TaskRecord] = field(default_factory=list)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    view_at_plan: dict[tuple, float] = field(default_factory=dict)  # NetworkView.snapshot()
    policy_s: float = 0.0
    t0: float = 0.0
    last_plan_t: float = 0.0
    replans: int = 0
    replan_s: float = 0.0  # the last re-plan's solve (versions.replan_due spaces the next by it)
    replanning: asyncio.Future | None = None  # an off-loop re-plan under way (PlannerSpec.offload)
    view_at_aux: dict[tuple, float] = field(default_factory=dict)
    last_aux_t: float = 0.0
    aux_updates: int = 0  # AUX_UPDATE pushes: new auxiliary tables without a new version
    aborts: list[dict[str, Any]] = field(default_factory=list)  # every aborted attempt, with why and when
    predicted: dict[int, float | None] = field(default_factory=dict)  # version -> simulated on the view
    job_msg: dict[str, Any] = field(default_factory=dict)  # the JOB message, for agents that rejoin
    avoid: list[list[int]] = field(default_factory=list)  # links the current plan routes around (view.unusable)
    joins: dict[int, int] = field(default_factory=dict)  # node -> first round it runs after rejoining
    mode: str = "rounds"  # "rounds": workers iterate (progress model below); "tasks": the scheduler forms them
    progress: Any = None  # the job's progress model (scheduler.progress): bsp, ssp, queue
    tasks: dict[int, Task] = field(default_factory=dict)  # by id (BSP: id = round)

    def bsp_task(self, rnd: int) -> Task:
        """The task of BSP round `rnd` (formed by the first READY for it)."""
        t = self.tasks.get(rnd)
        if t is None:
            t = self.tasks[rnd] = Task(rnd, rnd)
        return t

    def settled(self) -> int:
        """Every task below this id is over everywhere (recorded, or never to run again)."""
        live = [t.id for t in self.tasks.values() if t.recorded_t is None]
        return min(live, default=max(self.tasks, default=-1) + 1)

    # per task: what the per-round dicts of earlier versions showed (read-only views, for logs and tests)
    @property
    def frozen(self) -> Mapping[int, int]:
        return {n: r.version for n, r in self.tasks.items() if r.version is not None}

    @property
    def started(self) -> Mapping[int, float]:
        return {n: r.started_t for n, r in self.tasks.items() if r.started_t is not None}

    @property
    def blocked(self) -> Mapping[int, str]:
        return {n: r.blocked for n, r in self.tasks.items() if r.blocked is not None}

    @property
    def asked(self) -> Mapping[int, dict[int, set[int]]]:
        return {n: r.asked for n, r in self.tasks.items() if r.asked is not None}

    @property
    def attempt(self) -> Mapping[int, int]:
        return {n: r.attempt for n, r in self.tasks.items() if r.attempt}

    @property
    def done(self) -> Mapping[int, dict[int, TaskDone]]:
        return {n: r.done for n, r in self.tasks.items() if r.done}

    @property
    def recorded_t(self) -> Mapping[int, float]:
        return {n: r.recorded_t for n, r in self.tasks.items() if r.recorded_t is not None}
