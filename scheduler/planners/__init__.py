"""One planner per scheme: `plan(view, job, memory) -> Plan`. Later schemes register here too.

A scheme is a `PlannerSpec`: the planner, the options it always gets, and what it can do between
versions, declared rather than called by name: `adaptive` (re-planned within a job when the view
moved, or when its own `stale(memory)` says so) and `refresh_aux` (new auxiliary tables pushed
without a new version). `memory` is what a planner keeps between the plans of one job (NetStorm's
roots, chosen once measurements arrived): explicit, owned by the job, empty at its start and after a
change of members. The scheduler adds what the job's rounds took (`memory["measured"]`: plan scheme,
seconds) and, for a formed task's plan, the job's memory (`memory["job"]`).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.plan import Job, Plan

from ..view import NetworkView
from . import (
    a2a,
    auto,
    blink,
    crew,
    dbtree,
    gring,
    ktree,
    mst,
    multicast,
    netstorm,
    packing,
    plink,
    ps,
    ring,
    shardps,
    star,
    toa,
)
from .cpufit import fitted

Memory = dict[str, Any]
Planner = Callable[[NetworkView, Job, Memory], Plan]


@dataclass(frozen=True)
class PlannerSpec:
    name: str
    planner: Planner
    options: Mapping[str, Any] = field(default_factory=dict)  # fixed by the scheme (a variant's ablation)
    adaptive: bool = False  # re-planned as the view changes within a job
    refresh_aux: Callable[[NetworkView, Job, Plan], Plan] | None = None  # auxiliary tables between versions
    one_source: bool = False  # plans one member's multicast to receivers, not a reduce of the members
    offload: bool = False  # adaptive re-plans solve in a worker thread on a copy of the view (slow solvers)
    candidate: bool = False  # `auto` may choose it (among the specs of its kind: one-source or reduce)
    multicast_variant: str | None = None  # the spec that stands for this one under a multicasting progress model
    stale: Callable[[Memory], bool] | None = None  # an adaptive planner's own re-plan trigger, from its memory

    def opening(self, job: Job) -> Job:
        """The job a whole-cluster plan is made for: a one-source scheme's is the lowest member's
        multicast to every other (what a job shows before its first task); a reduce's is the job."""
        if not self.one_source or len(job.participants) == 1:
            return job
        src, *rest = job.participants
        return Job(job.params, job.chunk_params, (src,), {**job.options, "receivers": rest})

    def for_progress(self, multicasts: bool) -> PlannerSpec:
        """The spec a job under a progress model that multicasts (or reduces) runs: itself, or its variant
        for that kind (`auto` chooses among one-source schemes there)."""
        if multicasts and self.multicast_variant is not None:
            return resolve(self.multicast_variant)
        return self

    def plan(self, view: NetworkView, job: Job, memory: Memory | None = None) -> Plan:
        return self.planner(view, job, {} if memory is None else memory)


def _stateless(fn: Callable[[NetworkView, Job], Plan]) -> Planner:
    return lambda view, job, memory: fn(view, job)


SCHEMES: dict[str, PlannerSpec] = {}


def register(spec: PlannerSpec) -> PlannerSpec:
    SCHEMES[spec.name] = spec
    return spec


register(PlannerSpec("star", _stateless(star.plan), candidate=True))  # star and ktree keep the hub they started with
register(PlannerSpec("ring", _stateless(ring.plan), candidate=True))
register(PlannerSpec("mst", _stateless(mst.plan), adaptive=True, candidate=True))
register(PlannerSpec("ktree", _stateless(ktree.plan), candidate=True))
# one source to a receiver set (SelMcast): l7 = a unicast per receiver, l3 = replicated where routes part
register(PlannerSpec("mcast", _stateless(multicast.plan), {"mode": "l7"}, one_source=True, candidate=True))
register(PlannerSpec("mcast-l3", _stateless(multicast.plan), {"mode": "l3"}, one_source=True, candidate=True))
# NetStorm's ablation ladder: lite = multi-root FAPT planned once; std = + awareness (re-planned as
# measurements change); pro (plain "netstorm") = + auxiliary paths, refreshed between versions
register(PlannerSpec("netstorm-lite", netstorm.plan, {"awareness": False, "aux": False}))
register(PlannerSpec("netstorm-std", netstorm.plan, {"awareness": True, "aux": False}, adaptive=True))
register(PlannerSpec("netstorm", netstorm.plan, {"awareness": True, "aux": True}, adaptive=True,
                     refresh_aux=netstorm.refresh_aux, candidate=True))
# topology-adaptive tree packing (seed 001): the LP re-solved from the view as it moves, off the loop; its
# chunks, and BLINK's, cut no finer than the agents' machines handle (cpufit.py)
_packing = fitted(packing.plan, "t_lp_s", chooses=True)  # it compares fitted variants (packing.py: VARIANTS)
register(PlannerSpec("packing", _packing, adaptive=True, offload=True, candidate=True))
register(PlannerSpec("packing-no-overlap", _packing, {"no_overlap": True}, adaptive=True, offload=True))
# tree packing's baselines (digest 001 §5): sharded PS, BLINK-like (packed from one root), and for GPU
# clusters NCCL's double binary tree and a PLink-like hierarchy
register(PlannerSpec("shardps", _stateless(shardps.plan), candidate=True))
register(PlannerSpec("blink", fitted(_stateless(blink.plan), "s_over_lambda_s"), adaptive=True, offload=True,
                     candidate=True))
register(PlannerSpec("dbtree", _stateless(dbtree.plan), candidate=True))
register(PlannerSpec("plink", _stateless(plink.plan), adaptive=True))

# CREW (seed 004): every active worker aggregates a block sized by LP (2) (split na) or evenly (ed);
# per-link flow scheduling fl (flow-level FCFS, the default), fs, tl, c1, c2 (crew.py); OPR is CREW with
# the members as the only aggregators; the baselines behind the same ready queue: a2a, ps, gring, toa
register(PlannerSpec("crew", _stateless(crew.plan), {"split": "na", "sched": "fl"}, candidate=True))
for _split in ("na", "ed"):
    for _sched in ("fl", "fs", "tl", "c1", "c2", "none"):
        register(PlannerSpec(f"crew-{_split}-{_sched}", _stateless(crew.plan), {"split": _split, "sched": _sched}))
        register(PlannerSpec(f"opr-{_split}-{_sched}", _stateless(crew.plan),
                             {"split": _split, "sched": _sched, "aggregate": "members"}))
register(PlannerSpec("opr", _stateless(crew.plan), {"split": "na", "sched": "fl", "aggregate": "members"}))
register(PlannerSpec("a2a", _stateless(a2a.plan)))
register(PlannerSpec("ps", _stateless(ps.plan)))
register(PlannerSpec("gring", _stateless(gring.plan)))
register(PlannerSpec("toa", _stateless(toa.plan)))

# auto (issue 36): the candidates above planned on the view and simulated, the fastest run; re-planned as
# the view moves like any adaptive scheme, off the loop; under a multicasting progress model, among the
# one-source candidates
def candidates(one_source: bool) -> list[PlannerSpec]:
    """The schemes `auto` chooses among for a job of this kind."""
    return [s for s in SCHEMES.values() if s.candidate and s.one_source == one_source]


register(PlannerSpec("auto", auto.make(lambda: candidates(False)), adaptive=True, offload=True,
                     refresh_aux=auto.refresh_aux(lambda: SCHEMES), multicast_variant="auto-mcast", stale=auto.stale))
register(PlannerSpec("auto-mcast", auto.make(lambda: candidates(True)), one_source=True, adaptive=True,
                     offload=True, stale=auto.stale))

# the plain planners by scheme name (tests and tools that plan once)
PLANNERS: dict[str, Callable[..., Plan]] = {"star": star.plan, "ring": ring.plan, "mst": mst.plan,
                                            "ktree": ktree.plan, "netstorm": netstorm.plan}


def resolve(scheme: str) -> PlannerSpec:
    """The scheme's spec; ValueError naming the known ones."""
    try:
        return SCHEMES[scheme]
    except KeyError:
        raise ValueError(f"unknown scheme {scheme!r}; known: {', '.join(sorted(SCHEMES))}") from None


# --- the planner options that name nodes: what the scheduler checks and keeps to the living ------------
def named_nodes(options: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The nodes a task's planner options name, by option (aggregators outside the members, a hub):
    each must be a node of the cluster."""
    out = {"aggregators": list(options.get("aggregators", ()))}
    if options.get("hub") is not None:
        out["hub"] = [options["hub"]]
    return out


def for_living(options: Mapping[str, Any], alive: Container[int], members: Container[int] | None = None
               ) -> dict[str, Any]:
    """Planner options for the nodes still alive: a lost hub is dropped (the planner picks the best one
    alive); given a task's `members`, its aggregators narrow to the living outside them."""
    out = dict(options)
    if out.get("hub") is not None and out["hub"] not in alive:
        del out["hub"]
    if members is not None and "aggregators" in out:
        out["aggregators"] = [n for n in out["aggregators"] if n in alive and n not in members]
    return out
