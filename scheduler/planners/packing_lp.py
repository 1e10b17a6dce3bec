"""The tree-packing LP (issue 18): how fast can trees rooted at every active node synchronize S?

For each active root v: reduce in-arborescences (toward v) and broadcast out-arborescences (from v),
each with a weight w (Mbit/s it takes on every one of its links). Σ reduce w of v = χ(v) = Σ broadcast
w of v. Maximize Σχ under link capacities. Root v owns χ(v)/Σχ of the parameters, each tree carries
a share ∝ its weight, so:

- `overlap=True` (the issue's LP): one capacity row per directed link, shared by the reduce and
  broadcast trees of all roots (they run at the same time). Round time **T = S / Σχ**.
  Every directed cut between active nodes carries each root's χ once (its broadcast trees leave
  the side holding the root, its reduce trees enter it), so Σχ ≤ λ, the smallest such cut.
- `overlap=False` (the digest's LP (4), for the Fig. 7 ablation): reduce and broadcast each get a
  link's full capacity (separate rows: the stages run one after the other). **T = 2·S / Σχ**.

Solved by column generation jointly over all roots: a HiGHS master (highspy; interior point, whose
centred duals price out few useless trees), its duals as edge prices, and per root and role the
cheapest arborescence under them (exact Edmonds when every node is active, the Steiner heuristic
otherwise; `arborescence.py`) plus depth-limited ones; the Farley bound says how far from the LP
optimum over all trees it stopped. An optimum may hold up to |E| + 2|V| trees, and a tree d levels
deep needs ~d/fill chunks to pipeline, so `pack` then takes, among packings of the generated trees
within SHALLOW_SLACK of the optimum, the vertex of least Σ weight x depth, keeps the heaviest
`max_trees_per_root` per root and role, and re-solves over those, reporting both optima. Pure:
capacities in, packing out; nothing here knows about plans or agents.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import networkx as nx
import numpy as np
from highspy import _core
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from .arborescence import INF, cost, depth, edmonds, prune, shallow, sparse_graph, steiner

Role = Literal["reduce", "broadcast"]
ROLES: tuple[Role, Role] = ("reduce", "broadcast")
REDUCED_COST_TOL = 1e-6  # a column enters when its reduced cost is below -tol (capacities scaled to max 1;
# the interior point duals are accurate to about 1e-8)
SHALLOW_LEVELS = (1, 2, 3)  # depth-limited trees priced each round besides the exact oracle's
SHALLOW_SLACK = 1e-4  # the shallowest packing may give up this share of the pool's optimum
PRICINGS = 4  # oracle calls per root and role in one column-generation round (see _column_generation)


@dataclass(frozen=True)
class Tree:
    """An arborescence as a parent map (node -> parent, root -> None); for a reduce tree the parent is
    the next hop toward the root, for a broadcast tree the node it receives from."""

    root: int
    parent: Mapping[int, int | None]
    weight: float  # Mbit/s it takes on each of its edges

    def edges(self, role: Role) -> tuple[tuple[int, int], ...]:
        """Directed links: reduce trees send child -> parent, broadcast trees parent -> child."""
        pairs = sorted((x, p) for x, p in self.parent.items() if p is not None)
        return tuple(pairs) if role == "reduce" else tuple((p, x) for x, p in pairs)


@dataclass(frozen=True)
class Packing:
    reduce: Mapping[int, tuple[Tree, ...]]  # per active root: in-arborescences toward it
    broadcast: Mapping[int, tuple[Tree, ...]]  # per active root: out-arborescences from it
    chi: Mapping[int, float]  # per active root, Σ reduce weights = Σ broadcast weights (may be 0)
    sum_chi: float  # after pruning: what a plan built from these trees gets
    sum_chi_lp: float  # the column-generation optimum before pruning
    lam: float  # smallest directed cut capacity between active nodes (Mbit/s); Σχ ≤ λ with overlap
    iterations: int  # master LP solves
    gap_pct: float  # Farley bound of the last pricing round over sum_chi_lp, in % (0 = LP optimum)
    solve_s: float
    trees: int  # reduce + broadcast trees kept
    overlap: bool  # True: T = S/Σχ; False: reduce then broadcast, T = 2·S/Σχ
    oracle_exact: bool = True  # False with inactive nodes: gap_pct is then relative to the heuristic oracle

    def round_time_s(self, size_mbit: float) -> float:
        """The LP round time for `size_mbit` of parameters: S/Σχ with overlap, 2·S/Σχ without."""
        return (1.0 if self.overlap else 2.0) * size_mbit / self.sum_chi


def min_cut(capacity: Mapping[tuple[int, int], float], active: Iterable[int]) -> float:
    """λ: the smallest capacity of a directed cut with active nodes on both sides. Any such cut
    separates a fixed active node a from some other active t, one way or the other."""
    nodes = sorted(set(active))
    if len(nodes) < 2:
        raise ValueError("min_cut: needs at least two active nodes")
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    for (u, v), b in capacity.items():
        g.add_edge(u, v, capacity=float(b))
    a, *rest = nodes
    return min(min(nx.maximum_flow_value(g, a, t), nx.maximum_flow_value(g, t, a)) for t in rest)


@dataclass
class _Graph:
    """The links as indices: node ids <-> 0..n-1, edges 0..m-1, capacities scaled to max 1."""

    ids: np.ndarray  # internal index -> node id
    active: np.ndarray  # internal indices of the active nodes, ascending id
    roots: np.ndarray  # positions in `active` of the nodes that may own parameters (every active one by default)
    src: np.ndarray
    dst: np.ndarray
    cap: np.ndarray  # scaled
    scale: float  # Mbit/s per scaled unit
    eidx: np.ndarray  # n x n: edge index of u->x, -1 if none

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def m(self) -> int:
        return len(self.src)

    @property
    def all_active(self) -> bool:
        return len(self.active) == self.n

    def matrix(self, values: np.ndarray, role: int, fill: float = INF) -> np.ndarray:
        """Per-edge values as an n x n matrix in out-tree orientation: a reduce tree is an out-tree
        of the reversed links, so its matrix is the transpose."""
        out = np.full((self.n, self.n), fill)
        out[self.src, self.dst] = values
        return out.T.copy() if role == 0 else out

    def tree_edges(self, parent: np.ndarray, role: int) -> np.ndarray:
        kids = np.flatnonzero(parent >= 0)
        if role == 0:
            return self.eidx[kids, parent[kids]]  # child -> parent
        return self.eidx[parent[kids], kids]  # parent -> child


def _graph(capacity: Mapping[tuple[int, int], float], active: Iterable[int],
           roots: Iterable[int] | None = None) -> _Graph:
    act = sorted(set(int(v) for v in active))
    if len(act) < 2:
        raise ValueError(f"pack: needs at least two active nodes, got {act}")
    owners = act if roots is None else sorted(set(int(v) for v in roots))
    if not owners or not set(owners) <= set(act):
        raise ValueError(f"pack: roots {owners} must be a non-empty subset of the active nodes {act}")
    for (u, v), b in capacity.items():
        if u == v or not np.isfinite(b) or b <= 0:
            raise ValueError(f"pack: link {u}->{v} has capacity {b}; links need distinct ends and a rate > 0")
    ids = np.array(sorted({u for u, _ in capacity} | {v for _, v in capacity} | set(act)))
    pos = {int(x): i for i, x in enumerate(ids)}
    src = np.array([pos[u] for u, _ in capacity], dtype=int)
    dst = np.array([pos[v] for _, v in capacity], dtype=int)
    n = len(ids)
    adj = csr_matrix((np.ones(len(src)), (src, dst)), shape=(n, n))
    _, label = connected_components(adj, directed=True, connection="strong")
    act_idx = np.array([pos[v] for v in act])
    if len(set(label[act_idx].tolist())) > 1:
        raise ValueError(f"pack: the active nodes {act} are not strongly connected by the links "
                         "(no arborescence spans them)")
    keep = label == label[act_idx[0]]  # a node off every path between active nodes can never help
    new = np.cumsum(keep) - 1
    emask = keep[src] & keep[dst]
    src, dst = new[src[emask]], new[dst[emask]]
    rates = np.array([float(b) for b in capacity.values()])[emask]
    scale = float(rates.max())
    nk = int(keep.sum())
    eidx = np.full((nk, nk), -1)
    eidx[src, dst] = np.arange(len(src))
    return _Graph(ids[keep], new[act_idx], np.array([act.index(v) for v in owners]), src, dst, rates / scale,
                  scale, eidx)


@dataclass
class _Columns:
    """Every tree generated so far, with its root (position in `active`) and role; column t of the
    master is tree t."""

    root: list[int] = field(default_factory=list)
    role: list[int] = field(default_factory=list)
    parent: list[np.ndarray] = field(default_factory=list)
    edges: list[np.ndarray] = field(default_factory=list)
    seen: set[tuple[int, int, bytes]] = field(default_factory=set)

    def add(self, root: int, role: int, parent: np.ndarray, edges: np.ndarray) -> bool:
        key = (root, role, np.sort(edges).tobytes())
        if key in self.seen:
            return False
        self.seen.add(key)
        self.root.append(root)
        self.role.append(role)
        self.parent.append(parent)
        self.edges.append(edges)
        return True


@dataclass
class _Solution:
    w: np.ndarray  # per column, scaled
    chi: np.ndarray  # per active root, scaled
    prices: np.ndarray  # per capacity row, >= 0
    alpha: np.ndarray  # (roots, 2): equality duals, the price a root's reduce/broadcast tree must beat

    @property
    def value(self) -> float:
        return float(self.chi.sum())


class _Master:
    """The restricted master LP, kept in one HiGHS instance that columns are added to as they are priced.

    During column generation (`interior=True`) it is solved by HiGHS's interior point method without
    crossover: interior duals are well-centred prices, which price out far fewer useless trees than
    a simplex vertex's extreme duals (30-node mesh: 14 rounds and ~5 s instead of ~65 rounds and
    minutes of degenerate simplex pivots). The pruned re-solve (`interior=False`) uses the simplex
    method, whose basic solution holds at most rows-many trees.

    Rows: one capacity row per directed link (two with `overlap=False`: reduce and broadcast each get
    the link), then per active root v the rows Σ reduce w - χ(v) = 0 and Σ broadcast w - χ(v) = 0.
    Columns: χ(v) per root (cost -1: HiGHS minimizes), then one per tree."""

    def __init__(self, g: _Graph, overlap: bool, *, interior: bool) -> None:
        # highspy's Highs() prints a banner from C on construction; the binding underneath does not
        self.h = _core._Highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("threads", 1)  # planners run beside the agents' event loops
        if interior:
            self.h.setOptionValue("solver", "ipm")
            self.h.setOptionValue("run_crossover", "off")
        self.g, self.overlap = g, overlap
        self.cap_rows = g.m if overlap else 2 * g.m
        a = len(g.active)
        inf = self.h.getInfinity()
        cap = g.cap if overlap else np.concatenate([g.cap, g.cap])
        none = np.zeros(0, dtype=np.int32)
        self.h.addRows(self.cap_rows, np.full(self.cap_rows, -inf), cap, 0, none, none, np.zeros(0))
        self.h.addRows(2 * a, np.zeros(2 * a), np.zeros(2 * a), 0, none, none, np.zeros(0))
        starts = np.arange(0, 2 * a, 2, dtype=np.int32)
        rows = (self.cap_rows + np.arange(2 * a)).astype(np.int32)
        upper = np.zeros(a)
        upper[g.roots] = inf  # an active node that may not own parameters keeps χ = 0
        self.h.addCols(a, -np.ones(a), np.zeros(a), upper, 2 * a, starts, rows, -np.ones(2 * a))
        self.trees = 0

    def add(self, cols: _Columns, t: int) -> None:
        """Column t of `cols` (columns must be added in order)."""
        assert t == self.trees
        role, edges = cols.role[t], cols.edges[t]
        rows = np.concatenate([edges + (0 if self.overlap else role * self.g.m),
                               [self.cap_rows + 2 * cols.root[t] + role]]).astype(np.int32)
        self.h.addCol(0.0, 0.0, self.h.getInfinity(), len(rows), rows, np.ones(len(rows)))
        self.trees += 1

    def shallowest(self, depths: np.ndarray, floor: float) -> _Solution:
        """Re-optimise among packings worth at least `floor` (scaled Σχ): the one with the least
        Σ weight x depth (a vertex: simplex), so the trees kept pipeline in fewer steps."""
        a = len(self.g.active)
        costs = np.concatenate([np.zeros(a), depths.astype(float)])
        self.h.changeColsCost(len(costs), np.arange(len(costs), dtype=np.int32), costs)
        self.h.addRow(floor, self.h.getInfinity(), a, np.arange(a, dtype=np.int32), np.ones(a))
        return self.solve()

    def solve(self) -> _Solution:
        self.h.run()
        status = self.h.getModelStatus()
        if status != _core.HighsModelStatus.kOptimal:
            raise RuntimeError(f"pack: master LP failed: {self.h.modelStatusToString(status)}")
        sol = self.h.getSolution()
        x, dual = np.asarray(sol.col_value), np.asarray(sol.row_dual)
        a = len(self.g.active)
        # HiGHS row duals are d(objective)/d(rhs) of a minimization: <= 0 on binding <= rows. The
        # reduced cost of a tree t of root v and role r is Σ_{e in t} prices_e - alpha[v, r].
        return _Solution(x[a:], x[:a], np.maximum(0.0, -dual[:self.cap_rows]),
                         dual[self.cap_rows:self.cap_rows + 2 * a].reshape(a, 2))


def _solve(g: _Graph, cols: _Columns, subset: np.ndarray, overlap: bool) -> _Solution:
    """The master over the columns in `subset` only (the pruned re-solve); `w` follows `subset`."""
    sub = _Columns()
    for t in subset:
        sub.add(cols.root[t], cols.role[t], cols.parent[t], cols.edges[t])
    master = _Master(g, overlap, interior=False)
    for t in range(len(subset)):
        master.add(sub, t)
    return master.solve()


class _Oracle:
    """Cheapest arborescence per root and role under edge prices: exact (Edmonds) when all nodes are
    active, the Steiner heuristic otherwise."""

    def __init__(self, g: _Graph, prices: np.ndarray, overlap: bool) -> None:
        self.g = g
        self.w = [g.matrix(prices if overlap else prices[r * g.m:(r + 1) * g.m], r) for r in (0, 1)]
        if not g.all_active:
            self.sparse = [sparse_graph(w) for w in self.w]

    def tree(self, root: int, role: int) -> tuple[np.ndarray, float]:
        v = int(self.g.active[root])
        if self.g.all_active:
            parent = edmonds(self.w[role], v)
        else:
            parent = steiner(self.w[role], v, self.g.active, self.sparse[role])
        if parent is None:  # cannot happen on a strongly connected active set
            raise RuntimeError("pack: the oracle found no arborescence")
        return parent, cost(self.w[role], parent)


def _widest(g: _Graph, root: int, role: int) -> np.ndarray:
    """The widest-path tree from `root` (Prim on bottlenecks), pruned to the active nodes: the warm start."""
    capm = g.matrix(g.cap, role, fill=0.0)
    n = g.n
    parent = np.full(n, -1)
    best = capm[root].copy()
    frm = np.full(n, root)
    done = np.zeros(n, dtype=bool)
    done[root] = True
    best[root] = -1.0
    for _ in range(n - 1):
        cand = np.where(done, -1.0, best)
        x = int(cand.argmax())
        if cand[x] <= 0:
            break
        parent[x], done[x] = frm[x], True
        better = ~done & (capm[x] > best)
        best[better], frm[better] = capm[x][better], x
    return prune(parent, g.active)


def _column_generation(g: _Graph, cols: _Columns, overlap: bool, max_iterations: int, gap_pct: float,
                       deadline: float) -> tuple[_Solution, int, float]:
    """Price every root in both roles each round until no tree has a negative reduced cost or the
    Farley bound is within `gap_pct` of the master's value. Returns the last master (its `w` over
    every column), the number of master solves and the Farley gap in %.

    Each round asks the oracle PRICINGS times per root and role: first under the duals, then under
    prices raised on the links the round's trees already use, so one round brings several different
    trees (kept only if their reduced cost under the true duals is negative): fewer master solves."""
    master = _Master(g, overlap, interior=True)
    for t in range(len(cols.root)):
        master.add(cols, t)
    gap = float("inf")
    sol = None
    it = 0
    while it < max_iterations:
        it += 1
        sol = master.solve()
        rows = g.m if overlap else 2 * g.m
        prices = sol.prices.copy()
        lengths = np.zeros((len(g.roots), 2))
        added = 0
        for k in range(PRICINGS):
            oracle = _Oracle(g, prices, overlap)
            used = np.zeros(rows)
            for i, v in enumerate(g.roots):
                for r in (0, 1):
                    parent, length = oracle.tree(v, r)
                    edges = g.tree_edges(parent, r)
                    rows_of = edges + (0 if overlap else r * g.m)
                    if k == 0:
                        lengths[i, r] = length
                    else:
                        length = float(sol.prices[rows_of].sum())
                    if length < sol.alpha[v, r] - REDUCED_COST_TOL and cols.add(v, r, parent, edges):
                        master.add(cols, len(cols.root) - 1)
                        added += 1
                    used[rows_of] += 1
            cap = g.cap if overlap else np.concatenate([g.cap, g.cap])
            prices = prices + used * (float(prices.mean()) + 1e-3) / (2 * cap)
        for v in g.roots:  # shallow trees under the true duals: they pipeline better
            for r in (0, 1):
                wm = g.matrix(sol.prices if overlap else sol.prices[r * g.m:(r + 1) * g.m], r)
                for h in SHALLOW_LEVELS:
                    parent = shallow(wm, int(g.active[v]), h, None if g.all_active else g.active)
                    if parent is None:
                        continue
                    edges = g.tree_edges(parent, r)
                    length = float(sol.prices[edges + (0 if overlap else r * g.m)].sum())
                    if length < sol.alpha[v, r] - REDUCED_COST_TOL and cols.add(v, r, parent, edges):
                        master.add(cols, len(cols.root) - 1)
                        added += 1
        # Farley: prices scaled by 1/θ satisfy every tree's dual row, so z/θ bounds the full LP.
        theta = float(lengths.sum(axis=1).min())
        gap = 100.0 * max(0.0, 1.0 / theta - 1.0) if theta > 0 else float("inf")
        if not added or gap <= gap_pct or time.perf_counter() > deadline:
            break
    assert sol is not None
    return sol, it, gap


def pack(capacity: Mapping[tuple[int, int], float], active: Iterable[int], *, overlap: bool = True,
         max_trees_per_root: int | None = 8, min_weight_frac: float = 0.01, max_iterations: int = 500,
         gap_pct: float = 0.01, time_limit_s: float | None = None, roots: Iterable[int] | None = None) -> Packing:
    """Pack reduce and broadcast trees for every active root; `capacity` maps directed links to Mbit/s.
    Nodes outside `active` may relay and aggregate but are never roots; `roots` (default: every
    active node) narrows who may own parameters (BLINK packs from one root). Raises ValueError when the
    active nodes are fewer than two or not strongly connected. Column generation stops at an LP gap
    (Farley bound) of `gap_pct` % or after `time_limit_s` (the gap then says how far it got)."""
    t0 = time.perf_counter()
    active = list(active)
    g = _graph(capacity, active, roots)
    deadline = t0 + time_limit_s if time_limit_s is not None else float("inf")
    cols = _Columns()
    for v in g.roots:
        for r in (0, 1):
            parent = _widest(g, int(g.active[v]), r)
            cols.add(v, r, parent, g.tree_edges(parent, r))
    sol, iterations, gap = _column_generation(g, cols, overlap, max_iterations, gap_pct, deadline)
    master = _Master(g, overlap, interior=False)
    for t in range(len(cols.root)):
        master.add(cols, t)
    shallow_sol = master.shallowest(np.array([depth(p) for p in cols.parent]), sol.value * (1 - SHALLOW_SLACK))
    subset = _prune(cols, shallow_sol.w, max_trees_per_root, min_weight_frac)
    final = _solve(g, cols, subset, overlap)
    w = _feasible(g, cols, subset, final.w, overlap)
    packing = _packing(g, cols, subset, w)
    return Packing(
        reduce=packing[0], broadcast=packing[1], chi=packing[2], sum_chi=sum(packing[2].values()),
        sum_chi_lp=sol.value * g.scale, lam=min_cut(capacity, active), iterations=iterations, gap_pct=gap,
        solve_s=time.perf_counter() - t0, trees=sum(len(ts) for side in packing[:2] for ts in side.values()),
        overlap=overlap, oracle_exact=g.all_active)


def _prune(cols: _Columns, w: np.ndarray, max_per_root: int | None, min_frac: float) -> np.ndarray:
    """The basic solution's non-zero trees (`w` per column), without those under min_frac of the
    heaviest, at most max_per_root per root and role (heaviest first); returns column ids."""
    top = float(w.max()) if len(w) else 0.0
    keep = np.flatnonzero(w > max(min_frac * top, 1e-9 * top))
    groups: dict[tuple[int, int], list[int]] = {}
    for i in keep[np.argsort(-w[keep], kind="stable")]:
        t = int(i)
        groups.setdefault((cols.root[t], cols.role[t]), []).append(t)
    limit = max_per_root if max_per_root is not None else len(w)
    return np.array(sorted(t for ts in groups.values() for t in ts[:limit]), dtype=int)


def _feasible(g: _Graph, cols: _Columns, subset: np.ndarray, w: np.ndarray, overlap: bool) -> np.ndarray:
    """The solver's weights made exact: each root's broadcast weights scaled to sum to its reduce
    weights, then everything scaled down if a link is over capacity by the solver's tolerance."""
    w = np.maximum(w, 0.0).copy()
    roles = np.array([cols.role[t] for t in subset], dtype=int)
    roots = np.array([cols.root[t] for t in subset], dtype=int)
    for v in np.unique(roots):
        red, bc = (roots == v) & (roles == 0), (roots == v) & (roles == 1)
        total_r, total_b = w[red].sum(), w[bc].sum()
        if total_r <= 0 or total_b <= 0:
            w[red | bc] = 0.0
        else:
            w[bc] *= total_r / total_b
    load = np.zeros(g.m if overlap else 2 * g.m)
    for i, t in enumerate(subset):
        np.add.at(load, cols.edges[t] + (0 if overlap else roles[i] * g.m), w[i])
    cap = g.cap if overlap else np.concatenate([g.cap, g.cap])
    over = float((load / cap).max()) if len(load) else 0.0
    return w / over if over > 1.0 else w


def _packing(g: _Graph, cols: _Columns, subset: np.ndarray, w: np.ndarray) -> tuple[
        dict[int, tuple[Tree, ...]], dict[int, tuple[Tree, ...]], dict[int, float]]:
    """Back to node ids and Mbit/s; trees of zero weight after the re-solve are left out."""
    sides: tuple[dict[int, list[Tree]], dict[int, list[Tree]]] = ({}, {})
    chi = {int(g.ids[v]): 0.0 for v in g.active}
    for side in sides:
        for v in chi:
            side[v] = []
    for i, t in enumerate(subset):
        if w[i] <= 0:
            continue
        root = int(g.ids[g.active[cols.root[t]]])
        parent = cols.parent[t]
        pmap: dict[int, int | None] = {root: None}
        for x in np.flatnonzero(parent >= 0):
            pmap[int(g.ids[x])] = int(g.ids[parent[x]])
        tree = Tree(root, pmap, float(w[i]) * g.scale)
        sides[cols.role[t]][root].append(tree)
        if cols.role[t] == 0:
            chi[root] += tree.weight
    reduce, broadcast = ({v: tuple(sorted(ts, key=lambda t: -t.weight)) for v, ts in side.items()} for side in sides)
    return reduce, broadcast, chi
