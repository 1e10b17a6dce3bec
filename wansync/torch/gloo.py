"""The baseline data plane: the same optimizer code over plain `torch.distributed.all_reduce` on Gloo.

`wansync train` runs it on the same shaped WAN as wansync's own data plane (WANSYNC_BASELINE=gloo),
so that a comparison changes nothing but how the bytes move.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist

from .sync import Reduced, SyncError


def process_group() -> dist.ProcessGroup | None:
    """A Gloo group of every rank: the default group, initialized from torchrun's environment
    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) if there is none yet; a Gloo group beside it if the
    default group has another backend (NCCL)."""
    if not dist.is_initialized():
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise SyncError(f"no process group and no torchrun environment to make one (missing {', '.join(missing)})")
        dist.init_process_group("gloo")
    if dist.get_backend() == "gloo":
        return None  # the default group
    return dist.new_group(backend="gloo")


class GlooSync:
    """`Sync` over Gloo: a SUM all-reduce of the flat float32 buffer; every rank is a member with
    weight 1. The buffer travels with one trailing float per rank, set by a rank whose contribution
    is not finite (which then sends zeros), so that every rank raises `SyncError` naming it in the
    same step instead of some ranks waiting forever."""

    def __init__(self, params: int) -> None:
        self.group = process_group()
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.params = params
        self._data = torch.zeros(params + self.world, dtype=torch.float32)
        self._metrics_path = os.environ.get("WANSYNC_METRICS")
        self.metrics: list[dict[str, float]] = []  # kept here when WANSYNC_METRICS is not set
        self._closed = False
        self.steps = 0
        self.sync_s = 0.0  # time in all_reduce (reported at close, as the channel does)
        self._t0 = time.perf_counter()
        self.log(attached=1.0)  # init_process_group was a barrier: every rank is here

    def buffer(self) -> torch.Tensor:
        return self._data[: self.params]

    def folder(self) -> None:
        return None  # Gloo's sum carries no trailer

    def allreduce(self) -> Reduced:
        if self._closed:
            raise SyncError(f"rank {self.rank}: allreduce after close")
        flags = self._data[self.params :]
        flags.zero_()
        if not bool(torch.isfinite(self.buffer()).all()):
            self.buffer().zero_()
            flags[self.rank] = 1.0
        t = time.perf_counter()
        dist.all_reduce(self._data, op=dist.ReduceOp.SUM, group=self.group)
        self.sync_s += time.perf_counter() - t
        self.steps += 1
        bad = [r for r in range(self.world) if flags[r].item() != 0.0]
        if bad:
            raise SyncError(f"rank {', '.join(map(str, bad))}: contribution not finite (inf or nan)")
        return Reduced(self.buffer(), float(self.world), tuple(range(self.world)))

    def log(self, **metrics: float) -> None:
        record = {"rank": self.rank, "t": time.time(), **{k: float(v) for k, v in metrics.items()}}
        if self._metrics_path:
            with open(self._metrics_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        else:
            self.metrics.append(record)

    def close(self) -> None:
        if not self._closed:
            self.log(steps=self.steps, sync_s=self.sync_s, wall_s=time.perf_counter() - self._t0,
                     flat=self.params, **_schedstat())
        self._closed = True


def _schedstat() -> dict[str, float]:
    """This process's CPU time, run-queue wait and wake-ups over all its threads (Linux schedstat), so
    a launcher can tell a baseline starved of CPU from a slow network; {} where there is none."""
    run = wait = slices = 0
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/schedstat") as fh:
                r, w, n = (int(x) for x in fh.read().split()[:3])
            run, wait, slices = run + r, wait + w, slices + n
    except (OSError, ValueError):
        return {}
    return {"cpu_s": run / 1e9, "runq_s": wait / 1e9, "runs": float(slices)}
