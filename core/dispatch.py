"""NetStorm's dispatch knobs and rule, in one place.

The agents' chunk engine sends by them and the simulator predicts by them, so both read them here:
a chunk ready on a tree edge with auxiliary routes leaves by the first auxiliary route with room once
the primary path is busy (`pick`), and a node's passive link probes count chunks of a minimum size.
The defaults are NetStorm's; the CLI's --primary-busy-bound, --aux-queue-length and --probe-num
override them per run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

R = TypeVar("R")


@dataclass(frozen=True)
class Dispatch:
    """How chunks pick a route among the primary and the auxiliary ones, and what counts as a probe."""

    primary_busy_bound: int = 2  # PRIMARY_BUSY_BOUND: transfers in transit that make the primary busy (Fig. 17)
    aux_queue_length: int = 5  # AUXILIARY_QUEUE_LENGTH: transfers an auxiliary route may hold in transit
    probe_chunk_bytes: int = 2_000_000  # PROBE_CHUNK_SIZE: a chunk this big counts as a link probe
    probe_num: int = 4  # PROBE_CHUNK_NUM: probes per estimate of a link

    def pick(self, primary: R, aux: Sequence[R] | None, in_transit: Callable[[R], int]) -> R | None:
        """The auxiliary route a ready chunk takes, or None: the primary. Once `primary_busy_bound`
        transfers are in transit on the primary, the first auxiliary route with fewer than
        `aux_queue_length` takes it; when every one is full the chunk queues on the primary after all."""
        if aux and in_transit(primary) >= self.primary_busy_bound:
            for route in aux:
                if in_transit(route) < self.aux_queue_length:
                    return route
        return None

    def but(self, **knobs: int | None) -> Dispatch:
        """These knobs changed, those given as None kept (a launcher's optional overrides)."""
        given = {k: v for k, v in knobs.items() if v is not None}
        return replace(self, **given) if given else self


DISPATCH = Dispatch()  # NetStorm's settings, what every run uses unless told otherwise
