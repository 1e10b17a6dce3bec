"""Fixtures over the helpers, made available to every test by tests/conftest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from emulation.topology import Topology

from .cluster import Cluster
from .secret import SECRET
from .wire import RecordingWire


@pytest.fixture
def secret() -> bytes:
    """The test clusters' secret."""
    return SECRET


@pytest.fixture
async def cluster_of() -> AsyncIterator[Callable[..., Awaitable[Cluster]]]:
    """Start Clusters (helpers/cluster.py: `await cluster_of(topo, "name", shaped=True)`); every one is
    closed when the test ends, whatever it did."""
    made: list[Cluster] = []

    async def make(topo: Topology | None = None, name: str = "c1", **kw: Any) -> Cluster:
        c = Cluster(name, topo, **kw)
        made.append(c)
        return await c.start()
    yield make
    for c in reversed(made):
        await c.close()


@pytest.fixture
def recording_wire() -> RecordingWire:
    """An in-memory overlay for one chunk engine: what the engine sends is recorded, nothing delivered."""
    return RecordingWire()
