"""Progress models: when workers synchronize, and how far one may run ahead of the others.

A progress model is a scheduler-side policy, like a planner: the core names none. It hears every
worker's READY (it computed an iteration), every task recorded and every worker lost, and answers
by forming tasks (`Control.form`, or the BSP barrier) and by allowing iterations (`Control.go`).
Its `rule` tells the workers what to wait for before their next iteration: "result" (the task that
holds their contribution) or "bound" (a GO that allows the iteration).

    bsp     one task per round, formed once every member is READY (NetStorm's per-iteration request)
    ssp     a multicast from every worker after every iteration, to the others; a worker may compute
            iteration k once its own multicast of k - 1 is over and k <= (the slowest worker's last
            iteration whose multicast is over) + 1 + s (SelMcast's SSP, digest 000 §2.4)
    queue   a ready queue: workers queue on READY, the first p queued form a partial reduce (P-Reduce);
            the last workers, when fewer than p remain, form one with whoever is left
    crew    the ready queue with CREW's failure rules: a task whose member is lost or that overruns its
            time budget is abandoned, a failed aggregator's block moves to the Eq. (3) replacement
    selective  selective reduce (seed 003) and its baselines on one controller (sim.selective): BAG
            groups by bandwidth, bpaWR waits for faster workers, P-Reduce, all-reduce (scheme=sr|pr|ar|pa)
    mcast-bsp, mcast-ssp   multicasts to chosen receivers (SelMcast, Orpheus): mcast.py
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ..tasks import JobState, Task, TaskRecord


class Control(Protocol):
    """What a progress model may ask of the scheduler."""

    def barrier_ready(self, js: JobState, rnd: int, node: int, have: set[int]) -> None: ...

    def form(self, js: JobState, members: Iterable[int], receivers: Iterable[int] | None, rnd: int,
             iters: dict[int, int] | None = None, options: dict[str, Any] | None = None) -> Task: ...

    def go(self, js: JobState, upto: int, node: int) -> None: ...

    def alive(self) -> list[int]: ...

    def node_bandwidth(self) -> dict[int, float]: ...

    # what multicast models (mcast.py) use besides: the view's node caps, shrinking a running
    # multicast's receivers, and the timeline
    view: Any

    def drop_receiver(self, js: JobState, tid: int, node: int) -> None: ...

    def note_event(self, kind: str, **data: Any) -> dict[str, Any]: ...


class Progress(Protocol):
    name: str
    rule: str  # "result" | "bound"

    def start(self, ctl: Control, js: JobState) -> None: ...

    def ready(self, ctl: Control, js: JobState, node: int, rnd: int, have: set[int]) -> None: ...

    def task_done(self, ctl: Control, js: JobState, rec: TaskRecord) -> None: ...

    def lost(self, ctl: Control, js: JobState, node: int) -> None: ...


def resolve(name: str, **options: Any) -> Progress:
    """A progress model by name: bsp, ssp (staleness=S), queue (group=P), crew (group=P, budget_s=S),
    selective (group=P, scheme, eta, theta, dt, c, ...: selective.SelectiveReduce), mcast-bsp and mcast-ssp
    (select=selmcast|orpheus|all, p, k, eta, seed; mcast.py)."""
    from . import bsp, crew, mcast, queue, selective, ssp
    makers: dict[str, Callable[..., Progress]] = {"bsp": bsp.Bsp, "ssp": ssp.Ssp, "queue": queue.ReadyQueue,
                                                  "crew": crew.CrewQueue, "selective": selective.SelectiveReduce,
                                                  "mcast-bsp": mcast.McastBsp, "mcast-ssp": mcast.McastSsp}
    if name not in makers:
        raise ValueError(f"unknown progress model {name!r}; known: {', '.join(sorted(makers))}")
    return makers[name](**options)
