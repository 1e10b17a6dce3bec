"""Plan.validate() refusing a chunk outside the layout and an auxiliary route that repeats a node.

Each test here fails if the check it names is removed or weakened (issue 12 found that such a
breakage passed the whole suite): it drives the real code path with inputs only that check can refuse,
and computes the right answer by itself, never through the product.
"""

from __future__ import annotations

import pytest

from core.plan import ChunkGroup, Plan, PlanError, make_layout, tree_group
from emulation.topology import uniform

pytestmark = pytest.mark.unit


# --- Plan.validate() ----------------------------------------------------------------------------------
def base_plan(aux: dict[tuple[int, int], tuple[tuple[int, ...], ...]] | None = None,
              chunks: tuple[int, ...] = (0, 1, 2)) -> Plan:
    """4 participants, 3 chunks, one group rooted at 0 (a star), optional auxiliary routes."""
    parent: dict[int, int | None] = {0: None, 1: 0, 2: 0, 3: 0}
    g = tree_group(chunks, 0, parent)
    g = ChunkGroup(g.chunks, g.root, g.parent, g.children, aux or {})
    return Plan(1, "hand", (0, 1, 2, 3), {n: 1.0 for n in range(4)}, make_layout(300, 100), (g,))


LINKS = list(uniform(4).links)


def test_the_hand_made_plans_are_valid():
    base_plan().validate(LINKS)
    base_plan({(1, 0): ((1, 2, 0), (1, 3, 2, 0)), (0, 3): ((0, 2, 3),)}).validate(LINKS)


@pytest.mark.parametrize("extra", [3, 4, -1, 99])
def test_validate_refuses_a_chunk_index_outside_the_layout(extra):
    """Every layout chunk is in the group, so only the range check can refuse the extra index."""
    with pytest.raises(PlanError, match=f"chunk {extra} is not in the layout"):
        base_plan(chunks=(0, 1, 2, extra)).validate(LINKS)


@pytest.mark.parametrize("route", [(1, 2, 1, 0), (1, 2, 3, 2, 0), (1, 3, 2, 3, 0)])
@pytest.mark.parametrize("with_links", [True, False])
def test_validate_refuses_an_auxiliary_route_that_repeats_a_node(route, with_links):
    """Each route starts at the child, ends at the parent, is long enough and uses only links: it is
    wrong only in visiting a node twice (a relay loop)."""
    plan = base_plan({(1, 0): ((1, 2, 0), route)})
    with pytest.raises(PlanError, match="not a simple relay path"):
        plan.validate(LINKS if with_links else None)
