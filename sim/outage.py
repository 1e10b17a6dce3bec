"""Job mode with link failures: links go down for good, running tasks over them are repaired or abandoned.

What the live failure policy does (scheduler/progress/crew.py), replayed blind on the stepped engine
(sim/stepped.py) with a ready queue: at each failure's time both directions of the link carry nothing
(flows on it stall); `detect_s` later the failure is known: `on_detect(links)` lets the caller's
planner see it (later tasks avoid it), and every running task with a flow over a dead link is
aborted and handed to `repair(plan, dead links, running plans)`: a new plan re-runs the whole task
(as live, a new attempt resends everything) at once, None abandons it (its members queue again with
the same iterations, as live). The caller supplies both, so the simulator stays pure; not modelled:
node failures, the scheduler's own latency.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from core.compute import ComputeModel
from core.plan import Plan
from core.progress.queue import Queue as QueueDecision

from .job import _END, JobPrediction, PlanFor, Queue, _Job
from .model import SimNetwork, TaskRun
from .stepped import DT, Stepped

Link = tuple[int, int]
Repair = Callable[[Plan, set[Link], list[Plan]], Plan | None]
_DETECT = 4  # after job.py's kinds


@dataclass
class OutagePrediction(JobPrediction):
    repaired: int = 0  # tasks re-run on a repaired plan
    abandoned: int = 0
    detected: list[tuple[float, Link]] = field(default_factory=list)


def simulate_outages(policy: Queue, plan_for: PlanFor, compute: ComputeModel, workers: Iterable[int],
                     net: SimNetwork, budget_s: float, failures: Iterable[tuple[float, int, int]], *,
                     detect_s: float, on_detect: Callable[[list[Link]], None], repair: Repair,
                     dt: float = DT) -> OutagePrediction:
    """A ready-queue job of `budget_s` seconds from 0 in which each (t, a, b) of `failures` takes link a-b
    down (both directions) for good at t."""
    fails = sorted(failures)
    events = list(net.events) + [(t, s, d, 0.0) for t, a, b in fails for s, d in ((a, b), (b, a))]
    net = SimNetwork(net.rates_mbps, net.delays_s, net.route, net.uplink_mbps, net.downlink_mbps,
                     tuple(sorted(events)))
    job = _OutageJob(policy, plan_for, compute, tuple(sorted(workers)), None, Stepped(net, dt))
    job.repair, job.on_detect = repair, on_detect

    def planned(members: tuple[int, ...], receivers: tuple[int, ...]) -> Plan:
        job.last_plan = plan_for(members, receivers)
        return job.last_plan
    job.plan_for = planned
    for t, a, b in fails:
        job._push(t + detect_s, _DETECT, (min(a, b), max(a, b)))
    return job.run_outages(0.0, budget_s)


class _OutageJob(_Job):
    repair: Repair
    on_detect: Callable[[list[Link]], None]

    def run_outages(self, t0: float, t_end: float) -> OutagePrediction:
        self.dead: set[Link] = set()
        self.live_plans: dict[int, Plan] = {}
        self.repaired = self.abandoned = 0
        self.detected: list[tuple[float, Link]] = []
        self.start(t0)
        self._loop(t_end)
        out = OutagePrediction(self.iterations, self.computed, self.tasks)
        out.repaired, out.abandoned, out.detected = self.repaired, self.abandoned, self.detected
        return out

    last_plan: Plan

    def _dispatch(self, kind: int, data: Any, t: float) -> None:
        if kind == _DETECT:
            self._detect(data, t)
            return
        if kind == _END:
            self.live_plans.pop(data[0], None)
        super()._dispatch(kind, data, t)

    def _form(self, members: Iterable[int], receivers: Iterable[int], iters: dict[int, int], t: float) -> None:
        super()._form(members, receivers, iters, t)
        self.live_plans[self.tasks[-1].key] = self.last_plan

    def _received(self, key: int, node: int, t: float) -> None:
        if node not in self.tasks[key].receiver_done_s:  # a receiver done before a repair keeps that result
            super()._received(key, node, t)

    def _detect(self, link: Link, t: float) -> None:
        self.dead.add(link)
        self.detected.append((t, link))
        self.on_detect([link])
        assert isinstance(self.eng, Stepped)
        for key, plan in sorted(self.live_plans.items()):
            if not _uses(plan, self.dead):
                continue
            self.eng.abort(key)
            others = [p for k, p in self.live_plans.items() if k != key]
            new = self.repair(plan, set(self.dead), others)
            task = self.tasks[key]
            if new is None:
                del self.live_plans[key]
                self.abandoned += 1
                task.end_s = None
                assert isinstance(self.decision, QueueDecision)  # nothing applied: they queue again
                self._act(self.decision.requeue(sorted(task.iters.items()), t), t)
            else:
                self.repaired += 1
                self.live_plans[key] = new
                self.eng.add(TaskRun(key, new, t))


def _uses(plan: Plan, dead: set[Link]) -> bool:
    for g in plan.groups:
        edges = [(n, p) for n, p in g.parent.items() if p is not None]
        edges += [(p, k) for p, kids in g.children.items() for k in kids]
        if any((min(a, b), max(a, b)) in dead for a, b in edges):
            return True
    return False
