"""The chunk engine: executes any valid Plan, chunk by chunk, without knowing which scheme made it.

A plan runs as a *task* (a BSP round is the task "everyone contributes, everyone receives"); a node
may run several tasks at once, each keyed (job, task, attempt, version) on the wire, each run here by
its own TaskPart (agents.taskpart: this node's roles, accumulator, checks and single end). The engine
is the overlay's sink for chunks addressed to this node and keeps what is shared by the parts:
routing (routes around suspect links, NetStorm's auxiliary routes picked by core.dispatch, the
scheduler's per-flow rates), admission (which jobs and tasks this node expects frames of now) and
the stash (frames for a task not begun yet, held within a memory budget, else refused and resent).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from core.classes import MBIT
from core.dispatch import DISPATCH, Dispatch
from core.plan import AuxTable, Plan, aux_from_wire
from overlay.budget import MemoryBudget
from overlay.burstlog import BurstLog
from overlay.messages import ProtocolError
from overlay.peers import HoldRefused, Overlay
from overlay.routing import Routes

from .scratch import RecycledArrays, ScratchPool
from .taskpart import TaskAborted, TaskKey, TaskPart

log = logging.getLogger("wansync.engine")

# Bytes this node may hold for others: frames for tasks it has not begun, and chunks it relays.
# Over budget a frame is refused unacknowledged and resent later.
HOLD_BUDGET = 256 << 20
MAX_RATE_TABLES = 1024  # task attempts whose RATES this node keeps (those that began are dropped at their end)
# Tasks beyond the window whose frames may still be held (per job): a node left out of many tasks (a
# straggler under a queue model) learns of its next one from the TASK, which its peers' frames may
# overtake. Holding them (within the budget) spares a refusal's reconnect and resend; the bound keeps
# what a peer sending frames of tasks that never come can park here to a few tasks' worth.
EARLY_TASKS = 4


class ChunkEngine:
    """One per agent: the overlay's sink for chunks addressed to this node."""

    def __init__(self, node: int, routes: Routes, *, dispatch: Dispatch = DISPATCH) -> None:
        self.node = node
        self.routes = routes
        self._all_routes = routes
        self._avoid: frozenset[tuple[int, int]] = frozenset()
        self.dispatch = dispatch
        self.aux_bytes = 0
        self.sent_bytes = 0
        self.overlay: Overlay | None = None
        self.tasks: dict[TaskKey, TaskPart] = {}
        self._stash: dict[TaskKey, list[tuple[dict[str, Any], bytes]]] = defaultdict(list)
        self.stashed_frames = 0  # frames that had to wait for their task or plan (cumulative)
        # one memory budget for what this node holds for others: frames held here for a task it has
        # not begun, and chunks relayed through here (the overlay shares it)
        self.budget = MemoryBudget(HOLD_BUDGET)
        self.jobs: dict[int, int] = {}  # job -> tasks beyond the newest begun here that may already send
        self.top: dict[int, int] = {}  # job -> the newest task begun or announced here (or the first expected)
        self.settled: dict[int, int] = {}  # job -> every task below it is over everywhere (the scheduler says)
        self.scratch = ScratchPool()  # partial sums' segments land here, and are added at once (TaskPart)
        self.arrays = RecycledArrays()  # task parts' accumulators and results, once nothing refers to them
        self.held_peak = 0  # most bytes ever held for tasks not begun (<= the budget + a frame per peer)
        self.hold_refused = 0  # segments refused for the budget (resent by their senders later)
        self.refused_frames = 0  # segments refused as unexpected (unknown job, task outside the window)
        self._held = 0  # bytes in the stash
        self._refused_from: dict[int, set[tuple[int, int]]] = {}  # peer -> (job, task)s refused
        self._burst = BurstLog(log)
        self.plans: dict[int, Plan] = {}  # every version this node holds (the agent fills it)
        self.aborted: dict[tuple[int, int], int] = {}  # (job, task) -> highest aborted attempt
        # per-flow rates the scheduler assigned (RATES, core.capshare), by task attempt: (tree,
        # this node, destination) -> bytes/s, 0 = held; they override a plan's own `rates`
        self.rate_tables: dict[tuple[int, int, int], dict[tuple[int, int, int], float]] = {}
        # auxiliary tables pushed by AUX_UPDATE after a version was published: version -> per group
        self.aux_tables: dict[int, tuple[AuxTable, ...]] = {}
        self._aux_wire: tuple[list[Any], tuple[AuxTable, ...]] = ([], ())  # the last update, as sent and parsed

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

    def set_aux_wire(self, version: int, groups: Sequence[Any]) -> None:
        """AUX_UPDATE's tables in their wire form. Every update carries every group's table, most of
        them as in the update before: only the groups whose wire form changed are parsed again."""
        last_wire, last = self._aux_wire
        tables = tuple(last[i] if i < len(last_wire) and g == last_wire[i] else aux_from_wire(g)
                       for i, g in enumerate(groups))
        self._aux_wire = (list(groups), tables)
        self.set_aux(version, tables)

    def aux_for(self, plan: Plan, group: int) -> AuxTable:
        pushed = self.aux_tables.get(plan.version)
        return pushed[group] if pushed is not None and group < len(pushed) else plan.groups[group].aux

    def send(self, part: TaskPart, tree: int, header: dict[str, Any], data: np.ndarray, dst: int) -> None:
        """One chunk of a task part to `dst`: routed around suspect links, by an auxiliary route while
        the primary is busy (core.dispatch), at the rate the scheduler or the plan gives its flow."""
        assert self.overlay is not None
        group = part.plan.groups[tree]
        rate_Bps = None
        if group.classed:
            assigned = self.rate_tables.get((part.job, part.task, part.attempt), {}).get((tree, self.node, dst))
            mbps = group.rates.get((self.node, dst))
            rate_Bps = assigned if assigned is not None else None if mbps is None else mbps * MBIT
        path = self.routes.route(self.node, dst)
        aux = self.dispatch.pick(path, self.aux_for(part.plan, tree).get((self.node, dst)), self.overlay.in_transit)
        if aux is not None:  # source-routed: relays only forward
            path = aux
            self.aux_bytes += data.nbytes
        self.sent_bytes += data.nbytes
        self.overlay.send_chunk(header, memoryview(data).cast("B"), path, rate_Bps=rate_Bps)

    def clock(self) -> float:
        """The wire clock (overlay.clock), or this host's where the engine runs without an overlay."""
        return self.overlay.clock() if self.overlay is not None else time.time()

    # --- task lifecycle ------------------------------------------------------------------------------
    def begin_task(self, job: int, task: int, attempt: int, plan: Plan, contribution: np.ndarray | None,
                   into: np.ndarray | None = None) -> TaskPart:
        """This node's part of a task: its own contribution goes in (members), held frames for this task
        are replayed, leaf chunks go out. `contribution`: None unless this node is a member; `into`:
        where its result should land (TaskPart)."""
        if job not in self.jobs:  # driven without an agent (tests): the job is announced by its first task
            self.open_job(job, task)
        part = TaskPart(self, job, task, attempt, plan, contribution, self.clock(), into)
        self.tasks[part.key] = part
        self.top[job] = max(self.top.get(job, task), task)
        for h, data in self._unstash(part.key):
            try:
                part.check(h)  # held frames were never checked against the plan: check now
            except ProtocolError as exc:
                log.warning("node %d: dropped a held frame: %s", self.node, exc)
                continue
            part.receive(h, memoryview(data))
        self._ask_resend()
        part.begin()
        return part

    def end_task(self, part: TaskPart) -> None:
        """Forget a part that ended (its outcome taken): its frames are no longer expected here."""
        self.tasks.pop(part.key, None)
        self.rate_tables.pop((part.job, part.task, part.attempt), None)
        if part.external and self.overlay is not None:  # its memory goes back to its owner: no late byte lands
            self.overlay.let_go(part.result)

    def abort(self, job: int, task: int, attempt: int) -> None:
        """Attempts up to `attempt` of this task end now; their frames, held or late, are dropped."""
        self.aborted[(job, task)] = max(attempt, self.aborted.get((job, task), -1))
        for key, part in list(self.tasks.items()):
            if key[:2] == (job, task) and key[2] <= attempt:
                part.end(TaskAborted(f"job {job} task {task} attempt {key[2]} aborted"))
        for k in [k for k in self._stash if k[:2] == (job, task) and k[2] <= attempt]:
            self._unstash(k)

    def drop_receiver(self, part: TaskPart, node: int) -> None:
        """`node` left the task's receivers (TaskPart.drop_receiver); where that ends this node's part,
        its attempt is aborted here, so its frames are dropped from now on."""
        if part.drop_receiver(node):
            self.abort(part.job, part.task, part.attempt)

    def drop_stale(self, job: int, task: int) -> None:
        """Forget held frames of tasks before `task` (they can no longer start); `task` is expected next."""
        self.top[job] = task
        for k in [k for k in self._stash if (k[0], k[1]) < (job, task)]:
            self._unstash(k)

    def holds(self, part: TaskPart) -> bool:
        return self.tasks.get(part.key) is part

    def others(self, part: TaskPart) -> dict[int, int]:
        """Bytes received so far of each other task of its job in flight here."""
        return {o.task: o.rx_bytes for o in self.tasks.values()
                if o.job == part.job and o.task != part.task and o.rx_bytes and not o.done.done()}

    # --- ChunkSink -------------------------------------------------------------------------------------
    def chunk_buffer(self, h: dict[str, Any]) -> memoryview | None:
        part = self.tasks.get((h["job"], h["task"], h["attempt"], h["version"]))
        if part is None:
            self._may_hold(h)
            return None  # held until this node has the task and its plan
        return part.buffer(h)

    def chunk_segment(self, h: dict[str, Any], payload: memoryview) -> None:
        key = (h["job"], h["task"], h["attempt"], h["version"])
        part = self.tasks.get(key)
        if part is None and key[2] <= self.aborted.get(key[:2], -1):
            return  # a late frame of an aborted attempt
        if part is None:
            self._stash[key].append((h, bytes(payload)))
            self.stashed_frames += 1
            self.budget.take(_sender(h), len(payload))
            self._held += len(payload)
            self.held_peak = max(self.held_peak, self._held)
            return
        part.receive(h, payload)

    # --- which traffic this node expects: jobs and the tasks their progress model allows -------------
    def open_job(self, job: int, first_task: int = 0, ahead: int = 1) -> None:
        """Frames of `job` are welcome from now on, for tasks from the one before the oldest still
        running here (relays finish it for others) up to `ahead` beyond the newest begun (the progress
        model's window: BSP runs one round ahead at most). Every other job's traffic is refused."""
        if job not in self.jobs:
            self.top = {job: first_task}
            self.settled = {}
            for k in [k for k in self._stash if k[0] != job]:  # refused from now on: what was held goes
                self._unstash(k)
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
            for k in [k for k in self._stash if k[0] == job and k[1] < self.settled[job] - 1]:
                self._unstash(k)  # over everywhere: never begun here

    def _outside(self, h: dict[str, Any], *, early: bool = False) -> str | None:
        """Why this node expects no frame like `h` now, or None. The task before the oldest running here
        is still expected: others may finish it (through us) after we did, or abort it and make us go back.
        `early`: a frame beyond the window is expected too while at most EARLY_TASKS such tasks are held."""
        job, task = h["job"], h["task"]
        ahead = self.jobs.get(job)
        if ahead is None:
            return f"job {job} is not running here"
        top = self.top.get(job, 0)
        low = min((k[1] for k in self.tasks if k[0] == job), default=top)
        if job in self.settled:  # concurrent tasks: others still run tasks this node relays for
            low = min(low, self.settled[job])
        if task > top + ahead and not (early and self._early_room(job, task, top + ahead)):
            return f"task {task} is more than {ahead} ahead of task {top}"
        if task < low - 1:
            return f"task {task} is over (this node is at task {low})"
        return None

    def _early_room(self, job: int, task: int, edge: int) -> bool:
        """Whether frames of `task` (beyond `edge`, the window's end) may be held: it is already one of
        the held tasks beyond the window, or fewer than EARLY_TASKS are."""
        beyond = {k[1] for k in self._stash if k[0] == job and k[1] > edge}
        return task in beyond or len(beyond) < EARLY_TASKS

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
        why = self._outside(h, early=True)
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


def _sender(h: dict[str, Any]) -> int:
    """The neighbour a frame came from (the hop before this node on its route)."""
    return h["path"][h["hop"]]
