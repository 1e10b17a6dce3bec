"""The fidelity guard: was a live run limited by its emulated links, or by this machine's CPU?

Every live figure is meaningful only if the run was limited by the links it emulates. The agents
keep books (emulation/link.py: links and node caps) and event-loop figures (agents' STATS); this
module judges them: *valid* only if something was judged and all of it held, *invalid* if anything
failed, *unjudged* if nothing could be judged (too short, or the kernel shapes the rates). Never
valid by default. docs/fidelity-guard.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from core.cpucost import CPU_BUDGET, CPU_S_PER_CHUNK_HOP, CPU_S_PER_GB
from scheduler.tasks import JobState

# The forecast at a run's start (cpu_forecast): what the agents cost (core/cpucost.py: per chunk crossing
# a link, per GB), from the plan each scheme makes on the configured rates, whose rounds are the fastest
# it can run: a run whose busiest scheme needs more than CPU_BUDGET of the machine's cores queues its
# agents behind each other (lag, run-queue waits, books) and is judged invalid. CREW at --scale 0.05:
# crew:16 mst 1.6 cores, netstorm 4.4 (it warns); internet2, the default: 0.2-0.4 (it does not)

# The fidelity guard (docs/fidelity-guard.md). Books: a link or node cap backlogged >= GUARD_MIN_BACKLOG_S
# must have carried >= GUARD_MIN_RATIO of what its rate allowed
GUARD_MIN_RATIO = 0.97
GUARD_MIN_BACKLOG_S = 0.5  # shorter backlogs are dominated by the bucket's initial burst
# The loop, per agent, whatever the books say. Senders schedule LOOKAHEAD_S (20 ms) of wire time ahead:
# a loop that wakes them 20 ms late has certainly let the wire run dry while data waited (the books
# judge anything shorter directly). On an idle 2-core machine with 9 agents the busy p99 is 1.5-3 ms;
# CPU-starved ones show 12-42 ms. So: lag p99 while the node had traffic <= 20 ms
GUARD_MAX_LAG_S = 0.020
# judged over >= 200 busy ticks (2 s): over fewer a p99 is one or two samples, i.e. the worst hiccup
GUARD_MIN_LAG_TICKS = 200
# A loop thread busy >= 90 % of the job has no slack left to wake timers on time (it queues behind itself)
GUARD_MAX_LOOP_CPU = 0.90
# The loop thread waited for a CPU (runnable, not running: the machine's run queue) longer than it ran:
# whatever it did, it did late on average; and >= 2 ms per wake-up on average is a tenth of the lag limit
GUARD_MAX_RUNQ_PER_CPU = 1.0
GUARD_MAX_RUNQ_PER_RUN_S = 0.002
VERDICTS = ("valid", "invalid", "unjudged")


@dataclass
class GuardVerdict:
    """The fidelity guard's word on one job: `valid` only if something was judged and all of it held."""

    verdict: str  # "valid", "invalid" or "unjudged"
    worst_ratio: float | None  # worst achieved/configured ratio among judged links and caps
    bad: list[str]  # judged links and caps below GUARD_MIN_RATIO, e.g. "0->1 93.5%", "uplink of 3 90.0%"
    reasons: list[str]  # why invalid or unjudged (empty when valid)
    judged: int  # links and caps judged (backlogged long enough)

    @property
    def valid(self) -> bool | None:
        """True if valid, False if invalid, None if unjudged (never valid by default)."""
        return {"valid": True, "invalid": False}.get(self.verdict)


def guard_verdict(stats: Mapping[Any, Mapping[str, Any]], participants: Iterable[Any] | None = None
                  ) -> GuardVerdict:
    """Judge a job from its agents' STATS: the books of every link and node cap backlogged at least
    GUARD_MIN_BACKLOG_S (>= GUARD_MIN_RATIO of their rate), and every agent's event loop (lag while
    busy, CPU share of its thread, time waiting for a CPU). Any failure: invalid. Otherwise valid
    only if at least one book was judged and every participant reported; else unjudged."""
    bad: list[str] = []
    starved: list[str] = []
    worst: float | None = None
    judged = 0
    longest = 0.0
    unshaped: list[str] = []

    def book(label: str, entry: Mapping[str, Any]) -> None:
        nonlocal worst, judged, longest
        if "achieved_ratio" not in entry:
            return
        backlog = float(entry.get("backlog_s", 0.0))
        longest = max(longest, backlog)
        if backlog < GUARD_MIN_BACKLOG_S:
            return
        judged += 1
        ratio = float(entry["achieved_ratio"])
        worst = ratio if worst is None else min(worst, ratio)
        if ratio < GUARD_MIN_RATIO:
            bad.append(f"{label} {ratio:.1%}")

    for node, st in sorted(stats.items(), key=lambda kv: str(kv[0])):
        if st.get("app_rate_shaping") is False:
            unshaped.append(str(node))
        for dst, link in st.get("links", {}).items():
            book(f"{node}->{dst}", link)
        for name, cap in st.get("caps", {}).items():
            book(f"{name} of {node}", cap)
        lag, ticks = st.get("loop_lag_busy_p99_s"), int(st.get("loop_busy_ticks", 0))
        if lag is not None and ticks >= GUARD_MIN_LAG_TICKS and lag > GUARD_MAX_LAG_S:
            starved.append(f"node {node}: event-loop lag p99 {lag * 1e3:.1f} ms while busy "
                           f"(> {GUARD_MAX_LAG_S * 1e3:g} ms)")
        if float(st.get("wall_s", 0.0)) >= GUARD_MIN_BACKLOG_S:
            cpu = float(st.get("loop_cpu_share", 0.0))
            if cpu >= GUARD_MAX_LOOP_CPU:
                starved.append(f"node {node}: event loop busy {cpu:.0%} of the job (>= {GUARD_MAX_LOOP_CPU:.0%})")
            wait = float(st.get("runq_wait_share", 0.0))
            per_run = float(st.get("runq_wait_per_run_s", 0.0))
            if cpu > 0 and wait / cpu > GUARD_MAX_RUNQ_PER_CPU and per_run > GUARD_MAX_RUNQ_PER_RUN_S:
                starved.append(f"node {node}: event loop waited for a CPU {wait / cpu:.1f}x as long as it ran, "
                               f"{per_run * 1e3:.1f} ms per wake-up (machine overloaded)")
    reasons: list[str] = []
    if bad:
        reasons.append(f"{len(bad)} backlogged link(s)/cap(s) below {GUARD_MIN_RATIO:.0%} of their rate: "
                       + ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else ""))
    reasons += starved
    if reasons:
        return GuardVerdict("invalid", worst, bad, reasons, judged)
    missing = sorted(set(participants or ()) - set(stats), key=str)
    if missing:
        reasons.append(f"no STATS from node(s) {', '.join(map(str, missing))}")
    if not stats:
        reasons.append("no agent reported STATS")
    elif judged == 0:
        if unshaped and len(unshaped) == len(stats):
            reasons.append("rates shaped by the kernel (tc backend): no application-level books to judge")
        else:
            reasons.append(f"too short to judge: no link or cap was backlogged >= {GUARD_MIN_BACKLOG_S:g} s "
                           f"(longest {longest:.2f} s); run more rounds or a larger --scale")
    if reasons:
        return GuardVerdict("unjudged", worst, bad, reasons, judged)
    return GuardVerdict("valid", worst, bad, [], judged)


def job_guard(js: JobState) -> GuardVerdict:
    return guard_verdict(js.stats, js.plan.participants)


def live_guard(jobs: Iterable[JobState], *, reason: str | None = None) -> dict[str, Any]:
    """The benchmarks' figures for the live runs they used: `live_guard_valid` is true only if every
    one was judged valid (none at all: false); counts per verdict, and the first reasons otherwise."""
    verdicts = {v: 0 for v in VERDICTS}
    reasons: list[str] = []
    for js in jobs:
        g = job_guard(js)
        verdicts[g.verdict] += 1
        reasons += [f"{js.scheme}: {r}" for r in g.reasons[:1]]
    ok = sum(verdicts.values()) > 0 and verdicts["valid"] == sum(verdicts.values()) and reason is None
    out: dict[str, Any] = {"live_guard_valid": ok, "live_guard_verdicts": verdicts}
    if not ok:
        out["live_guard_reason"] = reason or ("; ".join(reasons[:3]) if reasons else "no live run to judge")
    return out


def fidelity_cell(s: Mapping[str, Any]) -> str:
    """The table's fidelity column: ok, INVALID (why) or UNJUDGED (why), never ok by default."""
    worst = "" if s.get("guard_worst_ratio") is None else f"worst {s['guard_worst_ratio']:.1%}, "
    if s["guard_verdict"] == "valid":
        return f"ok ({worst}{s['guard_judged']} judged)"
    why = "; ".join(s["guard_reasons"][:2])
    if s["guard_verdict"] == "invalid":
        return f"[bold red]INVALID: {why}[/]"
    return f"[yellow]UNJUDGED: {why}[/]"


def cpu_forecast(topo: Any, trace: Any, schemes: Iterable[str], params: int, chunk_params: int,
                 cores: float | None = None, cpus: int | None = None) -> tuple[str, float, float] | None:
    """Before a run on the application backend: would its agents need more CPU than this machine has
    to spare? Plans every scheme on the configured rates for agents that share one machine of `cpus`
    CPUs (default this one's: packing and BLINK fit their chunks to it) and simulates a round (as
    `wansync simulate` does); a chunk crossing a link costs CPU_S_PER_CHUNK_HOP, a GB CPU_S_PER_GB.
    Returns (busiest scheme, cores it needs, `cores` (default `cpus`) x CPU_BUDGET) if that exceeds the
    budget, else None (also when no prediction can be made: the run goes on and the guard judges it)."""
    import os

    from core.plan import Job
    from emulation.simnet import sim_network
    from scheduler import planners
    from sim import MEASURED, simulate

    from .predict import oracle_view

    cpus = cpus or os.cpu_count() or 1
    cores = cores or cpus
    view = oracle_view(topo)
    view.share_machine(range(topo.nodes), cpus)  # every agent on this machine, as the run places them
    net = sim_network(topo, trace)
    worst: tuple[str, float] | None = None
    for scheme in schemes:
        try:
            spec = planners.resolve(scheme)
            plan = spec.plan(view, Job(params, chunk_params, tuple(range(topo.nodes)), dict(spec.options)), {})
            pred = simulate(plan.with_version(1), net, costs=MEASURED)
        except Exception:  # an unknown or multicast scheme, a stalled trace: nothing to forecast
            continue
        round_s = pred.round_s
        if not round_s or round_s <= 0:
            continue
        moved = sum(pred.link_bytes.values())
        # the plan's own mean chunk: a packing cuts many far smaller than chunk_params
        chunk_bytes = 4 * plan.params / len(plan.layout) if plan.layout else 4 * chunk_params
        need = (moved / chunk_bytes * CPU_S_PER_CHUNK_HOP + moved / 1e9 * CPU_S_PER_GB) / round_s
        if worst is None or need > worst[1]:
            worst = (scheme, need)
    if worst is None or worst[1] <= CPU_BUDGET * cores:
        return None
    return worst[0], worst[1], CPU_BUDGET * cores


def cpu_warning(forecast: tuple[str, float, float], *, root: bool) -> str:
    """The line a run prints at its start when its forecast exceeds the machine."""
    scheme, need, budget = forecast
    fix = ("--backend tc (the kernel shapes the links; you are root)" if root else
           "--backend tc as root (the kernel shapes the links)")
    return (f"warning: at these rates {scheme} would keep the agents busy for ~{need:.1f} CPU cores, more than "
            f"the ~{budget:.1f} this machine can give them: the run will likely be CPU-bound and the fidelity "
            f"guard will judge it INVALID. Use {fix}, fewer nodes, bigger chunks, or lower rates (crew:N:x=F, "
            "hetero:x=F, geo:NAME:x=F)")
