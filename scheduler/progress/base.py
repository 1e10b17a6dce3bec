"""What a progress model is to the scheduler, and the registry models join (as planners join
scheduler/planners): the scheduler asks a model what it can do and never names one.

Models import this module only (never the package), and register themselves with `@register`; the
package imports every model once, so `resolve(name)` finds them all without an import circle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from core.plan import Plan

from ..tasks import JobState, Task, TaskRecord
from ..view import NetworkView

AHEAD_FACTOR, AHEAD_MIN = 4, 8  # a model without a barrier: frames for this many tasks per node (at least)


class Control(Protocol):
    """What a progress model may ask of the scheduler."""

    view: NetworkView  # the node caps (multicast models), links to suspend (CREW)
    plans: Mapping[int, Plan]  # every published plan, by version

    def barrier_ready(self, js: JobState, rnd: int, node: int, have: set[int]) -> None: ...

    def form(self, js: JobState, members: Iterable[int], receivers: Iterable[int] | None, rnd: int | None,
             iters: dict[int, int] | None = None, options: dict[str, Any] | None = None) -> Task: ...

    def go(self, js: JobState, upto: int, node: int) -> None: ...

    def alive(self) -> list[int]: ...

    def node_bandwidth(self) -> dict[int, float]: ...

    def drop_receiver(self, js: JobState, tid: int, node: int) -> None: ...

    def abort(self, js: JobState, tid: int, why: str) -> None: ...

    def note_event(self, kind: str, **data: Any) -> dict[str, Any]: ...

    def waited(self) -> dict[tuple[int, int], float]: ...

    def suspect(self, link: tuple[int, int], seconds: float, kind: str, **data: Any) -> bool: ...


class Progress(Protocol):
    """A progress model: when workers synchronize. Besides the events it hears (start, ready,
    task_done, lost, and a watch on every liveness tick), it declares what the scheduler needs."""

    name: str
    rule: str  # "result" | "bound": what a worker waits for before its next iteration
    uses_barrier: bool  # the scheduler's round barrier forms its tasks (one per round, READY goes there)
    multicasts: bool  # forms one-source multicasts: runs under a one-source scheme (mcast, mcast-l3)
    reduces: bool  # its tasks run under a reduce scheme (ring, mst, ...)
    # who a worker's result comes from (what a training mode may assume, wansync.torch.modes): "full"
    # (every worker, every sync), "partial" (the group the model formed: it changes) or "multicast"
    # (the models other workers multicast to it, applied as agents/received.py says)
    groups: str

    def ahead(self, nodes: int) -> int:
        """Tasks an agent may receive frames for beyond its own."""
        ...

    def over(self, js: JobState) -> bool:
        """Has every task of the job been recorded (the job ends once the agents' stats are in too)?"""
        ...

    def start(self, ctl: Control, js: JobState) -> None: ...

    def ready(self, ctl: Control, js: JobState, node: int, rnd: int, have: set[int]) -> None: ...

    def task_done(self, ctl: Control, js: JobState, rec: TaskRecord) -> None: ...

    def lost(self, ctl: Control, js: JobState, node: int) -> None: ...

    def retry(self, ctl: Control, js: JobState, t: Task, prev: int | None, why: str,
              done: frozenset[int] = frozenset()) -> str | None:
        """A formed task's attempt was aborted (`prev`: its version, `done`: receivers that had it
        whole): why it is abandoned, or None to let the scheduler re-plan and start it again."""
        ...

    def watch(self, ctl: Control, js: JobState, now: float) -> None:
        """The model's own deadlines, on every liveness tick while the job runs."""
        ...

    def finished(self, ctl: Control, js: JobState, node: int) -> None:
        """The worker has no iteration left in this job (its training script ended); it still serves
        the tasks it has a part in. A model that waits for more workers stops counting on it."""
        ...

    def staleness(self) -> int | None:
        """How many iterations older than its own a received model may be when a worker applies it
        (multicast models: their bound; None: a worker applies only its own tasks' results)."""
        ...


def all_recorded(js: JobState) -> bool:
    return all(t.recorded_t is not None for t in js.tasks.values())


class Model:
    """What most models answer: no barrier, reduces, frames for a few tasks ahead, retried as the
    scheduler sees fit, over once every task formed is recorded, no deadlines of their own."""

    name = ""
    rule = "result"
    uses_barrier = False
    multicasts = False
    reduces = True
    groups = "full"

    def ahead(self, nodes: int) -> int:
        return max(AHEAD_MIN, AHEAD_FACTOR * nodes)

    def over(self, js: JobState) -> bool:
        return all_recorded(js)

    def retry(self, ctl: Control, js: JobState, t: Task, prev: int | None, why: str,
              done: frozenset[int] = frozenset()) -> str | None:
        return None

    def watch(self, ctl: Control, js: JobState, now: float) -> None:
        pass

    def finished(self, ctl: Control, js: JobState, node: int) -> None:
        pass

    def staleness(self) -> int | None:
        return None


MODELS: dict[str, Callable[..., Progress]] = {}
DEFAULT = "bsp"  # the model a job runs unless it names one
M = TypeVar("M", bound=type)


def register(cls: M) -> M:
    """A progress model class, known by its `name` to `resolve` (and the CLI's --progress)."""
    MODELS[cls.name] = cls  # type: ignore[attr-defined]
    return cls


def resolve(name: str, **options: Any) -> Progress:
    """A progress model by name: bsp, ssp (staleness=S), queue (group=P), crew (group=P, budget_s=S),
    selective (group=P, scheme, eta, theta, dt, c, ...: selective.SelectiveReduce), mcast-bsp and mcast-ssp
    (select=selmcast|orpheus|all, p, k, eta, seed; mcast.py)."""
    if name not in MODELS:
        raise ValueError(f"unknown progress model {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[name](**options)
