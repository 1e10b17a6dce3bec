"""What a run shows on the terminal while it goes: a bar per scheme (last and running round time,
plan version, the slowest link in use), or one line per round when stderr is not a terminal."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from scheduler.live import LiveState
from scheduler.service import Scheduler


class RunProgress:
    def __init__(self, console: Console, sched: Scheduler, live: LiveState) -> None:
        self.console = console
        self.live = live
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
                                 transient=False, disable=not console.is_terminal)
        self.tasks: dict[int, Any] = {}  # job -> progress task
        self._ticker: asyncio.Task | None = None
        sched.subscribe(self._on_event)

    def __enter__(self) -> RunProgress:
        self.progress.__enter__()
        self._ticker = asyncio.create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        self.progress.__exit__(None, None, None)

    def _on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "job":
            self.tasks[data["job"]] = self.progress.add_task(f"{data['scheme']:>6}", total=data["rounds"], info="")
        elif kind == "task":
            tid = self.tasks.get(data["job"])
            if tid is not None:
                self.progress.update(tid, advance=1, info=self._info(data, 0.0))
            if not self.console.is_terminal:
                self.console.print(f"  {data['scheme']:>6} round {data['round']}: {data['round_s']:.3f}s "
                                   f"{'ok' if data['ok'] and data['digests_agree'] else 'WRONG'}"
                                   f"{' (warm-up)' if data['warmup'] else ''}")

    async def _tick(self) -> None:
        """Every 0.5 s the running round's time so far."""
        live = self.live
        while True:
            await asyncio.sleep(0.5)
            job = live.job
            tid = self.tasks.get(job["job"]) if job else None
            if job is None or tid is None or job["done"] >= job["rounds"]:
                continue
            last = next((r for r in reversed(live.rounds) if r["job"] == job["job"]), None)
            self.progress.update(tid, info=self._info(last, time.time() - job["last_end"]))

    def _info(self, last: dict[str, Any] | None, running_s: float) -> str:
        info = f"last {last['round_s']:.2f}s{'' if last['ok'] else ' WRONG'} " if last else ""
        info += f"now {running_s:.1f}s v{self.live.sched.version}"
        slow = self.live.slowest_link()
        return info + (f" slowest {slow[0]}->{slow[1]} {slow[2]:.0f} Mb/s" if slow is not None else "")
