"""Which data plane this process synchronizes through: the default one for a model (`connect`), and
the current one, where `wt.log` writes metrics."""

from __future__ import annotations

import atexit
import os
import warnings

from .layout import Layout
from .sync import Sync

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
    from .channel import Channel

    return Channel.from_env(layout)


def attach(sync: Sync) -> Sync:
    """Make `sync` the process's current data plane (the one `log` writes to)."""
    global _current
    _current = sync
    atexit.register(sync.close)  # the script's summary (steps, time in sync) and a clean detach
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
