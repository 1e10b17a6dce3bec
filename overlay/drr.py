"""Which flow's bytes go next on one link: per-flow queues served by deficit round-robin.

A link carries several flows at once (one per origin -> destination of its transfers: a node's own
chunks, chunks it relays for others). Each flow queues its transfers in order; every turn a flow
earns one quantum of bytes and sends segments while its credit lasts, so flows share the link fairly
in bytes although single-hop segments are larger than relayed ones. This is the one place that
decides how one traffic class's flows share a link; weighted shares, deadlines and strict priority
between classes are one level up (overlay.classes), not in the sender that writes the bytes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    """What the scheduler needs of a transfer: its flow, how far it is sent, how much is there."""

    flow: Hashable
    sent: int  # bytes already handed to the wire
    total: int  # bytes of the whole transfer
    ready: int  # bytes available so far (grows while a relay still receives the chunk)

    def view(self, start: int, n: int) -> memoryview:
        """Up to n bytes from `start` (fewer where the payload is stored in parts)."""
        ...


T = TypeVar("T", bound=Queued)


class DeficitRoundRobin(Generic[T]):
    """Per-flow FIFOs of transfers; `next` picks the next segment of the flow whose turn it is."""

    def __init__(self) -> None:
        self._flows: dict[Hashable, deque[T]] = {}
        self._order: deque[Hashable] = deque()  # flows with queued transfers, the current turn first
        self._deficit: dict[Hashable, int] = {}  # bytes each flow may still send this turn
        self._turn: Hashable | None = None  # the flow whose turn has begun (it earned its quantum)

    def __bool__(self) -> bool:
        """Some transfer is queued (sent in full or not)."""
        return bool(self._order)

    def enqueue(self, item: T) -> None:
        """Queue a transfer behind the others of its flow (a new flow takes the last turn)."""
        q = self._flows.get(item.flow)
        if q is None:
            q = self._flows[item.flow] = deque()
            self._order.append(item.flow)
        q.append(item)

    def remove(self, item: T) -> None:
        """Take a transfer out before it was sent in full (acknowledged early, or cancelled)."""
        q = self._flows.get(item.flow)
        if q and item in q:
            q.remove(item)

    def clear(self) -> None:
        """Forget every queue and credit (a reconnect queues everything unacknowledged again)."""
        self._flows.clear()
        self._order.clear()
        self._deficit.clear()
        self._turn = None

    def next(self, quantum: int, step: Callable[[T], int]) -> tuple[T, memoryview] | None:
        """The next segment to send, or None if no flow has bytes ready. A flow whose turn begins
        earns `quantum` bytes of credit; `step(item)` is the largest segment that transfer may send.
        A flow waiting for its bytes (a relay's upstream) passes its turn and keeps no credit."""
        for _ in range(len(self._order) + 1):
            if not self._order:
                return None
            flow = self._order[0]
            if self._turn != flow:
                self._turn = flow
                self._deficit[flow] = self._deficit.get(flow, 0) + quantum
            q = self._flows[flow]
            while q and q[0].sent >= q[0].total:
                q.popleft()
            if not q:
                del self._flows[flow]
                self._deficit.pop(flow, None)
                self._order.popleft()
                self._turn = None
                continue
            tr = q[0]
            if tr.ready > tr.sent:
                size = min(step(tr), tr.ready - tr.sent)
                if size <= self._deficit[flow]:
                    seg = tr.view(tr.sent, size)
                    self._deficit[flow] -= len(seg)
                    return tr, seg
            else:
                self._deficit[flow] = 0  # waiting for a relay's upstream: an idle flow saves no credit
            self._order.rotate(-1)
            self._turn = None
        return None
