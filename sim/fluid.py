"""The fluid engine: static max-min shares over a few dozen time slices, chunk times vectorized per
tree edge, which is what makes 1,000-node plans cheap.

It equals the exact engine when no two keys share a resource, and stays within a few percent for
one-tree plans whose routes cross; for plans of many groups it is slower than exact (a key's
streams share it evenly instead of taking turns at full rate: +20..30 % measured with 25..70
chunks per group, far more with only a couple). It refuses plans with auxiliary routes: their
dispatch depends on every earlier send's hop ack across all groups at that node, in time order,
which a per-group vectorized FIFO recursion cannot reproduce. For the same reason it refuses
concurrent tasks and traffic classes (sim/sharing.py): those are the exact engine's.
"""

from __future__ import annotations

import numpy as np

from core.maxmin import max_min_rates

from .model import MBIT, Model, RoundPrediction, SimulationStalled

FLUID_PASSES = 3  # 1 static pass, then re-solves from the previous pass's activity
FLUID_SLICES = 24  # at most this many time slices (plus trace events) per re-solve
_INF = float("inf")


class Fluid:
    """Static-share engine. Pass 1: every key gets its max-min share with all keys backlogged,
    piecewise constant between trace events; a key carrying s streams (group, direction) gives
    each 1/s of it. Later passes re-solve the shares per time slice among only the keys (and
    streams) that the previous pass found active in it, so capacity that finished subtrees leave
    behind goes to the rest, as it does live. Per stream, FIFO service
    finish_j = max(ready_j, finish_{j-1}) + b_j / rate is a cumulative max in cumulative-bytes
    space, so a tree edge costs a handful of numpy calls for all its chunks."""

    def __init__(self, m: Model, prev: Fluid | None = None) -> None:
        self.m = m
        nk = len(m.key_path)
        cap = np.asarray(m.cap, dtype=float)
        trace_t = [m.start]
        trace_cap = [cap.copy()]
        for t, a, b, mbps in m.later_events:
            if t != trace_t[-1]:
                trace_t.append(t)
                trace_cap.append(trace_cap[-1].copy())
            trace_cap[-1][m.res_of_event(a, b)] = mbps * MBIT
        pair_flow, pair_res = m.pairs(range(nk))
        if prev is None:
            streams = np.zeros(nk)
            for g_idx in range(len(m.plan.groups)):
                for k in m.agg_key[g_idx]:
                    if k >= 0:
                        streams[k] += 1
                for ks in m.bcast_keys[g_idx]:
                    for k in ks:
                        streams[k] += 1
            self.base_T = np.asarray(trace_t)
            self.base = np.stack([max_min_rates(pair_flow, pair_res, c, nk) for c in trace_cap])
            self.T = self.base_T
            self.R = self.base / np.maximum(streams, 1)  # (segments, keys): bytes/s of one stream
        else:
            self.base_T, self.base = prev.base_T, prev.base
            sk, s0, s1 = (np.asarray(x) for x in zip(*prev.spans, strict=True))
            kfirst = np.full(nk, _INF)
            klast = np.full(nk, -_INF)
            np.minimum.at(kfirst, sk, s0)
            np.maximum.at(klast, sk, s1)
            marks = np.unique(np.concatenate([s0, s1]))
            slices = max(8, FLUID_SLICES - len(self.base_T))  # a busy trace already slices time
            if len(marks) > slices:
                marks = np.unique(np.quantile(marks, np.linspace(0, 1, slices + 1)))
            T = np.unique(np.concatenate([self.base_T, marks[marks > m.start]]))
            ends = np.append(T[1:], _INF)
            R = np.empty((len(T), nk))
            for i, (t0, t1) in enumerate(zip(T, ends, strict=True)):
                seg = int(np.searchsorted(self.base_T, t0, side="right")) - 1
                active = (kfirst < t1) & (klast > t0)
                live = active[pair_flow]
                solved = max_min_rates(pair_flow[live], pair_res[live], trace_cap[seg], nk)
                # a key the last pass had idle here gets what the active ones leave, or at least
                # its all-backlogged share: a little optimistic, but never stuck at zero
                used = np.bincount(pair_res[live], weights=solved[pair_flow[live]], minlength=len(cap))
                spare = np.full(nk, _INF)
                np.minimum.at(spare, pair_flow, np.maximum(trace_cap[seg] - used, 0.0)[pair_res])
                idle = np.maximum(self.base[seg], spare)
                on = (s0 < t1) & (s1 > t0)
                streams = np.maximum(np.bincount(sk[on], minlength=nk), 1)
                R[i] = np.where(active, solved, idle) / streams
            self.T, self.R = T, R
        spans = np.diff(self.T)[:, None] * self.R[:-1]
        self.W = np.vstack([np.zeros((1, nk)), np.cumsum(spans, axis=0)])  # bytes servable by T[i]
        self.key_bytes = np.zeros(nk, dtype=np.int64)
        self.spans: list[tuple[int, float, float]] = []  # per stream: (key, first start, last finish)

    def _serve(self, k: int, ready: np.ndarray, size: np.ndarray, csum: np.ndarray) -> np.ndarray:
        """Finish times of FIFO stream k for items ready at `ready` (in order), plus arrival delays."""
        T, R, W = self.T, self.R[:, k], self.W[:, k]
        if len(T) == 1:
            r = R[0]
            if r <= 0:
                raise SimulationStalled(f"key {self.m.key_path[k]} has rate 0")
            fin = csum / r + np.maximum.accumulate(ready - (csum - size) / r)
            rate_end = np.full(len(fin), r)
        else:
            seg = np.searchsorted(T, ready, side="right") - 1
            w_ready = W[seg] + (ready - T[seg]) * R[seg]
            w_fin = csum + np.maximum.accumulate(w_ready - (csum - size))
            seg = np.clip(np.searchsorted(W, w_fin, side="left") - 1, 0, len(T) - 1)
            rate_end = R[seg]
            with np.errstate(divide="ignore", invalid="ignore"):
                fin = T[seg] + (w_fin - W[seg]) / rate_end
            if not np.isfinite(fin).all():
                raise SimulationStalled(f"key {self.m.key_path[k]} stays at rate 0")
        self.key_bytes[k] += int(size.sum())
        self.spans.append((k, float(ready[0]), float(fin[-1])))
        m = self.m
        hops = len(m.key_path[k]) - 1
        arrive = fin + m.key_delay[k]
        if hops > 1:  # cut-through: each relay waits for one segment before passing it on
            arrive = arrive + (hops - 1) * np.minimum(m.segment, size) / rate_end
        return arrive

    def run(self) -> RoundPrediction:
        m = self.m
        done = np.full(len(m.nodes), m.start)
        for g_idx, g in enumerate(m.plan.groups):
            chunks = sorted(g.chunks)
            size = np.asarray([m.chunk_bytes[c] for c in chunks], dtype=float)
            csum = np.cumsum(size)
            ready: dict[int, np.ndarray] = {}
            kids: dict[int, list[int]] = {}
            for v, k in enumerate(m.agg_key[g_idx]):
                if k >= 0:
                    kids.setdefault(m.key_dst[k], []).append(v)
            order = [m.root[g_idx]]  # top-down; aggregation runs it backwards
            for v in order:
                order.extend(kids.get(v, ()))
            for v in reversed(order):
                own = np.full(len(chunks), m.start_at[v])  # its own contribution, once it began
                r = np.maximum(ready[v], own) if v in ready else own
                k = m.agg_key[g_idx][v]
                if k >= 0:
                    arr = self._serve(k, r, size, csum)
                    p = m.key_dst[k]
                    ready[p] = np.maximum(ready[p], arr) if p in ready else arr
                else:
                    ready[v] = r
            final = {m.root[g_idx]: ready[m.root[g_idx]]}
            todo = [m.root[g_idx]]
            while todo:
                u = todo.pop()
                for k in m.bcast_keys[g_idx][u]:
                    final[m.key_dst[k]] = self._serve(k, final[u], size, csum)
                    todo.append(m.key_dst[k])
            for v, f in final.items():
                done[v] = max(done[v], float(f.max()))
        busy = self._busy()
        node_done = {m.nodes[v]: float(d) for v, d in enumerate(done)}
        return RoundPrediction(float(done.max()) - m.start, node_done, m.link_bytes(self.key_bytes.tolist()),
                               busy, "fluid")

    def _busy(self) -> dict[tuple[int, int], float]:
        """Union of the active spans of the streams on each link (gaps inside a span count as busy)."""
        per_link: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for k, a, b in self.spans:
            path = self.m.key_path[k]
            for link in zip(path, path[1:], strict=False):
                per_link.setdefault(link, []).append((a, b))
        out: dict[tuple[int, int], float] = {}
        for link, spans in per_link.items():
            total, end = 0.0, -_INF
            for a, b in sorted(spans):
                if b > end:
                    total += b - max(a, end)
                    end = b
            out[link] = total
        return out


def run_fluid(m: Model) -> RoundPrediction:
    """FLUID_PASSES passes, each re-solving the shares from where the previous one found keys active."""
    if m.has_aux:
        raise NotImplementedError("the fluid engine does not model auxiliary-route dispatch: use exact")
    if any(m.direct):
        raise NotImplementedError("the fluid engine replays trees, not all-to-all groups: use exact")
    if len(m.tasks) != 1 or m.classed:
        raise NotImplementedError("the fluid engine replays one task of plain round-robin sharing: use exact "
                                  "for concurrent tasks and traffic classes (weights, priorities, deadlines, rates)")
    sim = Fluid(m)
    pred = sim.run()
    for _ in range(FLUID_PASSES - 1 if m.key_path else 0):
        sim = Fluid(m, sim)
        pred = sim.run()
    return pred
