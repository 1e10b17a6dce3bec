"""Job mode with CREW's non-blocking scatter (§2.6): a worker scatters as soon as it is READY, before it
knows its group.

Every worker holds the default plan (the split for P = every worker: block j of the default
assignment to aggregator j). When READY it starts sending its blocks of it, each to its aggregator,
in increasing chunk order, FCFS with everything else on the links (on the stepped engine, sim/stepped.py).
When the ready queue forms its task, the task's plan comes from `plan_for(members)`, which re-arranges
the default assignment to the group's split (Algorithm 2: the fewest chunks move, the largest indexes
of a block first, the ones least likely sent). What a member already sent of a chunk that stayed
with the same aggregator counts (a prefix of the block, since blocks go in increasing order); the
rest of its scatter, and its multicast, run as in a blocking task; chunks that moved were sent for
nothing. Everything else is the ready queue of sim/job.py. The caller supplies the default
assignment and the planner, so the simulator stays pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from core.compute import ComputeModel
from core.plan import Plan

from .job import JobPrediction, JobTask, PlanFor, Queue, _Job
from .model import FLOAT32, SimNetwork, TaskRun
from .stepped import DT, Stepped

Blocks = Mapping[int, Sequence[int]]  # aggregator -> its chunks, in increasing order


def simulate_nonblocking(policy: Queue, plan_for: PlanFor, default: Blocks, layout: Sequence[tuple[int, int]],
                         compute: ComputeModel, workers: Iterable[int], net: SimNetwork, budget_s: float, *,
                         dt: float = DT) -> JobPrediction:
    """A ready-queue job of `budget_s` seconds from 0 with non-blocking scatter on the default
    assignment `default` of the chunk `layout`."""
    job = _NonBlocking(policy, plan_for, compute, tuple(sorted(workers)), None, Stepped(net, dt))
    job.default = {j: list(c) for j, c in default.items()}
    job.chunk_bytes = [n * FLOAT32 for _, n in layout]
    return job.run(0.0, budget_s)


class _NonBlocking(_Job):
    default: dict[int, list[int]]
    chunk_bytes: list[int]

    def _ready(self, w: int, k: int, t: float) -> None:
        assert isinstance(self.eng, Stepped)
        sizes = {j: float(sum(self.chunk_bytes[c] for c in cs)) for j, cs in self.default.items() if j != w}
        self.eng.add_flows(("pre", w, k), w, sizes, t)
        super()._ready(w, k, t)

    def _form(self, members: Iterable[int], receivers: Iterable[int], iters: dict[int, int], t: float) -> None:
        assert isinstance(self.eng, Stepped)
        members, receivers = tuple(sorted(members)), tuple(sorted(receivers))
        plan = self.plan_for(members, receivers)
        credit: dict[tuple[int, int], float] = {}
        for m in members:
            sent = self.eng.sent(("pre", m, iters[m]))
            self.eng.abort(("pre", m, iters[m]))
            for g in plan.groups:
                j = g.root
                if j == m or (m, j) not in sent:
                    continue
                kept = set(g.chunks) & set(self.default.get(j, ()))  # a prefix of j's default block
                credit[(m, j)] = min(sent[(m, j)], float(sum(self.chunk_bytes[c] for c in kept)))
        task = JobTask(len(self.tasks), members, receivers, iters, t)
        self.tasks.append(task)
        self.eng.add(TaskRun(task.key, plan, t), credit=credit)


def default_blocks(plan: Plan) -> dict[int, list[int]]:
    """A plan's assignment as aggregator -> chunks (the default plan's, to scatter by)."""
    return {g.root: sorted(g.chunks) for g in plan.groups}
