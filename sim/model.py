"""What a round is made of, as both engines see it: plain network data, flows on resources, max-min sharing.

The simulator models what the live data plane does, and nothing fitted to live runs (it is a blind oracle):
- per chunk, store-and-forward at tree nodes: a node sends its partial sum of a chunk to its
  aggregation parent once all its aggregation children's copies arrived; the root then sends the
  final value down the broadcast tree, each node forwarding a chunk once it fully arrived;
- a logical transfer u->v follows the static route net.route(u, v), cut-through at the relays:
  one flow that occupies every link of the route at once, plus each link's one-way delay and one
  segment's transmission per extra relay hop;
- each sender keeps one FIFO per flow key (route origin, route destination) and first hop, as the
  live LinkSender does per link: transfers with the same key run one after the other, different
  keys share links round-robin, which at flow level is max-min fairness over links and node
  uplink/downlink caps;
- what live rounds pay outside link transfer (sim/costs.py): the barrier's replies reaching the
  participants one by one and their round setup (each starts at its own time), a chunk's handling
  at every node it crosses (added to its route's delay), an ack's handling;
- NetStorm's auxiliary routes (ChunkGroup.aux) are dispatched as the agents' chunk engine does
  (core.dispatch), when the chunk is ready: once `primary_busy_bound` transfers on the primary path are in
  transit (queued, sending, or waiting for the first hop's ack), the first auxiliary route with
  fewer than `aux_queue_length` in transit takes the chunk, relayed like any other route;
- several tasks at once (TaskRun: a plan, its start, its members' ready times): they share links and
  node caps; a node that only aggregates or replicates begins at the task's start; a task ends when
  its last receiver holds the full result;
- traffic classes (ChunkGroup's weight, priority, deadline_s, rates): a classed tree is a class of
  its own, every unclassed transfer is in the default class, so unclassed tasks share one FIFO per
  (origin, destination, first hop) as they do live; each class has FIFOs of its own. How classes
  share a resource: sharing.py;
- the scheduler's cap rates (core.capshare): where classed trees of different senders meet at a
  node cap, the exact engine runs the scheduler's own split at each classed task's start and end and
  paces those edges (every route of one) to it, overriding the plan's `rates` (0 holds the edge).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from core.plan import ChunkGroup, Plan

from .costs import NONE, WanCosts

MBIT = 1e6 / 8  # bytes per second in one Mbit/s
FLOAT32 = 4
_INF = float("inf")


@dataclass(frozen=True)
class SimNetwork:
    """Plain data only, so the scheduler can feed its own view and the CLI an emulation topology;
    sim.make_network builds one with the overlay's routes."""

    rates_mbps: Mapping[tuple[int, int], float]  # directed overlay links
    delays_s: Mapping[tuple[int, int], float]
    route: Callable[[int, int], tuple[int, ...]]  # static min-hop route, src..dst
    uplink_mbps: Mapping[int, float] = field(default_factory=dict)
    downlink_mbps: Mapping[int, float] = field(default_factory=dict)
    events: Sequence[tuple[float, int, int, float]] = ()  # (t, src, dst, rate_mbps), sorted by t


@dataclass
class RoundPrediction:
    round_s: float  # from start_s until the last participant holds its full result
    node_done_s: dict[int, float]  # absolute time (same clock as start_s and the events)
    link_bytes: dict[tuple[int, int], int]  # bytes carried by each directed link, relayed ones included
    link_busy_s: dict[tuple[int, int], float]  # time each link had at least one backlogged flow
    mode: str = "exact"  # the engine that produced it
    aux_bytes: int = 0  # bytes senders put on auxiliary routes (each transfer once, not per link)


@dataclass
class TaskPrediction:
    """One task of a multi-task replay; times absolute (the clock of start_s and the trace)."""

    start_s: float
    end_s: float  # the last receiver holds the full result
    receiver_done_s: dict[int, float]
    node_done_s: dict[int, float]  # every node that got the full result (receivers, replicating nodes, roots)
    link_bytes: dict[tuple[int, int], int]  # this task's bytes per directed link, relayed ones included

    @property
    def round_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class TasksPrediction:
    tasks: dict[Hashable, TaskPrediction]  # by TaskRun.key
    link_bytes: dict[tuple[int, int], int]  # all tasks
    link_busy_s: dict[tuple[int, int], float]
    mode: str = "exact"
    aux_bytes: int = 0


class SimulationStalled(RuntimeError):
    """Work remained but nothing could make progress (a link or cap at rate 0 for good)."""


class SimulationOverBudget(RuntimeError):
    """The simulation would take more CPU than its caller allowed (a decision's or a prediction's)."""


@dataclass(frozen=True)
class TaskRun:
    """One synchronization task to replay: its plan, when it starts, and (optionally) when each member's
    contribution is ready (absolute, same clock as start_s; default: the start)."""

    key: Hashable
    plan: Plan
    start_s: float = 0.0
    ready_s: Mapping[int, float] | None = None


@dataclass(frozen=True)
class TrafficClass:
    """How a class's transfers share a link: strict priority, then earliest absolute deadline, then weight."""

    weight: float = 1.0
    priority: int = 0
    deadline: float = float("inf")  # absolute (task start + deadline_s); none: after every deadline

    @property
    def level(self) -> tuple[int, float]:
        """Sort key of its level: higher priority first, then earlier deadline."""
        return (-self.priority, self.deadline)


DEFAULT_CLASS = TrafficClass()


@dataclass(frozen=True)
class KeyArrays:
    size: tuple[int, int]  # (keys, classes) they were built for
    res_flat: np.ndarray  # every key's resources, concatenated
    res_start: np.ndarray  # per key: where its resources start in res_flat
    res_len: np.ndarray
    key_class: np.ndarray
    first_res: np.ndarray  # per key: its first resource (the sender's link)
    class_weight: np.ndarray  # per class
    class_level: np.ndarray  # per class: rank of its level (0 first: highest priority, earliest deadline)


class Model:
    """What both engines share: resources (links, then node caps), flow keys and traffic classes as
    dense ints, over one or more tasks. Nodes, groups and chunks of all tasks are numbered together
    (in the order tasks were added); `plan`, `start` and `start_at` describe the first task (the
    one-task case). Job mode adds tasks while the exact engine runs (`add_task`); every node a later
    task may use must then be named up front (`nodes`)."""

    def __init__(self, tasks: Sequence[TaskRun] | Plan, net: SimNetwork, start: float = 0.0, segment: int = 65536,
                 costs: WanCosts = NONE, *, nodes: Iterable[int] = ()) -> None:
        if isinstance(tasks, Plan):
            tasks = [TaskRun(0, tasks, start)]
        self.net, self.segment, self.costs = net, segment, costs
        self.nodes = sorted({n for t in tasks for n in t.plan.nodes} | set(nodes))  # aggregators, receivers too
        self.ix = {n: i for i, n in enumerate(self.nodes)}
        self.t0 = min((t.start_s for t in tasks), default=start)  # the trace's state then: starting capacity
        self._build_resources()
        self._init_tables()
        for t in tasks:
            self.add_task(t)
        if self.tasks:
            self.plan, self.start, self.start_at = self.tasks[0].plan, self.tasks[0].start_s, self.begin[0]

    def _init_tables(self) -> None:
        self.tasks: list[TaskRun] = []
        self.task_ix: dict[Hashable, int] = {}
        # per task, per node index: when the node begins (the barrier's replies reach a task's nodes
        # one by one, then its setup), and for a member, not before its contribution is ready
        self.begin: list[list[float]] = []
        self.groups: list[ChunkGroup] = []
        self.group_task: list[int] = []
        self.group_class: list[tuple[int, int]] = []  # per group: its aggregation's and broadcast's classes
        self.chunk_bytes: list[int] = []
        self.chunk_task: list[int] = []
        self.chunk_base: list[int] = []  # per task: global index of its chunk 0
        self.key_of: dict[tuple[int, int, int], int] = {}
        self.key_of_path: dict[tuple[int, tuple[int, ...]], int] = {}
        self.path_info: dict[tuple[int, ...], tuple[tuple[int, ...], float, float]] = {}
        self.fifo_of: dict[tuple[int, int, int, int], int] = {}
        self.classes: list[TrafficClass] = [DEFAULT_CLASS]
        self.key_path: list[tuple[int, ...]] = []
        self.key_res: list[tuple[int, ...]] = []
        self.key_delay: list[float] = []
        self.key_dst: list[int] = []
        self.key_ack: list[float] = []  # from a transfer's last byte leaving to its hop ack arriving back
        self.key_fifo: list[int] = []
        self.key_class: list[int] = []
        self._arrays: KeyArrays | None = None
        self.key_cap: list[float] = []  # bytes/s the sender paces the key to (ChunkGroup.rates), else inf
        self.counted: list[bool] = []  # keys whose in-transit count some auxiliary dispatch reads
        self.group_of: list[int] = []  # per chunk
        self.agg_key: list[list[int]] = []  # per group, per node index: key to the agg parent (-1 at root)
        self.bcast_keys: list[list[tuple[int, ...]]] = []  # per group, per node index
        self.nkids: list[list[int]] = []  # per group, per node index: aggregation children to wait for
        self.root: list[int] = []
        self.direct: list[bool] = []  # per group: all-to-all (every receiver sums on its own)
        self.direct_keys: list[list[tuple[int, ...]]] = []  # per group, per node index: a member's own sends
        # NetStorm auxiliary routes: per group, primary key of a tree edge -> its auxiliary keys
        self.aux_keys: list[dict[int, tuple[int, ...]]] = []

    def add_task(self, task: TaskRun) -> int:
        """Number the task's groups, chunks and keys after the others'; its index."""
        if task.key in self.task_ix:
            raise ValueError(f"task key {task.key!r} is taken")
        plan = task.plan
        missing = set(plan.nodes) - set(self.ix)
        if missing:
            raise ValueError(f"task {task.key!r} uses nodes {sorted(missing)[:8]} the model was not given")
        t_idx = len(self.tasks)
        at = [task.start_s] * len(self.nodes)
        for node, off in zip(plan.nodes, self.costs.start_offsets(len(plan.nodes)), strict=True):
            at[self.ix[node]] = task.start_s + off
        for node, ready in (task.ready_s or {}).items():
            if node not in plan.participants:
                raise ValueError(f"task {task.key!r}: ready_s names {node}, which is no member")
            at[self.ix[node]] = max(at[self.ix[node]], ready)
        self.tasks.append(task)
        self.task_ix[task.key] = t_idx
        self.begin.append(at)
        self.chunk_base.append(len(self.chunk_bytes))
        self.chunk_bytes.extend(k * FLOAT32 for _, k in plan.layout)
        self.chunk_task.extend([t_idx] * len(plan.layout))
        self.group_of.extend([0] * len(plan.layout))
        for g in plan.groups:
            self._add_group(t_idx, g)
        return t_idx

    def _build_resources(self) -> None:
        net = self.net
        self.res_of_link: dict[tuple[int, int], int] = {}
        cap: list[float] = []
        for link, mbps in net.rates_mbps.items():
            self.res_of_link[link] = len(cap)
            cap.append(mbps * MBIT)
        self.nlinks = len(cap)
        self.up_res = {n: self._add(cap, m) for n, m in net.uplink_mbps.items()}
        self.down_res = {n: self._add(cap, m) for n, m in net.downlink_mbps.items()}
        for t, a, b, mbps in net.events:  # the trace's state at start_s is the starting capacity
            r = self.res_of_event(a, b)
            if r is None:
                raise ValueError(f"trace event at {t} s for {a}->{b}, which is not a link or node cap")
            if t <= self.t0:
                cap[r] = mbps * MBIT
        self.cap = cap
        self.later_events = sorted((e for e in net.events if e[0] > self.t0), key=lambda e: e[0])
        self.never_full = self._never_full()

    def _never_full(self) -> set[int]:
        """Node caps that can never fill: at their lowest over the trace still at least the sum of the
        node's links that way at their highest. Every byte through a cap crosses one of those links, so
        such a cap changes no rate; left out of the keys' resources, it does not tie every flow of its
        node into one max-min problem (a 10 Gbit/s port before a few 100 Mbit/s links)."""
        low = {r: c for r, c in enumerate(self.cap) if r >= self.nlinks}
        high = dict(enumerate(self.cap[: self.nlinks]))
        for r, mbps in ((self.res_of_event(a, b), m) for _, a, b, m in self.net.events):
            assert r is not None
            if r >= self.nlinks:
                low[r] = min(low[r], mbps * MBIT)
            else:
                high[r] = max(high[r], mbps * MBIT)
        for r, mbps in ((self.up_res.get(a), m) for a, m in self.net.uplink_mbps.items()):
            low[r] = min(low[r], mbps * MBIT)
        for r, mbps in ((self.down_res.get(b), m) for b, m in self.net.downlink_mbps.items()):
            low[r] = min(low[r], mbps * MBIT)
        for (a, b), r in self.res_of_link.items():
            high[r] = max(high[r], self.net.rates_mbps[(a, b)] * MBIT)
        through: dict[int, float] = {}
        for (a, b), r in self.res_of_link.items():
            for cap_r in (self.up_res.get(a), self.down_res.get(b)):
                if cap_r is not None:
                    through[cap_r] = through.get(cap_r, 0.0) + high[r]
        return {r for r, c in low.items() if c >= through.get(r, 0.0)}

    def res_of_event(self, a: int, b: int) -> int | None:
        """The resource a trace event (t, a, b, rate) changes: link a->b, or a node cap (a, -1): a's
        uplink, (-1, b): b's downlink (emulation.trace.PORT)."""
        if b == -1:
            return self.up_res.get(a)
        if a == -1:
            return self.down_res.get(b)
        return self.res_of_link.get((a, b))

    @staticmethod
    def _add(cap: list[float], mbps: float) -> int:
        cap.append(mbps * MBIT)
        return len(cap) - 1

    def edge_keys(self, g_idx: int, a: int, b: int) -> list[int]:
        """The keys of tree edge a->b of group g_idx: its aggregation's, its broadcast's, or both."""
        g, (cls, bcls) = self.groups[g_idx], self.group_class[g_idx]
        if g.direct:
            return [self.key_of[(cls, a, b)]] if b in g.children.get(a, ()) else []
        out = [self.key_of[(cls, a, b)]] if g.parent.get(a) == b else []
        if b in g.children.get(a, ()):
            out.append(self.key_of[(bcls, a, b)])
        return out

    def _key(self, u: int, v: int, cls: int = 0) -> int:
        """The key of a logical transfer u->v of class `cls` on its static route."""
        k = self.key_of.get((cls, u, v))
        if k is not None:
            return k
        path = tuple(self.net.route(u, v))
        if len(path) < 2 or path[0] != u or path[-1] != v:
            raise ValueError(f"route({u}, {v}) returned {path}, not a path from {u} to {v}")
        k = self.key_of[(cls, u, v)] = self._path_key(path, cls)
        return k

    def _path_info(self, path: tuple[int, ...]) -> tuple[tuple[int, ...], float, float]:
        """Resources a path uses, its delay (each node on the way handles a chunk) and its hop ack's time:
        the first hop has the whole chunk one link delay after its last byte left, and its ACK needs
        the reverse link's delay to come back."""
        res: list[int] = []
        delay = 0.0
        for a, b in zip(path, path[1:], strict=False):
            r = self.res_of_link.get((a, b))
            if r is None:
                raise ValueError(f"route {path} uses {a}->{b}, which is not a link")
            res.append(r)
            delay += self.net.delays_s.get((a, b), 0.0) + self.costs.hop_s
            if a in self.up_res and self.up_res[a] not in self.never_full:
                res.append(self.up_res[a])
            if b in self.down_res and self.down_res[b] not in self.never_full:
                res.append(self.down_res[b])
        ack = (self.net.delays_s.get((path[0], path[1]), 0.0) + self.net.delays_s.get((path[1], path[0]), 0.0)
               + self.costs.ack_s)
        return tuple(dict.fromkeys(res)), delay, ack

    def _path_key(self, path: tuple[int, ...], cls: int = 0) -> int:
        """One key per class and path (the static route of a pair, or an auxiliary route). Keys of one
        class whose paths share origin, destination and first hop share one FIFO, as in the live
        LinkSender; each class has FIFOs of its own."""
        k = self.key_of_path.get((cls, path))
        if k is not None:
            return k
        if path not in self.path_info:
            self.path_info[path] = self._path_info(path)
        res, delay, ack = self.path_info[path]
        k = len(self.key_path)
        self.key_of_path[(cls, path)] = k
        self.key_path.append(path)
        self.key_res.append(res)
        self.key_delay.append(delay)
        self.key_dst.append(self.ix[path[-1]])
        self.key_ack.append(ack)
        self.key_class.append(cls)
        self.key_cap.append(_INF)
        self.counted.append(False)
        self.key_fifo.append(self.fifo_of.setdefault((cls, path[0], path[-1], path[1]), len(self.fifo_of)))
        return k

    def _class_of(self, g_idx: int) -> tuple[int, int]:
        """Unclassed trees of every task share the default class 0; a classed tree is two classes of
        its own, its aggregation and its broadcast (as the live link scheduler keys them: a link both
        use carries the tree's weight once for each, as a packing counts it)."""
        g = self.groups[g_idx]
        if not g.classed:
            return 0, 0
        t = self.tasks[self.group_task[g_idx]]
        dl = _INF if g.deadline_s is None else t.start_s + g.deadline_s  # fcfs: set at its first send (exact.py)
        self.classes += [TrafficClass(g.weight, g.priority, dl), TrafficClass(g.weight, g.priority_of("bcast"), dl)]
        return len(self.classes) - 2, len(self.classes) - 1

    def arrived(self, cls: int, t: float) -> None:
        """A flow-level FCFS class (ChunkGroup.fcfs) has its first chunk ready at t: that is its deadline."""
        c = self.classes[cls]
        if t < c.deadline:
            self.classes[cls] = TrafficClass(c.weight, c.priority, t)
            self._arrays = None  # class levels changed

    def _add_group(self, t_idx: int, g: ChunkGroup) -> None:
        """Flow keys of every tree edge of g, and per node which keys its chunks leave on."""
        n = len(self.nodes)
        g_idx = len(self.groups)
        self.groups.append(g)
        self.group_task.append(t_idx)
        base = self.chunk_base[t_idx]
        for c in g.chunks:
            self.group_of[base + c] = g_idx
        cls, bcls = self._class_of(g_idx)
        self.group_class.append((cls, bcls))
        agg = [-1] * n
        kids = [0] * n
        self.direct.append(g.direct)
        if g.direct:  # each member's chunks to every other receiver, summed there
            sends: list[tuple[int, ...]] = [()] * n
            for node, children in g.children.items():
                sends[self.ix[node]] = tuple(self._key(node, ch, cls) for ch in children)
                for ch in children:
                    kids[self.ix[ch]] += 1
            self.direct_keys.append(sends)
            self.agg_key.append(agg)
            self.bcast_keys.append([()] * n)
            self.nkids.append(kids)
            self.root.append(self.ix[g.root])
            self.aux_keys.append({})
            return
        self.direct_keys.append([()] * n)
        for node, parent in g.parent.items():
            if parent is not None:
                agg[self.ix[node]] = self._key(node, parent, cls)
                kids[self.ix[parent]] += 1
        bc: list[tuple[int, ...]] = [()] * n
        for node, children in g.children.items():
            bc[self.ix[node]] = tuple(self._key(node, ch, bcls) for ch in children)
        self.agg_key.append(agg)
        self.bcast_keys.append(bc)
        self.nkids.append(kids)
        self.root.append(self.ix[g.root])
        aux: dict[int, tuple[int, ...]] = {}
        for (a, b), routes in g.aux.items():
            if routes:
                c = bcls if g.parent.get(a) != b else cls
                aux[self._key(a, b, c)] = tuple(self._path_key(tuple(r), c) for r in routes)
        self.aux_keys.append(aux)
        for (a, b), mbps in g.rates.items():  # the pacing caps each route of the edge on its own
            for k in self.edge_keys(g_idx, a, b):
                for x in (k, *aux.get(k, ())):
                    self.key_cap[x] = min(self.key_cap[x], mbps * MBIT)
        for k, routes in aux.items():
            for x in (k, *routes):
                self.counted[x] = True

    @property
    def classed(self) -> bool:
        """Some tree asks for more than plain round-robin (weights, priorities, deadlines or rates)."""
        return len(self.classes) > 1

    @property
    def has_aux(self) -> bool:
        return any(self.aux_keys)

    def pairs(self, keys: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flow index, resource id) of every resource each key uses, for max_min_rates."""
        a = self.arrays()
        ks = np.asarray(keys, dtype=np.int64)
        lens = a.res_len[ks]
        flow = np.repeat(np.arange(len(ks)), lens)
        offs = np.arange(len(flow)) - np.repeat(np.cumsum(lens) - lens, lens)
        return flow, a.res_flat[np.repeat(a.res_start[ks], lens) + offs]

    def arrays(self) -> KeyArrays:
        """The per-key and per-class lists as numpy arrays, rebuilt when tasks added keys or classes
        (job mode grows the model): the exact engine's rate solves index them instead of looping."""
        size = (len(self.key_res), len(self.classes))
        if self._arrays is None or self._arrays.size != size:
            lens = np.fromiter((len(r) for r in self.key_res), dtype=np.int64, count=len(self.key_res))
            flat = np.fromiter((r for res in self.key_res for r in res), dtype=np.int64, count=int(lens.sum()))
            levels = sorted({c.level for c in self.classes})
            rank = {lv: i for i, lv in enumerate(levels)}
            self._arrays = KeyArrays(
                size, flat, np.cumsum(lens) - lens, lens, np.asarray(self.key_class, dtype=np.int64),
                flat[np.cumsum(lens) - lens] if len(lens) else np.zeros(0, dtype=np.int64),
                np.array([c.weight for c in self.classes], dtype=float),
                np.array([rank[c.level] for c in self.classes], dtype=np.int64))
        return self._arrays

    def transfers_per_key(self) -> np.ndarray:
        count = np.zeros(len(self.key_path), dtype=np.int64)
        for g_idx, g in enumerate(self.groups):
            for k in self.agg_key[g_idx]:
                if k >= 0:
                    count[k] += len(g.chunks)
            for ks in (*self.bcast_keys[g_idx], *self.direct_keys[g_idx]):
                for k in ks:
                    count[k] += len(g.chunks)
        return count

    def link_bytes(self, key_bytes: Sequence[int]) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = {}
        for k, path in enumerate(self.key_path):
            if key_bytes[k]:
                for link in zip(path, path[1:], strict=False):
                    out[link] = out.get(link, 0) + int(key_bytes[k])
        return out
