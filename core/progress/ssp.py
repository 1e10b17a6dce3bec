"""SSP (stale synchronous parallel) with a staleness bound s, as SelMcast uses it (digest 000 §2.4).

After computing iteration k a worker's parameters are multicast to every other worker; an iteration
of a worker is *done* once that multicast is over. With d_j the last done iteration of worker j (-1
before its first), worker i may compute iteration k only when

    d_i >= k - 1               its own previous multicast is over, and
    k <= min_j d_j + 1 + s     it is at most s iterations ahead of the slowest one's done count

over the workers still in the job (s = 0 is BSP's lockstep). A `Go` tells a worker whenever its
allowance rises. Waiting for its own multicast keeps a fast worker from piling up transfers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .base import INF, Action, Decision, Form, Go, register


@register()
class Ssp(Decision):
    name = "ssp"
    rule = "bound"

    def __init__(self, staleness: int = 2) -> None:
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        super().__init__()
        self.s = staleness
        self.last: float = INF  # the last iteration
        self.done: dict[int, int] = {}  # worker -> its last done iteration (its multicast is over)
        self.allowed: dict[int, int] = {}  # worker -> the highest iteration a Go allowed it
        self.violations = 0  # READYs for an iteration no Go allowed (must stay 0)

    def start(self, workers: Iterable[int], t: float, *, rounds: int | None = None) -> list[Action]:
        super().start(workers, t, rounds=rounds)
        self.last = INF if rounds is None else rounds - 1
        self.done = {n: -1 for n in workers}
        return self.advance()

    def ready(self, worker: int, iteration: int, t: float, *, last: bool = False, defer: bool = False,
              alive: Iterable[int] | None = None) -> list[Action]:
        """The worker's iteration goes to every other living worker; nobody to tell: done at once."""
        if iteration > self.allowed.get(worker, -1):  # it computed an iteration no Go allowed
            self.violations += 1
        others = tuple(n for n in self._alive(alive) if n != worker)
        if others:
            return [Form((worker,), others, {worker: iteration})]
        return self.finished(worker, iteration)

    def over(self, ref: int | None, iters: Mapping[int, int], t: float, *, aborted: bool = False,
             back: Mapping[int, float] | None = None, t_end: float | None = None,
             alive: Iterable[int] | None = None) -> list[Action]:
        out: list[Action] = []
        for worker, k in iters.items():  # over, exact or given up: the worker may go on
            out += self.finished(worker, k)
        return out

    def lost(self, worker: int, t: float, *, alive: Iterable[int] | None = None) -> list[Action]:
        super().lost(worker, t)
        self.done.pop(worker, None)  # the slowest is among the living
        return self.advance()

    def synced(self, worker: int) -> int:
        return self.done.get(worker, -1) + 1

    def finished(self, worker: int, k: int) -> list[Action]:
        """The multicast of the worker's iteration k is over (or there was none)."""
        if worker not in self.done:
            return []
        self.done[worker] = max(self.done[worker], k)
        return self.advance()

    def advance(self) -> list[Action]:
        """Each worker's allowance min(d_i + 1, min_j d_j + 1 + s, last): a Go where it rose."""
        floor = min(self.done.values(), default=-1)
        out: list[Action] = []
        for n, d in self.done.items():
            upto = int(min(d + 1, floor + 1 + self.s, self.last))
            if upto > self.allowed.get(n, -1):
                self.allowed[n] = upto
                out.append(Go(n, upto))
        return out
