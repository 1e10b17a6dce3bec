"""Emulated WAN topologies: which node pairs are overlay links, and each direction's rate and delay.

Built-ins: `uniform` and `hetero` (full meshes) and `internet2`, the 9-node, 13-link overlay of
the NetStorm paper. Any topology also loads from a TOML or JSON file; a bad file raises
`TopologyError` naming the offending field. Node ids are 0..n-1 (the paper's node k is our k-1).

`build(spec)` finds the generator a spec names in one registry (GENERATORS): the built-ins and presets
here, and the generator modules (bigswitch, gpumesh, switch, waxman), which build on the record in
topotypes.py and never import this module, so no import goes in a circle.
"""

from __future__ import annotations

import json
import random
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import bigswitch, gpumesh, switch, waxman
from .link import LinkSpec
from .topotypes import INTERNET2_DELAY_S, PAPER_RATE_RANGE, Topology, TopologyError

# NetStorm's Internet2 overlay (digest §4, 1-indexed there): 13 links, node 6 (our 5) has degree 4.
INTERNET2_LINKS = [(1, 2), (1, 3), (2, 3), (2, 5), (3, 4), (4, 5), (4, 6), (5, 7), (6, 7), (6, 8),
                   (6, 9), (7, 8), (8, 9)]


def uniform(nodes: int, rate_mbps: float = 100.0, delay_s: float = INTERNET2_DELAY_S) -> Topology:
    links = {(a, b): LinkSpec(rate_mbps, delay_s) for a in range(nodes) for b in range(nodes) if a != b}
    return Topology("uniform", nodes, links)


def hetero(nodes: int, lo: float = PAPER_RATE_RANGE[0], hi: float = PAPER_RATE_RANGE[1], seed: int = 1,
           delay_s: float = INTERNET2_DELAY_S) -> Topology:
    """Full mesh; every direction of every pair draws its own integer rate in [lo, hi]."""
    rng = random.Random(seed)
    links = {(a, b): LinkSpec(float(rng.randint(int(lo), int(hi))), delay_s)
             for a in range(nodes) for b in range(nodes) if a != b}
    return Topology("hetero", nodes, links)


def internet2(seed: int = 1, lo: float = PAPER_RATE_RANGE[0], hi: float = PAPER_RATE_RANGE[1],
              delay_s: float = INTERNET2_DELAY_S) -> Topology:
    """Each of the 26 directions draws randint(lo, hi) Mbit/s with random.seed(seed), as the paper's scripts."""
    rng = random.Random(seed)
    links: dict[tuple[int, int], LinkSpec] = {}
    for a, b in INTERNET2_LINKS:
        links[(a - 1, b - 1)] = LinkSpec(float(rng.randint(int(lo), int(hi))), delay_s)
        links[(b - 1, a - 1)] = LinkSpec(float(rng.randint(int(lo), int(hi))), delay_s)
    return Topology("internet2", 9, links)


PRESETS = Path(__file__).parent / "presets"  # measured matrices; each file names its source


def presets() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.toml"))


def preset(spec: str) -> Topology:
    """`geo:NAME[:x=F]`: a measured matrix from emulation/presets/NAME.toml, every rate times F
    (default 1; real inter-region rates may be more than one small machine can emulate)."""
    _, _, rest = spec.partition(":")
    name, *opts = rest.split(":") if rest else [""]
    if name not in presets():
        raise TopologyError(f"topology: unknown preset {name!r} in {spec!r}; presets: {', '.join(presets())}")
    factor = 1.0
    for opt in opts:
        factor = _x_option(spec, opt)
    topo = load(PRESETS / f"{name}.toml")
    return topo if factor == 1.0 else topo.with_rates({k: v.rate_mbps * factor for k, v in topo.links.items()})


def _x_option(spec: str, opt: str) -> float:
    """One `x=F` option: a finite, positive rate multiplier, or an error naming the option."""
    key, _, val = opt.partition("=")
    try:
        if key != "x":
            raise ValueError
        factor = float(val)
    except ValueError:
        raise TopologyError(f"topology: {spec!r}: option {opt!r} is not x=FACTOR") from None
    if not (factor > 0 and factor < float("inf")):
        raise TopologyError(f"topology: {spec!r}: x must be a finite positive number, got {factor}")
    return factor


def _internet2_spec(spec: str, arg: str, seed: int) -> Topology:
    """`internet2[:seed=S][:x=F]`: the seed of the rate draws (default: the run's --seed) and a rate
    multiplier (the same draws, every rate times F)."""
    factor = 1.0
    for opt in (p for p in arg.split(":") if p):
        key, _, val = opt.partition("=")
        if key == "seed":
            try:
                seed = int(val)
            except ValueError:
                raise TopologyError(f"topology: {spec!r}: seed must be an integer, got {val!r}") from None
        else:
            factor = _x_option(spec, opt)
    topo = internet2(seed=seed)
    return topo if factor == 1.0 else topo.with_rates({k: v.rate_mbps * factor for k, v in topo.links.items()})


def _rate_factor(spec: str, arg: str) -> tuple[str, float]:
    """`hetero[:lo-hi][:x=F]`: the range part and the rate multiplier (default 1)."""
    parts = [p for p in arg.split(":") if p] if arg else []
    factor = 1.0
    rest = []
    for part in parts:
        if "=" not in part:
            rest.append(part)
            continue
        factor = _x_option(spec, part)
    if len(rest) > 1:
        raise TopologyError(f"topology: cannot parse {spec!r}; use hetero[:lo-hi][:x=F]")
    return (rest[0] if rest else ""), factor


def _mesh(spec: str, nodes: int | None, seed: int) -> Topology:
    """`uniform[:Mbps]` or `hetero[:lo-hi][:x=F]` on --nodes nodes (default 9)."""
    name, _, arg = spec.partition(":")
    n = 9 if nodes is None else nodes
    if n < 2:
        raise TopologyError(f"nodes: {name} needs at least 2 nodes, got {n}")
    if name == "uniform":
        return uniform(n, float(arg) if arg else 100.0)
    rng, factor = _rate_factor(spec, arg)
    lo, hi = (float(x) for x in rng.split("-")) if rng else PAPER_RATE_RANGE
    topo = hetero(n, lo, hi, seed=seed)
    if factor != 1.0:  # the seeded draws stay the same; only their scale changes
        topo = topo.with_rates({k: v.rate_mbps * factor for k, v in topo.links.items()})
    return topo


@dataclass(frozen=True)
class Generator:
    """One family of topologies a spec `NAME[:...]` names: `make(spec, nodes, seed)`. A `sized` one takes
    its size from --nodes; any other fixes its own, which --nodes (if given) must agree with."""

    name: str
    usage: str  # how the spec is written, for the error that lists them
    make: Callable[[str, int | None, int], Topology]
    sized: bool = False


GENERATORS: dict[str, Generator] = {}


def register(gen: Generator) -> Generator:
    GENERATORS[gen.name] = gen
    return gen


def _spec_only(from_spec: Callable[[str], Topology]) -> Callable[[str, int | None, int], Topology]:
    return lambda spec, nodes, seed: from_spec(spec)


register(Generator("uniform", "uniform", _mesh, sized=True))
register(Generator("hetero", "hetero", _mesh, sized=True))
register(Generator("internet2", "internet2",
                   lambda spec, nodes, seed: _internet2_spec(spec, spec.partition(":")[2], seed)))
register(Generator("waxman", "waxman:N", _spec_only(waxman.from_spec)))
register(Generator("crew", "crew:N", _spec_only(waxman.from_spec)))
register(Generator("geo", "geo:NAME", _spec_only(preset)))
register(Generator("gpumesh", "gpumesh:AxB", _spec_only(gpumesh.from_spec)))  # GPU clusters, Gbit/s
register(Generator("gpunic", "gpunic:AxB", _spec_only(gpumesh.from_spec)))
# seed 003's network: uneven capped host edges on a non-blocking fabric
register(Generator("switch", "switch:N", _spec_only(switch.from_spec)))
register(Generator("bigswitch", "bigswitch:N", _spec_only(bigswitch.from_spec)))  # SelMcast's big switch


def build(spec: str, nodes: int | None = None, seed: int = 1) -> Topology:
    """`internet2[:seed=S][:x=F]`, `uniform[:Mbps]`, `hetero[:lo-hi][:x=F]`, `waxman:N[:seed=S][:x=F]`,
    `crew:N[:seed=S][:x=F]`, `geo:NAME[:x=F]` (x multiplies every rate), `gpumesh:AxB[:inter=G][:intra=G]`,
    `gpunic:AxB[...]` (GPU clusters, Gbit/s), `switch:N[...]` (capped hosts on a non-blocking fabric),
    `bigswitch:N[:...]` (emulation.bigswitch), or a .toml/.json file."""
    gen = GENERATORS.get(spec.partition(":")[0])
    if gen is not None:
        topo = gen.make(spec, nodes, seed)
        if gen.sized:
            return topo
    elif Path(spec).suffix in (".toml", ".json"):
        topo = load(spec)
    else:
        known = ", ".join(g.usage for g in GENERATORS.values())
        raise TopologyError(f"topology: unknown {spec!r}; use one of {known} or a .toml/.json file")
    if nodes is not None and nodes != topo.nodes:
        raise TopologyError(f"nodes: --nodes {nodes} disagrees with topology {topo.name!r}, "
                            f"which has {topo.nodes} nodes")
    return topo


def load(path: str | Path) -> Topology:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TopologyError(f"topology file {p}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise TopologyError(f"topology file {p}: not valid {p.suffix[1:].upper()}: {exc}") from None
    try:
        return from_dict(data, default_name=p.stem)
    except TopologyError as exc:
        raise TopologyError(f"topology file {p}: {exc}") from None


def _num(d: Mapping[str, Any], key: str, where: str, default: float | None = None, *,
         positive: bool = False) -> float:
    v = d.get(key, default)
    if v is None:
        raise TopologyError(f"{where}.{key}: missing")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TopologyError(f"{where}.{key}: must be a number, got {v!r}")
    if v < 0 or (positive and v == 0):
        raise TopologyError(f"{where}.{key}: must be {'positive' if positive else 'non-negative'}, got {v}")
    return float(v)


def _node(d: Mapping[str, Any], key: str, where: str, nodes: int) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise TopologyError(f"{where}.{key}: must be a node id (int), got {v!r}")
    if not 0 <= v < nodes:
        raise TopologyError(f"{where}.{key}: node {v} outside 0..{nodes - 1}")
    return v


def _tables(data: Mapping[str, Any], key: str) -> list[tuple[str, Mapping[str, Any]]]:
    """The entries of an optional list of tables, each with the name errors should use for it."""
    raw = data.get(key, [])
    if not isinstance(raw, list):
        raise TopologyError(f"{key}: must be a list")
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise TopologyError(f"{key}[{i}]: must be a table")
    return [(f"{key}[{i}]", entry) for i, entry in enumerate(raw)]


def from_dict(data: Mapping[str, Any], default_name: str = "custom") -> Topology:
    """Schema: nodes; defaults {rate_mbps, delay_ms, jitter_ms}; links [{a,b | src,dst, rate_mbps,
    rate_ab_mbps, rate_ba_mbps, delay_ms, jitter_ms}] or matrix [[Mbit/s, 0 = no link]]; caps
    [{node, uplink_mbps, downlink_mbps}]. `a`/`b` means both directions, `src`/`dst` one."""
    if not isinstance(data, Mapping):
        raise TopologyError("top level must be a table/object")
    nodes = data.get("nodes")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 2:
        raise TopologyError(f"nodes: must be an int >= 2, got {nodes!r}")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, Mapping):
        raise TopologyError("defaults: must be a table")
    d_rate = defaults.get("rate_mbps")
    d_delay = _num(defaults, "delay_ms", "defaults", 0.0)
    d_jitter = _num(defaults, "jitter_ms", "defaults", 0.0)
    links: dict[tuple[int, int], LinkSpec] = {}

    def put(a: int, b: int, rate: float, delay_ms: float, jitter_ms: float, where: str) -> None:
        if a == b:
            raise TopologyError(f"{where}: a link from node {a} to itself")
        if (a, b) in links:
            raise TopologyError(f"{where}: link {a}->{b} given twice")
        links[(a, b)] = LinkSpec(rate, delay_ms / 1e3, jitter_ms / 1e3)

    if "matrix" in data:
        m = data["matrix"]
        if not isinstance(m, list) or len(m) != nodes or any(not isinstance(r, list) or len(r) != nodes for r in m):
            raise TopologyError(f"matrix: must be {nodes} rows of {nodes} rates")
        for a in range(nodes):
            for b in range(nodes):
                if a != b and m[a][b]:
                    r = _num({"rate": m[a][b]}, "rate", f"matrix[{a}][{b}]", positive=True)
                    put(a, b, r, d_delay, d_jitter, f"matrix[{a}][{b}]")
    for where, link in _tables(data, "links"):
        delay = _num(link, "delay_ms", where, d_delay)
        jitter = _num(link, "jitter_ms", where, d_jitter)
        if "src" in link or "dst" in link:
            a, b = _node(link, "src", where, nodes), _node(link, "dst", where, nodes)
            put(a, b, _num(link, "rate_mbps", where, d_rate, positive=True), delay, jitter, where)
        else:
            a, b = _node(link, "a", where, nodes), _node(link, "b", where, nodes)
            both = link.get("rate_mbps", d_rate)
            r_ab = _num(link, "rate_ab_mbps", where, both, positive=True)
            r_ba = _num(link, "rate_ba_mbps", where, both, positive=True)
            put(a, b, r_ab, delay, jitter, where)
            put(b, a, r_ba, delay, jitter, where)
    if not links:
        raise TopologyError("links: the topology has no links (give links or matrix)")
    up: dict[int, float] = {}
    down: dict[int, float] = {}
    for where, cap in _tables(data, "caps"):
        n = _node(cap, "node", where, nodes)
        if cap.get("uplink_mbps") is not None:
            up[n] = _num(cap, "uplink_mbps", where, positive=True)
        if cap.get("downlink_mbps") is not None:
            down[n] = _num(cap, "downlink_mbps", where, positive=True)
    name = data.get("name", default_name)
    if not isinstance(name, str):
        raise TopologyError(f"name: must be a string, got {name!r}")
    return Topology(name, nodes, links, up, down)
