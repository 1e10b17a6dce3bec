"""Plans: random valid plans on random graphs run exactly on the real engine; broken plans are refused."""

import asyncio
import random
from dataclasses import replace

import pytest
from helpers.cluster import LocalNet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.plan import ChunkGroup, Plan, PlanError, make_layout, tree_group
from emulation.link import LinkSpec
from emulation.topology import Topology


def random_topology(rng: random.Random, n: int) -> Topology:
    links = {}
    for v in range(1, n):  # a random spanning tree keeps it connected
        u = rng.randrange(v)
        links[(u, v)] = links[(v, u)] = LinkSpec(1000.0)
    for _ in range(rng.randint(0, n)):
        a, b = rng.sample(range(n), 2)
        links[(a, b)] = links[(b, a)] = LinkSpec(1000.0)
    return Topology("random", n, links)


def random_tree(rng: random.Random, nodes: list[int], root: int) -> dict[int, int | None]:
    order = [root] + rng.sample([x for x in nodes if x != root], len(nodes) - 1)
    return {v: (None if i == 0 else order[rng.randrange(i)]) for i, v in enumerate(order)}


def relay_routes(rng: random.Random, topo: Topology, a: int, b: int) -> tuple[tuple[int, ...], ...]:
    """Up to two random simple relay paths a -> ... -> b over the topology's links."""
    routes = []
    for _ in range(6):
        path, seen = [a], {a}
        while path[-1] != b and len(path) < 8:
            nxt = [x for x in topo.neighbors(path[-1]) if x not in seen]
            if not nxt:
                break
            v = b if b in nxt and len(path) > 1 else rng.choice(nxt)
            path.append(v)
            seen.add(v)
        if path[-1] == b and len(path) >= 3 and tuple(path) not in routes:
            routes.append(tuple(path))
        if len(routes) == 2:
            break
    return tuple(routes)


def with_random_aux(rng: random.Random, plan: Plan, topo: Topology) -> Plan:
    groups = []
    for g in plan.groups:
        edges = [(c, p) for c, p in g.parent.items() if p is not None]
        edges += [(p, k) for p, kids in g.children.items() for k in kids]
        aux = {}
        for a, b in edges:
            if rng.random() < 0.5 and (routes := relay_routes(rng, topo, a, b)):
                aux[(a, b)] = routes
        groups.append(replace(g, aux=aux))
    return replace(plan, groups=tuple(groups))


def random_plan(rng: random.Random, n: int, params: int) -> Plan:
    parts = sorted(rng.sample(range(n), rng.randint(1, n))) if n > 2 else list(range(n))
    layout = make_layout(params, rng.randint(1, params))
    chunks = list(range(len(layout)))
    rng.shuffle(chunks)
    ngroups = rng.randint(1, min(4, len(chunks)))
    cuts = sorted(rng.sample(range(1, len(chunks)), ngroups - 1)) if ngroups > 1 else []
    groups = []
    for lo, hi in zip([0, *cuts], [*cuts, len(chunks)], strict=True):
        root = rng.choice(parts)
        agg = random_tree(rng, parts, root)
        if rng.random() < 0.5:
            groups.append(tree_group(sorted(chunks[lo:hi]), root, agg))
        else:  # a broadcast tree that is not the reverse of the aggregation tree
            down = random_tree(rng, parts, root)
            kids: dict[int, list[int]] = {}
            for v, p in down.items():
                if p is not None:
                    kids.setdefault(p, []).append(v)
            groups.append(ChunkGroup(tuple(sorted(chunks[lo:hi])), root, agg, {p: tuple(k) for p, k in kids.items()}))
    return Plan(1, "random", tuple(parts), {p: 1.0 for p in parts}, layout, tuple(groups))


@pytest.mark.loopback
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 30), params=st.integers(1, 40_000))
def test_random_valid_plans_run_exactly(seed, n, params):
    rng = random.Random(seed)
    topo = random_topology(rng, n)
    plan = with_random_aux(rng, random_plan(rng, n, params), topo).validate(topo.links)

    async def go():
        # busy bound 0 or 1 sends most chunks that have auxiliary routes over them
        async with LocalNet(topo, segment_bytes=rng.choice([4096, 65536]),
                            primary_busy_bound=rng.choice([0, 1, 2])) as net:
            await net.run_round(plan)  # asserts == the exact sum on every participant
    asyncio.run(go())


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 30))
def test_random_plans_validate_and_survive_the_wire(seed, n):
    rng = random.Random(seed)
    plan = random_plan(rng, n, rng.randint(1, 5000))
    plan.validate()
    again = Plan.from_wire(plan.to_wire())
    assert again == plan and again.validate()


def base_plan() -> Plan:
    parent = {0: None, 1: 0, 2: 0, 3: 1}
    layout = make_layout(100, 10)
    return Plan(1, "t", (0, 1, 2, 3), {n: 1.0 for n in range(4)}, layout,
                (tree_group(range(5), 0, parent), tree_group(range(5, 10), 3, {3: None, 0: 3, 1: 0, 2: 1})))


@pytest.mark.unit
def test_base_plan_is_valid():
    base_plan().validate()


@pytest.mark.unit
@pytest.mark.parametrize("breakage, message", [
    (lambda p: replace(p, layout=((0, 10), (11, 89))), "gap or overlap"),
    (lambda p: replace(p, layout=(*p.layout, (100, 5))), "in no group"),
    (lambda p: replace(p, groups=(p.groups[0], replace(p.groups[1], chunks=(4, 5, 6, 7, 8, 9)))), "in groups"),
    (lambda p: replace(p, groups=(replace(p.groups[0], parent={0: None, 1: 3, 2: 0, 3: 1}), p.groups[1])), "cycle"),
    (lambda p: replace(p, groups=(replace(p.groups[0], parent={0: 1, 1: 0, 2: 0, 3: 1}), p.groups[1])), "has a parent"),
    (lambda p: replace(p, groups=(replace(p.groups[0], parent={0: None, 1: 0, 2: 0}), p.groups[1])), "covers"),
    (lambda p: replace(p, groups=(replace(p.groups[0], children={0: (1, 2)}), p.groups[1])), "misses nodes [3]"),
    (lambda p: replace(p, groups=(replace(p.groups[0], children={0: (1, 2, 3), 1: (3,)}), p.groups[1])),
     "more than once"),
    (lambda p: replace(p, groups=(replace(p.groups[0], root=9), p.groups[1])), "not a participant"),
    (lambda p: replace(p, groups=(replace(p.groups[0], aux={(3, 1): ((3, 2, 1),)}), p.groups[1])), "not a link"),
    (lambda p: replace(p, groups=(replace(p.groups[0], aux={(2, 3): ((2, 1, 3),)}), p.groups[1])),
     "not a tree edge"),
    (lambda p: replace(p, weights={0: 1.0}), "weights"),
    (lambda p: replace(p, participants=(0, 1, 1, 2)), "unique"),
])
def test_invalid_plans_are_refused(breakage, message):
    links = [(a, b) for a in range(4) for b in range(4) if a != b and {a, b} != {2, 1}]
    base_plan().validate(links)
    with pytest.raises(PlanError, match=message.replace("[", r"\[").replace("]", r"\]")):
        breakage(base_plan()).validate(links)


@pytest.mark.unit
def test_malformed_wire_plan_is_a_plan_error():
    with pytest.raises(PlanError):
        Plan.from_wire({"version": 1})


@pytest.mark.loopback
def test_chains_sum_weighted_members_and_non_members_in_one_pass_exactly():
    """A chunk with one aggregation child (a chain, a ring) is summed segment by segment in one pass (its
    start value plus the child's bytes), at the root straight into the result. On chains whose hops
    are relayed (a 4-node ring overlay, 4 KB segments) with integer weights, a non-member in the middle
    of one chain and a non-member root of the other, every receiver still holds the exact sum."""
    links = {}
    for a in range(4):
        links[(a, (a + 1) % 4)] = links[((a + 1) % 4, a)] = LinkSpec(1000.0)
    topo = Topology("ring4", 4, links)
    layout = make_layout(50_000, 7_000)  # 8 chunks of up to 28 KB: several segments each
    half = len(layout) // 2
    # 3 -> 1 and 2 -> 0 cross a relay; node 1 contributes nothing
    mid = ChunkGroup(tuple(range(half)), 0, {3: 1, 1: 2, 2: 0, 0: None}, {0: (2,), 2: (1,), 1: (3,)})
    top = ChunkGroup(tuple(range(half, len(layout))), 1, {0: 2, 2: 3, 3: 1, 1: None}, {1: (3,), 3: (2,), 2: (0,)})
    plan = Plan(1, "chains", (0, 2, 3), {0: 2.0, 2: 3.0, 3: 1.0}, layout, (mid, top)).validate(topo.links)

    async def go():
        async with LocalNet(topo, segment_bytes=4096) as net:
            await net.run_round(plan)  # asserts == the exact weighted sum (the test's own) on every receiver
    asyncio.run(go())
