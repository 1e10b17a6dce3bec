"""The chunk engine: executes any valid Plan, chunk by chunk, without knowing which scheme made it.

Per chunk a node knows its role from the plan: the aggregation children it waits for, the parent
it forwards its partial sum to (only once every child arrived: aggregate-forward), and, coming
down, the broadcast children it passes the final value on to. Partial sums are added in place
with numpy as their segments land; final values land directly in the result tensor. Every frame
carries its contributor set, so a doubled, stale or missing contribution is caught, not summed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from overlay.budget import MemoryBudget
from overlay.burstlog import BurstLog
from overlay.messages import ProtocolError, bitmap, bitmap_bytes, bitmap_int, chunk_header
from overlay.peers import HoldRefused, Overlay
from overlay.routing import Routes
from scheduler.plan import AuxTable, Plan

log = logging.getLogger("wansync.engine")

RoundKey = tuple[int, int, int, int]  # job, round, attempt, version


class RoundError(RuntimeError):
    """The round cannot end exact (a contribution doubled or missing); it must be aborted."""


class RoundAborted(RuntimeError):
    """The scheduler aborted this attempt (an agent was lost, or the round stalled); it is retried."""


@dataclass
class _Role:
    """What this node does for one chunk group."""

    group: int
    parent: int | None
    agg_children: frozenset[int]
    bcast_parent: int | None
    bcast_children: tuple[int, ...]


@dataclass
class RoundState:
    job: int
    round: int
    attempt: int
    plan: Plan
    acc: np.ndarray
    result: np.ndarray
    roles: dict[int, _Role]  # by group index
    chunk_group: list[int]
    everyone: int  # bitmap of all participants
    waiting: list[int]  # per chunk: agg children not yet complete
    contributors: list[int]  # per chunk: bitmap summed into acc so far
    agg_bytes: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    final_bytes: list[int] = field(default_factory=list)
    finals: int = 0
    started: bool = False
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    t_first_final: float | None = None

    @property
    def key(self) -> RoundKey:
        return (self.job, self.round, self.attempt, self.plan.version)


# Bytes this node may hold for others: frames for rounds it has not begun, and chunks it relays.
# Over budget a frame is refused unacknowledged and resent later.
HOLD_BUDGET = 256 << 20
PRIMARY_BUSY_BOUND = 2  # NetStorm's best setting (Fig. 17)
AUXILIARY_QUEUE_LENGTH = 5


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
        self.rounds: dict[RoundKey, RoundState] = {}
        self._stash: dict[tuple[int, int, int, int], list[tuple[dict[str, Any], bytes]]] = defaultdict(list)
        self.stashed_frames = 0  # frames that had to wait for their round or plan (cumulative)
        # one memory budget for what this node holds for others: frames held here for a later round,
        # and chunks relayed through here (the overlay shares it)
        self.budget = MemoryBudget(HOLD_BUDGET)
        self.jobs: dict[int, int] = {}  # job -> rounds ahead of this node's its progress model allows
        self.current: tuple[int, int] | None = None  # (job, round) this node runs or runs next
        self.held_peak = 0  # most bytes ever held for rounds not begun (<= the budget + a frame per peer)
        self.hold_refused = 0  # segments refused for the budget (resent by their senders later)
        self.refused_frames = 0  # segments refused as unexpected (unknown job, round outside the window)
        self._held = 0  # bytes in the stash
        self._refused_from: dict[int, set[tuple[int, int]]] = {}  # peer -> (job, round)s refused
        self._burst = BurstLog(log)
        self.on_error: Callable[[RoundKey, Exception], None] | None = None
        self.plans: dict[int, Plan] = {}  # every version this node holds (the agent fills it)
        self.aborted: dict[tuple[int, int], int] = {}  # (job, round) -> highest aborted attempt
        # auxiliary tables pushed by AUX_UPDATE after a version was published: version -> per group
        self.aux_tables: dict[int, tuple[AuxTable, ...]] = {}

    def avoid_links(self, links: Iterable[Sequence[int]]) -> None:
        """Links the scheduler suspects dead (a blackhole): this round's chunks route around them.
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

    # --- round lifecycle -----------------------------------------------------------------------------
    def begin_round(self, job: int, rnd: int, attempt: int, plan: Plan, contribution: np.ndarray) -> RoundState:
        """Own contribution goes in, leaf chunks go out, held frames for this round are replayed."""
        me = self.node
        if job not in self.jobs:  # driven without an agent (tests): the job is announced by its first round
            self.open_job(job, rnd)
        if me not in plan.participants:
            raise ValueError(f"node {me} is not a participant of plan v{plan.version}")
        if contribution.shape != (plan.params,) or contribution.dtype != np.float32:
            raise ValueError(f"contribution must be float32 of {plan.params} elements")
        w = plan.weights[me]
        acc = contribution.copy() if w == 1.0 else (contribution * np.float32(w))
        chunk_group = [0] * len(plan.layout)
        roles: dict[int, _Role] = {}
        waiting = [0] * len(plan.layout)
        for gi, g in enumerate(plan.groups):
            kids = frozenset(g.agg_children(me))
            roles[gi] = _Role(gi, g.parent[me], kids, g.bcast_parent(me), tuple(g.children.get(me, ())))
            for c in g.chunks:
                chunk_group[c] = gi
                waiting[c] = len(kids)
        st = RoundState(job, rnd, attempt, plan, acc, np.empty_like(acc), roles, chunk_group,
                        bitmap_int(bitmap(plan.participants)), waiting, [1 << me] * len(plan.layout),
                        final_bytes=[0] * len(plan.layout))
        self.rounds[st.key] = st
        self.current = (job, rnd)
        for h, data in self._unstash(st.key):
            try:
                self.chunk_buffer(h)  # held frames were never checked against the plan: check now
                self._segment(st, h, memoryview(data))
            except ProtocolError as exc:
                log.warning("node %d: dropped a held frame: %s", self.node, exc)
            except RoundError as exc:
                self._fail(st, exc)
        self._ask_resend()
        st.started = True
        for c in range(len(plan.layout)):
            if st.waiting[c] == 0:
                self._complete_agg(st, c)
        return st

    def end_round(self, st: RoundState) -> None:
        self.rounds.pop(st.key, None)
        if self.current == (st.job, st.round):
            self.current = (st.job, st.round + 1)  # the next round's early frames are not "future"

    def abort(self, job: int, rnd: int, attempt: int) -> None:
        """Attempts up to `attempt` of this round end now; their frames, held or late, are dropped."""
        self.aborted[(job, rnd)] = max(attempt, self.aborted.get((job, rnd), -1))
        for key, st in list(self.rounds.items()):
            if key[:2] == (job, rnd) and key[2] <= attempt and not st.done.done():
                st.done.set_exception(RoundAborted(f"job {job} round {rnd} attempt {key[2]} aborted"))
        for k in [k for k in self._stash if k[:2] == (job, rnd) and k[2] <= attempt]:
            self._unstash(k)

    def drop_stale(self, job: int, rnd: int) -> None:
        """Forget held frames of rounds that can no longer start."""
        self.current = (job, rnd)
        for k in [k for k in self._stash if (k[0], k[1]) < (job, rnd)]:
            self._unstash(k)

    # --- ChunkSink -------------------------------------------------------------------------------------
    def chunk_buffer(self, h: dict[str, Any]) -> memoryview | None:
        st = self.rounds.get((h["job"], h["round"], h["attempt"], h["version"]))
        if st is None:
            self._may_hold(h)
            return None  # held until this node has the round and its plan
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
        key = (h["job"], h["round"], h["attempt"], h["version"])
        st = self.rounds.get(key)
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
        except RoundError as exc:
            self._fail(st, exc)

    # --- which traffic this node expects: jobs and the rounds their progress model allows ------------
    def open_job(self, job: int, first_round: int = 0, ahead: int = 1) -> None:
        """Frames of `job` are welcome from now on, for rounds from the one before this node's (relays
        finish it for others) up to `ahead` beyond it (the progress model's window: BSP runs one round
        ahead at most). Every other job's traffic is refused from now on."""
        self.jobs = {job: ahead}
        if self.current is None or self.current[0] != job:
            self.current = (job, first_round)

    def _outside(self, h: dict[str, Any]) -> str | None:
        """Why this node expects no frame like `h` now, or None. The round before this node's is still
        expected: others may finish it (through us) after we did, or abort it and make us go back."""
        job, rnd = h["job"], h["round"]
        ahead = self.jobs.get(job)
        if ahead is None:
            return f"job {job} is not running here"
        cur = self.current[1] if self.current is not None and self.current[0] == job else 0
        if rnd > cur + ahead:
            return f"round {rnd} is more than {ahead} ahead of round {cur}"
        if rnd < cur - 1:
            return f"round {rnd} is over (this node is at round {cur})"
        return None

    def admit_relay(self, h: dict[str, Any], peer: int) -> None:
        why = self._outside(h)
        if why is not None:
            self._refuse(h, peer, why)

    def _refuse(self, h: dict[str, Any], peer: int, why: str) -> None:
        """Not stored, so never acknowledged: the sender keeps the chunk and resends it after the
        connection drops, which this node asks for when the round begins (`_ask_resend`)."""
        self.refused_frames += 1
        self._refused_from.setdefault(peer, set()).add((h["job"], h["round"]))
        self._burst.log(logging.WARNING, (peer, why.split(" ", 1)[0]),
                        f"node {self.node}: refused frames from node {peer} (job {h['job']} round {h['round']}): {why}")
        raise HoldRefused(why)

    # --- held frames: bounded memory, nothing lost ---------------------------------------------------
    @property
    def hold_budget(self) -> int:
        return self.budget.limit

    @hold_budget.setter
    def hold_budget(self, nbytes: int) -> None:
        self.budget.limit = nbytes

    def held_bytes(self) -> int:
        """Bytes of frames held for a round (or plan) this node has not begun yet."""
        return self._held

    def _may_hold(self, h: dict[str, Any]) -> None:
        """Refuse a frame for a round not begun yet when it is not expected, or holding it would
        exceed the node's memory budget (shared with relayed chunks) or the sender's share of it.

        Refused means not stored, hence never acknowledged: the sender keeps the chunk, and the
        overlay drops that connection when the round begins (`_ask_resend`), so the sender resends
        it from its start and the frames go straight into place (already held offsets are dropped
        as duplicates). Back-pressure (pausing the socket) is not used: the current round's frames
        on the same connection would wait behind the future ones, and the future round can only
        begin once the current one ends: a deadlock."""
        peer = _sender(h)
        why = self._outside(h)
        if why is not None:
            self._refuse(h, peer, why)
        if self.budget.room(peer, h["nbytes"]):
            return
        rnd = (h["job"], h["round"])
        self.hold_refused += 1
        seen = self._refused_from.setdefault(peer, set())
        if rnd not in seen:
            seen.add(rnd)
            log.warning("node %d: hold budget full (%d of %d bytes held, %d for node %d): refusing job %d round %d "
                        "frames from node %d unacknowledged; they are resent when it begins", self.node,
                        self.budget.used, self.budget.limit, self.budget.by_peer.get(peer, 0), peer, rnd[0], rnd[1],
                        peer)
        raise HoldRefused(f"hold budget of {self.hold_budget} bytes full")

    def _unstash(self, key: tuple[int, int, int, int]) -> list[tuple[dict[str, Any], bytes]]:
        """Take a round's held frames out of the stash (to replay or drop): their bytes leave the budget."""
        frames = self._stash.pop(key, [])
        for h, data in frames:
            self.budget.give(_sender(h), len(data))
            self._held -= len(data)
        return frames

    def _ask_resend(self) -> None:
        """A round began: peers whose frames were refused resend everything unacknowledged (a reconnect)."""
        peers, self._refused_from = self._refused_from, {}
        for peer in peers:
            if self.overlay is not None:
                self.overlay.drop_connection(peer)

    # --- internals -------------------------------------------------------------------------------------
    def _segment(self, st: RoundState, h: dict[str, Any], payload: memoryview) -> None:
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
                    raise RoundError(f"chunk {c}: contributors {theirs:#x} from node {origin} overlap "
                                     f"{st.contributors[c]:#x} already summed")
                if theirs & ~st.everyone:
                    raise RoundError(f"chunk {c}: node {origin} sent contributions of non-participants")
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
                    raise RoundError(f"chunk {c}: final value holds contributors "
                                     f"{bitmap_int(h['contributors']):#x}, expected {st.everyone:#x}")
                self._final(st, c)

    def _complete_agg(self, st: RoundState, c: int) -> None:
        role = st.roles[st.chunk_group[c]]
        off, n = st.plan.layout[c]
        if role.parent is not None:
            self._send(st, c, "agg", st.acc[off:off + n], st.contributors[c], role.parent)
            return
        if st.contributors[c] != st.everyone:
            self._fail(st, RoundError(f"chunk {c}: root {self.node} aggregated {st.contributors[c]:#x}, "
                                      f"expected {st.everyone:#x}"))
            return
        st.result[off:off + n] = st.acc[off:off + n]
        self._final(st, c)

    def _final(self, st: RoundState, c: int) -> None:
        role = st.roles[st.chunk_group[c]]
        off, n = st.plan.layout[c]
        for child in role.bcast_children:
            self._send(st, c, "bcast", st.result[off:off + n], st.everyone, child)
        st.finals += 1
        if st.finals == len(st.plan.layout) and not st.done.done():
            st.done.set_result(st.result)

    def _send(self, st: RoundState, c: int, kind: str, data: np.ndarray, contributors: int, dst: int) -> None:
        assert self.overlay is not None
        header = chunk_header(job=st.job, rnd=st.round, attempt=st.attempt, version=st.plan.version, chunk=c,
                              kind=kind, origin=self.node, contributors=bitmap_bytes(contributors))
        path = self.routes.route(self.node, dst)
        aux = self.aux_for(st.plan, st.chunk_group[c]).get((self.node, dst))
        if aux and self.overlay.in_transit(path) >= self.primary_busy_bound:
            # the primary is busy: the first auxiliary route with room takes it (source-routed, relays
            # only forward); when every one is full the chunk queues on the primary after all
            for route in aux:
                if self.overlay.in_transit(route) < self.aux_queue_length:
                    path = route
                    self.aux_bytes += data.nbytes
                    break
        self.sent_bytes += data.nbytes
        self.overlay.send_chunk(header, memoryview(data).cast("B"), path)

    def _fail(self, st: RoundState, exc: Exception) -> None:
        log.error("node %d round %s: %s", self.node, st.key, exc)
        if not st.done.done():
            st.done.set_exception(exc)
        if self.on_error is not None:
            self.on_error(st.key, exc)


def _sender(h: dict[str, Any]) -> int:
    """The neighbour a frame came from (the hop before this node on its route)."""
    return h["path"][h["hop"]]
