"""Training scripts attaching: every rank's model layout, compared before any job moves it.

Each agent whose script attached says ATTACH with the layout (overlay.handoff checked its shape
already). Once every expected rank has, the layouts are compared with rank 0's: if they agree every
agent hears ATTACHED ok (and hands its script the shared memory); if not, every agent hears which
rank differs and how, and refuses its script with that message. The launcher waits for the same
verdict (`verdict`), and starts the job only on agreement.

While a job runs, an ATTACH is a rank coming back (its script restarted, docs/training-failures.md):
it is compared with the agreed layout and answered alone, and on agreement the rank rejoins the job
(`rejoin`: scheduler.failures.back), getting the current model in its first round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from overlay.handoff import difference
from overlay.messages import Attach, Attached

from .registry import AgentInfo, Registry


class ModelMismatch(RuntimeError):
    """The ranks' models differ; the message names the rank and the difference."""


class Attachments:
    def __init__(self, registry: Registry, expected: int) -> None:
        self.registry = registry
        self.expected = expected
        self.layouts: dict[int, dict[str, Any]] = {}
        self._verdict: asyncio.Future[dict[str, Any]] | None = None
        self.reference: dict[str, Any] | None = None  # the layout every rank agreed on last
        self.running: Callable[[], bool] = lambda: False  # a job runs (an attach is a rank coming back)
        self.rejoin: Callable[[int], None] = lambda node: None  # the rank comes back into the job
        self.others: Callable[[int], bool] = lambda node: False  # other ranks stayed in the job

    def on_attach(self, a: AgentInfo, msg: Attach) -> None:
        a.paced = True  # a script paces this agent now: it says LEAVE if the script stops
        if self.reference is not None and self.running():
            why = difference(self.reference, msg.layout)
            error = None if why is None else f"rank {msg.node}'s model differs from the running job's: {why}"
            stayed = error is None and self.others(msg.node)  # they hold the current model
            self.registry.send(a, Attached(ok=error is None, world=self.expected, error=error, rejoin=stayed or None))
            if error is None:  # after the verdict: its agent has the script when the job comes
                self.rejoin(msg.node)
            return
        self.layouts[msg.node] = msg.layout
        if len(self.layouts) < self.expected:
            return
        layouts, self.layouts = self.layouts, {}
        error = _compare(layouts)
        self.reference = layouts[0] if error is None else None
        for agent in list(self.registry.agents.values()):
            self.registry.send(agent, Attached(ok=error is None, world=self.expected, error=error))
        fut = self._future()
        if not fut.done():
            if error is None:
                fut.set_result(layouts[0])
            else:
                fut.set_exception(ModelMismatch(error))

    async def verdict(self, timeout: float) -> dict[str, Any]:
        """Rank 0's layout once every rank attached with the same model (ModelMismatch if they differ,
        TimeoutError naming who never attached). The next call waits for the next attach."""
        fut = self._future()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            missing = sorted(set(range(self.expected)) - set(self.layouts))
            raise TimeoutError(f"ranks {missing} had no script attached within {timeout:.0f} s") from None
        finally:
            if fut.done():
                self._verdict = None

    def _future(self) -> asyncio.Future[dict[str, Any]]:
        if self._verdict is None:
            self._verdict = asyncio.get_running_loop().create_future()
        return self._verdict


def _compare(layouts: dict[int, dict[str, Any]]) -> str | None:
    ref = layouts[0]
    for rank in sorted(layouts):
        why = difference(ref, layouts[rank])
        if why is not None:
            return f"rank {rank}'s model differs from rank 0's: {why}"
    return None
