"""What a progress model decides, and the one registry both the live scheduler and the simulator's job
mode take their models from (scheduler/progress adapts them to its Control, sim/job.py drives them).

A decision object is pure and clock-free: it hears events (a worker READY for an iteration, a task
over, a worker lost; `t` only where the model reasons about time, selective reduce) and answers with
actions, which the caller carries out in order: `Form` a task, `Go` (a worker may compute up to an
iteration). Who is in the job is the decision's own list (the workers it started with, less those
lost) unless the caller says who is alive now (`alive`): the scheduler does, a restarted agent
comes back there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

INF = float("inf")


@dataclass(frozen=True)
class Form:
    """Form a task: `members` contribute (each its iteration in `iters`), `receivers` get the result
    (None: the members themselves, a reduce); `weights` per member (None: a plain sum); `ref`: the
    decision's own name for the task, handed back with `over`."""

    members: tuple[int, ...]
    receivers: tuple[int, ...] | None
    iters: dict[int, int]
    weights: dict[int, float] | None = None
    ref: int | None = None


@dataclass(frozen=True)
class Go:
    """Worker `worker` may compute iterations up to `upto` (a bounded model's allowance rose)."""

    worker: int
    upto: int


Action = Form | Go


class Decision:
    """What most decisions answer: nothing at start, no deadlines of their own. `barrier`: the round's
    task forms once every worker is READY (the caller may run its own barrier); `rule`: what a worker
    waits for before its next iteration, "result" (its task's result) or "bound" (a Go)."""

    name = ""
    rule = "result"
    barrier = False

    def __init__(self) -> None:
        self.workers: set[int] = set()
        self.wake_at: float | None = None  # when `tick` wants to be called

    def start(self, workers: Iterable[int], t: float, *, rounds: int | None = None) -> list[Action]:
        """The job begins at t with these workers, each computing `rounds` iterations (None: unbounded)."""
        self.workers = set(workers)
        return []

    def ready(self, worker: int, iteration: int, t: float, *, last: bool = False, defer: bool = False,
              alive: Iterable[int] | None = None) -> list[Action]:
        """`worker` computed `iteration` (last: its last one); defer: more READYs of this instant follow."""
        raise NotImplementedError

    def over(self, ref: int | None, iters: Mapping[int, int], t: float, *, aborted: bool = False,
             back: Mapping[int, float] | None = None, t_end: float | None = None,
             alive: Iterable[int] | None = None) -> list[Action]:
        """A task formed from `iters` (its `ref`) is over (aborted: nothing of it was applied); back:
        when each member resumed training."""
        return []

    def lost(self, worker: int, t: float, *, alive: Iterable[int] | None = None) -> list[Action]:
        self.workers.discard(worker)
        return []

    def tick(self, t: float) -> list[Action]:
        """`wake_at` came."""
        return []

    def synced(self, worker: int) -> int:
        """Iterations of the worker whose synchronization is over, where the decision counts them (a
        bounded model: its Gos depend on them); 0 where the worker's own task results say."""
        return 0

    def _alive(self, alive: Iterable[int] | None) -> list[int]:
        return sorted(self.workers) if alive is None else list(alive)


DECISIONS: dict[str, type[Decision]] = {}
SIMULATED: set[str] = set()  # the models the simulator's job mode can run
D = TypeVar("D", bound=type[Decision])


def register(*, simulated: bool = True) -> Callable[[D], D]:
    """A decision class, known by its `name` to `decide` (and, if `simulated`, to the simulator)."""
    def add(cls: D) -> D:
        DECISIONS[cls.name] = cls
        if simulated:
            SIMULATED.add(cls.name)
        return cls
    return add


def decide(name: str, **options: Any) -> Decision:
    """A new decision object of the model `name` (bsp, ssp: staleness; queue: group; selective: config,
    bandwidth, samples), from the registry as it is now."""
    if name not in DECISIONS:
        raise ValueError(f"unknown progress model {name!r}; known: {', '.join(sorted(DECISIONS))}")
    return DECISIONS[name](**options)
