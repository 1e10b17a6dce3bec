"""Slow solves (tree packing's LP, `auto`'s candidates) in a process of their own, niced.

A re-plan that takes a second of CPU must not hold the scheduler's event loop, and on one machine it
must not take that second from the agents either. A thread would do the first but not the second:
a niced thread preempted while it holds the GIL stalls the loop (priority inversion). So the solve
runs in one worker process at nice SOLVER_NICE, started on first use (spawn: no inherited sockets or
loop) and kept for the scheduler's life. The worker gets the scheme's name, a copy of the view, the
job and the planner's memory, and sends back the plan, the memory as the planner left it, and its CPU
seconds. Until the worker has started, and for a spec it cannot find by name (registered at run time
by a caller), the solve runs in a thread at the scheduler's priority instead.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import signal
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from core.plan import Job, Plan

from . import planners
from .view import NetworkView

SOLVER_NICE = 10

Solved = tuple[Plan, dict[str, Any], float]  # the plan, the planner's memory after it, CPU seconds


def _lower(pid: int) -> None:
    """Process `pid` to SOLVER_NICE above this process's own nice value (never back up)."""
    want = os.getpriority(os.PRIO_PROCESS, 0) + SOLVER_NICE
    try:
        if os.getpriority(os.PRIO_PROCESS, pid) < want:
            os.setpriority(os.PRIO_PROCESS, pid, want)
    except OSError:  # not allowed, or already gone: it runs at the scheduler's priority
        pass


def _worker_init() -> None:
    """Deaf to ^C: a terminal's SIGINT reaches the whole process group, and the launcher it is meant
    for shuts the pool down (a worker would print a KeyboardInterrupt traceback). Its parent niced
    it as it started (_NicedSpawnProcess)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _NicedSpawnProcess(multiprocessing.get_context("spawn").Process):  # type: ignore[misc]
    """A spawned process niced by its parent the moment it exists: a worker's start (a new
    interpreter importing numpy, scipy, networkx and the project, ~0.3 CPU-s) used to run at full
    priority until its initializer niced it, and on a 2-core machine the first rounds of a job, when
    the predictor's worker starts, ran 20-50 % slower than the rest (4 agents, unshaped ring)."""

    def start(self) -> None:
        super().start()
        if self.pid is not None:
            _lower(self.pid)


class _NicedSpawn(type(multiprocessing.get_context("spawn"))):  # type: ignore[misc]
    Process = _NicedSpawnProcess


def niced_process() -> ProcessPoolExecutor:
    """One spawned worker process at nice SOLVER_NICE from its start: CPU-heavy Python (a solve, a
    simulation) off the scheduler's loop and behind the agents. Spawn: no inherited sockets or loop."""
    return ProcessPoolExecutor(1, mp_context=_NicedSpawn(), initializer=_worker_init)


def _solve(name: str, view: NetworkView, job: Job, memory: dict[str, Any]) -> Solved:
    start = time.process_time()
    plan = planners.resolve(name).plan(view, job, memory)
    return plan, memory, time.process_time() - start


def _solve_here(spec: planners.PlannerSpec, view: NetworkView, job: Job, memory: dict[str, Any]) -> Solved:
    start = time.thread_time()
    plan = spec.plan(view, job, memory)
    return plan, memory, time.thread_time() - start


def _ready() -> bool:
    return bool(planners.SCHEMES)  # the registry imported: the worker is ready to solve


class Solver:
    """One solve at a time, off the scheduler's loop: in the niced worker process once it has started
    (spawning it and importing the planners takes a second or two), in a thread until then and for
    specs the worker cannot resolve by name."""

    def __init__(self) -> None:
        self._process: ProcessPoolExecutor | None = None
        self._started: Future[bool] | None = None
        self._thread: ThreadPoolExecutor | None = None

    def warm(self) -> None:
        """Start the worker process now, so that it is ready by the first re-plan."""
        if self._process is None:
            self._process = niced_process()
            self._started = self._process.submit(_ready)

    @property
    def ready(self) -> bool:
        return self._started is not None and self._started.done() and self._started.exception() is None

    def submit(self, spec: planners.PlannerSpec, view: NetworkView, job: Job, memory: dict[str, Any]
               ) -> Future[Solved]:
        named = planners.SCHEMES.get(spec.name) is spec
        if named:
            self.warm()
        if named and self.ready:
            assert self._process is not None
            # pickled later, by the pool's feeder thread: a copy now, whatever the loop does meanwhile
            return self._process.submit(_solve, spec.name, view, job, copy.deepcopy(memory))
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="solver")
        return self._thread.submit(_solve_here, spec, view, job, copy.deepcopy(memory))

    def close(self) -> None:
        """Stop the worker (a solve under way is dropped; nothing adopts it)."""
        for pool in (self._process, self._thread):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._process = self._thread = self._started = None
