"""The one cluster harness: a scheduler in this process and one agent per node, authenticated with the
test secret (helpers/secret.py) — the agents in this process (fast; their objects are at hand) or as
`wansync agent` processes (to kill, freeze and restart them). And LocalNet: agents' data planes alone
(chunk engines and overlays over real TCP on loopback, no scheduler), for tests of the data plane."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agents.agent import Agent
from agents.engine import ChunkEngine
from agents.workload import contribution
from core.dispatch import DISPATCH
from core.plan import Plan
from emulation.link import LinkShaper
from emulation.topology import Topology
from overlay.auth import SECRET_ENV
from overlay.peers import Overlay
from scheduler.service import JobState, Scheduler
from wansync.backend import agent_command
from wansync.cluster import agent_options_file
from wansync.procs import reap
from wansync.runspec import RunConfig

from .exact import exact_sum
from .secret import SECRET
from .waiting import until


class Cluster:
    """A scheduler in this process and one agent per node of `topo`: `Agent`s on this event loop, or,
    given `processes` (the run whose agents' command line to use), one `wansync agent` process per node.
    Start it with `start()` or `async with`; every event the scheduler emits is kept in `events`."""

    def __init__(self, name: str, topo: Topology | None = None, *, processes: RunConfig | None = None,
                 on_event: Callable[[str, dict], None] | None = None, shaped: bool = False,
                 secret: bytes | None = SECRET, tls: Any = None, heartbeat_timeout: float = 1.5,
                 probe: bool = True, **agent_kw: Any) -> None:
        """secret=None: --insecure; tls: overlay.auth.TlsFiles; probe: the scheduler probes idle links (as
        `wansync run` does by default); agent_kw: more `Agent` arguments."""
        if (topo is None) == (processes is None):
            raise ValueError("a cluster of in-process agents needs topo; one of agent processes, processes")
        if processes is not None and secret is None:
            raise ValueError("agent processes run authenticated: they read the secret from the environment")
        self.name, self.cluster = name, name
        self.topo = topo if topo is not None else processes.topo
        self.processes = processes
        self.nodes = self.topo.nodes
        self.secret, self.tls, self.shaped, self.agent_kw = secret, tls, shaped, agent_kw
        self.events: list[tuple[float, str, dict]] = []
        self._on_event = on_event

        def record(kind: str, data: dict) -> None:
            self.events.append((time.time(), kind, data))
            if self._on_event is not None:
                self._on_event(kind, data)
        self.sched = Scheduler(name, self.nodes, on_event=record, secret=secret, tls=tls,
                               heartbeat_timeout=heartbeat_timeout, probe=probe)
        self.port = 0
        self.agents: list[Agent] = []  # in-process agents
        self.tasks: list[asyncio.Task] = []  # ...and the tasks running them
        self.procs: dict[int, subprocess.Popen] = {}  # agent processes
        self.logs: dict[int, str] = {}  # every incarnation's stderr so far, drained without blocking
        self._watched: set[int] = set()  # agents' stderr descriptors the loop reads as they write
        self.options_file: Path | None = None

    async def start(self, wait_s: float = 30.0) -> Cluster:
        """Start the scheduler and every agent; return once every agent registered."""
        self.port = await self.sched.start()
        if self.processes is None:
            self.agents = [Agent(n, self.name, ("127.0.0.1", self.port), self.topo, shaped=self.shaped,
                                 secret=self.secret, tls=self.tls, **self.agent_kw) for n in range(self.nodes)]
            self.tasks = [asyncio.create_task(a.run()) for a in self.agents]
        else:
            for n in range(self.nodes):
                self.spawn(n)
        await self.sched.wait_agents(wait_s)
        return self

    async def close(self) -> None:
        """Shut the scheduler down; the in-process agents end with it, agent processes are reaped."""
        await self.sched.shutdown()
        if self.tasks:
            await asyncio.wait_for(asyncio.gather(*self.tasks), 10)
        for fd in list(self._watched):
            self._unwatch(fd)
        reap(list(self.procs.values()))

    async def __aenter__(self) -> Cluster:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- agent processes ------------------------------------------------------------------------------
    def spawn(self, node: int) -> None:
        """Start node's agent process (again: a restarted agent, a newer epoch, the same node id)."""
        assert self.processes is not None and self.secret is not None
        env = dict(os.environ, **{SECRET_ENV: self.secret.decode()})
        self.drain(node)
        if self.options_file is None:  # written once: every incarnation reads the run's options from it
            self.options_file = agent_options_file(self.processes, self.name)
        cmd = agent_command(self.options_file, node, f"127.0.0.1:{self.port}")
        self.procs[node] = subprocess.Popen(cmd, env=env,
                                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert self.procs[node].stderr is not None
        fd = self.procs[node].stderr.fileno()
        os.set_blocking(fd, False)
        # read whenever the agent writes: a full pipe would freeze a chatty agent mid-test
        asyncio.get_running_loop().add_reader(fd, self._read, node, self.procs[node])
        self._watched.add(fd)

    def drain(self, node: int) -> str:
        """Node's stderr so far (all its incarnations). Read without blocking; also keeps the pipe
        from filling up, which would freeze a chatty agent."""
        p = self.procs.get(node)
        if p is not None:
            self._read(node, p)
        return self.logs.get(node, "")

    def _read(self, node: int, p: subprocess.Popen) -> None:
        """What this incarnation of node's agent wrote so far (its reader goes at its end of file)."""
        while p.stderr is not None:
            try:
                data = os.read(p.stderr.fileno(), 65536)
            except BlockingIOError:
                break
            if not data:  # the agent ended: nothing more to read from this incarnation
                self._unwatch(p.stderr.fileno())
                break
            self.logs[node] = self.logs.get(node, "") + data.decode(errors="replace")

    def _unwatch(self, fd: int) -> None:
        if fd in self._watched:
            self._watched.discard(fd)
            asyncio.get_running_loop().remove_reader(fd)

    # --- what a test waits for ------------------------------------------------------------------------
    async def when_round_starts(self, rnd: int) -> None:
        """Round `rnd`'s attempt has started: every member has its reply, no member has finished it."""
        await until(lambda: self.sched.current is not None and rnd in self.sched.current.started,
                    f"round {rnd} to start")

    async def when_retried_without(self, node: int) -> None:
        """The survivors finished a retried attempt without `node`: recorded, exact or not (judged later)."""
        await until(lambda: any(r.attempt > 0 and r.participants == self.nodes - 1 and node not in r.digests
                                for r in self.sched.current.records),
                    f"the survivors' retry without node {node} to be recorded")

    async def when_back_in_a_round(self, node: int) -> None:
        """Node `node` registered again and a round it took part in was recorded."""
        def back() -> bool:
            rejoined = [e for e in self.sched.timeline if e["kind"] == "agent_rejoined" and e["node"] == node]
            return bool(rejoined) and any(r.round >= rejoined[-1]["round"] and node in r.digests
                                          for r in self.sched.current.records)
        await until(back, f"node {node} to rejoin and take part in a recorded round")

    async def stop(self, job: asyncio.Task) -> JobState:
        """End a job that runs until stopped: what the test waited for has happened."""
        js = self.sched.current
        assert js is not None and not job.done(), "the job ended before the test saw what it waits for"
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job
        return js

    def kinds(self, kind: str) -> list[dict]:
        return [d for _, k, d in self.events if k == kind]


async def start_cluster(topo: Topology, cluster: str = "c1", **kw: Any) -> tuple[Scheduler, list[Agent],
                                                                                  list[asyncio.Task]]:
    """A Cluster of in-process agents, started: (its scheduler, its agents, the tasks running them).
    kw: Cluster's (on_event, shaped, secret, tls, agent arguments)."""
    c = await Cluster(cluster, topo, **kw).start(20)
    return c.sched, c.agents, c.tasks


async def stop_cluster(sched: Scheduler, tasks: list[asyncio.Task]) -> None:
    """End what start_cluster started."""
    await sched.shutdown()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)


class LocalNet:
    """Several real agents' data planes in one process: real TCP on loopback, one event loop."""

    def __init__(self, topo: Topology, *, shaped: bool = False, cluster: str = "test",
                 segment_bytes: int = 64 * 1024, primary_busy_bound: int | None = None,
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
            eng = ChunkEngine(n, self.routes, dispatch=DISPATCH.but(primary_busy_bound=self.primary_busy_bound))
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
                        starts: Mapping[int, Callable[[], Awaitable[Any]]] | None = None
                        ) -> dict[int, np.ndarray]:
        """Every node with a part in the plan (members, aggregators, replicating nodes) runs it as task
        `rnd`; every receiver must end with the exact (weighted) sum of the members, computed here
        (`exact_sum`). starts: node -> a coroutine function to await before that node begins (an event
        it waits for, e.g. `lambda: until(...)`). Returns the receivers' results."""
        async def one(n: int) -> np.ndarray | None:
            gate = (starts or {}).get(n)
            if gate is not None:
                await gate()
            mine = contribution(rnd, attempt, n, plan.params) if n in plan.participants else None
            st = self.engines[n].begin_task(job, rnd, attempt, plan, mine)
            res = await st.done
            self.engines[n].end_task(st)
            return res
        for n, eng in self.engines.items():  # what the scheduler's JOB tells every agent, relays included
            eng.open_job(job, rnd)
            if n not in plan.nodes:
                eng.drop_stale(job, rnd)  # a node that only relays follows the job's tasks all the same
        results = await asyncio.wait_for(asyncio.gather(*(one(n) for n in plan.nodes)), 60)
        want = exact_sum(rnd, plan.participants, plan.params, attempt=attempt, weights=plan.weights)
        out = {n: r for n, r in zip(plan.nodes, results, strict=True) if n in plan.receiver_set}
        assert set(out) == set(plan.receiver_set)
        for n, r in out.items():
            assert r is not None and r.dtype == np.float32 and np.array_equal(r, want), \
                f"node {n} holds a wrong result"
        return out
