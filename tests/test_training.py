"""Real training as a workload (agents/training.py) and selective reduce live (scheduler/progress/
selective.py): real gradients reduced over real TCP against this test's own numpy reference, the
in-band check biting, digits reaching 90 % under every scheme, the integer workload still exact."""

import asyncio
import dataclasses
import statistics

import numpy as np
import pytest
from helpers.cluster import Cluster, LocalNet, start_cluster, stop_cluster
from helpers.exact import assert_round_exact
from helpers.waiting import until

from agents.training import U32, Trainer, TrainingSpec, WorkloadError, check_result, digits_split, init_model, shard
from core.plan import Job
from emulation.switch import switch
from emulation.topology import uniform
from overlay.messages import Job as JobMsg
from overlay.messages import JobEnd
from scheduler.planners import ring
from scheduler.progress.selective import SelectiveReduce
from scheduler.view import NetworkView

SMALL = TrainingSpec(n=4, hidden=(32, 16), seed=3)


def numeric_gradient_ok(spec: TrainingSpec) -> bool:
    """Backprop against central differences on a few coordinates (float64)."""
    from agents.training import gradient
    Xtr, ytr, _, _ = digits_split(spec.seed)
    X, y = Xtr[:8].astype(np.float64), ytr[:8]
    flat = init_model(spec).astype(np.float64)
    g, _ = gradient(spec, flat, X, y)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(flat), 12, replace=False):
        e = np.zeros_like(flat)
        e[i] = 1e-5
        num = (gradient(spec, flat + e, X, y)[1] - gradient(spec, flat - e, X, y)[1]) / 2e-5
        if abs(num - g[i]) > 1e-4 + 1e-3 * abs(num):
            return False
    return True


@pytest.mark.unit
def test_the_gradients_are_real_backprop():
    assert numeric_gradient_ok(SMALL)


@pytest.mark.unit
def test_shards_cover_the_training_split_once_and_noniid_skews_labels():
    _, y, _, _ = digits_split(SMALL.seed)
    for how in ("iid", "noniid"):
        parts = shard(y, 8, how, 1)
        allidx = np.concatenate(parts)
        assert sorted(allidx) == list(range(len(y)))  # every sample once
    skewed = [len(set(y[p])) for p in shard(y, 8, "noniid", 1)]
    mixed = [len(set(y[p])) for p in shard(y, 8, "iid", 1)]
    assert max(skewed) <= 4 and min(mixed) == 10


@pytest.mark.unit
def test_a_bad_workload_spec_says_which_part():
    for spec, msg in [("mnist:n=4", "digits"), ("digits:hidden=8", "n=WORKERS"), ("digits:n=4,shard=x", "shard"),
                      ("digits:n=4,lr=-1", "lr"), ("digits:n=4,depth=3", "unknown option"),
                      ("digits:n=4,batch=x", "KEY=NUMBER"), ("digits:n=0", ">= 1")]:
        with pytest.raises(WorkloadError, match=msg):
            TrainingSpec.parse(spec)
    s = TrainingSpec.parse("digits:n=16")
    assert s.model_params == 64 * 512 + 512 + 512 * 320 + 320 + 320 * 10 + 10 == 200_650
    assert TrainingSpec.parse(s.to_spec()) == s


@pytest.mark.loopback
async def test_a_partial_reduce_of_real_models_matches_a_numpy_reference_within_the_float32_bound():
    """Three of five workers' locally trained models (real SGD steps), weighted 0.5/0.3/0.2, summed over
    a weighted ring on real TCP: every receiver holds the same bytes, each element within
    (m + 1) 2^-24 sum_j w_j |x_j| of the float64 reference this test computes, and the in-band check passes."""
    topo = uniform(5, rate_mbps=1000.0, delay_s=0.0)
    members, weights = (0, 2, 3), {0: 0.5, 2: 0.3, 3: 0.2}
    trainers = {m: Trainer(dataclasses.replace(SMALL, n=5), m) for m in members}
    contrib = {m: trainers[m].step(0) for m in members}
    assert len({c[:SMALL.model_params].tobytes() for c in contrib.values()}) == 3  # different local models
    plan = ring.plan(NetworkView(topo.links), Job(SMALL.vector_params, 700, members))
    plan = dataclasses.replace(plan, weights=weights).with_version(1).validate(topo.links)
    async with LocalNet(topo) as net:
        for eng in net.engines.values():
            eng.open_job(1, 0)

        async def one(n):
            st = net.engines[n].begin_task(1, 0, 0, plan, contrib[n])
            res = await st.done
            net.engines[n].end_task(st)
            return res
        results = await asyncio.wait_for(asyncio.gather(*(one(n) for n in members)), 30)
    assert len({r.tobytes() for r in results}) == 1  # bit for bit the same at every receiver
    r = results[0].astype(np.float64)
    ref = sum(weights[m] * contrib[m].astype(np.float64) for m in members)
    bound = (len(members) + 1) * U32 * sum(weights[m] * np.abs(contrib[m].astype(np.float64)) for m in members)
    assert np.all(np.abs(r - ref) <= bound)
    assert np.abs(r - ref).max() > 0  # float32 really rounded: the bound is what makes this a check
    assert check_result(SMALL, results[0], len(members)) == (True, "")


@pytest.mark.unit
def test_the_in_band_check_catches_corrupted_misplaced_or_mixed_values():
    """A receiver's own check (the trailer): any value that is not the weighted sum of whole
    contributions. (A missing or doubled contribution is still a consistent sum: the engine's contributor
    bitmaps catch those, as for every workload.)"""
    trainers = [Trainer(SMALL, i) for i in range(3)]
    xs = [t.step(0) for t in trainers]
    w = np.float32(1 / 3)
    good = (w * xs[0] + w * xs[1]) + w * xs[2]
    assert check_result(SMALL, good, 3) == (True, "")
    bad = good.copy()
    bad[123] += 0.05  # one element off by far more than float32 rounding
    ok, why = check_result(SMALL, bad, 3)
    assert not ok and "tolerance" in why
    swapped = good.copy()
    swapped[0:500], swapped[500:1000] = good[500:1000], good[0:500]  # two chunks landed in each other's place
    assert not check_result(SMALL, swapped, 3)[0]
    later = trainers[2].step(1)  # one chunk of member 2 from its next round (a stale or mixed attempt)
    mixed = good.copy()
    mixed[:700] = (w * xs[0][:700] + w * xs[1][:700]) + w * later[:700]
    assert not check_result(SMALL, mixed, 3)[0]
    assert not check_result(SMALL, good[:-1], 3)[0]  # not the workload's size


# --- live: the scheduler's policy, agents in this process, real TCP ----------------------------------------
async def run_until(sched, agents, policy, *, scheme="ring", params, chunk, workload=None, compute="constant:0.01",
                    until_fn, what, timeout=60.0):
    before = sched.current  # the previous job's, if any
    job = asyncio.create_task(sched.run_job(scheme, rounds=100_000, params=params, chunk_params=chunk,
                                            progress=policy, compute=compute, workload=workload))
    await until(lambda: sched.current not in (None, before), "the job to open")
    js = sched.current
    try:
        await until(until_fn, what, timeout=timeout)
    finally:
        policy.stop()
        for n in sched.agents:
            sched.send(n, JobEnd(job=js.job))
        await asyncio.wait_for(job, 30)
    return js


@pytest.mark.loopback
@pytest.mark.timeout(240)
async def test_training_reaches_90_percent_on_digits_under_every_scheme():
    n = 4
    spec = TrainingSpec(n=n, hidden=(64, 32), eval_s=0.1, seed=1)
    sched, agents, tasks = await start_cluster(uniform(n, 1000.0, 0.0), cluster="train")
    try:
        for scheme in ("sr", "pr", "ar"):
            pol = SelectiveReduce(scheme, group=2, dt=0.005, c=5 if scheme != "ar" else None,
                                  bandwidth={0: 10.0, 1: 20.0, 2: 30.0, 3: 40.0})

            before = {id(a.rounds.trainer) for a in agents}  # the last job's: not this one's

            def acc(before=before):
                logs = [a.rounds.trainer.log for a in agents if id(a.rounds.trainer) not in before]
                return len(logs) == n and all(x for x in logs) and statistics.fmean(x[-1][2] for x in logs) >= 0.9
            js = await run_until(sched, agents, pol, params=spec.vector_params, chunk=2_000, workload=spec.to_spec(),
                                 until_fn=acc, what=f"{scheme}: 90 % held-out accuracy")
            assert js.records and all(r.ok and r.digests_agree and not r.aborted for r in js.records), scheme
            assert all(len(set(r.digests.values())) == 1 for r in js.records)
            if scheme != "ar":  # a weighted average: float weights summing to 1, and every 5th sync a full one
                weighted = [sched.plans[r.version].weights for r in js.records]
                assert all(sum(w.values()) == pytest.approx(1.0) for w in weighted)
                assert any(len(r.members) == n for r in js.records)
            assert all("training" in st and st["training"]["accuracy"] for st in js.stats.values())
    finally:
        await stop_cluster(sched, tasks)
    assert not sched.errors


@pytest.mark.loopback
@pytest.mark.timeout(120)
@pytest.mark.parametrize("planner", ["ring", "mst", "netstorm"])
async def test_selective_reduce_live_keeps_the_integer_workloads_exact_sums_and_the_controllers_groups(planner):
    topo = switch(6, unit=50.0, seed=2)  # caps 50-1000 Mbit/s, registered by the agents
    sched, agents, tasks = await start_cluster(topo, cluster="sr-int", shaped=True)
    try:  # a group's plan is any planner's: the ring (the paper's), a spanning tree, NetStorm's trees
        pol = SelectiveReduce("sr", group=2, dt=0.01, eta=0.3, strict_trigger=True)
        js = await run_until(sched, agents, pol, scheme=planner, params=50_000, chunk=5_000, compute="cnn:mean=0.05",
                             until_fn=lambda: len(sched.current.records) >= 12, what="12 syncs")
        assert {sched.plans[r.version].scheme for r in js.records} == {planner}
        assert pol.controller.bw == {n: topo.uplink_mbps[n] for n in range(6)}  # the caps as registered
        assert pol.controller.cfg.weights == "uniform"  # integer contributions: a plain sum
        for rec in js.records:  # each member's own iteration, summed exactly: == against this test's sum
            assert_round_exact(rec, sched.plans[rec.version])
        launched = sorted(s.members for s in pol.controller.syncs.values())
        assert launched == sorted(tuple(t.members) for t in js.tasks.values())
        assert all(len(s.members) >= 3 for s in pol.controller.syncs.values())  # strict trigger: > p ready
    finally:
        await stop_cluster(sched, tasks)


@pytest.mark.loopback
@pytest.mark.timeout(120)
async def test_a_job_of_rounds_ends_at_job_end_while_workers_wait_in_the_queue_or_compute(tmp_path):
    """The budget's end: workers waiting for a sync that will never form, and one in a long round, stop."""
    trace = tmp_path / "compute.csv"
    trace.write_text("\n".join(f"{n},0,0.01\n{n},1,{600 if n == 0 else 0.01}" for n in range(3)))
    sched, agents, tasks = await start_cluster(uniform(3), cluster="stop")
    try:
        pol = SelectiveReduce("ar", group=2, bandwidth=dict.fromkeys(range(3), 10.0))
        job = asyncio.create_task(sched.run_job("ring", rounds=1000, params=1000, chunk_params=100, progress=pol,
                                                compute=f"csv:{trace}"))
        await until(lambda: sched.current is not None, "the job to open")
        js = sched.current
        # after the first all-reduce, 1 and 2 wait in the queue for 0, which computes for 10 minutes
        await until(lambda: len(js.records) == 1 and len(pol.controller.queue) == 2, "1 and 2 to wait for 0")
        pol.stop()
        for n in sched.agents:
            sched.send(n, JobEnd(job=js.job))
        await asyncio.wait_for(job, 30)  # every worker stopped and sent its stats
        assert sorted(js.stats) == [0, 1, 2] and len(js.records) == 1
    finally:
        await stop_cluster(sched, tasks)


@pytest.mark.loopback
async def test_selective_reduce_refuses_a_cluster_without_bandwidths():
    sched, agents, tasks = await start_cluster(uniform(3), cluster="sr-nobw")
    try:
        with pytest.raises(ValueError, match="bandwidth"):
            await asyncio.wait_for(sched.run_job("ring", rounds=2, params=1000, chunk_params=100,
                                                 progress=SelectiveReduce("sr", group=2)), 30)
    finally:
        await stop_cluster(sched, tasks)


@pytest.mark.loopback
@pytest.mark.parametrize("workload", ["training", "handoff"])
async def test_a_jobs_own_check_judges_its_results_from_the_moment_the_job_arrives(tmp_path, workload):
    """On a loaded machine a task can complete at an agent still waiting for its connections, its data
    set or its script; the synthetic workload's closed-form check then judged a script's sum and called
    all 222 values wrong (CI). Here the agent waits for a neighbour whose link is down: the job's own
    check must already be the one its results meet."""
    handoff_dir = tmp_path / "handoff"
    handoff_dir.mkdir(mode=0o700)
    async with Cluster("own-check", uniform(2, 200.0, 0.0), handoff=(str(handoff_dir), "token")) as c:
        agent = c.agents[0]
        agent.overlay.suspend(1, True)  # the link to node 1 is down: the job stays in its wait for it
        await until(lambda: 1 not in agent.overlay._conns, "the link to node 1 to go down", 10)
        spec = SMALL.to_spec() if workload == "training" else "handoff"
        agent.rounds.start(JobMsg(job=99, scheme="ring", rounds=1, params=SMALL.vector_params, compute_s=0.0,
                                  workload=spec))
        try:
            await until(lambda: 99 in agent.runner.verifiers, "the job's own check in place", 10)
            assert agent.rounds.tasks and not any(t.done() for t in agent.rounds.tasks)  # still waiting
            _, why = agent.runner.verifiers[99](np.zeros(SMALL.vector_params, np.float32), _TwoMembers())
            assert "differ from the exact sum" not in why, why  # its own verdict, not the closed form's
        finally:
            agent.rounds.cancel()
            agent.overlay.suspend(1, False)


class _TwoMembers:
    participants = (0, 1)
