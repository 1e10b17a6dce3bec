"""Scheduler and agents over real TCP on loopback: every scheme exact every round, plan switches clean."""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import uuid

import pytest
from helpers.cluster import start_cluster, stop_cluster
from helpers.exact import assert_job_exact, assert_results_exact
from helpers.processes import agents_of, tagged
from helpers.waiting import until_sync

from agents.agent import Agent
from emulation.topology import internet2, uniform
from scheduler.service import Scheduler

pytestmark = pytest.mark.loopback


@pytest.mark.parametrize("scheme", ["star", "ring", "mst", "ktree"])
async def test_every_scheme_is_exact_on_a_sparse_topology(scheme):
    topo = internet2().scaled(0.02)
    sched, agents, tasks = await start_cluster(topo, shaped=True)
    try:
        js = await asyncio.wait_for(sched.run_job(scheme, rounds=3, params=60_000, chunk_params=7_000), 60)
        assert len(js.records) == 3
        for r in js.records:
            assert r.ok and r.digests_agree and r.versions_agree, r
        assert_job_exact(sched, js)  # the exact sum, as this test computes it
        # relays carried traffic for non-neighbour tree edges (star on internet2 needs them)
        if scheme == "star":
            relayed = sum(s["links"][d]["bytes"] for s in js.stats.values() for d in s["links"])
            assert relayed > 8 * 60_000 * 4 * 2  # more than the direct pushes and pulls alone
    finally:
        await stop_cluster(sched, tasks)
    assert not sched.errors


async def test_plan_switch_mid_run_never_mixes_versions():
    topo = uniform(6)
    flips = iter([(0, 1), (2, 3), (4, 5), (1, 2), (3, 4)])

    def on_event(kind, data):
        if kind == "task":  # make a different link look fastest after every round: mst re-plans
            a, b = next(flips, (0, 5))
            for _ in range(5):
                sched.view.observe(a, b, 10**9, 0.01)
                sched.view.observe(b, a, 10**9, 0.01)

    sched, agents, tasks = await start_cluster(uniform(6), cluster="c2", on_event=on_event)
    try:
        js = await asyncio.wait_for(sched.run_job("mst", rounds=6, params=50_000, chunk_params=4_000), 60)
        versions = [r.version for r in sorted(js.records, key=lambda r: r.round)]
        assert len(set(versions)) >= 3, versions
        for r in js.records:
            assert r.ok and r.digests_agree and r.versions_agree
        assert_job_exact(sched, js)
    finally:
        await stop_cluster(sched, tasks)
    del topo


async def test_wrong_cluster_agent_is_refused():
    topo = uniform(2)
    sched = Scheduler("right", 2)
    port = await sched.start()
    agent = Agent(0, "wrong", ("127.0.0.1", port), topo, shaped=False)
    with pytest.raises(ConnectionError, match="refused"):
        await asyncio.wait_for(agent.run(), 10)
    assert not sched.agents
    await sched.shutdown()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_wansync_run_end_to_end_reaps_its_processes(tmp_path, loop):
    out = tmp_path / "r.jsonl"
    tag = uuid.uuid4().hex
    cmd = [sys.executable, "-m", "wansync.cli", "run", "--topology", "internet2", "--schemes", "star,ring",
           "--model", "resnet50", "--scale", "0.005", "--rounds", "2", "--out", str(out), "--loop", loop]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=tagged(tag))
    assert res.returncode == 0, res.stderr[-2000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["schema"] == 3 for r in recs)
    rounds = [r for r in recs if r["type"] == "task"]  # a BSP round's record is its task's
    assert {r["scheme"] for r in rounds} == {"star", "ring"} and len(rounds) == 2 * 3
    assert all(r["ok"] and r["versions_agree"] for r in rounds)
    assert assert_results_exact(out) == 2 * 3  # every node's digest is that of the exact sum
    assert any(r["type"] == "link_sample" for r in recs)
    views = [r for r in recs if r["type"] == "view"]  # the view at each job's end: how each link is known
    assert [v["scheme"] for v in views] == ["star", "ring"]
    assert {(lk["src"], lk["dst"]) for lk in views[-1]["links"]} == {(a, b) for r in recs if r["type"] == "run"
                                                                       for a, b in ((x["src"], x["dst"])
                                                                                    for x in r["links"])}
    assert all(lk["how"] in ("nominal", "passive", "probed") for v in views for lk in v["links"])
    jobs = [r for r in recs if r["type"] == "job"]
    assert all("guard_valid" in j for j in jobs)
    assert all(r["prediction_s"] > 0 for r in rounds)  # the simulator's prediction rides along
    assert agents_of(tag) == []  # every agent process was reaped


def test_agents_write_their_profiles_where_wansync_profile_says(tmp_path):
    """The data plane's profiling aid: every agent of a local run leaves a cProfile file that pstats
    reads, in which the agent's frame handling appears."""
    import pstats

    prof = tmp_path / "prof"
    prof.mkdir()
    cmd = [sys.executable, "-m", "wansync.cli", "run", "--topology", "uniform", "--nodes", "3", "--schemes", "ring",
           "--scale", "0.002", "--rounds", "1", "--warmup", "0", "--no-http"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "WANSYNC_PROFILE": str(prof)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(p.name for p in prof.iterdir()) == ["agent-0.prof", "agent-1.prof", "agent-2.prof"]
    stats = pstats.Stats(str(prof / "agent-1.prof"))
    assert any(fn == "buffer_updated" and path.endswith("codec.py") for path, _, fn in stats.stats)  # type: ignore[attr-defined]


def test_ctrl_c_reaps_every_agent(tmp_path):
    tag = uuid.uuid4().hex
    log = tmp_path / "run.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "wansync.cli", "run", "--rounds", "100", "--scale", "0.01",
                                 "--schemes", "ring"], stdout=subprocess.DEVNULL, stderr=err, env=tagged(tag))
    try:
        until_sync(lambda: len(agents_of(tag)) == 9 or proc.poll() is not None, "the run's 9 agents to start")
        until_sync(lambda: re.search(r"ring round \d+: ", log.read_text()) or proc.poll() is not None,
                   "the run's first round to end (mid-run from then on)")
        assert proc.poll() is None, log.read_text()[-1500:]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130, log.read_text()[-1500:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert agents_of(tag) == []  # reaped before the launcher exited: none left over, not even for a moment


def test_nodes_disagreeing_with_a_fixed_topology_is_an_error():
    res = subprocess.run([sys.executable, "-m", "wansync.cli", "run", "--topology", "internet2", "--nodes", "5"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--nodes 5 disagrees" in res.stderr
