"""Chunks cut no finer than the agents' CPU can handle: a plan's chunking fitted to the cores its agents share.

Planners that cut the tensor into many small chunks for pipelining (tree packing, BLINK: tens of
trees, each cut into chunks so that its pipeline costs ~`fill` of its time) assume that handling a
chunk costs nothing. It costs the agents at both ends of every link it crosses about
CPU_S_PER_CHUNK_HOP, and every GB crossing a link CPU_S_PER_GB (core/cpucost.py). Ten agents on one
2-core machine running tree packing on aws10 cut ~300 chunks of 17 KB that cross ~18 links each: about
four cores of chunk handling for a round at T_LP, where 1.5 are to be had. The agents then queue
for a CPU, the links run below their rates and the round measures the machine, not the WAN.

The rule. The launcher that places the agents tells the scheduler's view which machine each runs on
and its CPUs (a local `wansync run` or `train`: all on this one); agents on one machine share its cores
(NetworkView.cpu_hosts). For every machine, what its
agents spend on the plan's chunks in one round must stay within FIT_BUDGET of its cores:

    sum over the plan's tree edges e, of the share of e's two ends on the machine,
        of (chunks of e's group x CPU_S_PER_CHUNK_HOP + bytes of e's group x CPU_S_PER_GB)
    <= FIT_BUDGET x cpus x round

with the round from the planner's own pipeline model: alone, a group of s chunks on trees d steps deep
takes (s + d - 1) / s of its ideal time (packing's T_LP; BLINK's S / lambda, as the data plane
overlaps its two stages). Groups share links, and one's pipeline filling or draining leaves capacity
to the others: the round is the ideal plus SHARED_FILL of the groups' mean (weighted by parameters)
excess over it. Against the simulator (packing on aws10 x 0.02, hetero:20-155 x 8, internet2; floors
of 5 k-80 k parameters) the simulated excess was 0.36-0.63 of the model's. Fitted on 2 CPUs, the
simulated rounds' chunk handling came to 0.98-1.42 cores against a budget of 1.3 (packing and BLINK
on internet2, hetero:20-155:x=0.3 x 8). Where the plan's own
chunks fit, it is returned as it is. Otherwise every group's chunks are cut again at the smallest
common floor (in parameters) that fits, by bisection (coarser chunks only lower the load and lengthen
the round); no group's chunks get smaller than they were. Where even one chunk per group does not fit
(the bytes alone are too much), one chunk per group is what is cut, and `info["cpu_fit"]` says so.
Nodes on no known machine (agents placed by hand or over SSH; a view built from a topology file:
`wansync advise` without --cpus, `simulate`) are fitted to nothing: their chunks are cut as the
planner chose.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from core.cpucost import CPU_S_PER_CHUNK_HOP, CPU_S_PER_GB
from core.plan import ChunkGroup, Job, Plan

from ..view import NetworkView
from .packing import tree_depth

FLOAT32 = 4
# of a machine's cores the agents' chunks may take: below the forecast's CPU_BUDGET (0.75, where a run
# warns), as the scheduler, its solver and predictor and the loops' own slack need the rest. At 0.75 a
# fitted packing on hetero:20-155 x 8 lagged (p99 25 ms); at 0.65 the packing check's live runs
# (internet2 x 0.1, aws10 x 0.02) were valid once and lagged once (p99 21.8 ms); at 0.5 valid
FIT_BUDGET = 0.5
SHARED_FILL = 0.5  # of the groups' pipeline excess over T_LP that shows in the round (module docstring)


def tree_edges(g: ChunkGroup) -> list[tuple[int, int]]:
    """Every link a chunk of the group crosses once per round: its aggregation edges, then its broadcast's."""
    up = [] if g.direct else [(n, p) for n, p in g.parent.items() if p is not None]
    return up + [(p, c) for p, kids in g.children.items() for c in kids]


def depth(g: ChunkGroup) -> int:
    """Store-and-forward steps from the deepest contributor to the deepest receiver: its aggregation
    tree's depth plus its broadcast's (1 for an all-to-all group: one hop)."""
    if g.direct:
        return 1
    return tree_depth(g.parent) + tree_depth({c: p for p, kids in g.children.items() for c in kids})


@dataclasses.dataclass(frozen=True)
class _Group:
    """One group as the fit sees it: its parameters, its chunk size, its depth, and per machine how
    many of its edges' ends are there (halves: an edge with both ends there counts 1)."""

    params: int
    size: int
    depth: int
    ends: tuple[float, ...]

    def chunks(self, floor: int) -> int:
        return math.ceil(self.params / max(self.size, floor))

    def round_s(self, floor: int, ideal_s: float) -> float:
        """Its pipeline's time: s chunks take s + depth - 1 chunk times of ideal_s / s each."""
        s = self.chunks(floor)
        return ideal_s * (s + self.depth - 1) / s

    def cpu_s(self, floor: int, machine: int) -> float:
        ends = self.ends[machine]
        return ends * (self.chunks(floor) * CPU_S_PER_CHUNK_HOP + self.params * FLOAT32 / 1e9 * CPU_S_PER_GB)


def _groups(plan: Plan, hosts: Sequence[tuple[frozenset[int], int]]) -> list[_Group]:
    out = []
    for g in plan.groups:
        if g.chunks:
            lengths = [plan.layout[c][1] for c in g.chunks]
            edges = tree_edges(g)
            out.append(_Group(sum(lengths), max(lengths), depth(g),
                              tuple(sum(((a in nodes) + (b in nodes)) / 2 for a, b in edges) for nodes, _ in hosts)))
    return out


def _need(groups: list[_Group], floor: int, ideal_s: float, machines: int, shared_fill: float) -> list[float]:
    """Per machine, the cores its agents' chunk handling takes, rounds at the pipeline's estimate."""
    total = sum(g.params for g in groups)
    alone = sum(g.params * g.round_s(floor, ideal_s) for g in groups) / total if total else ideal_s
    round_s = ideal_s + shared_fill * (alone - ideal_s)
    return [sum(g.cpu_s(floor, m) for g in groups) / round_s for m in range(machines)]


def _fits(groups: list[_Group], floor: int, ideal_s: float, hosts: Sequence[tuple[frozenset[int], int]],
          shared_fill: float) -> bool:
    need = _need(groups, floor, ideal_s, len(hosts), shared_fill)
    return all(n <= FIT_BUDGET * cpus for n, (_, cpus) in zip(need, hosts, strict=True))


def fit_chunks(plan: Plan, hosts: Sequence[tuple[frozenset[int], int]], ideal_s: float, *,
               shared_fill: float = SHARED_FILL) -> Plan:
    """The plan with its groups' chunks cut no finer than `hosts` (per machine: its nodes and CPUs) can
    handle, in rounds as long as its pipelines make them from `ideal_s` (its round with no pipeline to
    fill, T_LP; module docstring). Every group's chunks must be consecutive in the layout, covering one
    range of parameters (as packing and BLINK compile them)."""
    if not hosts or not plan.groups or not ideal_s > 0:
        return plan
    if sorted(c for g in plan.groups for c in g.chunks) != list(range(len(plan.layout))):
        raise ValueError(f"{plan.scheme}: chunks outside the groups, or in two of them: cannot cut them again")
    groups = _groups(plan, hosts)
    if _fits(groups, 0, ideal_s, hosts, shared_fill):
        return plan
    lo, hi = 1, max(g.params for g in groups)  # _fits(hi) may be False: then one chunk per group, the least
    while lo < hi:
        mid = (lo + hi) // 2
        if _fits(groups, mid, ideal_s, hosts, shared_fill):
            hi = mid
        else:
            lo = mid + 1
    floor = lo
    layout: list[tuple[int, int]] = []
    out = []
    for g in plan.groups:
        spans = [plan.layout[c] for c in g.chunks]
        if not spans:
            out.append(g)
            continue
        start, size, total = spans[0][0], max(n for _, n in spans), sum(n for _, n in spans)
        if any(o != po + pn for (po, pn), (o, _) in zip(spans, spans[1:], strict=False)):
            raise ValueError(f"{plan.scheme}: a group's chunks do not cover one range: cannot cut them again")
        size = max(size, floor)
        first = len(layout)
        layout += [(o, min(size, start + total - o)) for o in range(start, start + total, size)]
        out.append(dataclasses.replace(g, chunks=tuple(range(first, len(layout)))))
    info = {"floor_params": floor, "chunks_before": len(plan.layout), "chunks": len(layout),
            "cores": [round(FIT_BUDGET * cpus, 3) for _, cpus in hosts],
            "need_cores_before": [round(x, 3) for x in _need(groups, 0, ideal_s, len(hosts), shared_fill)],
            "need_cores": [round(x, 3) for x in _need(groups, floor, ideal_s, len(hosts), shared_fill)],
            "fits": _fits(groups, floor, ideal_s, hosts, shared_fill)}
    return dataclasses.replace(plan, layout=tuple(layout), groups=tuple(out),
                               info={**plan.info, "chunks": len(layout), "cpu_fit": info})


def fitted(plan: Callable[..., Plan], ideal: str, *, chooses: bool = False) -> Callable[..., Plan]:
    """A planner whose plans are fitted to the view's machines (`fit_chunks`), its ideal round read
    from the plan's own `info[ideal]` (packing: "t_lp_s"; BLINK, whose stages the data plane overlaps:
    "s_over_lambda_s"). chooses: the planner compares plans it compiles (packing's variants), so it is
    given the fit (`fit=`) to make before it compares them, and returns a fitted plan."""

    def plan_fitted(view: NetworkView, job: Job, memory: dict[str, Any] | None = None) -> Plan:
        hosts = view.cpu_hosts()

        def fit(out: Plan) -> Plan:
            return fit_chunks(out, hosts, out.info.get(ideal) or 0.0)

        return plan(view, job, memory, fit=fit) if chooses else fit(plan(view, job, memory))

    return plan_fitted
