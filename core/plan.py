"""The one plan representation every scheme compiles to, and the checks it must pass before use.

A flattened float32 tensor is cut into chunks. Each chunk belongs to exactly one group; a group
has an aggregation tree (parent per node, partial sums flow leaf -> root) and a broadcast tree
(children per node, final values flow root -> leaves), optionally auxiliary relay routes per tree
edge. Nothing downstream knows which scheme produced a plan.

Roles. The *participants* (members) contribute, with weights; the *receivers* (default: the
members) get the final value. Other nodes may take part without contributing: an *aggregator* is
an inner node of an aggregation tree (it sums what its children send; it may be the root), a
*replicating* node is an inner node of a broadcast tree (it passes the final value on). So every
member is in every aggregation tree, every receiver in every broadcast tree, and a node that is
neither must have children where it appears (a leaf that contributes or receives nothing has no
reason to be there). `validate()` says which rule a plan breaks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.classes import MAX_WEIGHT, PRIORITIES

NodeId = int


class PlanError(ValueError):
    """A plan that breaks an invariant; the message says which group and node."""


@dataclass(frozen=True)
class Job:
    """What a planner needs besides the network view: tensor size, chunking and scheme options."""

    params: int
    chunk_params: int
    participants: tuple[NodeId, ...]
    options: Mapping[str, Any] = field(default_factory=dict)

    def layout(self) -> tuple[tuple[int, int], ...]:
        return make_layout(self.params, self.chunk_params)


@functools.lru_cache(maxsize=64)  # planners ask for the same layout task after task
def make_layout(params: int, chunk_params: int) -> tuple[tuple[int, int], ...]:
    """(offset, length) of every chunk, in float32 elements; the last chunk takes the remainder."""
    if params <= 0 or chunk_params <= 0:
        raise PlanError(f"params ({params}) and chunk_params ({chunk_params}) must be positive")
    return tuple((off, min(chunk_params, params - off)) for off in range(0, params, chunk_params))


@dataclass(frozen=True)
class ChunkGroup:
    chunks: tuple[int, ...]
    root: NodeId
    parent: Mapping[NodeId, NodeId | None]
    children: Mapping[NodeId, tuple[NodeId, ...]]
    # per tree edge (child->parent when pushing, parent->child when pulling): relay routes that may
    # carry a share of its chunks; relays only forward (NetStorm §VI)
    aux: Mapping[tuple[NodeId, NodeId], tuple[tuple[NodeId, ...], ...]] = field(default_factory=dict)
    # how this tree shares the links it uses with other trees and tasks (overlay.classes): a weight
    # (weighted fair share), a priority (strict: higher first), a deadline (earliest first, among
    # equal priorities; seconds after the task started), and per tree edge a rate (Mbit/s) its sender
    # paces this tree's chunks to (the scheduler assigns them where senders meet at a receiver's
    # downlink, which no sender alone can share out). All defaults: plain round-robin, as before.
    weight: float = 1.0
    priority: int = 0
    deadline_s: float | None = None
    rates: Mapping[tuple[NodeId, NodeId], float] = field(default_factory=dict)
    own_class: bool = False  # a class of its own even with default values (a task given `sharing=`)
    # flow-level FCFS (CREW): each of the tree's flows (its aggregation, its broadcast) takes as its
    # deadline the moment its first chunk was ready at its sender, so on every link a flow that came
    # first goes first (earliest deadline first = first come, first served); not with deadline_s
    fcfs: bool = False
    bcast_priority: int | None = None  # the broadcast's priority where it differs from the aggregation's
    # all-to-all (no tree): every member sends its weighted chunks straight to each of its `children`
    # (the other receivers) and every receiver sums what it got itself; `parent` maps every member and
    # receiver to None (each holds its own sum), `root` is the lowest member
    direct: bool = False

    @property
    def classed(self) -> bool:
        """The tree is a traffic class of its own (its chunks carry it), not plain round-robin."""
        return (self.own_class or self.weight != 1.0 or self.priority != 0 or self.deadline_s is not None
                or bool(self.rates) or self.fcfs or self.bcast_priority is not None)

    def priority_of(self, kind: str) -> int:
        """The priority of the tree's aggregation ("agg") or broadcast ("bcast") class."""
        return self.bcast_priority if kind == "bcast" and self.bcast_priority is not None else self.priority

    def agg_children(self, node: NodeId) -> tuple[NodeId, ...]:
        if self.direct:  # whoever sends to it
            return tuple(sorted(m for m, kids in self.children.items() if node in kids))
        return tuple(sorted(c for c, p in self.parent.items() if p == node))

    def bcast_parent(self, node: NodeId) -> NodeId | None:
        for p, kids in self.children.items():
            if node in kids:
                return p
        return None


@dataclass(frozen=True)
class Plan:
    version: int
    scheme: str
    participants: tuple[NodeId, ...]
    weights: Mapping[NodeId, float]
    layout: tuple[tuple[int, int], ...]
    groups: tuple[ChunkGroup, ...]
    multicast: Mapping[NodeId, tuple[NodeId, ...]] | None = None
    receivers: tuple[NodeId, ...] | None = None  # who gets the final value; None: the participants
    # what the planner wants shown beside the plan (e.g. tree packing's LP figures); never on the wire
    # and no part of the policy (same_policy ignores it)
    info: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def params(self) -> int:
        return sum(n for _, n in self.layout)

    @property
    def members(self) -> tuple[NodeId, ...]:
        """Who contributes (the participants)."""
        return self.participants

    @property
    def receiver_set(self) -> tuple[NodeId, ...]:
        return self.participants if self.receivers is None else self.receivers

    @property
    def nodes(self) -> tuple[NodeId, ...]:
        """Every node with a role in some tree: members, receivers, aggregators, replicating nodes."""
        out = set(self.participants) | set(self.receiver_set)
        for g in self.groups:
            out.update(g.parent)
            out.update(g.children)
            for kids in g.children.values():
                out.update(kids)
        return tuple(sorted(out))

    def with_version(self, version: int) -> Plan:
        return dataclasses.replace(self, version=version)

    def same_policy(self, other: Plan) -> bool:
        """Equal apart from the version number (re-planning found nothing new)."""
        return self.with_version(0).to_wire() == other.with_version(0).to_wire()

    # --- validation ---------------------------------------------------------------------------
    def validate(self, links: Iterable[tuple[NodeId, NodeId]] | None = None) -> Plan:
        """Raise PlanError unless every invariant holds; `links` are the overlay's directed links."""
        parts = self.participants
        if not parts or len(set(parts)) != len(parts):
            raise PlanError(f"participants must be non-empty and unique, got {parts}")
        pset = set(parts)
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in pset):
            raise PlanError(f"participants must be node ids (ints >= 0), got {sorted(pset, key=str)}")
        if set(self.weights) != pset:
            raise PlanError("weights must name exactly the participants")
        for n, w in self.weights.items():
            if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
                raise PlanError(f"weights: node {n} has weight {w!r}; a weight is a finite number > 0")
        recv = self.receiver_set
        if not recv or len(set(recv)) != len(recv):
            raise PlanError(f"receivers must be non-empty and unique, got {recv}")
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in recv):
            raise PlanError(f"receivers must be node ids (ints >= 0), got {list(recv)}")
        expect = 0
        for i, (off, n) in enumerate(self.layout):
            if off != expect:
                raise PlanError(f"layout: chunk {i} starts at {off}, expected {expect} (gap or overlap)")
            if n <= 0:
                raise PlanError(f"layout: chunk {i} has length {n}")
            expect = off + n
        if not self.layout:
            raise PlanError("layout: no chunks")
        seen: dict[int, int] = {}
        for g_idx, g in enumerate(self.groups):
            for c in g.chunks:
                if not 0 <= c < len(self.layout):
                    raise PlanError(f"group {g_idx}: chunk {c} is not in the layout")
                if c in seen:
                    raise PlanError(f"chunk {c} is in groups {seen[c]} and {g_idx}")
                seen[c] = g_idx
            if not g.chunks:
                raise PlanError(f"group {g_idx} has no chunks")
            self._check_group(g_idx, g, pset, set(recv), links)
        missing = set(range(len(self.layout))) - set(seen)
        if missing:
            raise PlanError(f"chunks {sorted(missing)[:8]} are in no group")
        if self.multicast is not None:
            for src, to in self.multicast.items():
                if src not in pset or not set(to) <= pset or src in to:
                    raise PlanError(f"multicast: source {src} has receivers outside the participants")
        return self

    @staticmethod
    def _check_group(g_idx: int, g: ChunkGroup, members: set[int], receivers: set[int],
                     links: Iterable[tuple[int, int]] | None) -> None:
        where = f"group {g_idx}"
        if g.direct:
            _check_direct(where, g, members, receivers)
            return
        agg = set(g.parent)
        if g.root not in agg:
            raise PlanError(f"{where}: root {g.root} is not a participant nor a node of its aggregation tree")
        if g.parent[g.root] is not None:
            raise PlanError(f"{where}: root {g.root} has a parent")
        if not members <= agg:
            raise PlanError(f"{where}: aggregation tree covers {sorted(agg)}, not the members "
                            f"{sorted(members - agg)} (every member contributes to every chunk)")
        for n, p in g.parent.items():
            if n != g.root and (p is None or p not in agg or p == n):
                raise PlanError(f"{where}: node {n} has parent {p}, not a node of the aggregation tree")
        has_kids = {p for p in g.parent.values() if p is not None}
        for n in sorted(agg - members):
            if n not in has_kids:
                raise PlanError(f"{where}: node {n} is a leaf of the aggregation tree but no member: it "
                                "would only send an empty sum (an aggregator needs children)")
        for n in agg:  # every chain of parents ends at the root
            hops, cur = 0, n
            while cur != g.root:
                cur = g.parent[cur]  # type: ignore[assignment]
                hops += 1
                if hops > len(agg):
                    raise PlanError(f"{where}: aggregation tree has a cycle through node {n}")
        reached = {g.root}
        frontier = [g.root]
        counted: dict[int, int] = {}
        for kids in g.children.values():
            for k in kids:
                counted[k] = counted.get(k, 0) + 1
        if any(v > 1 for v in counted.values()) or g.root in counted:
            raise PlanError(f"{where}: broadcast tree reaches a node more than once")
        while frontier:
            nxt = []
            for u in frontier:
                for k in g.children.get(u, ()):
                    reached.add(k)
                    nxt.append(k)
            frontier = nxt
        orphans = {n for n in g.children if g.children[n]} - reached
        if orphans:
            raise PlanError(f"{where}: broadcast from {sorted(orphans)}, which the broadcast tree never reaches")
        if not receivers <= reached:
            raise PlanError(f"{where}: broadcast tree misses nodes {sorted(receivers - reached)} (receivers)")
        for n in sorted(reached - receivers):
            if not g.children.get(n):
                raise PlanError(f"{where}: node {n} is a leaf of the broadcast tree but no receiver: it "
                                "would get the final value for nothing (a replicating node needs children)")
        link_set = set(links) if links is not None else None
        check_sharing(g.weight, g.priority, g.deadline_s, where)
        if g.bcast_priority is not None:
            check_sharing(g.weight, g.bcast_priority, None, f"{where} (broadcast)")
        if g.fcfs is not True and g.fcfs is not False:
            raise PlanError(f"{where}: fcfs {g.fcfs!r} is not true or false")
        if g.fcfs and g.deadline_s is not None:
            raise PlanError(f"{where}: fcfs orders flows by their arrival; it takes no deadline_s")
        for (a, b), mbps in g.rates.items():
            if g.parent.get(a) != b and b not in g.children.get(a, ()):
                raise PlanError(f"{where}: a rate for {a}->{b}, which is not a tree edge")
            if isinstance(mbps, bool) or not isinstance(mbps, int | float) or not math.isfinite(mbps) or mbps <= 0:
                raise PlanError(f"{where}: rate {mbps!r} for {a}->{b} is not a finite Mbit/s > 0")
        for (a, b), routes in g.aux.items():
            if g.parent.get(a) != b and b not in g.children.get(a, ()):
                raise PlanError(f"{where}: auxiliary routes for {a}->{b}, which is not a tree edge")
            for r in routes:
                if len(r) < 3 or r[0] != a or r[-1] != b or len(set(r)) != len(r):
                    raise PlanError(f"{where}: auxiliary route {r} is not a simple relay path {a}->..->{b}")
                if link_set is not None:
                    for u, v in zip(r, r[1:], strict=False):
                        if (u, v) not in link_set:
                            raise PlanError(f"{where}: auxiliary route {r} uses {u}->{v}, not a link")

    # --- wire form ----------------------------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        return {
            "version": self.version, "scheme": self.scheme, "participants": list(self.participants),
            "weights": [[n, w] for n, w in sorted(self.weights.items())],
            "layout": [list(x) for x in self.layout],
            "groups": [group_to_wire(g) for g in self.groups],
            "multicast": None if self.multicast is None
            else [[s, list(r)] for s, r in sorted(self.multicast.items())],
            "receivers": None if self.receivers is None else list(self.receivers),
        }

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> Plan:
        try:
            groups = tuple(group_from_wire(g) for g in d["groups"])
            mc, recv = d.get("multicast"), d.get("receivers")
            return cls(version=d["version"], scheme=d["scheme"], participants=tuple(d["participants"]),
                       weights={n: float(w) for n, w in d["weights"]},
                       layout=tuple((o, n) for o, n in d["layout"]), groups=groups,
                       multicast=None if mc is None else {s: tuple(r) for s, r in mc},
                       receivers=None if recv is None else tuple(recv))
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"malformed plan on the wire: {exc!r}") from None


def group_to_wire(g: ChunkGroup) -> dict[str, Any]:
    """A group's wire form; sharing fields only where they differ from plain round-robin (plans of
    schemes that share nothing keep their size and compare equal to older ones)."""
    d: dict[str, Any] = {"chunks": list(g.chunks), "root": g.root,
                         "parent": [[n, -1 if p is None else p] for n, p in sorted(g.parent.items())],
                         "children": [[n, list(k)] for n, k in sorted(g.children.items())],
                         "aux": aux_to_wire(g.aux)}
    if g.weight != 1.0:
        d["weight"] = g.weight
    if g.priority:
        d["priority"] = g.priority
    if g.deadline_s is not None:
        d["deadline_s"] = g.deadline_s
    if g.rates:
        d["rates"] = [[a, b, r] for (a, b), r in sorted(g.rates.items())]
    if g.own_class:
        d["own_class"] = True
    if g.fcfs:
        d["fcfs"] = True
    if g.bcast_priority is not None:
        d["bcast_priority"] = g.bcast_priority
    if g.direct:
        d["direct"] = True
    return d


def group_from_wire(g: Mapping[str, Any]) -> ChunkGroup:
    dl = g.get("deadline_s")
    return ChunkGroup(chunks=tuple(g["chunks"]), root=g["root"],
                      parent={n: (None if p == -1 else p) for n, p in g["parent"]},
                      children={n: tuple(k) for n, k in g["children"]},
                      aux=aux_from_wire(g.get("aux", [])), weight=float(g.get("weight", 1.0)),
                      priority=g.get("priority", 0), deadline_s=None if dl is None else float(dl),
                      rates={(a, b): float(r) for a, b, r in g.get("rates", [])},
                      own_class=g.get("own_class", False) is True, fcfs=g.get("fcfs", False) is True,
                      bcast_priority=g.get("bcast_priority"), direct=g.get("direct", False) is True)


def _check_direct(where: str, g: ChunkGroup, members: set[int], receivers: set[int]) -> None:
    """An all-to-all group: every member sends to every other receiver, nobody relays or aggregates."""
    if set(g.parent) != members | receivers or any(p is not None for p in g.parent.values()):
        raise PlanError(f"{where}: an all-to-all group maps exactly its members and receivers to no parent")
    if g.root != min(members):
        raise PlanError(f"{where}: an all-to-all group's root is its lowest member ({min(members)}), not {g.root}")
    for m in sorted(members):
        if set(g.children.get(m, ())) != receivers - {m} or len(g.children.get(m, ())) != len(receivers - {m}):
            raise PlanError(f"{where}: member {m} must send to exactly the other receivers "
                            f"{sorted(receivers - {m})} in an all-to-all group")
    if set(g.children) - members:
        raise PlanError(f"{where}: nodes {sorted(set(g.children) - members)} send in an all-to-all group "
                        "but are no members")
    if g.aux or g.rates:
        raise PlanError(f"{where}: an all-to-all group takes no auxiliary routes or rates")
    check_sharing(g.weight, g.priority, g.deadline_s, where)


def direct_group(chunks: Iterable[int], members: Iterable[int], receivers: Iterable[int]) -> ChunkGroup:
    """All-to-all: each member straight to every other receiver, which sums on its own."""
    ms, rs = sorted(set(members)), sorted(set(receivers))
    return ChunkGroup(tuple(chunks), ms[0], dict.fromkeys(sorted(set(ms) | set(rs))),
                      {m: tuple(r for r in rs if r != m) for m in ms}, direct=True)


def check_sharing(weight: Any, priority: Any, deadline_s: Any, where: str = "sharing") -> None:
    """Raise PlanError unless these make a traffic class (overlay.classes)."""
    w = weight
    if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or not 0 < w <= MAX_WEIGHT:
        raise PlanError(f"{where}: weight {w!r} is not a share in (0, {MAX_WEIGHT:g}]")
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority < PRIORITIES:
        raise PlanError(f"{where}: priority {priority!r} is not a level 0..{PRIORITIES - 1}")
    dl = deadline_s
    if dl is not None and (isinstance(dl, bool) or not isinstance(dl, int | float) or not math.isfinite(dl)
                           or dl <= 0):
        raise PlanError(f"{where}: deadline {dl!r} is not a finite number of seconds > 0")


def with_sharing(plan: Plan, *, weight: float = 1.0, priority: int = 0, deadline_s: float | None = None) -> Plan:
    """The plan with every tree a class of its own with these values (a task-level share, priority or
    deadline): even at the defaults it is then shared with others as a class, not round-robin."""
    return dataclasses.replace(plan, groups=tuple(
        dataclasses.replace(g, weight=weight, priority=priority, deadline_s=deadline_s, own_class=True)
        for g in plan.groups))


AuxTable = Mapping[tuple[NodeId, NodeId], tuple[tuple[NodeId, ...], ...]]


def aux_to_wire(aux: AuxTable) -> list[list[Any]]:
    return [[a, b, [list(r) for r in rs]] for (a, b), rs in sorted(aux.items())]


def aux_from_wire(wire: Iterable[Any]) -> dict[tuple[NodeId, NodeId], tuple[tuple[NodeId, ...], ...]]:
    return {(a, b): tuple(tuple(r) for r in rs) for a, b, rs in wire}


def tree_group(chunks: Iterable[int], root: NodeId, parent: Mapping[NodeId, NodeId | None]) -> ChunkGroup:
    """A group whose broadcast tree is the reverse of its aggregation tree (the common case)."""
    children: dict[NodeId, list[NodeId]] = {}
    for n, p in parent.items():
        if p is not None:
            children.setdefault(p, []).append(n)
    return ChunkGroup(tuple(chunks), root, dict(parent), {p: tuple(sorted(k)) for p, k in children.items()})
