"""The solver (scheduler/solver.py): slow re-plans run in a niced process of their own once it has
started, come back with the planner's memory, and equal the same solve done here."""

from __future__ import annotations

import os
import signal

import pytest

from core.plan import Job
from emulation.topology import internet2
from scheduler import planners
from scheduler.solver import SOLVER_NICE, Solver
from wansync.predict import oracle_view


@pytest.mark.loopback
def test_a_solve_in_the_niced_process_equals_one_here_and_brings_its_memory_back():
    view = oracle_view(internet2(seed=1))
    job = Job(200_000, 20_000, tuple(range(9)), dict(planners.resolve("netstorm").options))
    solver = Solver()
    try:
        solver.warm()
        solver._started.result(120)  # the worker answered its first call: it is up
        assert solver.ready
        [pid] = solver._process._processes  # the one worker
        assert os.getpriority(os.PRIO_PROCESS, pid) >= SOLVER_NICE
        assert solver._process.submit(signal.getsignal, signal.SIGINT).result(60) == signal.SIG_IGN  # ^C: not its
        spec = planners.resolve("netstorm")
        plan, memory, cpu_s = solver.submit(spec, view, job, {}).result(120)
        mine: dict = {}
        assert plan == spec.plan(view, job, mine) and memory == mine and memory  # NetStorm keeps its roots
        assert cpu_s >= 0
    finally:
        solver.close()


@pytest.mark.unit
def test_a_spec_the_worker_cannot_find_by_name_solves_in_a_thread_here():
    calls = []

    def plan(view, job, memory):
        calls.append(os.getpid())
        memory["seen"] = True
        return planners.resolve("ring").plan(view, job)

    spec = planners.PlannerSpec("not-registered", plan)
    solver = Solver()
    try:
        view = oracle_view(internet2(seed=1))
        memory = {"kept": 1}
        _, out, _ = solver.submit(spec, view, Job(100_000, 10_000, tuple(range(9))), memory).result(60)
        assert calls == [os.getpid()] and out == {"kept": 1, "seen": True} and memory == {"kept": 1}
        assert solver._process is None  # no worker started for it
    finally:
        solver.close()
