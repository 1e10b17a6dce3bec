"""A run resolved: its options (wansync.options) and what they build — the topology, the trace, the
faults, the TLS files, the model's size and chunk — checked before any process starts.

`resolve` is where every value that needs more than itself is checked (a topology file that cannot
work, a trace or fault that names a link the topology lacks, a scheme that does not fit the progress
model, a compute model that does not parse): one line, an `OptionsError`, before anything starts.
Agents resolve only the WAN (`wan_of`): they never load the planners or the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.dispatch import DISPATCH, Dispatch
from emulation.faults import Fault, FaultError, LinkControl
from emulation.topology import Topology, TopologyError, build
from emulation.trace import Trace, TraceError
from overlay.auth import SecretError, TlsFiles

from .loops import resolve_loop
from .options import ONE_SOURCE_PROGRESS, Options, OptionsError

TRACE_HORIZON_S = 6 * 3600.0
CHUNK_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


@dataclass
class RunConfig:
    """The resolved run every launcher conducts: the options, and the objects they describe."""

    options: Options
    topo: Topology
    trace: Trace | None = None
    faults: list[Fault] = field(default_factory=list)
    tls: TlsFiles | None = None
    secret: bytes | None = None  # --secret-file's secret; None: a fresh one per run
    link_control: LinkControl | None = None  # who realises link faults (default: EMU messages to agents)

    @property
    def schemes(self) -> list[str]:
        return self.options.scheme_list

    @property
    def params(self) -> int:
        from agents.workload import model_params

        return model_params(self.options.workload["model"], self.options.wan["scale"])

    @property
    def chunk(self) -> int:
        from agents.workload import chunk_params

        override = chunk_of(self.options)
        return override if override is not None else chunk_params(self.options.wan["scale"])


def parse_chunk(text: str) -> int:
    """--chunk: bytes with a unit (200KB, 4MiB, 200000B; KB = 1000, KiB = 1024) or a plain integer
    count of parameters (float32, 4 bytes each). Returns parameters; ValueError says what is wrong."""
    t = text.strip().replace(" ", "")
    i = len(t)
    while i > 0 and t[i - 1].isalpha():
        i -= 1
    number, unit = t[:i], t[i:].lower()
    if not unit:
        if not number.isdigit():
            raise ValueError(f"--chunk {text!r}: a plain number is a parameter count and must be a whole number "
                             "(or give bytes with a unit: B, KB, MB, GB, KiB, MiB, GiB)")
        n = int(number)
        if n <= 0:
            raise ValueError(f"--chunk {text!r}: must be > 0")
        return n
    if unit not in CHUNK_UNITS:
        raise ValueError(f"--chunk {text!r}: unknown unit {t[i:]!r} (B, KB, MB, GB, KiB, MiB, GiB; "
                         "no unit: parameters)")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"--chunk {text!r}: {number!r} is not a number") from None
    nbytes = value * CHUNK_UNITS[unit]
    if not nbytes > 0 or nbytes != int(nbytes):
        raise ValueError(f"--chunk {text!r}: must be a positive whole number of bytes")
    if int(nbytes) % 4:
        raise ValueError(f"--chunk {text!r} = {int(nbytes)} bytes: not a multiple of 4 (parameters are float32)")
    return int(nbytes) // 4


def chunk_of(options: Options) -> int | None:
    """--chunk in parameters, or None (the scaled default)."""
    spec = options.workload["chunk"]
    if spec is None:
        return None
    try:
        return parse_chunk(str(spec))
    except ValueError as exc:
        raise OptionsError(str(exc)) from None


def topology_of(options: Options) -> Topology:
    w = options.wan
    try:
        return build(w["topology"], w["nodes"], seed=w["seed"]).scaled(w["scale"])
    except TopologyError as exc:
        raise OptionsError(str(exc)) from None


def trace_of(options: Options, topo: Topology) -> Trace:
    """--trace-file (computed by the launcher, already scaled) > --trace SPEC > --dynamic (redraw:PERIOD)."""
    from emulation.trace import build as build_trace

    w = options.wan
    caps = [(n, "up") for n in topo.uplink_mbps] + [(n, "down") for n in topo.downlink_mbps]
    try:
        if w["trace_file"]:
            return Trace.read(Path(w["trace_file"])).check(topo.links, f"trace file {w['trace_file']}", caps)
        spec = w["trace"]
        if spec is None:
            if not w["dynamic"]:
                return Trace()
            spec = f"redraw:{w['period_s']:g}"
        base = {k: s.rate_mbps for k, s in topo.links.items()}
        return build_trace(spec, base, horizon_s=TRACE_HORIZON_S, seed=w["seed"], topology=topo).scaled(w["scale"])
    except TraceError as exc:
        raise OptionsError(str(exc)) from None


def tls_of(options: Options) -> TlsFiles | None:
    s = options.security
    try:
        return TlsFiles.from_args(s["tls_cert"], s["tls_key"], s["tls_ca"])
    except SecretError as exc:
        raise OptionsError(str(exc)) from None


def dispatch_of(options: Options) -> Dispatch:
    """NetStorm's knobs for this run (core.dispatch): the agents send by them, the simulator predicts by
    them. The probe size is NetStorm's 2 MB shrunk by --scale unless given (launchers give half a --chunk)."""
    a = options.agents
    probe = a["probe_bytes"] if a["probe_bytes"] is not None else int(DISPATCH.probe_chunk_bytes * options.wan["scale"])
    return DISPATCH.but(primary_busy_bound=a["primary_busy_bound"], aux_queue_length=a["aux_queue_length"],
                        probe_num=a["probe_num"], probe_chunk_bytes=probe)


def wan_of(options: Options) -> tuple[Topology, Trace]:
    """What an agent needs to emulate its links: no planner, no scheduler."""
    topo = topology_of(options)
    return topo, trace_of(options, topo)


def resolve(options: Options, *, secret: bytes | None = None) -> RunConfig:
    """Every check a launcher makes before it starts anything; OptionsError names what is wrong."""
    from emulation.faults import check, load_scenario, parse
    from scheduler import planners

    options.validate()
    schemes = options.scheme_list
    one_source = options.progress["model"] in ONE_SOURCE_PROGRESS
    for scheme in schemes:
        try:
            planner = planners.resolve(scheme).for_progress(one_source)
        except (KeyError, ValueError) as exc:
            raise OptionsError(str(exc).strip("'\"")) from None
        if planner.one_source != one_source:
            raise OptionsError(f"scheme {scheme} does not fit --progress {options.progress['model']}: ssp, "
                               "mcast-bsp and mcast-ssp take one-source schemes (mcast, mcast-l3), the others "
                               "take reduces")
    _check_compute(options)
    _check_http(options)
    topo = topology_of(options)
    try:
        faults = [parse(s) for s in options.output["faults"]]
        if options.output["scenario"] is not None:
            faults += load_scenario(Path(options.output["scenario"]))
        faults = check(faults, topo.nodes, topo.links)
    except FaultError as exc:
        raise OptionsError(str(exc)) from None
    cfg = RunConfig(options, topo, trace_of(options, topo), faults, tls_of(options), secret)
    try:
        cfg.params  # noqa: B018 - an unknown --model fails here, not in an agent
    except ValueError as exc:
        raise OptionsError(str(exc)) from None
    cfg.chunk  # noqa: B018
    return cfg


def _check_compute(options: Options) -> None:
    """--compute-model parsed here; a csv trace made absolute (the agents' working directory differs)."""
    from core.compute import ComputeError, ComputeModel

    spec = options.workload["compute_model"]
    if spec is None:
        return
    if spec.startswith("csv:"):
        spec = options.workload["compute_model"] = "csv:" + str(Path(spec[4:]).resolve())
    try:
        ComputeModel(spec, options.wan["seed"])
    except ComputeError as exc:
        raise OptionsError(f"--compute-model: {exc}") from None


def _check_http(options: Options) -> None:
    from scheduler.http import parse_hostport

    if options.http is None:
        return
    try:
        parse_hostport(options.http)
    except ValueError as exc:
        raise OptionsError(f"--http: {exc}") from None


def run_record(cfg: RunConfig, cluster: str) -> dict[str, Any]:
    """The results file's first record: what ran, with the whole options object (never the secret)."""
    o = cfg.options
    return {"type": "run", "topology": cfg.topo.name, "nodes": cfg.topo.nodes, "schemes": cfg.schemes,
            "model": o.workload["model"], "params": cfg.params, "chunk_params": cfg.chunk,
            "scale": o.wan["scale"], "chunk_override": o.workload["chunk"] is not None,
            "rounds": o.workload["rounds"], "warmup": o.workload["warmup"],
            "loop": resolve_loop(o.agents["loop"], o.wan["backend"]),
            "seed": o.wan["seed"], "dynamic": o.wan["dynamic"], "links": cfg.topo.to_dict()["links"],
            "trace": None if cfg.trace is None else cfg.trace.spec,
            "faults": [f.describe() for f in cfg.faults], "cluster": cluster, "options": o.to_dict()}
