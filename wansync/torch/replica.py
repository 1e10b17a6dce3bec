"""This rank's replica of the model and its data plane: attaching to one, and starting every rank
from the same model (rank 0's, as DDP does)."""

from __future__ import annotations

import torch

from . import plane as planes
from .layout import Tensors
from .sync import Sync, SyncError


def open_sync(tensors: Tensors, sync: Sync | None) -> Sync:
    """The given data plane, or the default one for this layout (`wansync.torch.connect`); checked
    against the layout and made the process's current one (where `wt.log` writes)."""
    plane = sync if sync is not None else planes.connect(tensors.layout)
    if plane.params != tensors.layout.flat_size:
        raise ValueError(
            f"the data plane's buffer holds {plane.params} floats, the model needs {tensors.layout.flat_size} "
            f"({tensors.layout.param_numel} parameters, {tensors.layout.buffer_numel} buffer elements, 1 flag)"
        )
    return planes.attach(plane)


def broadcast(sync: Sync, tensors: Tensors) -> None:
    """Rank 0's parameters and floating buffers to every rank, through the data plane: rank 0 writes
    its values, the others zeros, and everyone copies the sum. A script that rejoins a running job
    gets the current model instead: its agent contributes zeros for it, and one of the ranks that
    stayed (the source) its model, which `provide` writes when the agent asks (agents.handoff)."""
    rejoined = bool(getattr(sync, "rejoined", False))
    if hasattr(sync, "provide"):
        def provide(flat: torch.Tensor) -> bool:
            tensors.params_into(flat)
            tensors.buffers_into(flat)
            flat[tensors.layout.flag] = 0.0
            return True
        sync.provide = provide  # type: ignore[attr-defined]
    flat = sync.buffer()
    if sync.rank == 0 and not rejoined:
        tensors.params_into(flat)
        tensors.buffers_into(flat)
        flat[tensors.layout.flag] = 0.0
    else:
        flat.zero_()
    reduced = sync.allreduce()
    if 0 not in reduced.members and not rejoined:
        raise SyncError(f"rank {sync.rank}: the initial broadcast did not include rank 0 (members {reduced.members})")
    with torch.no_grad():
        tensors.params_from(reduced.result)
        tensors.buffers_from(reduced.result)
