"""The paper's non-blocking big switch (SelMcast, seed 000): workers whose only bottlenecks are their
own uplink (ingress port, b^I) and downlink (egress port, b^E), and the paper's bandwidth models.

Bandwidth (digest §2.7): egress b^E_j = b(1 + lambda x_j), ingress b^I_i = b mu (1 + lambda x'_i),
x ~ U[-1, 1] seeded, drawn independently per port (`shared`: one x per worker for both).
Fluctuation: every period each port draws b* afresh from the same model and runs at
(1 - gamma) b# + gamma b*, b# its configured capacity (a trace, `ports:gamma=G,period=T`).

Two realisations of one switch, as `Topology`s both backends and the simulator take:
  caps    (default) a full mesh of the N workers whose links never bind (twice the largest port),
          with node caps uplink_mbps = b^I, downlink_mbps = b^E: congestion only at the ports, as in
          the paper. A multicast is L7 here (one unicast per receiver, each copy crossing the
          sender's uplink cap); the node caps are what the view learns.
  switch  a star: the N workers plus node N, the switch, which is an agent of its own that relays
          (L7) or replicates (L3: `mcast-l3`'s tree is src -> N -> receivers, so each byte crosses
          the sender's uplink once and the switch copies it to every receiver's downlink). The
          ports are the links i->N (b^I_i) and N->i (b^E_i). Tasks only (`run_task`): in a job of
          iterations the switch's agent would be a worker too.

`bigswitch:N[:bw=MBPS][:lambda=L][:mu=M][:seed=S][:shared][:switch][:delay=MS]` (bw default 100,
lambda 0.5, mu 1, seed 1, delay 0 ms).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .link import LinkSpec
from .topotypes import Topology, TopologyError
from .tracetypes import PORT, RateEvent, Trace, TraceError

PREFIX = "bigswitch"


@dataclass(frozen=True)
class SwitchModel:
    nodes: int
    bw: float = 100.0  # b-bar, Mbit/s
    lam: float = 0.5
    mu: float = 1.0
    seed: int = 1
    shared: bool = False  # one x per worker for both of its ports
    switch: bool = False  # realised through a switch node (N) instead of node caps
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.nodes < 2:
            raise TopologyError(f"nodes: a big switch needs at least 2 workers, got {self.nodes}")
        if not (self.bw > 0 and np.isfinite(self.bw)):
            raise TopologyError(f"bw: must be a finite positive rate in Mbit/s, got {self.bw}")
        if not 0 <= self.lam < 1:
            raise TopologyError(f"lambda: must be in [0, 1), got {self.lam}")
        if not (self.mu > 0 and np.isfinite(self.mu)):
            raise TopologyError(f"mu: must be a finite positive number, got {self.mu}")
        if self.delay_s < 0:
            raise TopologyError(f"delay: must be >= 0 ms, got {self.delay_s * 1e3}")

    @property
    def spec(self) -> str:
        opts = [f"bw={self.bw:g}", f"lambda={self.lam:g}", f"mu={self.mu:g}", f"seed={self.seed}"]
        opts += ["shared"] * self.shared + ["switch"] * self.switch
        opts += [f"delay={self.delay_s * 1e3:g}"] if self.delay_s else []
        return ":".join([PREFIX, str(self.nodes), *opts])

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(uplinks b^I, downlinks b^E) in Mbit/s from one generator: x for the downlinks, then x' for
        the uplinks (the same x if shared)."""
        x = rng.uniform(-1.0, 1.0, self.nodes)
        x2 = x if self.shared else rng.uniform(-1.0, 1.0, self.nodes)
        return self.bw * self.mu * (1 + self.lam * x2), self.bw * (1 + self.lam * x)

    def ports(self) -> tuple[np.ndarray, np.ndarray]:
        """The configured capacities b# (uplinks, downlinks), Mbit/s."""
        return self.draw(np.random.default_rng(self.seed))

    def topology(self) -> Topology:
        up, down = self.ports()
        n = self.nodes
        if self.switch:
            links = {}
            for i in range(n):
                links[(i, n)] = LinkSpec(round(float(up[i]), 6), self.delay_s)
                links[(n, i)] = LinkSpec(round(float(down[i]), 6), self.delay_s)
            return Topology(self.spec, n + 1, links)
        fast = 2 * float(max(up.max(), down.max()))  # links never bind: only the ports do
        links = {(a, b): LinkSpec(fast, self.delay_s) for a in range(n) for b in range(n) if a != b}
        return Topology(self.spec, n, links, {i: round(float(up[i]), 6) for i in range(n)},
                        {i: round(float(down[i]), 6) for i in range(n)})

    def fluctuation(self, gamma: float, period_s: float, horizon_s: float, seed: int = 1) -> Trace:
        """Every period, each port runs at (1 - gamma) b# + gamma b*, b* a fresh draw of the model: node
        cap events on the caps realisation, link events (worker <-> switch) on the switch one."""
        if not 0 <= gamma <= 1:
            raise TraceError(f"trace ports: gamma must be in [0, 1], got {gamma}")
        if not period_s > 0:
            raise TraceError(f"trace ports: period must be positive, got {period_s}")
        base_up, base_down = self.ports()
        rng = np.random.default_rng([seed, self.seed])
        n = self.nodes
        events = []
        k = 1
        while k * period_s <= horizon_s:
            up, down = self.draw(rng)
            t = k * period_s
            for i in range(n):
                bu = round(float((1 - gamma) * base_up[i] + gamma * up[i]), 6)
                bd = round(float((1 - gamma) * base_down[i] + gamma * down[i]), 6)
                if self.switch:
                    events += [RateEvent(t, i, n, bu), RateEvent(t, n, i, bd)]
                else:
                    events += [RateEvent(t, i, PORT, bu), RateEvent(t, PORT, i, bd)]
            k += 1
        return Trace(tuple(events), period_s, f"ports:gamma={gamma:g},period={period_s:g}")


def parse(spec: str) -> SwitchModel:
    """`bigswitch:N[:bw=..][:lambda=..][:mu=..][:seed=..][:shared][:switch][:delay=..]`; errors name the option."""
    name, *args = spec.split(":")
    if name != PREFIX or not args:
        raise TopologyError(f"topology: {spec!r} is not {PREFIX}:N[:bw=MBPS][:lambda=L][:mu=M][:seed=S]"
                            "[:shared][:switch][:delay=MS]")
    try:
        nodes = int(args[0])
    except ValueError:
        raise TopologyError(f"topology: {spec!r}: N must be an integer, got {args[0]!r}") from None
    kw: dict[str, object] = {}
    keys = {"bw": "bw", "lambda": "lam", "mu": "mu", "seed": "seed", "delay": "delay_s"}
    for opt in args[1:]:
        key, eq, val = opt.partition("=")
        if not eq and key in ("shared", "switch"):
            kw[key] = True
            continue
        if key not in keys or not eq:
            raise TopologyError(f"topology: {spec!r}: unknown option {opt!r} "
                                "(bw=, lambda=, mu=, seed=, delay=, shared, switch)")
        try:
            num = int(val) if key == "seed" else float(val)
        except ValueError:
            raise TopologyError(f"topology: {spec!r}: {key}: cannot parse {val!r} as a number") from None
        kw[keys[key]] = num / 1e3 if key == "delay" else num
    return SwitchModel(nodes, **kw)  # type: ignore[arg-type]


def from_spec(spec: str) -> Topology:
    return parse(spec).topology()


def model_of(topo: Topology) -> SwitchModel | None:
    """The generator a big-switch topology was built from (its name is its spec), else None."""
    return parse(topo.name) if topo.name.startswith(PREFIX + ":") else None
