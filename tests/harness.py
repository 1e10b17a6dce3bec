"""Several real agents' data planes in one process: real TCP on loopback, one event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np

from agents.engine import ChunkEngine
from agents.workload import contribution, expected
from emulation.link import LinkShaper
from emulation.topology import Topology
from overlay.peers import Overlay
from scheduler.plan import Plan

SECRET = b"harness-cluster-secret-0123456789"  # tests run authenticated, as `wansync run` does


class LocalNet:
    def __init__(self, topo: Topology, *, shaped: bool = False, cluster: str = "test",
                 segment_bytes: int = 64 * 1024, primary_busy_bound: int = 2,
                 secret: bytes | None = SECRET, hold_budget: int | None = None) -> None:
        """secret: every connection authenticates (overlay.auth) unless None (--insecure)."""
        self.topo = topo
        self.secret = secret
        self.hold_budget = hold_budget
        self.routes = topo.routes()
        self.engines: dict[int, ChunkEngine] = {}
        self.overlays: dict[int, Overlay] = {}
        self.shaped = shaped
        self.cluster = cluster
        self.segment_bytes = segment_bytes
        self.samples: list[tuple[int, int, int, float]] = []
        self.primary_busy_bound = primary_busy_bound

    async def __aenter__(self) -> LocalNet:
        addrs = {}
        for n in range(self.topo.nodes):
            eng = ChunkEngine(n, self.routes, primary_busy_bound=self.primary_busy_bound)
            pacers = ({b: LinkShaper(s) for (a, b), s in self.topo.links.items() if a == n}
                      if self.shaped else None)
            ov = Overlay(n, self.cluster, eng, neighbors=self.topo.neighbors(n), pacers=pacers,
                         segment_bytes=self.segment_bytes, secret=self.secret,
                         on_sample=lambda *s: self.samples.append(s))
            eng.overlay = ov
            if self.hold_budget is not None:
                eng.hold_budget = self.hold_budget
            addrs[n] = ("127.0.0.1", await ov.listen())
            self.engines[n], self.overlays[n] = eng, ov
        for ov in self.overlays.values():
            ov.connect(addrs)
        await asyncio.gather(*(ov.wait_connected(10) for ov in self.overlays.values()))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(ov.close() for ov in self.overlays.values()))

    async def run_round(self, plan: Plan, job: int = 1, rnd: int = 0, attempt: int = 0,
                        starts: Mapping[int, float] | None = None) -> dict[int, np.ndarray]:
        """Every participant starts (optionally after a delay) and must end with the exact sum."""
        async def one(n: int) -> np.ndarray:
            if starts and starts.get(n):
                await asyncio.sleep(starts[n])
            st = self.engines[n].begin_round(job, rnd, attempt, plan,
                                             contribution(rnd, attempt, n, plan.params))
            res = await st.done
            self.engines[n].end_round(st)
            return res
        results = await asyncio.wait_for(asyncio.gather(*(one(n) for n in plan.participants)), 60)
        want = expected(rnd, attempt, plan.participants, plan.params)
        out = dict(zip(plan.participants, results, strict=True))
        for n, r in out.items():
            assert np.array_equal(r, want), f"node {n} holds a wrong result"
        return out
