"""What `wt.Optimizer` and `wt.ddp` need of a data plane: a flat float32 buffer to fill, and the
sum of every rank's buffer back.

Two data planes implement it: `Channel` (wansync.torch.channel: the rank's agent, over the local
hand-off channel; the scheme the scheduler runs moves the bytes) and `GlooSync` (plain
`torch.distributed.all_reduce` on Gloo: the baseline on the same WAN). The optimizer never knows
which one it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from core.sketch import Folder


class SyncError(RuntimeError):
    """A synchronization failed (a rank's contribution was not finite, the job ended, the agent went
    away); the message names the rank where it can."""


@dataclass(frozen=True)
class Reduced:
    """One synchronization's outcome: `result` is the sum of the members' buffers (weighted by the
    scheme's weights; a view into memory the data plane owns, valid until the next `buffer()`),
    `weight` the sum of the members' weights (the number of members for a plain sum), `members`
    the ranks that contributed, `weights` their weights in that order (empty where the data plane
    does not say)."""

    result: torch.Tensor
    weight: float
    members: tuple[int, ...]
    weights: tuple[float, ...] = ()


class Sync(Protocol):
    rank: int
    world: int
    params: int  # length of the flat buffer

    def buffer(self) -> torch.Tensor:
        """The flat float32 buffer (length `params`) the next `allreduce` sends; write it in place."""
        ...

    def folder(self) -> Folder | None:
        """A fold of the data plane's check trailer to fill while writing this step's buffer (the
        writer folds each piece as it writes it: core.sketch.Folder), or None where the data plane
        checks its own way. A fold that missed a value is ignored, the data plane then folds itself."""
        ...

    def allreduce(self) -> Reduced:
        """Send the buffer; block until the sum of every member's buffer is here."""
        ...

    def log(self, **metrics: float) -> None:
        """Metrics of this rank (step, accuracy, loss, ...) into the run's results."""
        ...

    def close(self) -> None:
        """Detach: no more synchronizations from this rank."""
        ...
