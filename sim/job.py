"""Job mode: a progress policy driving many tasks over a time budget, on one network, blind.

Workers compute (the same seeded draws of a core.compute.ComputeModel the agents sleep for), say READY,
and the policy forms tasks, which the exact engine replays as they come, sharing the network with
every task still running. The caller supplies the planner (`plan_for(members, receivers) -> Plan`),
so the simulator stays pure. The policies mirror scheduler/progress (bsp.py, ssp.py, queue.py; not
imported, they live on the scheduler's job state), with the worker loop of agents/rounds.py:

    Bsp()            every worker each round: the task forms when the last worker is READY; a
                     worker computes its next iteration once it holds the result
    Ssp(staleness)   after each iteration a worker's tensor is multicast to all others; with d_j the
                     last iteration of worker j whose multicast is over (-1 before), worker i may
                     compute iteration k only when d_i >= k - 1 and k <= min_j d_j + 1 + s
    Queue(group)     READY workers queue; the first `group` queued form a partial reduce of their
                     contributions (each its own iteration), which they all receive; when fewer
                     than `group` are still to come (only with `rounds`), whoever is queued goes
    Selective(cfg, bandwidth, samples)
                     selective reduce, P-Reduce, all-reduce (seed 003): core.selective.Controller, the
                     very object scheduler/progress/selective.py runs live, told of every READY and
                     task end and woken at its own dt; a member resumes at its own receive time

engine="ring" replays tasks with the paper's ring cost model (sim/ringcost.py, Eq. 2) instead of the
exact engine: disjoint ring groups at node caps at n = 200 with a 500 MB model.

Not modelled: the scheduler's own latency (a READY forms its task, a task's end raises the GO, at
once), planning time, losses and aborts.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.compute import ComputeModel
from core.dispatch import DISPATCH, Dispatch
from core.plan import Plan
from core.selective import Controller, Launch, SelectiveConfig

from .costs import NONE, WanCosts
from .exact import Exact
from .model import Model, SimNetwork, TaskRun
from .ringcost import RingCost
from .stepped import DT, Stepped

PlanFor = Callable[[tuple[int, ...], tuple[int, ...]], Plan]

_INF = float("inf")
# driver events, in the order they are handled when times tie (results before the READYs they free)
_RECEIVED, _END, _COMPUTED, _WAKE = 0, 1, 2, 3


@dataclass(frozen=True)
class Bsp:
    name = "bsp"


@dataclass(frozen=True)
class Ssp:
    staleness: int = 2
    name = "ssp"


@dataclass(frozen=True)
class Queue:
    group: int = 2
    name = "queue"


@dataclass(frozen=True)
class Selective:
    config: SelectiveConfig
    bandwidth: Mapping[int, float]  # per worker, Mbit/s: what the controller believes (an oracle by default)
    samples: tuple[float, ...] = ()  # the runtime profile for a warm start
    name = "selective"


Policy = Bsp | Ssp | Queue | Selective


@dataclass
class JobTask:
    key: int
    members: tuple[int, ...]
    receivers: tuple[int, ...]
    iters: dict[int, int]  # member -> the iteration its contribution comes from
    start_s: float
    end_s: float | None = None  # None: still running when the budget ran out
    receiver_done_s: dict[int, float] = field(default_factory=dict)


@dataclass
class JobPrediction:
    # per worker: iterations whose synchronization was over within the budget (BSP, queue: the worker
    # held the result; SSP: its multicast of the iteration had ended)
    iterations: dict[int, int]
    computed: dict[int, int]  # per worker: iterations computed (READY) within the budget
    tasks: list[JobTask]
    controller: Controller | None = None  # Selective: the controller, with its figures (`summary`)


def simulate_job(policy: Policy, plan_for: PlanFor, compute: ComputeModel, workers: Iterable[int], net: SimNetwork,
                 budget_s: float, *, rounds: int | None = None, start_s: float = 0.0, segment_bytes: int = 65536,
                 costs: WanCosts = NONE, dispatch: Dispatch = DISPATCH, cap_rates: bool = True,
                 engine: str = "exact", dt: float = DT) -> JobPrediction:
    """Replay a job from `start_s` for `budget_s` seconds: every worker starts computing iteration 0 at
    start_s; rounds: iterations per worker (None: as many as the budget allows). engine: "exact" (every
    chunk an event), "ring" (the paper's closed-form ring cost, ring plans only) or "stepped"
    (sim/stepped.py: flows advanced together in steps of dt, for one-hop plans on networks without
    node caps, such as CREW's at n = 60; costs do not apply)."""
    if engine == "ring":
        eng: Exact | RingCost | Stepped = RingCost(net, start_s)
    elif engine == "stepped":
        eng = Stepped(net, dt)
        eng.now = start_s
    elif engine == "exact":
        nodes = {n for link in net.rates_mbps for n in link}
        m = Model([], net, start_s, segment_bytes, costs, nodes=nodes)
        eng = Exact(m, dispatch, cap_rates=cap_rates)
    else:
        raise ValueError(f"engine: {engine!r} is not exact, ring or stepped")
    job = _Job(policy, plan_for, compute, tuple(sorted(workers)), rounds, eng, start_s)
    return job.run(start_s, start_s + budget_s)


class _Job:
    """The driver: its own events (computations over, results and task ends as the engine finds them),
    the engine advanced up to each of them."""

    def __init__(self, policy: Policy, plan_for: PlanFor, compute: ComputeModel, workers: tuple[int, ...],
                 rounds: int | None, eng: Exact | RingCost | Stepped, t0: float = 0.0) -> None:
        if isinstance(policy, Queue) and policy.group < 1:
            raise ValueError(f"group must be >= 1, got {policy.group}")
        if isinstance(policy, Ssp) and policy.staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {policy.staleness}")
        self.policy, self.plan_for, self.compute, self.workers = policy, plan_for, compute, workers
        self.last = _INF if rounds is None else rounds - 1  # the last iteration
        self.eng = eng
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.tasks: list[JobTask] = []
        self.iterations = dict.fromkeys(workers, 0)
        self.computed = dict.fromkeys(workers, 0)
        self.barrier: dict[int, set[int]] = {}  # BSP: iteration -> workers READY for it
        self.queue: list[tuple[int, int]] = []  # ready queue: (worker, iteration) in READY order
        self.last_in: set[int] = set()
        self.done = dict.fromkeys(workers, -1)  # SSP: last iteration whose multicast is over
        self.allowed: dict[int, int] = {}
        self.waiting: dict[int, int] = {}  # SSP: worker -> the iteration it waits to be allowed
        self.ctl: Controller | None = None
        self.gid_task: dict[int, int] = {}  # Selective: the controller's group -> task key
        self.task_gid: dict[int, int] = {}
        self.wake_seq = 0  # the controller's current wake-up (an older one is stale)
        if isinstance(policy, Selective):
            self.ctl = Controller(policy.config, workers, policy.bandwidth, t0=t0, samples=policy.samples)

    def run(self, t0: float, t_end: float) -> JobPrediction:
        if isinstance(self.policy, Ssp):
            self._advance(t0, start=False)
        for w in self.workers:
            self._compute(w, 0, t0)
        self._loop(t_end)
        return JobPrediction(self.iterations, self.computed, self.tasks, self.ctl)

    def _loop(self, t_end: float) -> None:
        """The network's and the job's events in time order, up to t_end."""
        while True:
            t_next = min(self.events[0][0] if self.events else _INF, t_end)
            found = self.eng.advance(t_next)
            if found:
                for key, node, t in found:
                    self._push(t, _END if node is None else _RECEIVED, (key, node))
                continue
            if not self.events or self.events[0][0] > t_end:
                break
            t, kind, _, data = heapq.heappop(self.events)
            self._dispatch(kind, data, t)

    def _dispatch(self, kind: int, data: Any, t: float) -> None:
        if kind == _COMPUTED:
            self._ready(*data, t)
        elif kind == _WAKE:
            if data == self.wake_seq:
                self._launch(self.ctl.tick(t), t)  # type: ignore[union-attr]
        elif kind == _RECEIVED:
            self._received(*data, t)
        else:
            self._ended(data[0], t)

    def _push(self, t: float, kind: int, data: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, data))

    def _compute(self, w: int, k: int, t: float) -> None:
        if k <= self.last:
            self._push(t + self.compute.draw(w, k), _COMPUTED, (w, k))

    def _form(self, members: Iterable[int], receivers: Iterable[int], iters: dict[int, int], t: float) -> None:
        members, receivers = tuple(sorted(members)), tuple(sorted(receivers))
        task = JobTask(len(self.tasks), members, receivers, iters, t)
        self.tasks.append(task)
        self.eng.add(TaskRun(task.key, self.plan_for(members, receivers), t))

    # --- READY ----------------------------------------------------------------------------------
    def _ready(self, w: int, k: int, t: float) -> None:
        self.computed[w] += 1
        p = self.policy
        if self.ctl is not None:  # READYs of one instant are drained before the controller's pass (A21)
            more = bool(self.events) and self.events[0][0] == t and self.events[0][1] == _COMPUTED
            self._launch(self.ctl.ready(w, k, t, last=k >= self.last, defer=more), t)
        elif isinstance(p, Bsp):
            have = self.barrier.setdefault(k, set())
            have.add(w)
            if len(have) == len(self.workers):
                del self.barrier[k]
                self._form(self.workers, self.workers, dict.fromkeys(self.workers, k), t)
        elif isinstance(p, Ssp):
            others = [n for n in self.workers if n != w]
            if others:
                self._form((w,), others, {w: k}, t)
            else:  # nobody to tell: done at once
                self._ssp_done(w, k, t)
            if k + 1 <= self.last:  # computes on once a GO allows it
                self.waiting[w] = k + 1
                self._release(t)
        else:
            self.queue = [(n, r) for n, r in self.queue if n != w] + [(w, k)]
            if k >= self.last:
                self.last_in.add(w)
            self._queue_form(t)

    def _queue_form(self, t: float) -> None:
        """ReadyQueue._form: groups of p in READY order; the last ones together once nobody else comes."""
        assert isinstance(self.policy, Queue)
        p = self.policy.group
        while len(self.queue) >= p:
            group, self.queue = self.queue[:p], self.queue[p:]
            self._form([n for n, _ in group], [n for n, _ in group], dict(group), t)
        coming = set(self.workers) - self.last_in - {n for n, _ in self.queue}
        if self.queue and not coming:
            group, self.queue = self.queue, []
            self._form([n for n, _ in group], [n for n, _ in group], dict(group), t)

    def _launch(self, launches: list[Launch], t: float) -> None:
        """The controller's groups become tasks now; its next wake-up (if a group waits) an event."""
        for L in launches:
            self.gid_task[L.gid] = len(self.tasks)
            self.task_gid[len(self.tasks)] = L.gid
            self._form(L.members, L.members, dict(L.iters), t)
        assert self.ctl is not None
        self.wake_seq += 1  # every pass sets the wake-up anew: earlier ones are stale
        if self.ctl.wake_at is not None:
            self._push(self.ctl.wake_at, _WAKE, self.wake_seq)

    # --- results and ends ---------------------------------------------------------------------------
    def _received(self, key: int, node: int, t: float) -> None:
        task = self.tasks[key]
        task.receiver_done_s[node] = t
        if not isinstance(self.policy, Ssp) and node in task.iters:  # the result of its own iteration
            self.iterations[node] += 1
            self._compute(node, task.iters[node] + 1, t)

    def _ended(self, key: int, t: float) -> None:
        task = self.tasks[key]
        task.end_s = t
        if isinstance(self.policy, Ssp):
            for node, k in task.iters.items():
                self._ssp_done(node, k, t)
        elif isinstance(self.policy, Queue):
            self._queue_form(t)
        elif self.ctl is not None:  # each member resumed when it held the result (agents/rounds.py)
            self._launch(self.ctl.done(self.task_gid[key], t, back=dict(task.receiver_done_s)), t)

    # --- SSP's bound ----------------------------------------------------------------------------------
    def _ssp_done(self, w: int, k: int, t: float) -> None:
        if k > self.done[w]:
            self.iterations[w] += k - self.done[w]
            self.done[w] = k
        self._advance(t)

    def _advance(self, t: float, start: bool = True) -> None:
        """Ssp._advance: each worker's allowance, then the waiting ones it frees compute on."""
        assert isinstance(self.policy, Ssp)
        floor = min(self.done.values(), default=-1)
        for n, d in self.done.items():
            upto = min(d + 1, floor + 1 + self.policy.staleness, self.last)
            if upto > self.allowed.get(n, -1):
                self.allowed[n] = int(upto)
        if start:
            self._release(t)

    def _release(self, t: float) -> None:
        for w, k in list(self.waiting.items()):
            if k <= self.allowed.get(w, -1):
                del self.waiting[w]
                self._compute(w, k, t)
