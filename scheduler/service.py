"""The scheduler: runs jobs on the registered agents as tasks, freezes a plan version per task, learns
the network.

It composes the parts that each do one thing: the control port (server.py: accept, authenticate,
dispatch typed messages), who is in the cluster (registry.py), the life of each task (tasks.py),
liveness (liveness.py: heartbeats, barrier, stall and overrun deadlines, suspected links), and the
planners (planners/: a PlannerSpec per scheme). What is left here is the job's course.

A task: members that contribute (weighted), receivers of the result, nodes that only aggregate,
replicate or relay, a plan and its version. A BSP job is a task per round, "everyone contributes,
everyone receives"; a tasks job runs the partial reduces this scheduler forms (`run_task`), many at
once, each exact or aborted on its own; a lost agent aborts (and retries or re-plans) only the
tasks it had a part in.

Version rule (one mechanism for every scheme): under BSP each agent says READY when it computed
round r; the first READY for r freezes the version for everyone, so a round never mixes versions.
Re-planning (adaptive schemes, when the view moved by more than `update_rate`) only ever affects
rounds not yet frozen. The TASK goes out once every member has said READY (BSP: nobody can compute
round r before it holds round r-1's result anyway), to every node with a part in it. Synchronization
then starts together, so a round's time is the synchronization itself and not the previous round's
broadcast tail seen by an early finisher.

Public API for launchers (wansync/): start/shutdown, wait_agents, run_job (BSP), open_tasks /
run_task / close_job (formed tasks), send (to one agent), job_t0, subscribe/note_event (events and
the timeline), stage/push_aux (operator overrides).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgpack

from core.capshare import CapSharing
from core.plan import Job, Plan, PlanError, aux_to_wire, check_sharing, with_sharing
from overlay.auth import TlsFiles
from overlay.messages import (
    Abort,
    AuxUpdate,
    Counters,
    Drop,
    Fence,
    Go,
    Heartbeat,
    JobEnd,
    ProtocolError,
    Rates,
    Ready,
    Record,
    Register,
    Report,
    Shutdown,
    Stats,
    TaskDone,
)
from overlay.messages import Job as JobMsg
from overlay.messages import Task as TaskMsg
from overlay.routing import NoRoute, Routes, adjacency

from . import planners
from . import progress as progress_models
from .liveness import Liveness
from .registry import AgentInfo, Registry
from .server import ControlServer
from .tasks import JobState, RoundRecord, Task, TaskRecord
from .view import DisconnectedView, NetworkView

__all__ = ["AgentInfo", "JobState", "RoundRecord", "Scheduler", "TaskRecord"]

log = logging.getLogger("wansync.scheduler")

Event = Callable[[str, dict[str, Any]], None]
BSP_AHEAD = 1  # tasks an agent may receive frames for beyond its own: BSP starts r+1 once r ended everywhere
BLOCKED_TASK_S = 10.0  # a formed task no plan connects this long is given up (recorded as aborted)


class Unplannable(DisconnectedView):
    """A formed task has nobody left to contribute or receive: it is given up at once."""


# A re-plan takes at most this share of one core: the solver shares the machine with the agents (on
# one machine, all of them), and a dense mesh's packing LP takes 0.2-0.5 s where UPDATE_TIME may be 0.25 s
REPLAN_CPU_SHARE = 0.1


def replan_due(since_last_s: float, update_time_s: float, last_solve_s: float) -> bool:
    """May a new re-plan start `since_last_s` after the last one began? Not before UPDATE_TIME, nor
    before the last solve's time over REPLAN_CPU_SHARE (a slow solver re-plans less often)."""
    return since_last_s >= max(update_time_s, last_solve_s / REPLAN_CPU_SHARE)


class Scheduler:
    def __init__(self, cluster: str, nodes: int, *, update_rate: float = 0.1, update_time: float = 0.0,
                 on_event: Event | None = None, predict: Callable[[Plan, float], float | None] | None = None,
                 consistency: bool = True, heartbeat_timeout: float = 1.5, secret: bytes | None = None,
                 tls: TlsFiles | None = None) -> None:
        """predict(plan, seconds since the job's t0) -> predicted round time: the simulator on the
        configured network, where the caller knows it (scheduler/ never sees the emulator itself).
        secret: the cluster secret agents must prove they hold (overlay.auth); None = no
        authentication (--insecure, trusted networks and in-process tests only). tls: serve TLS."""
        self.cluster = cluster
        self.expected = nodes
        self.update_rate = update_rate  # re-plan only if some link's rate moved by more than this (relative)
        self.update_time = update_time  # ... and at most this often (seconds; NetStorm's UPDATE_TIME)
        self.on_event = on_event or (lambda kind, data: None)
        self.predict = predict
        # False reproduces what NetStorm's topology request protocol prevents (Fig. 8): every agent
        # gets the newest version when it asks, no freeze per round, no barrier. Tests only.
        self.consistency = consistency
        self.registry = Registry(nodes)
        self.liveness = Liveness(self, heartbeat_timeout)
        self.server = ControlServer(cluster, secret, may_connect=self.registry.may_connect,
                                    handlers=self._handlers(), on_closed=self._connection_closed,
                                    ssl=tls.server_context() if tls else None)
        self._closing = False
        self.view = NetworkView()
        self.plans: dict[int, Plan] = {}
        self.version = 0
        self.job_id = 0
        self.current: JobState | None = None
        self.errors: list[str] = []
        self.policy_bytes = 0  # size of every published plan, as sent to one agent
        # what happened when, for dashboards and results: plan versions, jobs, faults (note_event)
        self.timeline: list[dict[str, Any]] = []
        self.link_bytes: dict[tuple[int, int], int] = {}  # cumulative bytes per directed link (COUNTERS)
        self.cap_sharing = CapSharing()  # per-flow rates where classed flows of many senders meet
        self._watch: asyncio.Task | None = None

    # the parts' state, as the launcher, dashboard and tests read it
    @property
    def agents(self) -> dict[int, AgentInfo]:
        return self.registry.agents

    @property
    def lost(self) -> dict[int, dict[str, Any]]:
        return self.registry.lost

    @property
    def fenced(self) -> dict[int, int]:
        return self.registry.fenced

    @property
    def heartbeat_timeout(self) -> float:
        return self.liveness.heartbeat_timeout

    @heartbeat_timeout.setter
    def heartbeat_timeout(self, seconds: float) -> None:
        self.liveness.heartbeat_timeout = seconds

    @property
    def job_t0(self) -> float | None:
        """When the running (or last) job started: traces and faults count from it."""
        return None if self.current is None else self.current.t0

    # --- lifecycle ---------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        port = await self.server.start(host, port)
        self._watch = asyncio.get_running_loop().create_task(self.liveness.watch())
        return port

    @property
    def port(self) -> int:
        assert self.server.server is not None
        return self.server.server.sockets[0].getsockname()[1]

    async def wait_agents(self, timeout: float = 60.0) -> None:
        try:
            await asyncio.wait_for(self.registry.complete.wait(), timeout)
        except TimeoutError:
            missing = sorted(set(range(self.expected)) - set(self.agents))
            raise TimeoutError(f"agents {missing} did not register within {timeout:.0f} s") from None
        self.registry.broadcast(self.registry.peers())

    async def shutdown(self) -> None:
        self._closing = True
        self.registry.broadcast(Shutdown())
        await asyncio.sleep(0.05)  # the SHUTDOWN lines leave before the sockets close
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        await self.server.close()

    def send(self, node: int, msg: Record | dict[str, Any]) -> None:
        """One message to one registered agent (fault injection, operator commands); RuntimeError if
        it is not registered, ConnectionError if its connection just closed."""
        self.registry.send_to(node, msg)

    def note_event(self, kind: str, **data: Any) -> dict[str, Any]:
        """Put something on the timeline (plan, job, a fault injector's link_down, ...) and tell observers."""
        entry = {"t": time.time(), "kind": kind, **data}
        self.timeline.append(entry)
        self.on_event("timeline", entry)
        return entry

    def subscribe(self, fn: Event) -> None:
        """One more observer of every event (dashboard, metrics), called after the owner's on_event."""
        prev = self.on_event

        def both(kind: str, data: dict[str, Any]) -> None:
            prev(kind, data)
            fn(kind, data)
        self.on_event = both

    # --- jobs -------------------------------------------------------------------------------------
    def _open(self, scheme: str, *, rounds: int, params: int, chunk_params: int, compute_s: float,
              options: dict[str, Any] | None, warmup: int, t0: float | None, mode: str, ahead: int,
              progress: Any = None, compute: str | None = None, seed: int = 1,
              compute_scale: float = 1.0, workload: str | None = None) -> JobState:
        """A new job on every agent: its first plan published, JOB sent."""
        self.cap_sharing.clear()  # an earlier job's tasks share nothing with this one's
        spec = planners.resolve(scheme)
        self.job_id += 1
        job = Job(params, chunk_params, tuple(sorted(self.agents)), {**(options or {}), **spec.options})
        memory: dict[str, Any] = {}  # what the planner keeps between its plans for this job
        t = time.perf_counter()
        plan = self._publish(spec.plan(self.view, spec.opening(job), memory))
        js = JobState(self.job_id, scheme, rounds + warmup, job, plan, warmup, planner=spec, memory=memory,
                      view_at_plan=self.view.snapshot(), policy_s=time.perf_counter() - t,
                      t0=time.time() if t0 is None else t0, last_plan_t=time.time(), avoid=self.view.unusable(),
                      mode=mode, progress=progress)
        self.current = js
        js.job_msg = JobMsg(job=js.job, scheme=scheme, rounds=js.rounds, params=params, compute_s=compute_s,
                            t0=js.t0, warmup=warmup, ahead=ahead, mode=mode,
                            rule=None if progress is None else progress.rule, compute=compute,
                            compute_scale=compute_scale if compute else None, seed=seed if compute else None,
                            workload=workload).wire()
        for a in list(self.agents.values()):
            self.registry.send(a, js.job_msg)
        self.on_event("job", {"job": js.job, "scheme": scheme, "rounds": js.rounds, "version": js.plan.version,
                              "t0": js.t0, "mode": mode})
        self.note_event("job", job=js.job, scheme=scheme, rounds=js.rounds, version=js.plan.version, mode=mode)
        return js

    async def run_job(self, scheme: str, *, rounds: int, params: int, chunk_params: int, compute_s: float = 0.0,
                      options: dict[str, Any] | None = None, warmup: int = 0, t0: float | None = None,
                      progress: str | Any = "bsp", staleness: int = 2, group: int = 2, compute: str | None = None,
                      seed: int = 1, compute_scale: float = 1.0, workload: str | None = None,
                      progress_options: Mapping[str, Any] | None = None) -> JobState:
        """Every agent iterates `warmup + rounds` times; `progress` decides how they synchronize (bsp: a
        task per round, everyone contributes and receives; ssp: a multicast per worker per iteration,
        at most `staleness` iterations ahead of the slowest; queue: partial reduces of the first
        `group` ready; mcast-bsp, mcast-ssp: multicasts to chosen receivers, `progress_options` say how:
        select, p, k, eta). `progress` may also be a progress model built by the caller
        (scheduler.progress, e.g. selective.SelectiveReduce with its options). `compute`: a compute model
        spec (core.compute), else `compute_s` seconds each. `workload`: what members contribute (None: the
        synthetic integers; a spec of agents.training: real training). Returns the job with its records."""
        model = (progress_models.resolve(progress, staleness=staleness, group=group, **(progress_options or {}))
                 if isinstance(progress, str) else progress)
        if planners.resolve(scheme).one_source and not getattr(model, "multicasts", False):
            raise ValueError(f"{scheme} plans one worker's multicast: it fits progress ssp (a multicast per "
                             f"worker and iteration), not {model.name} (reduces of several workers)")
        if model.name.startswith("mcast-") and not planners.resolve(scheme).one_source:
            raise ValueError(f"progress {model.name} forms multicasts: scheme mcast or mcast-l3, not {scheme}")
        ahead = BSP_AHEAD if model.name == "bsp" else max(8, 4 * self.expected)
        js = self._open(scheme, rounds=rounds, params=params, chunk_params=chunk_params, compute_s=compute_s,
                        options=options, warmup=warmup, t0=t0, mode="rounds", ahead=ahead, progress=model,
                        compute=compute, seed=seed, compute_scale=compute_scale, workload=workload)
        model.start(self, js)
        await js.finished.wait()
        return js

    # --- what progress models may ask (scheduler.progress.Control) --------------------------------
    def alive(self) -> list[int]:
        return sorted(self.agents)

    def node_bandwidth(self) -> dict[int, float]:
        """Each registered agent's b = min(uplink, downlink) of its configured caps, Mbit/s (those
        with both caps): what a bandwidth-aware model (selective reduce) groups workers by."""
        return {n: min(a.uplink_mbps, a.downlink_mbps) for n, a in sorted(self.agents.items())
                if a.uplink_mbps is not None and a.downlink_mbps is not None}

    def form(self, js: JobState, members: Iterable[int], receivers: Iterable[int] | None, rnd: int | None,
             iters: dict[int, int] | None = None, options: dict[str, Any] | None = None) -> Task:
        """A task the scheduler forms (not behind a barrier): started at once, retried on its own.
        `rnd`: the iteration members contribute from (None: the task's own id, a synthetic seed)."""
        tid = max(js.tasks, default=-1) + 1
        t = js.tasks[tid] = Task(tid, tid if rnd is None else rnd, barrier=False, members=tuple(sorted(set(members))),
                                 receivers=None if receivers is None else tuple(sorted(set(receivers))),
                                 options={**js.spec.options, **(options or {})}, iters=dict(iters or {}))
        t.finished = asyncio.get_running_loop().create_future()
        self.try_start(js, tid)
        return t

    def go(self, js: JobState, upto: int, node: int) -> None:
        """Worker `node` may compute iterations up to `upto` (a bounded progress model)."""
        self.note_event("go", job=js.job, node=node, upto=upto)
        if node in self.agents:
            self.registry.send(self.agents[node], Go(job=js.job, upto=upto))

    def barrier_ready(self, js: JobState, rnd: int, node: int, have: set[int]) -> None:
        """BSP: `node` is READY for round `rnd`; the round's task starts once every member is."""
        js.bsp_task(rnd).ask(node, have, time.time())
        self.try_start(js, rnd, node)

    def drop_receiver(self, js: JobState, tid: int, node: int) -> None:
        """`node` leaves a running task's receivers (a multicast shrinks, SelMcast SSP): it applies
        nothing of it, whoever sends to it stops, the others go on; the task is over once the
        remaining receivers hold the result."""
        t = js.tasks[tid]
        if t.version is None or t.recorded_t is not None:
            raise RuntimeError(f"task {tid} is not running")
        plan = self.plans[t.version]
        if node not in plan.receiver_set or node in t.dropped:
            raise ValueError(f"receivers: node {node} is not a receiver of task {tid}")
        t.dropped.add(node)
        replicates = any(g.children.get(node) for g in plan.groups)  # it passes the value on: keep feeding it
        self.note_event("receiver_dropped", job=js.job, task=tid, node=node, replicates=replicates)
        for n in sorted(t.involved):
            if n in self.agents:
                self.registry.send(self.agents[n], Drop(job=js.job, task=tid, attempt=t.attempt, node=node,
                                                        replicates=replicates or None))
        self._record(js, t)

    def open_tasks(self, scheme: str, *, params: int, chunk_params: int, options: dict[str, Any] | None = None,
                   in_flight: int = 16, t0: float | None = None) -> JobState:
        """A job whose tasks this scheduler forms (`run_task`), up to `in_flight` at once; end it with
        `close_job`. `scheme` plans each task, on its members (and the aggregators its options name)."""
        return self._open(scheme, rounds=0, params=params, chunk_params=chunk_params, compute_s=0.0,
                          options=options, warmup=0, t0=t0, mode="tasks", ahead=in_flight)

    async def run_task(self, js: JobState, members: Iterable[int], receivers: Iterable[int] | None = None, *,
                       options: dict[str, Any] | None = None, weights: dict[int, float] | None = None,
                       max_attempts: int = 4, sharing: Mapping[str, Any] | None = None) -> TaskRecord:
        """One partial reduce of `js`: the exact (weighted) sum of `members` to `receivers` (default the
        members), planned by the job's scheme with `options` (e.g. aggregators outside the members).
        Runs beside every other task in flight; a failure retries or re-plans only this task. Returns
        its record (`aborted` if no attempt could end exact within `max_attempts`). `sharing`: how its
        trees share links with other tasks ({weight, priority, deadline_s}: overlay.classes)."""
        if js.mode != "tasks":
            raise RuntimeError(f"job {js.job} runs rounds of its own (BSP); tasks are formed in a tasks job")
        members, receivers = tuple(sorted(set(members))), None if receivers is None else tuple(sorted(set(receivers)))
        self._check_task(members, receivers, options or {}, weights)
        if sharing:
            unknown = set(sharing) - {"weight", "priority", "deadline_s"}
            if unknown:
                raise ValueError(f"sharing: unknown {sorted(unknown)} (weight, priority, deadline_s)")
            check_sharing(sharing.get("weight", 1.0), sharing.get("priority", 0), sharing.get("deadline_s"))
        t = self.form(js, members, receivers, None,
                      options={**(options or {}), **({"weights": weights} if weights else {}),
                               **({"sharing": dict(sharing)} if sharing else {}), "max_attempts": max_attempts})
        return await t.finished

    def _check_task(self, members: tuple[int, ...], receivers: tuple[int, ...] | None, options: dict[str, Any],
                    weights: dict[int, float] | None) -> None:
        """A task's request is refused at once, naming the field, when it cannot mean anything."""
        def nodes(field: str, ns: Iterable[Any]) -> None:
            bad = [n for n in ns if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < self.expected]
            if bad:
                raise ValueError(f"{field}: {bad[:8]} are not nodes of this cluster (0..{self.expected - 1})")
        if not members:
            raise ValueError("members: a task needs at least one member")
        nodes("members", members)
        if receivers is not None:
            if not receivers:
                raise ValueError("receivers: a task needs at least one receiver")
            nodes("receivers", receivers)
        nodes("aggregators", options.get("aggregators", ()))
        if options.get("hub") is not None:
            nodes("hub", [options["hub"]])
        for n, w in (weights or {}).items():
            if n not in members:
                raise ValueError(f"weights: node {n} is not a member")
            if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
                raise ValueError(f"weights: node {n} has weight {w!r}; a weight is a finite number > 0")

    async def close_job(self, js: JobState, timeout: float = 60.0) -> JobState:
        """End a tasks job: every agent sends its STATS."""
        js.rounds = len(js.records)
        for a in list(self.agents.values()):
            self.registry.send(a, JobEnd(job=js.job))
        self._maybe_finish(js)
        await asyncio.wait_for(js.finished.wait(), timeout)
        return js

    def stage(self, plan: Plan) -> int:
        """A new policy for the running job (operator override, tests); rounds not yet frozen use it."""
        if self.current is None:
            raise RuntimeError("no job is running")
        self.current.plan = self._publish(plan)
        return self.current.plan.version

    def push_aux(self, plan: Plan, nodes: Iterable[int] | None = None) -> None:
        """Auxiliary tables for an already published version, pushed at once, no version change:
        safe because auxiliary chunks carry their whole source route (NetStorm §VII-B). `nodes`
        (tests) delivers to some agents only, as a slow network would."""
        js = self.current
        if js is None or plan.version not in self.plans:
            raise RuntimeError(f"no running job with plan v{plan.version}")
        plan.validate(self.view.links())
        msg = AuxUpdate(job=js.job, version=plan.version, groups=[aux_to_wire(g.aux) for g in plan.groups]).wire()
        if nodes is None:
            self.plans[plan.version] = plan  # agents that get this version later get the new tables with it
            if js.plan.version == plan.version:
                js.plan = plan
        self.policy_bytes += len(msgpack.packb(msg))
        for n in sorted(self.agents) if nodes is None else nodes:
            self.agents[n].conn.send(msg)
        self.on_event("aux_update", {"version": plan.version, "nodes": None if nodes is None else list(nodes)})

    def _maybe_refresh_aux(self, js: JobState) -> None:
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
            self.push_aux(new)

    def _publish(self, plan: Plan) -> Plan:
        plan.validate(self.view.links())
        self.version += 1
        plan = plan.with_version(self.version)
        self.plans[plan.version] = plan
        self.policy_bytes += len(msgpack.packb(plan.to_wire()))
        self.on_event("plan", {"version": plan.version, "scheme": plan.scheme, "plan": plan})
        self.note_event("plan", version=plan.version, scheme=plan.scheme)
        return plan

    def _version_for(self, js: JobState, t: Task) -> int:
        """BSP: the first READY for a round freezes its version; adaptive schemes may re-plan just before.
        A formed task gets a plan of its own, on its members, around what is unusable."""
        if t.version is not None:
            return t.version
        if not t.barrier:
            return self._plan_task(js, t)
        # an agent that rejoined mid-job takes part from the round it was told to start at
        alive = tuple(sorted(n for n in self.agents if js.joins.get(n, 0) <= t.round))
        avoid = self.view.unusable()
        if alive != js.spec.participants or avoid != js.avoid:  # lost, back, or a link suspected dead
            self._replan_members(js, alive, avoid)
            t.version = js.plan.version
            return t.version
        if js.replanning is not None and js.replanning.done():
            self._adopt_replan(js)  # and if the view moved again meanwhile, the next solve starts now
        if (js.replanning is None and js.planner is not None and js.planner.adaptive and t.round > 0
                and replan_due(time.time() - js.last_plan_t, self.update_time, js.replan_s)
                and self.view.changed_since(js.view_at_plan, self.update_rate)):
            js.replans += 1
            js.view_at_plan = self.view.snapshot()
            js.last_plan_t = time.time()
            if js.planner.offload:
                self._replan_off_loop(js)
            else:
                start = time.perf_counter()
                new = js.planner.plan(self.view, js.spec, js.memory)
                js.replan_s = time.perf_counter() - start
                js.policy_s += js.replan_s
                if not new.same_policy(js.plan):
                    js.plan = self._publish(new)
        t.version = js.plan.version
        return t.version

    def _replan_off_loop(self, js: JobState) -> None:
        """A planner whose solve takes long (tree packing's LP) runs on a copy of the view in a worker
        thread; rounds go on with the current plan, and the first round asked for after the solve
        ends takes the new one (_adopt_replan)."""
        assert js.planner is not None
        planner, view, spec, memory = js.planner, self.view.copy(), js.spec, js.memory

        def solve() -> tuple[Plan, float]:
            start = time.perf_counter()
            return planner.plan(view, spec, memory), time.perf_counter() - start
        js.replanning = asyncio.get_running_loop().run_in_executor(None, solve)

    def _adopt_replan(self, js: JobState) -> None:
        fut, js.replanning = js.replanning, None
        assert fut is not None
        try:
            new, seconds = fut.result()
        except Exception as exc:  # a view the LP cannot plan on (disconnected, numerics): keep the plan
            log.warning("job %d: re-plan off the loop failed, keeping version %d: %s", js.job, js.plan.version, exc)
            return
        js.policy_s += seconds
        js.replan_s = seconds
        if new.participants == js.plan.participants and not new.same_policy(js.plan):
            js.plan = self._publish(new)

    def _plan_task(self, js: JobState, t: Task) -> int:
        """A formed task's plan: its live members (those lost are dropped), its receivers, aggregators
        (options) that are alive; planned by the job's scheme on the view, around what is unusable."""
        assert js.planner is not None
        members = tuple(n for n in t.members if n in self.agents)
        receivers = None if t.receivers is None else tuple(n for n in t.receivers if n in self.agents)
        if not members or receivers == ():
            raise Unplannable(f"task {t.id}: no live member or receiver left")
        options = {k: v for k, v in t.options.items() if k not in ("weights", "max_attempts", "sharing")}
        if receivers is not None:
            options["receivers"] = list(receivers)  # planners that build to the receivers (multicast) see them
        if "aggregators" in options:
            options["aggregators"] = [n for n in options["aggregators"] if n in self.agents and n not in members]
        if options.get("hub") is not None and options["hub"] not in self.agents:
            del options["hub"]
        spec = dataclasses.replace(js.spec, participants=members, options=options)
        start = time.perf_counter()
        plan = js.planner.plan(self.view, spec, {})
        js.policy_s += time.perf_counter() - start
        weights = t.options.get("weights")
        if weights is not None or receivers is not None:
            plan = dataclasses.replace(plan, receivers=receivers, weights={
                n: float((weights or {}).get(n, plan.weights[n])) for n in plan.participants})
        if t.options.get("sharing"):
            plan = with_sharing(plan, **t.options["sharing"])
        t.version = self._publish(plan).version
        return t.version

    def _involved(self, plan: Plan, avoid: list[list[int]]) -> frozenset[int]:
        """Every node with a part in a plan: its tree nodes, and the relays on the routes its tree
        edges take (min-hop over the known links, around the unusable ones; auxiliary routes too)."""
        bad = {(a, b) for a, b in avoid}
        links = [(a, b) for a, b in self.view.links() if (min(a, b), max(a, b)) not in bad]
        routes = Routes(adjacency(links))
        out = set(plan.nodes)
        for g in plan.groups:
            edges = [(c, p) for c, p in g.parent.items() if p is not None]
            edges += [(p, k) for p, kids in g.children.items() for k in kids]
            for a, b in edges:
                try:
                    out.update(routes.route(a, b))
                except NoRoute:
                    pass
            for rs in g.aux.values():
                for r in rs:
                    out.update(r)
        return frozenset(out)

    def try_start(self, js: JobState, tid: int, asking: int | None = None) -> None:
        """Freeze the task's version (re-planning first if members or usable links changed) and start
        it: under BSP once every member said READY, a formed task at once. Blocked while no plan
        connects the members (a lost node or suspected links cut them apart): the watchdog tries
        again as the cluster changes."""
        t = js.tasks[tid]
        try:
            v = self._version_for(js, t)
        except (DisconnectedView, PlanError, ValueError) as exc:
            if t.blocked != str(exc):
                log.warning("job %d task %d waits: no plan for its members (%s)", js.job, tid, exc)
                self.note_event("blocked", job=js.job, task=tid, round=t.round, why=str(exc))
            t.blocked = str(exc)
            now = time.time()
            t.blocked_t = t.blocked_t or now
            if not t.barrier and (isinstance(exc, Unplannable) or now - t.blocked_t > BLOCKED_TASK_S):
                self._give_up(js, t, str(exc))  # nothing left to wait for, or waited long enough
            return
        t.blocked, t.blocked_t = None, None
        plan = self.plans[v]
        members = set(plan.participants)
        asked = t.asked if t.asked is not None else {}
        if t.barrier:
            for node in [n for n in asked if n not in members]:
                del asked[node]  # joined after this round was frozen (it sits this one out), or lost since
                if node in self.agents:
                    self.registry.send(self.agents[node], TaskMsg(
                        job=js.job, task=tid, attempt=t.attempt, version=v, round=t.round, members=[],
                        receivers=[], skip=True))
            if asking is not None:
                self.on_event("topo_request", {"node": asking, "round": t.round, "version": v})
            if not members <= set(asked):
                return
        t.involved = self._involved(plan, js.avoid)
        if any(g.classed for g in plan.groups) and self.cap_sharing.caps:
            self._send_rates(js, self.cap_sharing.start(tid, t.attempt, plan, time.time(), self._routes().route))
        settled = js.settled()
        for node in sorted(t.involved):
            a = self.agents.get(node)
            if a is None:
                continue
            have = asked.get(node, a.versions)
            msg = TaskMsg(job=js.job, task=tid, attempt=t.attempt, version=v, round=t.round,
                          members=list(plan.participants), receivers=list(plan.receiver_set), avoid=js.avoid,
                          plan=None if v in have else plan.to_wire(), settled=settled, iters=t.iters or None)
            if self.registry.send(a, msg):
                a.versions.add(v)
        t.start(time.time())

    def _routes(self) -> Routes:
        """The agents' min-hop routes (overlay.routing over the links they registered)."""
        return Routes({n: a.neighbors for n, a in self.agents.items()})

    def _send_rates(self, js: JobState, updates: Mapping[int, Mapping[tuple[int, int], list]]) -> None:
        for node, per_task in updates.items():
            a = self.agents.get(node)
            if a is not None:
                for (task, attempt), rows in per_task.items():
                    self.registry.send(a, Rates(job=js.job, task=task, attempt=attempt, rates=rows))

    def _replan_members(self, js: JobState, alive: tuple[int, ...], avoid: list[list[int]]) -> None:
        """Plan for the living on what is usable; all or nothing (a planner may find no plan)."""
        old = js.spec.participants
        options = dict(js.spec.options)
        if options.get("hub") is not None and options["hub"] not in alive:
            del options["hub"]  # the chosen hub is lost: the planner picks the best one alive
        spec = dataclasses.replace(js.spec, participants=alive, options=options)
        memory: dict[str, Any] = {}  # frozen roots may be gone: choose again among the living
        assert js.planner is not None
        start = time.perf_counter()
        plan = js.planner.plan(self.view, spec, memory)
        js.policy_s += time.perf_counter() - start
        js.spec, js.avoid, js.memory = spec, avoid, memory
        js.plan = self._publish(plan)
        js.replanning = None  # an off-loop solve under way planned for the old members and links: dropped
        js.replans += 1
        js.view_at_plan = self.view.snapshot()
        js.last_plan_t = time.time()
        self.note_event("membership", job=js.job, was=list(old), now=list(alive), version=js.plan.version,
                        avoid=js.avoid)

    def _record(self, js: JobState, t: Task) -> None:
        """Every receiver of the task reported: its record (with the simulator's prediction)."""
        plan = self.plans[t.version] if t.version is not None else js.plan
        if not set(t.receivers_of(plan)) <= set(t.done):
            return
        t.started_t = None
        rec = t.record(js, plan, self.view.coverage())
        if self.predict is not None and rec.version in self.plans:
            try:
                rec.prediction_s = self.predict(self.plans[rec.version], rec.t_start - js.t0)
            except NotImplementedError as exc:  # a plan the simulator cannot replay yet: no prediction
                log.info("task %d: no prediction (%s)", t.task, exc)
        self._recorded(js, t, rec)

    def _recorded(self, js: JobState, t: Task, rec: TaskRecord) -> None:
        self._send_rates(js, self.cap_sharing.end(t.id, t.attempt))
        js.records.append(rec)
        t.recorded_t = time.time()
        self.on_event("task", rec.to_json())
        if t.finished is not None and not t.finished.done():
            t.finished.set_result(rec)
        if js.progress is not None:
            js.progress.task_done(self, js, rec)
        self._maybe_finish(js)

    def _give_up(self, js: JobState, t: Task, why: str) -> None:
        """A formed task no attempt could end exact: recorded as aborted (nothing of it was applied)."""
        now = time.time()
        rec = TaskRecord(job=js.job, scheme=js.scheme, task=t.id, round=t.round, version=-1, round_s=0.0,
                         compute_s=0.0, ok=False, digests_agree=False, versions_agree=False, t_start=now, t_end=now,
                         warmup=False, errors=[why], attempt=t.attempt, members=list(t.members),
                         receivers=list(t.receivers or t.members), bytes=js.spec.params * 4, aborted=True)
        log.warning("job %d task %d abandoned after %d attempts: %s", js.job, t.id, t.attempt, why)
        self.note_event("task_abandoned", job=js.job, task=t.id, why=why)
        self._recorded(js, t, rec)

    def _maybe_finish(self, js: JobState) -> None:
        """Done when every task is recorded and every agent still here sent its job stats."""
        bsp = js.progress is not None and js.progress.name == "bsp"
        if all(n in js.stats for n in self.agents) and (len(js.records) >= js.rounds if bsp else
                                                        all(t.recorded_t is not None for t in js.tasks.values())):
            js.finished.set()

    # --- failures ---------------------------------------------------------------------------------
    def lose(self, node: int, why: str) -> None:
        """Declare an agent gone: fence its incarnation, abort the tasks it had a part in, re-plan."""
        if self._closing:  # shutting down: connections close, nobody is lost for it
            self.registry.agents.pop(node, None)
            return
        a = self.registry.remove(node, why)
        if a is None:
            return
        for link in self.view.node_down(node):  # suspected links the living need
            self.liveness.trust(link)
            self.note_event("link_trusted", link=list(link), why=f"needed without node {node}")
        log.warning("agent %d lost (%s); fencing epoch %d", node, why, a.epoch)
        self.note_event("agent_lost", node=node, why=why)
        fence = Fence(node=node, epoch=a.epoch)
        self.registry.send(a, fence)  # a frozen agent reads it when it wakes
        a.conn.close()
        self.registry.broadcast(fence)
        js = self.current
        if js is None or js.finished.is_set():
            return
        for t in sorted(js.tasks.values(), key=lambda t: t.id):
            if t.version is None or t.recorded_t is not None:
                continue
            if node in t.involved or node in self.plans[t.version].nodes:
                self.abort(js, t.id, f"agent {node} lost: {why}")
        if js.progress is not None:
            js.progress.lost(self, js, node)

    def abort(self, js: JobState, tid: int, why: str) -> None:
        """The task's current attempt cannot end exact: everyone drops it; a BSP round is asked for
        again (READY), a formed task is re-planned (without what was lost) and started again."""
        t = js.tasks[tid]
        t_start, prev, had = t.started_t, t.version, frozenset(t.done)
        att = t.abort()
        self._send_rates(js, self.cap_sharing.end(tid, att))
        js.aborts.append({"round": t.round, "task": tid, "attempt": att, "why": why, "t": time.time(),
                          "t_start": t_start})
        log.warning("job %d task %d attempt %d aborted: %s", js.job, tid, att, why)
        self.note_event("abort", job=js.job, task=tid, round=t.round, attempt=att, why=why)
        self.registry.broadcast(Abort(job=js.job, task=tid, attempt=att))
        if not t.barrier:
            # a progress model may refuse the retry (abandon) or prepare it (CREW's failover, §2.9)
            refuse = getattr(js.progress, "retry", None)
            why_not = refuse(self, js, t, prev, why, had) if refuse is not None else None
            if why_not is not None or t.aborted >= t.options.get("max_attempts", 4):
                self._give_up(js, t, why_not or why)
            else:
                self.try_start(js, tid)

    def _rejoin(self, a: AgentInfo) -> None:
        """A restarted agent: peers learn its address and epoch; it joins the running job from the next
        round that is not frozen yet (whose plan then includes it)."""
        self.registry.broadcast(self.registry.peers())
        js = self.current
        if js is None or js.finished.is_set():
            return
        start = js.joins[a.node] = max(js.frozen, default=-1) + 1
        self.note_event("agent_rejoined", node=a.node, epoch=a.epoch, round=start)
        self.registry.send(a, {**js.job_msg, "start": start})

    # --- what agents say ---------------------------------------------------------------------------
    def _handlers(self) -> dict[type[Record], Callable[[AgentInfo, Any], None]]:
        """The dispatch table: message type -> handler. Only REGISTER may come before registering;
        every other message speaks for the node that registered on that connection, and for no other."""
        def registered(handler: Callable[[AgentInfo, Any], None]) -> Callable[[AgentInfo, Any], None]:
            def checked(a: AgentInfo, msg: Any) -> None:
                if not self.registry.registered(a):  # an authenticated connection that did not register
                    raise ProtocolError(f"{msg.T} from node {a.node}, which has not registered on this "
                                        "connection", msg_type=msg.T)
                if getattr(msg, "node", a.node) != a.node:
                    raise ProtocolError(f"node {a.node} speaks for node {msg.node}", field="node", msg_type=msg.T)
                handler(a, msg)
            return checked
        return {Register: self._on_register, Ready: registered(self._on_ready),
                Report: registered(self._on_report), TaskDone: registered(self._on_task_done),
                Stats: registered(self._on_stats), Counters: registered(self._on_counters),
                Heartbeat: registered(self._on_heartbeat)}

    def _connection_closed(self, a: AgentInfo) -> None:
        if self.registry.registered(a):
            self.on_event("agent_lost", {"node": a.node})
            self.lose(a.node, "control connection closed")

    def _on_register(self, a: AgentInfo, msg: Register) -> None:
        if msg.node != a.node:
            raise ProtocolError(f"node {a.node} speaks for node {msg.node}", field="node", msg_type=msg.T)
        replaced = self.registry.admit(a, msg)
        if replaced is False:
            return
        if replaced is not None:
            self.lose(a.node, f"replaced by epoch {a.epoch}")
        # never reuse a job id or version an agent saw from an earlier scheduler (restarted)
        self.job_id = max(self.job_id, msg.seen_job or 0)
        self.version = max(self.version, msg.seen_version or 0)
        self.registry.add(a, msg)
        self.cap_sharing.set_caps(a.node, msg.uplink_mbps, msg.downlink_mbps)
        self.view.set_cap(a.node, "up", msg.uplink_mbps)  # nominal until its own samples come
        self.view.set_cap(a.node, "down", msg.downlink_mbps)
        self.view.add_node(a.node)
        self.view.node_up(a.node)
        for n in a.neighbors:
            self.view.add_link(a.node, n)
        self.on_event("agent", {"node": a.node, "neighbors": a.neighbors})
        if self.registry.complete.is_set():  # a restarted agent: everyone learns where it is now
            self._rejoin(a)

    def _on_ready(self, a: AgentInfo, msg: Ready) -> None:
        js = self.current
        if js is None or msg.job != js.job or js.mode != "rounds":
            self.registry.send(a, Abort(job=msg.job, task=msg.round, attempt=-1 if js is None else 0))
            return
        rnd, attempt = msg.round, msg.attempt or 0
        if rnd >= js.rounds:
            raise ProtocolError(f"round {rnd} of job {js.job}, which has {js.rounds}", field="round", msg_type=msg.T)
        if js.progress.name != "bsp":  # the model forms the tasks (and answers with GO where it bounds)
            self.note_event("ready", job=js.job, node=a.node, round=rnd)
            js.progress.ready(self, js, a.node, rnd, set(msg.have or ()))
            return
        t = js.bsp_task(rnd)
        if attempt != t.attempt:
            # an aborted attempt: say so again (an agent that rejoined never got that ABORT)
            self.registry.send(a, Abort(job=js.job, task=rnd, attempt=t.attempt - 1))
            return
        if not self.consistency:
            v = js.plan.version
            have = set(msg.have or ())
            plan = self.plans[v]
            self.registry.send(a, TaskMsg(job=js.job, task=rnd, attempt=t.attempt, version=v, round=rnd,
                                          members=list(plan.participants), receivers=list(plan.receiver_set),
                                          plan=None if v in have else plan.to_wire()))
            self.on_event("topo_request", {"node": a.node, "round": rnd, "version": v})
            return
        self.barrier_ready(js, rnd, a.node, set(msg.have or ()))

    def _on_report(self, a: AgentInfo, msg: Report) -> None:
        for src, dst, _, _ in msg.samples:  # the schema checked shapes and values
            if dst != a.node or src not in a.neighbors:  # samples are taken by the receiver of a link
                raise ProtocolError(f"sample of link {src}->{dst}, not a link into node {a.node}",
                                    field="samples", msg_type=msg.T)
        for src, dst, nbytes, seconds in msg.samples:
            self.view.observe(src, dst, nbytes, seconds)
        for kind, nbytes, seconds in msg.caps or ():  # the node's own caps (a big switch's ports)
            self.view.observe_cap(a.node, ("up", "down")[int(kind)], int(nbytes), seconds)
        for kind, mbps in zip(("up", "down"), msg.declared or (), strict=False):
            if mbps is not None:
                self.view.declare_cap(a.node, kind, mbps)
        self.on_event("samples", {"node": a.node, "samples": msg.samples})
        if self.current is not None:
            self._maybe_refresh_aux(self.current)

    def _on_task_done(self, a: AgentInfo, msg: TaskDone) -> None:
        js = self.current
        if js is None or msg.job != js.job:
            return
        if not self.consistency and js.mode == "rounds" and js.progress.name == "bsp" and msg.task < js.rounds:
            t: Task | None = js.bsp_task(msg.task)
        else:
            t = js.tasks.get(msg.task)
        if t is None or msg.attempt != t.attempt or (self.consistency and t.version is None):
            return  # finished an attempt that was aborted meanwhile (or a task that never began)
        t.done[a.node] = msg
        if not msg.ok:
            self.errors.append(f"node {a.node} job {js.job} task {msg.task}: {msg.error or 'wrong result'}")
        self._record(js, t)

    def _on_stats(self, a: AgentInfo, msg: Stats) -> None:
        js = self.current
        if js is not None and msg.job == js.job:
            js.stats[a.node] = msg.stats
            self._maybe_finish(js)

    def _on_counters(self, a: AgentInfo, msg: Counters) -> None:
        links = {int(dst): nbytes for dst, nbytes in msg.links.items()}  # the schema checked the keys
        if not set(links) <= set(a.neighbors):
            raise ProtocolError(f"counters for links {sorted(set(links) - set(a.neighbors))[:8]} that "
                                f"node {a.node} does not have", field="links", msg_type=msg.T)
        for dst, nbytes in links.items():
            self.link_bytes[(a.node, dst)] = nbytes
        self.on_event("counters", {"node": a.node, "time": msg.time, "links": msg.links})

    def _on_heartbeat(self, a: AgentInfo, msg: Heartbeat) -> None:
        a.rx_bytes = msg.rx if msg.rx is not None else a.rx_bytes
        a.stuck = {int(b): w for b, w in msg.stuck or () if b in a.neighbors}
