"""Choices several planners share: the hub (best aggregate measured rate), a root by tree delay."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from core.plan import Job, Plan, make_layout, tree_group

from ..view import NetworkView


def best_hub(view: NetworkView, participants: Sequence[int]) -> int:
    """The node whose links carry the most measured rate in and out (ties: lowest id)."""
    def score(n: int) -> float:
        g = view.g
        return sum(d["rate"] for *_, d in g.out_edges(n, data=True)) + \
            sum(d["rate"] for *_, d in g.in_edges(n, data=True))
    return max(sorted(participants), key=score)


def hub_for(view: NetworkView, job: Job) -> int:
    """The `hub` option (it may be outside the members: it then aggregates without contributing),
    else the best-connected member."""
    hub = job.options.get("hub")
    if hub is not None:
        if hub not in job.participants and hub not in view.g:
            raise ValueError(f"--hub {hub} is neither a member nor a node the view knows")
        return int(hub)
    return best_hub(view, job.participants)


def single_tree_plan(scheme: str, job: Job, root: int, parent: Mapping[int, int | None]) -> Plan:
    """Every chunk on one tree (star, mst, ktree): aggregate up, broadcast down the same edges. Tree
    nodes outside the members aggregate and replicate without contributing."""
    layout = make_layout(job.params, job.chunk_params)
    group = tree_group(range(len(layout)), root, parent)
    return Plan(0, scheme, tuple(job.participants), {n: 1.0 for n in job.participants}, layout, (group,))
