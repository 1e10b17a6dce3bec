"""Which training modes make sense under which progress models (docs/training-progress.md has the
table for users).

A progress model says who a worker's result comes from (scheduler.progress: its `groups`): `full`
(every rank, every sync: BSP), `partial` (the group the model formed, which changes: queue, selective,
crew) or `multicast` (the models others multicast to it: mcast-bsp, mcast-ssp). `wansync train` puts
the run's model and its groups in the scripts' environment; `wt.Optimizer` refuses a mode that cannot
work there before the first sync, with the reason, and the launcher shows it.
"""

from __future__ import annotations

import os

from overlay.handoff import GROUPS_ENV, PROGRESS_ENV  # the launcher sets them without importing torch

__all__ = ["GROUPS_ENV", "PROGRESS_ENV", "from_env", "refusal"]

WHY = {
    ("grad", "partial"): (
        "grad mode averages gradients and every rank then takes the same step from the same model; a partial "
        "group gives its members one average and everyone else none, so the replicas drift apart with nothing "
        "to pull them back (no model is ever averaged). Use mode='model': the group averages its members' models "
        "with the scheduler's weights"),
    ("grad", "multicast"): (
        "grad mode needs every rank's gradient at every step; a multicast model delivers some ranks' models to "
        "some others, so each rank would step with a different average and the replicas drift apart. Use "
        "mode='model': a rank averages its model with the ones it received"),
    ("outer", "partial"): (
        "outer mode (DiLoCo) keeps outer parameters and Nesterov momentum that must be the same on every rank; "
        "averaging the pseudo-gradients of a changing group steps each rank's outer optimizer with a different "
        "gradient, and the outer copies and their momentum diverge. Use mode='model' (local SGD with the "
        "group's weighted average)"),
    ("outer", "multicast"): (
        "outer mode (DiLoCo) needs one pseudo-gradient average that every rank's outer optimizer steps with; "
        "received models are a different set on every rank. Use mode='model'"),
}


def refusal(mode: str, groups: str, progress: str = "") -> str | None:
    """Why `mode` cannot train under a progress model whose results come from `groups` (None: it can)."""
    why = WHY.get((mode, groups))
    if why is None:
        return None
    where = f"--progress {progress}" if progress else f"a progress model with {groups} groups"
    return f"mode {mode!r} under {where}: {why}"


def from_env(mode: str) -> str | None:
    """The refusal for this process's run (None outside `wansync train`, or where the pair works)."""
    groups = os.environ.get(GROUPS_ENV, "")
    return refusal(mode, groups, os.environ.get(PROGRESS_ENV, "")) if groups else None
