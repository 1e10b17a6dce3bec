"""The scheduler: runs jobs on the registered agents as tasks, freezes a plan version per task, learns
the network.

It composes the parts that each do one thing: the control port (server.py: accept, authenticate,
dispatch typed messages), who is in the cluster (registry.py), what agents say (handlers.py), plan
versions and re-planning (versions.py), task start with routes and rates (start.py), records
(records.py), failures (failures.py), liveness (liveness.py: heartbeats, barrier, stall and overrun
deadlines, suspected links), what progress models may ask (control.py; the models in progress/) and
the planners (planners/: a PlannerSpec per scheme). What is left here is the job's course.

A task: members that contribute (weighted), receivers of the result, nodes that only aggregate,
replicate or relay, a plan and its version. A BSP job is a task per round, "everyone contributes,
everyone receives"; a tasks job runs the partial reduces this scheduler forms (`run_task`), many at
once, each exact or aborted on its own; a lost agent aborts (and retries or re-plans) only the
tasks it had a part in.

Public API for launchers (wansync/): start/shutdown, wait_agents, run_job (BSP), open_tasks /
run_task / close_job (formed tasks), send (to one agent), job_t0, subscribe/note_event (events and
the timeline), stage/push_aux (operator overrides).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any

from core.capshare import CapSharing
from core.plan import Job, Plan, check_sharing
from overlay.auth import TlsFiles
from overlay.messages import Job as JobMsg
from overlay.messages import JobEnd, Record, Shutdown
from overlay.routing import Routes

from . import planners
from . import progress as progress_models
from .attach import Attachments
from .control import ModelControl
from .events import Event
from .failures import Failures
from .handlers import Handlers
from .liveness import Liveness
from .prober import BUDGET as PROBE_BUDGET
from .prober import Prober, plans_in_force
from .records import Predict, Records
from .registry import AgentInfo, Registry
from .server import ControlServer
from .start import BLOCKED_TASK_S, TaskStart, check_task
from .tasks import JobState, RoundRecord, TaskRecord
from .versions import REPLAN_CPU_SHARE, Unplannable, Versions, replan_due
from .view import NetworkView

__all__ = ["BLOCKED_TASK_S", "REPLAN_CPU_SHARE", "AgentInfo", "JobState", "RoundRecord", "Scheduler", "TaskRecord",
           "Unplannable", "replan_due"]


class Scheduler:
    def __init__(self, cluster: str, nodes: int, *, update_rate: float = 0.1, update_time: float = 0.0,
                 on_event: Event | None = None, predict: Predict | None = None,
                 heartbeat_timeout: float = 1.5, secret: bytes | None = None,
                 tls: TlsFiles | None = None, probe: bool = True, probe_budget: float = PROBE_BUDGET) -> None:
        """predict(plan, seconds since the job's t0) -> predicted round time: the simulator on the
        configured network, where the caller knows it (scheduler/ never sees the emulator itself).
        update_rate: re-plan only if some link's rate moved by more than this (relative); update_time:
        ... and at most this often (seconds; NetStorm's UPDATE_TIME). secret: the cluster secret agents
        must prove they hold (overlay.auth); None = no authentication (--insecure, trusted networks and
        in-process tests only). tls: serve TLS. probe: probe the links no plan keeps busy (prober.py), each
        node for at most `probe_budget` of its time."""
        self.cluster = cluster
        self.expected = nodes
        self.on_event = on_event or (lambda kind, data: None)
        # False reproduces what NetStorm's topology request protocol prevents (Fig. 8): every agent
        # gets the newest version when it asks, no freeze per round, no barrier. Tests only.
        self.job_id = 0
        self.current: JobState | None = None
        self.errors: list[str] = []
        # what happened when, for dashboards and results: plan versions, jobs, faults (note_event)
        self.timeline: list[dict[str, Any]] = []
        self.link_bytes: dict[tuple[int, int], int] = {}  # cumulative bytes per directed link (COUNTERS)
        self.cap_sharing = CapSharing()  # per-flow rates where classed flows of many senders meet
        self.view = NetworkView()
        self.registry = Registry(nodes)
        # the parts, each with what it needs (the scheduler itself only as the narrow host it declares)
        self.versions = Versions(self.view, self.registry, self, update_rate=update_rate, update_time=update_time)
        self.liveness = Liveness(self, self.registry.agents, self.view, heartbeat_timeout)
        self.starter = TaskStart(self.registry, self.view, self.versions, self.cap_sharing, self,
                                 give_up=lambda js, t, why: self.records.give_up(js, t, why))
        self.records = Records(self.registry, self.view, self.versions, self.cap_sharing, self.starter.send_rates,
                               self, predict)
        self.failures = Failures(self.registry, self.view, self.liveness, self.versions, self.cap_sharing,
                                 self.starter, self.records, self)
        self.control = ModelControl(self.registry, self.view, self.versions, self.starter, self.records,
                                    self.failures, self.liveness, self)
        self.attachments = Attachments(self.registry, nodes)
        self.attachments.running = lambda: self.current is not None and not self.current.finished.is_set()
        self.attachments.rejoin = self.failures.back
        self.attachments.others = self.failures.others_stayed
        self.handlers = Handlers(self.registry, self.view, self.versions, self.cap_sharing, self.records,
                                 self.failures, self.control, self, attachments=self.attachments)
        self.server = ControlServer(cluster, secret, may_connect=self.registry.may_connect,
                                    handlers=self.handlers.table(), on_closed=self.handlers.connection_closed,
                                    ssl=tls.server_context() if tls else None)
        self.prober = Prober(self.view, send=self._send_probe, alive=self.alive,
                             running=lambda: plans_in_force(self.current, self.versions.plans),
                             route=lambda: Routes({n: a.neighbors for n, a in self.registry.agents.items()}).route,
                             enabled=probe, budget=probe_budget)
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
    def plans(self) -> dict[int, Plan]:
        """Every published plan, by version."""
        return self.versions.plans

    @property
    def version(self) -> int:
        """The newest published version."""
        return self.versions.version

    @property
    def job_t0(self) -> float | None:
        """When the running (or last) job started: traces and faults count from it."""
        return None if self.current is None else self.current.t0

    # --- lifecycle ---------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        port = await self.server.start(host, port)
        self._watch = asyncio.get_running_loop().create_task(self.liveness.watch())
        self.prober.start()
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

    async def attached(self, timeout: float = 120.0) -> dict[str, Any]:
        """Every rank's training script attached with the same model: rank 0's layout (scheduler.attach)."""
        return await self.attachments.verdict(timeout)

    async def shutdown(self) -> None:
        self.failures.closing = True
        self.prober.stop()
        self.versions.close()
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
              compute_scale: float = 1.0, workload: str | None = None, multicasts: bool = False) -> JobState:
        """A new job on every agent: its first plan published, JOB sent."""
        self.cap_sharing.clear()  # an earlier job's tasks share nothing with this one's
        spec = planners.resolve(scheme).for_progress(multicasts)
        self.job_id += 1
        job = Job(params, chunk_params, tuple(sorted(self.agents)), {**(options or {}), **spec.options})
        memory: dict[str, Any] = {}  # what the planner keeps between its plans for this job
        t = time.perf_counter()
        plan = self.versions.publish(spec.plan(self.view, spec.opening(job), memory))
        js = JobState(self.job_id, scheme, rounds + warmup, job, plan, warmup, planner=spec, memory=memory,
                      view_at_plan=self.view.snapshot(), policy_s=time.perf_counter() - t,
                      t0=time.time() if t0 is None else t0, last_plan_t=time.time(), avoid=self.view.unusable(),
                      mode=mode, progress=progress)
        self.versions.opened(js)
        self.current = js
        js.job_msg = JobMsg(job=js.job, scheme=scheme, rounds=js.rounds, params=params, compute_s=compute_s,
                            t0=js.t0, warmup=warmup, ahead=ahead, mode=mode,
                            rule=None if progress is None else progress.rule, compute=compute,
                            compute_scale=compute_scale if compute else None, seed=seed if compute else None,
                            workload=workload,
                            staleness=None if progress is None else progress.staleness(),
                            barrier=(progress is not None and progress.uses_barrier
                                     and progress.groups == "full") or None).wire()
        for a in list(self.agents.values()):
            self.registry.send(a, js.job_msg)
        self.on_event("job", {"job": js.job, "scheme": scheme, "rounds": js.rounds, "version": js.plan.version,
                              "t0": js.t0, "mode": mode})
        self.note_event("job", job=js.job, scheme=scheme, rounds=js.rounds, version=js.plan.version, mode=mode)
        return js

    async def run_job(self, scheme: str, *, rounds: int, params: int, chunk_params: int, compute_s: float = 0.0,
                      options: dict[str, Any] | None = None, warmup: int = 0, t0: float | None = None,
                      progress: str | Any = progress_models.DEFAULT, staleness: int = 2, group: int = 2,
                      compute: str | None = None, seed: int = 1, compute_scale: float = 1.0,
                      workload: str | None = None, progress_options: Mapping[str, Any] | None = None) -> JobState:
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
        one_source = planners.resolve(scheme).for_progress(model.multicasts).one_source
        if one_source and not model.multicasts:
            raise ValueError(f"{scheme} plans one worker's multicast: it fits progress ssp (a multicast per "
                             f"worker and iteration), not {model.name} (reduces of several workers)")
        if not one_source and not model.reduces:
            raise ValueError(f"progress {model.name} forms multicasts: scheme mcast or mcast-l3, not {scheme}")
        ahead = model.ahead(self.expected)
        js = self._open(scheme, rounds=rounds, params=params, chunk_params=chunk_params, compute_s=compute_s,
                        options=options, warmup=warmup, t0=t0, mode="rounds", ahead=ahead, progress=model,
                        compute=compute, seed=seed, compute_scale=compute_scale, workload=workload,
                        multicasts=model.multicasts)
        model.start(self.control, js)
        await js.finished.wait()
        return js

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
        check_task(members, receivers, options or {}, weights, self.expected)
        if sharing:
            unknown = set(sharing) - {"weight", "priority", "deadline_s"}
            if unknown:
                raise ValueError(f"sharing: unknown {sorted(unknown)} (weight, priority, deadline_s)")
            check_sharing(sharing.get("weight", 1.0), sharing.get("priority", 0), sharing.get("deadline_s"))
        t = self.starter.form(js, members, receivers, None,
                              options={**(options or {}), **({"weights": weights} if weights else {}),
                                       **({"sharing": dict(sharing)} if sharing else {}),
                                       "max_attempts": max_attempts})
        return await t.finished

    def finished(self, js: JobState, node: int) -> None:
        """The worker has no iteration left in `js` (its training script ended): the progress model stops
        waiting for it (a ready queue's last workers then go together)."""
        if js.progress is not None and js is self.current and not js.finished.is_set():
            js.progress.finished(self.control, js, node)

    async def close_job(self, js: JobState, timeout: float = 60.0) -> JobState:
        """End a tasks job: every agent sends its STATS."""
        js.rounds = len(js.records)
        for a in list(self.agents.values()):
            self.registry.send(a, JobEnd(job=js.job))
        self.records.maybe_finish(js)
        await asyncio.wait_for(js.finished.wait(), timeout)
        return js

    def stage(self, plan: Plan) -> int:
        """A new policy for the running job (operator override, tests); rounds not yet frozen use it."""
        if self.current is None:
            raise RuntimeError("no job is running")
        self.current.plan = self.versions.publish(plan)
        return self.current.plan.version

    def push_aux(self, plan: Plan, nodes: Iterable[int] | None = None) -> None:
        """Auxiliary tables for an already published version, pushed at once, no version change:
        safe because auxiliary chunks carry their whole source route (NetStorm §VII-B). `nodes`
        (tests) delivers to some agents only, as a slow network would."""
        if self.current is None:
            raise RuntimeError(f"no running job with plan v{plan.version}")
        self.versions.push_aux(self.current, plan, nodes)

    # --- what the watchdog (liveness.Watched), tests and tools may ask ------------------------------
    def _send_probe(self, node: int, msg: Record) -> bool:
        a = self.registry.agents.get(node)
        return a is not None and self.registry.send(a, msg)

    def alive(self) -> list[int]:
        return self.control.alive()

    def drop_receiver(self, js: JobState, tid: int, node: int) -> None:
        """`node` leaves a running task's receivers (control.ModelControl.drop_receiver)."""
        self.control.drop_receiver(js, tid, node)

    def try_start(self, js: JobState, tid: int, asking: int | None = None) -> None:
        """Freeze the task's version and start it once it may (start.TaskStart.try_start)."""
        self.starter.try_start(js, tid, asking)

    def lose(self, node: int, why: str) -> None:
        """Declare an agent gone: fence it, abort the tasks it had a part in, re-plan (failures.py)."""
        self.failures.lose(node, why)

    def abort(self, js: JobState, tid: int, why: str) -> None:
        """The task's current attempt cannot end exact: dropped everywhere, asked for again, retried
        or given up (failures.py)."""
        self.failures.abort(js, tid, why)
