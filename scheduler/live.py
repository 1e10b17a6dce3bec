"""Live state of a running scheduler, for people and scrapers: link throughput, rounds, tasks, liveness,
metrics.

Everything here is derived from the scheduler's own events (agents' COUNTERS, task records, the
timeline) and, for the tasks in flight, read from its current job, so the dashboard, the Prometheus
endpoint, the terminal and the results file all show the same numbers. A job of rounds (BSP) has
its records as rounds too (the rounds view and round metrics); a tasks job's records (partial
reduces the scheduler forms) are tasks only. Nothing in this module changes the scheduler's state.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from core.plan import Plan

from .service import Scheduler
from .view import describe

Link = tuple[int, int]
Listener = Callable[[str, dict[str, Any]], None]

SERIES_STEP_S = 0.5  # throughput point period per link: agents report every 0.25 s; two reports smooth bursts
SERIES_KEEP = 1800  # points per link (15 min at two a second)
ROUNDS_KEEP = 5000
TASKS_KEEP = 5000
FEED_KEEP = 50_000
NODE_STALE_S = 3.0  # agents report counters every 0.25 s: silence this long means the node is not up
# round-time histogram buckets (seconds): scaled-down runs take milliseconds, full-size WAN rounds minutes
ROUND_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
GUARD_VERDICTS = ("valid", "invalid", "unjudged")  # the fidelity guard's words (wansync.guard.guard_verdict)
PLAN_GROUPS_MAX = 64  # groups sent per plan (ring: one per node; netstorm: one per root)
TASK_OUTCOMES = ("exact", "failed", "aborted")  # a task record's outcome (task_outcome)
# what the live feed and the dashboard's snapshot carry of a task record (/api/tasks has all of it)
TASK_ITEM = ("job", "scheme", "task", "round", "version", "attempt", "round_s", "ok", "digests_agree", "aborted",
             "members", "receivers", "aggregators", "bytes", "t_start", "t_end", "spans", "mode")


def task_outcome(rec: dict[str, Any]) -> str:
    """exact (every receiver holds the agreed, checked sum), aborted (no attempt could end exact: nothing
    of it was applied) or failed (it ended, but not exact: an agent's check or their digests disagree)."""
    if rec.get("aborted"):
        return "aborted"
    return "exact" if rec.get("ok") and rec.get("digests_agree") else "failed"


def plan_json(p: Plan) -> dict[str, Any]:
    """A plan as drawn: trees, aux routes, multicast, roles; chunk layout omitted."""
    groups = [{"root": g.root, "chunks": len(g.chunks),
               "parent": {str(n): q for n, q in sorted(g.parent.items())},
               "children": {str(n): list(k) for n, k in sorted(g.children.items())},
               "aux": [{"src": a, "dst": b, "routes": [list(r) for r in rs]} for (a, b), rs in sorted(g.aux.items())]}
              for g in p.groups[:PLAN_GROUPS_MAX]]
    return {"version": p.version, "scheme": p.scheme, "participants": list(p.participants),
            "receivers": list(p.receiver_set), "nodes": sorted(p.nodes),
            "weights": {str(n): w for n, w in sorted(p.weights.items())}, "chunks": len(p.layout),
            "params": p.params, "groups_total": len(p.groups), "groups": groups,
            "multicast": None if p.multicast is None else {str(n): list(r) for n, r in sorted(p.multicast.items())}}


class LiveState:
    """Subscribes to a Scheduler and keeps bounded histories plus a sequence-numbered feed of what is new."""

    def __init__(self, sched: Scheduler, *, step_s: float = SERIES_STEP_S) -> None:
        self.sched = sched
        self.step_s = step_s
        self.t_start = time.time()
        self.seq = 0
        self.feed: deque[tuple[int, str, dict[str, Any]]] = deque(maxlen=FEED_KEEP)
        self.series: dict[Link, deque[tuple[float, float]]] = {}
        self.current_mbps: dict[Link, float] = {}
        self._last: dict[Link, tuple[float, int]] = {}
        self.rounds: deque[dict[str, Any]] = deque(maxlen=ROUNDS_KEEP)  # BSP jobs' records
        self.tasks: deque[dict[str, Any]] = deque(maxlen=TASKS_KEEP)  # every job's task records
        self.modes: dict[int, str] = {}  # job -> its mode (its timeline entry): "tasks", or rounds
        self.task_hist: dict[str, list[int]] = {}  # tasks jobs: scheme -> count per bucket, as `hist`
        self.task_hist_sum: dict[str, float] = {}
        self.task_outcomes: dict[tuple[str, str], int] = {}  # tasks jobs: (scheme, outcome) -> count
        self.hist: dict[str, list[int]] = {}  # scheme -> count per bucket (not cumulative), last one +Inf
        self.hist_sum: dict[str, float] = {}
        self.failed: dict[str, int] = {}
        self.guard: dict[str, dict[str, Any]] = {}
        self.lost: set[int] = set()
        self.job: dict[str, Any] | None = None
        self._job_bytes0: dict[Link, int] = {}
        self.listeners: list[Listener] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        sched.subscribe(self._on_event)

    # --- events -----------------------------------------------------------------------------------
    def _push(self, kind: str, item: dict[str, Any]) -> None:
        self.seq += 1
        self.feed.append((self.seq, kind, item))
        for fn in self.listeners:
            fn(kind, item)

    def _on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "counters":
            self._counters(data["node"], float(data["time"]), data["links"])
        elif kind == "task":
            self._task(data)
        elif kind == "prediction":  # a round's prediction, simulated after the round was recorded
            for r in reversed(self.rounds):
                if r["job"] == data["job"] and r["round"] == data["round"]:
                    r["prediction_s"] = data["prediction_s"]
                    break
        elif kind == "timeline":
            if data["kind"] == "job":
                mode = self.modes[data["job"]] = data.get("mode", "rounds")
                self.job = {"job": data["job"], "scheme": data["scheme"], "rounds": data["rounds"], "done": 0,
                            "t_start": data["t"], "last_end": data["t"], "mode": mode}
                self._job_bytes0 = dict(self.sched.link_bytes)
            elif data["kind"] == "guard":
                g = {k: data[k] for k in ("valid", "verdict", "worst_ratio", "bad_links", "reasons") if k in data}
                if g.get("verdict") not in GUARD_VERDICTS:  # an older event: only `valid` (None: unjudged)
                    g["verdict"] = {True: "valid", False: "invalid"}.get(g.get("valid"), "unjudged")
                g["valid"] = {"valid": True, "invalid": False}.get(g["verdict"])
                self.guard[data["scheme"]] = g
            self._push("timeline", _plain(data))
        elif kind == "agent":
            self.lost.discard(data["node"])
        elif kind == "agent_lost":
            self.lost.add(data["node"])

    def _counters(self, node: int, t: float, links: dict[Any, int]) -> None:
        for dst, nbytes in links.items():
            link = (node, int(dst))
            prev = self._last.get(link)
            if prev is None:
                self._last[link] = (t, int(nbytes))
                continue
            dt = t - prev[0]
            if dt < self.step_s:
                continue
            mbps = max(0, int(nbytes) - prev[1]) * 8 / dt / 1e6
            self._last[link] = (t, int(nbytes))
            self.current_mbps[link] = mbps
            self.series.setdefault(link, deque(maxlen=SERIES_KEEP)).append((t, mbps))
            self._push("point", {"src": link[0], "dst": link[1], "t": t, "mbps": mbps, "bytes": int(nbytes)})

    def _task(self, rec: dict[str, Any]) -> None:
        """A task record: kept (with its job's mode); a BSP job's is also a round, a tasks job's counts
        in the task metrics."""
        mode = self.modes.get(rec["job"], "rounds")
        t = {**{k: v for k, v in rec.items() if k != "type"}, "mode": mode}
        t["spans"] = {str(n): list(se) for n, se in (rec.get("spans") or {}).items()}  # JSON keys, as the API sends
        t["digests"] = {str(n): d for n, d in (rec.get("digests") or {}).items()}
        self.tasks.append(t)
        if self.job is not None and self.job["job"] == rec["job"]:
            self.job["done"] += 1
            self.job["last_end"] = time.time()
        if mode != "tasks":  # a job of rounds (BSP or another progress model): its tasks are its rounds
            self._round(rec)
            return
        scheme, outcome = rec["scheme"], task_outcome(rec)
        self.task_outcomes[(scheme, outcome)] = self.task_outcomes.get((scheme, outcome), 0) + 1
        if outcome != "aborted":
            counts = self.task_hist.setdefault(scheme, [0] * (len(ROUND_BUCKETS) + 1))
            counts[next((i for i, le in enumerate(ROUND_BUCKETS) if rec["round_s"] <= le), len(ROUND_BUCKETS))] += 1
            self.task_hist_sum[scheme] = self.task_hist_sum.get(scheme, 0.0) + rec["round_s"]
        self._push("task", {k: t.get(k) for k in TASK_ITEM})

    def _round(self, rec: dict[str, Any]) -> None:
        r = {k: rec.get(k) for k in ("job", "scheme", "round", "version", "round_s", "ok", "digests_agree",
                                     "t_start", "t_end", "warmup", "prediction_s")}
        self.rounds.append(r)
        scheme = r["scheme"]
        if not (r["ok"] and r["digests_agree"]):
            self.failed[scheme] = self.failed.get(scheme, 0) + 1
        if not r["warmup"]:
            counts = self.hist.setdefault(scheme, [0] * (len(ROUND_BUCKETS) + 1))
            counts[next((i for i, le in enumerate(ROUND_BUCKETS) if r["round_s"] <= le), len(ROUND_BUCKETS))] += 1
            self.hist_sum[scheme] = self.hist_sum.get(scheme, 0.0) + r["round_s"]
        self._push("round", r)

    # --- read-only views --------------------------------------------------------------------------
    def since(self, seq: int) -> list[dict[str, Any]]:
        """Feed items newer than `seq` (a client's cursor), oldest first."""
        if not self.feed or self.feed[-1][0] <= seq:
            return []
        return [{"seq": s, "kind": k, "item": item} for s, k, item in self.feed if s > seq]

    def node_up(self, node: int, now: float | None = None) -> bool:
        a = self.sched.agents.get(node)
        now = time.time() if now is None else now
        return a is not None and node not in self.lost and now - a.last_seen < NODE_STALE_S

    def nodes(self) -> list[dict[str, Any]]:
        now = time.time()
        out = []
        for n in range(self.sched.expected):
            a = self.sched.agents.get(n)
            out.append({"node": n, "up": self.node_up(n, now), "registered": a is not None,
                        "host": a.host if a else None, "port": a.port if a else None,
                        "pid": a.pid if a else None, "neighbors": list(a.neighbors) if a else [],
                        "last_seen_age_s": round(now - a.last_seen, 3) if a else None})
        return out

    def links(self) -> list[dict[str, Any]]:
        g = self.sched.view.g
        now = time.time()
        out = []
        for a, b, e in sorted(g.edges(data=True)):
            how = describe(e)
            out.append({"src": a, "dst": b, "throughput_mbps": round(self.current_mbps.get((a, b), 0.0), 3),
                        "bytes_total": self.sched.link_bytes.get((a, b), 0), "rate_mbps": round(e["rate"], 3),
                        "capacity_mbps": round(self.sched.view.capacity(a, b), 3),
                        "measured": e["measured"], "samples": e["n"], "how": how["how"], "spread": how["spread"],
                        "age_s": round(now - e["t"], 3) if e["measured"] else None})
        return out

    def cluster(self) -> dict[str, Any]:
        s = self.sched
        plan = self.plan()
        return {"cluster": s.cluster, "expected_nodes": s.expected, "nodes": self.nodes(),
                "up": sum(1 for n in range(s.expected) if self.node_up(n)), "plan_version": s.version,
                "tasks_in_flight": self.in_flight_count(),
                "scheme": plan["scheme"] if plan else None, "job": self.job, "guard": self.guard,
                "guard_verdict": self.run_verdict(),
                "guard_valid": {"valid": True, "invalid": False}.get(self.run_verdict() or ""),
                "errors": s.errors[-20:], "uptime_s": round(time.time() - self.t_start, 3)}

    def run_verdict(self) -> str | None:
        """The run's fidelity so far: invalid if any scheme was, valid only if every scheme was judged
        valid, unjudged otherwise; None before the first verdict."""
        if not self.guard:
            return None
        verdicts = {g["verdict"] for g in self.guard.values()}
        return "invalid" if "invalid" in verdicts else "valid" if verdicts == {"valid"} else "unjudged"

    def view(self) -> dict[str, Any]:
        v = self.sched.view
        return {"nodes": v.nodes, "links": self.links(), "coverage": v.coverage(), "samples": v.samples,
                "nominal_mbps": v.nominal, "probes": self.sched.prober.as_json()}

    def plan(self, version: int | None = None) -> dict[str, Any] | None:
        """The current plan (or one by version) as drawn: trees, aux routes, multicast; chunk layout omitted."""
        s = self.sched
        p: Plan | None
        if version is not None:
            p = s.plans.get(version)
        elif s.current is not None:
            p = s.current.plan
        else:
            p = s.plans[max(s.plans)] if s.plans else None
        return None if p is None else plan_json(p)

    def recent_rounds(self, limit: int = 100, scheme: str | None = None) -> list[dict[str, Any]]:
        rs = [r for r in self.rounds if scheme is None or r["scheme"] == scheme]
        return rs[-limit:] if limit > 0 else []

    def recent_tasks(self, limit: int = 100, job: int | None = None) -> list[dict[str, Any]]:
        """The most recent task records (every job's: a BSP round's is its task's), oldest first."""
        ts = [t for t in self.tasks if job is None or t["job"] == job]
        return ts[-limit:] if limit > 0 else []

    def in_flight(self) -> dict[str, Any]:
        """The current job's tasks not recorded yet: `running` (started: members, receivers,
        aggregators, relays, the plan tree they run, who reported) and `waiting` (formed, not started:
        at a BSP barrier, or blocked with the reason)."""
        js = self.sched.current
        out: dict[str, Any] = {"job": None, "mode": None, "running": [], "waiting": []}
        if js is None or js.finished.is_set():
            return out
        out["job"], out["mode"] = js.job, js.mode
        now = time.time()
        for t in sorted(js.tasks.values(), key=lambda t: t.id):
            if t.recorded_t is not None:
                continue
            plan = self.sched.plans.get(t.version) if t.version is not None else None
            if t.started_t is not None and plan is not None:
                members, receivers = set(plan.participants), set(plan.receiver_set)
                out["running"].append({
                    "job": js.job, "scheme": js.scheme, "task": t.id, "round": t.round, "attempt": t.attempt,
                    "version": t.version, "members": sorted(members), "receivers": sorted(receivers),
                    "aggregators": sorted(set(plan.nodes) - members - receivers),
                    "relays": sorted(set(t.involved) - set(plan.nodes)), "started_t": t.started_t,
                    "age_s": round(now - t.started_t, 3), "reported": sorted(t.done), "plan": plan_json(plan)})
            elif not t.barrier or t.asked is not None:
                out["waiting"].append({
                    "job": js.job, "scheme": js.scheme, "task": t.id, "round": t.round, "attempt": t.attempt,
                    "members": list(t.members), "receivers": None if t.receivers is None else list(t.receivers),
                    "blocked": t.blocked, "at_barrier": sorted(t.asked or ())})
        return out

    def in_flight_count(self) -> int:
        js = self.sched.current
        if js is None or js.finished.is_set():
            return 0
        return sum(1 for t in js.tasks.values() if t.started_t is not None and t.recorded_t is None)

    def series_json(self) -> dict[str, list[list[float]]]:
        return {f"{a}-{b}": [[round(t, 3), round(m, 3)] for t, m in pts] for (a, b), pts in sorted(self.series.items())}

    def snapshot(self) -> dict[str, Any]:
        """Everything a freshly opened dashboard draws; `seq` is where its live updates start."""
        return {"seq": self.seq, "cluster": self.cluster(), "view": self.view(), "plan": self.plan(),
                "series": self.series_json(), "rounds": list(self.rounds)[-1000:],
                "tasks": [{k: t.get(k) for k in TASK_ITEM} for t in list(self.tasks)[-500:] if t["mode"] == "tasks"],
                "in_flight": self.in_flight(), "timeline": self.timeline()}

    def timeline(self, limit: int = 1000) -> list[dict[str, Any]]:
        return [_plain(e) for e in self.sched.timeline[-limit:]]

    def slowest_link(self) -> tuple[int, int, float] | None:
        """The slowest measured link among those the current job has used: what bounds its rounds."""
        g = self.sched.view.g
        used = [(a, b) for (a, b), n in self.sched.link_bytes.items()
                if n > self._job_bytes0.get((a, b), 0) and g.has_edge(a, b) and g.edges[a, b]["measured"]]
        if not used:
            return None
        a, b = min(used, key=lambda ab: g.edges[ab]["rate"])
        return a, b, g.edges[a, b]["rate"]

    def metrics_text(self) -> bytes:
        return generate_latest(self.registry)


class _Collector:
    """Prometheus metrics computed on scrape from the live state (no second copy of any number)."""

    def __init__(self, live: LiveState) -> None:
        self.live = live

    def collect(self) -> Iterator[Metric]:
        live, s = self.live, self.live.sched
        c = CounterMetricFamily("wansync_link_bytes", "Bytes sent over a directed overlay link (agents' counters)",
                                labels=["src", "dst"])
        for (a, b), n in sorted(s.link_bytes.items()):
            c.add_metric([str(a), str(b)], n)
        yield c
        g = GaugeMetricFamily("wansync_link_rate_mbps", "The scheduler's view of a link's rate (EWMA of passive "
                              "samples; nominal until measured)", labels=["src", "dst"])
        m = GaugeMetricFamily("wansync_link_measured", "1 once the view has a passive sample of the link",
                              labels=["src", "dst"])
        for a, b, e in sorted(s.view.g.edges(data=True)):
            g.add_metric([str(a), str(b)], e["rate"])
            m.add_metric([str(a), str(b)], 1.0 if e["measured"] else 0.0)
        yield g
        yield m
        yield _histogram("wansync_round_seconds", "Synchronization round time per scheme (BSP jobs; warm-up "
                         "rounds excluded)", live.hist, live.hist_sum)
        f = CounterMetricFamily("wansync_rounds_failed", "Rounds that did not end with the exact, agreed result",
                                labels=["scheme"])
        for scheme in sorted(live.hist.keys() | live.failed.keys()):
            f.add_metric([scheme], live.failed.get(scheme, 0))
        yield f
        yield _histogram("wansync_task_seconds", "Task time per scheme in tasks jobs (partial reduces the "
                         "scheduler forms; aborted tasks excluded)", live.task_hist, live.task_hist_sum)
        tc = CounterMetricFamily("wansync_tasks", "Recorded tasks of tasks jobs per scheme and outcome (exact, "
                                 "failed, aborted)", labels=["scheme", "outcome"])
        for (scheme, outcome), n in sorted(live.task_outcomes.items()):
            tc.add_metric([scheme, outcome], n)
        yield tc
        yield GaugeMetricFamily("wansync_tasks_in_flight", "Tasks of the current job started and not recorded yet",
                                value=live.in_flight_count())
        yield GaugeMetricFamily("wansync_plan_version", "Newest published plan version", value=s.version)
        yield GaugeMetricFamily("wansync_nodes_expected", "Nodes the cluster was started with", value=s.expected)
        up = GaugeMetricFamily("wansync_node_up", f"1 if the node is registered, connected and reported within "
                               f"{NODE_STALE_S:g} s", labels=["node"])
        for n in range(s.expected):
            up.add_metric([str(n)], 1.0 if live.node_up(n) else 0.0)
        yield up
        gv = GaugeMetricFamily("wansync_guard_valid", "Fidelity guard per finished scheme of this run: 1 judged "
                               "valid, 0 invalid (CPU-bound) or unjudged (too short to judge)", labels=["scheme"])
        gs = GaugeMetricFamily("wansync_guard_verdict", "Fidelity guard per finished scheme: 1 for its verdict "
                               "(valid, invalid or unjudged), 0 for the others", labels=["scheme", "verdict"])
        gw = GaugeMetricFamily("wansync_guard_worst_ratio", "Worst achieved/configured rate ratio of a judged "
                               "(backlogged) link or node cap, per scheme", labels=["scheme"])
        for scheme, v in sorted(live.guard.items()):
            gv.add_metric([scheme], 1.0 if v["verdict"] == "valid" else 0.0)
            for verdict in GUARD_VERDICTS:
                gs.add_metric([scheme, verdict], 1.0 if v["verdict"] == verdict else 0.0)
            if v.get("worst_ratio") is not None:
                gw.add_metric([scheme], float(v["worst_ratio"]))
        yield gv
        yield gs
        yield gw
        if live.guard:
            yield GaugeMetricFamily("wansync_run_guard_valid", "1 while every scheme so far in this run was judged "
                                    "valid (0 if any was invalid or unjudged)",
                                    value=1.0 if live.run_verdict() == "valid" else 0.0)


def _histogram(name: str, doc: str, hist: dict[str, list[int]], sums: dict[str, float]) -> HistogramMetricFamily:
    """Per-scheme counts per ROUND_BUCKETS bucket (not cumulative, last +Inf) as a Prometheus histogram."""
    h = HistogramMetricFamily(name, doc, labels=["scheme"])
    for scheme, counts in sorted(hist.items()):
        cum, buckets = 0, []
        for le, n in zip((*ROUND_BUCKETS, float("inf")), counts, strict=True):
            cum += n
            buckets.append(("+Inf" if le == float("inf") else repr(le), cum))
        h.add_metric([scheme], buckets, sums[scheme])
    return h


def _plain(entry: dict[str, Any]) -> dict[str, Any]:
    """A timeline entry as JSON-safe data (a fault injector may pass tuples or other odd values)."""
    out: dict[str, Any] = {}
    for k, v in entry.items():
        out[k] = v if isinstance(v, str | int | float | bool | type(None) | list | dict) else str(v)
        if isinstance(v, tuple):
            out[k] = list(v)
    return out
