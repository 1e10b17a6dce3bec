"""The results file of a run: one JSON object per line (docs/results-file.md).

`Recorder` turns the scheduler's events and the live throughput into records as they happen, so a
run killed halfway still leaves everything up to that point on disk.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

from scheduler.live import LiveState
from scheduler.service import Scheduler

# 2: adds `throughput` and `event` records; 3: `task` records replace `round` records (a BSP round is
# the task of that round; docs/results-file.md); later: `agent` records
SCHEMA_VERSION = 3


class Results:
    """The JSON-lines file (None: records are dropped)."""

    def __init__(self, path: Path | None) -> None:
        self.fh: TextIO | None = path.open("w") if path else None

    def write(self, record: dict[str, Any]) -> None:
        if self.fh is not None:
            self.fh.write(json.dumps({"schema": SCHEMA_VERSION, "t": time.time(), **record}, default=str) + "\n")

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


class Recorder:
    """Writes what the scheduler reports (rounds with their prediction error, passive samples, plans,
    timeline events) and the live throughput points."""

    def __init__(self, results: Results, sched: Scheduler, live: LiveState) -> None:
        self.results = results
        self.sched = sched
        self._held: dict[tuple[int, int, int], dict[str, Any]] = {}  # task records awaiting their prediction
        sched.subscribe(self._on_event)
        live.listeners.append(self._on_live)

    def _on_event(self, kind: str, data: dict[str, Any]) -> None:
        write = self.results.write
        if kind == "task":
            rec = {k: v for k, v in data.items() if k != "prediction_pending"}
            if data.get("prediction_pending"):  # written with its prediction, when the simulator has it
                self._held[(rec["job"], rec["task"], rec["attempt"])] = rec
            else:
                write(_with_error(rec))
        elif kind == "prediction":
            rec = self._held.pop((data["job"], data["task"], data["attempt"]), None)
            if rec is not None:
                write(_with_error({**rec, "prediction_s": data["prediction_s"]}))
        elif kind == "samples":
            for src, dst, nbytes, seconds, *probed in data["samples"]:
                write({"type": "link_sample", "src": src, "dst": dst, "bytes": nbytes, "seconds": seconds,
                       "how": "probed" if probed and probed[0] else "passive"})
        elif kind == "plan":
            write({"type": "plan", "version": data["version"], "scheme": data["scheme"],
                   "plan": data["plan"].to_wire()})
        elif kind == "agent":  # registered (or came back): where it is, and its clock against ours
            a = self.sched.agents.get(data["node"])
            if a is not None:
                write({"type": "agent", "node": a.node, "host": a.host, "port": a.port, "pid": a.pid,
                       "epoch": a.epoch, "clock_offset_s": a.clock_offset, "clock_error_s": a.clock_error})
        elif kind == "timeline":
            write({"type": "event", "kind": data["kind"], "at": data["t"],
                   "data": {k: v for k, v in data.items() if k not in ("t", "kind")}})

    def _on_live(self, kind: str, item: dict[str, Any]) -> None:
        if kind == "point":
            self.results.write({"type": "throughput", "src": item["src"], "dst": item["dst"], "at": item["t"],
                                "mbps": item["mbps"], "bytes": item["bytes"]})


def _with_error(rec: dict[str, Any]) -> dict[str, Any]:
    """A task record with the simulator's error against it (where there is a prediction)."""
    if rec.get("prediction_s"):
        rec["prediction_err_pct"] = 100.0 * (rec["round_s"] - rec["prediction_s"]) / rec["prediction_s"]
    return rec
