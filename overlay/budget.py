"""Memory a node holds on behalf of others: relayed chunks and frames held for a later round.

Neither is bounded by anything the node itself controls, so both draw on one budget per node, and
no single peer may use more than its share of it: a neighbour that floods (or lies about sizes)
runs out of room alone. Bytes are charged as they arrive, never from a size a peer announced, and
given back when the chunk is forwarded and acknowledged, replayed, or dropped with its round.
"""

from __future__ import annotations

from collections.abc import Hashable

PEER_SHARE = 0.5  # one peer may hold at most this share of the node's budget


class MemoryBudget:
    def __init__(self, limit: int, *, peer_share: float = PEER_SHARE) -> None:
        if limit <= 0:
            raise ValueError(f"a memory budget must be positive, got {limit}")
        self.limit = limit
        self.peer_share = peer_share
        self.used = 0
        self.peak = 0
        self.refused = 0  # times room() said no
        self.by_peer: dict[Hashable, int] = {}

    @property
    def peer_limit(self) -> int:
        return max(1, int(self.limit * self.peer_share))

    def room(self, peer: Hashable, nbytes: int) -> bool:
        """Would holding `nbytes` more for `peer` stay within both limits? (Counts a refusal if not.)"""
        ok = self.used + nbytes <= self.limit and self.by_peer.get(peer, 0) + nbytes <= self.peer_limit
        if not ok:
            self.refused += 1
        return ok

    def take(self, peer: Hashable, nbytes: int) -> None:
        """Charge bytes that arrived (after `room` allowed them: at most one frame per connection over)."""
        self.used += nbytes
        self.by_peer[peer] = self.by_peer.get(peer, 0) + nbytes
        self.peak = max(self.peak, self.used)

    def give(self, peer: Hashable, nbytes: int) -> None:
        self.used -= nbytes
        left = self.by_peer.get(peer, 0) - nbytes
        if left > 0:
            self.by_peer[peer] = left
        else:
            self.by_peer.pop(peer, None)
