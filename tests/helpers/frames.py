"""Frames by hand: chunk headers, a fake transport and a recording handler for the real FrameProtocol,
and a feeder that hands it bytes in random splits."""

from __future__ import annotations

import random

import numpy as np

from overlay.codec import FrameProtocol
from overlay.messages import bitmap, chunk_key


def header(**kw) -> dict:  # noqa: ANN003
    """A CHUNK header as the overlay's senders write it (before path/hop/offsets), with `kw` on top."""
    h = {"t": "CHUNK", "job": 1, "task": 0, "attempt": 0, "version": 1, "chunk": 0, "kind": "agg",
         "origin": 0, "contributors": bitmap([0]), "t_send": 0.0}
    h.update(kw)
    return h


class Recorder:
    def __init__(self, dest: np.ndarray | None = None):
        self.frames, self.invalid, self.closed, self.dest = [], [], [], dest

    def on_header(self, header):
        return None if self.dest is None else memoryview(self.dest).cast("B")[: header["nbytes"]]

    def on_frame(self, header, payload):
        self.frames.append((header, None if payload is None else bytes(payload)))

    def on_invalid(self, error):
        self.invalid.append(error)

    def on_closed(self, error):
        self.closed.append(error)


class FakeTransport:
    def __init__(self):
        self.aborted = False
        self.reading = True

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True

    def abort(self):
        self.aborted = True

    def is_closing(self):
        return self.aborted


def feed(proto: FrameProtocol, data: bytes, rng: random.Random) -> None:
    i = 0
    while i < len(data) and not proto.transport.aborted:
        buf = proto.get_buffer(-1)
        n = min(len(buf), len(data) - i, rng.randint(1, 9000))
        buf[:n] = data[i:i + n]
        proto.buffer_updated(n)
        i += n


def chunk(nbytes: int, **kw) -> dict:
    h = {"t": "CHUNK", "job": 1, "task": 0, "attempt": 0, "version": 1, "chunk": 3, "kind": "agg",
         "origin": 0, "contributors": bitmap([0]), "t_send": 1.5, "path": [0, 1], "hop": 0, "off": 0,
         "total": nbytes, "nbytes": nbytes}
    h.update(kw)
    return h


class Sink:
    """An overlay's sink that keeps every segment delivered to it: (chunk key, offset, bytes)."""

    def __init__(self):
        self.segments = []

    def chunk_buffer(self, h):
        return None

    def chunk_segment(self, h, payload):
        self.segments.append((chunk_key(h), h["off"], bytes(payload)))
