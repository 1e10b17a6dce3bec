"""The control connection's immediate path: a TASK is handled as its frame is read, never ahead of a
message queued before it, and one that cannot be used still ends the connection as the serve loop does."""

import asyncio
import logging
import random

import pytest
from helpers.cluster import start_cluster, stop_cluster
from helpers.exact import assert_job_exact
from helpers.frames import FakeTransport, feed
from helpers.waiting import until

from emulation.topology import uniform
from overlay.codec import encode
from overlay.control import ControlConn, control_protocol
from overlay.messages import Task


def authenticated_conn() -> ControlConn:
    proto = control_protocol("scheduler")
    conn = ControlConn(proto)
    proto.transport = FakeTransport()
    conn.authenticated = True
    proto.authenticated()
    return conn


@pytest.mark.unit
async def test_an_immediate_message_is_handled_as_read_but_never_ahead_of_one_queued():
    conn = authenticated_conn()
    handled: list[int] = []

    def immediate(header: dict) -> bool:
        if header["t"] != "HEARTBEAT":
            return False
        handled.append(header["node"])
        return True

    conn.immediate = immediate
    beat = {"t": "HEARTBEAT", "node": 1, "time": 1.0}
    feed(conn.proto, encode(beat), random.Random(0))
    assert handled == [1] and conn.inbox.empty()  # handled in the frame's callback, not queued
    report = {"t": "REPORT", "node": 2, "samples": []}
    feed(conn.proto, encode(report) + encode({**beat, "node": 3}), random.Random(1))
    assert handled == [1]  # the REPORT waits in the inbox: the heartbeat queues behind it
    assert (await conn.recv())["t"] == "REPORT"
    assert (await conn.recv())["node"] == 3


@pytest.mark.loopback
async def test_a_task_for_a_plan_the_agent_lacks_makes_it_reconnect_and_the_next_job_is_exact(caplog):
    """The immediate path leaves a TASK it cannot use to the serve loop, which meets the same error:
    the agent reconnects rather than run half a task, and the cluster goes on."""
    caplog.set_level(logging.ERROR)
    sched, agents, tasks = await start_cluster(uniform(3), cluster="c-task")
    try:
        first = agents[1].ctl
        await until(lambda: first.inbox.empty(), what="node 1 to have handled what came before")
        # as if its frame had just been read from the scheduler's socket, with nothing queued ahead
        first.on_frame(Task(job=77, task=5, attempt=0, version=999, round=0, members=[0, 1, 2],
                            receivers=[0, 1, 2]).wire(), None)
        await until(lambda: any("task 5 uses plan v999, which this node does not hold" in r.getMessage()
                                and "reconnecting" in r.getMessage() for r in caplog.records),
                    what="node 1 to give up the connection over the unusable TASK")
        await until(lambda: agents[1].ctl is not first and 1 in sched.agents, what="node 1 registered again")
        await sched.wait_agents(30)
        js = await asyncio.wait_for(sched.run_job("ring", rounds=2, params=60_000, chunk_params=6_000), 60)
        assert_job_exact(sched, js)
    finally:
        await stop_cluster(sched, tasks)
