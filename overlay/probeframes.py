"""Probe frames on the receiving side: counted, timed and acknowledged like any chunk, their bytes read past.

A probe (CHUNK kind "probe", agents/linkprobe.py) only measures its link. Its payload is discarded
as it is read (the codec's DISCARD: nothing allocated), so it is never held, relayed, or offered to a
task: it cannot enter a sum. What remains of each chunk is a byte count, bounded per peer by
MAX_PROBE_CHUNKS chunks open at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .messages import MAX_PROBE_CHUNKS, ChunkKey, ProtocolError


@dataclass
class _Open:
    total: int
    got: int = 0


class ProbeFrames:
    def __init__(self) -> None:
        self._open: dict[int, dict[ChunkKey, _Open]] = {}  # per peer: its probe chunks not yet whole

    def header(self, peer: int, h: dict[str, Any], key: ChunkKey) -> _Open:
        """A probe segment's header: the chunk it continues, or a new one (a resend starts over)."""
        open_ = self._open.setdefault(peer, {})
        rx = open_.get(key)
        if rx is None or rx.total != h["total"] or h["off"] != rx.got:
            if rx is None and len(open_) >= MAX_PROBE_CHUNKS:
                raise ProtocolError(f"more than {MAX_PROBE_CHUNKS} probe chunks open at once", field="chunk",
                                    peer=peer, msg_type="CHUNK")
            rx = open_[key] = _Open(h["total"])
        return rx

    def segment(self, peer: int, h: dict[str, Any], key: ChunkKey, rx: _Open) -> tuple[int, bool]:
        """Its bytes were read past: how many count as the link's (0 if the chunk was dropped meanwhile),
        and whether the chunk is now whole (to be acknowledged and timed)."""
        open_ = self._open.get(peer, {})
        if open_.get(key) is not rx:
            return 0, False
        rx.got += h["nbytes"]
        if rx.got < rx.total:
            return h["nbytes"], False
        del open_[key]
        return h["nbytes"], True

    def drop(self, peer: int) -> None:
        """The connection closed: a probe's resend starts over and is timed anew."""
        self._open.pop(peer, None)
