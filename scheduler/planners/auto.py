"""`auto`: plan every candidate scheme on the view, predict each plan's round with the simulator, run
the fastest — and switch only when another is predicted faster by more than the simulator's error.

A planner like the others (view in, plan out; what it keeps between the plans of one job lives in
`memory`), so the scheduler re-plans it as the view moves and never knows it chooses. The candidates
are the registry's (PlannerSpec.candidate), given by the caller; each is planned with its own memory
(NetStorm's roots stay chosen while NetStorm stays in force) and simulated on the view's rates with
the data plane's measured costs (sim.MEASURED), as `wansync simulate` does on a configured WAN.

Every decision is appended to `memory["events"]` (the scheduler puts it on the timeline) and to the
plan's `info`: each candidate's predicted round or why it was skipped, the choice and why.
A formed task (partial reduce, multicast) is planned with the job's current choice, given as
`memory["job"]`: deciding per task would cost a simulation of every scheme per task.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from core.plan import Job, Plan
from overlay.routing import Routes, adjacency
from sim import MEASURED, SimNetwork, SimulationOverBudget, SimulationStalled, WanCosts, simulate

from ..view import NetworkView
from .onview import MIN_SIM_S, link_loads, port_loads, view_network

# a switch must be predicted at least this much faster than the scheme in force: the simulator's
# error against live rounds is ~1-4 % on the fidelity checks and up to ~10 % on fluctuating WANs
MARGIN = 0.1
PAYBACK_ROUNDS = 3  # a switch pays for itself within this many rounds, or it is not made
# predictions this close are one (the simulator's median error is ~1 %): among them, the plan over the
# fewest links, which leaves the simulator least to get wrong (flows sharing ports, per-chunk costs): under
# binding ports shardps over 30 links tied ring over 6 at 1.367 s, and ran 1.60-s rounds to ring's 1.37
TIE = 0.005
# seconds, of CPU and of wall time alike, for planning and simulating the candidates of one decision; the
# rest are skipped. Wall time too: the solver is niced behind the agents, and a decision that waits for a
# core still delays the switch (2 CPU-s alone let decisions take 2.5-3.3 s on a loaded 2-core machine)
BUDGET_S = 1.5
OPTIONS = ("auto_margin", "auto_budget_s")  # auto's own job options, not passed to the candidates


class NoCandidate(RuntimeError):
    """Every candidate failed or was skipped: nothing to run."""


@dataclass(frozen=True)
class Candidate:
    """One scheme's part in a decision: its predicted round time, or why it has none."""

    scheme: str
    round_s: float | None = None
    plan_s: float = 0.0  # CPU seconds of the solve
    sim_s: float = 0.0  # CPU seconds of the simulation
    skipped: str | None = None
    ratio: float = 1.0  # its live rounds over its predictions, as measured while it ran (1: never run)
    expected_s: float | None = None  # round_s x ratio: what decides
    links: int = 0  # directed links its plan moves bytes over (a tie goes to the fewest: decide)
    bound_s: float | None = None  # no round of its plan is shorter (lower_bound_s x ratio), where known
    runnable: bool = False  # it has no prediction, but its plan stands (the scheme in force, out of time)

    @property
    def key(self) -> float | None:
        return self.expected_s if self.expected_s is not None else self.round_s


@dataclass(frozen=True)
class Decision:
    chosen: str
    previous: str | None
    why: str
    candidates: tuple[Candidate, ...]
    decide_s: float  # CPU seconds of the whole decision
    wall_s: float  # ... and its wall time (a solver waits for a core the agents hold)

    @property
    def switched(self) -> bool:
        return self.previous is not None and self.chosen != self.previous

    def wire(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "previous": self.previous, "why": self.why, "switched": self.switched,
                "decide_s": round(self.decide_s, 4), "wall_s": round(self.wall_s, 4),
                "candidates": [asdict(c) for c in self.candidates]}


def router(view: NetworkView) -> Callable[[int, int], tuple[int, ...]]:
    """The agents' min-hop routes over the view's links (a tree edge between non-neighbours is relayed)."""
    return Routes(adjacency(view.links())).route


def lower_bound_s(plan: Plan, view: NetworkView, route: Callable[[int, int], tuple[int, ...]]) -> float | None:
    """No round of `plan` can be shorter than its busiest link's bytes at the link's rate (the view's
    capacity), nor than the bytes through a node's declared port (a big switch's: every link out of the
    node shares its uplink, every link into it its downlink) at the port's rate — unless it has
    auxiliary routes, which may move bytes off its tree links: no bound, None."""
    found = bound_link(plan, view, route)
    return None if found is None else found[0]


Bottleneck = tuple[int, int] | tuple[int, str]  # a link (src, dst), or a node's port (node, "up" | "down")


def bound_link(plan: Plan, view: NetworkView, route: Callable[[int, int], tuple[int, ...]],
               loads: Mapping[tuple[int, int], float] | None = None) -> tuple[float, Bottleneck | None] | None:
    """lower_bound_s and the link or port that sets it (None for a plan that moves no bytes). The ports
    count: under binding ports tree packing's bound on its links alone was a fifth of its round, so
    every decision simulated it (a whole budget's share) to find it slowest. `loads`: the plan's
    link_loads without auxiliary routes, where the caller has them."""
    if any(g.aux for g in plan.groups):
        return None
    loads = link_loads(plan, route, aux=False) if loads is None else loads
    times: list[tuple[float, Bottleneck | None]] = [
        (b * 8 / (max(view.capacity(*ln), 1e-9) * 1e6), ln) for ln, b in loads.items()]
    for (node, kind), nbytes in port_loads(loads).items():
        cap = view.cap(node, kind)
        if cap:
            times.append((nbytes * 8 / (cap * 1e6), (node, kind)))
    return max(times, default=(0.0, None), key=lambda x: x[0])


def _estimate(view: NetworkView, what: Bottleneck | None) -> str:
    """How the view knows the link or port that bounds a plan (a decision's record says what kept a
    scheme out)."""
    if what is None:
        return ""
    a, b = what
    if isinstance(b, str):
        return f"; set by node {a}'s {b}link port at {view.cap(a, b):.1f} Mbit/s (declared)"
    if not view.g.has_edge(a, b):
        return ""
    h = view.how(a, b)
    return f"; set by {a}->{b} at {view.capacity(a, b):.1f} Mbit/s ({h['how']}, {h['samples']} samples)"


def evaluate(view: NetworkView, job: Job, specs: Sequence[Any], memory: dict[str, dict[str, Any]], *,
             budget_s: float = BUDGET_S, costs: WanCosts = MEASURED, in_force: str | None = None,
             order: Sequence[str] = (), prune: bool = True, net: SimNetwork | None = None,
             ratio: Mapping[str, float] | None = None) -> tuple[list[Candidate], dict[str, Plan]]:
    """Each candidate planned (`in_force`, the scheme running now, first; then in `order`), then
    simulated (`in_force` first, the others cheapest first: fewest trees) until `budget_s` of this thread's
    CPU or of wall time is spent (a switch waits for the decision, whether it computes or waits for a core),
    though never before one candidate has a prediction, and never skipping `in_force`; a candidate's
    simulation gets what is left of the budget (`sim_budget_s`; `in_force`'s half the budget: where its
    simulation cannot finish, the other half still predicts the others). A candidate whose
    lower bound is no better than the fastest expectation so far cannot win and is not simulated
    (branch and bound: the simulation of a many-tree plan is what a decision costs). A planner that
    raises, or a plan the simulator cannot finish (or not within its budget), is skipped with
    the reason. `memory` holds each
    candidate's planner memory.
    prune=False simulates every candidate (a ranking, `wansync advise`); `net` is what to simulate on
    (default the view's rates; advise passes a configured WAN's, delays included). `ratio`: per scheme,
    its live rounds over its predictions; a candidate is expected to take round_s x ratio (1 if unknown),
    and the bound is scaled alike."""
    ratio = ratio or {}
    rank = {s: i for i, s in enumerate(order)}
    specs = sorted(specs, key=lambda sp: (sp.name != in_force, rank.get(sp.name, len(rank))))
    start, wall0 = time.thread_time(), time.perf_counter()
    out: dict[str, Candidate] = {}
    plans: dict[str, Plan] = {}
    bound: dict[str, float | None] = {}
    by: dict[str, Bottleneck | None] = {}  # the link or port that sets each bound
    route = router(view)

    def over_budget(name: str, have_one: bool) -> bool:
        """Past the budget, skip all but the scheme in force — once there is something to run."""
        cpu, wall = time.thread_time() - start, time.perf_counter() - wall0
        if max(cpu, wall) <= budget_s or name == in_force or not have_one:
            return False
        out[name] = Candidate(name, skipped=f"planning budget of {budget_s:g} s spent ({cpu:.2f} CPU-s, {wall:.2f} s)")
        return True

    for spec in specs:
        if over_budget(spec.name, bool(plans)):
            continue
        t0 = time.thread_time()
        try:
            plan = spec.plan(view, Job(job.params, job.chunk_params, job.participants,
                                       {**job.options, **spec.options}), memory.setdefault(spec.name, {}))
            plan.validate(view.links())
            loads = link_loads(plan, route, aux=False)
            found = bound_link(plan, view, route, loads)
            bound[spec.name], by[spec.name] = found if found is not None else (None, None)
        except Exception as exc:  # any planner's failure is this candidate's, not the job's
            out[spec.name] = Candidate(spec.name, plan_s=time.thread_time() - t0,
                                       skipped=f"planner failed: {type(exc).__name__}: {exc}")
            continue
        took = time.thread_time() - t0
        if took > budget_s and spec.name != in_force and plans:  # a solve this slow holds every decision up
            out[spec.name] = Candidate(spec.name, plan_s=took,
                                       skipped=f"its solve took {took:.2f} CPU-s, over the budget of {budget_s:g}")
            continue
        plans[spec.name] = plan
        out[spec.name] = Candidate(spec.name, plan_s=took, links=len(loads))
    net = view_network(view) if net is None else net
    best = math.inf
    # cheapest to simulate first (a plan's groups are its trees: a many-tree plan's simulation is what
    # a decision costs), so that the budget goes to the most candidates and the best so far can prune
    for name in sorted(plans, key=lambda n: (n != in_force, len(plans[n].groups), bound[n] or 0.0)):
        c = out[name]
        lb = bound[name]
        r = ratio.get(name, 1.0)
        if prune and name != in_force and lb is not None and lb * r >= best:
            out[name] = replace(c, ratio=r, skipped=f"cannot win: its lower bound {lb:.3f} s (x{r:.2f}) >= "
                                                    f"{best:.3f} s expected{_estimate(view, by[name])}")
            del plans[name]
            continue
        if over_budget(name, best < math.inf):
            del plans[name]
            continue
        t1 = time.thread_time()
        # a simulation gets what is left of the budget (the scheme in force, simulated first, half of it): a
        # plan whose simulation alone would take longer (classed trees under node caps: tens of CPU-s) is
        # skipped rather than holding the decision up. Not all of it for the scheme in force: on the
        # auto bench's flipping trace, tree packing in force when the ports tightened spent the whole budget
        # on a simulation that could not finish, and every other candidate was skipped. And no more CPU
        # than the decision has been getting per wall second, times the wall time left: the simulator
        # stops on CPU time, and one given 0.75 CPU-s ran for seconds in the niced solver behind busy agents
        left = sim_budget_s(budget_s, time.thread_time() - start, time.perf_counter() - wall0, name == in_force)
        try:
            round_s = simulate(plans[name], net, costs=costs, cpu_budget_s=left).round_s
        except SimulationOverBudget as exc:
            out[name] = replace(c, sim_s=time.thread_time() - t1, skipped=f"no prediction in time: simulation {exc}",
                                ratio=r, bound_s=None if lb is None else lb * r, runnable=name == in_force)
            if name != in_force:  # the scheme in force stays runnable: decide keeps it unless another is surely faster
                del plans[name]
            continue
        except (SimulationStalled, ValueError, KeyError, NotImplementedError) as exc:
            out[name] = replace(c, sim_s=time.thread_time() - t1, skipped=f"no prediction: {type(exc).__name__}: {exc}")
            del plans[name]
            continue
        out[name] = replace(c, round_s=round_s, sim_s=time.thread_time() - t1, ratio=r, expected_s=round_s * r)
        best = min(best, round_s * r)
    return [out[s.name] for s in specs], plans


def sim_budget_s(budget_s: float, cpu_s: float, wall_s: float, in_force: bool) -> float:
    """The CPU seconds a candidate's simulation may take, `cpu_s` and `wall_s` of the decision's budget
    spent: what is left of it (the scheme in force, simulated first: half of it), at most the CPU the
    decision got per wall second so far times the wall time left (a niced solver that waits for a core
    would otherwise overrun the wall budget inside one simulation), and at least MIN_SIM_S."""
    share = min(1.0, cpu_s / wall_s) if wall_s > 0 else 1.0
    if in_force:
        return max(MIN_SIM_S, share * budget_s / 2)
    return max(MIN_SIM_S, min(budget_s - cpu_s, share * (budget_s - wall_s)))


def decide(cands: Sequence[Candidate], current: str | None, *, margin: float = MARGIN,
           switch_cost_s: float = 0.0, payback_rounds: int = PAYBACK_ROUNDS) -> tuple[str, str]:
    """The scheme to run and why. Without one in force: the fastest predicted (of those within TIE of
    it, the one in force, else the plan over the fewest links). Otherwise the one in
    force stays unless another is predicted faster by more than `margin` of its round and the gain over
    `payback_rounds` rounds exceeds `switch_cost_s`, or it could not be planned. Where its simulation
    ran out of time (`runnable`) and its plan has a lower bound, it stays unless another is expected
    faster than that bound by the margin: on the random trace, tree packing in force without a
    prediction gave way to mst or BLINK, which the next decision found 49 % slower, and switched back."""
    ok = sorted((c for c in cands if c.key is not None), key=lambda c: (c.key, c.scheme))
    if not ok:
        raise NoCandidate("auto: no scheme could be planned and predicted: "
                          + "; ".join(f"{c.scheme}: {c.skipped}" for c in cands))
    top = ok[0].key
    assert top is not None
    tied = [c for c in ok if c.key is not None and c.key <= top * (1 + TIE)]
    best = next((c for c in tied if c.scheme == current), None) or min(tied, key=lambda c: (c.links, c.key, c.scheme))
    assert best.key is not None
    tie = "" if best is ok[0] else (f"; ties {ok[0].scheme} within {TIE:.1%}, over fewer links "
                                    f"({best.links} against {ok[0].links})")
    if current is None:
        return best.scheme, f"fastest expected ({best.key:.3f} s a round){tie}"
    cur = next((c for c in cands if c.scheme == current), None)
    if (cur is not None and cur.key is None and cur.runnable and cur.bound_s is not None
            and best.key > (1 - margin) * cur.bound_s):
        return current, (f"{current} has no prediction now ({cur.skipped}), and {best.scheme}'s {best.key:.3f} s "
                         f"is not faster than its lower bound {cur.bound_s:.3f} s by the margin")
    if cur is None or cur.key is None:
        return best.scheme, f"{current} has no prediction now ({cur.skipped if cur else 'not a candidate'})"
    if best.scheme == current:
        return current, f"still the fastest expected ({cur.key:.3f} s a round)"
    gain = cur.key - best.key
    if gain <= margin * cur.key:
        return current, f"{best.scheme} expected {gain / cur.key:.1%} faster, within the margin of {margin:.0%}"
    if gain * payback_rounds <= switch_cost_s:
        return current, (f"{best.scheme} expected {gain:.3f} s a round faster: less than the switch's cost "
                         f"({switch_cost_s:.3f} s) over {payback_rounds} rounds")
    return best.scheme, f"expected {gain / cur.key:.0%} faster than {current} ({best.key:.3f} s a round){tie}"


def switch_cost_s(costs: WanCosts = MEASURED) -> float:
    """What moving to another plan costs beyond its rounds: its first round starts the pipeline afresh
    (the setup and one hop that a round on the same plan overlaps). Its solve is no cost of the
    switch: auto solves every candidate at every decision, whichever runs."""
    return costs.setup_s + costs.hop_s


STALE_ROUNDS = 3  # rounds of the scheme in force before its live time may call the decision stale


def _since(state: dict[str, Any], measured: Sequence[tuple[int, str, float]]) -> list[float]:
    """Round seconds of the plan in force measured since the last decision; after a switch, not its first
    round, which pays the switch (switch_cost_s): on the flipping trace mst's first rounds after a switch
    read 3x its prediction, auto learnt that ratio and switched back within 1.3 s."""
    out = [sec for seq, scheme, sec in measured if seq > state["seq"] and scheme == state["plan_scheme"]]
    return out[1:] if state.get("switched") else out


def learn(state: dict[str, Any], measured: Sequence[tuple[int, str, float]], view: NetworkView | None = None) -> None:
    """The scheme in force's live rounds over what the simulator predicted for it: from now on its
    predictions are scaled by that ratio (a plan of many thin trees may run slower than the
    simulator's per-chunk costs say, on a machine short of CPU). Only where that prediction rested on
    measured rates (every link of the plan known to the view at the decision): a prediction on nominal
    guesses says nothing of the simulator. Nor where the view of the plan's links has moved by more than
    the margin since (`view`): those rounds ran on another WAN than the one predicted (a port that
    loosened made them 4x faster: a ratio of 0.25 would have called the scheme 4x faster everywhere).
    Candidates never run keep 1: the simulator's word."""
    recent = _since(state, measured)
    if not (state["scheme"] is not None and state["predicted_s"] and state.get("learnable") and len(recent) >= 2):
        return
    if view is not None and moved(state.get("rates_at", {}), view, state.get("margin", MARGIN)):
        return
    state["ratio"][state["scheme"]] = statistics.median(recent) / state["predicted_s"]


def wan_at(view: NetworkView, links: Iterable[tuple[int, int]]) -> dict[Bottleneck, float]:
    """What a prediction of a plan over `links` rests on: each link's capacity (the simulator's rate)
    and each declared port the links cross. Not what the links deliver: under binding ports that is a
    share, which moves with every probe and phase of a round (learn would never have learnt a thing)."""
    out: dict[Bottleneck, float] = {}
    for a, b in links:
        out[(a, b)] = view.capacity(a, b)
        for port in ((a, "up"), (b, "down")):
            cap = view.cap(*port)
            if cap:
                out[port] = cap
    return out


def moved(at: Mapping[Bottleneck, float], view: NetworkView, margin: float) -> bool:
    """Whether the WAN a decision predicted on (`wan_at`) moved by more than `margin` since."""
    def now(k: Bottleneck) -> float:
        a, b = k
        return (view.cap(a, b) or 0.0) if isinstance(b, str) else view.capacity(a, b)
    return any(abs(now(k) - r) > margin * r for k, r in at.items())


def stale(memory: dict[str, Any]) -> bool:
    """The scheduler's re-plan trigger: the scheme in force has run STALE_ROUNDS rounds since the last
    decision, and their median is off what that decision expected by more than the margin."""
    state = memory.get("auto")
    if not state or not state.get("expect_s"):
        return False
    recent = _since(state, memory.get("measured", ()))
    return (len(recent) >= STALE_ROUNDS
            and abs(statistics.median(recent) / state["expect_s"] - 1) > state.get("margin", MARGIN))


def make(candidates: Callable[[], Sequence[Any]]) -> Callable[[NetworkView, Job, dict[str, Any]], Plan]:
    """The auto planner over the specs `candidates()` returns (evaluated at each call: schemes that
    register later take part)."""

    def plan(view: NetworkView, job: Job, memory: dict[str, Any]) -> Plan:
        specs = list(candidates())
        opts = {k: v for k, v in job.options.items() if k not in OPTIONS}
        inner_job = replace(job, options=opts)
        chosen_before = (memory.get("job") or {}).get("auto", {}).get("scheme")
        if chosen_before is not None:  # a formed task: the job's choice, planned for its members
            spec = next((s for s in specs if s.name == chosen_before), None)
            if spec is not None:
                return spec.plan(view, replace(inner_job, options={**opts, **spec.options}), {})
        state = memory.setdefault("auto", {"scheme": None, "inner": {}, "cost": {}, "ratio": {}, "seq": -1,
                                           "plan_scheme": None, "expect_s": None, "predicted_s": None})
        margin = float(job.options.get("auto_margin", MARGIN))
        learn(state, memory.get("measured", ()), view)
        t, cpu = time.perf_counter(), time.thread_time()
        # the scheme in force first, then the cheapest to decide on (a slow solver cannot starve the rest)
        cheap = sorted((s.name for s in specs), key=lambda n: state["cost"].get(n, 0.0))
        cands, plans = evaluate(view, inner_job, specs, state["inner"],
                                budget_s=float(job.options.get("auto_budget_s", BUDGET_S)),
                                in_force=state["scheme"], order=cheap, ratio=state["ratio"])
        try:
            chosen, why = decide(cands, state["scheme"], margin=margin, switch_cost_s=switch_cost_s())
        except NoCandidate as exc:
            if state["scheme"] not in plans:  # nothing at all to run: the job cannot go on with auto
                raise
            chosen, why = state["scheme"], f"kept: {exc}"
        d = Decision(chosen, state["scheme"], why, tuple(cands), time.thread_time() - cpu, time.perf_counter() - t)
        mine = next(c for c in cands if c.scheme == chosen)
        measured = memory.get("measured") or [(-1, "", 0.0)]
        links = link_loads(plans[chosen], router(view))
        # the rounds that teach a ratio (learn) and call a decision stale count from the switch, or from
        # the last move of the WAN under the plan, not from the last decision: decisions that keep the
        # scheme may come every round (the view moves), and shardps ran 1.6-s rounds against its 1.37
        # predicted for 15 decisions on the flipping trace, each leaving one round to learn from
        if d.switched or state.get("rates_at") is None or moved(state["rates_at"], view, margin):
            state.update(seq=measured[-1][0], switched=d.switched, rates_at=wan_at(view, links))
        state.update(scheme=chosen, plan_scheme=plans[chosen].scheme, predicted_s=mine.round_s, expect_s=mine.key,
                     margin=margin, learnable=view.coverage_of(links) >= 1.0)
        state["cost"].update({c.scheme: c.plan_s + c.sim_s for c in cands if c.plan_s or c.sim_s})
        memory.setdefault("events", []).append({"kind": "auto", **d.wire()})
        out = plans[chosen]
        return replace(out, info={**out.info, "auto": d.wire()})

    return plan


def refresh_aux(specs: Callable[[], Mapping[str, Any]]) -> Callable[[NetworkView, Job, Plan], Plan]:
    """Auxiliary tables between versions, as the chosen scheme refreshes them (NetStorm); others keep theirs."""

    def refresh(view: NetworkView, job: Job, plan: Plan) -> Plan:
        spec = specs().get(plan.scheme)
        if spec is None or spec.refresh_aux is None:
            return plan
        opts = {k: v for k, v in job.options.items() if k not in OPTIONS}
        return spec.refresh_aux(view, replace(job, options={**opts, **spec.options}), plan)

    return refresh
