"""NetStorm's policy-consistency failures (Fig. 8), reproduced with the protocol off, prevented with it on."""

import asyncio

import pytest
from test_cluster import start_cluster, stop_cluster

from emulation.topology import uniform
from scheduler.plan import ChunkGroup, Job, Plan
from scheduler.planners import ring

PARAMS, CHUNK = 40_000, 4_000
SHUFFLE = {0: 2, 1: 0, 2: 3, 3: 1}  # the new policy: the same ring shape over other neighbours


def shuffled_ring(sched) -> Plan:
    """A ring in another node order. Any split of nodes between the old and this ring deadlocks and
    strands frames: walking the old ring, some node on the old version sends to one on the new."""
    p = ring.plan(sched.view, Job(PARAMS, CHUNK, tuple(range(4))))
    m = SHUFFLE.get
    groups = tuple(ChunkGroup(g.chunks, m(g.root), {m(n): (None if q is None else m(q)) for n, q in g.parent.items()},
                              {m(n): tuple(m(k) for k in kids) for n, kids in g.children.items()})
                   for g in p.groups)
    return Plan(0, "ring", p.participants, p.weights, p.layout, groups)


def restage_after_first_request(holder, rnd):
    """Publish a new policy right after the first agent asked for round `rnd` (a re-plan racing the round)."""
    def on_event(kind, data):
        if kind == "topo_request" and data["round"] == rnd and not holder.get("staged"):
            holder["staged"] = holder["sched"].stage(shuffled_ring(holder["sched"]))
    return on_event


async def test_without_the_protocol_a_racing_replan_deadlocks_and_loses_frames():
    holder: dict = {}
    sched, agents, tasks = await start_cluster(uniform(4), cluster="fig8-off",
                                               on_event=restage_after_first_request(holder, 1))
    holder["sched"] = sched
    sched.consistency = False
    try:
        job = asyncio.create_task(sched.run_job("ring", rounds=3, params=PARAMS, chunk_params=CHUNK))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(job), 4)
        # round 1 never ends: the first agent runs the old ring, the others the new one (deadlock),
        # and frames sent under one version wait forever at receivers that run the other (loss)
        running = {a.node: {k[3] for k in a.engine.rounds if k[1] == 1} for a in agents}
        assert len(set().union(*running.values())) == 2, running
        assert sum(a.engine.stashed_frames for a in agents) > 0
        assert [r.round for r in sched.current.records] == [0]
        job.cancel()
    finally:
        await stop_cluster(sched, tasks)


async def test_with_the_protocol_the_same_race_is_harmless_and_every_round_exact():
    holder: dict = {}
    sched, agents, tasks = await start_cluster(uniform(4), cluster="fig8-on",
                                               on_event=restage_after_first_request(holder, 1))
    holder["sched"] = sched
    try:
        js = await asyncio.wait_for(sched.run_job("ring", rounds=3, params=PARAMS, chunk_params=CHUNK), 30)
        by_round = {r.round: r for r in js.records}
        assert by_round[1].version == by_round[0].version  # frozen on the first request, before the re-plan
        assert by_round[2].version == holder["staged"]  # the new policy from the next round on
        assert all(r.ok and r.digests_agree and r.versions_agree for r in js.records)
    finally:
        await stop_cluster(sched, tasks)
