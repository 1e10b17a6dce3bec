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
def test_a_registered_agent_may_not_speak_for_another_node(msg):
    sched = Scheduler("parts", 2)
    a = sched.registry.agents[0] = AgentInfo(0, conn=None)  # type: ignore[arg-type]  # registered as node 0
    with pytest.raises(ProtocolError, match="node 0 speaks for node 1"):
        sched.server.handlers[type(msg)](a, msg)


def test_a_message_without_a_node_speaks_for_its_connection():
    sched = Scheduler("parts", 2)
    sched.registry.agents[0] = a = AgentInfo(0, conn=None)  # type: ignore[arg-type]
    assert not Ready.SPEAKS_FOR
    sched.server.handlers[Heartbeat](a, Heartbeat(node=0, time=1.0))  # its own: accepted


def test_progress_models_register_and_declare_what_the_scheduler_needs():
    assert set(progress.MODELS) >= {"bsp", "ssp", "queue", "crew", "selective", "mcast-bsp", "mcast-ssp"}
    bsp, ssp, mcast = progress.resolve("bsp"), progress.resolve("ssp"), progress.resolve("mcast-ssp")
    assert bsp.uses_barrier and not ssp.uses_barrier and bsp.ahead(8) == 1 and ssp.ahead(8) == 32
    assert ssp.multicasts and ssp.reduces and mcast.multicasts and not mcast.reduces
    assert not bsp.multicasts and progress.resolve("queue").reduces
    with pytest.raises(ValueError, match="unknown progress model 'nope'"):
        progress.resolve("nope")
