"""Fluctuation traces: every model seeded and bounded, files round-trip, bad input named, outages
(rate 0) survived by the shaper, the live data plane and the simulator, which see the same events."""

import asyncio
import time

import numpy as np
import pytest
from helpers.cluster import LocalNet
from helpers.waiting import until

from agents.agent import Agent
from emulation.link import LinkShaper, LinkSpec
from emulation.simnet import sim_network
from emulation.topology import build as build_topology
from emulation.topology import internet2, uniform
from emulation.trace import RateEvent, Trace, TraceError, build, markov, read_csv, redraw, steps, walk
from sim import SimulationStalled, simulate
from wansync.cli import main
from wansync.options import Options, OptionsError
from wansync.predict import RoundPredictor, predict
from wansync.runspec import trace_of

HORIZON = 3600.0


def base_of(topo):
    return {k: s.rate_mbps for k, s in topo.links.items()}


BASE = base_of(internet2())
SPECS = ["redraw:180", "walk:period=10,step=0.2,lo=20,hi=155", "markov:mean_up=60,mean_down=5"]


@pytest.mark.unit
@pytest.mark.parametrize("spec", SPECS)
def test_every_model_is_seeded(spec):
    a, b = (build(spec, BASE, horizon_s=HORIZON, seed=7) for _ in range(2))
    assert a.events and a == b
    assert build(spec, BASE, horizon_s=HORIZON, seed=8).events != a.events
    assert all(x <= y for x, y in zip(a.events, a.events[1:], strict=False))  # time order


@pytest.mark.unit
def test_redraw_matches_the_old_dynamic_draws_and_stays_in_range():
    """--dynamic --period 180 keeps producing exactly NetStorm's randint draws."""
    t = build("redraw:180", BASE, horizon_s=HORIZON, seed=1)
    assert t == redraw(BASE, 180, HORIZON, seed=1) and t.period_s == 180
    assert {e.t for e in t.events} == {180.0 * k for k in range(1, 21)}
    assert all(20 <= e.rate_mbps <= 155 and e.rate_mbps == int(e.rate_mbps) for e in t.events)


@pytest.mark.unit
def test_walk_is_bounded_and_moves_by_at_most_step():
    t = walk(BASE, 10, HORIZON, step=0.3, lo=40, hi=100, seed=3)
    assert len(t.events) == 360 * len(BASE)
    for link in BASE:
        rates = [min(max(BASE[link], 40), 100)] + [e.rate_mbps for e in t.for_link(*link)]
        assert all(40 <= r <= 100 for r in rates)
        ratios = np.array(rates[1:]) / np.array(rates[:-1])
        assert np.all(ratios <= 1.3 + 1e-3) and np.all(ratios >= 0.7 - 1e-3)
        assert len(set(rates)) > 10  # it does walk


@pytest.mark.unit
def test_markov_outages_hit_both_directions_and_always_end():
    t = markov(BASE, 60, 5, HORIZON, seed=2)
    downs = [e for e in t.events if e.rate_mbps == 0]
    assert downs, "an hour at mean_up=60 s must have outages"
    for a, b in BASE:
        ev = t.for_link(a, b)
        assert [e.rate_mbps == 0 for e in ev] == [i % 2 == 0 for i in range(len(ev))]  # down, up, down, up...
        assert not ev or ev[-1].rate_mbps == BASE[(a, b)]  # ends up, even past the horizon
        assert [e.t for e in ev] == [e.t for e in t.for_link(b, a)]  # a cut takes both directions
    mean_down = np.mean([u.t - d.t for link in BASE for d, u in zip(t.for_link(*link)[::2],
                                                                     t.for_link(*link)[1::2], strict=True)])
    assert 3 < mean_down < 8


@pytest.mark.unit
def test_steps_scale_every_link():
    t = build("steps:30=0.5,90=0,120=1", BASE, horizon_s=HORIZON)
    assert t.rates_at(60, BASE) == {k: v * 0.5 for k, v in BASE.items()}
    assert set(t.rates_at(100, BASE).values()) == {0.0}
    assert t.rates_at(500, BASE) == BASE
    assert steps(BASE, [(1, 2)]).scaled(0.1).events[0].t == pytest.approx(0.1)


@pytest.mark.unit
def test_csv_and_json_round_trip(tmp_path):
    t = build("markov:mean_up=30,mean_down=4", BASE, horizon_s=600, seed=4)
    t.to_csv(tmp_path / "t.csv")
    assert read_csv(tmp_path / "t.csv").events == t.events
    assert build(f"csv:{tmp_path / 't.csv'}", BASE, horizon_s=1).events == t.events
    assert build(f"steps:{tmp_path / 't.csv'}", BASE, horizon_s=1).events == t.events
    t.write(tmp_path / "t.json")
    back = Trace.read(tmp_path / "t.json")
    assert back.events == t.events and back.spec == t.spec


@pytest.mark.unit
@pytest.mark.parametrize("text, match", [
    ("", "empty"),
    ("t,src,dst,rate\n", "line 1: header must be time,src,dst,rate"),
    ("time,src,dst,rate\n1,0,1\n", "line 2: expected 4 columns"),
    ("time,src,dst,rate\n1,0,1,fast\n", "line 2: rate: cannot parse 'fast'"),
    ("time,src,dst,rate\n1,0,1,10\n2,0,1.5,10\n", "line 3: dst: cannot parse '1.5'"),
    ("time,src,dst,rate\n1,0,1,-3\n", "line 2: rate: must be >= 0"),
    ("time,src,dst,rate\n-1,0,1,3\n", "line 2: time: must be >= 0"),
    ("time,src,dst,rate\n1,2,2,3\n", "line 2: src/dst: a link from node 2 to itself"),
])
def test_bad_csv_names_the_line_and_field(tmp_path, text, match):
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(TraceError, match=match):
        read_csv(tmp_path / "bad.csv")


@pytest.mark.unit
@pytest.mark.parametrize("spec, match", [
    ("sine:3", "unknown model 'sine'"),
    ("walk:period=10,stride=2", "unknown option 'stride'"),
    ("walk:period=ten", "period: cannot parse 'ten'"),
    ("walk:step=1.5", "step must be in"),
    ("redraw:0", "period must be positive"),
    ("redraw:10,lo=100,hi=50", "need 0 < lo <= hi"),
    ("markov:mean_up=0", "must be positive"),
    ("steps:10=x", "is not TIME=FACTOR"),
    ("csv:/nonexistent/t.csv", "No such file"),
    ("constant:5", "takes no options"),
])
def test_bad_specs_are_errors_naming_what(spec, match):
    with pytest.raises(TraceError, match=match):
        build(spec, BASE, horizon_s=HORIZON)


@pytest.mark.loopback
def test_events_on_links_that_do_not_exist_are_refused(tmp_path):
    (tmp_path / "t.csv").write_text("time,src,dst,rate\n5,0,8,10\n")  # 0-8 is no internet2 link
    with pytest.raises(TraceError, match="0->8, which is not a link"):
        build(f"csv:{tmp_path / 't.csv'}", BASE, horizon_s=HORIZON)
    assert main(["simulate", "--topology", "internet2", "--trace", f"csv:{tmp_path / 't.csv'}"]) == 2


def _trace(options, topo):
    return trace_of(options, topo)


def _args(period=180.0, trace_file=None, **kw):
    return Options.make(period_s=period, trace_file=None if trace_file is None else str(trace_file), **kw)


@pytest.mark.unit
def test_dynamic_is_an_alias_of_redraw_and_not_combinable():
    topo = internet2()
    assert _trace(_args(dynamic=True, period=60), topo) == _trace(_args(trace="redraw:60"), topo)
    with pytest.raises(OptionsError, match="not both"):
        _args(dynamic=True, trace="walk").validate()
    assert not _trace(_args(), topo).events


@pytest.mark.unit
async def test_agents_and_simulator_see_the_same_events(tmp_path):
    """The launcher computes once and writes the file; agents replay their own links from it;
    the simulator gets every event: the same set, to the bit."""
    topo = internet2().scaled(0.05)
    trace = _trace(_args(trace="markov:mean_up=20,mean_down=3", seed=5), topo)
    assert trace.events and trace.events[0].t < 20 * 0.05 * 10  # scaled with --scale
    trace.write(tmp_path / "t.json")
    agent_view = _trace(_args(trace_file=tmp_path / "t.json", trace="ignored"), topo)
    assert agent_view == trace
    seen: list[RateEvent] = []
    for n in range(topo.nodes):
        agent = Agent(n, "c", ("127.0.0.1", 1), topo, trace=agent_view)

        async def capture(t0, events):
            seen.extend(events)
        agent.wan._apply_trace = capture
        agent.wan.start_trace(time.time())
        if agent.wan._trace_task is not None:  # None: no event on this node's links
            await agent.wan._trace_task
    sim_events = sim_network(topo, trace).events
    assert sorted((e.t, e.src, e.dst, e.rate_mbps) for e in seen) == list(sim_events)


@pytest.mark.unit
def test_simulator_waits_out_an_outage_and_does_not_crash_on_a_permanent_one():
    topo = uniform(3, 80.0, 0.0)
    [p] = predict(topo, None, ["ring"], 200_000, 20_000)
    clear = simulate(p.plan, sim_network(topo)).round_s
    base = base_of(topo)
    outage = steps(base, [(0.01, 0.0), (0.51, 1.0)])
    held = simulate(p.plan, sim_network(topo, outage)).round_s
    assert held == pytest.approx(clear + 0.5, rel=0.02)  # nothing moves for 0.5 s, then as before
    forever = steps(base, [(0.01, 0.0)])
    with pytest.raises(SimulationStalled):
        simulate(p.plan, sim_network(topo, forever))
    assert RoundPredictor(topo, forever).round_s(p.plan) is None  # a run's prediction, not a crash


@pytest.mark.unit
async def test_shaper_holds_at_rate_zero_and_never_crashes():
    sh = LinkShaper(LinkSpec(50.0))
    sh.set_rate(0)
    assert sh.held and sh.rate_Bps == 0 and sh.rate_mbps == 0
    waiter = asyncio.ensure_future(sh.wait_open())
    await asyncio.sleep(0.05)  # a while at rate 0 (what the test is about): held, at any machine speed
    assert not waiter.done()
    sh.blackhole(True)
    sh.set_rate(25)
    await asyncio.sleep(0.05)  # likewise
    assert not waiter.done()  # the blackhole still holds
    sh.blackhole(False)
    await asyncio.wait_for(waiter, 1)
    assert sh.rate_mbps == pytest.approx(25)
    with pytest.raises(ValueError):
        sh.set_rate(-1)


@pytest.mark.loopback
async def test_outage_holds_live_bytes_then_the_round_ends_exact():
    """A real shaped overlay: link 0->1 at rate 0 carries nothing (not even acks); once it is back
    the round completes with the exact sum."""
    topo = uniform(3, 200.0, 0.002)
    [p] = predict(topo, None, ["ring"], 30_000, 5_000)
    async with LocalNet(topo, shaped=True) as net:
        shaper = net.overlays[0].senders[1].pacer
        shaper.set_rate(0)
        before = net.overlays[1].meters_in[0].bytes
        rnd = asyncio.ensure_future(net.run_round(p.plan))
        # node 0 has chunks for node 1 and waits at the held link; then the outage lasts a while
        # (what the test is about: it holds at any machine speed)
        await until(lambda: net.overlays[0].senders[1].unacked and shaper._open is not None,
                    "node 0's sender to wait at the held link")
        await asyncio.sleep(0.3)
        assert not rnd.done()
        assert net.overlays[1].meters_in[0].bytes == before  # nothing crossed
        shaper.set_rate(200)
        await asyncio.wait_for(rnd, 20)  # run_round asserts the exact sum at every node
        assert net.overlays[1].meters_in[0].bytes > before


@pytest.mark.unit
def test_geo_preset_and_crew_generator():
    geo = build_topology("geo:aws10")
    assert geo.nodes == 10 and geo.full_mesh
    assert geo.links[(0, 1)].rate_mbps == 790 and geo.links[(0, 1)].delay_s == pytest.approx(0.0335)
    small = build_topology("geo:aws10:x=0.1")
    assert small.links[(7, 8)].rate_mbps == pytest.approx(114) and small.links[(7, 8)].delay_s == 0.007
    crew = build_topology("crew:40:seed=3")
    mult = np.array([s.rate_mbps / 25 for s in crew.links.values()])
    assert np.all(mult == np.rint(mult)) and mult.min() >= 1 and mult.max() <= 10
    assert abs(mult.mean() - 5) < 0.1 and 0.8 < mult.std() < 1.2  # N(5, 1), rounded and clipped
