"""The scheduler's per-flow rates at node caps, as the exact engine replays them.

Live, the scheduler splits every node cap between the classed flows of the tasks in flight
(core.capshare) whenever a classed task starts or ends, and each sender paces its flows to those
rates. The exact engine (sim/exact.py) runs the very same CapSharing at the same instants; this
module turns its updates into the engine's per-key rate limits."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from core import capshare

from .model import MBIT, Model


class CapRates:
    """The node caps of a simulated network, split between classed flows as the scheduler does."""

    def __init__(self, m: Model, set_key_cap: Callable[[int, float], None],
                 capacity: Callable[[], Sequence[float]] | None = None) -> None:
        """set_key_cap(key, bytes/s): the engine's limit on one flow key (its plan's rate by default);
        capacity(): the engine's current bytes/s per resource (links first), which says which caps are
        loose when a task starts, as the scheduler's view says live (default: the model's at its start)."""
        self.m = m
        self._set = set_key_cap
        self._capacity = capacity or (lambda: m.cap)
        self._out: dict[int, list[int]] = {}  # node -> resources of its links out, and into (-1 - node)
        for (a, b), r in m.res_of_link.items():
            self._out.setdefault(a, []).append(r)
            self._out.setdefault(-1 - b, []).append(r)
        self.sharing = capshare.CapSharing()
        for node in {*m.net.uplink_mbps, *m.net.downlink_mbps}:
            self.sharing.set_caps(node, m.net.uplink_mbps.get(node), m.net.downlink_mbps.get(node))
        self.rated: dict[int, set[int]] = {}  # per task with flows at caps: the keys given a cap rate

    @classmethod
    def of(cls, m: Model, set_key_cap: Callable[[int, float], None], enabled: bool,
           capacity: Callable[[], Sequence[float]] | None = None) -> CapRates | None:
        """None where the network has no node caps (or the caller replays without cap rates)."""
        return cls(m, set_key_cap, capacity) if enabled and (m.net.uplink_mbps or m.net.downlink_mbps) else None

    def links_mbps(self, node: int, kind: str) -> float:
        """The summed rate of the node's links out of it ("up") or into it ("down"), now."""
        cap = self._capacity()
        return sum(cap[r] for r in self._out.get(node if kind == "up" else -1 - node, ())) / MBIT

    def holds(self, t_idx: int) -> bool:
        """Task t_idx has flows at caps: its end gives their share to the others."""
        return t_idx in self.rated

    def starts(self, t_idx: int) -> None:
        """A task with classed trees starts: the caps are split again, its flows paced from now on."""
        task = self.m.tasks[t_idx]
        update = self.sharing.start(t_idx, 0, task.plan, task.start_s, self.m.net.route, self.links_mbps)
        if update:
            self.rated[t_idx] = set()
        self._apply(update)

    def ends(self, t_idx: int) -> None:
        """A task ends: its flows go back to their plan's own rates, the others get its share."""
        update = self.sharing.end(t_idx, 0)
        for x in self.rated.pop(t_idx):  # back to the plan's own rates (the task is over anyway)
            self._set(x, self.m.key_cap[x])
        self._apply(update)

    def _apply(self, update: dict[int, dict[tuple[int, int], capshare.Update]]) -> None:
        """Every route of each edge whose rate changed (its auxiliary routes too) takes the new rate."""
        m = self.m
        for per_task in update.values():
            for (task_idx, _), rows in per_task.items():
                g_base = m.group_task.index(task_idx)
                for tree, a, b, mbps in rows:
                    g_idx = g_base + int(tree)
                    for k in m.edge_keys(g_idx, int(a), int(b)):
                        for x in (k, *m.aux_keys[g_idx].get(k, ())):
                            self.rated[task_idx].add(x)
                            self._set(x, mbps * MBIT)
