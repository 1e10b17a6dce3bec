"""Selective reduce (seed 003) and its baselines (P-Reduce, all-reduce, bpaWR) as a progress decision:
core.selective's Controller, told of every READY and task end and woken at its own dt."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..selective import Controller, Launch, SelectiveConfig
from .base import Action, Decision, Form, register


@register()
class Selective(Decision):
    name = "selective"
    rule = "result"

    def __init__(self, config: SelectiveConfig, bandwidth: Mapping[int, float],
                 samples: Sequence[float] = ()) -> None:
        """bandwidth: per worker, Mbit/s (what the controller believes); samples: the runtime profile."""
        super().__init__()
        self.config, self.bandwidth, self.samples = config, bandwidth, tuple(samples)
        self.controller: Controller | None = None

    def start(self, workers: Iterable[int], t: float, *, rounds: int | None = None) -> list[Action]:
        super().start(workers, t, rounds=rounds)
        self.controller = Controller(self.config, workers, self.bandwidth, t0=t, samples=self.samples)
        return []

    def ready(self, worker: int, iteration: int, t: float, *, last: bool = False, defer: bool = False,
              alive: Iterable[int] | None = None) -> list[Action]:
        return self._forms(self._ctl().ready(worker, iteration, t, last=last, defer=defer))

    def over(self, ref: int | None, iters: Mapping[int, int], t: float, *, aborted: bool = False,
             back: Mapping[int, float] | None = None, t_end: float | None = None,
             alive: Iterable[int] | None = None) -> list[Action]:
        assert ref is not None, "a selective task is over without its group"
        if aborted:
            return self._forms(self._ctl().aborted(ref, t))
        return self._forms(self._ctl().done(ref, t, back=back, t_end=t_end))

    def lost(self, worker: int, t: float, *, alive: Iterable[int] | None = None) -> list[Action]:
        super().lost(worker, t)
        return self._forms(self._ctl().lost(worker, t))

    def tick(self, t: float) -> list[Action]:
        return self._forms(self._ctl().tick(t))

    def _ctl(self) -> Controller:
        assert self.controller is not None, "the decision has not started"
        return self.controller

    def _forms(self, launches: list[Launch]) -> list[Action]:
        self.wake_at = self._ctl().wake_at
        return [Form(L.members, None, dict(L.iters), dict(L.weights), L.gid) for L in launches]
