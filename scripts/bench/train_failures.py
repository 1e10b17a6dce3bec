"""Training through wansync when something fails (issue "Training under every progress model",
docs/training-failures.md): the four failure cases, each run for real by wansync.failcases (a scheduler,
3 `wansync agent` processes, 3 trainer processes on the hand-off channel, BSP), and judged: every
sum a trainer got checked exactly against its members' contributions, the survivors ended every step,
the victim's error names the cause, the restarted trainer got the current model first.

    trainer_killed     rank 2's trainer SIGKILLs itself before step 3
    trainer_hung       it stops calling step() (dropped after --script-stall 8 s), then steps late
    agent_killed       rank 2's agent is SIGKILLed
    trainer_restarted  killed, then a new incarnation starts and rejoins

Prints a table, then a last JSON line: {"failure_cases": N (0-4, how many ended as specified),
"cases": {case: true/false}, "why": {case: why not}, "seconds": {case: s}}. About a minute here.

    python scripts/bench/train_failures.py [--case NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from wansync.failcases import CASES, run_all  # noqa: E402


def table(results: list[tuple[str, bool, str, float]]) -> Table:
    """The cases run_all ran: as specified or not, how long, and why not."""
    tab = Table(title="training failures (3 nodes, BSP, ring)")
    for col in ("case", "as specified", "seconds", "why not"):
        tab.add_column(col)
    for case, ok, why, seconds in results:
        tab.add_row(case, "yes" if ok else "NO", f"{seconds:.1f}", why[:120])
    return tab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", choices=CASES, help="run only this case (repeatable)")
    ap.add_argument("--deadline", type=float, default=150.0, help="each wait's deadline, s (default 150)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    results = asyncio.run(run_all(tuple(args.case or CASES), deadline_s=args.deadline))
    Console(stderr=True).print(table(results))
    print(json.dumps({"failure_cases": sum(ok for _, ok, _, _ in results),
                      "cases": {c: ok for c, ok, _, _ in results}, "why": {c: w for c, ok, w, _ in results if not ok},
                      "seconds": {c: round(s, 1) for c, _, _, s in results}}))


if __name__ == "__main__":
    main()
