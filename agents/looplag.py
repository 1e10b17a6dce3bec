"""How the event loop fares: the fidelity guard's view of a CPU-starved agent.

A late loop delays every timer the emulated WAN runs on (the delay line, the token buckets), so a
run on a starved machine measures the machine, not the schemes; `wansync.guard.guard_verdict`
judges a run by these figures (sent with each job's STATS).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import numpy as np

LAG_TICK_S = 0.01
# While the node has no traffic the loop is ticked 10x less often: an idle agent's ticks were most of
# its CPU (two 100 Hz tickers: 2.4 % of a core each, 0.39 cores for 16 idle agents on this 2-core
# machine). Only busy ticks are judged (the guard's loop_lag_busy_p99_s); a busy period is ticked at
# LAG_TICK_S from the first tick that finds it, at most IDLE_TICK_S after it began.
IDLE_TICK_S = 0.1


class LoopLag:
    """How late the event loop wakes a sleeper of 10 ms (100 ms while the node is idle: a CPU-starved
    process shows it first), how much of a core the loop's thread used, and how long it waited for a
    CPU (the machine's run queue).

    Lag is also kept apart for the ticks during which `busy()` held (this node had traffic): only
    then does a late loop distort what a run measures."""

    def __init__(self, busy: Callable[[], bool] | None = None) -> None:
        self.samples: list[float] = []
        self.busy_samples: list[float] = []
        self._busy = busy
        self._task: asyncio.Task | None = None
        self._tid = threading.get_native_id()
        self._mark = self._clocks()

    def start(self) -> None:
        self._tid = threading.get_native_id()  # the loop's thread
        self._mark = self._clocks()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        busy = self._busy
        while True:
            t = time.perf_counter()
            was = busy is not None and busy()
            tick = LAG_TICK_S if was or busy is None else IDLE_TICK_S
            await asyncio.sleep(tick)
            lag = time.perf_counter() - t - tick
            self.samples.append(lag)
            if was or (busy is not None and busy()):
                self.busy_samples.append(lag)

    def _clocks(self) -> tuple[float, float, float, int]:
        """(wall, loop thread's CPU s, its run-queue wait s, times it ran) from /proc (Linux
        schedstat); elsewhere the wait and count are 0."""
        try:
            with open(f"/proc/self/task/{self._tid}/schedstat") as fh:
                run_ns, wait_ns, slices = (int(x) for x in fh.read().split()[:3])
            return time.perf_counter(), run_ns / 1e9, wait_ns / 1e9, slices
        except (OSError, ValueError):
            return time.perf_counter(), time.thread_time(), 0.0, 0

    def take(self) -> dict[str, float]:
        """The figures since the previous take (or start), and start over."""
        s, self.samples = self.samples, []
        b, self.busy_samples = self.busy_samples, []
        now, mark = self._clocks(), self._mark
        self._mark = now
        wall = max(1e-9, now[0] - mark[0])
        cpu, wait, runs = now[1] - mark[1], now[2] - mark[2], now[3] - mark[3]
        return {"loop_lag_p99_s": float(np.percentile(s, 99)) if s else 0.0,
                "loop_lag_max_s": max(s, default=0.0),
                "loop_lag_busy_p99_s": float(np.percentile(b, 99)) if b else 0.0,
                "loop_busy_ticks": len(b), "loop_ticks": len(s),
                "loop_cpu_share": cpu / wall, "runq_wait_share": wait / wall,
                "runq_wait_per_run_s": wait / runs if runs > 0 else 0.0}

    def take_p99(self) -> float:
        return self.take()["loop_lag_p99_s"]

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
