"""Active probes of the links no plan keeps busy, so the view knows every link (NetStorm explores idle links).

The passive view learns only links a plan keeps busy; a link no plan uses (or one a tree feeds at
its children's pace) stays at the nominal guess, so no planner can see that it became the best one.
Every TICK_S this prober orders short probes (agents/linkprobe.py: real chunks through the link's
shaper and kernel queues, discarded by the receiver) on links:

- that no running plan keeps busy: a plan link whose load takes at least BUSY_SHARE of the time its
  bottleneck link's load takes (at the view's rates) is busy, and not probed while the plan runs
  unless its estimate predates a move of a port it crosses (so a plan's bottleneck, which such a link
  is by definition, never is while it gives samples); so is a link that gave a
  passive sample within PASSIVE_BUSY_S (a plan's chunks kept it backlogged just now). The second rule
  holds where the first is misled: a link the view underestimates tenfold (a starved sender's
  samples) inflates the plan's bottleneck time, and the true bottleneck's share falls below BUSY_SHARE;
- unknown first, then those whose estimate is older than `refresh_s` (oldest first), and at once a
  link whose newest sample disagreed with its estimate (it may have changed: the view needs a second
  agreeing sample to move, scheduler/view.py `_moved`), or one at a node where another link's estimate
  just moved by NODE_MOVED or more (a node's port moves all its links: a tree's idle links, probed while
  the ports were shared, would otherwise keep their old share until refresh_s comes round for each);
- never through a capped port that busy links fill (what they carry alone, NetworkView.capacity, adds up
  to PORT_BUSY of its declared cap at that port; their rates under a binding port are only their shares
  of it): there a probe takes its bytes from the plan's share of the port, whatever link it is
  on (a tree under 50 Mbit/s ports ran 4.8 s rounds with probing against 1.8 without). A plan link the
  first rule lets be probed for its stale or missing estimate counts here all the same: it carries the
  plan's bytes (on auto's flipping trace a 2-MB probe left a node through its uplink, just bound to 50
  Mbit/s, beside the ring that auto had switched to, whose first rounds ran 1.45-1.57 s against 1.37);
- at most one probe per node at a time (as sender or receiver: where node caps exist a second one
  would share the cap), at most `at_once` in the cluster, and no node probing for more than `budget`
  of the last WINDOW_S seconds (counting the probe about to start, at the view's rate of its link).

A probe is sized to give the view one sample it trusts alone: PROBE_S of the link's busy time at its
estimated rate (the known links' median for a first guess; twice the last size while a probe left the
link unknown), REPROBE_S on a link already known (at once again, at the rate it showed, if a re-probe
ran faster than the estimate: `done`), in PROBE_CHUNKS chunks (each counts as one of
NetStorm's probes, agents/probes.py).
The prober never reads a progress model or a planner: a plan is links and bytes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from core.classes import MBIT
from core.plan import Plan
from overlay.messages import MAX_PROBE_BYTES, Probe, ProbeDone

from .planners.onview import link_loads, port_loads
from .view import AGREE, MOVED, NetworkView

log = logging.getLogger("wansync.scheduler")

TICK_S = 0.1
PROBE_S = 0.15  # busy time a probe aims at: one sample of 2 x KNOWN_S the view trusts alone, with margin
REPROBE_S = 0.08  # ... on a known link: one sample of KNOWN_S, enough to confirm it or show it moved
PROBE_CHUNKS = 8  # chunks per probe: the first only opens the receiver's busy period (agents/probes.py)
MIN_PROBE_BYTES = 32 * 1024
BUSY_SHARE = 0.5  # a plan link loaded for this share of its bottleneck's time is busy: never probed
PASSIVE_BUSY_S = 1.0  # ... and so is a link that gave a passive sample this recently (reports every 0.25 s)
# ... but not a plan link still unknown this long after it became busy: its passive samples do not come (a
# link that carries one chunk a round never has a busy period of two, and a period's first chunk is not
# counted). Busy for ever, it stayed at its nominal rate and so did the plan: on hetero:20-155:x=0.3, 2 runs
# in 8 kept tree packing's nominal plan (1.68 s rounds against 0.6) through 16 rounds with no sample at all
BLIND_S = 3.0
REFRESH_S = 5.0  # a link's estimate older than this is probed again
PORT_BUSY = 0.5  # a capped port whose busy links take this share of its cap (at the view's rates) is busy
NODE_MOVED = 1.5  # an estimate that moved by this factor (up or down) moves its nodes' other links up the queue
WINDOW_S = 5.0  # the budget's window
BUDGET = 0.25  # share of the window a node may spend in probes (sending or receiving)
AT_ONCE = 2  # probes in flight in the whole cluster
HISTORY = 100_000  # orders kept for whoever audits them (the view benchmark)
ORDER_TIMEOUT_S = 70.0  # a probe with no PROBE_DONE by then is given up (its agent lost meanwhile)


def busy_links(plans: Iterable[Plan], view: NetworkView, route: Callable[[int, int], tuple[int, ...]],
               share: float = BUSY_SHARE) -> set[tuple[int, int]]:
    """Links some plan keeps busy: loaded for at least `share` of its bottleneck link's time (at the
    view's rates; a link the view lacks counts at its nominal rate)."""
    out: set[tuple[int, int]] = set()
    for plan in plans:
        times = {k: b / (max(view.rate_or_nominal(*k), 1e-9) * MBIT)
                 for k, b in link_loads(plan, route).items()}
        if times:
            top = max(times.values())
            out.update(k for k, t in times.items() if t >= share * top)
    return out


@dataclass
class _Order:
    id: int
    src: int
    dst: int
    nbytes: int
    t: float


@dataclass
class ProbeStats:
    """What probing cost and did (/api/view; the results file's `view` records)."""

    ordered: int = 0
    done: int = 0
    failed: int = 0
    bytes: int = 0
    seconds: float = 0.0


class Prober:
    def __init__(self, view: NetworkView, *, send: Callable[[int, Any], bool],
                 alive: Callable[[], Iterable[int]], running: Callable[[], list[Plan]],
                 route: Callable[[], Callable[[int, int], tuple[int, ...]]], enabled: bool = True,
                 budget: float = BUDGET, at_once: int = AT_ONCE, refresh_s: float = REFRESH_S) -> None:
        """send(node, msg): to an agent (False if it is gone); alive(): nodes that may probe; running():
        the plans now in force; route(): the agents' min-hop router."""
        self.view, self.send, self.alive, self.running, self.route = view, send, alive, running, route
        self.enabled, self.budget, self.at_once, self.refresh_s = enabled, budget, at_once, refresh_s
        self.inflight: dict[int, _Order] = {}
        self.spent: dict[int, list[tuple[float, float]]] = {}  # node -> (start, end) of its recent probes
        self.size: dict[tuple[int, int], int] = {}  # next probe's bytes per link, where a probe taught us
        self.faster: dict[tuple[int, int], float] = {}  # known links a probe showed faster (Mbit/s, a lower bound)
        self.last_probe: dict[tuple[int, int], float] = {}  # when each link was last ordered a probe
        self.estimates: dict[tuple[int, int], float] = {}  # each known link's estimate when last looked at
        self.node_moved: dict[int, float] = {}  # when an estimate of a link at this node last moved by NODE_MOVED
        self.loaded_since: dict[tuple[int, int], float] = {}  # running plans' busy links: since when (BLIND_S)
        self.stats = ProbeStats()
        # (t, src, dst, bytes, versions of the plans in force then) of every probe ordered: what an audit of
        # "never a running plan's bottleneck" needs (scripts/bench/view.py)
        self.history: deque[tuple[float, int, int, int, tuple[int, ...]]] = deque(maxlen=HISTORY)
        self._next_id = 1
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._ticks())

    def set_enabled(self, on: bool) -> None:
        """Probing on or off from now (probes in flight finish)."""
        self.enabled = on
        if on:
            self.start()
        else:
            self.stop()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _ticks(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.tick(time.time())
            except Exception:  # a bug here must not end probing, nor anything else
                log.exception("prober")

    # --- choosing ---------------------------------------------------------------------------------------
    def tick(self, now: float) -> list[_Order]:
        """Give up orders long unanswered, then order what the budget allows."""
        for oid, o in list(self.inflight.items()):
            if now - o.t > ORDER_TIMEOUT_S:
                del self.inflight[oid]
                self.stats.failed += 1
        if len(self.inflight) >= self.at_once:
            return []
        busy_nodes = {n for o in self.inflight.values() for n in (o.src, o.dst)}
        alive = set(self.alive())
        free = {n for n in alive if n not in busy_nodes and self._spent(n, now) < self.budget * WINDOW_S}
        if len(free) < 2:
            return []
        busy = self.busy_now(now)
        ordered = []
        for link in self.candidates(now, free, busy):
            if len(self.inflight) >= self.at_once:
                break
            a, b = link
            if a not in free or b not in free:
                continue
            nbytes = self.probe_bytes(a, b)
            takes = nbytes / (max(self.view.rate(a, b), 1e-6) * MBIT)  # as the view sees the link now
            if all(self._spent(n, now) + takes <= self.budget * WINDOW_S for n in link):
                o = self._order(a, b, now, nbytes)
                if o is not None:
                    ordered.append(o)
                    free -= {a, b}
        return ordered

    def busy_now(self, now: float) -> set[tuple[int, int]]:
        """Links not to probe now: those a running plan keeps busy at the view's rates, unless their
        estimate predates a move of a port they cross (NetworkView.ports_moved) or they are still unknown
        BLIND_S after they became busy, and those that gave a passive sample within PASSIVE_BUSY_S. A
        plan link the plan keeps backlogged gives samples; one whose estimate was taken under the old
        port may look loaded only by it: on the auto bench's flipping trace mst's ring links kept the
        10 Mbit/s they read under binding ports for 400 s after the ports loosened (chunks forwarded
        from slower links give no sample), and mst kept routing over chords around them."""
        plan_links = busy_links(self.running(), self.view, self.route())
        since = self.loaded_since = {k: self.loaded_since.get(k, now) for k in plan_links}
        loaded = {k for k in plan_links
                  if (now - since[k] < BLIND_S if not self.view.known(*k)
                      else self.view.g.edges[k]["t"] >= self.view.ports_moved.at(*k))}
        return loaded | self.view.passive_since(now - PASSIVE_BUSY_S)

    def candidates(self, now: float, free: set[int], busy: set[tuple[int, int]]) -> list[tuple[int, int]]:
        """Links that may be probed now, most wanted first: unknown ones, then those whose newest sample
        disagreed with the estimate or whose node saw another link move since their last sample and
        probe, then the stalest beyond refresh_s."""
        self._note_moves(now)
        # a plan link exempt from `busy` (an estimate older than its port's move, or none) may be probed
        # itself, but the plan's bytes cross its ports all the same (loaded_since: busy_now's plan links)
        ports = self.busy_ports(busy | self.loaded_since.keys())
        ranked = []
        for a, b, e in self.view.g.edges(data=True):
            if a not in free or b not in free or (a, b) in busy or (a, "up") in ports or (b, "down") in ports:
                continue
            probed = self.last_probe.get((a, b), -math.inf)  # among equals, the one probed longest ago
            if not e["measured"]:
                ranked.append((0, probed, (a, b)))
                continue
            recent = e["recent"]
            moved = (recent and abs(recent[-1][0] - e["rate"]) > 2 * AGREE * e["rate"]) or (a, b) in self.faster
            at_moved_node = max(self.node_moved.get(a, -math.inf), self.node_moved.get(b, -math.inf)) \
                > max(e["t"], probed)
            if (moved and now - probed >= 2 * TICK_S) or at_moved_node:
                ranked.append((1, probed, (a, b)))
            elif now - max(e["t"], probed) >= self.refresh_s:
                ranked.append((2, max(e["t"], probed), (a, b)))
        return [k for *_, k in sorted(ranked)]

    def busy_ports(self, busy: set[tuple[int, int]]) -> set[tuple[int, str]]:
        """Capped ports ((node, "up" | "down")) that the busy links fill: what they carry alone
        (NetworkView.capacity: not their share of a port that binds them now) adds up to PORT_BUSY of the
        port's declared cap. Without caps, links are independent: none."""
        load = port_loads({k: self.view.capacity(*k) if self.view.g.has_edge(*k) else self.view.nominal
                           for k in busy})
        return {port for port, mbps in load.items()
                if (cap := self.view.cap(*port)) is not None and mbps >= PORT_BUSY * cap}

    def _note_moves(self, now: float) -> None:
        """Note the nodes of every known link whose estimate moved by NODE_MOVED since the last look, and
        of every port whose declared cap moved (NetworkView.declare_cap)."""
        for (node, _), t in self.view.ports_moved.t.items():
            self.node_moved[node] = max(self.node_moved.get(node, -math.inf), t)
        for a, b, e in self.view.g.edges(data=True):
            if not e["measured"]:
                continue
            before = self.estimates.get((a, b))
            self.estimates[(a, b)] = e["rate"]
            if before and max(e["rate"], before) >= NODE_MOVED * min(e["rate"], before):
                self.node_moved[a] = self.node_moved[b] = now

    def _spent(self, node: int, now: float) -> float:
        """Seconds of the last WINDOW_S this node spent in probes."""
        spans = self.spent.get(node)
        if not spans:
            return 0.0
        spans[:] = [(s, e) for s, e in spans if e > now - WINDOW_S]
        return sum(min(e, now) - max(s, now - WINDOW_S) for s, e in spans)

    def probe_bytes(self, a: int, b: int) -> int:
        """PROBE_S at the link's estimated rate, or what its previous probe taught while it is not known;
        REPROBE_S once it is, at the fastest of the estimate, the newest sample and what the last probe
        showed (`done`); whole chunks of float32."""
        if self.view.known(a, b):
            recent = self.view.g.edges[a, b]["recent"]
            mbps = max(self.view.rate(a, b), recent[-1][0] if recent else 0.0, self.faster.get((a, b), 0.0))
            want = mbps * MBIT * REPROBE_S
        else:  # a first guess: the links known so far (a nominal 100 Mbit/s is 5x off on a 20 Mbit/s link)
            want = self.size.get((a, b), self._typical_mbps() * MBIT * PROBE_S)
        per = max(MIN_PROBE_BYTES // PROBE_CHUNKS, int(want) // PROBE_CHUNKS) // 4 * 4
        return min(per * PROBE_CHUNKS, MAX_PROBE_BYTES // PROBE_CHUNKS // 4 * 4 * PROBE_CHUNKS)

    def _typical_mbps(self) -> float:
        """The median rate of the links known so far (an unknown link's rate is the nominal one)."""
        known = sorted(e["rate"] for *_, e in self.view.g.edges(data=True) if e["measured"])
        return known[len(known) // 2] if known else self.view.nominal

    def _order(self, a: int, b: int, now: float, nbytes: int) -> _Order | None:
        o = _Order(self._next_id, a, b, nbytes, now)
        self._next_id += 1
        if not self.send(a, Probe(id=o.id, dst=b, size=o.nbytes, chunks=PROBE_CHUNKS)):
            return None
        self.inflight[o.id] = o
        self.last_probe[(a, b)] = now
        self.history.append((now, a, b, o.nbytes, tuple(sorted(p.version for p in self.running()))))
        self.stats.ordered += 1
        return o

    # --- what agents say ----------------------------------------------------------------------------------
    def done(self, node: int, msg: ProbeDone, now: float | None = None) -> None:
        """A probe's sender says it is over: its slot frees, and its time counts against both ends' budget.
        The next probe of the link is sized from what this one showed."""
        o = self.inflight.get(msg.id)
        if o is None or o.src != node or o.dst != msg.dst:
            return  # not ours (given up, or a stranger's id): nothing to free
        del self.inflight[msg.id]
        now = time.time() if now is None else now
        for n in (o.src, o.dst):
            self.spent.setdefault(n, []).append((o.t, now))
        if not msg.ok:
            self.stats.failed += 1
            return
        self.stats.done += 1
        self.stats.bytes += msg.sent
        self.stats.seconds += msg.seconds
        link = (o.src, o.dst)
        shown = msg.sent * 8 / 1e6 / max(msg.seconds, 1e-6)  # Mbit/s, a lower bound: the seconds hold delays and acks
        if not self.view.known(*link):  # too short to make a sample the view trusts: longer next time
            self.size[link] = int(max(shown * MBIT * PROBE_S, 2 * o.nbytes))
        elif shown > (1 + MOVED) * self.view.rate(*link):
            # faster than the estimate by more than the view's noise: a re-probe sized at the estimate takes
            # too little busy time at the new rate for the receiver to make a sample of it (agents/probes.py
            # MIN_SAMPLE_S), and the view would never see the link got faster; probe it again at this rate
            self.faster[link] = shown
        else:
            self.faster.pop(link, None)

    def as_json(self) -> dict[str, Any]:
        s = self.stats
        return {"enabled": self.enabled, "budget": self.budget, "at_once": self.at_once, "ordered": s.ordered,
                "done": s.done, "failed": s.failed, "bytes": s.bytes, "seconds": round(s.seconds, 3),
                "in_flight": [[o.src, o.dst] for o in self.inflight.values()]}


def plans_in_force(current: Any, plans: Mapping[int, Plan]) -> list[Plan]:
    """The plans a job now runs: its current plan, and the versions of its tasks that started and are not over."""
    if current is None or current.finished.is_set():
        return []
    out = {id(current.plan): current.plan}
    for t in current.tasks.values():
        if t.started_t is not None and t.recorded_t is None and t.version in plans:
            p = plans[t.version]
            out[id(p)] = p
    return list(out.values())
