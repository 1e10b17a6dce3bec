"""GPU clusters as overlays, for tree packing's evaluation (digest 001 §4): A machines x B GPUs,
one worker per GPU, PCIe inside a machine, the network between machines.

- `gpumesh:AxB[:inter=G][:intra=G]`: every GPU pair inside a machine at `intra` Gbit/s (default 100,
  PCIe), every cross-machine GPU pair a direct link at `inter` (default 10). The paper's reading
  under which a sharded PS equals the optimum at intra = inter; it ignores NIC sharing.
- `gpunic:AxB[:inter=G][:intra=G]`: the NIC-gateway variant: one extra NIC node per machine (ids
  A*B .. A*B+A-1), joined to its machine's GPUs at `intra` and to every other NIC at `inter`;
  cross-machine traffic crosses two NICs. NIC nodes take part only as relays.

Rates are per direction; delays are zero (the evaluation is of transfer times).
"""

from __future__ import annotations

from .link import LinkSpec
from .topotypes import Topology, TopologyError

GBIT = 1000.0  # Mbit/s


def gpumesh(machines: int, gpus: int, inter_gbps: float = 10.0, intra_gbps: float = 100.0) -> Topology:
    _check(machines, gpus, inter_gbps, intra_gbps)
    links = {}
    for a in range(machines * gpus):
        for b in range(machines * gpus):
            if a != b:
                gbps = intra_gbps if a // gpus == b // gpus else inter_gbps
                links[(a, b)] = LinkSpec(gbps * GBIT, 0.0)
    return Topology(f"gpumesh{machines}x{gpus}", machines * gpus, links)


def gpunic(machines: int, gpus: int, inter_gbps: float = 10.0, intra_gbps: float = 100.0) -> Topology:
    _check(machines, gpus, inter_gbps, intra_gbps)
    n = machines * gpus
    links = {}
    for m in range(machines):
        nic = n + m
        members = range(m * gpus, (m + 1) * gpus)
        for a in members:
            links[(a, nic)] = links[(nic, a)] = LinkSpec(intra_gbps * GBIT, 0.0)
            for b in members:
                if a != b:
                    links[(a, b)] = LinkSpec(intra_gbps * GBIT, 0.0)
        for other in range(machines):
            if other != m:
                links[(nic, n + other)] = LinkSpec(inter_gbps * GBIT, 0.0)
    return Topology(f"gpunic{machines}x{gpus}", n + machines, links)


def from_spec(spec: str) -> Topology:
    """`gpumesh:AxB[:inter=G][:intra=G]` or `gpunic:...` (Gbit/s)."""
    name, *args = spec.split(":")
    usage = f"{name}:AxB[:inter=Gbps][:intra=Gbps]"
    try:
        a, b = (int(x) for x in args[0].lower().split("x"))
        opts = dict(x.split("=", 1) for x in args[1:])
        inter = float(opts.pop("inter", 10.0))
        intra = float(opts.pop("intra", 100.0))
    except (IndexError, ValueError):
        raise TopologyError(f"topology: cannot parse {spec!r}; use {usage}") from None
    if opts:
        raise TopologyError(f"topology: unknown option(s) {sorted(opts)} in {spec!r}; use {usage}")
    return (gpumesh if name == "gpumesh" else gpunic)(a, b, inter, intra)


def _check(machines: int, gpus: int, inter: float, intra: float) -> None:
    if machines < 1 or gpus < 1 or machines * gpus < 2:
        raise TopologyError(f"gpu cluster: needs at least 2 GPUs in all, got {machines} x {gpus}")
    for name, v in (("inter", inter), ("intra", intra)):
        if not (0 < v < float("inf")):
            raise TopologyError(f"gpu cluster: {name} must be a finite positive rate in Gbit/s, got {v}")
