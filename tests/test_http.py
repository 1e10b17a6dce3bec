"""Dashboard HTTP API, WebSocket and Prometheus metrics, checked against a real cluster over loopback TCP."""

import asyncio
import functools
import json
import re
import subprocess
import sys
import time
import urllib.request

import aiohttp
import pytest
from helpers.cluster import Cluster
from helpers.exact import assert_job_exact, assert_results_exact, assert_round_exact, digest_of, exact_sum
from helpers.waiting import until, until_sync
from prometheus_client.parser import text_string_to_metric_families

from emulation.topology import uniform
from scheduler.http import DashboardServer, parse_hostport
from scheduler.live import ROUND_BUCKETS, LiveState

PARAMS, CHUNK = 100_000, 10_000


async def start(topo, cluster, step_s=0.5):
    c = Cluster(cluster, topo, shaped=True)
    live = LiveState(c.sched, step_s=step_s)
    server = DashboardServer(c.sched, live, push_every_s=0.2)
    url = await server.start()
    await c.start(20)
    return c.sched, live, server, url, c.tasks, c.agents


async def stop(sched, server, tasks):
    await server.stop()
    await sched.shutdown()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)


def metrics(text):
    """name -> {labels tuple: value} over every sample of the exposition text."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


async def fetch(http: aiohttp.ClientSession, url: str, path: str, status: int = 200, *, json_only: bool = False):
    """GET url+path, asserting its status; the JSON body (required with json_only), else the text."""
    async with http.get(url.rstrip("/") + path) as r:
        assert r.status == status, (path, r.status, await r.text())
        if json_only or r.content_type == "application/json":
            return await r.json()
        return await r.text()


@pytest.mark.loopback
async def test_api_and_metrics_describe_the_running_cluster():
    topo = uniform(4, 30).scaled(0.01)  # ~0.1 s per tree edge and direction: rounds span several points
    sched, live, server, url, tasks, agents = await start(topo, "h1", step_s=0.25)
    try:
        async with aiohttp.ClientSession() as http:
            get = functools.partial(fetch, http, url)

            before = await get("/api/cluster")
            assert before["up"] == 4 and before["job"] is None
            assert await get("/api/plan", 404)
            js = await asyncio.wait_for(sched.run_job("mst", rounds=3, warmup=1, params=PARAMS, chunk_params=CHUNK),
                                        60)
            assert_job_exact(sched, js)
            # the agents' last counters (every 0.25 s) after the final broadcast: the scheduler has
            # every link's byte count as the sender's own meter ends it
            await until(lambda: all(sched.link_bytes.get((a.node, b)) == s.meter.bytes
                                    for a in agents for b, s in a.overlay.senders.items()),
                        "the agents' final byte counters")
            c = await get("/api/cluster")
            assert c["expected_nodes"] == 4 and c["up"] == 4 and all(n["up"] for n in c["nodes"])
            assert c["plan_version"] == sched.version and c["scheme"] == "mst"
            assert c["job"]["scheme"] == "mst" and c["job"]["done"] == 4 == c["job"]["rounds"]

            view = await get("/api/view")
            assert len(view["links"]) == 12
            for link in view["links"]:
                assert link["bytes_total"] == sched.link_bytes[(link["src"], link["dst"])]
            # an mst on 4 nodes: 3 tree edges, every round one partial sum up and one result down each
            assert sum(x["bytes_total"] for x in view["links"]) >= 4 * 3 * 2 * PARAMS * 4

            plan = await get("/api/plan")
            assert plan["version"] == js.plan.version and plan["scheme"] == "mst"
            assert sorted(plan["participants"]) == [0, 1, 2, 3]
            g = plan["groups"][0]
            assert g["parent"][str(g["root"])] is None
            assert sum(p is not None for p in g["parent"].values()) == 3
            assert (await get(f"/api/plan?version={js.plan.version}"))["version"] == js.plan.version
            assert "error" in await get("/api/plan?version=999", 404)
            assert "error" in await get("/api/plan?version=x", 400)

            rounds = (await get("/api/rounds"))["rounds"]
            assert [r["round_s"] for r in rounds] == [r.round_s for r in js.records]
            assert [r["warmup"] for r in rounds] == [True, False, False, False]
            assert len((await get("/api/rounds?limit=2"))["rounds"]) == 2
            assert (await get("/api/rounds?scheme=ring"))["rounds"] == []
            series = (await get("/api/series"))["links"]
            assert any(max(m for _, m in pts) > 0 for pts in series.values())

            async with http.get(url + "metrics") as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
                m = metrics(await r.text())
            for (a, b), n in sched.link_bytes.items():
                assert m["wansync_link_bytes_total"][(("dst", str(b)), ("src", str(a)))] == n
            measured = [r.round_s for r in js.records if not r.warmup]
            assert m["wansync_round_seconds_count"][(("scheme", "mst"),)] == 3
            assert m["wansync_round_seconds_sum"][(("scheme", "mst"),)] == pytest.approx(sum(measured))
            assert m["wansync_round_seconds_bucket"][(("le", "300.0"), ("scheme", "mst"))] == 3
            assert m["wansync_round_seconds_bucket"][(("le", "+Inf"), ("scheme", "mst"))] == 3
            first = next(le for le in ROUND_BUCKETS if le >= max(measured))
            assert m["wansync_round_seconds_bucket"][(("le", repr(first)), ("scheme", "mst"))] == 3
            assert m["wansync_plan_version"][()] == sched.version
            assert all(m["wansync_node_up"][(("node", str(n)),)] == 1 for n in range(4))
            assert "wansync_guard_valid" not in m  # no verdict before a scheme finished

            # what `wansync run` and a fault injector add: verdicts and faults on the timeline
            sched.note_event("guard", scheme="mst", valid=False, worst_ratio=0.81, bad_links=["0->1 81.0%"])
            sched.note_event("link_down", src=0, dst=1)
            kinds = [e["kind"] for e in (await get("/api/timeline"))["timeline"]]
            assert kinds[:2] == ["plan", "job"] and kinds[-2:] == ["guard", "link_down"]
            assert (await get("/api/cluster"))["guard_valid"] is False

            tasks[3].cancel()  # node 3 dies: its control connection closes
            await asyncio.gather(tasks[3], return_exceptions=True)
            await until(lambda: 3 not in sched.agents, "the scheduler to notice node 3 is gone")
            async with http.get(url + "metrics") as r:
                m = metrics(await r.text())
            assert m["wansync_node_up"][(("node", "3"),)] == 0 and m["wansync_node_up"][(("node", "0"),)] == 1
            assert m["wansync_guard_valid"][(("scheme", "mst"),)] == 0
            assert m["wansync_guard_worst_ratio"][(("scheme", "mst"),)] == pytest.approx(0.81)
            assert m["wansync_run_guard_valid"][()] == 0

            # read-only: nothing but GET (and HEAD) is routed
            for method in ("POST", "PUT", "DELETE"):
                async with http.request(method, url + "api/cluster") as r:
                    assert r.status == 405
    finally:
        await stop(sched, server, tasks)


@pytest.mark.loopback
async def test_websocket_sends_a_snapshot_then_live_throughput_and_rounds():
    topo = uniform(4, 100).scaled(0.01)
    sched, live, server, url, tasks, agents = await start(topo, "h2", step_s=0.25)
    try:
        job = asyncio.create_task(sched.run_job("ring", rounds=12, params=PARAMS, chunk_params=CHUNK))
        kinds, busy, timeline = set(), [], []
        async with aiohttp.ClientSession() as http, http.ws_connect(url + "ws") as ws:
            first = await ws.receive_json(timeout=30)
            assert first["type"] == "snapshot" and first["cluster"]["expected_nodes"] == 4
            assert len(first["view"]["links"]) == 12
            seq = first["seq"]
            while not job.done() and not ("round" in kinds and busy):
                msg = await ws.receive_json(timeout=30)
                assert msg["type"] == "update" and msg["seq"] >= seq
                assert all(it["seq"] > seq for it in msg["items"])  # never resends what the page has
                seq = msg["seq"]
                kinds |= {it["kind"] for it in msg["items"]}
                busy += [it["item"] for it in msg["items"] if it["kind"] == "point" and it["item"]["mbps"] > 0]
                timeline += [it["item"]["kind"] for it in msg["items"] if it["kind"] == "timeline"]
        assert "round" in kinds and busy, kinds
        assert all(0 < it["mbps"] < 10_000 and it["src"] != it["dst"] for it in busy)
        assert "plan" in timeline + [e["kind"] for e in first["timeline"]]
        js = await asyncio.wait_for(job, 60)
        assert all(r.ok and r.digests_agree for r in js.records)
        assert_job_exact(sched, js)
    finally:
        await stop(sched, server, tasks)


@pytest.mark.unit
def test_parse_hostport():
    assert parse_hostport("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_hostport(":8080") == ("127.0.0.1", 8080)
    assert parse_hostport("[::1]:9000") == ("::1", 9000)
    for bad in ("8080", "host:", "host:x"):
        with pytest.raises(ValueError):
            parse_hostport(bad)


@pytest.mark.loopback
def test_wansync_run_prints_the_url_and_serves_while_running(tmp_path):
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "wansync.cli", "run", "--nodes", "4", "--topology", "hetero", "--schemes",
           "star,mst,ring", "--scale", "0.005", "--rounds", "4", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = wait_for_url(proc)
        seen = {"bytes": False, "guard": False}

        def served() -> bool:
            """Both seen on /metrics while the run still serves it (after that: a failure, not a wait)."""
            try:
                with urllib.request.urlopen(url + "metrics", timeout=30) as r:
                    m = metrics(r.read().decode())
            except OSError:  # the run ended between two requests (a failure), or a moment's hiccup
                assert proc.poll() is None, f"the run ended before /metrics showed {seen}"
                return False
            seen["bytes"] = seen["bytes"] or sum(m.get("wansync_link_bytes_total", {}).values()) > 0
            seen["guard"] = seen["guard"] or m.get("wansync_guard_valid", {}).get((("scheme", "star"),)) in (0.0, 1.0)
            return seen["bytes"] and seen["guard"]
        until_sync(served, "the running cluster's link bytes and star's verdict on /metrics", every=0.05)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["schema"] for r in recs} == {3}
    events = [r for r in recs if r["type"] == "event"]
    assert [e["data"]["scheme"] for e in events if e["kind"] == "guard"] == ["star", "mst", "ring"]
    assert any(e["kind"] == "plan" for e in events)
    tp = [r for r in recs if r["type"] == "throughput"]
    assert tp and all(r["mbps"] >= 0 and r["bytes"] >= 0 for r in tp) and any(r["mbps"] > 0 for r in tp)
    assert assert_results_exact(out) == 3 * (4 + 1)  # every round of the three schemes (warm-up included)


def wait_for_url(proc, timeout=30):
    """The dashboard line `wansync run` prints before starting agents."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if m := re.search(r"dashboard: (http://\S+/)", line):
            return m.group(1)
    raise AssertionError("wansync run printed no dashboard URL")


@pytest.mark.loopback
def test_no_http_starts_no_server():
    res = subprocess.run([sys.executable, "-m", "wansync.cli", "run", "--no-http", "--http", "nonsense",
                          "--topology", "uniform", "--nodes", "2", "--schemes", "star", "--scale", "0.002",
                          "--rounds", "1", "--warmup", "0"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "dashboard:" not in res.stderr
    bad = subprocess.run([sys.executable, "-m", "wansync.cli", "run", "--http", "nonsense"], capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode != 0 and "--http" in bad.stderr


TASK_PARAMS = 250_000  # 1 MB: at 4 Mbit/s a star task takes seconds, long enough to be seen in flight


@pytest.mark.loopback
async def test_api_tasks_shows_tasks_in_flight_with_their_trees_then_their_records():
    topo = uniform(5, 4).scaled(0.01)
    sched, live, server, url, tasks, agents = await start(topo, "h3", step_s=0.25)
    try:
        async with aiohttp.ClientSession() as http:
            get = functools.partial(fetch, http, url, json_only=True)

            async with http.ws_connect(url + "ws") as ws:
                first = await ws.receive_json(timeout=30)
                assert first["type"] == "snapshot" and first["tasks"] == []
                assert first["in_flight"] == {"job": None, "mode": None, "running": [], "waiting": []}
                js = sched.open_tasks("star", params=TASK_PARAMS, chunk_params=25_000)
                # (members, receivers, hub, weights): each hub is outside its members; one task also
                # delivers to its hub; one is weighted (integer weights: an exact sum to compare with)
                asks = [([0, 1, 2], None, 3, None), ([1, 2, 4], None, 0, {1: 2.0, 2: 1.0, 4: 3.0}),
                        ([0, 3, 4], [0, 2, 3, 4], 2, None)]
                runs = [asyncio.create_task(sched.run_task(js, m, r, options={"hub": h}, weights=w))
                        for m, r, h, w in asks]
                flight = None
                deadline = time.monotonic() + 60
                while flight is None:  # the three run at once: the API shows them together, with their trees
                    assert time.monotonic() < deadline and not any(r.done() for r in runs), \
                        "the three tasks were never seen in flight together"
                    f = (await get("/api/tasks"))["in_flight"]
                    flight = f if len(f["running"]) == 3 else None
                assert flight["job"] == js.job and flight["mode"] == "tasks" and flight["waiting"] == []
                by_members = {tuple(t["members"]): t for t in flight["running"]}
                assert sorted(by_members) == sorted(tuple(m) for m, *_ in asks)
                for members, receivers, hub, _ in asks:
                    t = by_members[tuple(members)]
                    assert t["receivers"] == sorted(receivers or members)
                    assert t["aggregators"] == ([] if receivers else [hub])  # the hub only aggregates
                    assert t["relays"] == []  # a full mesh: every tree edge is a direct link
                    g = t["plan"]["groups"][0]
                    assert g["root"] == hub and g["parent"][str(hub)] is None
                    assert all(g["parent"][str(m)] == hub for m in members)
                    assert sorted(t["plan"]["nodes"]) == sorted({*members, hub})
                    assert t["plan"]["version"] == t["version"] and t["age_s"] >= 0

                recs = await asyncio.wait_for(asyncio.gather(*runs), 60)
                for rec, (members, receivers, _, w) in zip(recs, asks, strict=True):
                    assert not rec.aborted and rec.ok and rec.digests_agree, rec
                    # every receiver holds the exact sum of what was asked, weights included, computed here
                    want = digest_of(exact_sum(rec.round, members, TASK_PARAMS, weights=w))
                    assert rec.digests == {n: want for n in sorted(receivers or members)}, rec
                    assert_round_exact(rec, sched.plans[rec.version])
                # the live feed: each record once, as a `task` item, and the tasks in flight emptied
                seen, emptied = [], False
                deadline = time.monotonic() + 60
                while len(seen) < 3 or not emptied:
                    assert time.monotonic() < deadline, f"the feed gave {seen} and in flight emptied: {emptied}"
                    msg = await ws.receive_json(timeout=30)
                    seen += [it["item"] for it in msg["items"] if it["kind"] == "task"]
                    if "in_flight" in msg:
                        emptied = msg["in_flight"]["running"] == []
                assert sorted(t["task"] for t in seen) == sorted(r.task for r in recs)
                assert all(t["mode"] == "tasks" and t["aggregators"] is not None for t in seen)

            got = await get("/api/tasks")
            assert got["in_flight"]["running"] == [] and got["in_flight"]["waiting"] == []
            assert [t["task"] for t in got["tasks"]] == [r.task for r in js.records]
            for t, rec in zip(got["tasks"], js.records, strict=True):
                assert t["mode"] == "tasks" and t["job"] == js.job and not t["aborted"]
                assert (t["members"], t["receivers"], t["aggregators"]) == (rec.members, rec.receivers, rec.aggregators)
                assert t["digests"] == {str(n): d for n, d in rec.digests.items()}
                assert sorted(t["spans"]) == sorted(str(n) for n in rec.spans)
                assert t["t_start"] <= t["t_end"] and t["bytes"] == TASK_PARAMS * 4
            assert len((await get("/api/tasks?limit=1"))["tasks"]) == 1
            assert (await get(f"/api/tasks?job={js.job + 1}"))["tasks"] == []
            assert "error" in await get("/api/tasks?job=x", 400)
            assert (await get("/api/rounds"))["rounds"] == []  # a tasks job has no rounds: the BSP view stays BSP
            c = await get("/api/cluster")
            assert c["job"]["mode"] == "tasks" and c["job"]["done"] == 3 and c["tasks_in_flight"] == 0

            async with http.get(url + "metrics") as r:
                m = metrics(await r.text())
            assert m["wansync_tasks_total"][(("outcome", "exact"), ("scheme", "star"))] == 3
            assert m["wansync_task_seconds_count"][(("scheme", "star"),)] == 3
            assert m["wansync_task_seconds_sum"][(("scheme", "star"),)] == pytest.approx(sum(r.round_s for r in recs))
            assert m["wansync_tasks_in_flight"][()] == 0
            assert "wansync_round_seconds_count" not in m  # tasks are not rounds
            await sched.close_job(js)
    finally:
        await stop(sched, server, tasks)
    assert not sched.errors
