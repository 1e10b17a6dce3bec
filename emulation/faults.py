"""Faults scheduled at a time or a round: kill, freeze, link down, link blackhole, rate collapse.

Grammar of `--fault` (one fault per flag; a scenario file lists the same fields as TOML tables):

    KIND:WHAT[,OPTION...]@WHEN[,OPTION...]

    kill:node=3@t=20                           SIGKILL agent 3, 20 s after the run started
    freeze:node=2@round=3,for=5                SIGSTOP agent 2 as round 3 starts, SIGCONT 5 s later
    down:link=0-1@t=2,for=1                    link 0-1 down (both directions) for 1 s
    blackhole:link=2-5@round=3,scheme=ring,for=10
    collapse:link=2-5,factor=7@round=2,for=5   both directions at 1/7 of their current rate
    collapse:link=2>5,mbps=3@t=4               one direction at 3 Mbit/s, for good

WHAT: `node=N` (kill, freeze) or `link=A-B` (both directions; collapse also takes `A>B`, one).
Collapse options: `factor=F` (default 7) or `mbps=R`. WHEN: `t=SECONDS` (real seconds, not scaled by
--scale: faults exercise live machinery whose timeouts are real) or `round=R` (as round R begins;
rounds count from 0, warm-up included). `job=J` / `scheme=S` tie the fault to that job: `t` then
counts from its start, and `round` means its round R; without them `t` counts from the run's start
(all agents registered) and `round` fires in the first job reaching R. `for=SECONDS` heals the fault
afterwards (not for kill). Every fault fires at most once.

Scenario file (`--scenario FILE`, TOML):

    [[faults]]
    kind = "blackhole"
    link = "2-5"         # or [2, 5]
    round = 3
    for = 10

The injector runs in the launcher. It signals agent processes itself (it knows their pids) and
drives links through a `LinkControl`: `AppLinkControl` sends EMU control messages to the agents
owning a link (the application backend); the tc backend implements the same protocol on the kernel.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("wansync.faults")

KINDS = ("kill", "freeze", "down", "blackhole", "collapse")
NODE_KINDS = ("kill", "freeze")
DEFAULT_COLLAPSE = 7.0  # issue 7: a 7x drop must not cause a storm of aborts
_WHAT = ("node", "link", "factor", "mbps")
_WHEN = ("t", "round", "for", "job", "scheme")


class FaultError(ValueError):
    """A fault spec or scenario file that cannot be used; the message names the field."""


class LinkControl(Protocol):
    """What a backend offers the injector. Rates in Mbit/s; 0 is an outage (see emulation.trace)."""

    def set_rate(self, src: int, dst: int, mbps: float) -> None: ...

    def set_down(self, a: int, b: int, down: bool) -> None:  # both directions of link a-b
        ...

    def set_blackhole(self, a: int, b: int, on: bool) -> None:  # silently dropped both ways
        ...


@dataclass(frozen=True)
class Fault:
    kind: str
    node: int | None = None
    link: tuple[int, int] | None = None
    both: bool = True  # link faults: both directions (A-B) or src->dst only (A>B, collapse)
    factor: float | None = None
    mbps: float | None = None
    at_s: float | None = None
    at_round: int | None = None
    for_s: float | None = None
    job: int | None = None
    scheme: str | None = None
    spec: str = ""

    def describe(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if v is not None}
        if self.link is not None:
            d["link"] = list(self.link)
        else:
            del d["both"]
        return d


# --- parsing ---------------------------------------------------------------------------------------
def _int(v: Any, field: str, where: str, lo: int = 0) -> int:
    if isinstance(v, str):
        try:
            v = int(v.strip())
        except ValueError:
            raise FaultError(f"{where}: {field}: must be an integer, got {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise FaultError(f"{where}: {field}: must be an integer >= {lo}, got {v!r}")
    return v


def _num(v: Any, field: str, where: str, *, positive: bool = False) -> float:
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            raise FaultError(f"{where}: {field}: must be a number, got {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), -float("inf")):
        raise FaultError(f"{where}: {field}: must be a finite number, got {v!r}")
    if v < 0 or (positive and v == 0):
        raise FaultError(f"{where}: {field}: must be {'positive' if positive else '>= 0'}, got {v}")
    return float(v)


def _link(v: Any, where: str) -> tuple[tuple[int, int], bool]:
    if isinstance(v, list):
        if len(v) != 2:
            raise FaultError(f"{where}: link: must be two node ids, got {v!r}")
        return (_int(v[0], "link", where), _int(v[1], "link", where)), True
    if not isinstance(v, str):
        raise FaultError(f"{where}: link: must be 'A-B' or 'A>B', got {v!r}")
    sep = ">" if ">" in v else "-"
    a, _, b = v.partition(sep)
    if not _ or not a.strip() or not b.strip():
        raise FaultError(f"{where}: link: must be 'A-B' (both directions) or 'A>B' (one), got {v!r}")
    link = (_int(a, "link", where), _int(b, "link", where))
    if link[0] == link[1]:
        raise FaultError(f"{where}: link: a link from node {link[0]} to itself")
    return link, sep == "-"


def from_fields(fields: Mapping[str, Any], where: str, spec: str = "") -> Fault:
    """One fault from its fields (a parsed --fault, or a scenario table); errors name the field."""
    unknown = sorted(set(fields) - {"kind", *_WHAT, *_WHEN})
    if unknown:
        raise FaultError(f"{where}: {unknown[0]}: unknown field (fields: kind, {', '.join(_WHAT + _WHEN)})")
    kind = fields.get("kind")
    if kind not in KINDS:
        raise FaultError(f"{where}: kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    kw: dict[str, Any] = {"kind": kind, "spec": spec}
    if kind in NODE_KINDS:
        if "node" not in fields:
            raise FaultError(f"{where}: node: {kind} needs node=N")
        for bad in ("link", "factor", "mbps"):
            if bad in fields:
                raise FaultError(f"{where}: {bad}: not an option of {kind}")
        kw["node"] = _int(fields["node"], "node", where)
    else:
        if "link" not in fields:
            raise FaultError(f"{where}: link: {kind} needs link=A-B")
        if "node" in fields:
            raise FaultError(f"{where}: node: not an option of {kind} (use link=A-B)")
        kw["link"], kw["both"] = _link(fields["link"], where)
        if kind != "collapse":
            if not kw["both"]:
                raise FaultError(f"{where}: link: {kind} takes both directions (A-B), not A>B")
            for bad in ("factor", "mbps"):
                if bad in fields:
                    raise FaultError(f"{where}: {bad}: not an option of {kind}")
        elif "factor" in fields and "mbps" in fields:
            raise FaultError(f"{where}: mbps: give factor or mbps, not both")
        elif "mbps" in fields:
            kw["mbps"] = _num(fields["mbps"], "mbps", where)
        else:
            kw["factor"] = _num(fields.get("factor", DEFAULT_COLLAPSE), "factor", where, positive=True)
    if ("t" in fields) == ("round" in fields):
        raise FaultError(f"{where}: t: give exactly one of t=SECONDS or round=R")
    if "t" in fields:
        kw["at_s"] = _num(fields["t"], "t", where)
    else:
        kw["at_round"] = _int(fields["round"], "round", where)
    if "for" in fields:
        if kind == "kill":
            raise FaultError(f"{where}: for: a kill cannot be undone")
        kw["for_s"] = _num(fields["for"], "for", where, positive=True)
    if "job" in fields:
        kw["job"] = _int(fields["job"], "job", where, lo=1)
    if "scheme" in fields:
        if not isinstance(fields["scheme"], str) or not fields["scheme"]:
            raise FaultError(f"{where}: scheme: must be a scheme name, got {fields['scheme']!r}")
        kw["scheme"] = fields["scheme"]
    return Fault(**kw)


def parse(spec: str) -> Fault:
    """One `--fault` spec (see the module docstring)."""
    where = f"fault {spec!r}"
    what, at, when = spec.partition("@")
    if not at:
        raise FaultError(f"{where}: missing '@WHEN' (e.g. @t=20 or @round=3)")
    kind, colon, rest = what.partition(":")
    if not colon:
        raise FaultError(f"{where}: must start with KIND: (one of {', '.join(KINDS)})")
    fields: dict[str, Any] = {"kind": kind.strip()}
    for part, allowed in ((rest, _WHAT), (when, _WHEN)):
        for item in (x.strip() for x in part.split(",")):
            key, eq, val = item.partition("=")
            key = key.strip()
            if not eq or not key:
                raise FaultError(f"{where}: {item!r} is not key=value")
            if key not in allowed:
                side = "after" if key in _WHEN else "before"
                if key in _WHAT + _WHEN:
                    raise FaultError(f"{where}: {key}: belongs {side} the '@'")
                raise FaultError(f"{where}: {key}: unknown field (fields: {', '.join(_WHAT + _WHEN)})")
            if key in fields:
                raise FaultError(f"{where}: {key}: given twice")
            fields[key] = val.strip()
    return from_fields(fields, where, spec)


def load_scenario(path: str | Path) -> list[Fault]:
    """A TOML scenario: `[[faults]]` tables with the fields of the --fault grammar."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except OSError as exc:
        raise FaultError(f"scenario {p}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise FaultError(f"scenario {p}: not valid TOML: {exc}") from None
    extra = sorted(set(data) - {"faults", "name", "description"})
    if extra:
        raise FaultError(f"scenario {p}: {extra[0]}: unknown key (a scenario has [[faults]])")
    raw = data.get("faults")
    if not isinstance(raw, list) or not raw:
        raise FaultError(f"scenario {p}: faults: must be a non-empty list of [[faults]] tables")
    out = []
    for i, entry in enumerate(raw):
        where = f"scenario {p}: faults[{i}]"
        if not isinstance(entry, dict):
            raise FaultError(f"{where}: must be a table")
        out.append(from_fields(entry, where, spec=f"{p.name}#{i}"))
    return out


def check(faults: Iterable[Fault], nodes: int, links: Iterable[tuple[int, int]]) -> list[Fault]:
    """Faults must name nodes and links of the topology (before any process starts)."""
    known = set(links)
    out = list(faults)
    for f in out:
        where = f"fault {f.spec!r}"
        if f.node is not None and not 0 <= f.node < nodes:
            raise FaultError(f"{where}: node: node {f.node} outside 0..{nodes - 1}")
        if f.link is not None and f.link not in known:
            raise FaultError(f"{where}: link: {f.link[0]}-{f.link[1]} is not a link of the topology")
    return out


# --- the application backend -----------------------------------------------------------------------
class AppLinkControl:
    """LinkControl for the application backend: EMU messages to the agents that own the link.
    `send(node, msg)` puts a control message on that agent's scheduler connection."""

    def __init__(self, send: Callable[[int, dict[str, Any]], None]) -> None:
        self.send = send

    def set_rate(self, src: int, dst: int, mbps: float) -> None:
        self.send(src, {"t": "EMU", "op": "rate", "src": src, "dst": dst, "mbps": float(mbps)})

    def set_down(self, a: int, b: int, down: bool) -> None:
        for n in (a, b):
            self.send(n, {"t": "EMU", "op": "down", "src": a, "dst": b, "on": down})

    def set_blackhole(self, a: int, b: int, on: bool) -> None:
        for n in (a, b):
            self.send(n, {"t": "EMU", "op": "blackhole", "src": a, "dst": b, "on": on})


# --- injection -------------------------------------------------------------------------------------
class FaultInjector:
    """Fires faults at their time or round, heals them after `for`, reports every step.

    The launcher calls `start()` once all agents registered (time zero of `t=`), feeds it the
    scheduler's events (`on_event`: "job" when a job starts, "task" after each task), and awaits
    `stop()` on the way out, which heals whatever is still active (a frozen agent gets SIGCONT)."""

    def __init__(self, faults: Iterable[Fault], *, links: LinkControl | None,
                 pid_of: Callable[[int], int | None], rate_of: Callable[[int, int], float],
                 report: Callable[[dict[str, Any]], None], clock: Callable[[], float] = time.time,
                 signal_node: Callable[[int, int], None] | None = None) -> None:
        """signal_node(node, signal): how kill/freeze reach an agent that does not run on this
        machine (a remote signal over SSH); None: os.kill on pid_of(node)."""
        self.faults = list(faults)
        self.links = links
        self.pid_of = pid_of
        self.signal_node = signal_node
        self.rate_of = rate_of  # the rate a link has now without faults (configured or the trace's)
        self.report = report
        self.clock = clock
        self.t0: float | None = None
        self.fired: set[int] = set()
        self.log: list[dict[str, Any]] = []
        self._tasks: set[asyncio.Task] = set()
        self._heal: dict[int, Callable[[], None]] = {}

    def start(self) -> None:
        self.t0 = self.clock()
        for i, f in enumerate(self.faults):
            if f.at_s is not None and f.job is None and f.scheme is None:
                self._spawn(self._at(i, f.at_s, None))

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "job":
            for i, f in enumerate(self.faults):
                if i in self.fired or not self._matches(f, data):
                    continue
                if f.at_s is not None and (f.job is not None or f.scheme is not None):
                    self._spawn(self._at(i, f.at_s, data))
                elif f.at_round == 0:
                    self._fire(i, {"job": data.get("job"), "scheme": data.get("scheme"), "round": 0})
        elif kind == "task":  # a round (BSP) ended: its task record carries the round
            for i, f in enumerate(self.faults):
                if (i not in self.fired and f.at_round is not None and f.at_round == data.get("round", -2) + 1
                        and self._matches(f, data)):
                    self._fire(i, {"job": data.get("job"), "scheme": data.get("scheme"), "round": f.at_round})

    @staticmethod
    def _matches(f: Fault, data: Mapping[str, Any]) -> bool:
        return ((f.job is None or f.job == data.get("job"))
                and (f.scheme is None or f.scheme == data.get("scheme")))

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for i in list(self._heal):
            self._do_heal(i)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _at(self, i: int, at_s: float, job: Mapping[str, Any] | None) -> None:
        start = self.t0 if job is None else self.clock()
        assert start is not None
        await asyncio.sleep(max(0.0, start + at_s - self.clock()))
        if i not in self.fired:
            self._fire(i, {} if job is None else {"job": job.get("job"), "scheme": job.get("scheme")})

    def _fire(self, i: int, ctx: dict[str, Any]) -> None:
        self.fired.add(i)
        f = self.faults[i]
        try:
            self._heal[i] = self._inject(f)
            self._note(f, "inject", ctx)
        except Exception as exc:  # a fault that could not be injected is reported, never fatal
            self._note(f, "inject", ctx, error=str(exc))
            return
        if f.for_s is not None:
            self._spawn(self._heal_later(i, f.for_s, ctx))
        elif f.kind == "kill":
            self._heal.pop(i, None)

    async def _heal_later(self, i: int, after_s: float, ctx: dict[str, Any]) -> None:
        await asyncio.sleep(after_s)
        self._do_heal(i, ctx)

    def _do_heal(self, i: int, ctx: dict[str, Any] | None = None) -> None:
        heal = self._heal.pop(i, None)
        if heal is None:
            return
        f = self.faults[i]
        try:
            heal()
            self._note(f, "heal", ctx or {})
        except Exception as exc:
            self._note(f, "heal", ctx or {}, error=str(exc))

    def _inject(self, f: Fault) -> Callable[[], None]:
        """Do the fault now; return what undoes it."""
        if f.kind in NODE_KINDS:
            assert f.node is not None
            if self.signal_node is not None:
                node, remote = f.node, self.signal_node
                remote(node, signal.SIGKILL if f.kind == "kill" else signal.SIGSTOP)
                return lambda: remote(node, signal.SIGCONT)
            pid = self.pid_of(f.node)
            if pid is None:
                raise RuntimeError(f"no process for node {f.node}")
            os.kill(pid, signal.SIGKILL if f.kind == "kill" else signal.SIGSTOP)
            return lambda: os.kill(pid, signal.SIGCONT)
        if self.links is None:
            raise RuntimeError(f"{f.kind}: this backend has no link control")
        links = self.links
        assert f.link is not None
        a, b = f.link
        if f.kind == "down":
            links.set_down(a, b, True)
            return lambda: links.set_down(a, b, False)
        if f.kind == "blackhole":
            links.set_blackhole(a, b, True)
            return lambda: links.set_blackhole(a, b, False)
        dirs = [(a, b), (b, a)] if f.both else [(a, b)]
        for s, d in dirs:
            links.set_rate(s, d, f.mbps if f.mbps is not None else self.rate_of(s, d) / (f.factor or DEFAULT_COLLAPSE))

        def restore() -> None:
            for s, d in dirs:
                links.set_rate(s, d, self.rate_of(s, d))
        return restore

    def _note(self, f: Fault, action: str, ctx: Mapping[str, Any], error: str | None = None) -> None:
        rec: dict[str, Any] = {"type": "fault", "action": action, **f.describe(), **ctx,
                               "t_run": None if self.t0 is None else self.clock() - self.t0}
        if error is not None:
            rec["error"] = error
            log.warning("fault %s %s failed: %s", f.spec, action, error)
        self.log.append(rec)
        self.report(rec)
