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

from emulation.tc import unavailable  # noqa: E402
from emulation.topology import build  # noqa: E402
from scheduler import planners  # noqa: E402
from scheduler.plan import ChunkGroup, Job, Plan, make_layout  # noqa: E402
from scheduler.view import NetworkView  # noqa: E402
from wansync.cluster import RunConfig, run  # noqa: E402
from wansync.guard import job_guard  # noqa: E402

SCHEMES = ["mst", "netstorm", "ring"]
ALL_LINKS = "all-links"
SCALE = 0.05
VIEW_SCALES = (0.005, 0.01, 0.05)
N_QUICK = {"app": 16, "tc": 24}
DENSE_CHUNK = 10_000  # parameters (40 KB): a fifth of --scale 0.05's default chunk


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


def run_case(case: Case) -> list[JobResult]:
    topo = build(case.topology)
    fd, name = tempfile.mkstemp(prefix="wansync-capacity-", suffix=".jsonl")
    os.close(fd)
    out = Path(name)
    cfg = RunConfig(topology=case.topology, topo=topo.scaled(case.scale), schemes=case.schemes, model="resnet50",
                    scale=case.scale, rounds=case.rounds, warmup=case.warmup, out=out, backend=case.backend,
                    chunk_override=case.chunk, options=dict(case.options))
    quiet = Console(file=io.StringIO(), width=150)
    try:
        with Sampler() as sampler:
            jobs = asyncio.run(run(cfg, console=quiet, show_table=False))
        recs = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    finally:
        out.unlink(missing_ok=True)
    views = replay_view(recs, topo)
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
        err, cov, nlinks = views.get(js.job, (None, None, 0))
        results.append(JobResult(case.label, js.scheme, topo.nodes, case.backend, case.topology, case.scale, g.verdict,
                                 g.reasons, wrong == 0, wrong, statistics.median(r.round_s for r in measured),
                                 statistics.median(preds) if preds else None, gb,
                                 sum(st.get("cpu_s", 0.0) for st in stats), sampler.span(t0, t1), err, cov, nlinks))
    return results


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


def replay_view(recs: list[dict[str, Any]], topo: Any) -> dict[int, tuple[float | None, float | None, int]]:
    """The scheduler's view rebuilt from the passive samples it received (results file), judged at the end
    of every job on the links its plans used: (worst error % over known links, coverage, used links)."""
    view = NetworkView(topo.links)
    route = topo.routes().route
    plans: dict[str, list[Plan]] = {}
    out: dict[int, tuple[float | None, float | None, int]] = {}
    for r in recs:
        if r["type"] == "link_sample":
            view.observe(r["src"], r["dst"], r["bytes"], r["seconds"], now=r.get("t"))
        elif r["type"] == "plan":
            plans.setdefault(r["scheme"], []).append(Plan.from_wire(r["plan"]))
        elif r["type"] == "job":
            used: set[tuple[int, int]] = set()
            for p in plans.pop(r["scheme"], []):
                used |= plan_links(p, topo.links, route)
            known = [k for k in used if view.known(*k)]
            errs = [100.0 * abs(view.rate(*k) - topo.links[k].rate_mbps) / topo.links[k].rate_mbps for k in known]
            out[r["job"]] = (max(errs) if errs else None, len(known) / len(used) if used else None, len(used))
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


def capacity_cases(backend: str, n: int, all_links_x: float, schemes: list[str]) -> list[Case]:
    return [Case(f"crew:{n}", f"crew:{n}", backend, list(schemes)),
            Case(f"crew:{n}:x={all_links_x:.3g}", f"crew:{n}:x={all_links_x:.4g}", backend, [ALL_LINKS])]


def dense_cases() -> list[Case]:
    """CREW meshes with every node a root (netstorm, all-links) and small chunks: per-chunk latency,
    barrier skew and store-and-forward gaps weigh most there. Rates x0.1 keep them link-bound here."""
    return [Case("dense crew:8", "crew:8:x=0.1", "app", ["netstorm", ALL_LINKS, "ring"], scale=0.05, rounds=3,
                 chunk=DENSE_CHUNK),
            Case("dense crew:12", "crew:12:x=0.1", "app", ["netstorm", ALL_LINKS], scale=0.05, rounds=3,
                 chunk=DENSE_CHUNK)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one pass at N = 16 (app) and 24 (tc); under 5 min")
    ap.add_argument("--backends", default="app,tc", help="comma-separated (default app,tc; tc needs root)")
    ap.add_argument("--all-links-mbps", type=float, default=800.0,
                    help="total rate of the all-links pattern, Mbit/s over every link (default 800)")
    ap.add_argument("--parts", default="capacity,all-links,dense",
                    help="what to run (default capacity,all-links,dense)")
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
    for case in dense if "dense" in parts else []:
        results += run_case(case)
        print(f"{case.label} done at {time.time() - t_start:.0f} s", file=sys.stderr)
    print_jobs(results)

    def cap(backend: str) -> list[JobResult]:
        return [r for r in results if r.backend == backend and r.case.startswith("crew:")]

    app, tc = cap("app"), cap("tc")
    view_app = [r for r in results if r.backend == "app" and r.view_links]
    errs = [r.view_err_pct for r in view_app if r.view_err_pct is not None]
    covs = [r.view_coverage for r in view_app if r.view_coverage is not None]
    dense_err = [r.sim_err_pct for r in results if r.case.startswith("dense") and r.sim_err_pct is not None]
    gb = sum(r.gb for r in app)
    print(json.dumps({
        "valid_16_app": bool(app) and all(r.valid for r in app),
        "valid_24_tc": bool(tc) and all(r.valid for r in tc),
        "cpu_s_per_gb_app": round(sum(r.cpu_s for r in app) / gb, 2) if gb else None,
        "cpu_s_per_gb_tc": round(sum(r.cpu_s for r in tc) / sum(r.gb for r in tc), 2) if tc else None,
        "wakeups_per_s_agent_app": round(max((r.proc.get("wakeups_per_s_agent", 0) for r in app), default=0), 1),
        "agent_rss_mib_app": round(max((r.proc.get("agent_rss_mib_max", 0) for r in app), default=0), 1),
        "view_err_max_pct": round(max(errs), 2) if errs else None,
        "view_coverage": round(min(covs), 3) if covs else None,
        "dense_sim_vs_live_max_err_pct": round(max(dense_err), 2) if dense_err else None,
        "rounds_wrong": sum(r.rounds_wrong for r in results),
        "all_links_x": {b: round(all_links_factor(f"crew:{N_QUICK[b]}", args.all_links_mbps), 4) for b in backends},
        "largest_valid_n": largest,
        "load_avg": os.getloadavg()[0],
        "seconds": round(time.time() - t_start, 1),
    }))


if __name__ == "__main__":
    main()
