"""Topology-adaptive tree packing (seed 001): many reduce and broadcast trees rooted at different
members, each carrying a slice of the tensor in proportion to the rate the packing LP gives it.

The LP (`packing_lp.pack`, column generation on HiGHS) packs, per root v, reduce in-arborescences and
broadcast out-arborescences whose weights (Mbit/s) sum to chi(v) each, all of them together within
every directed link's rate (overlapped), maximising sum chi; the round then takes T_LP = S / sum chi.
Nodes outside the members may relay and aggregate (Steiner nodes), never own parameters.

Compiling a packing into the one plan form: a group has one aggregation tree and one broadcast tree
for the same chunks, so per root the reduce trees and broadcast trees are paired by cutting [0, chi(v))
into the intervals both sides' weights make (at most |I(v)| + |J(v)| - 1 pairs); a pair of amount a
carries S * a / sum chi parameters and shares every link it uses by weight a (weighted fair queuing:
a tree gets at least its LP share and takes what others leave), optionally also paced to a on each
of its edges (`pace`). Chunks are sized per group so each tree pipelines: a chunk is summed at every
inner node before it moves on, so a group whose trees are d hops deep (aggregation plus broadcast)
ends about (d - 1) chunk times after its last chunk left, and with s chunks a chunk time is T_LP / s;
each group gets s = (d - 1) / `fill` chunks (never below `min_chunk_params` each), so every group's
pipeline costs about `fill` of T_LP.

Options (Job.options): `relays` (nodes outside the members the trees may use: "all" known nodes,
the default, or a list; "none"), `no_overlap` (reduce and broadcast packed as separate stages,
digest LP (4): T = 2 S / sum chi; the data plane still pipelines them), `max_trees_per_root`
(per role, default 8), `fill` (default 0.1), `min_chunk_params` (default: a twelfth of the job's
chunk, at least 1024: every chunk costs our agents CPU at every hop, and a dense mesh's thin trees
at 1024 starved 10 agents on 2 cores), `pace` (default off), `min_gain` (default 0.05: a re-solve
replaces the job's current packing only if its sum chi beats what the current trees still get on the
new rates by this fraction; measurement noise moves a mesh's optimum by a few per cent, and every new
version costs every agent a plan switch and the scheduler two predictions), `variants` (default 3; 1:
the first solve alone: the job's first packing on measured rates is the fastest the simulator predicts
of that many LP solves, on the view's rates and on copies jittered by 2 %; VARIANTS below says why).
The plan's `info` records sum chi (LP and after pruning and rounding), T_LP, lambda, S / lambda, trees,
column-generation iterations, the LP gap and the solve time.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from core.plan import ChunkGroup, Job, Plan, PlanError
from sim import MEASURED, SimNetwork, SimulationOverBudget, SimulationStalled, simulate

from ..view import NetworkView
from .onview import MIN_SIM_S, view_network
from .packing_lp import Packing, Tree, pack

FLOAT32 = 4
FILL = 0.1
MIN_CHUNK_PARAMS = 1024
CHUNK_FLOOR_DIVISOR = 12
MAX_TREES_PER_ROOT = 8
MIN_GAIN = 0.05
# the LP's optimum is one vertex of many of (nearly) the same sum chi, and they pipeline very differently:
# on internet2 x 0.05 (resnet50, chunks fitted to 2 CPUs) ten vertices that measurement noise of 3 % picks
# simulated 0.633-0.752 s at one T_LP of 0.48 s (deep, thin trees cut into few chunks). So a new packing
# is solved VARIANTS times, on the rates as they are and on copies jittered by VARIANT_JITTER (less than
# the view's own noise), and the one the simulator predicts fastest on the view runs: 0.629-0.708 s over
# the same ten views (hetero:20-155 x 0.3, 8 nodes, eight views: 0.675-0.866 s before, 0.642-0.800 s, the
# budget leaving room for two variants there)
VARIANTS = 3
VARIANT_JITTER = 0.02
VARIANT_BUDGET_S = 0.6  # seconds the search may spend past the first solve; a simulation gets what is left


def plan(view: NetworkView, job: Job, memory: dict[str, Any] | None = None, *,
         fit: Callable[[Plan], Plan] | None = None) -> Plan:
    """Solve the packing LP on the view's rates and compile it into groups (module docstring);
    `memory` keeps the job's current packing, which a re-solve must beat by `min_gain`. `fit`: what
    the caller does to a compiled plan before it runs (cpufit's chunk fit), done to every variant
    before the simulator compares them."""
    opts = job.options
    members = tuple(sorted(job.participants))
    relays = _relays(view, members, opts.get("relays", "all"))
    nodes = set(members) | relays
    capacity = _capacity(view, nodes)
    overlap = not opts.get("no_overlap", False)
    max_trees = int(opts.get("max_trees_per_root", MAX_TREES_PER_ROOT))
    pk = pack(capacity, members, overlap=overlap, max_trees_per_root=max_trees)
    gain = float(opts.get("min_gain", MIN_GAIN))
    if not gain >= 0:
        raise PlanError(f"packing: min_gain must be >= 0, got {gain}")
    memory = {} if memory is None else memory
    kept = memory.get("packing")
    if kept is not None and pk.sum_chi <= (1.0 + gain) * achieved(kept[0], capacity):
        return kept[1]  # not worth a new version: the scheduler sees the same policy
    variants = opts.get("variants", VARIANTS)
    if not isinstance(variants, int) or isinstance(variants, bool) or variants < 1:
        raise PlanError(f"packing: variants must be a whole number >= 1, got {variants!r}")

    def build(p: Packing) -> Plan:
        out = compile_packing(p, job, fill=float(opts.get("fill", FILL)), min_chunk_params=chunk_floor(job),
                              pace=bool(opts.get("pace", False)))
        return out if fit is None else fit(out)

    def solve(k: int) -> Packing:
        return honest(pack(jittered(capacity, k), members, overlap=overlap, max_trees_per_root=max_trees),
                      capacity, pk)

    # a job searches once: its first packing on rates the view has measured (on nominal guesses the
    # simulator would compare fictions). Later re-solves answer rates that moved, and a switch is worth
    # most early: searching at every flip of auto's flipping trace read 0.961 x the best fixed scheme's
    # time in one run (0.90-0.97 without it, median 0.93), and one decision on its random trace took 2.2 s
    search = not memory.get("searched") and all(view.known(*e) for e in links_of(pk))
    if search:
        memory["searched"] = True
    chosen = fastest(pk, build, solve, view_network(view), variants if search else 1)
    memory["packing"] = chosen
    return chosen[1]


def links_of(pk: Packing) -> set[tuple[int, int]]:
    """The directed links the packing's trees use."""
    return {e for role in ("reduce", "broadcast") for ts in getattr(pk, role).values() for t in ts
            for e in t.edges(role)}


def jittered(capacity: Mapping[tuple[int, int], float], k: int) -> dict[tuple[int, int], float]:
    """Variant k's rates: every link's moved by up to VARIANT_JITTER, seeded by k (0: as they are)."""
    if k == 0:
        return dict(capacity)
    rng = random.Random(k)
    return {ln: c * (1.0 + VARIANT_JITTER * rng.uniform(-1.0, 1.0)) for ln, c in sorted(capacity.items())}


def honest(pk: Packing, capacity: Mapping[tuple[int, int], float], first: Packing) -> Packing:
    """A packing solved on jittered rates, its weights scaled to what its trees get on the real ones
    (`achieved`): its sum chi and T_LP are then its own on the view, and `sum_chi_lp` the real LP's."""
    scale = achieved(pk, capacity) / pk.sum_chi if pk.sum_chi > 0 else 0.0

    def trees(side: Mapping[int, tuple[Tree, ...]]) -> dict[int, tuple[Tree, ...]]:
        return {v: tuple(dataclasses.replace(t, weight=t.weight * scale) for t in ts) for v, ts in side.items()}

    return dataclasses.replace(pk, reduce=trees(pk.reduce), broadcast=trees(pk.broadcast),
                               chi={v: c * scale for v, c in pk.chi.items()}, sum_chi=pk.sum_chi * scale,
                               sum_chi_lp=first.sum_chi_lp, solve_s=first.solve_s + pk.solve_s)


def fastest(first: Packing, build: Callable[[Packing], Plan], solve: Callable[[int], Packing], net: SimNetwork,
            variants: int) -> tuple[Packing, Plan]:
    """Of `first` and the packings solved on `variants` - 1 jittered copies of the rates (module
    docstring), the one whose plan (`build`) the simulator predicts fastest on `net`, with each
    candidate's predicted round in its plan's info; `first` wherever none could be predicted. A search
    that has spent VARIANT_BUDGET_S (of CPU or of wall time) tries no further variant."""
    start, wall0 = time.thread_time(), time.perf_counter()
    tried: list[tuple[Packing, Plan, float]] = []
    for k in range(variants):
        # CPU and wall time alike: the solver runs niced behind the agents, and waiting for a core delays too
        left = VARIANT_BUDGET_S - max(time.thread_time() - start, time.perf_counter() - wall0)
        if k and left <= 0:
            break
        pk = first if k == 0 else solve(k)
        out = build(pk)
        if variants == 1:
            return pk, out
        try:
            round_s = simulate(out, net, costs=MEASURED, cpu_budget_s=max(MIN_SIM_S, left)).round_s
        except (SimulationOverBudget, SimulationStalled, ValueError, KeyError):
            round_s = math.inf  # no prediction: never preferred to one with
        tried.append((pk, out, round_s))
    k = min(range(len(tried)), key=lambda i: (tried[i][2], i))
    pk, out, _ = tried[k]
    predicted = [None if math.isinf(r) else round(r, 4) for *_, r in tried]
    return pk, dataclasses.replace(out, info={**out.info, "variant": k, "variants_round_s": predicted,
                                              "search_s": round(time.thread_time() - start, 4)})


def achieved(pk: Packing, capacity: Mapping[tuple[int, int], float]) -> float:
    """Sum chi `pk`'s trees get on other rates: their weights scaled by the tightest link they load
    (all trees at once when overlapped, each stage alone otherwise); 0 if a link they use is gone."""
    stages = ([("reduce", pk.reduce), ("broadcast", pk.broadcast)],) if pk.overlap else \
        ([("reduce", pk.reduce)], [("broadcast", pk.broadcast)])
    scale = math.inf
    for stage in stages:
        load: dict[tuple[int, int], float] = {}
        for role, per_root in stage:
            for trees in per_root.values():
                for t in trees:
                    for e in t.edges(role):
                        load[e] = load.get(e, 0.0) + t.weight
        scale = min([scale] + [capacity.get(e, 0.0) / w for e, w in load.items() if w > 0])
    return pk.sum_chi * scale if math.isfinite(scale) else 0.0


def _capacity(view: NetworkView, nodes: set[int]) -> dict[tuple[int, int], float]:
    """The view's rates of the links among `nodes`. A link not measured yet counts at the median of
    those measured (once some are): the nominal guess would make the LP pile trees onto every
    unknown link of a slower WAN, and their measurements arrive as the trees use them anyway."""
    links = [(a, b) for a, b in view.links() if a in nodes and b in nodes]
    known = sorted(view.rate(a, b) for a, b in links if view.known(a, b))
    typical = known[len(known) // 2] if known else None
    return {(a, b): view.rate(a, b) if typical is None or view.known(a, b) else typical for a, b in links}


def _relays(view: NetworkView, members: Sequence[int], spec: Any) -> set[int]:
    if spec in (None, "none"):
        return set()
    if spec == "all":
        return set(view.nodes) - set(members)
    try:
        out = {int(n) for n in spec}
    except (TypeError, ValueError):
        raise ValueError(f"packing: relays must be 'all', 'none' or a list of node ids, got {spec!r}") from None
    unknown = sorted(out - set(view.nodes))
    if unknown:
        raise ValueError(f"packing: relays {unknown} are not nodes the view knows")
    return out - set(members)


def pair_trees(reduce: Sequence[Tree], broadcast: Sequence[Tree]) -> list[tuple[Tree, Tree, float]]:
    """One root's reduce and broadcast trees paired over [0, chi): (reduce, broadcast, amount), the
    amounts of a reduce tree summing to its weight and likewise for a broadcast tree."""
    rs = sorted(reduce, key=lambda t: -t.weight)
    bs = sorted(broadcast, key=lambda t: -t.weight)
    out: list[tuple[Tree, Tree, float]] = []
    i = j = 0
    left_r = rs[0].weight if rs else 0.0
    left_b = bs[0].weight if bs else 0.0
    while i < len(rs) and j < len(bs):
        a = min(left_r, left_b)
        if a > 1e-9 * max(rs[0].weight, bs[0].weight):
            out.append((rs[i], bs[j], a))
        left_r -= a
        left_b -= a
        if left_r <= 1e-9 * rs[0].weight:
            i += 1
            left_r = rs[i].weight if i < len(rs) else 0.0
        if left_b <= 1e-9 * bs[0].weight:
            j += 1
            left_b = bs[j].weight if j < len(bs) else 0.0
    return out


def largest_remainder(total: int, shares: Sequence[float]) -> list[int]:
    """`total` split in proportion to `shares`, whole numbers summing to it exactly."""
    s = sum(shares)
    raw = [total * x / s for x in shares]
    out = [math.floor(x) for x in raw]
    for k in sorted(range(len(raw)), key=lambda k: out[k] - raw[k])[: total - sum(out)]:
        out[k] += 1
    return out


def compile_packing(pk: Packing, job: Job, *, fill: float = FILL, min_chunk_params: int = MIN_CHUNK_PARAMS,
                    pace: bool = False, scheme: str = "packing") -> Plan:
    """The packing as a plan: paired trees as groups, parameters in proportion to each pair's amount,
    chunks sized for pipelining, each group a traffic class of weight = its amount (Mbit/s)."""
    if not 0 < fill <= 1 or min_chunk_params < 1:
        raise PlanError(f"packing: fill ({fill}) must be in (0, 1] and min_chunk_params ({min_chunk_params}) >= 1")
    members = set(job.participants)
    pairs = [(v, r, b, a) for v in sorted(pk.chi) for r, b, a in
             pair_trees(pk.reduce.get(v, ()), pk.broadcast.get(v, ()))]
    if not pairs:
        raise PlanError("packing: the LP found no tree (sum chi = 0)")
    sizes = largest_remainder(job.params, [a for *_, a in pairs])
    layout: list[tuple[int, int]] = []
    groups: list[ChunkGroup] = []
    off = 0
    used = []
    for (v, r, b, a), n in zip(pairs, sizes, strict=True):
        if n == 0:
            continue  # a sliver the rounding left nothing: its tree carries nothing this round
        parent = _pruned(dict(r.parent), members)
        children = children_of(_pruned(dict(b.parent), members))
        first = len(layout)
        layout += pipelined(off, n, tree_depth(parent) + tree_depth(b.parent), fill, min_chunk_params)
        off += n
        rates: dict[tuple[int, int], float] = {}
        if pace:
            for c, p in parent.items():
                if p is not None:
                    rates[(c, p)] = rates.get((c, p), 0.0) + a
            for p, kids in children.items():
                for k in kids:
                    rates[(p, k)] = rates.get((p, k), 0.0) + a
        groups.append(ChunkGroup(tuple(range(first, len(layout))), v, parent, children, weight=a, rates=rates,
                                 own_class=True))
        used.append((n, a))
    # what rounding left: the slowest group's time at its amount against T_LP
    t_eff = max(n / a for n, a in used)
    info = {"sum_chi": pk.sum_chi, "sum_chi_lp": pk.sum_chi_lp, "lambda": pk.lam, "trees": pk.trees,
            "iterations": pk.iterations, "lp_gap_pct": pk.gap_pct, "solve_s": pk.solve_s, "overlap": pk.overlap,
            "pruning_loss_pct": max(0.0, 100.0 * (1.0 - pk.sum_chi / pk.sum_chi_lp)) if pk.sum_chi_lp > 0 else 0.0,
            "params": job.params, "groups": len(groups), "chunks": len(layout),
            "t_lp_s": _seconds(job.params, pk.sum_chi, overlap=pk.overlap),
            "s_over_lambda_s": _seconds(job.params, pk.lam, overlap=True),
            "sum_chi_rounded": job.params / t_eff,
            "rounding_loss_pct": max(0.0, 100.0 * (1.0 - job.params / t_eff / pk.sum_chi))}
    return Plan(0, scheme, tuple(job.participants), {n: 1.0 for n in job.participants}, tuple(layout),
                tuple(groups), info=info)


def chunk_floor(job: Job) -> int:
    """The smallest chunk a packing cuts: the `min_chunk_params` option, else a twelfth of the job's
    chunk size (the data plane's granularity the user chose), never below MIN_CHUNK_PARAMS."""
    return int(job.options.get("min_chunk_params", max(MIN_CHUNK_PARAMS, job.chunk_params // CHUNK_FLOOR_DIVISOR)))


def pipelined(off: int, n: int, depth: int, fill: float, min_chunk_params: int) -> list[tuple[int, int]]:
    """Chunks (offset, length) for n parameters from `off` on a group `depth` store-and-forward steps
    deep (aggregation plus broadcast): its pipeline then costs about `fill` of the group's time."""
    size = max(min_chunk_params, math.ceil(n * fill / max(1, depth - 1)))
    return [(o, min(size, off + n - o)) for o in range(off, off + n, size)]


def _seconds(params: int, mbps: float, *, overlap: bool) -> float:
    """S / rate (overlapped stages) or 2 S / rate (reduce, then broadcast)."""
    return (1 if overlap else 2) * params * FLOAT32 * 8 / (mbps * 1e6) if mbps > 0 else math.inf


def tree_depth(parent: Mapping[int, int | None]) -> int:
    """Hops from the deepest node to the root."""
    def hops(n: int) -> int:
        k = 0
        while (p := parent.get(n)) is not None:
            n, k = p, k + 1
        return k
    return max((hops(n) for n in parent), default=0)


def _pruned(parent: dict[int, int | None], members: set[int]) -> dict[int, int | None]:
    """Drop leaves outside the members (a relay with nothing below it has no part in the tree)."""
    while True:
        has_kids = {p for p in parent.values() if p is not None}
        leaves = [n for n in parent if n not in members and n not in has_kids and parent[n] is not None]
        if not leaves:
            return parent
        for n in leaves:
            del parent[n]


def children_of(parent: Mapping[int, int | None]) -> dict[int, tuple[int, ...]]:
    kids: dict[int, list[int]] = {}
    for n, p in parent.items():
        if p is not None:
            kids.setdefault(p, []).append(n)
    return {p: tuple(sorted(k)) for p, k in kids.items()}
