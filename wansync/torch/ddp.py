"""`wt.ddp(model)`: DistributedDataParallel whose gradients travel through a wansync data plane.

DDP itself needs a process group: one is made (Gloo, from torchrun's environment) if there is none.
It carries only what DDP does at construction (broadcasting rank 0's parameters and buffers) and
nothing per step: the gradient all-reduce is replaced by a communication hook, and buffers are not
broadcast before each forward (`forward_sync_buffers=False` unless given); floating buffers are averaged
through the data plane with the gradients instead, as `wt.Optimizer` does in `grad` mode.

The hook collects one backward's buckets and, when the last arrives, sends the whole flat gradient
once (the data plane's buffer is the model's layout, not a bucket), folding the data plane's check
trailer in the copy as wt.Optimizer's grad mode does; each bucket's future then completes with its
averaged slice. A rank whose gradients are not finite (a GradScaler overflow)
sends zeros and raises the flag: every rank then gets inf gradients, so every scaler skips the step,
as under plain DDP where the inf travels in the sum.
"""

# No `from __future__ import annotations`: DDP compares the hook's annotations with the real types.
import inspect
import math
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .gloo import process_group
from .layout import Tensors, copy_folded
from .replica import open_sync
from .sync import Sync


class _Hook:
    """The communication hook's state: the buckets of the backward in progress."""

    def __init__(self, sync: Sync, tensors: Tensors) -> None:
        self.sync, self.tensors = sync, tensors
        self.index = {id(p): i for i, p in enumerate(tensors.params)}
        self.pending: list[tuple[Any, torch.futures.Future]] = []

    def add(self, bucket: dist.GradBucket) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        self.pending.append((bucket, future))
        if bucket.is_last():
            self._sync()
        return future

    def _sync(self) -> None:
        pending, self.pending = self.pending, []
        tensors, layout, flat = self.tensors, self.tensors.layout, self.sync.buffer()
        fold = self.sync.folder()  # the data plane's check trailer, folded in the copy (None: Gloo)
        written = set()
        for bucket, _ in pending:
            for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
                i = self.index[id(p)]
                dst, src = tensors.param_slice(flat, i), g.reshape(-1)
                if fold is None:
                    dst.copy_(src)
                else:
                    copy_folded(dst, src, 1.0, layout.params[i].offset, fold)
                written.add(i)
        for i, spec in enumerate(layout.params):  # parameters DDP left out of every bucket contribute zeros
            if i not in written:
                tensors.param_slice(flat, i).zero_()
                if fold is not None:
                    fold.zeros(spec.numel)
        # a non-finite value makes the fold's L1 non-finite: no pass of its own to find one
        overflow = (not math.isfinite(fold.l1) if fold is not None
                    else not bool(torch.isfinite(flat[: layout.param_numel]).all()))
        if overflow:
            flat[: layout.param_numel].zero_()
            if fold is not None:
                fold.reset()
                fold.zeros(layout.param_numel)
        tensors.buffers_into(flat, fold)
        tensors.flag_into(flat, 1.0 if overflow else 0.0, fold)
        try:
            reduced = self.sync.allreduce()
        except Exception as e:
            for _, future in pending:
                future.set_exception(e)
            raise
        skip = float(reduced.result[layout.flag]) > 0
        w = 1.0 / reduced.weight
        tensors.buffers_from(reduced.result, w)
        for bucket, future in pending:
            buffer = bucket.buffer()
            out = torch.empty_like(buffer)
            if skip:
                out.fill_(float("inf"))
            else:
                offset = 0
                for p in bucket.parameters():
                    part = tensors.param_slice(reduced.result, self.index[id(p)])
                    torch.mul(part, w, out=out[offset : offset + part.numel()])
                    offset += part.numel()
                if offset != buffer.numel():
                    raise RuntimeError(f"bucket {bucket.index()}: {buffer.numel()} elements, parameters hold {offset}")
            future.set_result(out)


def wansync_hook(state: _Hook, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's communication hook: hand the bucket to the state, which syncs after the last one."""
    return state.add(bucket)


def ddp(model: torch.nn.Module, *, sync: Sync | None = None, **ddp_kwargs: Any) -> DistributedDataParallel:
    """`DistributedDataParallel(model, **ddp_kwargs)` with the gradient all-reduce done by the data
    plane (`sync`, or `wansync.torch.connect`'s default)."""
    group = process_group()
    if group is not None:
        ddp_kwargs.setdefault("process_group", group)
    if "broadcast_buffers" not in ddp_kwargs and "forward_sync_buffers" not in ddp_kwargs:
        # buffers still go out once, at construction; torch before 2.13 names the switch broadcast_buffers
        newer = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
        ddp_kwargs["forward_sync_buffers" if newer else "broadcast_buffers"] = False
    wrapped = DistributedDataParallel(model, **ddp_kwargs)  # broadcasts rank 0's model over the group
    tensors = Tensors.of(model)
    plane = open_sync(tensors, sync)
    wrapped.register_comm_hook(_Hook(plane, tensors), wansync_hook)
    return wrapped
