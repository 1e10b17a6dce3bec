"""Progress models: when workers synchronize, and how far one may run ahead of the others.

A progress model is what the scheduler runs, like a planner. It hears every worker's READY (it
computed an iteration), every task recorded and every worker lost, and answers by forming tasks
(`Control.form`, or the BSP barrier) and by allowing iterations (`Control.go`). What bsp, ssp, queue
and selective decide is core.progress's (one registry, `core.progress.DECISIONS`, which the
simulator's job mode drives too): their modules here adapt those pure decisions to `Control`. crew
and mcast-* act on the scheduler's own view, plans and records, so they live here only (on the
`queue` and `ssp` decisions).
Its `rule` tells the workers what to wait for before their next iteration: "result" (the task that
holds their contribution) or "bound" (a GO that allows the iteration).

    bsp     one task per round, formed once every member is READY (NetStorm's per-iteration request)
    ssp     a multicast from every worker after every iteration, to the others; a worker may compute
            iteration k once its own multicast of k - 1 is over and k <= (the slowest worker's last
            iteration whose multicast is over) + 1 + s (SelMcast's SSP, digest 000 §2.4)
    queue   a ready queue: workers queue on READY, the first p queued form a partial reduce (P-Reduce);
            the last workers, when fewer than p remain, form one with whoever is left
    crew    the ready queue with CREW's failure rules: a task whose member is lost or that overruns its
            time budget is abandoned, a failed aggregator's block moves to the Eq. (3) replacement
    selective  selective reduce (seed 003) and its baselines on one controller (core.selective): BAG
            groups by bandwidth, bpaWR waits for faster workers, P-Reduce, all-reduce (scheme=sr|pr|ar|pa)
    mcast-bsp, mcast-ssp   multicasts to chosen receivers (SelMcast, Orpheus): mcast.py

What the scheduler needs of a model (its barrier, how far ahead agents may run, whether it multicasts,
how it retries and ends) is declared in base.Progress; models register in base.MODELS, and this
package imports each once so that `resolve` knows them all.
"""

from __future__ import annotations

from . import bsp, crew, mcast, queue, selective, ssp  # noqa: F401  (each registers its models)
from .base import DEFAULT, MODELS, Control, Model, Progress, register, resolve

__all__ = ["DEFAULT", "MODELS", "Control", "Model", "Progress", "register", "resolve"]
