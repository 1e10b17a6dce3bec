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

Solved by column generation jointly over all roots: a HiGHS master (`linprog`, sparse), duals as
edge prices, and per root and role the cheapest arborescence under them (exact Edmonds when every
node is active, the Steiner heuristic otherwise; `arborescence.py`). A basic solution may hold up
to |E| + 2|V| trees, too thin to pipeline well; `pack` prunes them and re-solves over what is left,
reporting both optima. Pure: capacities in, packing out; nothing here knows about plans or agents.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import networkx as nx
import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csc_matrix, csr_matrix
from scipy.sparse.csgraph import connected_components

from .arborescence import INF, cost, edmonds, prune, sparse_graph, steiner

Role = Literal["reduce", "broadcast"]
ROLES: tuple[Role, Role] = ("reduce", "broadcast")
REDUCED_COST_TOL = 1e-7  # a column enters when its reduced cost is below -tol (capacities scaled to max 1)
IDLE_ROUNDS = 3  # master rounds a zero-weight tree stays in the master before it waits in the pool


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


def _graph(capacity: Mapping[tuple[int, int], float], active: Iterable[int]) -> _Graph:
    act = sorted(set(int(v) for v in active))
    if len(act) < 2:
        raise ValueError(f"pack: needs at least two active nodes, got {act}")
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
    return _Graph(ids[keep], new[act_idx], src, dst, rates / scale, scale, eidx)


@dataclass
class _Columns:
    """Every tree generated so far (the pool), with its root (position in `active`) and role. The
    master holds only the live ones: a tree idle (zero weight) for IDLE_ROUNDS rounds leaves it and
    comes back when its reduced cost turns negative again; a smaller master solves several x faster."""

    root: list[int] = field(default_factory=list)
    role: list[int] = field(default_factory=list)
    parent: list[np.ndarray] = field(default_factory=list)
    edges: list[np.ndarray] = field(default_factory=list)
    idle: list[int] = field(default_factory=list)
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
        self.idle.append(0)
        return True

    def live(self) -> np.ndarray:
        return np.flatnonzero(np.array(self.idle) <= IDLE_ROUNDS)

    def reduced_costs(self, sol: _Solution, overlap: bool, m: int) -> np.ndarray:
        """Σ prices over each tree's links minus its root's and role's equality dual, for every tree."""
        lens = np.array([len(e) for e in self.edges])
        role = np.array(self.role)
        rows = np.concatenate(self.edges) + (0 if overlap else np.repeat(role * m, lens))
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        length = np.add.reduceat(sol.prices[rows], starts)
        return length - sol.alpha[np.array(self.root), role]


@dataclass
class _Solution:
    w: np.ndarray  # per column, scaled
    chi: np.ndarray  # per active root, scaled
    prices: np.ndarray  # per capacity row, >= 0
    alpha: np.ndarray  # (roots, 2): equality duals, the price a root's reduce/broadcast tree must beat

    @property
    def value(self) -> float:
        return float(self.chi.sum())


def _solve(g: _Graph, cols: _Columns, subset: np.ndarray, overlap: bool) -> _Solution:
    """The restricted master over the columns in `subset`: max Σχ (HiGHS dual simplex: a basic solution)."""
    k, a = len(subset), len(g.active)
    rows_ub = g.m if overlap else 2 * g.m
    lens = np.array([len(cols.edges[t]) for t in subset], dtype=int)
    role = np.array([cols.role[t] for t in subset], dtype=int)
    root = np.array([cols.root[t] for t in subset], dtype=int)
    ub_rows = np.concatenate([cols.edges[t] for t in subset]) if k else np.zeros(0, dtype=int)
    if not overlap:
        ub_rows = ub_rows + np.repeat(role * g.m, lens)
    ub_cols = np.repeat(np.arange(k), lens)
    a_ub = csc_matrix((np.ones(len(ub_rows)), (ub_rows, ub_cols)), shape=(rows_ub, k + a))
    eq_rows = np.concatenate([2 * root + role, 2 * np.arange(a), 2 * np.arange(a) + 1])
    eq_cols = np.concatenate([np.arange(k), k + np.arange(a), k + np.arange(a)])
    eq_vals = np.concatenate([np.ones(k), -np.ones(2 * a)])
    a_eq = csc_matrix((eq_vals, (eq_rows, eq_cols)), shape=(2 * a, k + a))
    c = np.concatenate([np.zeros(k), -np.ones(a)])
    b_ub = g.cap if overlap else np.concatenate([g.cap, g.cap])
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.zeros(2 * a), bounds=(0, None), method="highs-ds")
    if res.status != 0:
        raise RuntimeError(f"pack: master LP failed: {res.message}")
    # HiGHS marginals are d(objective)/d(rhs) of a minimization: <= 0 on <= rows. Reduced cost of a
    # tree t of root v and role r: Σ_{e in t} prices_e - alpha[v, r]; χ_v's: alpha[v,0] + alpha[v,1] - 1.
    return _Solution(res.x[:k], res.x[k:], np.maximum(0.0, -res.ineqlin.marginals),
                     res.eqlin.marginals.reshape(a, 2))


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


def _column_generation(g: _Graph, cols: _Columns, overlap: bool, max_iterations: int,
                       deadline: float) -> tuple[_Solution, np.ndarray, int, float]:
    """Price every root in both roles each round until no tree has a negative reduced cost.
    Returns the last master, the columns it held, the number of master solves and the Farley gap in %."""
    gap = float("inf")
    sol = None
    it = 0
    while it < max_iterations:
        it += 1
        live = cols.live()
        sol = _solve(g, cols, live, overlap)
        for i, t in enumerate(live):
            cols.idle[t] = 0 if sol.w[i] > 0 else cols.idle[t] + 1
        rc = cols.reduced_costs(sol, overlap, g.m)
        back = np.flatnonzero((rc < -REDUCED_COST_TOL) & (np.array(cols.idle) > IDLE_ROUNDS))
        for t in back:
            cols.idle[t] = 0
        oracle = _Oracle(g, sol.prices, overlap)
        lengths = np.zeros((len(g.active), 2))
        added = len(back)
        for v in range(len(g.active)):
            for r in (0, 1):
                parent, length = oracle.tree(v, r)
                lengths[v, r] = length
                if length < sol.alpha[v, r] - REDUCED_COST_TOL:
                    added += cols.add(v, r, parent, g.tree_edges(parent, r))
        # Farley: prices scaled by 1/θ satisfy every tree's dual row, so z/θ bounds the full LP.
        theta = float(lengths.sum(axis=1).min())
        gap = 100.0 * max(0.0, 1.0 / theta - 1.0) if theta > 0 else float("inf")
        if not added or time.perf_counter() > deadline:
            break
    assert sol is not None
    return sol, live, it, gap


def pack(capacity: Mapping[tuple[int, int], float], active: Iterable[int], *, overlap: bool = True,
         max_trees_per_root: int | None = 8, min_weight_frac: float = 0.01, max_iterations: int = 500,
         time_limit_s: float | None = None) -> Packing:
    """Pack reduce and broadcast trees for every active root; `capacity` maps directed links to Mbit/s.
    Nodes outside `active` may relay and aggregate but are never roots. Raises ValueError when the
    active nodes are fewer than two or not strongly connected."""
    t0 = time.perf_counter()
    active = list(active)
    g = _graph(capacity, active)
    deadline = t0 + time_limit_s if time_limit_s is not None else float("inf")
    cols = _Columns()
    for v in range(len(g.active)):
        for r in (0, 1):
            parent = _widest(g, int(g.active[v]), r)
            cols.add(v, r, parent, g.tree_edges(parent, r))
    sol, live, iterations, gap = _column_generation(g, cols, overlap, max_iterations, deadline)
    subset = _prune(cols, live, sol.w, max_trees_per_root, min_weight_frac)
    final = _solve(g, cols, subset, overlap)
    w = _feasible(g, cols, subset, final.w, overlap)
    packing = _packing(g, cols, subset, w)
    return Packing(
        reduce=packing[0], broadcast=packing[1], chi=packing[2], sum_chi=sum(packing[2].values()),
        sum_chi_lp=sol.value * g.scale, lam=min_cut(capacity, active), iterations=iterations, gap_pct=gap,
        solve_s=time.perf_counter() - t0, trees=sum(len(ts) for side in packing[:2] for ts in side.values()),
        overlap=overlap, oracle_exact=g.all_active)


def _prune(cols: _Columns, live: np.ndarray, w: np.ndarray, max_per_root: int | None, min_frac: float) -> np.ndarray:
    """The basic solution's non-zero trees (`w` per `live` column), without those under min_frac of
    the heaviest, at most max_per_root per root and role (heaviest first); returns column ids."""
    top = float(w.max()) if len(w) else 0.0
    keep = np.flatnonzero(w > max(min_frac * top, 1e-9 * top))
    groups: dict[tuple[int, int], list[int]] = {}
    for i in keep[np.argsort(-w[keep], kind="stable")]:
        t = int(live[i])
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
