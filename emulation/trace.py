"""Fluctuation as a precomputed, seeded list of rate events, shared by both backends and the simulator.

A trace never depends on wall-clock time while running: it is computed up front, so every scheme
(and the simulator) sees exactly the same WAN over the same window. The launcher writes the computed
trace to a JSON file and every agent reads that file, so no process recomputes (and so no process
can disagree about) a random draw.

Models (`build(spec, ...)`, the `--trace` grammar):
    constant                                   no events
    redraw:PERIOD[,lo=20,hi=155]               NetStorm: every PERIOD s each directed link draws randint(lo, hi)
    walk:period=10,step=0.2,lo=20,hi=155       bounded random walk: every period each directed link's rate
                                               moves by a factor 1 + uniform(-step, step), clipped to [lo, hi]
    markov:mean_up=60,mean_down=5[,rate=0]     on/off per undirected link: exponential up and down times;
                                               while down both directions run at `rate` (0 = outage)
    steps:T=F[,T=F...]                         at time T every link runs at F x its configured rate
    steps:FILE | csv:FILE                      replay a CSV with columns time,src,dst,rate (Mbit/s)
    ports:gamma=G[,period=0.1,horizon=600]     a big switch's ports (emulation.bigswitch): every period
                                               each port runs at (1 - G) x configured + G x a fresh draw,
                                               until `horizon` s (then the last draw holds)
All times are seconds at full scale; `Trace.scaled` shrinks them with --scale like link delays.

**Node caps.** An event whose dst is PORT (-1) sets node src's uplink cap, one whose src is PORT sets
node dst's downlink cap (a big switch's ingress and egress ports; in a CSV, `-1` as src or dst).

**Outages.** A rate of exactly 0 Mbit/s is an outage: the link carries no bytes at all (data, acks,
anything) until the link's next event, and its connection stays up, so nobody is told. The
application shaper holds the link's bytes (emulation.link.LinkShaper) and sends them at the new rate
when the outage ends, as TCP would after retransmitting; the simulator gives flows crossing the link
a zero share until then. Every model that can produce an outage ends it within the trace, so a
prediction never waits forever on a link that the trace left down.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .bigswitch import model_of
from .tracetypes import PORT as PORT  # the trace record, re-exported: its users import it from here
from .tracetypes import TRACE_SCHEMA as TRACE_SCHEMA
from .tracetypes import RateEvent, Trace, TraceError, checked_event

DEFAULT_LO, DEFAULT_HI = 20.0, 155.0  # NetStorm's range, Mbit/s


def read_csv(path: str | Path) -> Trace:
    """Replay of a measured or hand-written trace: a header `time,src,dst,rate`, one change per row."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TraceError(f"trace file {p}: {exc.strerror}") from None
    rows = list(csv.reader(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")))
    if not rows:
        raise TraceError(f"trace file {p}: empty (expected a header time,src,dst,rate)")
    header = [h.strip().lower() for h in rows[0]]
    want = ["time", "src", "dst", "rate"]
    if [h for h in header if h in want] != want or len(header) != 4:
        raise TraceError(f"trace file {p}: line 1: header must be time,src,dst,rate, got {','.join(rows[0])}")
    events = []
    for i, row in enumerate(rows[1:], start=2):
        where = f"trace file {p}: line {i}"
        if len(row) != 4:
            raise TraceError(f"{where}: expected 4 columns, got {len(row)}")
        vals: list[Any] = []
        for name, cell, conv in zip(want, row, (float, int, int, float), strict=True):
            try:
                vals.append(conv(cell.strip()))
            except ValueError:
                raise TraceError(f"{where}: {name}: cannot parse {cell.strip()!r}") from None
        events.append(checked_event(*vals, where))
    return Trace(tuple(events), spec=f"csv:{p}")


# --- models ---------------------------------------------------------------------------------------
def constant() -> Trace:
    return Trace()


def redraw(links: Iterable[tuple[int, int]], period_s: float, horizon_s: float, lo: float = DEFAULT_LO,
           hi: float = DEFAULT_HI, seed: int = 1) -> Trace:
    """NetStorm's dynamic WAN: every period, every directed link draws randint(lo, hi) Mbit/s."""
    if period_s <= 0:
        raise TraceError(f"redraw: period must be positive, got {period_s}")
    if not 0 < lo <= hi:
        raise TraceError(f"redraw: need 0 < lo <= hi, got lo={lo} hi={hi}")
    rng = random.Random(seed)
    order = sorted(links)
    events = []
    k = 1
    while k * period_s <= horizon_s:
        events.extend(RateEvent(k * period_s, a, b, float(rng.randint(int(lo), int(hi)))) for a, b in order)
        k += 1
    return Trace(tuple(events), period_s, f"redraw:{period_s:g},lo={lo:g},hi={hi:g}")


def walk(base: Mapping[tuple[int, int], float], period_s: float, horizon_s: float, step: float = 0.2,
         lo: float = DEFAULT_LO, hi: float = DEFAULT_HI, seed: int = 1) -> Trace:
    """Bounded random walk: every period each directed link's rate is multiplied by 1 + U(-step, step)
    and clipped to [lo, hi]; it starts from the configured rate (clipped), so the topology's shape stays."""
    if period_s <= 0:
        raise TraceError(f"walk: period must be positive, got {period_s}")
    if not 0 <= step < 1:
        raise TraceError(f"walk: step must be in [0, 1), got {step}")
    if not 0 < lo <= hi:
        raise TraceError(f"walk: need 0 < lo <= hi, got lo={lo} hi={hi}")
    order = sorted(base)
    steps = int(horizon_s // period_s)
    rng = np.random.default_rng(seed)
    factors = 1.0 + rng.uniform(-step, step, size=(steps, len(order)))
    rate = np.clip(np.array([base[k] for k in order], dtype=float), lo, hi)
    events = []
    for i in range(steps):
        rate = np.clip(rate * factors[i], lo, hi)
        t = (i + 1) * period_s
        events.extend(RateEvent(t, a, b, round(float(r), 3)) for (a, b), r in zip(order, rate, strict=True))
    return Trace(tuple(events), period_s, f"walk:period={period_s:g},step={step:g},lo={lo:g},hi={hi:g}")


def markov(base: Mapping[tuple[int, int], float], mean_up_s: float, mean_down_s: float, horizon_s: float,
           down_mbps: float = 0.0, seed: int = 1) -> Trace:
    """On/off outages per undirected link (a cut fibre takes both directions): up and down times are
    exponential with the given means; a down period that starts before the horizon always ends."""
    if mean_up_s <= 0 or mean_down_s <= 0:
        raise TraceError(f"markov: mean_up and mean_down must be positive, got {mean_up_s}, {mean_down_s}")
    if down_mbps < 0:
        raise TraceError(f"markov: rate must be >= 0 (0 = outage), got {down_mbps}")
    rng = np.random.default_rng(seed)
    events = []
    for a, b in sorted(k for k in base if k[0] < k[1]):
        t = float(rng.exponential(mean_up_s))
        while t < horizon_s:
            end = t + float(rng.exponential(mean_down_s))
            for s, d in ((a, b), (b, a)):
                events.append(RateEvent(round(t, 6), s, d, down_mbps))
                events.append(RateEvent(round(end, 6), s, d, base[(s, d)]))
            t = end + float(rng.exponential(mean_up_s))
    return Trace(tuple(events), None,
                 f"markov:mean_up={mean_up_s:g},mean_down={mean_down_s:g},rate={down_mbps:g}")


def steps(base: Mapping[tuple[int, int], float], changes: Iterable[tuple[float, float]]) -> Trace:
    """At each (time, factor) every link runs at factor x its configured rate (factor 0 = outage)."""
    events = []
    spec = []
    for t, f in sorted(changes):
        if t < 0 or f < 0:
            raise TraceError(f"steps: time and factor must be >= 0, got {t:g}={f:g}")
        spec.append(f"{t:g}={f:g}")
        events.extend(RateEvent(t, a, b, base[(a, b)] * f) for a, b in sorted(base))
    return Trace(tuple(events), None, "steps:" + ",".join(spec))


# --- the --trace grammar --------------------------------------------------------------------------
MODELS = ("constant", "redraw", "walk", "markov", "steps", "csv", "ports")


def _options(name: str, arg: str, allowed: dict[str, float], positional: str | None = None) -> dict[str, float]:
    """`k=v,k=v` (the first item may be a bare value for `positional`), every value a number."""
    out = dict(allowed)
    for i, item in enumerate(x.strip() for x in arg.split(",") if x.strip()):
        key, eq, val = item.partition("=")
        if not eq:
            if i == 0 and positional is not None:
                key, val = positional, item
            else:
                raise TraceError(f"trace {name}: {item!r} is not key=value")
        key = key.strip()
        if key not in allowed:
            raise TraceError(f"trace {name}: unknown option {key!r} (options: {', '.join(allowed)})")
        try:
            out[key] = float(val)
        except ValueError:
            raise TraceError(f"trace {name}: {key}: cannot parse {val.strip()!r} as a number") from None
    return out


def build(spec: str, base: Mapping[tuple[int, int], float], *, horizon_s: float, seed: int = 1,
          topology: Any = None) -> Trace:
    """The trace a `--trace SPEC` names, at full scale, checked against the links in `base`
    (directed link -> configured Mbit/s) and the node caps of `topology` (an emulation Topology; the
    `ports` model needs a big switch's)."""
    name, _, arg = spec.strip().partition(":")
    name = name.strip().lower()
    caps = [] if topology is None else ([(n, "up") for n in topology.uplink_mbps]
                                        + [(n, "down") for n in topology.downlink_mbps])
    if name == "ports":
        model = None if topology is None else model_of(topology)
        if model is None:
            raise TraceError("trace ports: needs a big-switch topology (bigswitch:N...)")
        # every port changes every period: 10 minutes (the paper's SSP window) unless told, not hours
        o = _options(name, arg, {"gamma": 0.0, "period": 0.1, "horizon": 600.0}, positional="gamma")
        trace = model.fluctuation(o["gamma"], o["period"], min(horizon_s, o["horizon"]), seed=seed)
        return trace.check(base, f"trace {spec}", caps)
    if name == "constant":
        if arg:
            raise TraceError("trace constant: takes no options")
        trace = constant()
    elif name == "redraw":
        o = _options(name, arg, {"period": 180.0, "lo": DEFAULT_LO, "hi": DEFAULT_HI}, positional="period")
        trace = redraw(base, o["period"], horizon_s, o["lo"], o["hi"], seed=seed)
    elif name == "walk":
        o = _options(name, arg, {"period": 10.0, "step": 0.2, "lo": DEFAULT_LO, "hi": DEFAULT_HI})
        trace = walk(base, o["period"], horizon_s, o["step"], o["lo"], o["hi"], seed=seed)
    elif name == "markov":
        o = _options(name, arg, {"mean_up": 60.0, "mean_down": 5.0, "rate": 0.0})
        trace = markov(base, o["mean_up"], o["mean_down"], horizon_s, o["rate"], seed=seed)
    elif name in ("steps", "csv"):
        if not arg:
            raise TraceError(f"trace {name}: needs a FILE" + (" or T=F,..." if name == "steps" else ""))
        if name == "steps" and "=" in arg:
            changes = []
            for item in (x.strip() for x in arg.split(",") if x.strip()):
                t, _, f = item.partition("=")
                try:
                    changes.append((float(t), float(f)))
                except ValueError:
                    raise TraceError(f"trace steps: {item!r} is not TIME=FACTOR") from None
            trace = steps(base, changes)
        else:
            trace = read_csv(arg)
    else:
        raise TraceError(f"trace: unknown model {name!r}; use one of {', '.join(MODELS)}")
    return trace.check(base, f"trace {spec}", caps)
