"""Your own PyTorch training through wansync, in two lines:

    import wansync.torch as wt
    opt = wt.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)   # the loop stays as it is
    wt.log(step=step, accuracy=acc)                                         # optional: metrics into the results

or `model = wt.ddp(model)` for code written around DistributedDataParallel. Under `wansync train`
the data plane is the rank's agent (`channel.Channel`); with WANSYNC_BASELINE=gloo it is plain
`torch.distributed` on Gloo (`gloo.GlooSync`), with the same optimizer code.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "wansync.torch needs PyTorch: install with pip install -e '.[torch]' (pins torch==2.13.0, CPU build)"
    ) from e

from .layout import Layout
from .sync import Reduced, Sync, SyncError

if TYPE_CHECKING:
    from .ddp import ddp
    from .optimizer import Optimizer

__all__ = ["Optimizer", "Reduced", "Sync", "SyncError", "connect", "ddp", "log"]

_current: Sync | None = None  # the data plane this process syncs through (the last one attached)
_warned = False


def connect(layout: Layout) -> Sync:
    """The default data plane for a model of this layout: plain Gloo when WANSYNC_BASELINE=gloo,
    else the rank's wansync agent over the channel `wansync train` named in WANSYNC_CHANNEL."""
    baseline = os.environ.get("WANSYNC_BASELINE", "")
    if baseline == "gloo":
        from .gloo import GlooSync

        return GlooSync(layout.flat_size)
    if baseline:
        raise ValueError(f"WANSYNC_BASELINE={baseline!r}: the only baseline is 'gloo'")
    if not os.environ.get("WANSYNC_CHANNEL"):
        raise RuntimeError(
            "not started by `wansync train` (no WANSYNC_CHANNEL); "
            "set WANSYNC_BASELINE=gloo for plain torch.distributed"
        )
    from . import channel

    return channel.Channel.from_env(layout)


def attach(sync: Sync) -> Sync:
    """Make `sync` the process's current data plane (the one `log` writes to)."""
    global _current
    _current = sync
    return sync


def log(**metrics: float) -> None:
    """This rank's metrics (step, accuracy, loss, ...) into the run's results, through the current
    data plane; without one (no Optimizer or ddp made yet) a no-op that warns once."""
    global _warned
    if _current is None:
        if not _warned:
            warnings.warn(
                "wansync.torch.log: no data plane yet (make wt.Optimizer or wt.ddp first); metrics dropped",
                stacklevel=2,
            )
            _warned = True
        return
    _current.log(**metrics)


def __getattr__(name: str) -> Any:
    """Optimizer and ddp load on first use. The name is then bound here for good: importing the
    submodule `.ddp` binds the module to that name, which the function must replace."""
    if name == "Optimizer":
        from .optimizer import Optimizer as found
    elif name == "ddp":
        from .ddp import ddp as found
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = found
    return found
