"""The chunk engine: executes any valid Plan, chunk by chunk, without knowing which scheme made it.

A plan runs as a *task* (a BSP round is the task "everyone contributes, everyone receives"); a node
may run several tasks at once, each keyed (job, task, attempt, version) on the wire. Per chunk a
node knows its role from the plan: as a member it contributes (weighted); in the aggregation tree
it waits for its children and forwards the partial sum to its parent only once every child arrived
(aggregate-forward), or, as the root, checks that every member is in the sum; in the broadcast tree
it passes the final value on to its children; as a receiver it keeps the result. A node outside
the members may aggregate (an inner node, or the root) or replicate (an inner broadcast node)
without contributing. Partial sums are added in place with numpy as their segments land; final
values land directly in the result tensor. Every frame carries its contributor set, so a doubled,
stale or missing contribution is caught, not summed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from overlay.budget import MemoryBudget
from overlay.burstlog import BurstLog
from overlay.classes import MBIT, TrafficClass
from overlay.messages import ProtocolError, bitmap, bitmap_bytes, bitmap_int, chunk_header
from overlay.peers import HoldRefused, Overlay
from overlay.routing import Routes
from scheduler.plan import AuxTable, Plan

log = logging.getLogger("wansync.engine")

TaskKey = tuple[int, int, int, int]  # job, task, attempt, version


class TaskError(RuntimeError):
    """The task cannot end exact (a contribution doubled or missing); it must be aborted."""


class TaskAborted(RuntimeError):
    """The scheduler aborted this attempt (an agent was lost, or the task stalled); it is retried."""


@dataclass
class _Role:
    """What this node does for one chunk group."""

    group: int
    in_agg: bool  # a node of the aggregation tree (member, aggregator or root)
    parent: int | None  # None: the root, or not in the aggregation tree
    agg_children: frozenset[int]
    in_bcast: bool  # holds the final value: the root, or a node the broadcast tree reaches
    bcast_parent: int | None
    bcast_children: tuple[int, ...]

    @property
    def duties(self) -> int:
        """Per chunk: forward the partial sum (non-root aggregation nodes); hold and pass on the final value."""
        return int(self.in_agg and self.parent is not None) + int(self.in_bcast)


@dataclass
class TaskState:
    job: int
    task: int
    attempt: int
    plan: Plan
    member: bool
    receiver: bool
    acc: np.ndarray
    result: np.ndarray
    roles: dict[int, _Role]  # by group index
    chunk_group: list[int]
    everyone: int  # bitmap of all members: what every final value must hold
    waiting: list[int]  # per chunk: agg children not yet complete
    contributors: list[int]  # per chunk: bitmap summed into acc so far
    pending: int = 0  # duties left (see _Role.duties); the task is done here at 0
    agg_bytes: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    final_bytes: list[int] = field(default_factory=list)
    started: bool = False
    t_begin: float = 0.0  # when this node began it, on the wire clock (a class's deadline counts from it)
    rx_bytes: int = 0  # data bytes of this task received here (partial sums and final values)
    # the bytes received here of each other task of its job in flight here, when this task's first
    # byte came and when its part here was done: how links were shared between them, in bytes
    # (scripts/bench/tasks.py's share figure)
    beside: dict[int, list[int]] = field(default_factory=dict)  # task -> [bytes at our first byte, at our end]
    _first: dict[int, int] | None = None  # the others' bytes when this task's first byte came
    arrival: dict[tuple[int, str], float] = field(default_factory=dict)  # (tree, kind) -> its first chunk here (fcfs)
    own: np.ndarray | None = None  # a member's weighted contribution, sent as is (all-to-all groups)
    on_done: Callable[[TaskState], None] | None = None
    done: asyncio.Future = field(default_factory=lambda: outcome_future())

    @property
    def key(self) -> TaskKey:
        return (self.job, self.task, self.attempt, self.plan.version)

    def _duty_done(self) -> None:
        self.pending -= 1
        if self.pending == 0 and not self.done.done():
            if self.on_done is not None:
                self.on_done(self)
            self.done.set_result(self.result if self.receiver else None)


# Bytes this node may hold for others: frames for tasks it has not begun, and chunks it relays.
# Over budget a frame is refused unacknowledged and resent later.
HOLD_BUDGET = 256 << 20
MAX_RATE_TABLES = 1024  # task attempts whose RATES this node keeps (those that began are dropped at their end)
PRIMARY_BUSY_BOUND = 2  # NetStorm's best setting (Fig. 17)
AUXILIARY_QUEUE_LENGTH = 5
LEAF_SLICE = 8  # leaf chunks sent per turn of the event loop when a task begins (_release)


class ChunkEngine:
    """One per agent: the overlay's sink for chunks addressed to this node."""

    def __init__(self, node: int, routes: Routes, *, primary_busy_bound: int = PRIMARY_BUSY_BOUND,
                 aux_queue_length: int = AUXILIARY_QUEUE_LENGTH) -> None:
        self.node = node
        self.routes = routes
        self._all_routes = routes
        self._avoid: frozenset[tuple[int, int]] = frozenset()
        self.primary_busy_bound = primary_busy_bound
        self.aux_queue_length = aux_queue_length
        self.aux_bytes = 0
        self.sent_bytes = 0
        self.overlay: Overlay | None = None
        self.tasks: dict[TaskKey, TaskState] = {}
        self._stash: dict[TaskKey, list[tuple[dict[str, Any], bytes]]] = defaultdict(list)
        self.stashed_frames = 0  # frames that had to wait for their task or plan (cumulative)
        # one memory budget for what this node holds for others: frames held here for a task it has
        # not begun, and chunks relayed through here (the overlay shares it)
        self.budget = MemoryBudget(HOLD_BUDGET)
        self.jobs: dict[int, int] = {}  # job -> tasks beyond the newest begun here that may already send
        self.top: dict[int, int] = {}  # job -> the newest task begun or announced here (or the first expected)
        self.settled: dict[int, int] = {}  # job -> every task below it is over everywhere (the scheduler says)
        self.held_peak = 0  # most bytes ever held for tasks not begun (<= the budget + a frame per peer)
        self.hold_refused = 0  # segments refused for the budget (resent by their senders later)
        self.refused_frames = 0  # segments refused as unexpected (unknown job, task outside the window)
        self._held = 0  # bytes in the stash
        self._refused_from: dict[int, set[tuple[int, int]]] = {}  # peer -> (job, task)s refused
        self._burst = BurstLog(log)
        self.on_error: Callable[[TaskKey, Exception], None] | None = None
        self.plans: dict[int, Plan] = {}  # every version this node holds (the agent fills it)
        self.aborted: dict[tuple[int, int], int] = {}  # (job, task) -> highest aborted attempt
        # per-flow rates the scheduler assigned (RATES, sim.capshare), by task attempt: (tree,
        # this node, destination) -> bytes/s, 0 = held; they override a plan's own `rates`
        self.rate_tables: dict[tuple[int, int, int], dict[tuple[int, int, int], float]] = {}
        # auxiliary tables pushed by AUX_UPDATE after a version was published: version -> per group
        self.aux_tables: dict[int, tuple[AuxTable, ...]] = {}

    def avoid_links(self, links: Iterable[Sequence[int]]) -> None:
        """Links the scheduler suspects dead (a blackhole): this task's chunks route around them.
        Only senders pick routes (relays follow the source route), so this is safe mid-flight."""
        avoid = frozenset(tuple(sorted((int(a), int(b)))) for a, b in links)
        if avoid == self._avoid:
            return
        self._avoid = avoid
        if not avoid:
            self.routes = self._all_routes
            return
        adj = {n: {m for m in peers if tuple(sorted((n, m))) not in avoid} for n, peers in self._all_routes.adj.items()}
        self.routes = Routes(adj)

    def set_rates(self, job: int, task: int, attempt: int, rates: Iterable[Sequence[Any]]) -> None:
        """Per-flow rates for this node's flows of a task attempt ([tree, a, b, Mbit/s], a == this
        node; others are not ours and ignored), kept for chunks not sent yet and applied at once to
        those queued. They may come before the task begins here (they go out just before TASK)."""
        table = self.rate_tables.setdefault((job, task, attempt), {})
        while len(self.rate_tables) > MAX_RATE_TABLES:  # tasks that never began here: oldest first
            self.rate_tables.pop(next(iter(self.rate_tables)))
        for tree, a, b, mbps in rates:
            if a != self.node:
                continue
            table[(tree, a, b)] = mbps * MBIT
            if self.overlay is not None:
                self.overlay.set_flow_rate(job, task, attempt, tree, b, mbps * MBIT)

    def set_aux(self, version: int, groups: tuple[AuxTable, ...]) -> None:
        """New auxiliary tables take effect for the next chunk sent; chunks in flight keep their route."""
        self.aux_tables[version] = groups

    def aux_for(self, plan: Plan, group: int) -> AuxTable:
        pushed = self.aux_tables.get(plan.version)
        return pushed[group] if pushed is not None and group < len(pushed) else plan.groups[group].aux

    def table_route(self, h: dict[str, Any]) -> tuple[int, ...]:
        """Where this node's own auxiliary table sends a chunk it relays: the rest of a route through
        this node, or the min-hop route. Only for reproducing Fig. 10's loop (relaying by table);
        normally relays follow the source route in the header."""
        origin, dst = h["path"][0], h["path"][-1]
        plan = self.plans.get(h["version"])
        if plan is not None:
            group = next((gi for gi, g in enumerate(plan.groups) if h["chunk"] in g.chunks), None)
            for r in self.aux_for(plan, group).get((origin, dst), ()) if group is not None else ():
                if self.node in r[:-1]:
                    return r[r.index(self.node):]
        return self.routes.route(self.node, dst)

    # --- task lifecycle ------------------------------------------------------------------------------
    def begin_task(self, job: int, task: int, attempt: int, plan: Plan, contribution: np.ndarray | None) -> TaskState:
        """This node's part of a task: its own contribution goes in (members), leaf chunks go out,
        held frames for this task are replayed. `contribution`: None unless this node is a member."""
        me = self.node
        if job not in self.jobs:  # driven without an agent (tests): the job is announced by its first task
            self.open_job(job, task)
        member, receiver = me in plan.participants, me in plan.receiver_set
        roles: dict[int, _Role] = {}
        for gi, g in enumerate(plan.groups):
            if g.direct:  # all-to-all: a receiver sums what every other member sends it, itself
                mine = me in plan.receiver_set
                kids = frozenset(g.agg_children(me)) if mine else frozenset()
                roles[gi] = _Role(gi, mine, None, kids, mine, None, ())
                continue
            in_agg = me in g.parent
            in_bcast = me == g.root or g.bcast_parent(me) is not None
            roles[gi] = _Role(gi, in_agg, g.parent.get(me), frozenset(g.agg_children(me)) if in_agg else frozenset(),
                              in_bcast, g.bcast_parent(me), tuple(g.children.get(me, ())))
        if not any(r.in_agg or r.in_bcast for r in roles.values()) and not member and not receiver:
            raise ValueError(f"node {me} has no role in plan v{plan.version}")
        if member:
            if contribution is None or contribution.shape != (plan.params,) or contribution.dtype != np.float32:
                raise ValueError(f"a member's contribution must be float32 of {plan.params} elements")
            w = plan.weights[me]
            acc = contribution.copy() if w == 1.0 else (contribution * np.float32(w))
        else:
            aggregates = any(r.in_agg for r in roles.values())
            acc = np.zeros(plan.params if aggregates else 0, np.float32)
        chunk_group = [0] * len(plan.layout)
        waiting = [0] * len(plan.layout)
        pending = 0
        for gi, g in enumerate(plan.groups):
            for c in g.chunks:
                chunk_group[c] = gi
                waiting[c] = len(roles[gi].agg_children)
            pending += roles[gi].duties * len(g.chunks)
        needs_result = receiver or any(r.in_bcast for r in roles.values())
        st = TaskState(job, task, attempt, plan, member, receiver, acc,
                       np.empty(plan.params if needs_result else 0, np.float32), roles, chunk_group,
                       bitmap_int(bitmap(plan.participants)), waiting,
                       [(1 << me) if member else 0] * len(plan.layout), pending=pending,
                       final_bytes=[0] * len(plan.layout))
        if member and any(g.direct for g in plan.groups):  # sent as is while others' parts add into acc
            st.own = acc.copy() if receiver else acc
        st.t_begin = self.overlay.clock() if self.overlay is not None else time.time()
        st.on_done = self._note_beside
        self.tasks[st.key] = st
        self.top[job] = max(self.top.get(job, task), task)
        for h, data in self._unstash(st.key):
            try:
                self.chunk_buffer(h)  # held frames were never checked against the plan: check now
                self._segment(st, h, memoryview(data))
            except ProtocolError as exc:
                log.warning("node %d: dropped a held frame: %s", self.node, exc)
            except TaskError as exc:
                self._fail(st, exc)
        self._ask_resend()
        st.started = True
        if st.own is not None:  # all-to-all: this member's chunks straight to every other receiver
            for g in plan.groups:
                for c in g.chunks if g.direct else ():
                    off, n = plan.layout[c]
                    for r in g.children.get(me, ()):
                        self._send(st, c, "agg", st.own[off:off + n], 1 << me, r)
        leaves = [c for c in range(len(plan.layout)) if roles[chunk_group[c]].in_agg and st.waiting[c] == 0]
        self._release(st, leaves, 0)
        if st.pending == 0 and not st.done.done():  # nothing to do here (a member that is no tree node)
            st.done.set_result(st.result if receiver else None)
        return st

    def _release(self, st: TaskState, leaves: list[int], start: int) -> None:
        """Send this node's leaf chunks LEAF_SLICE at a time, one slice per turn of the event loop. A
        plan of hundreds of chunks (aws10 packing: ~140 leaves per node per round) would otherwise
        queue them all in one stretch at every task's start, when every agent does the same at once:
        measured on aws10, loop-lag spikes over 20 ms fell from a median 6 to 3 per agent per run and
        the fidelity guard's verdict from 0 of 3 runs valid to 2 of 3. The links pace them anyway."""
        if st.done.done() or self.tasks.get(st.key) is not st:
            return  # aborted, failed or ended meanwhile: nothing more goes out for it
        end = min(start + LEAF_SLICE, len(leaves))
        for c in leaves[start:end]:
            self._complete_agg(st, c)
        if end < len(leaves):
            asyncio.get_running_loop().call_soon(self._release, st, leaves, end)

    def _others(self, st: TaskState) -> dict[int, int]:
        return {o.task: o.rx_bytes for o in self.tasks.values()
                if o.job == st.job and o.task != st.task and o.rx_bytes and not o.done.done()}

    def _note_beside(self, st: TaskState) -> None:
        first = st._first or {}
        st.beside = {t: [first.get(t, 0), n] for t, n in self._others(st).items()}

    def end_task(self, st: TaskState) -> None:
        self.tasks.pop(st.key, None)
        self.rate_tables.pop((st.job, st.task, st.attempt), None)

    def abort(self, job: int, task: int, attempt: int) -> None:
        """Attempts up to `attempt` of this task end now; their frames, held or late, are dropped."""
        self.aborted[(job, task)] = max(attempt, self.aborted.get((job, task), -1))
        for key, st in list(self.tasks.items()):
            if key[:2] == (job, task) and key[2] <= attempt and not st.done.done():
                st.done.set_exception(TaskAborted(f"job {job} task {task} attempt {key[2]} aborted"))
        for k in [k for k in self._stash if k[:2] == (job, task) and k[2] <= attempt]:
            self._unstash(k)

    def drop_receiver(self, st: TaskState, node: int) -> None:
        """`node` left the task's receivers (a multicast shrinks). This node, if it is the one, applies
        nothing: it keeps passing the value on where it has broadcast children, else its part ends
        here (its frames are dropped from now on); if this node broadcasts to it and it replicates
        for nobody in that tree, it stops."""
        if node == self.node:
            st.receiver = False
            if not any(r.bcast_children for r in st.roles.values()):
                self.abort(st.job, st.task, st.attempt)
            return
        for gi, role in st.roles.items():
            if node in role.bcast_children and not st.plan.groups[gi].children.get(node):
                st.roles[gi] = dataclasses.replace(role, bcast_children=tuple(k for k in role.bcast_children
                                                                             if k != node))

    def drop_stale(self, job: int, task: int) -> None:
        """Forget held frames of tasks before `task` (they can no longer start); `task` is expected next."""
        self.top[job] = task
        for k in [k for k in self._stash if (k[0], k[1]) < (job, task)]:
            self._unstash(k)

    # --- ChunkSink -------------------------------------------------------------------------------------
    def chunk_buffer(self, h: dict[str, Any]) -> memoryview | None:
        st = self.tasks.get((h["job"], h["task"], h["attempt"], h["version"]))
        if st is None:
            self._may_hold(h)
            return None  # held until this node has the task and its plan
        c = h["chunk"]
        if not 0 <= c < len(st.plan.layout):
            raise ProtocolError(f"chunk {c} is not in plan v{st.plan.version}", field="chunk", msg_type="CHUNK")
        off, n = st.plan.layout[c]
        if h["total"] != n * 4:
            raise ProtocolError(f"chunk {c} has {n * 4} bytes, not {h['total']}", field="total", msg_type="CHUNK")
        role = st.roles[st.chunk_group[c]]
        if h["kind"] == "agg":
            if h["origin"] not in role.agg_children:
                raise ProtocolError(f"node {h['origin']} is not an aggregation child of {self.node} for chunk {c}",
                                    field="origin", msg_type="CHUNK")
            return memoryview(np.empty(h["nbytes"] // 4, np.float32)).cast("B")
        if h["kind"] == "bcast":
            if h["origin"] != role.bcast_parent:
                raise ProtocolError(f"node {h['origin']} is not the broadcast parent of {self.node} for chunk {c}",
                                    field="origin", msg_type="CHUNK")
            start = off * 4 + h["off"]
            return memoryview(st.result).cast("B")[start:start + h["nbytes"]]
        raise ProtocolError(f"kind {h['kind']!r} is not used by plan v{st.plan.version}", field="kind",
                            msg_type="CHUNK")

    def chunk_segment(self, h: dict[str, Any], payload: memoryview) -> None:
        key = (h["job"], h["task"], h["attempt"], h["version"])
        st = self.tasks.get(key)
        if st is None and key[2] <= self.aborted.get(key[:2], -1):
            return  # a late frame of an aborted attempt
        if st is None:
            self._stash[key].append((h, bytes(payload)))
            self.stashed_frames += 1
            self.budget.take(_sender(h), len(payload))
            self._held += len(payload)
            self.held_peak = max(self.held_peak, self._held)
            return
        try:
            self._segment(st, h, payload)
        except TaskError as exc:
            self._fail(st, exc)

    # --- which traffic this node expects: jobs and the tasks their progress model allows -------------
    def open_job(self, job: int, first_task: int = 0, ahead: int = 1) -> None:
        """Frames of `job` are welcome from now on, for tasks from the one before the oldest still
        running here (relays finish it for others) up to `ahead` beyond the newest begun (the progress
        model's window: BSP runs one round ahead at most). Every other job's traffic is refused."""
        if job not in self.jobs:
            self.top = {job: first_task}
            self.settled = {}
        self.jobs = {job: ahead}

    def note_task(self, job: int, task: int, settled: int | None) -> None:
        """A TASK of `job` arrived (this node may only relay for it): frames up to it and the window
        beyond are expected; tasks from `settled` on may still run somewhere, so their frames are too,
        though this node runs none of them."""
        if job not in self.jobs:
            return
        self.top[job] = max(self.top.get(job, task), task)
        if settled is not None:
            self.settled[job] = max(self.settled.get(job, settled), settled)

    def _outside(self, h: dict[str, Any]) -> str | None:
        """Why this node expects no frame like `h` now, or None. The task before the oldest running here
        is still expected: others may finish it (through us) after we did, or abort it and make us go back."""
        job, task = h["job"], h["task"]
        ahead = self.jobs.get(job)
        if ahead is None:
            return f"job {job} is not running here"
        top = self.top.get(job, 0)
        low = min((k[1] for k in self.tasks if k[0] == job), default=top)
        if job in self.settled:  # concurrent tasks: others still run tasks this node relays for
            low = min(low, self.settled[job])
        if task > top + ahead:
            return f"task {task} is more than {ahead} ahead of task {top}"
        if task < low - 1:
            return f"task {task} is over (this node is at task {low})"
        return None

    def admit_relay(self, h: dict[str, Any], peer: int) -> None:
        why = self._outside(h)
        if why is not None:
            self._refuse(h, peer, why)

    def _refuse(self, h: dict[str, Any], peer: int, why: str) -> None:
        """Not stored, so never acknowledged: the sender keeps the chunk and resends it after the
        connection drops, which this node asks for when a task begins (`_ask_resend`)."""
        self.refused_frames += 1
        # the peer is to resend; the (job, task) it named is not kept: it may name a new one every frame
        self._refused_from.setdefault(peer, set())
        self._burst.log(logging.WARNING, "refused frames",
                        f"node {self.node}: refused frames from node {peer} (job {h['job']} task {h['task']}): {why}",
                        peer=peer)
        raise HoldRefused(why)

    # --- held frames: bounded memory, nothing lost ---------------------------------------------------
    @property
    def hold_budget(self) -> int:
        return self.budget.limit

    @hold_budget.setter
    def hold_budget(self, nbytes: int) -> None:
        self.budget.limit = nbytes

    def held_bytes(self) -> int:
        """Bytes of frames held for a task (or plan) this node has not begun yet."""
        return self._held

    def _may_hold(self, h: dict[str, Any]) -> None:
        """Refuse a frame for a task not begun yet when it is not expected, or holding it would
        exceed the node's memory budget (shared with relayed chunks) or the sender's share of it.

        Refused means not stored, hence never acknowledged: the sender keeps the chunk, and the
        overlay drops that connection when a task begins (`_ask_resend`), so the sender resends
        it from its start and the frames go straight into place (already held offsets are dropped
        as duplicates). Back-pressure (pausing the socket) is not used: the current task's frames
        on the same connection would wait behind the future ones, and the future task can only
        begin once the current one ends: a deadlock."""
        peer = _sender(h)
        why = self._outside(h)
        if why is not None:
            self._refuse(h, peer, why)
        if self.budget.room(peer, h["nbytes"]):
            return
        jt = (h["job"], h["task"])
        self.hold_refused += 1
        seen = self._refused_from.setdefault(peer, set())
        if jt not in seen:  # tasks within the window only (_outside): a few per peer
            seen.add(jt)
            self._burst.log(logging.WARNING, "hold budget full",
                            f"node {self.node}: hold budget full ({self.budget.used} of {self.budget.limit} bytes "
                            f"held, {self.budget.by_peer.get(peer, 0)} for node {peer}): refusing job {jt[0]} task "
                            f"{jt[1]} frames from node {peer} unacknowledged; they are resent when it begins",
                            peer=peer)
        raise HoldRefused(f"hold budget of {self.hold_budget} bytes full")

    def _unstash(self, key: tuple[int, int, int, int]) -> list[tuple[dict[str, Any], bytes]]:
        """Take a task's held frames out of the stash (to replay or drop): their bytes leave the budget."""
        frames = self._stash.pop(key, [])
        for h, data in frames:
            self.budget.give(_sender(h), len(data))
            self._held -= len(data)
        return frames

    def _ask_resend(self) -> None:
        """A task began: peers whose frames were refused resend everything unacknowledged (a reconnect)."""
        peers, self._refused_from = self._refused_from, {}
        for peer in peers:
            if self.overlay is not None:
                self.overlay.drop_connection(peer)

    # --- internals -------------------------------------------------------------------------------------
    def _segment(self, st: TaskState, h: dict[str, Any], payload: memoryview) -> None:
        if st._first is None:
            st._first = self._others(st)
        st.rx_bytes += h["nbytes"]
        c = h["chunk"]
        off, n = st.plan.layout[c]
        lo = off + h["off"] // 4
        hi = lo + h["nbytes"] // 4
        if h["kind"] == "agg":
            origin = h["origin"]
            got = st.agg_bytes[(c, origin)]
            if got == 0:
                theirs = bitmap_int(h["contributors"])
                if theirs & st.contributors[c]:
                    raise TaskError(f"chunk {c}: contributors {theirs:#x} from node {origin} overlap "
                                    f"{st.contributors[c]:#x} already summed")
                if theirs & ~st.everyone:
                    raise TaskError(f"chunk {c}: node {origin} sent contributions of non-members")
                st.contributors[c] |= theirs
            part = np.frombuffer(payload, dtype=np.float32)
            np.add(st.acc[lo:hi], part, out=st.acc[lo:hi])
            got += h["nbytes"]
            st.agg_bytes[(c, origin)] = got
            if got == n * 4:
                st.waiting[c] -= 1
                if st.waiting[c] == 0 and st.started:
                    self._complete_agg(st, c)
        else:  # bcast: bytes are already in place (chunk_buffer pointed into result)
            if payload.obj is not st.result:  # replayed from the stash: not yet in place
                st.result[lo:hi] = np.frombuffer(payload, dtype=np.float32)
            st.final_bytes[c] += h["nbytes"]
            if st.final_bytes[c] == n * 4:
                if bitmap_int(h["contributors"]) != st.everyone:
                    raise TaskError(f"chunk {c}: final value holds contributors "
                                    f"{bitmap_int(h['contributors']):#x}, expected {st.everyone:#x}")
                self._final(st, c)

    def _complete_agg(self, st: TaskState, c: int) -> None:
        role = st.roles[st.chunk_group[c]]
        off, n = st.plan.layout[c]
        if role.parent is not None:
            self._send(st, c, "agg", st.acc[off:off + n], st.contributors[c], role.parent)
            st._duty_done()
            return
        if st.contributors[c] != st.everyone:
            self._fail(st, TaskError(f"chunk {c}: root {self.node} aggregated {st.contributors[c]:#x}, "
                                     f"expected {st.everyone:#x}"))
            return
        st.result[off:off + n] = st.acc[off:off + n]
        self._final(st, c)

    def _final(self, st: TaskState, c: int) -> None:
        role = st.roles[st.chunk_group[c]]
        off, n = st.plan.layout[c]
        for child in role.bcast_children:
            self._send(st, c, "bcast", st.result[off:off + n], st.everyone, child)
        st._duty_done()

    def _send(self, st: TaskState, c: int, kind: str, data: np.ndarray, contributors: int, dst: int) -> None:
        assert self.overlay is not None
        header = chunk_header(job=st.job, task=st.task, attempt=st.attempt, version=st.plan.version, chunk=c,
                              kind=kind, origin=self.node, contributors=bitmap_bytes(contributors))
        gi = st.chunk_group[c]
        group = st.plan.groups[gi]
        rate_Bps = None
        if group.classed:  # its tree shares links by its class (overlay.classes), at every hop
            dl = None if group.deadline_s is None else st.t_begin + group.deadline_s
            if group.fcfs:  # flow-level FCFS: the flow's deadline is when its first chunk was ready here
                dl = st.arrival.setdefault((gi, kind), self.overlay.clock())
            header["cls"] = TrafficClass(group.weight, group.priority_of(kind), dl).to_wire(gi)
            assigned = self.rate_tables.get((st.job, st.task, st.attempt), {}).get((gi, self.node, dst))
            mbps = group.rates.get((self.node, dst))
            rate_Bps = assigned if assigned is not None else None if mbps is None else mbps * MBIT
        path = self.routes.route(self.node, dst)
        aux = self.aux_for(st.plan, gi).get((self.node, dst))
        if aux and self.overlay.in_transit(path) >= self.primary_busy_bound:
            # the primary is busy: the first auxiliary route with room takes it (source-routed, relays
            # only forward); when every one is full the chunk queues on the primary after all
            for route in aux:
                if self.overlay.in_transit(route) < self.aux_queue_length:
                    path = route
                    self.aux_bytes += data.nbytes
                    break
        self.sent_bytes += data.nbytes
        self.overlay.send_chunk(header, memoryview(data).cast("B"), path, rate_Bps=rate_Bps)

    def _fail(self, st: TaskState, exc: Exception) -> None:
        log.error("node %d task %s: %s", self.node, st.key, exc)
        if not st.done.done():
            st.done.set_exception(exc)
        if self.on_error is not None:
            self.on_error(st.key, exc)


def outcome_future() -> asyncio.Future:
    """A task's outcome. An ABORT may end it after whoever awaited it was cancelled (the agent is
    stopping): the exception is then nobody's, and must not be reported as never retrieved."""
    fut = asyncio.get_running_loop().create_future()
    fut.add_done_callback(_retrieve)
    return fut


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


def _sender(h: dict[str, Any]) -> int:
    """The neighbour a frame came from (the hop before this node on its route)."""
    return h["path"][h["hop"]]
