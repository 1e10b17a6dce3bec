"""CREW live: real agents over TCP on loopback. CREW, OPR and all-to-all partial reduces exact, and
failures: an aggregator killed mid-scatter (its block moves, the task ends exact on the replacement) and
a task whose member is killed (abandoned, recorded, nothing applied). Every result is compared with the
exact sum computed here (tests/helpers/exact.py)."""

import asyncio
import signal

import pytest
from helpers.cluster import Cluster, start_cluster, stop_cluster
from helpers.exact import assert_round_exact
from helpers.waiting import until

from emulation.topology import build
from wansync.options import Options
from wansync.runspec import resolve

pytestmark = pytest.mark.loopback


# --- live: the schemes exact over TCP ------------------------------------------------------------------------
async def test_crew_opr_and_all_to_all_partial_reduces_are_exact_over_tcp():
    sched, agents, tasks = await start_cluster(build("crew:6:seed=2:x=0.2"), cluster="crew-ex", shaped=True)
    try:
        for scheme in ("crew", "opr", "a2a", "crew-na-c1"):
            js = sched.open_tasks(scheme, params=60_000, chunk_params=3_000, in_flight=8)
            recs = await asyncio.wait_for(asyncio.gather(
                sched.run_task(js, (0, 1, 2)), sched.run_task(js, (3, 4, 5)), sched.run_task(js, (1, 3, 5))), 120)
            for rec in recs:
                assert rec.ok and not rec.aborted, rec
                assert_round_exact(rec, sched.plans[rec.version])
            if scheme.startswith("crew"):  # every worker aggregated: those outside the members too
                assert sorted(recs[0].aggregators) == [3, 4, 5]
            else:
                assert recs[0].aggregators == []
            await asyncio.wait_for(sched.close_job(js), 30)
    finally:
        await stop_cluster(sched, tasks)
    assert not sched.errors



# --- failures (§2.9) ---------------------------------------------------------------------------------------
CREW7 = resolve(Options.make(topology="uniform:20", nodes=7, scale=0.2, rounds=1))


async def first_started_task(sched):
    """The running job and its first task under way (a version frozen, data moving)."""
    def started():
        return [t for t in sched.current.tasks.values() if t.started_t is not None and t.version is not None] \
            if sched.current is not None else []
    await until(lambda: bool(started()), "a task to start")
    return sched.current, started()[0]


async def test_an_aggregator_killed_mid_scatter_moves_its_block_and_the_task_ends_exact():
    """Workers 0..6, p = 3, CREW over all: a task's block held by a worker outside its members; that
    worker is killed while the members scatter to it. The task is retried with that block on the Eq.
    (3) replacement and ends exact; a task the killed worker was a member of is abandoned, and its
    other members' contributions end up exactly once in a later exact task."""
    async with Cluster("crew-kill", processes=CREW7) as c:
        sched = c.sched
        run = asyncio.create_task(sched.run_job("crew", rounds=3, params=1_200_000, chunk_params=20_000,
                                                progress="crew", group=3, compute="constant:0.05"))
        js, t = await first_started_task(sched)
        plan = sched.plans[t.version]
        victim = max(g.root for g in plan.groups if g.root not in plan.members)
        c.procs[victim].send_signal(signal.SIGKILL)  # 4.8 MB a member at 20 Mbit/s: mid-scatter
        js = await asyncio.wait_for(run, 180)
        pol = js.progress
        mine = [m for m in pol.failovers if m["task"] == t.id and m["from"] == victim]
        assert mine, pol.failovers
        rec = next(r for r in js.records if r.task == t.id)
        assert rec.ok and not rec.aborted and rec.attempt >= 1, rec
        assert_round_exact(rec, sched.plans[rec.version])
        assert mine[0]["to"] in {g.root for g in sched.plans[rec.version].groups}
        assert victim not in {g.root for g in sched.plans[rec.version].groups}
        seen: set[tuple[int, int]] = set()
        for r in js.records:
            if r.aborted:
                assert not r.digests and not r.ok  # nothing of it reached anyone
                continue
            assert_round_exact(r, sched.plans[r.version])
            assert not seen & set(r.iters.items()), "a contribution summed twice"
            seen |= set(r.iters.items())
        survivors = [n for n in range(7) if n != victim]
        assert {(n, k) for n in survivors for k in range(3)} <= seen  # every survivor's every iteration, once


async def test_a_task_whose_member_is_killed_is_abandoned_and_recorded_with_nothing_applied():
    async with Cluster("crew-abandon", processes=CREW7) as c:
        sched = c.sched
        run = asyncio.create_task(sched.run_job("crew", rounds=2, params=1_200_000, chunk_params=20_000,
                                                progress="crew", group=3, compute="constant:0.05"))
        js, t = await first_started_task(sched)
        victim = t.members[0]
        c.procs[victim].send_signal(signal.SIGKILL)
        js = await asyncio.wait_for(run, 180)
        rec = next(r for r in js.records if r.task == t.id)
        assert rec.aborted and not rec.ok and not rec.digests and f"member(s) [{victim}] lost" in rec.errors[0]
        assert any(a["task"] == t.id for a in js.progress.abandoned)
        # the other members applied nothing of it: their iteration went into a later exact task, once
        for n in t.members:
            if n == victim:
                continue
            later = [r for r in js.records if not r.aborted and r.iters.get(n) == t.iters[n]]
            assert len(later) == 1 and later[0].task > t.id
            assert_round_exact(later[0], sched.plans[later[0].version])
