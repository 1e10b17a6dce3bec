"""Plan versions and re-planning: which plan a task runs, frozen once, and when a job plans again.

Version rule (one mechanism for every scheme): under BSP each agent says READY when it computed
round r; the first READY for r freezes the version for everyone, so a round never mixes versions.
Re-planning (adaptive schemes, when the view moved by more than `update_rate`) only ever affects
rounds not yet frozen; a change of members or of usable links plans again for the living. A formed
task gets a plan of its own, on its live members. Auxiliary tables (NetStorm) may be refreshed
between versions without a new one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any

import msgpack

from core.plan import Plan, aux_to_wire, with_sharing
from overlay.messages import AuxUpdate

from . import planners
from .events import Observed
from .registry import Registry
from .solver import Solver
from .tasks import JobState, Task
from .view import DisconnectedView, NetworkView

log = logging.getLogger("wansync.scheduler")

# A re-plan takes at most this share of one core: the solver shares the machine with the agents (on
# one machine, all of them), and a dense mesh's packing LP takes 0.2-0.5 s where UPDATE_TIME may be 0.25 s.
# Solves in the niced solver process (offload) yield to the agents by priority, so they may take more.
REPLAN_CPU_SHARE = 0.1
OFFLOAD_CPU_SHARE = 0.5
# a trace moves every node's ports at once: a re-plan waits until no port moved for this long, or it plans
# on a WAN half moved (auto's flipping trace: a decision begun on the first node's move kept mst, predicted
# 0.89 s a round with one port binding and 1.82 s with all six). Nodes declare a move at once (agents/agent.py
# _declare_soon): the twelve declarations of one step of that trace reached the view within 2.6 ms (0.3 s
# while they rode the next report, every 0.25 s)
PORT_SETTLE_S = 0.1
TASK_OPTIONS = ("weights", "max_attempts", "sharing")  # a formed task's options that are not the planner's
def _retrieved(fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("an off-loop re-plan failed: %s", fut.exception())


class Unplannable(DisconnectedView):
    """A formed task has nobody left to contribute or receive: it is given up at once."""


def replan_due(since_last_s: float, update_time_s: float, last_solve_s: float,
               share: float = REPLAN_CPU_SHARE) -> bool:
    """May a new re-plan start `since_last_s` after the last one began? Not before UPDATE_TIME, nor
    before the last solve's CPU time over `share` (a slow solver re-plans less often)."""
    return since_last_s >= max(update_time_s, last_solve_s / share)


class Versions:
    """Every published plan by version, and the decisions that publish one."""

    def __init__(self, view: NetworkView, registry: Registry, obs: Observed, *, update_rate: float,
                 update_time: float) -> None:
        self.view = view
        self.registry = registry
        self.obs = obs
        self.update_rate = update_rate  # re-plan only if some link's rate moved by more than this (relative)
        self.update_time = update_time  # ... and at most this often (seconds; NetStorm's UPDATE_TIME)
        self.plans: dict[int, Plan] = {}
        self.version = 0
        self.policy_bytes = 0  # size of every published plan, as sent to one agent
        self.solver = Solver()  # off-loop solves, one at a time, in a niced process

    def opened(self, js: JobState) -> None:
        """A new job: the solver's process starts now if its planner solves off the loop."""
        if js.planner is not None and js.planner.offload:
            self.solver.warm()
        self.tell(js)

    def tell(self, js: JobState) -> None:
        """What a planner said about its decisions (memory["events"]: `auto`'s candidates and choice)
        goes on the timeline, for the dashboard, /api and the results file."""
        for e in js.memory.pop("events", []):
            kind = e.pop("kind", "planner")
            self.obs.note_event(kind, job=js.job, version=js.plan.version, **e)

    def publish(self, plan: Plan) -> Plan:
        plan.validate(self.view.links())
        self.version += 1
        plan = plan.with_version(self.version)
        self.plans[plan.version] = plan
        self.policy_bytes += len(msgpack.packb(plan.to_wire()))
        self.obs.on_event("plan", {"version": plan.version, "scheme": plan.scheme, "plan": plan})
        self.obs.note_event("plan", version=plan.version, scheme=plan.scheme)
        return plan

    def version_for(self, js: JobState, t: Task) -> int:
        """BSP: the first READY for a round freezes its version; adaptive schemes may re-plan just before.
        A formed task gets a plan of its own, on its members, around what is unusable."""
        if t.version is not None:
            return t.version
        if not t.barrier:
            return self._plan_task(js, t)
        # an agent that rejoined mid-job takes part from the round it was told to start at
        alive = tuple(sorted(n for n in self.registry.agents if js.joins.get(n, 0) <= t.round))
        avoid = self.view.unusable()
        if alive != js.spec.participants or avoid != js.avoid:  # lost, back, or a link suspected dead
            self._replan_members(js, alive, avoid)
            t.version = js.plan.version
            return t.version
        if js.replanning is not None and js.replanning.done():
            self._adopt_replan(js)  # and if the view moved again meanwhile, the next solve starts now
        if t.round > 0 and self._replan_wanted(js):
            self._begin_replan(js)
            if js.planner.offload:
                self._replan_off_loop(js)
            else:
                start = time.perf_counter()
                new = js.planner.plan(self.view, js.spec, js.memory)
                js.replan_s = time.perf_counter() - start
                js.policy_s += js.replan_s
                if not new.same_policy(js.plan):
                    js.plan = self.publish(new)
                self.tell(js)
        t.version = js.plan.version
        return t.version

    def _replan_wanted(self, js: JobState) -> bool:
        """Should the job's adaptive planner plan again now? When the view moved by more than update_rate
        (or the planner calls its plan stale), no sooner than replan_due allows — unless a node's
        declared port moved since the last plan began: a change of the WAN itself, not of an estimate,
        which waits for no CPU share (on auto's flipping trace a decision of 1.5 s held the next one for 3)."""
        if js.replanning is not None or js.planner is None or not js.planner.adaptive:
            return False
        latest = self.view.ports_moved.latest()
        if time.time() - latest < PORT_SETTLE_S:  # the other ports' moves are still on their way
            return False
        port_moved = latest > js.last_plan_t
        return ((port_moved or replan_due(time.time() - js.last_plan_t, self.update_time, js.replan_s,
                                          OFFLOAD_CPU_SHARE if js.planner.offload else REPLAN_CPU_SHARE))
                and (self.view.changed_since(js.view_at_plan, self.update_rate)
                     or (js.planner.stale is not None and js.planner.stale(js.memory))))

    def replan_early(self, js: JobState) -> None:
        """A report moved the view: a planner that solves off the loop starts now, not when the next
        round asks for its version, so the new plan is ready for that round (under binding ports a round
        takes 2 s, and a switch waited for one round to start its solve and for another to adopt it).
        BSP rounds only (version_for adopts it at a barrier), once the first has run (version_for plans
        round 0 and any change of members)."""
        if (js.mode == "rounds" and js.planner is not None and js.planner.offload and len(js.tasks) > 1
                and next(reversed(js.tasks.values())).barrier and self._replan_wanted(js)):
            self._begin_replan(js)
            self._replan_off_loop(js)

    def _begin_replan(self, js: JobState) -> None:
        """A re-plan starts: counted, and the view and time it starts from kept (what the next is judged by)."""
        js.replans += 1
        js.view_at_plan = self.view.snapshot()
        js.last_plan_t = time.time()

    def _replan_off_loop(self, js: JobState) -> None:
        """A planner whose solve takes long (tree packing's LP, auto) runs in the solver's niced process
        (scheduler/solver.py) on a copy of the view and of its memory; rounds go on with the current
        plan, and the first round asked for after the solve ends takes the new one (_adopt_replan)."""
        assert js.planner is not None
        fut = self.solver.submit(js.planner, self.view.copy(), js.spec, js.memory)
        js.replanning = asyncio.wrap_future(fut)
        js.replanning.add_done_callback(_retrieved)  # a job that ends first never adopts it: not an error
        js.replanning.add_done_callback(lambda done: self._overtaken(js, done))

    def _overtaken(self, js: JobState, done: asyncio.Future) -> None:
        """A solve that a port's move overtook planned on a WAN that is gone: dropped, and the next one
        starts now, not when the next round asks for its version (under binding ports a round takes up
        to 1.8 s, and the round after it would run the stale plan)."""
        if js.replanning is not done or js.finished.is_set() or self.view.ports_moved.latest() <= js.last_plan_t:
            return
        js.replanning = None
        self.obs.note_event("replan_dropped", job=js.job, why="a node's port moved while it was planned")
        self.replan_early(js)

    def close(self) -> None:
        self.solver.close()

    def _adopt_replan(self, js: JobState) -> None:
        fut, js.replanning = js.replanning, None
        assert fut is not None
        try:
            new, memory, seconds = fut.result()
        except Exception as exc:  # a view the LP cannot plan on (disconnected, numerics): keep the plan
            log.warning("job %d: re-plan off the loop failed, keeping version %d: %s", js.job, js.plan.version, exc)
            return
        # what the planner kept, as it left it in the solver, with the rounds measured meanwhile
        js.memory = {**memory, **({"measured": js.memory["measured"]} if "measured" in js.memory else {})}
        js.policy_s += seconds
        js.replan_s = seconds
        if new.participants == js.plan.participants and not new.same_policy(js.plan):
            js.plan = self.publish(new)
        self.tell(js)

    def _plan_task(self, js: JobState, t: Task) -> int:
        """A formed task's plan: its live members (those lost are dropped), its receivers, aggregators
        (options) that are alive; planned by the job's scheme on the view, around what is unusable."""
        assert js.planner is not None
        agents = self.registry.agents
        members = tuple(n for n in t.members if n in agents)
        receivers = None if t.receivers is None else tuple(n for n in t.receivers if n in agents)
        if not members or receivers == ():
            raise Unplannable(f"task {t.id}: no live member or receiver left")
        options = {k: v for k, v in t.options.items() if k not in TASK_OPTIONS}
        if receivers is not None:
            options["receivers"] = list(receivers)  # planners that build to the receivers (multicast) see them
        options = planners.for_living(options, agents, members)
        spec = dataclasses.replace(js.spec, participants=members, options=options)
        start = time.perf_counter()
        plan = js.planner.plan(self.view, spec, {"job": js.memory})  # a task plans afresh; it may read the job's
        js.policy_s += time.perf_counter() - start
        weights = t.options.get("weights")
        if weights is not None or receivers is not None:
            plan = dataclasses.replace(plan, receivers=receivers, weights={
                n: float((weights or {}).get(n, plan.weights[n])) for n in plan.participants})
        if t.options.get("sharing"):
            plan = with_sharing(plan, **t.options["sharing"])
        t.version = self.publish(plan).version
        return t.version

    def _replan_members(self, js: JobState, alive: tuple[int, ...], avoid: list[list[int]]) -> None:
        """Plan for the living on what is usable; all or nothing (a planner may find no plan)."""
        old = js.spec.participants
        spec = dataclasses.replace(js.spec, participants=alive, options=planners.for_living(js.spec.options, alive))
        memory: dict[str, Any] = {}  # frozen roots may be gone: choose again among the living
        assert js.planner is not None
        start = time.perf_counter()
        plan = js.planner.plan(self.view, spec, memory)
        js.policy_s += time.perf_counter() - start
        js.spec, js.avoid, js.memory = spec, avoid, memory
        js.plan = self.publish(plan)
        self.tell(js)
        js.replanning = None  # an off-loop solve under way planned for the old members and links: dropped
        self._begin_replan(js)
        self.obs.note_event("membership", job=js.job, was=list(old), now=list(alive), version=js.plan.version,
                            avoid=js.avoid)

    # --- between versions ----------------------------------------------------------------------------
    def push_aux(self, js: JobState, plan: Plan, nodes: Iterable[int] | None = None) -> None:
        """Auxiliary tables for an already published version, pushed at once, no version change:
        safe because auxiliary chunks carry their whole source route (NetStorm §VII-B). `nodes`
        (tests) delivers to some agents only, as a slow network would."""
        if plan.version not in self.plans:
            raise RuntimeError(f"no running job with plan v{plan.version}")
        plan.validate(self.view.links())
        msg = AuxUpdate(job=js.job, version=plan.version, groups=[aux_to_wire(g.aux) for g in plan.groups]).wire()
        if nodes is None:
            self.plans[plan.version] = plan  # agents that get this version later get the new tables with it
            if js.plan.version == plan.version:
                js.plan = plan
        self.policy_bytes += len(msgpack.packb(msg))
        agents = self.registry.agents
        for n in sorted(agents) if nodes is None else nodes:
            agents[n].conn.send(msg)
        self.obs.on_event("aux_update", {"version": plan.version, "nodes": None if nodes is None else list(nodes)})

    def refresh_aux(self, js: JobState) -> None:
        """Between versions, recompute auxiliary routes (Algorithm 3) every UPDATE_TIME if the view moved."""
        refresh = js.planner.refresh_aux if js.planner is not None else None
        if (refresh is None or js.mode != "rounds" or time.time() - js.last_aux_t < self.update_time
                or not self.view.changed_since(js.view_at_aux or js.view_at_plan, self.update_rate)):
            return
        js.last_aux_t = time.time()
        js.view_at_aux = self.view.snapshot()
        t = time.perf_counter()
        new = refresh(self.view, js.spec, js.plan)
        js.policy_s += time.perf_counter() - t
        if [g.aux for g in new.groups] != [g.aux for g in js.plan.groups]:
            js.aux_updates += 1
            self.push_aux(js, new)
