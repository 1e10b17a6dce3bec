"""The scheduler's parts as their own modules declare them: an agent's message that names a node
must name its own (overlay.messages.Record.SPEAKS_FOR), and progress models are found in their
registry and say what the scheduler needs of them."""

import pytest

from overlay.messages import Counters, Heartbeat, ProtocolError, Ready, Report, Stats, TaskDone
from scheduler import progress
from scheduler.registry import AgentInfo
from scheduler.service import Scheduler


@pytest.mark.parametrize("msg", [
    Heartbeat(node=1, time=1.0), Report(node=1, samples=[]), Stats(node=1, job=1, stats={}),
    Counters(node=1, time=1.0, links={}),
    TaskDone(node=1, job=1, task=0, attempt=0, ok=True, digest="", version=1, t_start=0.0, t_end=0.0, t_compute=0.0),
])
@pytest.mark.unit
def test_a_registered_agent_may_not_speak_for_another_node(msg):
    sched = Scheduler("parts", 2)
    a = sched.registry.agents[0] = AgentInfo(0, conn=None)  # type: ignore[arg-type]  # registered as node 0
    with pytest.raises(ProtocolError, match="node 0 speaks for node 1"):
        sched.server.handlers[type(msg)](a, msg)


@pytest.mark.unit
def test_a_message_without_a_node_speaks_for_its_connection():
    sched = Scheduler("parts", 2)
    sched.registry.agents[0] = a = AgentInfo(0, conn=None)  # type: ignore[arg-type]
    assert not Ready.SPEAKS_FOR
    sched.server.handlers[Heartbeat](a, Heartbeat(node=0, time=1.0))  # its own: accepted


@pytest.mark.unit
def test_progress_models_register_and_declare_what_the_scheduler_needs():
    assert set(progress.MODELS) >= {"bsp", "ssp", "queue", "crew", "selective", "mcast-bsp", "mcast-ssp"}
    bsp, ssp, mcast = progress.resolve("bsp"), progress.resolve("ssp"), progress.resolve("mcast-ssp")
    assert bsp.uses_barrier and not ssp.uses_barrier and bsp.ahead(8) == 1 and ssp.ahead(8) == 32
    assert ssp.multicasts and ssp.reduces and mcast.multicasts and not mcast.reduces
    assert not bsp.multicasts and progress.resolve("queue").reduces
    with pytest.raises(ValueError, match="unknown progress model 'nope'"):
        progress.resolve("nope")


class _Conn:
    """An agent's control connection as the scheduler sees it: what was sent to it."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send(self, h: dict) -> None:
        self.sent.append(h)

    def close(self) -> None:
        pass


@pytest.mark.loopback
async def test_crews_link_watch_suspects_through_liveness_and_aborts_the_tasks_over_the_link():
    """CREW's dead-link rule runs on the scheduler's liveness tick: a link whose chunks waited past
    the timeout is suspected there (one suspicion, trusted again when it runs out) and the running
    tasks whose plan uses it abort."""
    import time

    from core.plan import Job
    from emulation.topology import uniform
    from scheduler import planners
    from scheduler.planners import crew
    from scheduler.progress.crew import CrewQueue
    from scheduler.tasks import JobState, Task

    sched = Scheduler("crew-watch", 3)
    now = time.time()
    for n in range(3):
        sched.view.add_node(n)
        sched.registry.agents[n] = AgentInfo(n, conn=_Conn(), neighbors=tuple(m for m in range(3) if m != n),
                                             last_seen=now + 100)  # type: ignore[arg-type]
    for a, b in uniform(3).links:
        sched.view.add_link(a, b)
    sched.registry.agents[0].stuck = {1: 10.0}  # node 0's chunks to node 1 wait unacknowledged
    pol = CrewQueue(group=2, suspect_s=30.0)
    plan = sched.versions.publish(crew.plan(sched.view, Job(5_000, 100, (0, 1), {})))
    js = sched.current = JobState(1, "crew", 10, Job(5_000, 100, (0, 1, 2)), plan, 0,
                                  planner=planners.resolve("crew"), progress=pol)
    js.tasks[0] = Task(0, 0, barrier=False, members=(0, 1), version=plan.version, started_t=now,
                       iters={0: 0, 1: 0}, options={"max_attempts": 1})
    pol.formed_t[0] = now
    sched.liveness.check(now)
    assert (0, 1) in sched.liveness.suspect_until and (0, 1) in sched.view.suspended
    assert [e["link"] for e in sched.timeline if e["kind"] == "link_down"] == [[0, 1]]
    assert [a["task"] for a in js.aborts] == [0] and "down" in js.aborts[0]["why"]
    sched.liveness.check(now + 1)  # still stuck: suspected once, not again
    assert len([e for e in sched.timeline if e["kind"] == "link_down"]) == 1
    sched.registry.agents[0].stuck = {}
    sched.liveness.check(now + 31)  # the suspicion ran out: the link is planned over again
    assert (0, 1) not in sched.liveness.suspect_until and (0, 1) not in sched.view.suspended
