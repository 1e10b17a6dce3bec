"""All-to-all direct (A2A, a CREW baseline): every member sends its whole tensor straight to every
other receiver, and each sums on its own. One all-to-all group (core.plan.direct_group): no
tree, no aggregator, p (p - 1) full copies on the p (p - 1) direct links; its time is about the
model over the slowest of those links."""

from __future__ import annotations

from core.plan import Job, Plan, direct_group, make_layout

from ..view import NetworkView


def plan(view: NetworkView, job: Job) -> Plan:
    members = tuple(sorted(job.participants))
    receivers = tuple(sorted(int(n) for n in job.options.get("receivers", members)))
    view.require_connected((*members, *receivers))
    layout = make_layout(job.params, job.chunk_params)
    group = direct_group(range(len(layout)), members, receivers)
    return Plan(0, "a2a", members, {m: 1.0 for m in members}, layout, (group,),
                receivers=None if receivers == members else receivers)
