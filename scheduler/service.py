"""The scheduler: runs jobs on the registered agents, freezes a plan version per round, learns the network.

It composes the parts that each do one thing: the control port (server.py: accept, authenticate,
dispatch typed messages), who is in the cluster (registry.py), the life of each round (rounds.py),
liveness (liveness.py: heartbeats, barrier, stall and overrun deadlines, suspected links), and the
planners (planners/: a PlannerSpec per scheme). What is left here is the job's course.

Version rule (one mechanism for every scheme): at the start of round r each agent asks which
version r uses; the first request for r freezes the answer for everyone, so a round never mixes
versions. Re-planning (adaptive schemes, when the view moved by more than `update_rate`) only
ever affects rounds not yet frozen.

The answer goes out once every participant has asked (BSP: nobody can compute round r before it
holds round r-1's result anyway). Synchronization then starts together, so a round's time is the
synchronization itself and not the previous round's broadcast tail seen by an early finisher.

Public API for launchers (wansync/): start/shutdown, wait_agents, run_job, send (to one agent),
job_t0, subscribe/note_event (events and the timeline), stage/push_aux (operator overrides).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgpack

from overlay.auth import TlsFiles
from overlay.messages import (
    Abort,
    AuxUpdate,
    Counters,
    Fence,
    Heartbeat,
    ProtocolError,
    Record,
    Register,
    Report,
    RoundDone,
    Shutdown,
    Stats,
    TopoReply,
    TopoRequest,
)
from overlay.messages import Job as JobMsg

from . import planners
from .liveness import Liveness
from .plan import Job, Plan, PlanError, aux_to_wire
from .registry import AgentInfo, Registry
from .rounds import JobState, RoundRecord
from .server import ControlServer
from .view import DisconnectedView, NetworkView

__all__ = ["AgentInfo", "JobState", "RoundRecord", "Scheduler"]

log = logging.getLogger("wansync.scheduler")

Event = Callable[[str, dict[str, Any]], None]
BSP_AHEAD = 1  # rounds an agent may receive frames for beyond its own: BSP starts r+1 once r ended everywhere


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
    async def run_job(self, scheme: str, *, rounds: int, params: int, chunk_params: int, compute_s: float = 0.0,
                      options: dict[str, Any] | None = None, warmup: int = 0, t0: float | None = None) -> JobState:
        """Run `warmup + rounds` synchronized rounds of one scheme on every agent; return its records."""
        spec = planners.resolve(scheme)
        self.job_id += 1
        job = Job(params, chunk_params, tuple(sorted(self.agents)), {**(options or {}), **spec.options})
        memory: dict[str, Any] = {}  # what the planner keeps between its plans for this job
        t = time.perf_counter()
        plan = self._publish(spec.plan(self.view, job, memory))
        js = JobState(self.job_id, scheme, rounds + warmup, job, plan, warmup, planner=spec, memory=memory,
                      view_at_plan=self.view.snapshot(), policy_s=time.perf_counter() - t,
                      t0=time.time() if t0 is None else t0, last_plan_t=time.time(), avoid=self.view.unusable())
        self.current = js
        js.job_msg = JobMsg(job=js.job, scheme=scheme, rounds=js.rounds, params=params, compute_s=compute_s,
                            t0=js.t0, warmup=warmup, ahead=BSP_AHEAD).wire()
        for a in list(self.agents.values()):
            self.registry.send(a, js.job_msg)
        self.on_event("job", {"job": js.job, "scheme": scheme, "rounds": js.rounds, "version": js.plan.version,
                              "t0": js.t0})
        self.note_event("job", job=js.job, scheme=scheme, rounds=js.rounds, version=js.plan.version)
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
        if (refresh is None or time.time() - js.last_aux_t < self.update_time
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

    def _version_for(self, js: JobState, rnd: int) -> int:
        """First request for a round freezes its version; adaptive schemes may re-plan just before."""
        r = js.round(rnd)
        if r.version is not None:
            return r.version
        # an agent that rejoined mid-job takes part from the round it was told to start at
        alive = tuple(sorted(n for n in self.agents if js.joins.get(n, 0) <= rnd))
        avoid = self.view.unusable()
        if alive != js.spec.participants or avoid != js.avoid:  # lost, back, or a link suspected dead
            self._replan_members(js, alive, avoid)
        elif (js.planner is not None and js.planner.adaptive and rnd > 0
                and time.time() - js.last_plan_t >= self.update_time
                and self.view.changed_since(js.view_at_plan, self.update_rate)):
            t = time.perf_counter()
            new = js.planner.plan(self.view, js.spec, js.memory)
            js.policy_s += time.perf_counter() - t
            js.replans += 1
            js.view_at_plan = self.view.snapshot()
            js.last_plan_t = time.time()
            if not new.same_policy(js.plan):
                js.plan = self._publish(new)
        r.version = js.plan.version
        return r.version

    def try_start(self, js: JobState, rnd: int, asking: int | None = None) -> None:
        """Freeze the round's version (re-planning first if members or usable links changed) and start
        it once every member asked. Blocked while no plan connects the members (a lost node or
        suspected links cut them apart): the watchdog tries again as the cluster changes."""
        r = js.round(rnd)
        try:
            v = self._version_for(js, rnd)
        except (DisconnectedView, PlanError, ValueError) as exc:
            if r.blocked != str(exc):
                log.warning("job %d round %d waits: no plan for its members (%s)", js.job, rnd, exc)
                self.note_event("blocked", job=js.job, round=rnd, why=str(exc))
            r.blocked = str(exc)
            return
        r.blocked = None
        members = set(self.plans[v].participants)
        asked = r.asked if r.asked is not None else {}
        for node in [n for n in asked if n not in members]:
            del asked[node]  # joined after this round was frozen (it sits this one out), or lost since
            if node in self.agents:
                self.registry.send(self.agents[node], TopoReply(job=js.job, round=rnd, version=v, attempt=r.attempt,
                                                                skip=True))
        if asking is not None:
            self.on_event("topo_request", {"node": asking, "round": rnd, "version": v})
        if not members <= set(asked):
            return
        for node, have in asked.items():
            reply = TopoReply(job=js.job, round=rnd, version=v, attempt=r.attempt, avoid=js.avoid,
                              plan=None if v in have else self.plans[v].to_wire())
            self.registry.send(self.agents[node], reply)
        r.start(time.time())

    def _replan_members(self, js: JobState, alive: tuple[int, ...], avoid: list[list[int]]) -> None:
        """Plan for the living on what is usable; all or nothing (a planner may find no plan)."""
        old = js.spec.participants
        options = dict(js.spec.options)
        if options.get("hub") is not None and options["hub"] not in alive:
            del options["hub"]  # the chosen hub is lost: the planner picks the best one alive
        spec = dataclasses.replace(js.spec, participants=alive, options=options)
        memory: dict[str, Any] = {}  # frozen roots may be gone: choose again among the living
        assert js.planner is not None
        t = time.perf_counter()
        plan = js.planner.plan(self.view, spec, memory)
        js.policy_s += time.perf_counter() - t
        js.spec, js.avoid, js.memory = spec, avoid, memory
        js.plan = self._publish(plan)
        js.replans += 1
        js.view_at_plan = self.view.snapshot()
        js.last_plan_t = time.time()
        self.note_event("membership", job=js.job, was=list(old), now=list(alive), version=js.plan.version,
                        avoid=js.avoid)

    def _record(self, js: JobState, rnd: int) -> None:
        """Every member of the round reported: its record (with the simulator's prediction)."""
        r = js.by_round[rnd]
        members = self.plans[r.version].participants if r.version is not None else js.spec.participants
        if len(r.done) < len(members):
            return
        r.started_t = None
        rec = r.record(js, members, self.view.coverage())
        if self.predict is not None and rec.version in self.plans:
            rec.prediction_s = self.predict(self.plans[rec.version], rec.t_start - js.t0)
        js.records.append(rec)
        r.recorded_t = time.time()
        self.on_event("round", rec.to_json())
        self._maybe_finish(js)

    def _maybe_finish(self, js: JobState) -> None:
        """Done when every round is recorded and every agent still here sent its job stats."""
        if len(js.records) == js.rounds and all(n in js.stats for n in self.agents):
            js.finished.set()

    # --- failures ---------------------------------------------------------------------------------
    def lose(self, node: int, why: str) -> None:
        """Declare an agent gone: fence its incarnation, abort the round it was part of, re-plan."""
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
        for r in sorted(js.by_round.values(), key=lambda r: r.number):
            if r.version is not None and r.recorded_t is None and node in self.plans[r.version].participants:
                self.abort(js, r.number, f"agent {node} lost: {why}")

    def abort(self, js: JobState, rnd: int, why: str) -> None:
        """The round's current attempt cannot end exact: everyone drops it and retries on a new plan."""
        r = js.round(rnd)
        t_start = r.started_t
        att = r.abort()
        js.aborts.append({"round": rnd, "attempt": att, "why": why, "t": time.time(), "t_start": t_start})
        log.warning("job %d round %d attempt %d aborted: %s", js.job, rnd, att, why)
        self.note_event("abort", job=js.job, round=rnd, attempt=att, why=why)
        self.registry.broadcast(Abort(job=js.job, round=rnd, attempt=att))

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
        return {Register: self._on_register, TopoRequest: registered(self._on_topo_request),
                Report: registered(self._on_report), RoundDone: registered(self._on_round_done),
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
        self.view.add_node(a.node)
        self.view.node_up(a.node)
        for n in a.neighbors:
            self.view.add_link(a.node, n)
        self.on_event("agent", {"node": a.node, "neighbors": a.neighbors})
        if self.registry.complete.is_set():  # a restarted agent: everyone learns where it is now
            self._rejoin(a)

    def _on_topo_request(self, a: AgentInfo, msg: TopoRequest) -> None:
        js = self.current
        if js is None or msg.job != js.job:
            self.registry.send(a, Abort(job=msg.job, round=msg.round, attempt=0))
            return
        rnd, attempt = msg.round, msg.attempt or 0
        if rnd >= js.rounds:
            raise ProtocolError(f"round {rnd} of job {js.job}, which has {js.rounds}", field="round", msg_type=msg.T)
        r = js.round(rnd)
        if attempt != r.attempt:
            # an aborted attempt: say so again (an agent that rejoined never got that ABORT)
            self.registry.send(a, Abort(job=js.job, round=rnd, attempt=r.attempt - 1))
            return
        if not self.consistency:
            v = js.plan.version
            have = set(msg.have or ())
            self.registry.send(a, TopoReply(job=js.job, round=rnd, version=v,
                                            plan=None if v in have else self.plans[v].to_wire()))
            self.on_event("topo_request", {"node": a.node, "round": rnd, "version": v})
            return
        r.ask(a.node, set(msg.have or ()), time.time())
        self.try_start(js, rnd, a.node)

    def _on_report(self, a: AgentInfo, msg: Report) -> None:
        for src, dst, _, _ in msg.samples:  # the schema checked shapes and values
            if dst != a.node or src not in a.neighbors:  # samples are taken by the receiver of a link
                raise ProtocolError(f"sample of link {src}->{dst}, not a link into node {a.node}",
                                    field="samples", msg_type=msg.T)
        for src, dst, nbytes, seconds in msg.samples:
            self.view.observe(src, dst, nbytes, seconds)
        self.on_event("samples", {"node": a.node, "samples": msg.samples})
        if self.current is not None:
            self._maybe_refresh_aux(self.current)

    def _on_round_done(self, a: AgentInfo, msg: RoundDone) -> None:
        js = self.current
        if js is None or msg.job != js.job:
            return
        r = js.round(msg.round) if not self.consistency and msg.round < js.rounds else js.by_round.get(msg.round)
        if r is None or msg.attempt != r.attempt or (self.consistency and r.version is None):
            return  # finished an attempt that was aborted meanwhile (or a round that never began)
        r.done[a.node] = msg
        if not msg.ok:
            self.errors.append(f"node {a.node} job {js.job} round {msg.round}: {msg.error or 'wrong result'}")
        self._record(js, msg.round)

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
