"""The big switch: the topology generator and its fluctuation trace, node-cap trace events in the
exact engine, the paper's flow model (sim/switch.py) by hand and against the exact engine, and the
SSP driver's staleness bound. Simulator only: milliseconds to a few seconds."""

import numpy as np
import pytest

from core.compute import ComputeModel
from core.plan import Job
from core.sspview import blocked_for
from emulation.bigswitch import SwitchModel, model_of, parse
from emulation.simnet import sim_network
from emulation.topology import TopologyError, build
from emulation.trace import PORT, RateEvent, Trace, TraceError
from emulation.trace import build as build_trace
from scheduler.planners import multicast
from scheduler.selection.choosers import make
from scheduler.view import NetworkView
from sim import TaskRun, simulate_tasks
from sim.mcastjob import bsp_round, simulate_ssp
from sim.switch import Switch

pytestmark = pytest.mark.unit

MB = 1e6 / 8


# --- the generator ----------------------------------------------------------------------------------
def test_the_bandwidth_model_is_the_papers_and_seeded():
    m = SwitchModel(2000, bw=40.0, lam=0.5, mu=0.25, seed=3)
    up, down = m.ports()
    assert down.min() >= 20.0 and down.max() <= 60.0 and abs(down.mean() - 40.0) < 1.0  # b(1 + lambda x)
    assert up.min() >= 5.0 and up.max() <= 15.0 and abs(up.mean() - 10.0) < 0.3  # b mu (1 + lambda x')
    assert not np.allclose(up / 0.25, down)  # independent x per port...
    shared = SwitchModel(50, shared=True, seed=3).ports()
    assert np.allclose(shared[0], shared[1])  # ...unless shared
    again = build("bigswitch:6:bw=20:seed=3")
    assert again.uplink_mbps == build("bigswitch:6:bw=20:seed=3").uplink_mbps != build("bigswitch:6:bw=20").uplink_mbps


def test_the_two_realisations():
    caps = build("bigswitch:4:bw=10:seed=2")
    assert caps.full_mesh and set(caps.uplink_mbps) == set(caps.downlink_mbps) == {0, 1, 2, 3}
    fastest = max([*caps.uplink_mbps.values(), *caps.downlink_mbps.values()])
    assert min(s.rate_mbps for s in caps.links.values()) >= 2 * fastest  # only the ports bind
    star = build("bigswitch:4:bw=10:seed=2:switch")
    assert star.nodes == 5 and star.neighbors(4) == [0, 1, 2, 3] and not star.uplink_mbps
    assert star.links[(1, 4)].rate_mbps == pytest.approx(caps.uplink_mbps[1])  # worker -> switch = b^I
    assert star.links[(4, 1)].rate_mbps == pytest.approx(caps.downlink_mbps[1])  # switch -> worker = b^E
    assert model_of(caps) == parse("bigswitch:4:bw=10:seed=2") and model_of(build("internet2")) is None


@pytest.mark.parametrize("spec, message", [
    ("bigswitch:x", "N must be an integer"), ("bigswitch:1", "at least 2 workers"),
    ("bigswitch:4:lambda=1", "lambda: must be in"), ("bigswitch:4:mu=0", "mu: must be"),
    ("bigswitch:4:speed=3", "unknown option 'speed=3'"), ("bigswitch:4:bw=fast", "bw: cannot parse"),
])
def test_a_bad_spec_names_the_option(spec, message):
    with pytest.raises(TopologyError, match=message):
        build(spec)


def test_the_fluctuation_trace_mixes_configured_and_fresh_draws():
    topo = build("bigswitch:3:bw=100:seed=4")
    base = {k: s.rate_mbps for k, s in topo.links.items()}
    steady = build_trace("ports:gamma=0,period=1", base, horizon_s=3, topology=topo)
    assert all(e.rate_mbps == pytest.approx((topo.uplink_mbps if e.cap[1] == "up" else topo.downlink_mbps)[e.cap[0]])
               for e in steady.events)  # gamma 0: the configured rate
    moved = build_trace("ports:gamma=1,period=1", base, horizon_s=3, topology=topo)
    assert len(moved.events) == 3 * 6 and {e.t for e in moved.events} == {1.0, 2.0, 3.0}
    assert all(50 <= e.rate_mbps <= 150 for e in moved.events)
    with pytest.raises(TraceError, match="needs a big-switch topology"):
        build_trace("ports:gamma=1", base, horizon_s=3, topology=build("internet2"))


def test_cap_events_must_name_a_cap_of_the_topology():
    topo = build("internet2")
    with pytest.raises(TraceError, match="node 2's uplink cap, which the topology does not have"):
        Trace((RateEvent(1.0, 2, PORT, 5.0),)).check(topo.links)
    with pytest.raises(TraceError, match="one end must be a node"):
        Trace.from_json('{"schema": 1, "events": [[1.0, -1, -1, 5.0]]}')


def test_the_exact_engine_follows_a_downlink_cap_change():
    """One 1 MB unicast into a 10 Mbit/s downlink cap that drops to 5 at 0.4 s: 0.4 s at 10 (0.5 MB),
    the rest at 5: 0.8 s more."""
    topo = build("bigswitch:2:bw=10:lambda=0")
    net = sim_network(topo, Trace((RateEvent(0.4, PORT, 1, 5.0),)))
    plan = multicast.plan(NetworkView(topo.links), Job(250_000, 25_000, (0,), {"receivers": [1]})).with_version(1)
    got = simulate_tasks([TaskRun(0, plan, 0.0)], net).tasks[0].end_s
    assert got == pytest.approx(1.2, rel=0.02)


# --- the flow model by hand ------------------------------------------------------------------------------
def test_l7_flows_share_the_senders_uplink_and_l3_runs_at_its_slowest_port():
    sw = Switch([4.0, 9, 9], [9.0, 1, 3])
    sw.start("a", 0, [1, 2], 2.0, "l7")  # uplink 4: flow to 1 gets 1 (its downlink), to 2 the other 3
    ends = {}
    while sw.active():
        for key, j, t in sw.advance(np.inf):
            ends[(key, j)] = t
    assert ends[("a", 2)] == pytest.approx(2 / 3) and ends[("a", 1)] == pytest.approx(2.0)
    sw = Switch([4.0, 9, 9], [9.0, 1, 3])
    sw.start("b", 0, [1, 2], 2.0, "l3")  # one rate for the tree: min(4, 1, 3) = 1
    got = sw.advance(np.inf)
    assert {(k, j) for k, j, _ in got} == {("b", 1), ("b", 2), ("b", None)} and got[0][2] == pytest.approx(2.0)


def test_priority_sharing_serves_the_earliest_level_first_and_stays_work_conserving():
    sw = Switch([10.0, 10, 10], [10.0, 10, 4], sharing="priority")
    sw.start("late", 0, [2], 4.0, "l7", level=(9.0,))
    sw.start("early", 1, [2], 4.0, "l7", level=(1.0,))
    first = sw.advance(np.inf)
    assert first[0][0] == "early" and first[0][2] == pytest.approx(1.0)  # all 4 of the shared downlink
    assert sw.left("late")[2] == pytest.approx(4.0)  # held meanwhile...
    rest = sw.advance(np.inf)
    assert rest[0][0] == "late" and rest[0][2] == pytest.approx(2.0)  # ...then the downlink is its own


def test_a_dropped_receiver_stops_loading_its_downlink():
    sw = Switch([10.0, 10, 10], [10.0, 1, 1])
    sw.start("t", 0, [1, 2], 2.0, "l3")
    sw.advance(1.0)
    assert sw.left("t") == {1: pytest.approx(1.0), 2: pytest.approx(1.0)}
    sw.drop("t", 1)
    sent = sw.port_bytes[3 + 1]
    out = sw.advance(np.inf)
    assert ("t", None) in {(k, j) for k, j, _ in out} and sw.tasks["t"].dropped == {1}
    assert sw.port_bytes[3 + 1] == sent  # nothing more crossed the dropped receiver's downlink
    with pytest.raises(ValueError, match="not a receiver still being served"):
        sw.drop("t", 1)


def test_port_events_change_capacity_mid_flow():
    sw = Switch([10.0, 10], [10.0, 2], events=[(0.5, 1, "down", 1.0)])
    sw.start("t", 0, [1], 2.0, "l7")
    assert sw.advance(np.inf)[0][2] == pytest.approx(0.5 + 1.0)  # 1 unit by 0.5 s, then 1 unit at 1/s


# --- the flow model against the exact engine ---------------------------------------------------------------
@pytest.mark.parametrize("mode", ["l7", "l3"])
def test_a_bsp_round_on_the_flow_model_matches_the_exact_engine(mode):
    """The same selection on the same ports: the paper's flow model (caps) and the chunk-level exact
    engine (L7 on the caps mesh; L3 through the switch node) agree within a few chunks."""
    n, p, params, chunk = 6, 2, 250_000, 12_500
    spec = f"bigswitch:{n}:bw=20:seed=5" + (":switch" if mode == "l3" else "")
    topo = build(spec)
    up, down = parse(spec).ports()
    chooser = make("selmcast", n, p, mode=mode, k=None, seed=1)
    x = chooser.bsp(up * MB, down * MB, np.full(n, params * 4.0))
    fluid = bsp_round(x, up * MB, down * MB, np.full(n, params * 4.0), mode)
    view = NetworkView(topo.links)
    runs = [TaskRun(i, multicast.plan(view, Job(params, chunk, (i,), {"receivers": np.flatnonzero(x[i]).tolist(),
                                                                      "mode": mode})).with_version(i + 1), 0.0)
            for i in range(n)]
    exact = max(t.end_s for t in simulate_tasks(runs, sim_network(topo)).tasks.values())
    assert exact == pytest.approx(fluid, rel=0.06)


# --- the SSP driver -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("s", [0, 2])
@pytest.mark.parametrize("scheme", ["selmcast", "orpheus"])
def test_no_worker_runs_more_than_ssp_iterations_ahead(scheme, s):
    n = 8
    up, down = SwitchModel(n, bw=100, seed=2).ports()
    compute = ComputeModel("lognormal:mean=0.2,cv=0.8,spread=0.6", seed=2)  # stragglers: the bound binds
    r = simulate_ssp(make(scheme, n, 3, k=2, seed=2), compute, up * MB, down * MB, np.full(n, 2e5),
                     staleness=s, budget_s=20.0)
    assert r.max_ahead == s  # reached, never passed
    assert min(r.iterations.values()) > 10 and 0 < r.utilisation < 1 and r.scale >= 3 / n


def test_blocked_for_waits_for_the_slowest_to_reach_k_minus_s():
    done = np.array([5, 3, 4])
    finish = np.array([0.0, 2.0, 1.0])
    per = np.array([1.0, 10.0, 1.0])
    assert blocked_for(6, 2, done, finish, per) == pytest.approx(2.0)  # worker 1 must finish iteration 4
    assert blocked_for(7, 2, done, finish, per) == pytest.approx(12.0)  # ...and 5: one more at 10 s each
    assert blocked_for(5, 2, done, finish, per) == 0.0


# --- the wire and the view -------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, field", [
    ({"caps": [[2, 100, 0.1]]}, "caps"), ({"caps": [[0, 0, 0.1]]}, "caps"), ({"caps": [[1, 100, -1.0]]}, "caps"),
    ({"caps": [[0, 100]]}, "caps"), ({"declared": [5.0]}, "declared"), ({"declared": [0.0, None]}, "declared"),
    ({"declared": [float("nan"), 3.0]}, "declared"),
])
def test_a_bad_cap_sample_or_declaration_is_refused_naming_the_field(change, field):
    from overlay.messages import ProtocolError, Report, validate

    good = Report(node=1, samples=[], caps=[[0, 100, 0.2], [1, 50, 0.3]], declared=[5.0, None]).wire()
    validate(good)
    with pytest.raises(ProtocolError) as e:
        validate(good | change)
    assert e.value.field == field


def test_the_view_measures_only_registered_caps_and_keeps_a_high_quantile():
    view = NetworkView()
    view.set_cap(3, "down", 10.0)
    view.observe_cap(3, "up", 1_000_000, 1.0)  # never registered: ignored
    assert view.cap(3, "up") is None and view.cap(3, "down") == 10.0 and not view.cap_known(3, "down")
    for mbps in (4.0, 8.0, 7.0, 8.2, 8.1):  # 4: a period the downlink did not bind
        view.observe_cap(3, "down", int(mbps * MB * 0.2), 0.2)
    assert view.cap_known(3, "down") and view.cap(3, "down", "measured") == pytest.approx(8.1, rel=0.01)
    assert view.cap(3, "down") == 10.0  # the declared rate stays what the node says...
    view.declare_cap(3, "down", 6.0)
    assert view.cap(3, "down") == 6.0  # ...until it says otherwise
    with pytest.raises(ValueError, match="source: declared or measured"):
        view.cap(3, "down", "guessed")
