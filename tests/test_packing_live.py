"""Tree packing (seed 001) live: compiled plans (packing and the baselines) run over real TCP, every
receiver compared with the exact sum computed here (tests/helpers/exact.py), relays that aggregate
without contributing, each tree's bytes against its LP weight, and the scheduler re-solving off its loop."""

from __future__ import annotations

import asyncio

import pytest
from helpers.cluster import LocalNet, start_cluster, stop_cluster
from helpers.exact import assert_job_exact

from core.plan import Job
from emulation.gpumesh import gpumesh
from emulation.link import LinkSpec
from emulation.topology import Topology, internet2, uniform
from scheduler.planners import resolve
from wansync.predict import oracle_view

PARAMS, CHUNK = 96_000, 8_000


async def packing_job_on_a_moving_view():
    """A packing job on 5 nodes whose view changes after every round (a different pair looks fast),
    every round exact (the harness's own sum); returns the scheduler and the job."""
    flips = iter([(0, 1), (2, 3), (1, 4), (0, 3)])

    def on_event(kind, data):
        if kind == "task":
            a, b = next(flips, (2, 4))
            for _ in range(5):
                sched.view.observe(a, b, 10**9, 0.05)
                sched.view.observe(b, a, 10**9, 0.05)

    sched, agents, tasks = await start_cluster(uniform(5), cluster="pk", on_event=on_event)
    for a, b in sched.view.links():  # every link measured (else the unknown ones count at the fast pair's rate)
        for _ in range(5):
            sched.view.observe(a, b, 1_250_000, 0.1)
    try:
        js = await asyncio.wait_for(sched.run_job("packing", rounds=6, params=50_000, chunk_params=5_000), 90)
        assert all(r.ok and r.digests_agree and r.versions_agree for r in js.records)
        assert_job_exact(sched, js)
    finally:
        await stop_cluster(sched, tasks)
    assert not sched.errors
    return sched, js


@pytest.mark.loopback
async def test_a_packing_plan_runs_exact_live_and_each_tree_carries_its_weights_share():
    """internet2's packing on real sockets: every receiver holds the exact sum (the harness computes
    it), and the bytes each tree's class carried over the wire, per tree edge, are its LP share of
    the tensor within 10 %."""
    topo = internet2(seed=1).scaled(0.05)
    plan = resolve("packing").plan(oracle_view(topo), Job(PARAMS, CHUNK, tuple(range(9)))).with_version(1)
    async with LocalNet(topo) as net:
        sent: dict[tuple[int, str], int] = {}
        for ov in net.overlays.values():
            for s in ov.senders.values():
                orig = s.send

                def spy(tr, orig=orig):
                    h = tr.header
                    if "cls" in h and h["kind"] in ("agg", "bcast"):
                        key = (h["cls"][0], h["kind"])
                        sent[key] = sent.get(key, 0) + tr.total
                    orig(tr)
                s.send = spy
        await net.run_round(plan)
    total_w = sum(g.weight for g in plan.groups)
    for i, g in enumerate(plan.groups):
        share = 4 * PARAMS * g.weight / total_w
        edges = len([n for n, p in g.parent.items() if p is not None])
        kids = sum(len(k) for k in g.children.values())
        assert sent[(i, "agg")] / edges == pytest.approx(share, rel=0.10)
        assert sent[(i, "bcast")] / kids == pytest.approx(share, rel=0.10)


@pytest.mark.loopback
async def test_inactive_relays_aggregate_without_contributing():
    """Members 0, 1, 2 on a star around node 3 whose spokes are the only fast links (the direct links
    between members crawl): the packing routes through 3, which sums and forwards its children's
    partial sums and adds nothing of its own (the harness compares with the members' sum alone)."""
    links = {}
    for a in range(3):
        links[(a, 3)] = links[(3, a)] = LinkSpec(400.0)
        for b in range(3):
            if a != b:
                links[(a, b)] = LinkSpec(5.0)
    topo = Topology("hub", 4, links)
    plan = resolve("packing").plan(oracle_view(topo), Job(PARAMS, CHUNK, (0, 1, 2))).with_version(1)
    plan.validate(topo.links)
    assert 3 in plan.nodes and 3 not in plan.participants
    assert any(p == 3 for g in plan.groups for p in g.parent.values())  # 3 aggregates for someone
    async with LocalNet(topo) as net:
        out = await net.run_round(plan, rnd=3)  # == the exact sum of 0, 1, 2 on every receiver
    assert sorted(out) == [0, 1, 2]


@pytest.mark.loopback
async def test_the_scheduler_re_solves_off_its_loop_as_the_view_moves_and_rounds_stay_exact():
    """The LP is re-solved in a worker thread as the view moves; later rounds take the new versions,
    none mixes them."""
    sched, js = await packing_job_on_a_moving_view()
    versions = [r.version for r in sorted(js.records, key=lambda r: r.round)]
    assert len(set(versions)) >= 2 and js.replans >= 1 and js.replan_s > 0, versions
    assert js.plan.info["trees"] > 0


@pytest.mark.loopback
async def test_the_scheduler_spaces_re_plans_by_their_solve_time(monkeypatch):
    """The same moving view, but a solver allowed a vanishing share of a core: after its first re-plan
    the next is never due, so the job re-plans once (packing solves off the loop: the offload share)."""
    import scheduler.versions as versions
    monkeypatch.setattr(versions, "OFFLOAD_CPU_SHARE", 1e-9)
    sched, js = await packing_job_on_a_moving_view()
    assert js.replans == 1


@pytest.mark.loopback
@pytest.mark.parametrize("scheme", ["shardps", "blink", "dbtree", "plink", "packing-no-overlap"])
async def test_every_baseline_runs_exact_live(scheme):
    topo = gpumesh(2, 2, 10.0).scaled(1.0)
    topo = topo.with_rates({k: v.rate_mbps / 100.0 for k, v in topo.links.items()})  # loopback-sized
    plan = resolve(scheme).plan(oracle_view(topo), Job(PARAMS, CHUNK, tuple(range(4)))).with_version(1)
    plan.validate(topo.links)
    async with LocalNet(topo) as net:
        await net.run_round(plan, rnd=1)
