"""What a trace is: a precomputed list of rate events (`RateEvent`, `Trace`), its JSON and CSV files, and
`TraceError`. Its own module so that a model built elsewhere (emulation.bigswitch's port fluctuation)
makes traces without importing the `--trace` grammar (emulation/trace.py), which finds that model."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

TRACE_SCHEMA = 1
PORT = -1  # the other end of a node cap's event: (node, PORT) its uplink, (PORT, node) its downlink


class TraceError(ValueError):
    """A trace spec or file that cannot be used; the message names the field or line."""


@dataclass(frozen=True, order=True)
class RateEvent:
    t: float  # seconds after the trace's time zero
    src: int
    dst: int
    rate_mbps: float  # 0 = outage

    @property
    def cap(self) -> tuple[int, str] | None:
        """(node, "up" | "down") for a node cap's event, None for a link's."""
        if self.dst == PORT:
            return self.src, "up"
        if self.src == PORT:
            return self.dst, "down"
        return None


@dataclass(frozen=True)
class Trace:
    events: tuple[RateEvent, ...] = ()
    period_s: float | None = None  # the redraw period, where there is one
    spec: str = "constant"

    def __post_init__(self) -> None:
        # rates_at and the agents' replay walk events in time order
        object.__setattr__(self, "events", tuple(sorted(self.events)))

    def for_link(self, src: int, dst: int) -> list[RateEvent]:
        return [e for e in self.events if e.src == src and e.dst == dst]

    def scaled(self, scale: float) -> Trace:
        """--scale shrinks trace periods with model bytes and delays."""
        return Trace(tuple(RateEvent(e.t * scale, e.src, e.dst, e.rate_mbps) for e in self.events),
                     None if self.period_s is None else self.period_s * scale, self.spec)

    def rates_at(self, t: float, base: Mapping[tuple[int, int], float]) -> dict[tuple[int, int], float]:
        rates = dict(base)
        for e in self.events:
            if e.t > t:
                break
            rates[(e.src, e.dst)] = e.rate_mbps
        return rates

    def check(self, links: Iterable[tuple[int, int]], where: str = "trace",
              caps: Iterable[tuple[int, str]] = ()) -> Trace:
        """Every event must name a directed link of the topology (the simulator and tc need one), or one
        of its node caps (`caps`: (node, "up" | "down"))."""
        known, capped = set(links), set(caps)
        for e in self.events:
            cap = e.cap
            if cap is not None and cap not in capped:
                raise TraceError(f"{where}: event at {e.t:g} s for node {cap[0]}'s {cap[1]}link cap, "
                                 "which the topology does not have")
            if cap is None and (e.src, e.dst) not in known:
                raise TraceError(f"{where}: event at {e.t:g} s for {e.src}->{e.dst}, which is not a link")
        return self

    # --- files ------------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({"schema": TRACE_SCHEMA, "spec": self.spec, "period_s": self.period_s,
                           "events": [[e.t, e.src, e.dst, e.rate_mbps] for e in self.events]})

    @classmethod
    def from_json(cls, text: str, where: str = "trace file") -> Trace:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not valid JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("schema") != TRACE_SCHEMA:
            raise TraceError(f"{where}: schema: expected {TRACE_SCHEMA}")
        raw = data.get("events")
        if not isinstance(raw, list):
            raise TraceError(f"{where}: events: must be a list")
        events = []
        for i, row in enumerate(raw):
            if not isinstance(row, list) or len(row) != 4:
                raise TraceError(f"{where}: events[{i}]: must be [t, src, dst, rate_mbps]")
            events.append(checked_event(row[0], row[1], row[2], row[3], f"{where}: events[{i}]"))
        period = data.get("period_s")
        return cls(tuple(events), None if period is None else float(period), str(data.get("spec", "file")))

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> Trace:
        p = Path(path)
        try:
            return cls.from_json(p.read_text(), f"trace file {p}")
        except OSError as exc:
            raise TraceError(f"trace file {p}: {exc.strerror}") from None

    def to_csv(self, path: str | Path) -> None:
        with Path(path).open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["time", "src", "dst", "rate"])
            for e in self.events:
                w.writerow([repr(e.t), e.src, e.dst, repr(e.rate_mbps)])


def checked_event(t: Any, src: Any, dst: Any, rate: Any, where: str) -> RateEvent:
    for name, v in (("time", t), ("rate", rate)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
            raise TraceError(f"{where}: {name}: must be a finite number, got {v!r}")
    for name, v in (("src", src), ("dst", dst)):
        if isinstance(v, bool) or not isinstance(v, int) or v < PORT:
            raise TraceError(f"{where}: {name}: must be a node id (int >= 0, or -1 for a node cap), got {v!r}")
    if src == dst == PORT:
        raise TraceError(f"{where}: src/dst: one end must be a node")
    if t < 0:
        raise TraceError(f"{where}: time: must be >= 0, got {t}")
    if rate < 0:
        raise TraceError(f"{where}: rate: must be >= 0 Mbit/s (0 = outage), got {rate}")
    if src == dst:
        raise TraceError(f"{where}: src/dst: a link from node {src} to itself")
    return RateEvent(float(t), src, dst, float(rate))
