"""CREW (seed 004): a partial reduce of the group P spread over every active worker.

The model is cut into blocks, one per aggregator; every active worker (not only the p members) may
aggregate one, sized by LP (2) on the view's bandwidths (`split`: "na", the closed form; "ed", even
division) and cut from the chunk layout by Algorithm 1 (crew_split). Each block is one group of the
plan: a weighted scatter (every member sends its chunks of block j to aggregator j), the reduce at j
(chunk by chunk, as the copies arrive), and the multicast of each reduced chunk straight back to every
member — the tree of block j is a star rooted at j. A worker outside P aggregates without contributing.

Per-link flow scheduling (`sched`), on the data plane's traffic classes (overlay.classes): a block's
scatter and its multicast are two classes on a link (its aggregation and its broadcast), so

    fs   every (task, block, phase) a class of weight 1: flows share each link equally (per-flow fair)
    fl   flow-level FCFS (the default): each class ordered on each link by when its first chunk was
         ready at the sender (`ChunkGroup.fcfs`): a flow that came first is never preempted by a later one
    tl   task-level FCFS: one deadline offset for every task, so the earliest-started task goes first
    c1   multicast preempts scatter (broadcast at a higher priority), FCFS within each
    c2   scatter preempts multicast (aggregation at a higher priority), FCFS within each
    none plain round-robin (the data plane's default: one FIFO per origin -> destination)

Options: `aggregate` ("all": every node the view still has links of, the default; "members": only
P, which is OPR, the original partial reduce, scheme "opr"), `aggregators` (the generic option: a list
of nodes outside the members; A is then the members and those), `split` (na | ed), `sched`, `chunks`
(cut the tensor into this many chunks instead of the job's chunk size), `blocks` ([[root, [[lo, hi],
...]], ...]: a fixed assignment, as a failover re-plan passes it: the same chunks, a block moved to
its replacement), `from_blocks` (the same form: the default plan the members already scattered by,
non-blocking scatter; the new split re-arranges it by Algorithm 2). The plan's `info` holds the
split (x per aggregator, T_s and T_m of LP (2) in seconds on the view's rates) for tools and the
failure policy's time budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from core.plan import ChunkGroup, Job, Plan, PlanError, make_layout

from ..view import NetworkView
from .crew_split import Split, assign, rearrange, split

SCHEDULES = ("fl", "fs", "tl", "c1", "c2", "none")
MBIT_BYTES = 1e6 / 8
TL_DEADLINE_S = 1e6  # task-level FCFS: every task the same offset, so earlier starts come first


def plan(view: NetworkView, job: Job) -> Plan:
    opts = job.options
    members = tuple(sorted(job.participants))
    sched = opts.get("sched", "fl")
    if sched not in SCHEDULES:
        raise PlanError(f"sched: {sched!r} is not one of {', '.join(SCHEDULES)}")
    layout = _layout(job)
    scheme = "opr" if opts.get("aggregate") == "members" else "crew"
    if len(members) == 1:  # nothing to reduce: the member keeps its own tensor
        g = ChunkGroup(tuple(range(len(layout))), members[0], {members[0]: None}, {})
        return Plan(0, scheme, members, {members[0]: 1.0}, layout, (g,))
    if opts.get("blocks") is not None:
        blocks = _fixed_blocks(opts["blocks"], len(layout))
        info: dict[str, Any] = {"blocks": "fixed"}
    else:
        aggs = aggregators(view, members, opts.get("aggregators") or opts.get("aggregate", "all"))
        mode = opts.get("split", "na")
        s = split(members, aggs, _rates_of(view, members), mode)
        if opts.get("from_blocks") is not None:  # non-blocking scatter: Algorithm 2 from the default plan
            current = dict(_fixed_blocks(opts["from_blocks"], len(layout)))
            order = [*s.aggregators, *sorted(set(current) - set(s.aggregators))]
            x = [*s.x, *[0.0] * (len(order) - len(s.aggregators))]
            chunks = rearrange(x, [list(current.get(j, ())) for j in order])
        else:
            order, chunks = list(s.aggregators), assign(s.x, len(layout))
        blocks = [(j, tuple(c)) for j, c in zip(order, chunks, strict=True) if c]
        info = split_info(s, job.params * 4)
    groups = tuple(star_group(chunks, root, members, sched) for root, chunks in blocks)
    return Plan(0, scheme, members, {m: 1.0 for m in members}, layout, groups, info=info)


def rate(view: NetworkView, a: int, b: int) -> float:
    """Bytes/s the view gives link a->b (0: no such link, or it is out of planning)."""
    e = view.g.adj[a].get(b) if a in view.g else None
    return e["rate"] * MBIT_BYTES if e is not None else 0.0


def _rates_of(view: NetworkView, members: Sequence[int]) -> Callable[[int, int], float]:
    """b(i, j) in bytes/s, read once per member from the view (rates to and from the members are all
    LP (2) needs: p (n - 1) of each)."""
    g = view.g
    table: dict[tuple[int, int], float] = {}
    for m in members:
        if m in g:
            for j, e in g.succ[m].items():
                table[(m, j)] = e["rate"] * MBIT_BYTES
            for j, e in g.pred[m].items():
                table[(j, m)] = e["rate"] * MBIT_BYTES
    return lambda a, b: table.get((a, b), 0.0)


def aggregators(view: NetworkView, members: Sequence[int], spec: Any) -> tuple[int, ...]:
    """Who may aggregate: "all" active workers (nodes the view still has links of), "members" (OPR),
    or the members and a list of other nodes."""
    if spec == "all":
        return tuple(n for n in view.nodes if view.g.degree(n) > 0 or n in members)
    if spec == "members":
        return tuple(members)
    if isinstance(spec, list | tuple):
        return tuple(sorted({int(n) for n in spec} | set(members)))
    raise PlanError(f"aggregate: {spec!r} is not 'all' or 'members' (or a list of aggregators)")


def split_info(s: Split, model_bytes: int) -> dict[str, Any]:
    return {"x": {j: round(v, 6) for j, v in zip(s.aggregators, s.x, strict=True) if v > 0},
            "t_scatter_s": s.t_scatter * model_bytes, "t_multicast_s": s.t_multicast * model_bytes,
            "aggregators": sum(1 for v in s.x if v > 0)}


def star_group(chunks: Sequence[int], root: int, members: Sequence[int], sched: str) -> ChunkGroup:
    """Block `chunks` aggregated at `root`: scatter from every member to it, the multicast back."""
    parent: dict[int, int | None] = {m: root for m in members if m != root}
    parent[root] = None
    kids = tuple(m for m in members if m != root)
    cls: dict[str, Any]
    if sched == "none":
        cls = {}
    elif sched == "fs":
        cls = {"own_class": True}
    elif sched == "tl":
        cls = {"deadline_s": TL_DEADLINE_S}
    elif sched == "fl":
        cls = {"fcfs": True}
    elif sched == "c1":
        cls = {"fcfs": True, "priority": 0, "bcast_priority": 1}
    else:  # c2
        cls = {"fcfs": True, "priority": 1, "bcast_priority": 0}
    return ChunkGroup(tuple(chunks), root, parent, {root: kids} if kids else {}, **cls)


def _layout(job: Job) -> tuple[tuple[int, int], ...]:
    k = job.options.get("chunks")
    if k is None:
        return make_layout(job.params, job.chunk_params)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise PlanError(f"chunks: {k!r} is not a number of chunks >= 1")
    return make_layout(job.params, math.ceil(job.params / min(k, job.params)))


def _fixed_blocks(spec: Any, k: int) -> list[tuple[int, tuple[int, ...]]]:
    """[[root, [[lo, hi], ...]], ...] -> (root, chunks) per block; every chunk exactly once."""
    out: list[tuple[int, tuple[int, ...]]] = []
    seen: set[int] = set()
    try:
        for root, rs in spec:
            chunks = tuple(sorted(c for lo, hi in rs for c in range(int(lo), int(hi))))
            if chunks:
                out.append((int(root), chunks))
                seen.update(chunks)
    except (TypeError, ValueError):
        raise PlanError(f"blocks: {spec!r} is not [[root, [[lo, hi], ...]], ...]") from None
    if seen != set(range(k)) or sum(len(c) for _, c in out) != k:
        raise PlanError(f"blocks: must cover chunks 0..{k - 1} exactly once")
    return out


def blocks_of(plan: Plan) -> list[list[Any]]:
    """A plan's blocks in the `blocks` option's form (what a failover re-plan starts from)."""
    from .crew_split import ranges
    return [[g.root, [list(r) for r in ranges(g.chunks)]] for g in plan.groups]


def loads(plans: Mapping[int, Plan]) -> dict[int, float]:
    """l_k of Eq. (3): per worker, the share of a model it is scheduled to reduce, summed over the
    given (unfinished) tasks' plans."""
    out: dict[int, float] = {}
    for p in plans.values():
        k = len(p.layout)
        for g in p.groups:
            if g.children:
                out[g.root] = out.get(g.root, 0.0) + len(g.chunks) / k
    return out


def move_blocks(plan: Plan, alive: Sequence[int], b: Callable[[int, int], float], load: Mapping[int, float]
                ) -> tuple[list[list[Any]], list[dict[str, Any]]] | None:
    """§2.9's failover on a plan: every block whose aggregator is not alive or has a dead link (b = 0)
    to or from a member moves to the worker Eq. (3) picks (OPR: among the members); the others stay.
    Returns (the `blocks` option of the re-plan, the moves), or None if some block has no candidate
    (the task must be abandoned). `load`: l_k, every worker's blocks over unfinished tasks, this one's
    included."""
    from .crew_split import replacement
    members = plan.participants
    live = set(alive)
    load = dict(load)
    blocks = blocks_of(plan)
    k = len(plan.layout)
    moved: list[dict[str, Any]] = []
    for blk in blocks:
        root = blk[0]
        if root in live and all(min(b(root, m), b(m, root)) > 0 for m in members if m != root):
            continue
        share = sum(hi - lo for lo, hi in blk[1]) / k
        pool = members if plan.scheme == "opr" else sorted(live)
        new = replacement(members, root, share, pool, b, load)
        if new is None:
            return None
        load[new] = load.get(new, 0.0) + share
        load[root] = load.get(root, 0.0) - share
        moved.append({"from": root, "to": new, "share": round(share, 6)})
        blk[0] = new
    merged: dict[int, list[list[int]]] = {}
    for root, rs in blocks:  # a replacement that already held a block takes both
        merged.setdefault(root, []).extend(rs)
    return [[r, rs] for r, rs in merged.items()], moved
