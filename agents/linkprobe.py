"""Active probes: the scheduler asks this node to keep one idle link busy for a moment, so the view learns it.

A probe is `chunks` back-to-back chunks of kind "probe" to one neighbour, through the same link sender,
shaper and kernel queues as every chunk (so it measures what a plan's chunks would get), under the
cluster's authentication. It is its own traffic class of weight PROBE_WEIGHT: where a plan's chunks
share the link it takes a sliver and the plan the rest. The receiver reads its bytes past without
keeping them (overlay/probeframes.py): it never meets a task, so it can never enter a sum. The receiver times
it like any chunk (agents/probes.py); this node reports when every chunk was acknowledged
(PROBE_DONE), which frees the probe's slot at the scheduler. One probe at a time: a second order
while one runs is answered at once with ok=false.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from core.classes import TrafficClass
from overlay.messages import PROBE_JOB, Probe, ProbeDone, Record, chunk_header
from overlay.peers import Overlay

log = logging.getLogger("wansync.agent")

PROBE_WEIGHT = 1 / 16  # a probe's share of a link where a plan's chunks want it too
PROBE_TIMEOUT_S = 60.0  # a probe not acknowledged by then is reported failed (a link cut meanwhile)


class ProbeSender:
    def __init__(self, node: int, overlay: Overlay, send: Callable[[Record], None]) -> None:
        self.node, self.overlay, self.send = node, overlay, send
        self._zeros = memoryview(b"")
        self._task: asyncio.Task | None = None

    def order(self, msg: Probe) -> None:
        """The scheduler's PROBE: start it, or say at once why not."""
        if self._task is not None and not self._task.done():
            self._reply(msg, 0.0, "a probe is already running on this node")
        elif msg.dst not in self.overlay.senders:
            self._reply(msg, 0.0, f"node {msg.dst} is not a neighbour of node {self.node}")
        else:
            self._task = asyncio.get_running_loop().create_task(self._run(msg))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self, msg: Probe) -> None:
        size = max(4, msg.size // msg.chunks // 4 * 4)  # float32 frames: whole words
        if len(self._zeros) < size:
            self._zeros = memoryview(bytes(size))  # bounded by the wire (MAX_PROBE_CHUNK_BYTES)
        cls = TrafficClass(weight=PROBE_WEIGHT).to_wire(0)
        t0 = time.monotonic()
        done = []
        for i in range(msg.chunks):
            h = chunk_header(job=PROBE_JOB, task=msg.id, attempt=0, version=0, chunk=i, kind="probe",
                             origin=self.node, contributors=b"\0")
            h["cls"] = cls
            done.append(self.overlay.send_chunk(h, self._zeros[:size], (self.node, msg.dst)).done)
        error = None
        # the sender cancels a transfer's future when it drops it (the overlay closing): not our cancel
        got, _ = await asyncio.wait(done, timeout=PROBE_TIMEOUT_S)
        if len(got) < len(done):
            error = f"not acknowledged within {PROBE_TIMEOUT_S:g} s"
            self.overlay.senders[msg.dst].cancel(lambda k: k[0] == PROBE_JOB and k[1] == msg.id and k[5] == "probe")
        elif any(f.cancelled() for f in got):
            error = "dropped by the link sender"
        self._reply(msg, time.monotonic() - t0, error, size * msg.chunks)

    def _reply(self, msg: Probe, seconds: float, error: str | None, sent: int = 0) -> None:
        with contextlib.suppress(ConnectionError, AssertionError):
            self.send(ProbeDone(node=self.node, id=msg.id, dst=msg.dst, sent=sent, seconds=seconds,
                                ok=error is None, error=error))
        if error is not None:
            log.info("node %d: probe %d to node %d: %s", self.node, msg.id, msg.dst, error)
