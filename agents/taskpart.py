"""This node's part of one running task: its roles, its accumulator, the checks on what it receives,
and its single end.

Per chunk a node knows its role from the plan: as a member it contributes (weighted); in the
aggregation tree it waits for its children and forwards the partial sum to its parent only once
every child arrived (aggregate-forward), or, as the root, checks that every member is in the sum; in
the broadcast tree it passes the final value on to its children; as a receiver it keeps the result.
A node outside the members may aggregate (an inner node, or the root) or replicate (an inner
broadcast node) without contributing. Partial sums are added in place with numpy as their segments
land (where a chunk has one child, as in a ring or a chain, its start value and each segment are
summed in one pass, at the root straight into the result); final values land directly in the result
tensor. Every frame carries its contributor set, so a
doubled, stale or missing contribution is caught, not summed. However the part ends (done, failed,
aborted), it ends through `end`, once; the chunk engine (agents.engine) routes what it sends.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from core.classes import TrafficClass
from core.plan import Plan
from overlay.messages import ProtocolError, bitmap, bitmap_bytes, bitmap_int, chunk_header

from .scratch import RecycledArrays, ScratchPool

log = logging.getLogger("wansync.engine")

TaskKey = tuple[int, int, int, int]  # job, task, attempt, version
LEAF_SLICE = 8  # leaf chunks sent per turn of the event loop when a task begins (TaskPart._release)


class TaskError(RuntimeError):
    """The task cannot end exact (a contribution doubled or missing); it must be aborted."""


class TaskAborted(RuntimeError):
    """The scheduler aborted this attempt (an agent was lost, or the task stalled); it is retried."""


class TaskHost(Protocol):
    """What a task part needs of the chunk engine that runs it."""

    node: int
    scratch: ScratchPool  # buffers for partial sums as they arrive
    arrays: RecycledArrays  # model-sized accumulators and results, used again

    def clock(self) -> float: ...

    def send(self, part: TaskPart, tree: int, header: dict[str, Any], data: np.ndarray, dst: int) -> None: ...

    def holds(self, part: TaskPart) -> bool: ...

    def others(self, part: TaskPart) -> dict[int, int]: ...


@dataclass(frozen=True)
class Role:
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


def roles_of(plan: Plan, me: int) -> dict[int, Role]:
    """Node `me`'s role in each chunk group of `plan`, by group index."""
    roles: dict[int, Role] = {}
    for gi, g in enumerate(plan.groups):
        if g.direct:  # all-to-all: a receiver sums what every other member sends it, itself
            mine = me in plan.receiver_set
            kids = frozenset(g.agg_children(me)) if mine else frozenset()
            roles[gi] = Role(gi, mine, None, kids, mine, None, ())
            continue
        in_agg = me in g.parent
        in_bcast = me == g.root or g.bcast_parent(me) is not None
        roles[gi] = Role(gi, in_agg, g.parent.get(me), frozenset(g.agg_children(me)) if in_agg else frozenset(),
                         in_bcast, g.bcast_parent(me), tuple(g.children.get(me, ())))
    return roles


class TaskPart:
    """One task attempt as this node runs it, from `begin` to `end`; `done` holds its outcome."""

    def __init__(self, host: TaskHost, job: int, task: int, attempt: int, plan: Plan,
                 contribution: np.ndarray | None, t_begin: float, into: np.ndarray | None = None) -> None:
        """`contribution`: None unless this node is a member. `into`: where the result should land, if
        this node holds one (float32 of the plan's size; a training script's result region, so the sum
        is received where the script reads it, with no copy); else one of the engine's own arrays.
        Raises ValueError where the plan gives this node no part, or a member's contribution does not
        fit the plan."""
        me = host.node
        self.host = host
        self.job, self.task, self.attempt, self.plan = job, task, attempt, plan
        self.member, self.receiver = me in plan.participants, me in plan.receiver_set
        self.roles = roles_of(plan, me)
        if not any(r.in_agg or r.in_bcast for r in self.roles.values()) and not self.member and not self.receiver:
            raise ValueError(f"node {me} has no role in plan v{plan.version}")
        if self.member:
            if contribution is None or contribution.shape != (plan.params,) or contribution.dtype != np.float32:
                raise ValueError(f"a member's contribution must be float32 of {plan.params} elements")
        # the accumulator starts as the (weighted) contribution, or zeros, one chunk at a time when the
        # chunk is first touched (agents/taskpart._acc): no model-sized copy on the loop at the start
        self._weight = plan.weights[me] if self.member else 1.0
        self._start = contribution if self.member else None
        aggregates = self.member or any(r.in_agg for r in self.roles.values())
        self.acc = host.arrays.empty(plan.params if aggregates else 0)
        self._acc_ready = bytearray(len(plan.layout))  # per chunk: acc holds its start value
        # per chunk: built segment by segment as its one agg child's bytes land, each in one numpy pass
        # (start + segment) instead of a copy of the start and an add; at a root straight into the result
        self._fused = bytearray(len(plan.layout))
        self.chunk_group = [0] * len(plan.layout)
        self.waiting = [0] * len(plan.layout)  # per chunk: agg children not yet complete
        self.pending = 0  # duties left (see Role.duties); this part is done at 0
        for gi, g in enumerate(plan.groups):
            for c in g.chunks:
                self.chunk_group[c] = gi
                self.waiting[c] = len(self.roles[gi].agg_children)
            self.pending += self.roles[gi].duties * len(g.chunks)
        self.duties = self.pending
        needs_result = self.receiver or any(r.in_bcast for r in self.roles.values())
        self.external = (needs_result and into is not None and into.shape == (plan.params,)
                         and into.dtype == np.float32)  # the result lives in memory the engine does not own
        self.result = into if self.external else host.arrays.empty(plan.params if needs_result else 0)
        self.everyone = bitmap_int(bitmap(plan.participants))  # what every final value must hold
        self.contributors = [(1 << me) if self.member else 0] * len(plan.layout)  # per chunk: summed into acc
        self.agg_bytes: dict[tuple[int, int], int] = defaultdict(int)  # (chunk, origin) -> bytes summed
        self.final_bytes = [0] * len(plan.layout)
        # a member's weighted contribution, sent as is to every other receiver (all-to-all groups)
        self.own: np.ndarray | None = None
        if self.member and any(g.direct for g in plan.groups):  # sent while others' parts add into acc
            for c in range(len(plan.layout)):
                self._acc(c)
            self.own = self.acc.copy() if self.receiver else self.acc
        self.started = False
        self.t_begin = t_begin  # when this node began it, on the wire clock (a class's deadline counts from it)
        self.rx_bytes = 0  # data bytes of this task received here (partial sums and final values)
        # the bytes received here of each other task of its job in flight here, when this task's first
        # byte came and when its part here was done: how links were shared between them, in bytes
        # (scripts/bench/tasks.py's share figure)
        self.beside: dict[int, list[int]] = {}  # task -> [bytes at our first byte, at our end]
        self._first: dict[int, int] | None = None  # the others' bytes when this task's first byte came
        self.arrival: dict[tuple[int, str], float] = {}  # (tree, kind) -> its first chunk here (fcfs)
        self.done: asyncio.Future = outcome_future()

    @property
    def key(self) -> TaskKey:
        return (self.job, self.task, self.attempt, self.plan.version)

    def begin(self) -> None:
        """Frames held for it are in: this member's chunks go out (all-to-all), and its leaf chunks."""
        self.started = True
        plan, me = self.plan, self.host.node
        if self.own is not None:  # all-to-all: this member's chunks straight to every other receiver
            for g in plan.groups:
                for c in g.chunks if g.direct else ():
                    off, n = plan.layout[c]
                    for r in g.children.get(me, ()):
                        self._send(c, "agg", self.own[off:off + n], 1 << me, r)
        leaves = [c for c in range(len(plan.layout))
                  if self.roles[self.chunk_group[c]].in_agg and self.waiting[c] == 0]
        self._release(leaves, 0)
        if self.pending == 0:  # nothing to do here (a member that is no tree node)
            self.end()

    def _release(self, leaves: list[int], start: int) -> None:
        """Send this node's leaf chunks LEAF_SLICE at a time, one slice per turn of the event loop. A
        plan of hundreds of chunks (aws10 packing: ~140 leaves per node per round) would otherwise
        queue them all in one stretch at every task's start, when every agent does the same at once:
        measured on aws10, loop-lag spikes over 20 ms fell from a median 6 to 3 per agent per run and
        the fidelity guard's verdict from 0 of 3 runs valid to 2 of 3. The links pace them anyway."""
        if self.done.done() or not self.host.holds(self):
            return  # aborted, failed or ended meanwhile: nothing more goes out for it
        end = min(start + LEAF_SLICE, len(leaves))
        for c in leaves[start:end]:
            self._complete_agg(c)
        if end < len(leaves):
            asyncio.get_running_loop().call_soon(self._release, leaves, end)

    # --- what arrives ---------------------------------------------------------------------------------
    def check(self, h: dict[str, Any]) -> None:
        """A frame's header against the plan and this node's roles (ProtocolError: not for us)."""
        c = h["chunk"]
        if not 0 <= c < len(self.plan.layout):
            raise ProtocolError(f"chunk {c} is not in plan v{self.plan.version}", field="chunk", msg_type="CHUNK")
        n = self.plan.layout[c][1]
        if h["total"] != n * 4:
            raise ProtocolError(f"chunk {c} has {n * 4} bytes, not {h['total']}", field="total", msg_type="CHUNK")
        role = self.roles[self.chunk_group[c]]
        if h["kind"] == "agg":
            if h["origin"] not in role.agg_children:
                raise ProtocolError(f"node {h['origin']} is not an aggregation child of {self.host.node} for "
                                    f"chunk {c}", field="origin", msg_type="CHUNK")
        elif h["kind"] == "bcast":
            if h["origin"] != role.bcast_parent:
                raise ProtocolError(f"node {h['origin']} is not the broadcast parent of {self.host.node} for "
                                    f"chunk {c}", field="origin", msg_type="CHUNK")
        else:
            raise ProtocolError(f"kind {h['kind']!r} is not used by plan v{self.plan.version}", field="kind",
                                msg_type="CHUNK")

    def buffer(self, h: dict[str, Any]) -> memoryview:
        """Where a checked frame's bytes go: a scratch buffer for a partial sum, the result for a final value."""
        self.check(h)
        if h["kind"] == "agg":
            return self.host.scratch.take(h["nbytes"])
        start = self.plan.layout[h["chunk"]][0] * 4 + h["off"]
        return memoryview(self.result).cast("B")[start:start + h["nbytes"]]

    def receive(self, h: dict[str, Any], payload: memoryview) -> None:
        """A segment of a checked frame: summed, or kept as the final value; a broken contract fails the part."""
        try:
            self._segment(h, payload)
        except TaskError as exc:
            self.end(exc)

    def _segment(self, h: dict[str, Any], payload: memoryview) -> None:
        if self._first is None:
            self._first = self.host.others(self)
        self.rx_bytes += h["nbytes"]
        c = h["chunk"]
        off, n = self.plan.layout[c]
        lo = off + h["off"] // 4
        hi = lo + h["nbytes"] // 4
        if h["kind"] == "agg":
            origin = h["origin"]
            got = self.agg_bytes[(c, origin)]
            if got == 0:
                theirs = bitmap_int(h["contributors"])
                if theirs & self.contributors[c]:
                    raise TaskError(f"chunk {c}: contributors {theirs:#x} from node {origin} overlap "
                                    f"{self.contributors[c]:#x} already summed")
                if theirs & ~self.everyone:
                    raise TaskError(f"chunk {c}: node {origin} sent contributions of non-members")
                self.contributors[c] |= theirs
            part = np.frombuffer(payload, dtype=np.float32)
            if self._fused[c] or (not self._acc_ready[c] and len(self.roles[self.chunk_group[c]].agg_children) == 1):
                self._fuse(c, lo, hi, part)
            else:
                acc = self._acc(c)[lo - off:hi - off]
                np.add(acc, part, out=acc)
            self.host.scratch.give(payload)
            got += h["nbytes"]
            self.agg_bytes[(c, origin)] = got
            if got == n * 4:
                self.waiting[c] -= 1
                if self.waiting[c] == 0 and self.started:
                    self._complete_agg(c)
        else:  # bcast: bytes are already in place (buffer pointed into result)
            if payload.obj is not self.result:  # replayed from the stash: not yet in place
                self.result[lo:hi] = np.frombuffer(payload, dtype=np.float32)
            self.final_bytes[c] += h["nbytes"]
            if self.final_bytes[c] == n * 4:
                if bitmap_int(h["contributors"]) != self.everyone:
                    raise TaskError(f"chunk {c}: final value holds contributors "
                                    f"{bitmap_int(h['contributors']):#x}, expected {self.everyone:#x}")
                self._final(c)

    # --- what goes out --------------------------------------------------------------------------------
    def _complete_agg(self, c: int) -> None:
        role = self.roles[self.chunk_group[c]]
        off, n = self.plan.layout[c]
        if not role.agg_children and self._weight == 1.0 and self._start is not None and not self._acc_ready[c]:
            value = self._start[off:off + n]  # a leaf's own values, as they are: nothing summed into them
        else:
            value = self._acc(c)
        if role.parent is not None:
            self._send(c, "agg", value, self.contributors[c], role.parent)
            self._duty_done()
            return
        if self.contributors[c] != self.everyone:
            self.end(TaskError(f"chunk {c}: root {self.host.node} aggregated {self.contributors[c]:#x}, "
                               f"expected {self.everyone:#x}"))
            return
        if not self._fused[c]:  # a fused root's sum is in the result already
            self.result[off:off + n] = value
        self._final(c)

    def _fuse(self, c: int, lo: int, hi: int, part: np.ndarray) -> None:
        """Elements lo..hi of chunk c, which has one agg child: its start value (the weighted contribution,
        or nothing) plus the child's segment, written in one pass where the chunk's sum goes: the
        result at the root (nothing copied there later), else the accumulator. The child sends each
        element once (the overlay drops a resent segment it already has), so each is written once."""
        if not self._fused[c]:
            self._fused[c] = self._acc_ready[c] = 1
        dest = (self.result if self.roles[self.chunk_group[c]].parent is None else self.acc)[lo:hi]
        if self._start is None:
            dest[:] = part
        elif self._weight == 1.0:
            np.add(self._start[lo:hi], part, out=dest)
        else:
            np.multiply(self._start[lo:hi], np.float32(self._weight), out=dest)
            dest += part

    def _acc(self, c: int) -> np.ndarray:
        """Chunk c of the accumulator, holding its start value (the weighted contribution, or zeros)
        from the first time it is asked for; a fused chunk's sum where _fuse put it."""
        off, n = self.plan.layout[c]
        if self._fused[c] and self.roles[self.chunk_group[c]].parent is None:
            return self.result[off:off + n]
        view = self.acc[off:off + n]
        if not self._acc_ready[c]:
            self._acc_ready[c] = 1
            if self._start is None:
                view.fill(0.0)
            elif self._weight == 1.0:
                view[:] = self._start[off:off + n]
            else:
                np.multiply(self._start[off:off + n], np.float32(self._weight), out=view)
        return view

    def _final(self, c: int) -> None:
        role = self.roles[self.chunk_group[c]]
        off, n = self.plan.layout[c]
        for child in role.bcast_children:
            self._send(c, "bcast", self.result[off:off + n], self.everyone, child)
        self._duty_done()

    def _duty_done(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.end()

    def _send(self, c: int, kind: str, data: np.ndarray, contributors: int, dst: int) -> None:
        """One chunk to `dst`, in its tree's traffic class; the engine picks its route and rate."""
        header = chunk_header(job=self.job, task=self.task, attempt=self.attempt, version=self.plan.version,
                              chunk=c, kind=kind, origin=self.host.node, contributors=bitmap_bytes(contributors))
        gi = self.chunk_group[c]
        group = self.plan.groups[gi]
        if group.classed:  # its tree shares links by its class (overlay.classes), at every hop
            dl = None if group.deadline_s is None else self.t_begin + group.deadline_s
            if group.fcfs:  # flow-level FCFS: the flow's deadline is when its first chunk was ready here
                dl = self.arrival.setdefault((gi, kind), self.host.clock())
            header["cls"] = TrafficClass(group.weight, group.priority_of(kind), dl).to_wire(gi)
        self.host.send(self, gi, header, data, dst)

    # --- how it ends ----------------------------------------------------------------------------------
    def drop_receiver(self, node: int) -> bool:
        """`node` left the task's receivers (a multicast shrinks). If it is this node, nothing is applied:
        it keeps passing the value on where it has broadcast children, else its part ends (True: the
        engine aborts it, so its frames are dropped from now on). If this node broadcasts to it and it
        replicates for nobody in that tree, it stops sending to it."""
        if node == self.host.node:
            self.receiver = False
            return not any(r.bcast_children for r in self.roles.values())
        for gi, role in self.roles.items():
            if node in role.bcast_children and not self.plan.groups[gi].children.get(node):
                self.roles[gi] = replace(role, bcast_children=tuple(k for k in role.bcast_children if k != node))
        return False

    def end(self, error: Exception | None = None) -> None:
        """Every way this part ends goes through here, once: done (`done` holds the result where this
        node receives, else None), failed (a TaskError, logged: reported, never silently wrong) or
        aborted (TaskAborted: the scheduler retries the task)."""
        if error is not None and not isinstance(error, TaskAborted):
            log.error("node %d task %s: %s", self.host.node, self.key, error)
        if self.done.done():
            return
        if error is not None:
            self.done.set_exception(error)
            return
        if self.duties:  # how the other tasks' bytes grew while this one ran here
            first = self._first or {}
            self.beside = {t: [first.get(t, 0), n] for t, n in self.host.others(self).items()}
        self.done.set_result(self.result if self.receiver else None)


def outcome_future() -> asyncio.Future:
    """A task's outcome. An ABORT may end it after whoever awaited it was cancelled (the agent is
    stopping): the exception is then nobody's, and must not be reported as never retrieved."""
    fut = asyncio.get_running_loop().create_future()
    fut.add_done_callback(_retrieve)
    return fut


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()
