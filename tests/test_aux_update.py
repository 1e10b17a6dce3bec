"""AUX_UPDATE on an agent: every group's table arrives each time; only the changed ones are parsed again,
and what the engine holds is exactly what the update says."""

import pytest

from agents.engine import ChunkEngine
from core.plan import aux_from_wire, aux_to_wire
from emulation.topology import uniform

pytestmark = pytest.mark.unit


def test_unchanged_tables_are_reused_and_changed_ones_parsed_again():
    engine = ChunkEngine(0, uniform(4).routes())
    first = [aux_to_wire({(0, 1): ((0, 2, 1),)}), aux_to_wire({(1, 3): ((1, 2, 3), (1, 0, 3))}), []]
    engine.set_aux_wire(5, first)
    held = engine.aux_tables[5]
    assert held == tuple(aux_from_wire(g) for g in first)
    second = [list(first[0]), aux_to_wire({(1, 3): ((1, 0, 3),)}), aux_to_wire({(2, 0): ((2, 1, 0),)})]
    engine.set_aux_wire(6, second)
    now = engine.aux_tables[6]
    assert now == tuple(aux_from_wire(g) for g in second)
    assert now[0] is held[0] and now[1] is not held[1]
    assert engine.aux_tables[5] == held  # the older version keeps its own tables
    engine.set_aux_wire(6, second[:1])  # fewer groups than before
    assert engine.aux_tables[6] == (aux_from_wire(second[0]),)


def test_a_malformed_table_fails_as_it_did_and_changes_nothing():
    engine = ChunkEngine(0, uniform(4).routes())
    good = [aux_to_wire({(0, 1): ((0, 2, 1),)})]
    engine.set_aux_wire(1, good)
    with pytest.raises((TypeError, ValueError)):
        engine.set_aux_wire(1, [good[0], [[0, 1]]])  # an entry without its routes
    assert engine.aux_tables[1] == (aux_from_wire(good[0]),)
