"""What the scheduler knows of the network: only what agents measured, with its age.

Node caps (a big switch's ports: each node's uplink and downlink) are known two ways. *Declared*: a
node registers the rates its caps run at and says so again whenever they change (a trace), as the
paper's manager "collects the available bandwidth" of every port (`cap(..., "declared")`, the default).
*Measured*, the same way as links (`cap(..., "measured")`): agents report samples of
what all of a node's traffic together moved while it stayed busy (agents/capprobes.py). An aggregate
reaches a cap only while the cap is what binds (otherwise the senders or receivers limit it), so a
cap's estimate is a high quantile (CAP_QUANTILE, duration-weighted) of its latest KEEP samples rather
than their median (the highest would pick the noise of a short sample); it is known once
KNOWN_S of busy time in KNOWN_SAMPLES samples arrived; until then it is the declared rate. A trace that
lowers a cap shows as soon as the older, faster samples have left the latest KEEP. A measured cap that
never binds reads low, and a selection that avoids a port it believes slow keeps it from binding: the
measured estimates are a lower bound, which is why selection uses the declared ones by default.

It starts uniform (every overlay link at a nominal rate, marked unknown) and learns from passive
samples: bytes a link delivered over seconds it was continuously busy (agents/probes.py). It never
looks at the emulator. A link is *known* (`measured`) once at least KNOWN_SAMPLES samples covering
KNOWN_S of busy time arrived and most of that time agrees within AGREE; until then its rate is the
nominal guess and the view says so (`known`, `coverage`, `coverage_of`): one short sample, or samples
that disagree, are no knowledge. The estimate is the duration-weighted
median of the link's latest KEEP samples: a sample whose ends a late event loop moved by a few ms (too
fast or too slow) does not move it, and after a change of rate the newer samples take over: at
once when the two newest agree with each other and both lie beyond MOVED of the estimate (`_moved`).

Samples come from a plan's own chunks (passive) or from the scheduler's probes of links no plan
keeps busy (scheduler/prober.py); the view says which (`how`), with the newest sample's time and
the samples' spread, so a reader knows what each estimate rests on. Where both are among a link's
latest samples the probed ones decide: a probe keeps its link backlogged by design, while a plan's
chunks on a link it does not keep busy (a tree's inner link, fed at its children's pace) read low.

Where nodes declare caps, a link busy beside others through a binding port delivers a share of the
port, not its own rate: `rate` says what it delivers, `capacity` what its samples no port bound say
it carries alone (`_port_bound`), which predictions of other plans need (the simulator applies the
ports). A port that moves makes its links' samples history (`declare_cap`).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

import networkx as nx

NOMINAL_MBPS = 100.0
EWMA_ALPHA = 0.3  # kept for callers that pass alpha; the estimate is duration-weighted (TAU_S)
KNOWN_S = 0.05  # busy time a link's samples must cover before its estimate is trusted
KNOWN_SAMPLES = 2  # ... in at least this many samples (or one of twice KNOWN_S)
AGREE = 0.10  # ... at least half of whose busy time lies within this of their median (else: unknown yet)
KEEP = 7  # latest samples per link the estimate is the (duration-weighted) median of
MOVED = 2 * AGREE  # two agreeing newest samples this far from the estimate: the rate changed (_moved)
PORT_BOUND = 1 - AGREE  # a sample whose port's busy links add up to this share of its declared cap: a share
CONCURRENT_S = 2.0  # ... busy: a sample within this long (agents report every 0.25 s, but a tree link is
# busy in one phase of a round: under binding ports an mst round takes 1.8 s, and a probe sharing its uplink
# with the other phase's link, whose last sample was 1.2 s old, read 25 Mbit/s as the link's own)
QUARANTINE_S = 0.75  # samples this close to a port's move may have run under either port (PortMoves.moving)
CAP_QUANTILE = 0.75  # a cap's estimate: this quantile of its latest samples (aggregates only reach it binding)


class PortMoves:
    """When each node's declared ports last moved ((node, "up" | "down") -> time): the ports a link crosses
    are its source's uplink and its destination's downlink."""

    def __init__(self) -> None:
        self.t: dict[tuple[int, str], float] = {}

    def note(self, node: int, kind: str, now: float) -> None:
        self.t[(node, kind)] = now

    def at(self, src: int, dst: int) -> float:
        """When a port link src->dst crosses last moved (-inf: never)."""
        return max(self.t.get((src, "up"), -math.inf), self.t.get((dst, "down"), -math.inf))

    def moving(self, src: int, dst: int, now: float) -> bool:
        """Did a port of this link move within QUARANTINE_S? A sample then may have run under either port
        (the source declares its uplink in its own reports, up to a report later than the receiver's)."""
        return now - self.at(src, dst) < QUARANTINE_S

    def latest(self) -> float:
        """When any port last moved (-inf: never)."""
        return max(self.t.values(), default=-math.inf)


class DisconnectedView(ValueError):
    """The known overlay does not connect the participants: no plan can exist."""


class NetworkView:
    def __init__(self, links: Iterable[tuple[int, int]] = (), *, nominal_mbps: float = NOMINAL_MBPS,
                 alpha: float = EWMA_ALPHA) -> None:
        self.g = nx.DiGraph()
        self.nominal = nominal_mbps
        self.alpha = alpha
        self.samples = 0
        self.suspended: dict[tuple[int, int], dict[tuple[int, int], dict]] = {}  # link -> its edges' data
        self.down: dict[int, dict[tuple[int, int], dict]] = {}  # lost node -> its edges' data
        self.caps: dict[tuple[int, str], dict] = {}  # (node, "up" | "down") -> its estimate, as an edge's
        self.cpus: dict[int, tuple[str, int]] = {}  # node -> (its machine, its CPUs), as its launcher knows
        self.ports_moved = PortMoves()  # when each declared cap moved
        for a, b in links:
            self.add_link(a, b)

    def copy(self) -> NetworkView:
        """A copy a planner may read in a worker thread while this one goes on learning."""
        return copy.deepcopy(self)

    def add_node(self, n: int) -> None:
        self.g.add_node(n)

    def add_link(self, a: int, b: int) -> None:
        """An overlay link (both directions) known from registration; rate unknown until measured."""
        if (min(a, b), max(a, b)) in self.suspended or a in self.down or b in self.down:
            return  # known, and out of planning while suspected dead or while an end is lost
        for u, v in ((a, b), (b, a)):
            if not self.g.has_edge(u, v):
                self.g.add_edge(u, v, rate=self.nominal, measured=False, t=0.0, n=0, busy_s=0.0, recent=(),
                                probed=())

    @property
    def nodes(self) -> list[int]:
        return sorted(self.g.nodes)

    def links(self) -> list[tuple[int, int]]:
        return sorted(self.g.edges)

    def rate(self, a: int, b: int) -> float:
        return self.g.edges[a, b]["rate"]

    def rate_or_nominal(self, a: int, b: int) -> float:
        """The link's estimate; the nominal guess for a link this view does not hold (a plan's route may)."""
        return self.rate(a, b) if self.g.has_edge(a, b) else self.nominal

    def links_mbps(self, node: int, kind: str) -> float:
        """The summed rate estimate of the node's links out of it ("up") or into it ("down")."""
        if node not in self.g:
            return 0.0
        return float(sum(rate for _, _, rate in _port_edges(self.g, node, kind, "rate")))

    # --- the machines the agents run on ----------------------------------------------------------------
    def set_cpu_host(self, node: int, host: str | None, cpus: int | None) -> None:
        """Where a node's agent runs, as the launcher that placed it knows: agents that name one machine
        share its CPUs (None: unknown)."""
        if host is None or cpus is None:
            self.cpus.pop(node, None)
        elif isinstance(cpus, bool) or not (isinstance(cpus, int) and cpus >= 1):
            raise ValueError(f"node {node}: a machine has at least 1 CPU, got {cpus!r}")
        else:
            self.cpus[node] = (host, cpus)

    def share_machine(self, nodes: Iterable[int], cpus: int, host: str = "local") -> None:
        """Every one of `nodes` runs on one machine of `cpus` CPUs (a local cluster)."""
        for n in nodes:
            self.set_cpu_host(n, host, cpus)

    def cpu_hosts(self) -> list[tuple[frozenset[int], int]]:
        """Every machine the launcher named: its nodes and the CPUs they share (the fewest given for
        any of them). Nodes it named no machine for are on none."""
        by: dict[str, list[int]] = {}
        for node, (host, _) in self.cpus.items():
            by.setdefault(host, []).append(node)
        return [(frozenset(nodes), min(self.cpus[n][1] for n in nodes)) for _, nodes in sorted(by.items())]

    # --- node caps -----------------------------------------------------------------------------------
    def set_cap(self, node: int, kind: str, mbps: float | None) -> None:
        """A node's configured cap (REGISTER): the nominal estimate until samples are in (None: no cap)."""
        if kind not in ("up", "down"):
            raise ValueError(f"kind: up or down, got {kind!r}")
        if mbps is None:
            self.caps.pop((node, kind), None)
        elif (node, kind) not in self.caps:
            self.caps[(node, kind)] = dict(rate=float(mbps), nominal=float(mbps), measured=False, t=0.0, n=0,
                                           busy_s=0.0, recent=())
        else:
            self.declare_cap(node, kind, mbps)

    def declare_cap(self, node: int, kind: str, mbps: float, now: float | None = None) -> None:
        """The rate a node says its cap runs at now (a trace changed it). A cap that moved by more than
        MOVED makes its links' samples history: they were taken under the old port (a share of it,
        where it bound) and say little of the new one. Each link keeps its estimate, but its next sample
        replaces them instead of joining them: found on the auto bench's flipping trace, where ring links
        read at their share of binding 50 Mbit/s ports (10 Mbit/s, samples of 0.5 s) kept that estimate
        long after the ports loosened, because the scheme in force gave them samples of 0.05 s at 200
        Mbit/s, which the duration-weighted median outweighed and _moved (samples of KNOWN_S at least)
        ignored."""
        e = self.caps.get((node, kind))
        if e is None:
            return
        before = e["nominal"]
        e["nominal"] = float(mbps)
        if not e["measured"]:
            e["rate"] = float(mbps)
        if abs(mbps - before) <= MOVED * max(before, 1e-9):
            return
        now = time.time() if now is None else now
        self.ports_moved.note(node, kind, now)
        if node not in self.g:
            return
        for *_, d in _port_edges(self.g, node, kind):
            if d["measured"]:
                d["recent"], d["probed"] = (), ()
            # samples taken as the port moved may have run under the new one: not the link's own
            d["free"] = tuple(x for x in d.get("free", ()) if x[3] < now - QUARANTINE_S)
            if d.get("free_since", -math.inf) >= now - QUARANTINE_S:  # ... nor a move they made
                d["free_since"] = -math.inf
            d["capacity"] = _free_rate(d["free"], d.get("free_since", -math.inf))

    def observe_cap(self, node: int, kind: str, nbytes: int, seconds: float, now: float | None = None) -> None:
        """One passive sample of a node cap: all of the node's traffic that way moved nbytes over `seconds`
        of busy time. Samples of caps the node never registered are ignored."""
        e = self.caps.get((node, kind))
        if e is None or not (math.isfinite(seconds) and seconds > 0 and nbytes > 0):
            return
        recent = e["recent"] = (*e["recent"][-(KEEP - 1):], (nbytes * 8 / seconds / 1e6, seconds))
        e["busy_s"] += seconds
        e["n"] += 1
        if e["measured"] or (e["busy_s"] >= KNOWN_S - 1e-12 and e["n"] >= KNOWN_SAMPLES):
            e["rate"] = _weighted_quantile(recent, CAP_QUANTILE)
            e["measured"] = True
        e["t"] = time.time() if now is None else now

    def cap(self, node: int, kind: str, source: str = "declared") -> float | None:
        """The cap in Mbit/s as the node declares it, or as measured ("measured": the declared rate until
        known), or None: no such cap."""
        e = self.caps.get((node, kind))
        if source not in ("declared", "measured"):
            raise ValueError(f"source: declared or measured, got {source!r}")
        return None if e is None else e["nominal" if source == "declared" else "rate"]

    def cap_known(self, node: int, kind: str) -> bool:
        e = self.caps.get((node, kind))
        return e is not None and bool(e["measured"])

    def observe(self, src: int, dst: int, nbytes: int, seconds: float, now: float | None = None, *,
                probed: bool = False) -> None:
        """One sample: the link delivered nbytes over `seconds` of continuous busy time, while a plan's
        chunks kept it busy (passive) or a probe did (probed: scheduler/prober.py)."""
        if not (math.isfinite(seconds) and seconds > 0 and nbytes > 0) or not self.g.has_edge(src, dst):
            return  # the wire refuses such samples; nothing else may poison a rate either
        e = self.g.edges[src, dst]
        recent = e["recent"] = (*e["recent"][-(KEEP - 1):], (nbytes * 8 / seconds / 1e6, seconds))
        flags = e["probed"] = (*e.get("probed", ())[-(KEEP - 1):], probed)
        if e["measured"] and _moved(recent, e["rate"]):
            recent, flags = e["recent"], e["probed"] = recent[-2:], flags[-2:]  # the older ones describe the past
        e["busy_s"] += seconds
        # a probe kept the link backlogged by design; a plan's chunks may have fed it at their upstream's
        # pace (a tree's inner link), which reads low: where both are among the latest, the probes decide
        pool = _deciding(recent, flags)
        e["how"] = "probed" if any(flags) else "passive"
        rate = _weighted_median(pool)
        if e["measured"]:
            e["rate"] = rate
        elif e["busy_s"] >= KNOWN_S - 1e-12 and (seconds >= 2 * KNOWN_S or (
                e["n"] + 1 >= KNOWN_SAMPLES and _agreeing(pool, rate) >= 0.5)):
            e["rate"] = rate  # from now on the link is known (its estimate follows its samples)
            e["measured"] = True
        t = time.time() if now is None else now
        if not _port_bound(self, src, dst, recent[-1][0], t) and not self.ports_moved.moving(src, dst, t):
            free = e["free"] = (*e.get("free", ())[-(KEEP - 1):], (recent[-1][0], seconds, probed, t))
            if e.get("capacity") is not None and _moved([x[:2] for x in free], e["capacity"]):
                e["free_since"] = free[-2][3]  # the older ones describe the past (kept: a port's move may undo it)
            e["capacity"] = _free_rate(free, e.get("free_since", -math.inf))
        e["t"] = t
        if not probed:
            e["passive_t"] = e["t"]
        e["n"] += 1
        self.samples += 1

    def capacity(self, a: int, b: int) -> float:
        """What the link itself carries, as far as the view knows: the estimate from its samples that no
        declared node cap bound (`_port_bound`), else its estimate (`rate`: what it delivers). What a
        prediction of another plan needs: the simulator applies the ports itself, and a share of a port
        under one plan is not the link's rate under another (auto's flipping trace: ring links known
        only at their share of binding ports kept the ring from ever being chosen while they bound).
        Never below what the link delivers now: a link carries no more than it can, so an estimate
        under its rate rests on samples that are history (on the flipping trace, one sample of 59
        Mbit/s taken 9 s earlier outlived 200 Mbit/s ones that came while a port moved or bound)."""
        e = self.g.edges[a, b]
        return max(e["capacity"], e["rate"]) if e["measured"] and e.get("capacity") is not None else e["rate"]

    def passive_since(self, t: float) -> set[tuple[int, int]]:
        """Links a plan's own chunks kept busy since time t (a passive sample arrived): in use now."""
        return {(a, b) for a, b, pt in self.g.edges(data="passive_t") if pt is not None and pt >= t}

    def known(self, a: int, b: int) -> bool:
        """Is link a->b measured well enough to be trusted (KNOWN_S of busy time), not the nominal guess?"""
        return self.g.has_edge(a, b) and bool(self.g.edges[a, b]["measured"])

    def how(self, a: int, b: int) -> dict:
        """How link a->b is known (describe): nominal, passive or probed; when; how sure."""
        return describe(self.g.edges[a, b])

    def coverage_of(self, links: Iterable[tuple[int, int]]) -> float:
        """Share of these directed links the view knows (1.0 for none): what a plan over them rests on."""
        links = list(links)
        return sum(1 for a, b in links if self.known(a, b)) / len(links) if links else 1.0

    def suspend(self, a: int, b: int) -> bool:
        """Take link a-b (both directions) out of planning while it is suspected dead (a blackhole
        found by a stall). Refused, returning False, if that would disconnect the nodes not lost."""
        if not self.g.has_edge(a, b) or (a, b) in self.suspended:
            return False
        edges = {(u, v): dict(self.g.edges[u, v]) for u, v in ((a, b), (b, a)) if self.g.has_edge(u, v)}
        self.g.remove_edges_from(edges)
        if not _connected(self.g, self.down):
            self._restore(edges)
            return False
        self.suspended[(a, b)] = edges
        return True

    def unsuspend(self, a: int, b: int) -> None:
        self._restore(self.suspended.pop((a, b), {}))

    def node_down(self, n: int) -> list[tuple[int, int]]:
        """A lost agent relays nothing: its links leave planning and routing until it registers again.
        A loss is a fact and a suspicion a guess: suspected links the living nodes need to stay
        connected are trusted again (returned). If they are still apart, no plan exists until the
        node is back (planners raise DisconnectedView)."""
        if n in self.down or n not in self.g:
            return []
        self.down[n] = {(u, v): dict(attrs) for u, v, attrs in [*self.g.out_edges(n, data=True),
                                                                  *self.g.in_edges(n, data=True)]}
        self.g.remove_edges_from(self.down[n])
        trusted = []
        for link in sorted(self.suspended):
            if _connected(self.g, self.down):
                break
            if not set(link) & set(self.down):
                self.unsuspend(*link)
                trusted.append(link)
        return trusted

    def node_up(self, n: int) -> None:
        self._restore(self.down.pop(n, {}))

    def _restore(self, edges: dict[tuple[int, int], dict]) -> None:
        """Put edges back, except those that another lost node or a suspected link still holds out."""
        for (u, v), attrs in edges.items():
            lost = u if u in self.down else v if v in self.down else None
            if lost is not None:
                self.down[lost][(u, v)] = attrs
            elif (min(u, v), max(u, v)) in self.suspended:
                self.suspended[(min(u, v), max(u, v))][(u, v)] = attrs
            else:
                self.g.add_edge(u, v, **attrs)

    def unusable(self) -> list[list[int]]:
        """Links agents must route around: suspected dead, or with a lost end (sorted pairs)."""
        out = set(self.suspended)
        for edges in self.down.values():
            out.update((min(u, v), max(u, v)) for u, v in edges)
        return [list(k) for k in sorted(out)]

    def coverage(self) -> float:
        """Share of directed links the view knows (measured for KNOWN_S of busy time)."""
        edges = self.g.number_of_edges()
        return sum(1 for *_, m in self.g.edges(data="measured") if m) / edges if edges else 0.0

    def snapshot(self) -> dict[tuple[int, int] | tuple[int, str], float]:
        """Every link's rate, and every node cap as declared ((node, "up" | "down")): what plans rest on."""
        out: dict[tuple[int, int] | tuple[int, str], float] = {(a, b): r for a, b, r in self.g.edges(data="rate")}
        out.update({key: e["nominal"] for key, e in self.caps.items()})
        return out

    def require_connected(self, participants: Iterable[int]) -> None:
        parts = list(participants)
        missing = [p for p in parts if p not in self.g]
        if missing:
            raise DisconnectedView(f"nodes {missing} have no known links")
        reach = nx.node_connected_component(self.g.to_undirected(as_view=True), parts[0])
        if not set(parts) <= reach:
            raise DisconnectedView(f"the view does not connect participants {sorted(set(parts) - reach)} "
                                   f"to node {parts[0]}")

    def changed_since(self, old: dict[tuple[int, int] | tuple[int, str], float], threshold: float) -> bool:
        """Did any link's rate, or a node's declared cap, move by more than `threshold` (relative) since `old`?"""
        now = self.snapshot()
        return any(abs(now[k] - old.get(k, self.nominal)) > threshold * max(old.get(k, self.nominal), 1e-9)
                   for k in now)


def _moved(samples: tuple[tuple[float, float], ...], rate: float) -> bool:
    """Did the link's rate change? Its two newest samples, each of KNOWN_S of busy time at least, agree
    with each other within AGREE and both lie beyond MOVED of the estimate, on the same side (one
    sample a late loop timed badly never does; a trace that halves a link does at its second sample)."""
    if len(samples) < 3:
        return False
    (a, wa), (b, wb) = samples[-2:]
    if min(wa, wb) < KNOWN_S or abs(a - b) > AGREE * max(a, b):
        return False
    return (min(a, b) > rate * (1 + MOVED)) or (max(a, b) < rate * (1 - MOVED))


def describe(e: dict) -> dict:
    """How the view knows one link's (or cap's) rate: from what (nominal, passive, probed), how long ago
    (`t`, the newest sample's time), and how sure: its samples' count and relative spread (the
    duration-weighted inter-quartile range over the median of the latest KEEP)."""
    recent = e.get("recent", ())
    spread = None
    if len(recent) >= 2:
        mid = _weighted_quantile(recent, 0.5)
        spread = (_weighted_quantile(recent, 0.75) - _weighted_quantile(recent, 0.25)) / mid if mid > 0 else None
    return {"how": e.get("how", "passive") if e["measured"] else "nominal", "t": e["t"], "samples": e["n"],
            "spread": None if spread is None else round(spread, 4)}


def _port_bound(view: NetworkView, src: int, dst: int, mbps: float, now: float) -> bool:
    """Did a declared node cap, rather than the link, set this sample's rate? It did where the port's own
    latest sample (what all its links moved together, agents/capprobes.py) within CONCURRENT_S reached
    PORT_BOUND of its declared cap, or where the link's busy neighbours through the port (a sample
    within CONCURRENT_S) and this sample add up to that: the link delivered its share of the port, and
    may run faster alone (a ring link read 25 Mbit/s as one of two tree links through a 50 Mbit/s
    port). The port's own sample catches what its neighbours' samples miss when they come a report
    later than this one (a probe read 16 Mbit/s as the link's own beside shardps's first round)."""
    for node, kind in ((src, "up"), (dst, "down")):
        c = view.caps.get((node, kind))
        if c is None:
            continue
        if c["recent"] and c["t"] >= now - CONCURRENT_S and c["recent"][-1][0] >= PORT_BOUND * c["nominal"]:
            return True  # the port itself ran full: its own latest sample (all its links together) says so
        total = mbps + sum(d["rate"] for u, v, d in _port_edges(view.g, node, kind)
                           if (u, v) != (src, dst) and d["measured"] and d["t"] >= now - CONCURRENT_S)
        if total >= PORT_BOUND * c["nominal"]:
            return True
    return False


def _connected(g: nx.DiGraph, down: Iterable[int]) -> bool:
    """Do the nodes not lost form one connected overlay (links either way)?"""
    lost = set(down)
    sub = g.subgraph(m for m in g if m not in lost).to_undirected(as_view=True)
    return len(sub) == 0 or nx.is_connected(sub)


def _free_rate(free: tuple[tuple[float, float, bool, float], ...], since: float) -> float | None:
    """A link's capacity from its samples no port bound (rate, seconds, probed, when), those since its
    rate last moved: their duration-weighted median, the probed ones deciding where there are any (as
    for `rate`); None without any."""
    free = tuple(x for x in free if x[3] >= since)
    if not free:
        return None
    return _weighted_median(_deciding([x[:2] for x in free], [x[2] for x in free]))


def _deciding(samples: Sequence[tuple[float, float]], probed: Sequence[bool]) -> Sequence[tuple[float, float]]:
    """The samples an estimate rests on: the probed ones where there are any (a probe keeps its link
    backlogged; a plan's chunks may feed it at their upstream's pace), else all."""
    return [x for x, f in zip(samples, probed, strict=True) if f] if any(probed) else samples


def _port_edges(g: nx.DiGraph, node: int, kind: str, data: bool | str = True) -> Any:
    """The links through a node's port: out of it ("up"), into it ("down")."""
    return g.out_edges(node, data=data) if kind == "up" else g.in_edges(node, data=data)


def _weighted_median(samples: Iterable[tuple[float, float]]) -> float:
    """The rate below and above which half of the samples' busy time lies (of two samples, their
    duration-weighted mean: neither is an outlier of the other)."""
    ordered = sorted(samples)
    if len(ordered) <= 2:
        return sum(r * w for r, w in ordered) / sum(w for _, w in ordered)
    return _weighted_quantile(ordered, 0.5)


def _weighted_quantile(samples: Iterable[tuple[float, float]], q: float) -> float:
    """The rate below which a share q of the samples' busy time lies."""
    ordered = sorted(samples)
    target = q * sum(w for _, w in ordered)
    acc = 0.0
    for rate, w in ordered:
        acc += w
        if acc >= target:
            return rate
    return ordered[-1][0]


def _agreeing(samples: Iterable[tuple[float, float]], rate: float) -> float:
    """Share of the samples' busy time whose rate is within AGREE of `rate`: samples that a starved
    receiver timed badly disagree, and a link with no agreeing majority is not known yet."""
    samples = list(samples)
    total = sum(w for _, w in samples)
    return sum(w for r, w in samples if abs(r - rate) <= AGREE * rate) / total if total > 0 else 0.0
