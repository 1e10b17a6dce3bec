"""`deploy --shape tc`: per-destination htb classes on each host's NIC, rates from the topology, and
the run's trace replayed on them from each job's t0 (as agents replay it in the application)."""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Callable, Coroutine
from typing import Any

from emulation.nicshape import NicShaper, ShapeError, check_replaceable, parse_mtu, parse_route_dev

from ..remote import q
from ..runspec import RunConfig
from .hosts import DeployError, Host, each


class HostShaping:
    def __init__(self, cfg: RunConfig, hosts: list[Host], say: Callable[[str], None],
                 spawn: Callable[[Coroutine[Any, Any, Any]], None], dead: dict[int, str]) -> None:
        self.cfg, self.hosts, self.say, self.spawn, self.dead = cfg, hosts, say, spawn, dead
        self.trace_task: asyncio.Task | None = None

    async def shape(self) -> None:
        addrs = [h.address for h in self.hosts]
        if len(set(addrs)) != len(addrs):
            raise DeployError("--shape tc classifies by peer address: every host needs its own address "
                              f"(got {', '.join(addrs)})")
        await each(self.hosts, self._shape_host)
        self.say("shaping: " + "; ".join(f"{h.name} {h.shaper.dev}: {len(h.shaper.rates)} classes"
                                         for h in self.hosts if h.shaper))

    def rates_from(self, node: int, at_s: float | None = None) -> dict[str, float]:
        topo = self.cfg.topo
        rates = {}
        for j in topo.neighbors(node):
            rate = topo.links[(node, j)].rate_mbps
            if at_s is not None and self.cfg.trace is not None:
                for e in self.cfg.trace.for_link(node, j):
                    if e.t > at_s:
                        break
                    rate = e.rate_mbps
            rates[self.hosts[j].address] = rate
        return rates

    async def _shape_host(self, h: Host) -> None:
        if not h.remote.root and not h.sudo:
            raise h.remote.fail("--shape tc needs root there: log in as root, or set sudo = true (passwordless sudo "
                                "for tc) in the inventory")
        rates = self.rates_from(h.node)
        if not rates:
            return
        dev = h.spec.nic
        if dev is None:
            devs = set()
            for peer in rates:
                route = await h.remote.run(q("ip", "-o", "route", "get", peer), what=f"finding the route to {peer}")
                devs.add(parse_route_dev(route)[0])
            if len(devs) != 1:
                raise h.remote.fail(f"its peers are reached through {len(devs)} interfaces ({', '.join(sorted(devs))}):"
                                    " name the one to shape with nic = ... in the inventory")
            dev = devs.pop()
        mtu = parse_mtu(await h.remote.run(q("ip", "-o", "link", "show", "dev", dev), what=f"reading {dev}'s MTU"))
        try:
            check_replaceable(await h.remote.run(f"{h.sudo}tc qdisc show dev {shlex.quote(dev)}"), dev)
            shaper = NicShaper(dev, rates, mtu=mtu)
        except ShapeError as exc:
            raise h.remote.fail(str(exc)) from None
        await h.remote.put([(json.dumps(shaper.to_json()).encode(), f"{h.run_dir}/shape.json", 0o644)])
        await h.remote.run(f"{h.sudo}tc -batch -", input="\n".join(shaper.setup()) + "\n",
                           what=f"shaping {dev} (tc htb, {len(rates)} classes)")
        h.shaper = shaper

    def on_job(self, t0: float) -> None:
        """Replay the trace on the NICs from a job's t0 (as agents replay it in the application)."""
        if self.cfg.trace is None or not self.cfg.trace.events:
            return
        if self.trace_task is not None:
            self.trace_task.cancel()
        self.trace_task = asyncio.ensure_future(self._replay(t0))

    async def _replay(self, t0: float) -> None:
        times = sorted({0.0} | {e.t for e in self.cfg.trace.events})  # type: ignore[union-attr]
        for t in times:
            await asyncio.sleep(max(0.0, t0 + t - time.time()))
            for h in self.hosts:
                if h.shaper is not None and h.node not in self.dead:
                    self.spawn(h.remote.run(f"{h.sudo}tc -batch -", check=False,
                                            input="\n".join(h.shaper.change(self.rates_from(h.node, t))) + "\n"))

    def stop(self) -> None:
        if self.trace_task is not None:
            self.trace_task.cancel()
