"""Emulator capacity and an honest view: how many agents this machine emulates faithfully, what an
agent costs, how close the scheduler's estimates come to the configured rates, and how the
simulator fares on dense meshes.

Per backend (`app`: token buckets in the agents; `tc`: the kernel, root only) it runs real clusters
(`wansync run`'s launcher) on CREW's full mesh at `--scale 0.05`: mst, netstorm and ring, then a
pattern that loads every directed link at once (`all-links`: every node the root of 1/N of the
chunks, every other node sending straight to it, the root sending the sums straight back). The
all-links pattern runs on `crew:N:x=F`, F chosen so that its total rate is what the busiest scheme
moves (every link of a 16-node mesh at CREW's own rates is 3.75 GB/s: no one machine emulates that
in Python). A case is valid if the fidelity guard judged every job valid and every round exact.

Also measured: CPU seconds per GB moved (agents, during jobs), wake-ups per second per agent (the
agents' event-loop threads' voluntary context switches), agent RSS, the launcher's CPU share; the
view (estimate vs configured rate of every link a plan used, links the view marks known, and the
share of used links it knows) at --scale 0.005, 0.01 and 0.05; the simulator's prediction vs the
live round time on dense meshes (crew:8 and crew:12, every node a root, small chunks).
`--quick` (the check, under 5 min): one pass, N = 16 (app) and 24 (tc). The full run searches the
largest valid N per backend. Prints tables; the last stdout line is one JSON object.

    python scripts/bench/capacity.py [--quick] [--backends app,tc]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core.plan import ChunkGroup, Job, Plan, make_layout  # noqa: E402
from emulation.link import EARLY_S  # noqa: E402
from emulation.tc import unavailable  # noqa: E402
from emulation.topology import build  # noqa: E402
from scheduler import planners  # noqa: E402
from scheduler.view import NetworkView  # noqa: E402
from wansync.cluster import run  # noqa: E402
from wansync.guard import job_guard  # noqa: E402
from wansync.options import Options  # noqa: E402
from wansync.runspec import resolve  # noqa: E402

SCHEMES = ["mst", "netstorm", "ring"]
ALL_LINKS = "all-links"
SCALE = 0.05
VIEW_SCALES = (0.005, 0.01, 0.05)
N_QUICK = {"app": 16, "tc": 24}


# --- the all-links pattern -----------------------------------------------------------------------------
def all_links_plan(view: NetworkView, job: Job, memory: dict[str, Any]) -> Plan:
    """Every node is the root of every N-th chunk; every other node sends its share straight to the
    root and gets the sum straight back: on a full mesh every directed link carries traffic at once."""
    nodes = sorted(job.participants)
    n = len(nodes)
    layout = make_layout(job.params, job.chunk_params)
    groups = []
    for j, root in enumerate(nodes):
        mine = tuple(c for c in range(len(layout)) if c % n == j)
        if mine:
            parent = {m: (None if m == root else root) for m in nodes}
            groups.append(ChunkGroup(mine, root, parent, {root: tuple(m for m in nodes if m != root)}))
    return Plan(0, ALL_LINKS, tuple(nodes), {m: 1.0 for m in nodes}, layout, tuple(groups))


planners.register(planners.PlannerSpec(ALL_LINKS, all_links_plan))
CHAIN = "chain"


def chain_plan(view: NetworkView, job: Job, memory: dict[str, Any]) -> Plan:
    """The data-plane microbenchmark's plan: one tree that is a chain, summed up it and broadcast back
    down, so a chunk crosses 2 (N - 1) hops one after the other."""
    nodes = sorted(job.participants)
    layout = make_layout(job.params, job.chunk_params)
    parent: dict[int, int | None] = {nodes[i]: nodes[i + 1] for i in range(len(nodes) - 1)}
    parent[nodes[-1]] = None
    children = {nodes[i + 1]: (nodes[i],) for i in range(len(nodes) - 1)}
    group = ChunkGroup(tuple(range(len(layout))), nodes[-1], parent, children)
    return Plan(0, CHAIN, tuple(nodes), {m: 1.0 for m in nodes}, layout, (group,))


planners.register(planners.PlannerSpec(CHAIN, chain_plan))


# --- what the agents cost: their processes, sampled from /proc -----------------------------------------
def _agent_pids() -> dict[int, int]:
    """pid -> node of every `wansync agent` process descended from this one."""
    me = os.getpid()
    parent: dict[int, int] = {}
    cmd: dict[int, list[str]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{d}/stat") as fh:
                parent[int(d)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                cmd[int(d)] = fh.read().decode(errors="replace").split("\0")
    out = {}
    for pid, argv in cmd.items():
        if "wansync.cli" in argv and "agent" in argv and "--node" in argv:
            p = pid
            while p in parent and p != me and p > 1:
                p = parent[p]
            if p == me:
                with contextlib.suppress(ValueError, IndexError):
                    out[pid] = int(argv[argv.index("--node") + 1])
    return out


def _proc(pid: int) -> tuple[float, int, float] | None:
    """(CPU s of the process, voluntary context switches of its main thread, RSS MiB)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
        cpu = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        vol, rss = 0, 0.0
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("voluntary_ctxt_switches:"):
                    vol = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024
        return cpu, vol, rss
    except (OSError, ValueError, IndexError):
        return None


class Sampler:
    """Samples the agents and this launcher every `every` s in a thread, so a job's figures can be cut
    from its wall-clock span afterwards."""

    def __init__(self, every: float = 0.25) -> None:
        self.every = every
        self.samples: list[tuple[float, float, dict[int, tuple[int, float, int, float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._pids: dict[int, int] = {}
        self._scan_t = 0.0

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            now = time.time()
            if now - self._scan_t > 2.0 or not self._pids:
                self._pids, self._scan_t = _agent_pids(), now
            agents = {}
            for pid, node in self._pids.items():
                got = _proc(pid)
                if got is not None:
                    agents[pid] = (node, *got)
            t = os.times()
            self.samples.append((now, t.user + t.system, agents))

    def span(self, t0: float, t1: float) -> dict[str, float]:
        """Figures between wall times t0 and t1: wake-ups/s per agent, agent CPU share, RSS, launcher CPU."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return {}
        (a_t, a_cpu, a), (b_t, b_cpu, b) = inside[0], inside[-1]
        dt = max(1e-9, b_t - a_t)
        common = [p for p in a if p in b]
        wake = [(b[p][2] - a[p][2]) / dt for p in common]
        cpu = [(b[p][1] - a[p][1]) / dt for p in common]
        rss = [max(s[2][p][3] for s in inside if p in s[2]) for p in common]
        return {"wakeups_per_s_agent": statistics.mean(wake) if wake else 0.0,
                "wakeups_per_s_agent_max": max(wake, default=0.0),
                "agent_cpu_share_mean": statistics.mean(cpu) if cpu else 0.0,
                "agent_rss_mib_max": max(rss, default=0.0), "agent_rss_mib_mean": statistics.mean(rss) if rss else 0.0,
                "launcher_cpu_share": (b_cpu - a_cpu) / dt}


# --- one cluster -------------------------------------------------------------------------------------------
@dataclass
class JobResult:
    case: str
    scheme: str
    nodes: int
    backend: str
    topology: str
    scale: float
    verdict: str
    reasons: list[str]
    exact: bool
    rounds_wrong: int
    round_s: float
    prediction_s: float | None
    gb: float
    cpu_s: float
    proc: dict[str, float]
    view_err_pct: float | None = None  # worst |estimate - configured| / configured over known used links
    view_coverage: float | None = None  # share of used links the view knows
    view_links: int = 0
    view_case: bool = False
    starts: list[dict[int, float]] = field(default_factory=list)  # per measured round: node -> start - first start
    round_times: list[float] = field(default_factory=list)
    chunk_bytes: int = 0  # the largest chunk of the job's first plan
    span_s: float = 0.0  # wall time from the job's first round to its last

    @property
    def launcher_cpu_s(self) -> float:
        """CPU seconds of the launcher process (scheduler included) while the job ran."""
        return self.proc.get("launcher_cpu_share", 0.0) * self.span_s

    @property
    def valid(self) -> bool:
        return self.verdict == "valid" and self.exact

    @property
    def sim_err_pct(self) -> float | None:
        if not self.prediction_s:
            return None
        return 100.0 * abs(self.round_s - self.prediction_s) / self.prediction_s


@dataclass
class Case:
    label: str
    topology: str
    backend: str
    schemes: list[str]
    scale: float = SCALE
    rounds: int = 3
    warmup: int = 1
    chunk: int | None = None  # parameters per chunk (None: the scaled default)
    options: dict[str, Any] = field(default_factory=dict)
    model: str = "resnet50"
    view: bool = False  # its jobs count for the view's figures
    nodes: int | None = None  # for hetero and uniform meshes
    run_options: dict[str, Any] = field(default_factory=dict)  # further options (e.g. seed)


def run_case(case: Case, *, views: bool = True, keep_rounds: bool = False) -> list[JobResult]:
    topo = build(case.topology, case.nodes)
    fd, name = tempfile.mkstemp(prefix="wansync-capacity-", suffix=".jsonl")
    os.close(fd)
    out = Path(name)
    cfg = resolve(Options.make(topology=case.topology, nodes=case.nodes, schemes=case.schemes,
                               workload__model=case.model, scale=case.scale, rounds=case.rounds, warmup=case.warmup,
                               out=str(out), backend=case.backend,
                               chunk=None if case.chunk is None else str(case.chunk),
                               no_http=True, **{f"schemes__{k}": v for k, v in case.options.items()},
                               **case.run_options))
    quiet = Console(file=io.StringIO(), width=150)
    try:
        with Sampler() as sampler:
            jobs = asyncio.run(run(cfg, console=quiet, show_table=False))
        recs = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    finally:
        out.unlink(missing_ok=True)
    seen = replay_view(recs, topo) if views else {}
    results = []
    for js in jobs:
        g = job_guard(js)
        measured = [r for r in js.records if not r.warmup] or js.records
        wrong = sum(1 for r in js.records if not (r.ok and r.digests_agree and r.versions_agree))
        preds = [r.prediction_s for r in measured if r.prediction_s]
        stats = js.stats.values()
        gb = sum(link.get("bytes", 0) for st in stats for link in st.get("links", {}).values()) / 1e9
        t0 = min(r.t_start for r in js.records)
        t1 = max(r.t_end for r in js.records)
        err, known, nlinks = seen.get(js.job, (None, 0, 0))
        cov = known / nlinks if nlinks else None
        results.append(JobResult(case.label, js.scheme, topo.nodes, case.backend, case.topology, case.scale, g.verdict,
                                 g.reasons, wrong == 0, wrong, statistics.median(r.round_s for r in measured),
                                 statistics.median(preds) if preds else None, gb,
                                 sum(st.get("cpu_s", 0.0) for st in stats), sampler.span(t0, t1), err, cov, nlinks,
                                 view_case=case.view, starts=round_starts(measured),
                                 chunk_bytes=4 * max((n for _, n in js.plan.layout), default=0), span_s=t1 - t0))
        if keep_rounds:
            results[-1].round_times = [r.round_s for r in measured]
    return results


def round_starts(records: list[Any]) -> list[dict[int, float]]:
    """Per round, when each agent started it (its TASK_DONE's t_start) after the first one did."""
    out = []
    for rec in records:  # the record's spans: node -> [t_start, t_end] of its TASK_DONE
        starts = {int(n): float(span[0]) for n, span in rec.spans.items()}
        if starts:
            first = min(starts.values())
            out.append({n: t - first for n, t in starts.items()})
    return out


def plan_links(plan: Plan, topo_links: Iterable[tuple[int, int]], route: Any) -> set[tuple[int, int]]:
    """Directed links a plan's transfers cross (tree edges along their routes, auxiliary routes too)."""
    links: set[tuple[int, int]] = set()
    known = set(topo_links)

    def path(a: int, b: int) -> None:
        p = (a, b) if (a, b) in known else tuple(route(a, b))
        links.update(zip(p, p[1:], strict=False))

    for g in plan.groups:
        for child, parent in g.parent.items():
            if parent is not None:
                path(child, parent)
        for node, kids in g.children.items():
            for kid in kids:
                path(node, kid)
        for routes in g.aux.values():
            for r in routes:
                links.update(zip(r, r[1:], strict=False))
    return links


def replay_view(recs: list[dict[str, Any]], topo: Any) -> dict[int, tuple[float | None, int, int]]:
    """The scheduler's view rebuilt from the passive samples it received (results file), judged at the end
    of every job: (worst error % over the known links any of its plans used, how many links of the
    plan in force at its end the view knows, how many that plan uses)."""
    view = NetworkView(topo.links)
    route = topo.routes().route
    plans: list[Plan] = []  # published since the previous job ended (jobs run one after the other)
    out: dict[int, tuple[float | None, int, int]] = {}
    for r in recs:
        if r["type"] == "link_sample":
            view.observe(r["src"], r["dst"], r["bytes"], r["seconds"], now=r.get("t"))
        elif r["type"] == "plan":
            plans.append(Plan.from_wire(r["plan"]))
        elif r["type"] == "job":
            used: set[tuple[int, int]] = set()
            versions, plans = plans, []
            for p in versions:
                used |= plan_links(p, topo.links, route)
            known = [k for k in used if view.known(*k)]
            errs = [100.0 * abs(view.rate(*k) - topo.links[k].rate_mbps) / topo.links[k].rate_mbps for k in known]
            # coverage: of the links the plan in force at the job's end uses (an adaptive scheme's
            # earlier plans were made while the view still learned: that is what they explored)
            last = plan_links(versions[-1], topo.links, route) if versions else set()
            out[r["job"]] = (max(errs) if errs else None, sum(1 for k in last if view.known(*k)), len(last))
    return out


# --- the report ----------------------------------------------------------------------------------------------
def all_links_factor(topology: str, budget_mbps: float) -> float:
    """x so that every link of the mesh at once carries `budget_mbps` in total."""
    total = sum(s.rate_mbps for s in build(topology).links.values())
    return budget_mbps / total


def print_jobs(results: list[JobResult]) -> None:
    print(f"{'case':<22} {'scheme':<9} {'backend':<7} {'N':>3} {'round s':>8} {'sim s':>7} {'GB':>6} {'CPU s/GB':>8} "
          f"{'wake/s':>7} {'RSS MiB':>7} {'view err%':>9} {'cover':>5}  verdict")
    for r in results:
        p = r.proc
        cpu_gb = r.cpu_s / r.gb if r.gb else float("nan")
        sim = "-" if r.prediction_s is None else f"{r.prediction_s:.3f}"
        err = "-" if r.view_err_pct is None else f"{r.view_err_pct:.1f}"
        cov = "-" if r.view_coverage is None else f"{r.view_coverage:.2f}"
        why = "" if r.valid else ": " + ("; ".join(r.reasons[:2]) if r.reasons else "a round was not exact")
        print(f"{r.case:<22} {r.scheme:<9} {r.backend:<7} {r.nodes:>3} {r.round_s:>8.3f} {sim:>7} {r.gb:>6.2f} "
              f"{cpu_gb:>8.1f} {p.get('wakeups_per_s_agent', 0):>7.0f} {p.get('agent_rss_mib_max', 0):>7.0f} "
              f"{err:>9} {cov:>5}  {r.verdict}{why}"[:400])


def view_cases() -> list[Case]:
    """The view at the two smaller scales (0.05 is the capacity case's, with mst and netstorm): a 6-node
    hetero mesh under ring, whose links stay busy (a tree's inner links are fed at their children's
    pace and never show their own rate: the view calls them unknown, honestly)."""
    return [Case(f"view x{scale:g}", "hetero", "app", ["ring"], scale=scale, rounds=8, view=True, nodes=6)
            for scale in (0.005, 0.01)]


def capacity_cases(backend: str, n: int, all_links_x: float, schemes: list[str]) -> list[Case]:
    return [Case(f"crew:{n}", f"crew:{n}", backend, list(schemes), view=True),
            Case(f"crew:{n}:x={all_links_x:.3g}", f"crew:{n}:x={all_links_x:.4g}", backend, [ALL_LINKS])]


# --- the data plane's own costs (sim/costs.py) --------------------------------------------------------------
CHAIN_MBPS = 1000.0  # links this fast carry a 4 KB chunk in 33 us: what is left is the data plane's
CHAIN_PARAMS = 1024
STREAM_MBPS = 100.0


def fast_mesh(n: int, mbps: float, path: Path) -> str:
    path.write_text(f"name = \"fast{n}\"\nnodes = {n}\n"
                    f"matrix = {[[0 if a == b else mbps for b in range(n)] for a in range(n)]}\n"
                    "[defaults]\ndelay_ms = 0\n")
    return str(path)


async def _stream_lateness(seconds: float = 2.0) -> tuple[float, float, int]:
    """Two overlay nodes, one shaped link at STREAM_MBPS kept busy with 200 KB chunks: how late the
    wire clock wakes after the earliest piece it was due for (mean, max) and how often it woke."""
    import numpy as np

    from emulation.link import MBIT, LinkShaper, LinkSpec
    from overlay.delayline import wire_clock
    from overlay.peers import Overlay

    class Sink:
        def __init__(self) -> None:
            self.buf = memoryview(np.zeros(50_000, dtype=np.float32)).cast("B")

        def chunk_buffer(self, h: dict[str, Any]) -> memoryview:
            return self.buf[h["off"]:h["off"] + h["nbytes"]]

        def chunk_segment(self, h: dict[str, Any], payload: memoryview) -> None:
            pass

    shaper = LinkShaper(LinkSpec(STREAM_MBPS, 0.0))
    a = Overlay(0, "dp", Sink(), neighbors=[1], pacers={1: shaper})
    b = Overlay(1, "dp", Sink(), neighbors=[0])
    pb = await b.listen()
    await a.listen()
    a.connect({1: ("127.0.0.1", pb)})
    await a.wait_connected(10)
    clock = wire_clock()
    payload = Sink().buf
    w0, l0 = clock.wakeups, clock.late_s
    clock.late_max_s = 0.0
    t_end = time.monotonic() + seconds
    chunk = 0
    pending: set[asyncio.Future] = set()
    while time.monotonic() < t_end:
        while len(pending) < 2 + int(STREAM_MBPS * MBIT * 0.05 / len(payload)):
            tr = a.send_chunk({"t": "CHUNK", "job": 1, "task": 0, "attempt": 0, "version": 0, "chunk": chunk,
                               "kind": "bcast", "origin": 0, "contributors": bytes([1]), "t_send": 0.0},
                              payload, (0, 1))
            assert tr.done is not None
            pending.add(tr.done)
            chunk += 1
        _, pending = await asyncio.wait(pending, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
    wakeups = clock.wakeups - w0
    late = (clock.late_s - l0) / max(1, wakeups)
    await a.close()
    await b.close()
    return late, clock.late_max_s, wakeups


def dataplane() -> dict[str, float]:
    """The constants of sim/costs.py, measured: a chunk's handling per hop from chains of 3 and 8 real
    agents (one 4 KB chunk summed up the chain and broadcast back: 2 (N - 1) hops in a row, on links too
    fast to matter), the barrier's start skew per agent and the setup before the first chunk leaves,
    and the wire clock's mean lateness on a busy link (which every chunk's last piece pays)."""
    out: dict[str, float] = {}
    per: dict[int, tuple[float, float]] = {}
    skews = []
    with tempfile.TemporaryDirectory() as d:
        for n in (3, 8):
            path = fast_mesh(n, CHAIN_MBPS, Path(d) / f"fast{n}.toml")
            [r] = run_case(Case(f"chain:{n}", path, "app", [CHAIN], scale=1.0, rounds=30, warmup=3,
                                chunk=CHAIN_PARAMS, model=str(CHAIN_PARAMS)), views=False, keep_rounds=True)
            # from the first agent's start to the end, less the time before the chain's first node started
            spans = [rs - st.get(0, 0.0) for rs, st in zip(r.round_times, r.starts, strict=False)]
            per[n] = (statistics.median(spans), 2 * (n - 1))
            if n == 8:
                skews = [max(st.values()) / (len(st) - 1) for st in r.starts if len(st) > 1]
    (d3, h3), (d8, h8) = per[3], per[8]
    wire = CHAIN_PARAMS * 4 / (CHAIN_MBPS * 1e6 / 8)
    hop = (d8 - d3) / (h8 - h3) - wire
    late, late_max, wakeups = asyncio.run(_stream_lateness())
    late = max(0.0, late - EARLY_S)  # the clock wakes for a piece EARLY_S before it is due
    out["hop_handling_s"] = hop
    out["wire_clock_late_mean_s"] = late
    out["wire_clock_late_max_s"] = late_max
    out["hop_s"] = hop + late
    out["setup_s"] = max(0.0, d3 - h3 * (hop + wire))
    out["start_skew_s"] = statistics.median(skews) if skews else 0.0
    out["ack_s"] = out["hop_s"]  # an ack crosses the same handling: the receiver's read, the sender's line
    out["stream_wakeups"] = wakeups
    return out


def dense_cases() -> list[Case]:
    """CREW meshes with every node a root (netstorm, all-links) and small chunks, where what a round
    pays outside link transfer weighs most. Every directed link carries chunks at once, so the agents
    handle (links x rate / chunk) chunks per second: rates x0.05 keep that within what this machine
    handles without starving (a starved run is invalid, and the simulator does not model it).
    netstorm-lite: NetStorm's multi-root trees without auxiliary paths, whose dispatch follows every
    ack's timing (their rounds vary by +-30 % from one auxiliary table to the next, live and simulated)."""
    return [Case("dense crew:8", "crew:8:x=0.05", "app", ["netstorm-lite", ALL_LINKS], scale=0.02, rounds=3,
                 chunk=10_000),
            Case("dense crew:12", "crew:12:x=0.05", "app", ["netstorm-lite", ALL_LINKS], scale=0.02, rounds=3,
                 chunk=20_000)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one pass at N = 16 (app) and 24 (tc); under 5 min")
    ap.add_argument("--backends", default="app,tc", help="comma-separated (default app,tc; tc needs root)")
    ap.add_argument("--all-links-mbps", type=float, default=800.0,
                    help="total rate of the all-links pattern, Mbit/s over every link (default 800)")
    ap.add_argument("--parts", default="capacity,all-links,view,dense",
                    help="what to run (default capacity,all-links,view,dense; dataplane: sim/costs.py's constants)")
    ap.add_argument("--nodes", type=int, default=None, help="N instead of 16 (app) / 24 (tc)")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    schemes = [s for s in args.schemes.split(",") if s]
    backends = [b for b in args.backends.split(",") if b]
    t_start = time.time()
    results: list[JobResult] = []
    tc_why = unavailable() if "tc" in backends else None
    if tc_why:
        print(f"tc backend unavailable: {tc_why}", file=sys.stderr)
    largest: dict[str, int | None] = {}
    for backend in backends:
        if backend == "tc" and tc_why:
            continue
        n = args.nodes or N_QUICK[backend]
        x = all_links_factor(f"crew:{n}", args.all_links_mbps)
        cases = capacity_cases(backend, n, x, schemes)
        cases = [c for c in cases if (ALL_LINKS in c.schemes and "all-links" in parts)
                 or (ALL_LINKS not in c.schemes and "capacity" in parts)]
        for case in cases:
            results += run_case(case)
            print(f"{case.label} ({backend}) done at {time.time() - t_start:.0f} s", file=sys.stderr)
    # the view at three scales and the simulator on dense meshes (app backend)
    dense = dense_cases()
    for case in [*(view_cases() if "view" in parts else []), *(dense if "dense" in parts else [])]:
        results += run_case(case)
        print(f"{case.label} done at {time.time() - t_start:.0f} s", file=sys.stderr)
    print_jobs(results)
    if "dataplane" in parts:
        costs = dataplane()
        print("\ndata plane (sim/costs.py): " + ", ".join(f"{k} {v * 1e3:.3f} ms" if k.endswith("_s") else f"{k} {v}"
                                                         for k, v in costs.items()))

    def cap(backend: str) -> list[JobResult]:
        return [r for r in results if r.backend == backend and r.case.startswith("crew:")]

    app, tc = cap("app"), cap("tc")
    view_app = [r for r in results if r.backend == "app" and r.view_case and r.view_links]
    view_tc = [r for r in results if r.backend == "tc" and r.view_case and r.view_links]
    errs_tc = [r.view_err_pct for r in view_tc if r.view_err_pct is not None]
    errs = [r.view_err_pct for r in view_app if r.view_err_pct is not None]
    # share of the links the plans in force used that the view knew, over every view job together
    known = sum(round(r.view_coverage * r.view_links) for r in view_app if r.view_coverage is not None)
    used = sum(r.view_links for r in view_app if r.view_coverage is not None)
    dense = [r for r in results if r.case.startswith("dense")]
    dense_err = [r.sim_err_pct for r in dense if r.valid and r.sim_err_pct is not None]
    gb = sum(r.gb for r in app)
    print(json.dumps({
        "valid_16_app": bool(app) and all(r.valid for r in app),
        "valid_24_tc": bool(tc) and all(r.valid for r in tc),
        "cpu_s_per_gb_app": round(sum(r.cpu_s for r in app) / gb, 2) if gb else None,
        "cpu_s_per_gb_tc": round(sum(r.cpu_s for r in tc) / sum(r.gb for r in tc), 2) if tc else None,
        "wakeups_per_s_agent_app": round(max((r.proc.get("wakeups_per_s_agent", 0) for r in app), default=0), 1),
        "agent_rss_mib_app": round(max((r.proc.get("agent_rss_mib_max", 0) for r in app), default=0), 1),
        "view_err_max_pct": round(max(errs), 2) if errs else None,
        "view_coverage": round(known / used, 3) if used else None,
        "view_err_by_scale_pct": {f"{sc:g}": round(max((r.view_err_pct for r in view_app if r.scale == sc
                                                        and r.view_err_pct is not None), default=float("nan")), 2)
                                  for sc in VIEW_SCALES},
        "view_err_max_pct_tc": round(max(errs_tc), 2) if errs_tc else None,
        "view_coverage_tc": round(min((r.view_coverage for r in view_tc if r.view_coverage is not None),
                                      default=float("nan")), 3) if view_tc else None,
        "dense_sim_vs_live_max_err_pct": round(max(dense_err), 2) if dense_err else None,
        "dense_runs_valid": f"{len(dense_err)}/{len(dense)}",  # starved runs are the guard's, not the simulator's
        "rounds_wrong": sum(r.rounds_wrong for r in results),
        "all_links_x": {b: round(all_links_factor(f"crew:{N_QUICK[b]}", args.all_links_mbps), 4) for b in backends},
        "largest_valid_n": largest,
        "load_avg": os.getloadavg()[0],
        "seconds": round(time.time() - t_start, 1),
    }))


if __name__ == "__main__":
    main()
