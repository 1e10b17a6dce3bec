"""The scheduler: registers agents, runs jobs, freezes a plan version per round, learns the network.

Version rule (one mechanism for every scheme): at the start of round r each agent asks which
version r uses; the first request for r freezes the answer for everyone, so a round never mixes
versions. Re-planning (adaptive schemes, when the view moved by more than `update_rate`) only
ever affects rounds not yet frozen.

The answer goes out once every participant has asked (BSP: nobody can compute round r before it
holds round r-1's result anyway). Synchronization then starts together, so a round's time is the
synchronization itself and not the previous round's broadcast tail seen by an early finisher.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from overlay.auth import AuthError, Handshake, TlsFiles
from overlay.burstlog import BurstLog
from overlay.control import ControlConn, Refuse, control_protocol
from overlay.messages import ProtocolError

from . import deadline, planners
from .plan import Job, Plan, PlanError, aux_to_wire
from .view import DisconnectedView, NetworkView

log = logging.getLogger("wansync.scheduler")
# Control connections accepted but not yet authenticated: more are refused at once (see Refuse)
MAX_HALF_OPEN = 64
BSP_AHEAD = 1  # rounds an agent may receive frames for beyond its own: BSP starts r+1 once r ended everywhere

Event = Callable[[str, dict[str, Any]], None]


@dataclass
class AgentInfo:
    node: int
    conn: ControlConn
    host: str = ""
    port: int = 0
    neighbors: tuple[int, ...] = ()
    pid: int | None = None
    versions: set[int] = field(default_factory=set)
    last_seen: float = 0.0
    epoch: int = 0  # the agent process's incarnation (HELLO); a fenced epoch never comes back
    rx_bytes: int = 0  # data-plane bytes received so far (HEARTBEAT): round progress
    stuck: dict[int, float] = field(default_factory=dict)  # peer -> seconds its chunks wait unacknowledged


@dataclass
class RoundRecord:
    job: int
    scheme: str
    round: int
    version: int
    round_s: float
    compute_s: float
    ok: bool
    digests_agree: bool
    versions_agree: bool  # every node ran the frozen version: the round mixed none
    t_start: float
    t_end: float
    warmup: bool
    errors: list[str]
    trp_wait_s: float = 0.0  # longest time an agent waited for this round's topology reply
    coverage: float = 0.0  # share of directed links the view has measured, when the round ended
    prediction_s: float | None = None  # filled in by whoever knows the configured network
    attempt: int = 0  # > 0: earlier attempts were aborted (a lost agent, a stall) and retried
    participants: int = 0
    # node -> hex blake2b-128 of its result's bytes: lets anyone check the result against a sum of their own
    digests: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"type": "round", **{k: v for k, v in self.__dict__.items()}}


@dataclass
class JobState:
    job: int
    scheme: str
    rounds: int
    spec: Job
    plan: Plan
    warmup: int
    frozen: dict[int, int] = field(default_factory=dict)  # round -> version
    asked: dict[int, dict[int, set[int]]] = field(default_factory=dict)  # round -> node -> versions it has
    done: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)  # round -> node -> ROUND_DONE
    stats: dict[int, dict[str, Any]] = field(default_factory=dict)
    records: list[RoundRecord] = field(default_factory=list)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    view_at_plan: dict[tuple[int, int], float] = field(default_factory=dict)
    policy_s: float = 0.0
    t0: float = 0.0
    planner: Callable[[NetworkView, Job], Plan] | None = None
    last_plan_t: float = 0.0
    replans: int = 0
    view_at_aux: dict[tuple[int, int], float] = field(default_factory=dict)
    last_aux_t: float = 0.0
    aux_updates: int = 0  # AUX_UPDATE pushes: new auxiliary tables without a new version
    attempt: dict[int, int] = field(default_factory=dict)  # round -> current attempt
    aborts: list[dict[str, Any]] = field(default_factory=list)  # every aborted attempt, with why and when
    started: dict[int, float] = field(default_factory=dict)  # round -> when its current attempt started
    predicted: dict[int, float | None] = field(default_factory=dict)  # version -> simulated on the view
    job_msg: dict[str, Any] = field(default_factory=dict)  # the JOB message, for agents that rejoin
    avoid: list[list[int]] = field(default_factory=list)  # links the current plan routes around (view.unusable)
    joins: dict[int, int] = field(default_factory=dict)  # node -> first round it runs after rejoining
    barrier_t: dict[int, float] = field(default_factory=dict)  # round -> first request of its attempt
    recorded_t: dict[int, float] = field(default_factory=dict)  # round -> when its last ROUND_DONE came
    blocked: dict[int, str] = field(default_factory=dict)  # round -> why no plan exists for its members yet


class Scheduler:
    def __init__(self, cluster: str, nodes: int, *, update_rate: float = 0.1, update_time: float = 0.0,
                 on_event: Event | None = None, predict: Callable[[Plan, float], float] | None = None,
                 consistency: bool = True, heartbeat_timeout: float = 1.5, secret: bytes | None = None,
                 tls: TlsFiles | None = None) -> None:
        """predict(plan, seconds since the job's t0) -> predicted round time: the simulator on the
        configured network, where the caller knows it (scheduler/ never sees the emulator itself).
        secret: the cluster secret agents must prove they hold (overlay.auth); None = no
        authentication (--insecure, trusted networks and in-process tests only). tls: serve TLS."""
        self.cluster = cluster
        self.secret = secret
        self.tls = tls
        self.expected = nodes
        self.update_rate = update_rate  # re-plan only if some link's rate moved by more than this (relative)
        self.update_time = update_time  # ... and at most this often (seconds; NetStorm's UPDATE_TIME)
        self.on_event = on_event or (lambda kind, data: None)
        self.predict = predict
        # False reproduces what NetStorm's topology request protocol prevents (Fig. 8): every agent
        # gets the newest version when it asks, no freeze per round, no barrier. Tests only.
        self.consistency = consistency
        # an agent silent this long (no heartbeat: frozen, partitioned) is declared lost
        self.heartbeat_timeout = heartbeat_timeout
        self.lost: dict[int, dict[str, Any]] = {}  # node -> when and why it was declared lost
        self.fenced: dict[int, int] = {}  # node -> highest epoch refused from now on
        self._progress = (0, time.time())  # (sum of agents' received bytes, when it last grew)
        self._closing = False
        self.suspect_until: dict[tuple[int, int], float] = {}  # link -> when to trust it again
        self.view = NetworkView()
        self.agents: dict[int, AgentInfo] = {}
        self.plans: dict[int, Plan] = {}
        self.version = 0
        self.job_id = 0
        self.current: JobState | None = None
        self.errors: list[str] = []
        self.policy_bytes = 0  # size of every published plan, as sent to one agent
        self._registered = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        # what happened when, for dashboards and results: plan versions, jobs, faults (note_event)
        self.timeline: list[dict[str, Any]] = []
        self.link_bytes: dict[tuple[int, int], int] = {}  # cumulative bytes per directed link (COUNTERS)
        self._tasks: set[asyncio.Task] = set()
        self._half_open = 0  # accepted control connections still in their handshake
        self._burst = BurstLog(log)  # one line per burst of refusals or invalid messages, not one per event

    # --- lifecycle ---------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, host, port,
                                                ssl=self.tls.server_context() if self.tls else None)
        watch = loop.create_task(self._watchdog())
        self._tasks.add(watch)
        watch.add_done_callback(self._tasks.discard)
        return self._server.sockets[0].getsockname()[1]

    def _accept(self) -> asyncio.BaseProtocol:
        if self._half_open >= MAX_HALF_OPEN:  # strangers may not pile up: each costs a task and buffers
            self._burst.log(logging.WARNING, "half-open", f"scheduler refused control connections: already "
                       f"{MAX_HALF_OPEN} waiting to authenticate")
            return Refuse()
        self._half_open += 1
        proto = control_protocol("agent?")
        conn = ControlConn(proto, self._burst)
        task = asyncio.get_running_loop().create_task(self._serve(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return proto

    async def wait_agents(self, timeout: float = 60.0) -> None:
        try:
            await asyncio.wait_for(self._registered.wait(), timeout)
        except TimeoutError:
            missing = sorted(set(range(self.expected)) - set(self.agents))
            raise TimeoutError(f"agents {missing} did not register within {timeout:.0f} s") from None
        self._send_peers()

    def _send_peers(self) -> None:
        peers = {n: [a.host, a.port, a.epoch] for n, a in self.agents.items()}
        for a in list(self.agents.values()):
            self._send(a, {"t": "PEERS", "peers": peers})

    def _send(self, a: AgentInfo, msg: dict[str, Any]) -> None:
        try:
            a.conn.send(msg)
        except ConnectionError:  # its loss is handled where the connection ends
            pass

    async def shutdown(self) -> None:
        self._closing = True
        for a in self.agents.values():
            try:
                a.conn.send({"t": "SHUTDOWN"})
            except ConnectionError:
                pass
        await asyncio.sleep(0.05)
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

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
    async def run_job(self, scheme: str, *, rounds: int, params: int, chunk_params: int, compute_s: float = 0.0,
                      options: dict[str, Any] | None = None, warmup: int = 0, t0: float | None = None) -> JobState:
        """Run `warmup + rounds` synchronized rounds of one scheme on every agent; return its records."""
        planner, fixed = planners.resolve(scheme)
        self.job_id += 1
        # "state": what a planner keeps between re-plans of this job (NetStorm's frozen roots)
        spec = Job(params, chunk_params, tuple(sorted(self.agents)), {**(options or {}), **fixed, "state": {}})
        t = time.perf_counter()
        plan = self._publish(planner(self.view, spec))
        js = JobState(self.job_id, scheme, rounds + warmup, spec, plan, warmup,
                      view_at_plan=self.view.snapshot(), policy_s=time.perf_counter() - t,
                      t0=time.time() if t0 is None else t0, planner=planner, last_plan_t=time.time(),
                      avoid=self.view.unusable())
        self.current = js
        msg = js.job_msg = {"t": "JOB", "job": js.job, "scheme": scheme, "rounds": js.rounds, "params": params,
                            "compute_s": compute_s, "t0": js.t0, "warmup": warmup, "ahead": BSP_AHEAD}
        for a in self.agents.values():
            a.conn.send(msg)
        self.on_event("job", {"job": js.job, "scheme": scheme, "rounds": js.rounds, "version": plan.version})
        self.note_event("job", job=js.job, scheme=scheme, rounds=js.rounds, version=plan.version)
        await js.finished.wait()
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
        msg = {"t": "AUX_UPDATE", "job": js.job, "version": plan.version,
               "groups": [aux_to_wire(g.aux) for g in plan.groups]}
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
        if (not planners.refreshes_aux(js.scheme, js.spec.options) or time.time() - js.last_aux_t < self.update_time
                or not self.view.changed_since(js.view_at_aux or js.view_at_plan, self.update_rate)):
            return
        js.last_aux_t = time.time()
        js.view_at_aux = self.view.snapshot()
        t = time.perf_counter()
        new = planners.refresh_aux(self.view, js.spec, js.plan)
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

    def _version_for(self, js: JobState, rnd: int) -> int:
        """First request for a round freezes its version; adaptive schemes may re-plan just before."""
        if rnd in js.frozen:
            return js.frozen[rnd]
        # an agent that rejoined mid-job takes part from the round it was told to start at
        alive = tuple(sorted(n for n in self.agents if js.joins.get(n, 0) <= rnd))
        avoid = self.view.unusable()
        if alive != js.spec.participants or avoid != js.avoid:  # lost, back, or a link suspected dead
            self._replan_members(js, alive, avoid)
        elif (planners.adaptive(js.scheme, js.spec.options) and rnd > 0
                and time.time() - js.last_plan_t >= self.update_time
                and self.view.changed_since(js.view_at_plan, self.update_rate)):
            t = time.perf_counter()
            new = js.planner(self.view, js.spec)
            js.policy_s += time.perf_counter() - t
            js.replans += 1
            js.view_at_plan = self.view.snapshot()
            js.last_plan_t = time.time()
            if not new.same_policy(js.plan):
                js.plan = self._publish(new)
        js.frozen[rnd] = js.plan.version
        return js.plan.version

    def _try_start(self, js: JobState, rnd: int, asking: int | None = None) -> None:
        """Freeze the round's version (re-planning first if members or usable links changed) and start
        it once every member asked. Blocked while no plan connects the members (a lost node or
        suspected links cut them apart): the watchdog tries again as the cluster changes."""
        try:
            v = self._version_for(js, rnd)
        except (DisconnectedView, PlanError, ValueError) as exc:
            if js.blocked.get(rnd) != str(exc):
                log.warning("job %d round %d waits: no plan for its members (%s)", js.job, rnd, exc)
                self.note_event("blocked", job=js.job, round=rnd, why=str(exc))
            js.blocked[rnd] = str(exc)
            return
        js.blocked.pop(rnd, None)
        attempt = js.attempt.get(rnd, 0)
        members = set(self.plans[v].participants)
        asked = js.asked.get(rnd, {})
        for node in [n for n in asked if n not in members]:
            del asked[node]  # joined after this round was frozen (it sits this one out), or lost since
            if node in self.agents:
                self._send(self.agents[node], {"t": "TOPO_REPLY", "job": js.job, "round": rnd, "version": v,
                                               "attempt": attempt, "skip": True})
        if asking is not None:
            self.on_event("topo_request", {"node": asking, "round": rnd, "version": v})
        if not members <= set(asked):
            return
        for node, have in asked.items():
            reply = {"t": "TOPO_REPLY", "job": js.job, "round": rnd, "version": v, "attempt": attempt,
                     "avoid": js.avoid}
            if v not in have:
                reply["plan"] = self.plans[v].to_wire()
            self._send(self.agents[node], reply)
        del js.asked[rnd]
        js.started[rnd] = time.time()

    def _replan_members(self, js: JobState, alive: tuple[int, ...], avoid: list[list[int]]) -> None:
        """Plan for the living on what is usable; all or nothing (a planner may find no plan)."""
        old = js.spec.participants
        # frozen roots may be gone: choose again among the living
        options = {**js.spec.options, "state": {}}
        if options.get("hub") is not None and options["hub"] not in alive:
            del options["hub"]  # the chosen hub is lost: the planner picks the best one alive
        spec = dataclasses.replace(js.spec, participants=alive, options=options)
        t = time.perf_counter()
        plan = js.planner(self.view, spec)
        js.policy_s += time.perf_counter() - t
        js.spec, js.avoid = spec, avoid
        js.plan = self._publish(plan)
        js.replans += 1
        js.view_at_plan = self.view.snapshot()
        js.last_plan_t = time.time()
        self.note_event("membership", job=js.job, was=list(old), now=list(alive), version=js.plan.version,
                        avoid=js.avoid)

    # --- failures ---------------------------------------------------------------------------------
    def _lost(self, node: int, why: str) -> None:
        """Declare an agent gone: fence its incarnation, abort the round it was part of, re-plan."""
        a = self.agents.pop(node, None)
        if a is None or self._closing:
            return
        self.fenced[node] = max(self.fenced.get(node, 0), a.epoch)
        self.lost[node] = {"t": time.time(), "why": why, "epoch": a.epoch}
        for link in self.view.node_down(node):  # suspected links the living need after all
            self.suspect_until.pop(link, None)
            self.note_event("link_trusted", link=list(link), why=f"needed without node {node}")
        log.warning("agent %d lost (%s); fencing epoch %d", node, why, a.epoch)
        self.note_event("agent_lost", node=node, why=why)
        self._send(a, {"t": "FENCE", "node": node, "epoch": a.epoch})  # a frozen agent reads it when it wakes
        a.conn.close()
        for b in list(self.agents.values()):
            self._send(b, {"t": "FENCE", "node": node, "epoch": a.epoch})
        js = self.current
        if js is None or js.finished.is_set():
            return
        for rnd in sorted(r for r in js.frozen if r not in js.recorded_t):
            if node in self.plans[js.frozen[rnd]].participants:
                self._abort(js, rnd, f"agent {node} lost: {why}")

    def _abort(self, js: JobState, rnd: int, why: str) -> None:
        """The round's current attempt cannot end exact: everyone drops it and retries on a new plan."""
        att = js.attempt.get(rnd, 0)
        js.attempt[rnd] = att + 1
        js.aborts.append({"round": rnd, "attempt": att, "why": why, "t": time.time(),
                          "t_start": js.started.get(rnd)})
        js.frozen.pop(rnd, None)
        js.asked.pop(rnd, None)
        js.blocked.pop(rnd, None)
        js.done.pop(rnd, None)
        js.started.pop(rnd, None)
        log.warning("job %d round %d attempt %d aborted: %s", js.job, rnd, att, why)
        self.note_event("abort", job=js.job, round=rnd, attempt=att, why=why)
        for a in list(self.agents.values()):
            self._send(a, {"t": "ABORT", "job": js.job, "round": rnd, "attempt": att})

    async def _watchdog(self, tick: float = 0.2) -> None:
        """Heartbeat deadlines for agents; stall and overrun deadlines (scheduler/deadline.py) for rounds."""
        last = time.time()
        while True:
            await asyncio.sleep(tick)
            now = time.time()
            late = now - last - tick
            last = now
            if late > 0.1:  # this loop could not listen meanwhile: that silence is ours, not the agents'
                for a in self.agents.values():
                    a.last_seen += late
                self._progress = (self._progress[0], self._progress[1] + late)
            try:
                self._deadlines(now)
            except Exception:  # a bug here must not end liveness checking for the whole run
                log.exception("watchdog")

    def _deadlines(self, now: float) -> None:
        """Heartbeats, suspicions that ended, blocked rounds, the barrier, stall and overrun."""
        for a in list(self.agents.values()):
            if now - a.last_seen > self.heartbeat_timeout:
                self._lost(a.node, f"silent for {now - a.last_seen:.1f} s")
        for link, until in list(self.suspect_until.items()):
            if now > until:  # trust it again; if it is still dead the next stall finds it
                del self.suspect_until[link]
                self.view.unsuspend(*link)
        js = self.current
        if js is None or js.finished.is_set():
            return
        rx = sum(a.rx_bytes for a in self.agents.values())
        if rx != self._progress[0]:
            self._progress = (rx, now)
        for rnd in list(js.blocked):  # the cluster may have changed: a node back, a suspicion over
            if rnd in js.asked:
                self._try_start(js, rnd)
            else:
                del js.blocked[rnd]
        for rnd, t0 in list(js.barrier_t.items()):
            if rnd not in js.asked:
                del js.barrier_t[rnd]
                continue
            if rnd not in js.frozen:
                continue  # blocked: no plan yet, so no members to wait for
            # once the previous round is complete everywhere, everyone asks within its compute time:
            # one who does not, while alive, is stuck (a slow previous round has its own deadlines)
            if rnd > 0 and rnd - 1 not in js.recorded_t:
                continue
            t0 = max(t0, js.recorded_t.get(rnd - 1, 0.0))
            recent = [r.round_s for r in js.records[-5:]]
            limit = deadline.overrun_s(js.job_msg.get("compute_s", 0.0), recent, 0)
            missing = [n for n in self.plans[js.frozen[rnd]].participants if n not in js.asked[rnd]]
            if now - t0 > limit and missing:
                for n in missing:
                    self._lost(n, f"did not ask for round {rnd} within {limit:.1f} s (stuck)")
        for rnd, t0 in list(js.started.items()):  # past the barrier, not complete (both pop it)
            plan = self.plans[js.frozen[rnd]]
            quiet = now - max(self._progress[1], t0)
            aborts = sum(1 for x in js.aborts if x["round"] == rnd)
            if quiet > deadline.stall_s(plan, self.view) * 2 ** aborts:
                suspects = self._suspect(quiet)
                self._abort(js, rnd, f"no data moved for {quiet:.1f} s"
                            + (f"; routing around {suspects}" if suspects else ""))
                continue
            recent = [r.round_s for r in js.records[-5:] if r.version == plan.version]
            limit = deadline.overrun_s(self._predicted(js, plan), recent, aborts)
            if now - t0 > limit:
                self._abort(js, rnd, f"round ran {now - t0:.1f} s, over its deadline of {limit:.1f} s")

    def _suspect(self, quiet: float) -> list[list[int]]:
        """After a stall: links whose chunks waited unacknowledged about as long as nothing moved
        swallowed them (a blackhole). They leave the view for a while, so the retry avoids them."""
        out = []
        for a in list(self.agents.values()):
            for b, waited in a.stuck.items():
                link = (min(a.node, b), max(a.node, b))
                if waited >= 0.8 * quiet and link not in self.suspect_until and self.view.suspend(*link):
                    self.suspect_until[link] = time.time() + deadline.suspect_s(quiet)
                    self.note_event("link_suspected", link=list(link), waited_s=waited)
                    out.append(list(link))
        return out

    def _predicted(self, js: JobState, plan: Plan) -> float | None:
        """The simulator's round time for `plan` on the view, computed in a thread (a big plan takes
        seconds, and this loop must keep reading heartbeats); None until it is known."""
        if plan.version not in js.predicted:
            js.predicted[plan.version] = None
            view = NetworkView()
            view.g = self.view.g.copy()  # a snapshot: the thread must not see the view change under it

            def done(fut: asyncio.Future) -> None:
                if not fut.cancelled() and fut.exception() is None:
                    js.predicted[plan.version] = fut.result()
            fut = asyncio.get_running_loop().run_in_executor(None, deadline.predict_on_view, plan, view)
            fut.add_done_callback(done)
        return js.predicted[plan.version]

    # --- one agent's control connection ---------------------------------------------------------------
    async def _serve(self, conn: ControlConn) -> None:
        info: AgentInfo | None = None
        try:
            # HELLO both ways, then HMAC proofs both ways (overlay/auth.py); nothing registers before
            hs = Handshake(self.cluster, -1, "scheduler", dialer=False, secret=self.secret, peer_role="agent",
                           check_peer=self._may_connect)
            try:
                node = await conn.handshake(hs)
            except (AuthError, TimeoutError, ConnectionError) as exc:
                if hs.peer_hello is not None or conn.errors or isinstance(exc, TimeoutError):
                    addr = conn.proto.transport.get_extra_info("peername") if conn.proto.transport else None
                    why = exc.reason if isinstance(exc, AuthError) else f"no handshake ({type(exc).__name__})"
                    kind = "timeout" if isinstance(exc, TimeoutError) else why
                    self._burst.log(logging.WARNING, ("refused", kind),
                               f"scheduler refused a control connection from {addr}: {why}")
                return
            finally:
                self._half_open -= 1
            first = hs.peer_hello
            assert first is not None
            conn.proto.peer = f"agent {node}"
            info = AgentInfo(node, conn, last_seen=time.time(), epoch=int(first.get("epoch", 0)))
            while True:
                msg = await conn.recv()
                if msg is None:
                    break
                if msg["t"] == "CLOCK":  # answered at once: its delay is the agent's error bound
                    try:
                        conn.send({"t": "CLOCK", "t0": msg["t0"], "t1": time.time()})
                    except ConnectionError:  # it hung up (or was cut off) meanwhile: the end of it
                        break
                    continue
                info.last_seen = time.time()
                try:
                    self._handle(info, msg)
                except ProtocolError as exc:  # valid by its schema, not by the rules: counted like one that is not
                    exc.peer = exc.peer if exc.peer is not None else conn.proto.peer
                    conn.refuse(exc)
                except Exception as exc:  # a bug must not leave a connection open that nobody reads
                    log.error("agent %d: handling its %s failed (%s: %s); closing its control connection",
                              node, msg["t"], type(exc).__name__, exc)
                    log.debug("handler failure", exc_info=True)
                    break
        except ProtocolError as exc:
            log.warning("%s", exc)
        finally:
            conn.close()
            if info is not None and self.agents.get(info.node) is info:
                self.on_event("agent_lost", {"node": info.node})
                self._lost(info.node, "control connection closed")

    def _may_connect(self, node: int, role: str) -> str | None:
        if not 0 <= node < self.expected:
            return f"unknown node {node} (cluster has nodes 0..{self.expected - 1})"
        return None

    def _handle(self, a: AgentInfo, msg: dict[str, Any]) -> None:
        t = msg["t"]
        if t != "REGISTER" and self.agents.get(a.node) is not a:
            # an authenticated connection that did not register (or was replaced since) speaks for no one
            raise ProtocolError(f"{t} from node {a.node}, which has not registered on this connection",
                                msg_type=t)
        if msg.get("node", a.node) != a.node:
            raise ProtocolError(f"node {a.node} speaks for node {msg['node']}", field="node", msg_type=t)
        if t == "REGISTER":
            strangers = [n for n in msg["neighbors"] if not 0 <= n < self.expected or n == a.node]
            if strangers:
                raise ProtocolError(f"neighbours {strangers[:8]} are not other nodes of this cluster "
                                    f"(0..{self.expected - 1})", field="neighbors", msg_type=t)
            if a.epoch <= self.fenced.get(a.node, -1):
                log.warning("refused node %d: epoch %d was fenced (a zombie of a lost agent)", a.node, a.epoch)
                self._send(a, {"t": "FENCE", "node": a.node, "epoch": a.epoch})
                a.conn.close()
                return
            old = self.agents.get(a.node)
            if old is not None and old is not a:
                if a.epoch <= old.epoch:
                    log.warning("refused node %d epoch %d: epoch %d is registered", a.node, a.epoch, old.epoch)
                    a.conn.close()
                    return
                self._lost(a.node, f"replaced by epoch {a.epoch}")
            # never reuse a job id or version an agent saw from an earlier scheduler (restarted)
            self.job_id = max(self.job_id, msg.get("seen_job", 0))
            self.version = max(self.version, msg.get("seen_version", 0))
            a.host, a.port, a.pid = msg["host"], msg["port"], msg.get("pid")
            a.neighbors = tuple(msg["neighbors"])
            self.agents[a.node] = a
            self.view.add_node(a.node)
            self.view.node_up(a.node)
            for n in a.neighbors:
                self.view.add_link(a.node, n)
            self.on_event("agent", {"node": a.node, "neighbors": a.neighbors})
            if len(self.agents) == self.expected:
                self._registered.set()
            if self._registered.is_set():  # a restarted agent: everyone learns where it is now
                self._rejoin(a)
        elif t == "TOPO_REQUEST":
            js = self.current
            if js is None or msg["job"] != js.job:
                a.conn.send({"t": "ABORT", "job": msg["job"], "round": msg["round"], "attempt": 0})
                return
            rnd, attempt = msg["round"], msg.get("attempt", 0)
            if attempt != js.attempt.get(rnd, 0):
                # an aborted attempt: say so again (an agent that rejoined never got that ABORT)
                self._send(a, {"t": "ABORT", "job": js.job, "round": rnd, "attempt": js.attempt.get(rnd, 0) - 1})
                return
            if not self.consistency:
                v = js.plan.version
                reply = {"t": "TOPO_REPLY", "job": js.job, "round": rnd, "version": v}
                if v not in set(msg.get("have", ())):
                    reply["plan"] = self.plans[v].to_wire()
                a.conn.send(reply)
                self.on_event("topo_request", {"node": a.node, "round": rnd, "version": v})
                return
            if rnd not in js.asked:
                js.barrier_t[rnd] = time.time()
            js.asked.setdefault(rnd, {})[a.node] = set(msg.get("have", ()))
            self._try_start(js, rnd, a.node)
        elif t == "REPORT":
            for src, dst, _, _ in msg["samples"]:  # the schema checked shapes and values
                if dst != a.node or src not in a.neighbors:  # samples are taken by the receiver of a link
                    raise ProtocolError(f"sample of link {src}->{dst}, not a link into node {a.node}",
                                        field="samples", msg_type=t)
            for src, dst, nbytes, seconds in msg["samples"]:
                self.view.observe(src, dst, nbytes, seconds)
            self.on_event("samples", {"node": a.node, "samples": msg["samples"]})
            if self.current is not None:
                self._maybe_refresh_aux(self.current)
        elif t == "ROUND_DONE":
            self._round_done(a, msg)
        elif t == "STATS":
            js = self.current
            if js is not None and msg["job"] == js.job:
                js.stats[a.node] = msg["stats"]
                self._maybe_finish(js)
        elif t == "COUNTERS":
            links = {int(dst): nbytes for dst, nbytes in msg["links"].items()}  # the schema checked the keys
            if not set(links) <= set(a.neighbors):
                raise ProtocolError(f"counters for links {sorted(set(links) - set(a.neighbors))[:8]} that "
                                    f"node {a.node} does not have", field="links", msg_type=t)
            for dst, nbytes in links.items():
                self.link_bytes[(a.node, dst)] = nbytes
            self.on_event("counters", {"node": a.node, "time": msg["time"], "links": msg["links"]})
        elif t == "HEARTBEAT":
            a.rx_bytes = msg.get("rx", a.rx_bytes)
            a.stuck = {b: w for b, w in msg.get("stuck", []) if b in a.neighbors}
        else:
            raise ProtocolError(f"{t} is not a message an agent sends", field="t", msg_type=t)

    def _round_done(self, a: AgentInfo, msg: dict[str, Any]) -> None:
        js = self.current
        if js is None or msg["job"] != js.job:
            return
        rnd = msg["round"]
        if msg["attempt"] != js.attempt.get(rnd, 0) or (self.consistency and rnd not in js.frozen):
            return  # finished an attempt that was aborted meanwhile
        got = js.done.setdefault(rnd, {})
        got[a.node] = msg
        if not msg["ok"]:
            self.errors.append(f"node {a.node} job {js.job} round {rnd}: {msg.get('error', 'wrong result')}")
        members = self.plans[js.frozen[rnd]].participants if rnd in js.frozen else js.spec.participants
        if len(got) < len(members):
            return
        js.started.pop(rnd, None)
        starts = [m["t_start"] for m in got.values()]
        ends = [m["t_end"] for m in got.values()]
        rec = RoundRecord(
            job=js.job, scheme=js.scheme, round=rnd, version=js.frozen.get(rnd, -1),
            round_s=max(ends) - min(starts), compute_s=statistics.median(m["t_compute"] for m in got.values()),
            ok=all(m["ok"] for m in got.values()), digests_agree=len({m["digest"] for m in got.values()}) == 1,
            versions_agree={m["version"] for m in got.values()} == {js.frozen.get(rnd, -1)},
            t_start=min(starts), t_end=max(ends), warmup=rnd < js.warmup,
            errors=[m["error"] for m in got.values() if m.get("error")],
            trp_wait_s=max(m.get("t_wait", 0.0) for m in got.values()), coverage=self.view.coverage(),
            attempt=msg["attempt"], participants=len(members),
            digests={n: m["digest"].hex() for n, m in sorted(got.items())})
        if self.predict is not None and rec.version in self.plans:
            rec.prediction_s = self.predict(self.plans[rec.version], rec.t_start - js.t0)
        js.records.append(rec)
        js.recorded_t[rnd] = time.time()
        self.on_event("round", rec.to_json())
        self._maybe_finish(js)

    def _maybe_finish(self, js: JobState) -> None:
        """Done when every round is recorded and every agent still here sent its job stats."""
        if len(js.records) == js.rounds and all(n in js.stats for n in self.agents):
            js.finished.set()

    def _rejoin(self, a: AgentInfo) -> None:
        """A restarted agent: peers learn its address and epoch; it joins the running job from the next
        round that is not frozen yet (whose plan then includes it)."""
        self._send_peers()
        js = self.current
        if js is None or js.finished.is_set():
            return
        start = js.joins[a.node] = max(js.frozen, default=-1) + 1
        self.note_event("agent_rejoined", node=a.node, epoch=a.epoch, round=start)
        self._send(a, {**js.job_msg, "start": start})
