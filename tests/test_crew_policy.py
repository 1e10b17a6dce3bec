"""CREW's failure policy (scheduler/progress/crew.py, §2.9) on a scheduler that is not started: a dead
aggregator's block moves to the Eq. (3) replacement, what cannot be saved is abandoned, and a member's
repeated READY never puts its contribution in a second task."""

import time

import pytest

from core.plan import Job, Plan
from emulation.topology import uniform
from scheduler import planners
from scheduler.planners import crew
from scheduler.progress.crew import CrewQueue
from scheduler.service import Scheduler
from scheduler.tasks import JobState, Task

pytestmark = pytest.mark.unit


# --- failures (§2.9) ---------------------------------------------------------------------------------------
def queue_task(sched: Scheduler, plan: Plan, members: tuple[int, ...]) -> tuple[CrewQueue, Task]:
    """A scheduler (not started) that knows `plan` as a task's aborted attempt, and the policy."""
    pol = CrewQueue(group=len(members))
    js = sched.current = JobState(1, "crew", 10, Job(plan.params, plan.layout[0][1], members), plan, 0,
                                  planner=planners.resolve("crew"), progress=pol)
    t = js.tasks[0] = Task(0, 0, barrier=False, members=members, iters=dict.fromkeys(members, 0))
    pol.formed_t[0] = time.time()
    return pol, t


async def test_the_policy_moves_a_dead_aggregators_block_and_abandons_what_cannot_be_saved():
    sched = Scheduler("pol", 5)
    for n in range(5):
        sched.view.add_node(n)
    for a, b in uniform(5).links:
        sched.view.add_link(a, b)
    sched.alive = lambda: [0, 1, 2, 3]  # type: ignore[method-assign]  # node 4 is gone
    plan = sched.versions.publish(crew.plan(sched.view, Job(5_000, 100, (0, 1), {})))
    pol, t = queue_task(sched, plan, (0, 1))
    # another task running: its blocks load nodes 0, 1 and 2, so node 3 is the least loaded (Eq. 3)
    busy = sched.versions.publish(crew.plan(sched.view, Job(5_000, 100, (1, 2), {
        "blocks": [[0, [[0, 20]]], [1, [[20, 35]]], [2, [[35, 50]]]]})))
    sched.current.tasks[1] = Task(1, 0, barrier=False, members=(1, 2), version=busy.version)
    sched.view.node_down(4)
    assert pol.retry(sched, sched.current, t, plan.version, "agent 4 lost") is None  # re-planned, not abandoned
    moved = {m["from"]: m["to"] for m in pol.failovers}
    assert moved == {4: 3}
    blocks = dict((r, rs) for r, rs in t.options["blocks"])
    assert 4 not in blocks and sum(hi - lo for rs in blocks.values() for lo, hi in rs) == len(plan.layout)
    # a lost member: abandoned; over the budget: abandoned
    sched.alive = lambda: [1, 2, 3]  # type: ignore[method-assign]
    assert "member(s) [0] lost" in pol.retry(sched, sched.current, t, plan.version, "agent 0 lost")
    sched.alive = lambda: [0, 1, 2, 3]  # type: ignore[method-assign]
    pol.budget_s = 1.0
    pol.formed_t[0] = time.time() - 2.0
    assert "over its time budget" in pol.retry(sched, sched.current, t, plan.version, "stall")
    assert len(pol.abandoned) == 2




def test_a_members_repeated_ready_never_puts_its_contribution_in_a_second_task():
    """After an abort a member's agent says READY again for the same iteration, whether its task is being
    retried or already ended on the retry: the policy keeps the contribution in that one task. Abandoned,
    the members queue again, except one that had received the whole result before the failure."""
    from scheduler.tasks import TaskRecord

    class Forms:  # the policy's view of the scheduler (scheduler.progress.Control): what it formed
        def __init__(self) -> None:
            self.formed: list[dict[int, int]] = []

        def form(self, js, members, receivers, rnd, iters=None, options=None):
            js.tasks[len(js.tasks)] = Task(len(js.tasks), rnd, barrier=False, members=tuple(members), iters=iters)
            self.formed.append(dict(iters))

        def alive(self):
            return [0, 1, 2, 3]
    ctl, pol = Forms(), CrewQueue(group=2)
    js = JobState(1, "crew", 100, Job(10, 10, (0, 1, 2, 3)), None, 0, progress=pol)  # type: ignore[arg-type]
    for n in (0, 1):
        pol.ready(ctl, js, n, 0, set())
    assert ctl.formed == [{0: 0, 1: 0}]
    pol.ready(ctl, js, 0, 0, set())  # repeated after an abort: ignored
    pol.ready(ctl, js, 2, 0, set())
    assert ctl.formed == [{0: 0, 1: 0}] and pol.queue == [(2, 0)]

    def record(task: int, iters: dict[int, int], aborted: bool) -> TaskRecord:
        return TaskRecord(1, "crew", task, 0, 1, 0.0, 0.0, not aborted, True, True, 0.0, 0.0, False, [],
                          iters=iters, members=sorted(iters), aborted=aborted)
    pol.consumed[0] = frozenset({1})  # node 1 had the whole result when the task was abandoned
    pol.task_done(ctl, js, record(0, {0: 0, 1: 0}, aborted=True))
    assert ctl.formed[-1] == {2: 0, 0: 0} and (1, 0) in pol.placed  # 0 queues again, 1 goes on
    pol.ready(ctl, js, 1, 0, set())
    assert pol.queue == []
