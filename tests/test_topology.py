"""Topologies: built-ins, files with clear errors, and the one min-hop routing rule."""

import json
import random

import pytest

from emulation.topology import TopologyError, build, hetero, internet2, load
from emulation.trace import redraw
from overlay import routing
from overlay.routing import NoRoute, Routes, adjacency

pytestmark = pytest.mark.unit


def test_internet2_matches_the_paper():
    t = internet2()
    assert t.nodes == 9 and len(t.undirected()) == 13 and len(t.links) == 26
    assert max(range(9), key=lambda n: len(t.neighbors(n))) == 5  # the paper's node 6, degree 4
    assert all(20 <= s.rate_mbps <= 155 and s.delay_s == 0.030 for s in t.links.values())
    assert internet2() == internet2() and internet2(seed=2) != internet2()


def test_hetero_is_seeded_full_mesh():
    t = hetero(5, 20, 155, seed=3)
    assert t.full_mesh and t == hetero(5, 20, 155, seed=3)
    assert len({s.rate_mbps for s in t.links.values()}) > 5


def test_scale_shrinks_delays_not_rates():
    t = internet2().scaled(0.1)
    assert all(s.delay_s == pytest.approx(0.003) for s in t.links.values())
    assert [s.rate_mbps for s in t.links.values()] == [s.rate_mbps for s in internet2().links.values()]


def test_min_hop_routes_break_ties_lexicographically():
    r = Routes(adjacency([(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]))
    assert r.route(0, 3) == (0, 1, 3)
    assert r.route(4, 0) == (4, 3, 1, 0)
    assert r.route(2, 1) == (2, 0, 1)
    with pytest.raises(NoRoute):
        Routes(adjacency([(0, 1), (2, 3)])).route(0, 3)


def brute_force_route(adj: dict[int, set[int]], src: int, dst: int) -> tuple[int, ...] | None:
    """Every simple path src..dst, the shortest and then lexicographically smallest: the rule, literally."""
    best: tuple[int, ...] | None = None
    stack = [(src,)]
    while stack:
        path = stack.pop()
        if path[-1] == dst:
            if best is None or (len(path), path) < (len(best), best):
                best = path
            continue
        stack.extend(path + (v,) for v in adj.get(path[-1], ()) if v not in path)
    return best


@pytest.mark.parametrize("search", ["python", "scipy"])
def test_min_hop_routes_match_brute_force_on_small_graphs(search, monkeypatch):
    # overlays past BFS_PY_MAX nodes search with scipy: both searches must give the rule's routes
    monkeypatch.setattr(routing, "BFS_PY_MAX", 10**9 if search == "python" else 0)
    rng = random.Random(13)
    for _ in range(150):
        ids = rng.sample(range(40), rng.randint(2, 8))  # sparse, unordered ids: not 0..n-1
        pairs = [(a, b) for a in ids for b in ids if a < b and rng.random() < 0.4]
        adj = adjacency(pairs)
        r = Routes(adj)
        for a in ids:
            for b in ids:
                want = brute_force_route(adj, a, b) if a != b else (a,)
                if want is None:
                    with pytest.raises(NoRoute):
                        r.route(a, b)
                else:
                    assert r.route(a, b) == want, (pairs, a, b)


def test_min_hop_routes_follow_adj_as_given():
    # a one-way entry is a one-way link; a node the overlay does not know has no route
    r = Routes({0: {1}, 1: {2}, 2: set()})
    assert r.route(0, 2) == (0, 1, 2)
    assert r.is_link(0, 1) and not r.is_link(1, 0)
    for a, b in ((2, 0), (1, 0), (0, 7), (7, 0)):
        with pytest.raises(NoRoute):
            r.route(a, b)
    assert r.route(7, 7) == (7,)
    assert Routes({}).adj == {}


def test_star_on_internet2_crosses_the_hub_links():
    r = internet2().routes()
    hops = [r.route(n, 5) for n in range(9) if n != 5]
    assert all(p[-2] in (3, 6, 7, 8) for p in hops)  # everything funnels into the hub's 4 links


def test_nodes_disagreeing_with_internet2_is_an_error():
    with pytest.raises(TopologyError, match="--nodes 4 disagrees"):
        build("internet2", 4)


@pytest.mark.parametrize("doc, field", [
    ({"nodes": 1, "links": []}, "nodes"),
    ({"nodes": 3, "links": [{"a": 0, "b": 5, "rate_mbps": 10}]}, "links[0].b"),
    ({"nodes": 3, "links": [{"a": 0, "b": 1}]}, "links[0].rate_ab_mbps"),
    ({"nodes": 3, "links": [{"a": 0, "b": 1, "rate_mbps": -3}]}, "links[0].rate_ab_mbps"),
    ({"nodes": 3, "links": [{"a": 0, "b": 1, "rate_mbps": 5, "delay_ms": "x"}]}, "links[0].delay_ms"),
    ({"nodes": 3, "links": [{"a": 0, "b": 1, "rate_mbps": 5}]}, "not all connected"),
    ({"nodes": 2, "links": [{"src": 0, "dst": 1, "rate_mbps": 5}]}, "no reverse direction"),
    ({"nodes": 2, "links": [{"a": 0, "b": 0, "rate_mbps": 5}]}, "to itself"),
    ({"nodes": 2, "matrix": [[0, 1]]}, "matrix"),
    ({"nodes": 2, "links": [{"a": 0, "b": 1, "rate_mbps": 5}], "caps": [{"node": 7, "uplink_mbps": 1}]},
     "caps[0].node"),
])
def test_bad_topology_files_name_the_field(tmp_path, doc, field):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(TopologyError) as e:
        load(p)
    assert field in str(e.value) and str(p) in str(e.value)


def test_toml_file_round_trip(tmp_path):
    p = tmp_path / "tri.toml"
    p.write_text('name = "tri"\nnodes = 3\n[defaults]\nrate_mbps = 50\ndelay_ms = 10\n'
                 '[[links]]\na = 0\nb = 1\n[[links]]\na = 1\nb = 2\nrate_ab_mbps = 20\n'
                 '[[caps]]\nnode = 1\nuplink_mbps = 60\n')
    t = build(str(p))
    assert t.name == "tri" and t.links[(1, 2)].rate_mbps == 20 and t.links[(2, 1)].rate_mbps == 50
    assert t.links[(0, 1)].delay_s == pytest.approx(0.01) and t.uplink_mbps == {1: 60.0}
    with pytest.raises(TopologyError, match="not valid TOML"):
        p.write_text("nodes = = 3")
        load(p)


def test_redraw_trace_is_seeded_and_periodic():
    links = internet2().links
    a, b = redraw(links, 180, 600, seed=1), redraw(links, 180, 600, seed=1)
    assert a == b and len(a.events) == 3 * 26 and {e.t for e in a.events} == {180, 360, 540}
    assert a.scaled(0.1).period_s == pytest.approx(18)
