"""NetStorm's policy-consistency failures (Fig. 8), reproduced with the protocol off, prevented with it on."""

import asyncio
from typing import Any

import pytest
from helpers.cluster import start_cluster, stop_cluster
from helpers.exact import assert_job_exact

from core.plan import ChunkGroup, Job, Plan
from emulation.topology import uniform
from overlay.messages import Task as TaskMsg
from overlay.messages import chunk_key
from overlay.peers import Overlay
from scheduler.planners import ring

pytestmark = pytest.mark.loopback

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


def without_the_protocol(sched) -> None:
    """Fig. 8's counterfactual, for these tests only: no barrier and no freeze per round. Every agent
    that says READY for round r gets its TASK at once, with whatever version is newest then (the
    first one asking only records the version the round's results are judged by)."""
    def at_once(js, rnd, node, have):
        t = js.bsp_task(rnd)
        v = js.plan.version
        if t.version is None:
            t.version = v  # what its TASK_DONEs are judged by; never "started": no watchdog aborts it
        plan = sched.versions.plans[v]
        sched.registry.send_to(node, TaskMsg(job=js.job, task=rnd, attempt=t.attempt, version=v, round=rnd,
                                             members=list(plan.participants), receivers=list(plan.receiver_set),
                                             plan=None if v in have else plan.to_wire()))
        sched.on_event("topo_request", {"node": node, "round": rnd, "version": v})
    sched.control.barrier_ready = at_once  # the one place the protocol decides; production has no switch


async def test_without_the_protocol_a_racing_replan_deadlocks_and_loses_frames():
    holder: dict = {}
    sched, agents, tasks = await start_cluster(uniform(4), cluster="fig8-off",
                                               on_event=restage_after_first_request(holder, 1))
    holder["sched"] = sched
    without_the_protocol(sched)
    try:
        job = asyncio.create_task(sched.run_job("ring", rounds=3, params=PARAMS, chunk_params=CHUNK))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(job), 4)
        # round 1 never ends: the first agent runs the old ring, the others the new one (deadlock),
        # and frames sent under one version wait forever at receivers that run the other (loss)
        running = {a.node: {k[3] for k in a.engine.tasks if k[1] == 1} for a in agents}
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
        assert_job_exact(sched, js)
    finally:
        await stop_cluster(sched, tasks)


# --- Fig. 10: auxiliary tables that update asynchronously -------------------------------------------

# s=0 pushes to its parent d=3; relays X=1 and Y=2. The old auxiliary route is 0->1->2->3, the new
# one 0->2->1->3. A relay that routes by its own table while only Y has the new one sends a chunk
# X -> Y -> X -> ...: a loop. Source routing (the protocol) carries the sender's route in the header.
OLD_ROUTE, NEW_ROUTE = (0, 1, 2, 3), (0, 2, 1, 3)


def fig10_topology():
    from emulation.link import LinkSpec
    from emulation.topology import Topology

    links = {}
    for a, b in ((0, 1), (0, 2), (1, 2), (1, 3), (2, 3), (0, 3)):
        links[(a, b)] = links[(b, a)] = LinkSpec(100.0, 0.001)
    return Topology("fig10", 4, links)


def fig10_plan(route) -> Plan:
    from core.plan import make_layout, tree_group

    g = tree_group(range(10), 3, {0: 3, 1: 3, 2: 3, 3: None})
    g = ChunkGroup(g.chunks, g.root, g.parent, g.children, {(0, 3): (route,)})
    return Plan(0, "fig10", (0, 1, 2, 3), dict.fromkeys(range(4), 1.0), make_layout(PARAMS, CHUNK), (g,))


class TableRelayOverlay(Overlay):
    """What NetStorm's protocol forbids, for Fig. 10 only: a relay routes a chunk by its own auxiliary
    table instead of the source route in its header, which can loop while tables update; a looping
    chunk then fails validation (its path visits a node twice) and is dropped."""

    def _on_chunk_header(self, peer: int, h: dict[str, Any]) -> tuple[str, Any]:
        path, hop = h["path"], h["hop"]
        if path[hop] == peer and path[hop + 1] == self.node and hop + 2 < len(path) \
                and chunk_key(h) not in self._rx:
            h["path"] = [*path[:hop + 1], *self._table_route(h)]
        return super()._on_chunk_header(peer, h)

    def _table_route(self, h: dict[str, Any]) -> tuple[int, ...]:
        """The rest of a route through this node in its own table (the agent's engine), or the min-hop route."""
        engine = self.sink
        origin, dst = h["path"][0], h["path"][-1]
        plan = engine.plans.get(h["version"])
        if plan is not None:
            group = next((gi for gi, g in enumerate(plan.groups) if h["chunk"] in g.chunks), None)
            for r in engine.aux_for(plan, group).get((origin, dst), ()) if group is not None else ():
                if self.node in r[:-1]:
                    return r[r.index(self.node):]
        return engine.routes.route(self.node, dst)


@pytest.fixture
def relay_by_table(monkeypatch):
    """Agents started in this test relay by their own tables (TableRelayOverlay)."""
    import agents.agent

    monkeypatch.setattr(agents.agent, "Overlay", TableRelayOverlay)


async def start_fig10(cluster):
    from agents.agent import Agent
    from scheduler.service import Scheduler

    topo = fig10_topology()
    sched = Scheduler(cluster, 4)
    port = await sched.start()
    # busy bound 0: every chunk node 0 sends goes the auxiliary way while the route has room
    agents = [Agent(n, cluster, ("127.0.0.1", port), topo, shaped=False, primary_busy_bound=0) for n in range(4)]
    tasks = [asyncio.create_task(a.run()) for a in agents]
    await sched.wait_agents(20)
    return sched, agents, tasks


def push_new_route_to_y_only(holder):
    """Right after round 0 froze (plan v1 with the old route), only relay Y=2 learns the new table."""
    def on_event(kind, data):
        if kind == "topo_request" and data["round"] == 1 and not holder.get("pushed"):
            holder["pushed"] = True
            sched = holder["sched"]
            sched.push_aux(fig10_plan(NEW_ROUTE).with_version(sched.current.plan.version), nodes=[2])
    return on_event


async def run_fig10(cluster):
    holder: dict = {}
    sched, agents, tasks = await start_fig10(cluster)
    holder["sched"] = sched
    sched.on_event = push_new_route_to_y_only(holder)
    from scheduler import planners
    planners.register(planners.PlannerSpec("fig10", lambda view, job, memory: fig10_plan(OLD_ROUTE)))
    return sched, agents, tasks


def loops(agents) -> int:
    """Chunks that came back to a node they had passed: refused as a path visiting a node twice."""
    return sum(e.field == "path" and "twice" in str(e) for a in agents for e in a.overlay.errors)


async def test_fig10_relaying_by_own_tables_loops_while_tables_update(relay_by_table):
    sched, agents, tasks = await run_fig10("fig10-off")
    try:
        job = asyncio.create_task(sched.run_job("fig10", rounds=3, params=PARAMS, chunk_params=CHUNK))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(job), 4)
        # chunks of node 0 went 0 -> 1 (old table) -> 2 (new table: back to 1) -> 1: a loop, dropped
        assert loops(agents) > 0
        assert [r.round for r in sched.current.records] == [0]  # round 1 never completes
        job.cancel()
    finally:
        await stop_cluster(sched, tasks)


async def test_fig10_source_routing_cannot_loop_and_every_round_is_exact():
    sched, agents, tasks = await run_fig10("fig10-on")
    try:
        js = await asyncio.wait_for(sched.run_job("fig10", rounds=3, params=PARAMS, chunk_params=CHUNK), 30)
        assert loops(agents) == 0
        assert all(r.ok and r.digests_agree and r.versions_agree for r in js.records)
        assert_job_exact(sched, js)
        assert agents[2].engine.aux_tables  # Y did get the new table ...
        assert sum(st["aux_bytes"] for st in js.stats.values()) > 0  # ... and auxiliary routes carried chunks
    finally:
        await stop_cluster(sched, tasks)
