"""Your own PyTorch training through wansync, in two lines:

    import wansync.torch as wt
    opt = wt.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)   # the loop stays as it is
    wt.log(step=step, accuracy=acc)                                         # optional: metrics into the results

or `model = wt.ddp(model)` for code written around DistributedDataParallel. Under `wansync train`
the data plane is the rank's agent (`channel.Channel`); with WANSYNC_BASELINE=gloo it is plain
`torch.distributed` on Gloo (`gloo.GlooSync`), with the same optimizer code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "wansync.torch needs PyTorch: install with pip install -e '.[torch]' (pins torch==2.13.0, CPU build)"
    ) from e

from .plane import connect, log
from .sync import Reduced, Sync, SyncError

if TYPE_CHECKING:
    from .ddp import ddp
    from .optimizer import Optimizer

__all__ = ["Optimizer", "Reduced", "Sync", "SyncError", "connect", "ddp", "log"]

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
