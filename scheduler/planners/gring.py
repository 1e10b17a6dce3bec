"""Greedy ring all-reduce (a CREW baseline, Baidu's ring built greedily): from a first member, each next
one is the unvisited member with the largest bandwidth from the one added last, and the ring closes
back to the first. Option `start`: the first member (default: one drawn from the members, seeded by
the group itself, so a group always gets the same ring)."""

from __future__ import annotations

import random

from core.plan import Job, Plan

from ..view import NetworkView
from .ring import ring_plan


def order(view: NetworkView, members: list[int], start: int) -> list[int]:
    def bw(a: int, b: int) -> float:
        return view.rate(a, b) if view.g.has_edge(a, b) else 0.0
    ring, left = [start], set(members) - {start}
    while left:
        nxt = max(sorted(left), key=lambda m: bw(ring[-1], m))
        ring.append(nxt)
        left.discard(nxt)
    return ring


def plan(view: NetworkView, job: Job) -> Plan:
    members = sorted(job.participants)
    view.require_connected(members)
    start = job.options.get("start")
    if start is None:
        start = random.Random(",".join(map(str, members))).choice(members)
    return ring_plan("gring", job, order(view, members, int(start)))
