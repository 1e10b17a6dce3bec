"""A time-stepped fluid engine for one-hop plans: flows instead of chunks, every flow advanced at once.

Why: CREW's job mode at n = 60 (seed 004) runs hundreds of tasks of 600 flows each; the exact engine
handles every chunk as an event and needs tens of seconds per simulated job, this one about a second.
It serves plans whose every tree edge is a direct link (stars: CREW, OPR, a parameter server;
all-to-all groups), on networks without node caps, with the traffic classes such plans use.

What it models, per task (TaskRun) and group (block):
- a *contribution flow* per member and edge: a member's bytes of the group to the group's root (its
  aggregation parent) or, in an all-to-all group, to every other receiver; available from the member's
  begin;
- a *result flow* per edge of the broadcast star: the root's reduced bytes to each child; available
  as the root has them: whole chunks that every contribution flow has delivered (one link delay after
  sending; store-and-forward per chunk, as live), so the multicast pipelines behind the scatter;
- per directed link, flows served by class as the data plane does (overlay.classes): higher priority
  first, then earlier deadline (fcfs classes: the moment the flow first had bytes to send, so a flow
  that came first is never preempted by a later one), then weighted fair shares between equals, each
  within what it has ready; unclassed transfers are ordered by their arrival too: the live FIFO
  per origin -> destination serves chunks in the order they were ready, the same for flows that are backlogged
  from their start (scatters), an approximation where two tasks' multicasts trickle into one FIFO
  (a hub's, as with a parameter server: within ~10 %, tests);
- a receiver holds the result one link delay after the last byte it needs left its sender.

Time advances in steps of `dt` (a task added between two steps starts at the next one, at most dt
late); rates are constant within a step, a flow ending inside one gets its exact end time, and the
link's rest of that step is not given to others (the error is at most dt per flow end on a link;
tests compare with the exact engine). Rate changes of a trace apply at their times. Not modelled:
relays, node caps, auxiliary routes, per-chunk transfer granularity beyond the store-and-forward
availability above.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .model import FLOAT32, MBIT, SimNetwork, TaskRun

_INF = float("inf")
DT = 0.01  # default step (s): within ~3 % of the exact engine on CREW tasks (tests)


class NotOneHop(NotImplementedError):
    """A plan or network this engine does not model (a relay, a node cap, an auxiliary route)."""


@dataclass
class _Task:
    key: Hashable
    start: float
    waiting: dict[int, int]  # receiver -> flows it still waits for
    done_at: dict[int, float]  # receiver -> latest delivery so far / when it held everything
    receivers: tuple[int, ...]
    left: int  # receivers not done yet


class Stepped:
    """Engine state: flat arrays over every flow added so far (finished tasks' flows compacted away)."""

    def __init__(self, net: SimNetwork, dt: float = DT) -> None:
        if net.uplink_mbps or net.downlink_mbps:
            raise NotOneHop("the stepped engine models no node caps: use the exact engine")
        self.net = net
        self.dt = dt
        self.links = {link: i for i, link in enumerate(net.rates_mbps)}
        self._direct: dict[tuple[int, int], int] = {}  # links checked to be their own route
        self.cap = np.array([net.rates_mbps[link] * MBIT for link in net.rates_mbps], dtype=float)
        self.delay = np.array([net.delays_s.get(link, 0.0) for link in net.rates_mbps], dtype=float)
        self.events = sorted((e for e in net.events), key=lambda e: e[0])
        self.now = 0.0
        self._ev = 0
        self.tasks: list[_Task] = []
        # flows
        self.f_link = np.zeros(0, np.int64)
        self.f_size = np.zeros(0)
        self.f_sent = np.zeros(0)
        self.f_rate = np.zeros(0)
        self.f_begin = np.zeros(0)
        self.f_result = np.zeros(0, bool)  # a result flow (fed by its group's reduce), else a contribution
        self.f_group = np.zeros(0, np.int64)  # result flows: the group feeding it; contributions: the group fed
        self.f_prio = np.zeros(0, np.int64)
        self.f_deadline = np.zeros(0)
        self.f_fcfs = np.zeros(0, bool)
        self.f_weight = np.zeros(0)
        self.f_task = np.zeros(0, np.int64)
        self.f_to = np.zeros(0, np.int64)  # the receiver it delivers to (-1: an aggregator that receives nothing)
        self.f_done = np.zeros(0, bool)
        self.f_fin = np.zeros(0)  # when its last byte left
        self.f_first = np.zeros(0)  # when its first byte left
        # groups
        self.g_chunk = np.zeros(0)  # its chunk size (bytes): results move in whole chunks
        self.g_size = np.zeros(0)
        self.g_first = np.zeros(0, np.int64)  # its contribution flows: f_group == g and not f_result
        self.g_avail = np.zeros(0)  # bytes reduced at its root (available to its result flows)
        self.g_task = np.zeros(0, np.int64)
        self.ended: list[tuple[int, int, float]] = []

    # --- tasks ------------------------------------------------------------------------------------
    def add(self, task: TaskRun, credit: Mapping[tuple[int, int], float] | None = None) -> int:
        """A task starting at task.start_s (clamped to the clock if a step already passed it). credit:
        bytes of a member's contribution to a root that are there already (non-blocking scatter: sent
        before the task formed); they count as sent and delivered."""
        plan = task.plan
        t_idx = len(self.tasks)
        start = max(task.start_s, self.now)
        ready = dict(task.ready_s or {})
        receivers = tuple(plan.receiver_set)
        waiting = dict.fromkeys(receivers, 0)
        rows: list[tuple] = []  # (link, size, begin, result, group, prio, deadline, fcfs, weight, to)
        g_rows: list[tuple[float, float]] = []
        g0 = len(self.g_size)
        rset = set(receivers)
        lengths = _lengths(plan.layout)
        for gi, g in enumerate(plan.groups):
            if g.aux or g.rates:
                raise NotOneHop("the stepped engine models no auxiliary routes or per-edge rates")
            first, last = g.chunks[0], g.chunks[-1]
            mine = (lengths[first:last + 1] if last - first + 1 == len(g.chunks)  # a contiguous block
                    else lengths[np.fromiter(g.chunks, np.int64, len(g.chunks))])
            size, chunk = float(mine.sum()) * FLOAT32, float(mine.max()) * FLOAT32
            gidx = g0 + gi
            g_rows.append((chunk, size))
            dl = _INF if g.deadline_s is None else start + g.deadline_s
            fcfs = g.fcfs or not g.classed
            prio_bcast = g.priority_of("bcast")

            if g.direct:
                for m, kids in g.children.items():
                    for r in kids:
                        rows.append((self._link(m, r), size, max(start, ready.get(m, start)), False, gidx, g.priority,
                                     dl, fcfs, g.weight, r))
                        waiting[r] += 1
                continue
            for n, p in g.parent.items():
                if p is None:
                    continue
                if p != g.root:
                    raise NotOneHop("the stepped engine models stars (depth 1), not deeper trees")
                to = p if p in rset else -1
                rows.append((self._link(n, p), size, max(start, ready.get(n, start)), False, gidx, g.priority, dl,
                             fcfs, g.weight, to))
                if to >= 0:
                    waiting[p] += 1
            for p, kids in g.children.items():
                if p != g.root:
                    raise NotOneHop("the stepped engine models stars (depth 1), not deeper trees")
                for r in kids:
                    rows.append((self._link(p, r), size, start, True, gidx, prio_bcast, dl, fcfs, g.weight,
                                 r if r in rset else -1))
                    if r in rset:
                        waiting[r] += 1
        first = len(self.f_size)
        self._append_groups(g_rows, t_idx)
        self._append_flows(rows, t_idx)
        done_at = dict.fromkeys(receivers, start)
        self.tasks.append(_Task(task.key, start, waiting, done_at, receivers, len(receivers)))
        for r in receivers:  # nothing to wait for (a root that only sums its own part)
            if waiting[r] == 0:
                self._receiver_done(t_idx, r)
        if credit:
            links = {i: link for link, i in self.links.items()}
            ids = [f for f in range(first, len(self.f_size)) if not self.f_result[f]
                   and credit.get(links[int(self.f_link[f])], 0.0) > 0]
            for f in ids:
                self.f_sent[f] = min(self.f_size[f], credit[links[int(self.f_link[f])]])
                self.f_first[f] = -_INF  # there already: delivered
            full = np.array([f for f in ids if self.f_sent[f] >= self.f_size[f] - 1e-6], np.int64)
            if len(full):
                self.f_fin[full] = -_INF
                self._deliver(full, np.full(len(full), start))
        return t_idx

    def add_flows(self, key: Hashable, src: int, sizes: Mapping[int, float], start: float) -> int:
        """Flows of no task yet (non-blocking scatter: a worker's blocks of the default plan, sent as it
        is READY): FCFS from `start`, delivering to nobody; read with `sent`, ended with `abort`."""
        t_idx = len(self.tasks)
        start = max(start, self.now)
        dsts = [d for d in sorted(sizes) if sizes[d] > 0]
        g0 = len(self.g_size)
        self._append_groups([(sizes[d], sizes[d]) for d in dsts], t_idx)
        self._append_flows([(self._link(src, d), float(sizes[d]), start, False, g0 + i, 0, _INF, True, 1.0, -1)
                            for i, d in enumerate(dsts)], t_idx)
        self.tasks.append(_Task(key, start, {}, {}, (), 1))  # never ends on its own
        return t_idx

    def sent(self, key: Hashable) -> dict[tuple[int, int], float]:
        """Bytes each flow of a running task has sent so far, by (src, dst)."""
        links = {i: link for link, i in self.links.items()}
        out: dict[tuple[int, int], float] = {}
        for t_idx, task in enumerate(self.tasks):
            if task.key == key and task.left:
                for f in np.flatnonzero(self.f_task == t_idx):
                    if not self.f_result[f]:
                        out[links[int(self.f_link[f])]] = float(self.f_sent[f])
        return out

    def abort(self, key: Hashable) -> None:
        """The running task `key` ends here, delivering nothing more (a failure aborted it)."""
        for t_idx, task in enumerate(self.tasks):
            if task.key == key and task.left:
                task.left = 0
                self.f_done[self.f_task == t_idx] = True
                self.ended = [e for e in self.ended if e[0] != t_idx]

    def _link(self, a: int, b: int) -> int:
        i = self._direct.get((a, b))
        if i is not None:
            return i
        if tuple(self.net.route(a, b)) != (a, b) or (a, b) not in self.links:
            raise NotOneHop(f"edge {a}->{b} is not a direct link: the stepped engine models no relays")
        i = self._direct[(a, b)] = self.links[(a, b)]
        return i

    def _append_groups(self, rows: list[tuple[float, float]], t_idx: int) -> None:
        chunk = np.array([r[0] for r in rows], dtype=float)
        size = np.array([r[1] for r in rows], dtype=float)
        self.g_chunk = np.concatenate([self.g_chunk, chunk])
        self.g_size = np.concatenate([self.g_size, size])
        self.g_avail = np.concatenate([self.g_avail, np.zeros(len(rows))])
        self.g_task = np.concatenate([self.g_task, np.full(len(rows), t_idx, np.int64)])

    def _append_flows(self, rows: list[tuple], t_idx: int) -> None:
        n = len(rows)
        cols = list(zip(*rows, strict=True)) if rows else [()] * 10
        self.f_link = np.concatenate([self.f_link, np.array(cols[0], np.int64)])
        self.f_size = np.concatenate([self.f_size, np.array(cols[1], float)])
        self.f_sent = np.concatenate([self.f_sent, np.zeros(n)])
        self.f_rate = np.concatenate([self.f_rate, np.zeros(n)])
        self.f_begin = np.concatenate([self.f_begin, np.array(cols[2], float)])
        self.f_result = np.concatenate([self.f_result, np.array(cols[3], bool)])
        self.f_group = np.concatenate([self.f_group, np.array(cols[4], np.int64)])
        self.f_prio = np.concatenate([self.f_prio, np.array(cols[5], np.int64)])
        self.f_deadline = np.concatenate([self.f_deadline, np.array(cols[6], float)])
        self.f_fcfs = np.concatenate([self.f_fcfs, np.array(cols[7], bool)])
        self.f_weight = np.concatenate([self.f_weight, np.array(cols[8], float)])
        self.f_task = np.concatenate([self.f_task, np.full(n, t_idx, np.int64)])
        self.f_to = np.concatenate([self.f_to, np.array(cols[9], np.int64)])
        self.f_done = np.concatenate([self.f_done, np.zeros(n, bool)])
        self.f_fin = np.concatenate([self.f_fin, np.full(n, _INF)])
        self.f_first = np.concatenate([self.f_first, np.full(n, _INF)])

    def _receiver_done(self, t_idx: int, r: int) -> None:
        task = self.tasks[t_idx]
        self.ended.append((t_idx, r, task.done_at[r]))
        task.left -= 1
        if task.left == 0:
            self.ended.append((t_idx, -1, max(task.done_at.values())))

    # --- time -------------------------------------------------------------------------------------
    def advance(self, until: float, stop_at_end: bool = True) -> list[tuple[Hashable, int | None, float]]:
        """Step to `until`; with stop_at_end, return after the first step in which a receiver or a task
        ended. Returns (task key, receiver, time it held the result) and (task key, None, the task's end)."""
        while self.now < until and not (stop_at_end and self.ended):
            # whole steps, even past `until` (the caller's next event): a task it then adds starts at
            # the clock, at most one step late; stepping to every caller event would double the steps
            t1 = self.now + self.dt
            while self._ev < len(self.events) and self.events[self._ev][0] <= self.now:
                _, a, b, mbps = self.events[self._ev]
                self.cap[self.links[(a, b)]] = mbps * MBIT
                self._ev += 1
            if self._ev < len(self.events):
                t1 = min(t1, self.events[self._ev][0])
            self._step(t1)
        ended, self.ended = self.ended, []
        return [(self.tasks[i].key, None if r < 0 else r, t) for i, r, t in ended]

    def run(self) -> dict[Hashable, tuple[float, dict[int, float]]]:
        """Every task to its end: key -> (end, receiver -> done)."""
        out: dict[Hashable, tuple[float, dict[int, float]]] = {}
        per: dict[Hashable, dict[int, float]] = {}
        while any(t.left for t in self.tasks):
            if not self._live().any():
                raise RuntimeError("tasks remain but no flow can move (a link at rate 0 for good?)")
            for key, r, t in self.advance(self.now + 3600.0):
                if r is None:
                    out[key] = (t, per.pop(key, {}))
                else:
                    per.setdefault(key, {})[r] = t
        return out

    def _live(self) -> np.ndarray:
        return ~self.f_done

    def _step(self, t1: float) -> None:
        now, dt = self.now, t1 - self.now
        if dt <= 0:
            return
        live = np.flatnonzero(~self.f_done & (self.f_begin <= now + 1e-12))
        self._avail()
        if len(live):
            rate = self._rates(live, dt)
            self._move(live, rate, now, dt)
        self.now = t1
        self._compact()

    def _avail(self) -> None:
        """Bytes each group's root has reduced: whole chunks every contribution flow has delivered (one
        link delay after sending)."""
        contrib = np.flatnonzero(~self.f_result)
        if not len(self.g_size):
            return
        delay = self.delay[self.f_link[contrib]]
        # bytes still in flight: a link delay's worth at its rate, less what landed since it ended
        flying = self.f_rate[contrib] * np.minimum(delay, np.maximum(0.0, self.f_fin[contrib] + delay - self.now))
        arrived = np.clip(self.f_sent[contrib] - flying, 0.0, None)
        g = self.f_group[contrib]
        low = np.full(len(self.g_size), _INF)
        np.minimum.at(low, g, arrived)
        low = np.where(np.isinf(low), self.g_size, low)  # no contribution flow: the root's own part
        whole = np.floor(low / self.g_chunk + 1e-9) * self.g_chunk
        self.g_avail = np.where(low >= self.g_size - 1e-6, self.g_size, np.minimum(whole, self.g_size))

    def _rates(self, live: np.ndarray, dt: float) -> np.ndarray:
        """Per live flow its rate this step: per link, priority, then deadline (fcfs: first ready),
        then weighted max-min within what each has ready."""
        link = self.f_link[live]
        cap = self.cap[link]
        left = self.f_size[live] - self.f_sent[live]
        res = self.f_result[live]
        demand = cap.copy()
        if res.any():  # a result flow sends what its root holds, and keeps pace with what arrives there
            have = self.g_avail[self.f_group[live]] - self.f_sent[live]
            feed = self._feed_rate()[self.f_group[live]]
            demand = np.where(res, np.clip(have / dt + feed, 0.0, cap), demand)
        demand = np.minimum(demand, left / dt)
        out = np.zeros(len(live))
        busy = np.flatnonzero(demand > 0)  # flows with nothing ready take nothing (and keep no place)
        if not len(busy):
            return out
        ids, demand, link = live[busy], demand[busy], link[busy]
        unset = self.f_fcfs[ids] & np.isinf(self.f_deadline[ids])
        if unset.any():
            self.f_deadline[ids[unset]] = self.now
        dl = self.f_deadline[ids]
        dl_key = np.where(np.isinf(dl), 2**46, np.round(np.clip(dl, 0, None) * 1e6)).astype(np.int64)
        key = (link << 50) | ((7 - self.f_prio[ids]) << 47) | np.minimum(dl_key, 2**47 - 1)
        order = np.argsort(key, kind="stable")
        k_s, d_s, w_s, l_s = key[order], demand[order], self.f_weight[ids][order], link[order]
        cell_start = np.flatnonzero(np.r_[True, k_s[1:] != k_s[:-1]])
        cell_d = np.add.reduceat(d_s, cell_start)
        cell_link = l_s[cell_start]
        # strict order between cells of a link: cell c gets min(C, D_c) - min(C, D_{c-1}), D cumulative
        cum = np.cumsum(cell_d)
        link_first = np.r_[True, cell_link[1:] != cell_link[:-1]]
        base = np.maximum.accumulate(np.where(link_first, cum - cell_d, 0.0))
        c_cap = self.cap[cell_link]
        got = np.minimum(c_cap, cum - base) - np.minimum(c_cap, cum - base - cell_d)
        got = np.maximum(got, 0.0)
        sizes = np.diff(np.r_[cell_start, len(d_s)])
        cell_of = np.repeat(np.arange(len(cell_start)), sizes)
        full = got >= cell_d * (1 - 1e-12)
        rate_s = np.where(full[cell_of], d_s, 0.0)
        short = ~full & (sizes > 1)
        single = ~full & (sizes == 1)
        rate_s[cell_start[single]] = got[single]
        if short.any():
            idx = np.flatnonzero(short[cell_of])
            rate_s[idx] = _water_fill(cell_of[idx], d_s[idx], w_s[idx], got)
        rate = np.empty(len(busy))
        rate[order] = rate_s
        out[busy] = rate
        return out

    def _feed_rate(self) -> np.ndarray:
        """Per group, the rate its root's reduced bytes grow at: the slowest rate at which its
        contributions still arriving arrive (each one link delay after it was sent; 0 before a
        contribution's first byte landed, so nothing is projected before the pipeline fills)."""
        now = self.now
        contrib = np.flatnonzero(~self.f_result)
        delay = self.delay[self.f_link[contrib]]
        coming = now < self.f_fin[contrib] + delay - 1e-12
        rate = np.where(now >= self.f_first[contrib] + delay, self.f_rate[contrib], 0.0)
        feed = np.full(len(self.g_size), _INF)
        np.minimum.at(feed, self.f_group[contrib[coming]], rate[coming])
        return np.where(np.isinf(feed), 0.0, feed)

    def _move(self, live: np.ndarray, rate: np.ndarray, now: float, dt: float) -> None:
        left = self.f_size[live] - self.f_sent[live]
        fin = (rate > 0) & (rate * dt >= left - 1e-6)
        self.f_rate[live] = rate
        started = (rate > 0) & np.isinf(self.f_first[live])
        self.f_first[live[started]] = now
        self.f_sent[live] = np.minimum(self.f_size[live], self.f_sent[live] + rate * dt)
        if not fin.any():
            return
        ids = live[fin]
        t_fin = now + left[fin] / rate[fin]
        self.f_fin[ids] = t_fin
        self._deliver(ids, t_fin + self.delay[self.f_link[ids]])

    def _deliver(self, ids: np.ndarray, arrive: np.ndarray) -> None:
        """These flows are over; their receivers hold their last byte at `arrive`."""
        self.f_done[ids] = True
        self.f_sent[ids] = self.f_size[ids]
        for f, t in sorted(zip(ids.tolist(), arrive.tolist(), strict=True), key=lambda x: x[1]):
            r = int(self.f_to[f])
            if r < 0:
                continue
            task = self.tasks[int(self.f_task[f])]
            task.waiting[r] -= 1
            if t > task.done_at[r]:
                task.done_at[r] = t
            if task.waiting[r] == 0:
                self._receiver_done(int(self.f_task[f]), r)

    def _compact(self) -> None:
        """Drop the flows and groups of tasks that are over (keeps every step's arrays small)."""
        done = self.f_done
        if len(done) < 4096 or done.sum() < len(done) // 2:
            return
        over = np.array([t.left == 0 for t in self.tasks], bool)
        keep_g = ~over[self.g_task]
        keep_f = ~over[self.f_task]
        if keep_f.all():
            return
        remap = np.cumsum(keep_g) - 1
        for name in ("f_link", "f_size", "f_sent", "f_rate", "f_begin", "f_result", "f_prio", "f_deadline",
                     "f_fcfs", "f_weight", "f_task", "f_to", "f_done", "f_fin", "f_first"):
            setattr(self, name, getattr(self, name)[keep_f])
        self.f_group = remap[self.f_group[keep_f]]
        for name in ("g_chunk", "g_size", "g_avail", "g_task"):
            setattr(self, name, getattr(self, name)[keep_g])


@lru_cache(maxsize=16)
def _lengths(layout: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Each chunk's length in elements (layouts repeat from task to task)."""
    return np.fromiter((n for _, n in layout), np.int64, len(layout))


def _water_fill(cell: np.ndarray, d: np.ndarray, w: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Weighted max-min of got[cell] among each cell's flows, each at most its demand d."""
    ratio = d / w
    order = np.lexsort((ratio, cell))
    c, dd, ww, rr = cell[order], d[order], w[order], ratio[order]
    start = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    sizes = np.diff(np.r_[start, len(c)])
    first = np.repeat(start, sizes)
    cum_d = np.cumsum(dd)
    before = cum_d - dd - (cum_d[first] - dd[first])  # demand of the cell's flows before this one
    cum_w_rev = np.cumsum(ww[::-1])[::-1]
    end_of = np.repeat(start + sizes - 1, sizes)
    w_from = cum_w_rev - cum_w_rev[end_of] + ww[end_of]  # weight of this flow and those after it
    lam = (got[c] - before) / w_from
    capped = rr <= lam
    pos = np.arange(len(c))
    first_free = np.minimum.reduceat(np.where(capped, len(c), pos), start)
    lam_cell = np.where(first_free < len(c), lam[np.minimum(first_free, len(c) - 1)], _INF)
    out_s = np.minimum(dd, ww * np.repeat(lam_cell, sizes))
    out = np.empty(len(c))
    out[order] = out_s
    return out
