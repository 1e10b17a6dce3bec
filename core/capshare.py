"""Per-flow rates where senders meet: node caps shared between traffic classes by the scheduler.

The scheduler runs this (scheduler.service: CapSharing at every classed task's start and end) and the
simulator replays the very same code (sim.exact), so live and predicted rates cannot drift; it lives
in core/ because both sides run it and core/ is the one package both may import.

A sender's class scheduler (overlay.classes) shares its own link by priority, deadline and weight.
Where flows of different senders meet — a receiver's downlink in a big-switch topology, or the
uplink one node's links share — no sender sees the others, so the scheduler assigns each flow of a
classed tree that crosses a node cap a rate its sender paces to (RATES):
  - the classes of all tasks in flight are taken in order of priority (higher first), then of
    absolute deadline (task start + deadline_s; none last); each level gets a weighted max-min share
    (weight = its tree's weight) of what the levels above left of every cap it crosses, so a lower
    level at a cap the higher ones fill gets 0: it is held until they end;
  - a task's trees all take its most urgent tree's level (their weights still split its share): a
    tree held behind another of its own task would hold the task for ever;
  - whenever a classed task starts or ends (recorded, aborted, given up) the rates are worked out
    again and only the changed ones are sent, before the new task's TASK (same connection, in order).
So priority and shares hold at caps at the granularity of tasks, not of bytes: a flow is held while
a higher task is in flight even if that task has nothing left for this cap, and rates follow the
configured caps (REGISTER), not what other traffic (unclassed, probes) takes of them. Links are not
resources here: each sender's own classes share them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from .maxmin import max_min_rates
from .plan import Plan

FlowKey = tuple[int, int, int, int, int]  # task, attempt, tree, a, b
Update = list[list[float | int]]  # [tree, a, b, mbps] rows of one task attempt


@dataclass(frozen=True)
class Flow:
    """One classed tree edge a->b of a task attempt, and the node caps its route crosses."""

    key: FlowKey
    caps: tuple[tuple[int, str], ...]  # (node, "up" | "down")
    weight: float
    level: tuple[int, float]  # (-priority, absolute deadline or inf): lower goes first


def assign(flows: Iterable[Flow], caps_mbps: Mapping[tuple[int, str], float]) -> dict[FlowKey, float]:
    """Mbit/s per flow: levels in order, each a weighted max-min share of what is left of the caps."""
    flows = [f for f in flows if f.caps]
    res = {c: i for i, c in enumerate(sorted({c for f in flows for c in f.caps}))}
    left = np.array([caps_mbps[c] for c in res], dtype=float)
    out: dict[FlowKey, float] = {}
    for level in sorted({f.level for f in flows}):
        group = [f for f in flows if f.level == level]
        pf = np.fromiter((i for i, f in enumerate(group) for _ in f.caps), dtype=np.int64)
        pr = np.fromiter((res[c] for f in group for c in f.caps), dtype=np.int64)
        rate = max_min_rates(pf, pr, np.maximum(left, 0.0), len(group),
                             weights=np.array([f.weight for f in group]))
        np.subtract.at(left, pr, rate[pf])
        out.update((f.key, float(r)) for f, r in zip(group, rate, strict=True))
    return out


class CapSharing:
    """The classed flows of the tasks in flight and the rates they were last given."""

    def __init__(self) -> None:
        self.caps: dict[tuple[int, str], float] = {}
        self._flows: dict[tuple[int, int], list[Flow]] = {}  # (task, attempt) -> its flows
        self._rates: dict[FlowKey, float] = {}

    def set_caps(self, node: int, uplink_mbps: float | None, downlink_mbps: float | None) -> None:
        for kind, mbps in (("up", uplink_mbps), ("down", downlink_mbps)):
            if mbps is None:
                self.caps.pop((node, kind), None)
            else:
                self.caps[(node, kind)] = mbps

    def start(self, task: int, attempt: int, plan: Plan, t_start: float,
              route: Callable[[int, int], tuple[int, ...]],
              links_mbps: Callable[[int, str], float] | None = None) -> dict[int, dict[tuple[int, int], Update]]:
        """A task attempt starts: its classed tree edges that cross a cap join. Returns what to send:
        node -> (task, attempt) -> rows, for every sender whose rates changed (this task's included).
        links_mbps(node, "up" | "down"): the summed rate of the node's links that way (the scheduler's
        view live, the network in the simulator); a cap at least that is loose: every byte through it
        crosses those links first, so it never fills, and its flows are not paced for it (split equally
        between many flows, it would only hold each below its own link's share)."""
        loose = set() if links_mbps is None else {c for c, mbps in self.caps.items() if mbps >= links_mbps(*c)}
        flows = []
        classed = [g for g in plan.groups if g.classed]
        # one level for all of a task's trees, its most urgent one's: a lower tree held behind a higher
        # tree of the same task at a cap would be held until the task ends, which it then never does
        level = min(((-g.priority, math.inf if g.deadline_s is None else t_start + g.deadline_s) for g in classed),
                    default=(0, math.inf))
        for gi, g in enumerate(plan.groups):
            if not g.classed:
                continue
            edges = {(n, p) for n, p in g.parent.items() if p is not None}
            edges |= {(p, k) for p, kids in g.children.items() for k in kids}
            for a, b in sorted(edges):
                try:
                    path = route(a, b)
                except ValueError:  # no route now (a lost node): the task aborts; nothing to share
                    continue
                caps = tuple(c for c in [(u, "up") for u in path[:-1]] + [(v, "down") for v in path[1:]]
                             if c in self.caps and c not in loose)
                if caps:
                    flows.append(Flow((task, attempt, gi, a, b), caps, g.weight, level))
        if not flows:
            return {}
        self._flows[(task, attempt)] = flows
        return self._update()

    def end(self, task: int, attempt: int) -> dict[int, dict[tuple[int, int], Update]]:
        """A task attempt is over (recorded, aborted or given up): the others may take its share."""
        if self._flows.pop((task, attempt), None) is None:
            return {}
        for k in [k for k in self._rates if k[:2] == (task, attempt)]:
            del self._rates[k]
        return self._update()

    def clear(self) -> None:
        self._flows.clear()
        self._rates.clear()

    def _update(self) -> dict[int, dict[tuple[int, int], Update]]:
        new = assign((f for fl in self._flows.values() for f in fl), self.caps)
        out: dict[int, dict[tuple[int, int], Update]] = {}
        for key, mbps in new.items():
            if self._rates.get(key) != mbps:
                task, attempt, tree, a, b = key
                out.setdefault(a, {}).setdefault((task, attempt), []).append([tree, a, b, mbps])
        self._rates = new
        return out
