"""`wansync advise`: which scheme is fastest on a WAN, without agents.

Every scheme `auto` may choose for the progress model (scheduler/planners: PlannerSpec.candidate) is
planned and simulated — the same code `auto` decides with (scheduler/planners/auto.py), here without
pruning, so the whole ranking shows — next to the LP bound T_LP (no reduce can beat the tree-packing
LP's rate). On a configured WAN (`--topology`, its rates and delays) or on a running cluster's
measured view (`--from URL`: its /api/view, rates as the scheduler knows them, no delays).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from core.plan import Job
from emulation.simnet import sim_network
from emulation.topology import Topology
from scheduler import planners
from scheduler.planners import auto
from scheduler.planners.onview import view_network
from scheduler.planners.packing_lp import pack
from scheduler.view import NetworkView
from sim import MEASURED, SimNetwork, WanCosts

from .predict import oracle_view

FETCH_TIMEOUT_S = 10.0
MAX_VIEW_BYTES = 16 * 1024 * 1024  # a cluster's /api/view at 1,000 nodes is a few MB


class AdviseError(ValueError):
    """The WAN to advise on could not be read."""


@dataclass
class Advice:
    source: str  # the topology's name, or the URL whose view was read
    nodes: int
    params: int
    chunk_params: int
    progress: str
    ranked: list[auto.Candidate]  # fastest first; those without a prediction last, with why
    t_lp_s: float | None  # the LP bound on a reduce's round (None for multicasts)
    coverage: float | None = None  # of a cluster's view: the share of links measured

    @property
    def best(self) -> auto.Candidate | None:
        return self.ranked[0] if self.ranked and self.ranked[0].round_s is not None else None

    def as_json(self) -> dict[str, Any]:
        return {"source": self.source, "nodes": self.nodes, "params": self.params, "chunk_params": self.chunk_params,
                "progress": self.progress, "t_lp_s": self.t_lp_s, "coverage": self.coverage,
                "best": None if self.best is None else self.best.scheme, "ranked": [asdict(c) for c in self.ranked]}


def view_from_api(url: str) -> tuple[NetworkView, float]:
    """A running cluster's view (GET URL/api/view): every link at the rate the scheduler holds, and
    the share of links measured."""
    target = url.rstrip("/") + "/api/view"
    try:
        with urllib.request.urlopen(target, timeout=FETCH_TIMEOUT_S) as resp:
            body = resp.read(MAX_VIEW_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise AdviseError(f"cannot read {target}: {exc}") from None
    if len(body) > MAX_VIEW_BYTES:
        raise AdviseError(f"{target}: more than {MAX_VIEW_BYTES} bytes; not a wansync view")
    try:
        data = json.loads(body)
        links = [(int(e["src"]), int(e["dst"]), float(e["rate_mbps"])) for e in data["links"]]
        coverage = float(data.get("coverage", 0.0))
    except (ValueError, KeyError, TypeError) as exc:
        raise AdviseError(f"{target}: not a wansync view ({exc})") from None
    if not links or any(r <= 0 for *_, r in links):
        raise AdviseError(f"{target}: no links, or a link without a positive rate")
    view = NetworkView([(a, b) for a, b, _ in links])
    for a, b, rate in links:
        view.g.edges[a, b]["rate"], view.g.edges[a, b]["measured"] = rate, True
    return view, coverage


def t_lp_s(view: NetworkView, params: int) -> float | None:
    """T_LP: the model's bits over the packing LP's rate on the view's links (relays allowed)."""
    pk = pack({ln: view.rate(*ln) for ln in view.links()}, view.nodes)
    return params * 32 / (pk.sum_chi * 1e6) if pk.sum_chi > 0 else None


def advise(view: NetworkView, params: int, chunk_params: int, *, progress: str = "bsp", multicasts: bool = False,
           options: dict[str, Any] | None = None, costs: WanCosts = MEASURED, net: SimNetwork | None = None,
           source: str = "", coverage: float | None = None, schemes: list[str] | None = None) -> Advice:
    """Every candidate for the progress model (reduces, or one-source multicasts; or the `schemes`
    named) planned on `view` and simulated on `net` (default: the view's rates), ranked."""
    try:
        specs = planners.candidates(multicasts) if not schemes else [planners.resolve(s) for s in schemes]
    except ValueError as exc:
        raise AdviseError(str(exc)) from None
    wrong = [s.name for s in specs if s.one_source != multicasts]
    if wrong:
        raise AdviseError(f"{', '.join(wrong)} do not fit --progress {progress}: "
                          + ("one-source schemes (mcast, mcast-l3) only" if multicasts else "reduces only"))
    members = tuple(view.nodes)
    job = Job(params, chunk_params, members, dict(options or {}))
    if multicasts:  # a multicast scheme is judged by one member's multicast to the others, as a job opens
        job = Job(params, chunk_params, members[:1], {**job.options, "receivers": list(members[1:])})
    cands, _ = auto.evaluate(view, job, specs, {}, budget_s=float("inf"), costs=costs, prune=False,
                             net=view_network(view) if net is None else net)
    ranked = sorted(cands, key=lambda c: (c.round_s is None, c.round_s or 0.0, c.scheme))
    return Advice(source, len(members), params, chunk_params, progress, ranked,
                  None if multicasts else t_lp_s(view, params), coverage)


def advise_topology(topo: Topology, params: int, chunk_params: int, *, cpus: int | None = None,
                    **kw: Any) -> Advice:
    """On a configured WAN: planners see its rates as if perfectly measured; the simulator runs its
    rates and delays. `cpus`: the agents share one machine with that many CPUs (a local cluster)."""
    view = oracle_view(topo)
    if cpus is not None:
        view.share_machine(range(topo.nodes), cpus)
    return advise(view, params, chunk_params, net=sim_network(topo, None), source=topo.name, **kw)
