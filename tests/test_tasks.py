"""Tasks: partial reduces, aggregators outside the members, several tasks at once, failures scoped to
a task. Real TCP (in-process agents, or agent processes where one is killed); every receiver's result
is compared with the exact sum this test computes itself (tests/helpers/exact.py's own closed form)."""

import asyncio
import dataclasses
import math
import re
import signal

import numpy as np
import pytest
from helpers.cluster import Cluster, LocalNet, start_cluster, stop_cluster
from helpers.exact import assert_round_exact, exact_sum
from helpers.waiting import until

from agents.taskpart import TaskError
from core.plan import ChunkGroup, Job, Plan, PlanError
from emulation.link import LinkSpec
from emulation.topology import Topology, uniform
from scheduler.planners import mst, star
from scheduler.view import NetworkView
from wansync.options import Options
from wansync.runspec import resolve

PARAMS, CHUNK = 60_000, 6_000


def star_via(hub: int, members: tuple[int, ...], n: int, receivers: tuple[int, ...] | None = None) -> Plan:
    """A star around `hub`, which need not be a member."""
    plan = star.plan(NetworkView(uniform(n).links), Job(PARAMS, CHUNK, members, {"hub": hub})).with_version(1)
    return dataclasses.replace(plan, receivers=receivers)


# --- the plan: which roles a node may have -------------------------------------------------------------------
@pytest.mark.unit
def test_a_node_outside_the_members_may_aggregate_and_replicate():
    plan = star_via(4, (0, 1, 2), 5).validate(uniform(5).links)
    assert plan.members == (0, 1, 2) and 4 in plan.nodes and plan.receiver_set == (0, 1, 2)
    assert plan.groups[0].root == 4


@pytest.mark.unit
@pytest.mark.parametrize("breakage, message", [
    # a non-member leaf of the aggregation tree would only send an empty sum
    (lambda p: dataclasses.replace(p, groups=(dataclasses.replace(
        p.groups[0], parent={**p.groups[0].parent, 3: 0}),)),
     "node 3 is a leaf of the aggregation tree but no member"),
    # a non-receiver leaf of the broadcast tree would get the final value for nothing
    (lambda p: dataclasses.replace(p, groups=(dataclasses.replace(
        p.groups[0], children={**p.groups[0].children, 0: (3,)}),)),
     "node 3 is a leaf of the broadcast tree but no receiver"),
    (lambda p: dataclasses.replace(p, receivers=(0, 1, 3)), "broadcast tree misses nodes [3] (receivers)"),
    (lambda p: dataclasses.replace(p, weights={0: 1.0, 1: math.nan, 2: 1.0}), "weights: node 1 has weight nan"),
    (lambda p: dataclasses.replace(p, weights={0: 1.0, 1: -2.0, 2: 1.0}), "weights: node 1 has weight -2.0"),
    (lambda p: dataclasses.replace(p, receivers=(0, -1)), "receivers must be node ids"),
    (lambda p: dataclasses.replace(p, receivers=()), "receivers must be non-empty"),
])
def test_roles_a_plan_may_not_give_are_refused_with_the_reason(breakage, message):
    plan = star_via(4, (0, 1, 2), 5)
    plan.validate()
    with pytest.raises(PlanError, match=re.escape(message)):
        breakage(plan).validate()


@pytest.mark.unit
def test_mst_keeps_only_the_aggregators_its_tree_needs():
    # a line 0-1-2-3 plus 4 hanging off 3: members 0 and 2 need 1 between them, not 3 or 4
    topo_links = [(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2), (3, 4), (4, 3)]
    plan = mst.plan(NetworkView(topo_links), Job(PARAMS, CHUNK, (0, 2), {"aggregators": [1, 3, 4]}))
    plan.validate(topo_links)
    assert set(plan.nodes) == {0, 1, 2}


# --- the engine: a partial reduce through an aggregator that contributes nothing ---------------------------------
@pytest.mark.loopback
async def test_a_partial_reduce_through_a_non_member_aggregator_is_exact():
    plan = star_via(3, (0, 1, 2), 4, receivers=(0, 1, 2))
    async with LocalNet(uniform(4)) as net:
        out = await net.run_round(plan, rnd=5)  # asserts == the members' exact sum on every receiver
    assert sorted(out) == [0, 1, 2]
    assert not np.array_equal(out[0], exact_sum(5, (0, 1, 2, 3), PARAMS))  # node 3 added nothing of its own


@pytest.mark.loopback
async def test_receivers_need_not_be_members_and_weights_are_exact_when_integer():
    """Members 1, 2, 3 (weights 3, 1, 2) sum at node 0, which contributes nothing; receivers are
    node 1 (a member) and node 4 (not a member, in no aggregation tree)."""
    base = star_via(0, (1, 2, 3), 5)
    group = ChunkGroup(base.groups[0].chunks, 0, {0: None, 1: 0, 2: 0, 3: 0}, {0: (1, 4)})
    plan = dataclasses.replace(base, receivers=(1, 4), weights={1: 3.0, 2: 1.0, 3: 2.0}, groups=(group,))
    plan.validate()
    async with LocalNet(uniform(5)) as net:
        out = await net.run_round(plan, rnd=2)
    want = 3 * exact_sum(2, (1,), PARAMS) + exact_sum(2, (2,), PARAMS) + 2 * exact_sum(2, (3,), PARAMS)
    assert sorted(out) == [1, 4] and all(np.array_equal(r, want) for r in out.values())


@pytest.mark.loopback
async def test_a_forged_contribution_from_the_aggregators_side_is_refused():
    """An aggregator is held to the members' bitmap: a sum claiming a non-member is never taken."""
    plan = star_via(3, (0, 1, 2), 4)
    async with LocalNet(uniform(4)) as net:
        eng = net.engines[3]
        eng.open_job(1, 0)
        st = eng.begin_task(1, 0, 0, plan, None)
        # it brings nothing of its own: every chunk of its accumulator starts at zero
        assert not any(st._acc(c).any() for c in range(len(plan.layout))) and st.contributors[0] == 0
        h = {"t": "CHUNK", "job": 1, "task": 0, "attempt": 0, "version": 1, "chunk": 0, "kind": "agg", "origin": 0,
             "contributors": bytes([0b1001]), "t_send": 0.0, "path": [0, 3], "hop": 0, "off": 0, "total": CHUNK * 4,
             "nbytes": CHUNK * 4}
        eng.chunk_buffer(h)
        eng.chunk_segment(h, memoryview(np.zeros(CHUNK, np.float32)).cast("B"))
        with pytest.raises(TaskError, match="non-members"):
            await st.done


# --- the scheduler: tasks formed on subsets, several at once -------------------------------------------------------
@pytest.mark.loopback
async def test_three_concurrent_tasks_on_overlapping_subsets_are_each_exact():
    sched, agents, tasks = await start_cluster(uniform(6).scaled(0.2), cluster="t3", shaped=True)
    try:
        js = sched.open_tasks("star", params=PARAMS, chunk_params=CHUNK, in_flight=8)
        recs = await asyncio.wait_for(asyncio.gather(
            sched.run_task(js, (0, 1, 2), options={"hub": 5}),  # aggregated by a node outside the members
            sched.run_task(js, (1, 2, 3), options={"hub": 5}),  # node 5 aggregates for two tasks at once
            sched.run_task(js, (2, 3, 4))), 60)
        for rec in recs:
            assert rec.ok and rec.digests_agree and not rec.aborted, rec
            assert_round_exact(rec, sched.plans[rec.version])  # the test's own exact sum, per receiver
        assert recs[0].aggregators == [5] and recs[1].aggregators == [5] and recs[2].aggregators == []
        assert sorted(recs[0].digests) == [0, 1, 2]  # only members receive
        # they ran at once: node 2 had a part in all three, and their spans there overlap
        spans = [rec.spans[2] for rec in recs]
        assert max(s[0] for s in spans) < min(s[1] for s in spans)
        await asyncio.wait_for(sched.close_job(js), 30)
        assert set(js.stats) == set(range(6))
    finally:
        await stop_cluster(sched, tasks)


@pytest.mark.loopback
async def test_a_relay_keeps_passing_on_an_older_task_while_it_runs_newer_ones_of_its_own():
    """Node 1 only relays for tasks 0 and 1 (0 and 2 talk through it) while it runs task 2 itself: a
    relay's window must follow what is still running anywhere, not the tasks it runs."""
    spec = LinkSpec(20.0)
    topo = Topology("hub-line", 4, {k: spec for a, b in ((0, 1), (1, 2), (1, 3)) for k in ((a, b), (b, a))})
    sched, agents, tasks = await start_cluster(topo, cluster="relay", shaped=True)
    try:
        js = sched.open_tasks("star", params=400_000, chunk_params=20_000)  # 1.6 MB a way: ~0.7 s at 20 Mbit/s
        recs = await asyncio.wait_for(asyncio.gather(
            sched.run_task(js, (0, 2), options={"hub": 0}), sched.run_task(js, (0, 2), options={"hub": 2}),
            sched.run_task(js, (1, 3))), 120)
        for rec in recs:
            assert rec.ok and not rec.aborted and rec.attempt == 0, rec  # nothing refused, nothing retried
            assert_round_exact(rec, sched.plans[rec.version])
        assert 1 not in recs[0].spans and 1 not in recs[1].spans  # a relay only: no part of its own
        assert agents[1].engine.refused_frames == 0
        await asyncio.wait_for(sched.close_job(js), 30)
    finally:
        await stop_cluster(sched, tasks)


@pytest.mark.loopback
async def test_a_straggler_holds_frames_that_overtake_its_task_far_beyond_the_window():
    """A node left out of many tasks (a straggler under a queue model) is still at task 0 when its peers'
    frames for task 50 arrive ahead of its TASK: they are held, not refused (a refusal costs the sender a
    reconnect and a resend), and the task ends exact once it begins there."""
    topo = Topology("line", 3, {k: LinkSpec(1000.0) for a, b in ((0, 1), (1, 2)) for k in ((a, b), (b, a))})
    plan = star.plan(NetworkView(topo.links), Job(PARAMS, CHUNK, (0, 1, 2), {"hub": 2})).with_version(1)
    async with LocalNet(topo) as net:
        for eng in net.engines.values():
            eng.open_job(1, 0, ahead=1)  # every node at task 0, one task of window
        straggler = net.engines[2]
        held = lambda: {k[1] for k in straggler._stash} == {50} and straggler.held_bytes() > 0  # noqa: E731
        await net.run_round(plan, rnd=50, starts={2: lambda: until(held, what="the straggler held task 50")})
        assert straggler.refused_frames == 0 and straggler.stashed_frames > 0


@pytest.mark.loopback
@pytest.mark.parametrize("scheme", ["star", "ring", "mst", "ktree", "netstorm"])
async def test_every_planner_runs_a_partial_reduce_exactly(scheme):
    sched, agents, tasks = await start_cluster(uniform(5), cluster=f"p-{scheme}")
    try:
        js = sched.open_tasks(scheme, params=PARAMS, chunk_params=CHUNK)
        rec = await asyncio.wait_for(sched.run_task(js, (0, 2, 3)), 60)
        assert rec.ok and rec.members == [0, 2, 3]
        assert_round_exact(rec, sched.plans[rec.version])
        await asyncio.wait_for(sched.close_job(js), 30)
    finally:
        await stop_cluster(sched, tasks)


@pytest.mark.loopback
@pytest.mark.parametrize("members, kwargs, message", [
    ((0, 9), {}, "members: [9] are not nodes of this cluster"),
    ((0, 1), {"receivers": (0, 7)}, "receivers: [7] are not nodes"),
    ((0, 1), {"weights": {0: 1.0, 1: math.nan}}, "weights: node 1 has weight nan"),
    ((0, 1), {"weights": {0: -1.0}}, "weights: node 0 has weight -1.0"),
    ((0, 1), {"weights": {2: 1.0}}, "weights: node 2 is not a member"),
    ((), {}, "members: a task needs at least one member"),
    ((0, 1), {"sharing": {"weight": 0}}, "sharing: weight 0 is not a share"),
    ((0, 1), {"sharing": {"priority": 9}}, "sharing: priority 9 is not a level"),
    ((0, 1), {"sharing": {"deadline_s": -1.0}}, "sharing: deadline -1.0 is not"),
    ((0, 1), {"sharing": {"share": 2}}, "sharing: unknown ['share']"),
])
async def test_a_task_that_cannot_mean_anything_is_refused_naming_the_field_and_others_run_on(members, kwargs,
                                                                                                message):
    sched, agents, tasks = await start_cluster(uniform(3), cluster="bad")
    try:
        js = sched.open_tasks("star", params=PARAMS, chunk_params=CHUNK)
        good = asyncio.create_task(sched.run_task(js, (0, 1, 2)))
        with pytest.raises(ValueError, match=re.escape(message)):
            await sched.run_task(js, members, **kwargs)
        rec = await asyncio.wait_for(good, 60)
        assert rec.ok
        assert_round_exact(rec, sched.plans[rec.version])
        await asyncio.wait_for(sched.close_job(js), 30)
    finally:
        await stop_cluster(sched, tasks)


# --- failure scoped to the tasks an agent had a part in ---------------------------------------------------------
# 20 Mbit/s links: a 2.4 MB partial reduce takes about a second
SIX = resolve(Options.make(topology="uniform:20", nodes=6, scale=0.2, rounds=1))


@pytest.mark.loopback
async def test_an_agent_killed_while_it_aggregates_for_two_tasks_affects_only_those():
    async with Cluster("kill-agg", processes=SIX) as c:
        sched = c.sched
        js = sched.open_tasks("star", params=600_000, chunk_params=50_000, in_flight=8)
        a = asyncio.create_task(sched.run_task(js, (0, 1), options={"hub": 5}))
        b = asyncio.create_task(sched.run_task(js, (2, 3), options={"hub": 5}))
        third = asyncio.create_task(sched.run_task(js, (1, 4), options={"hub": 0}))  # node 5 has no part in it
        await until(lambda: all(t.started_t is not None for t in js.tasks.values()) and len(js.tasks) == 3,
                    "the three tasks to start")
        assert 5 in js.tasks[0].involved and 5 in js.tasks[1].involved and 5 not in js.tasks[2].involved
        c.procs[5].send_signal(signal.SIGKILL)  # while it aggregates for the first two
        ra, rb, rc = await asyncio.wait_for(asyncio.gather(a, b, third), 120)
        for rec in (ra, rb):  # retried without it (its own hub gone: another one chosen), and exact
            assert rec.ok and not rec.aborted and rec.attempt >= 1 and 5 not in rec.aggregators, rec
            assert_round_exact(rec, sched.plans[rec.version])
        assert rc.ok and rc.attempt == 0  # untouched
        assert_round_exact(rc, sched.plans[rc.version])
        assert not any(r.ok is False and not r.aborted for r in js.records)  # none wrong
        assert 5 in sched.lost


@pytest.mark.loopback
async def test_a_task_whose_members_are_all_lost_is_recorded_as_aborted_and_nothing_applied():
    async with Cluster("kill-all", processes=SIX) as c:
        sched = c.sched
        js = sched.open_tasks("star", params=600_000, chunk_params=50_000, in_flight=8)
        doomed = asyncio.create_task(sched.run_task(js, (4,), receivers=(4,), options={"hub": 5}))
        await until(lambda: js.tasks and js.tasks[0].started_t is not None, "the task to start")
        c.procs[4].send_signal(signal.SIGKILL)
        rec = await asyncio.wait_for(doomed, 120)
        assert rec.aborted and not rec.ok and not rec.digests
        other = await asyncio.wait_for(sched.run_task(js, (0, 1, 2)), 60)
        assert other.ok
        assert_round_exact(other, sched.plans[other.version])

