"""What probing costs a running plan where node caps bind (issues "Every link known" and `auto`).

The 6-node ring mesh of scripts/bench/auto.py's flipping trace (ring neighbours at 200 Mbit/s, chords at
10) with every node's uplink and downlink capped at 50 Mbit/s, resnet50 x 0.05, application backend.
ring and mst run 8 measured rounds each, once with probing off and once on; each median round is set
against the simulator's prediction on the configured WAN (`wansync advise`'s). Probes on idle links
share the capped ports with the plan's flows, so the prober must leave ports a plan fills alone
(scheduler/prober.py PORT_BUSY): with probing on, a plan should run as it does with probing off.

    python scripts/bench/probe_ports.py [--rounds 8]

Figures: probe_cost_pct (worst over schemes: 100 x (median round with probing / without - 1)),
per scheme the medians and the prediction; last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import auto  # noqa: E402  (scripts/bench/auto.py: the flipping trace's mesh and advise)

from wansync.cluster import run  # noqa: E402
from wansync.guard import job_guard  # noqa: E402
from wansync.options import Options  # noqa: E402
from wansync.runspec import resolve  # noqa: E402

CAP_MBPS = 50.0
SCHEMES = ["ring", "mst"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    predicted = {c.scheme: c.round_s for c in auto.advised(auto.flip_topology(CAP_MBPS).scaled(auto.SCALE))}
    medians: dict[str, dict[str, float]] = {s: {} for s in SCHEMES}
    valid = True
    with tempfile.TemporaryDirectory() as d:
        path = auto.flip_file(Path(d) / "ports50.json", CAP_MBPS)
        for probe in ("off", "on"):
            cfg = resolve(Options.make(topology=str(path), seed=1, schemes=SCHEMES, workload__model=auto.MODEL,
                                       scale=auto.SCALE, rounds=args.rounds, warmup=1, no_http=True, probe=probe))
            for js in asyncio.run(run(cfg, console=Console(file=io.StringIO()), show_table=False)):
                medians[js.scheme][probe] = statistics.median(r.round_s for r in js.records if not r.warmup)
                valid = valid and job_guard(js).verdict == "valid"
    t = Table(title=f"probing under {CAP_MBPS:g} Mbit/s ports (flip mesh, {auto.MODEL} x {auto.SCALE:g})")
    for col in ("scheme", "predicted s", "probing off s", "probing on s", "cost %"):
        t.add_column(col)
    cost = {}
    for s in SCHEMES:
        m = medians[s]
        cost[s] = 100 * (m["on"] / m["off"] - 1)
        t.add_row(s, f"{predicted.get(s) or float('nan'):.3f}", f"{m['off']:.3f}", f"{m['on']:.3f}", f"{cost[s]:+.1f}")
    Console(width=120).print(t)
    print(json.dumps({"probe_cost_pct": round(max(cost.values()), 2),
                      "by_scheme": {s: {"predicted_s": predicted.get(s), **{f"probe_{k}_s": round(v, 4)
                                                                           for k, v in medians[s].items()}}
                                    for s in SCHEMES},
                      "live_guard_valid": valid}))


if __name__ == "__main__":
    main()
