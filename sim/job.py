"""Job mode: a progress model driving many tasks over a time budget, on one network, blind.

Workers compute (the same seeded draws of a core.compute.ComputeModel the agents sleep for), say READY,
and the model forms tasks, which the exact engine replays as they come, sharing the network with
every task still running. The caller supplies the planner (`plan_for(members, receivers) -> Plan`),
so the simulator stays pure. The models' decisions are core.progress's, taken by name from the one
registry the live scheduler's models (scheduler/progress) use too; this driver is the worker loop of
agents/rounds.py around them. The policies below name a model and its options:

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.compute import ComputeModel
from core.dispatch import DISPATCH, Dispatch
from core.plan import Plan
from core.progress import SIMULATED, Action, Decision, Form, Go, decide
from core.progress.selective import Selective as SelectiveDecision
from core.selective import Controller, SelectiveConfig

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

    def options(self) -> dict[str, Any]:
        """The registry's options of the model (core.progress.decide)."""
        return {}


@dataclass(frozen=True)
class Ssp:
    staleness: int = 2
    name = "ssp"

    def options(self) -> dict[str, Any]:
        return {"staleness": self.staleness}


@dataclass(frozen=True)
class Queue:
    group: int = 2
    name = "queue"

    def options(self) -> dict[str, Any]:
        return {"group": self.group}


@dataclass(frozen=True)
class Selective:
    config: SelectiveConfig
    bandwidth: Mapping[int, float]  # per worker, Mbit/s: what the controller believes (an oracle by default)
    samples: tuple[float, ...] = ()  # the runtime profile for a warm start
    name = "selective"

    def options(self) -> dict[str, Any]:
        return {"config": self.config, "bandwidth": self.bandwidth, "samples": self.samples}


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
    the engine advanced up to each of them; the model's decision object says what forms and who may go on."""

    def __init__(self, policy: Policy, plan_for: PlanFor, compute: ComputeModel, workers: tuple[int, ...],
                 rounds: int | None, eng: Exact | RingCost | Stepped, t0: float = 0.0) -> None:
        if policy.name not in SIMULATED:
            raise ValueError(f"progress model {policy.name!r}: the simulator runs {', '.join(sorted(SIMULATED))}")
        self.decision: Decision = decide(policy.name, **policy.options())  # refuses bad options now
        self.bound = self.decision.rule == "bound"  # workers wait for a Go, not for their task's result
        self.policy, self.plan_for, self.compute, self.workers = policy, plan_for, compute, workers
        self.rounds = rounds
        self.last = _INF if rounds is None else rounds - 1  # the last iteration
        self.eng = eng
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.tasks: list[JobTask] = []
        self.iterations = dict.fromkeys(workers, 0)
        self.computed = dict.fromkeys(workers, 0)
        self.refs: dict[int, int] = {}  # task key -> the decision's name for it (selective's group)
        self.allowed: dict[int, int] = {}  # bound: the highest iteration a Go allowed each worker
        self.waiting: dict[int, int] = {}  # bound: worker -> the iteration it waits to be allowed
        self.wake_seq = 0  # the decision's current wake-up (an older one is stale)
        self.t0 = t0

    def start(self, t0: float) -> None:
        """The decision hears the workers; every worker starts computing iteration 0 at t0."""
        self._act(self.decision.start(self.workers, self.t0, rounds=self.rounds), t0)
        for w in self.workers:
            self._compute(w, 0, t0)

    def run(self, t0: float, t_end: float) -> JobPrediction:
        self.start(t0)
        self._loop(t_end)
        if self.bound:  # an iteration is over once its multicast is: the decision's done count
            self.iterations.update({w: self.decision.synced(w) for w in self.workers})
        ctl = self.decision.controller if isinstance(self.decision, SelectiveDecision) else None
        return JobPrediction(self.iterations, self.computed, self.tasks, ctl)

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
                self._act(self.decision.tick(t), t)
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

    def _act(self, actions: Sequence[Action], t: float) -> None:
        """The decision's actions, in order: its tasks form now, its Gos free the workers waiting for
        them (once all of this pass are in); its next wake-up (if it has one) becomes an event."""
        gos = False
        for a in actions:
            if isinstance(a, Form):
                if a.ref is not None:
                    self.refs[len(self.tasks)] = a.ref
                self._form(a.members, a.members if a.receivers is None else a.receivers, dict(a.iters), t)
            elif isinstance(a, Go):
                self.allowed[a.worker] = a.upto
                gos = True
        if gos:
            self._release(t)
        self.wake_seq += 1  # every pass sets the wake-up anew: earlier ones are stale
        if self.decision.wake_at is not None:
            self._push(self.decision.wake_at, _WAKE, self.wake_seq)

    # --- READY ----------------------------------------------------------------------------------
    def _ready(self, w: int, k: int, t: float) -> None:
        self.computed[w] += 1
        # READYs of one instant are drained before a pass of a model that waits for them (A21)
        more = bool(self.events) and self.events[0][0] == t and self.events[0][1] == _COMPUTED
        self._act(self.decision.ready(w, k, t, last=k >= self.last, defer=more), t)
        if self.bound and k + 1 <= self.last:  # computes on once a Go allows it
            self.waiting[w] = k + 1
            self._release(t)

    # --- results and ends ---------------------------------------------------------------------------
    def _received(self, key: int, node: int, t: float) -> None:
        task = self.tasks[key]
        task.receiver_done_s[node] = t
        if not self.bound and node in task.iters:  # the result of its own iteration
            self.iterations[node] += 1
            self._compute(node, task.iters[node] + 1, t)

    def _ended(self, key: int, t: float) -> None:
        task = self.tasks[key]
        task.end_s = t
        # each member resumed when it held the result (agents/rounds.py)
        self._act(self.decision.over(self.refs.get(key), task.iters, t, back=dict(task.receiver_done_s)), t)

    def _release(self, t: float) -> None:
        for w, k in list(self.waiting.items()):
            if k <= self.allowed.get(w, -1):
                del self.waiting[w]
                self._compute(w, k, t)
