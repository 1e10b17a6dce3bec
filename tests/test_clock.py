"""Clock offsets: with wrong host clocks, one-way samples and round times stay right after the exchange."""

import asyncio

import pytest

from agents.agent import Agent
from emulation.topology import uniform
from overlay.clock import SyncedClock
from scheduler.service import Scheduler

SKEWS = [0.0, 0.8, -0.5]  # seconds: far larger than any transfer time here


async def run_with_skews(sync: bool):
    topo = uniform(3, rate_mbps=40.0).scaled(0.01)
    sched = Scheduler("clk", 3)
    port = await sched.start()
    agents = [Agent(n, "clk", ("127.0.0.1", port), topo, clock_skew=SKEWS[n], clock_sync=sync,
                    probe_bytes=0, probe_num=1) for n in range(3)]
    tasks = [asyncio.create_task(a.run()) for a in agents]
    try:
        await sched.wait_agents(20)
        js = await asyncio.wait_for(sched.run_job("ring", rounds=3, params=300_000, chunk_params=20_000), 60)
    finally:
        await sched.shutdown()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
    return sched, agents, js


def test_cristian_offset_from_the_shortest_round_trip():
    c = SyncedClock(skew=5.0)
    # (local send, scheduler time, local receive): the second exchange has the shortest round trip
    c.update([(105.0, 100.30, 105.5), (106.0, 101.02, 106.04), (107.0, 102.2, 107.6)])
    assert c.offset == pytest.approx(101.02 - 106.02)
    assert c.error_bound == pytest.approx(0.02)


async def test_synced_agents_measure_links_and_rounds_correctly():
    sched, agents, js = await run_with_skews(sync=True)
    for a in agents:
        assert a.clock.offset == pytest.approx(-SKEWS[a.node], abs=0.01)
    rates = [d["rate"] for *_, d in sched.view.g.edges(data=True) if d["measured"]]
    assert rates and all(20 < r < 44 for r in rates), rates  # 40 Mbit/s links, a chunk at a time
    assert all(0 < r.round_s < 2 for r in js.records)
    assert all(r.ok for r in js.records)


async def test_without_the_exchange_wrong_clocks_corrupt_samples_and_round_times():
    sched, agents, js = await run_with_skews(sync=False)
    rates = [d["rate"] for *_, d in sched.view.g.edges(data=True) if d["measured"]]
    assert any(not 20 < r < 44 for r in rates) or len(rates) < len(sched.view.links()), rates
    assert all(r.round_s > 1.0 for r in js.records)  # first start and last end come from clocks 1.3 s apart
    assert all(r.ok for r in js.records)  # data is still exact: only the measurements are wrong
