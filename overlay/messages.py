"""Every message type of the wire: one typed record per type, which is also the schema that guards it.

A record's fields say what the header holds (their types, whether required, and what their content
may be: `fieldcheck`); the schema used by `validate()` is derived from them, so the two cannot drift.
A header is acted on only after `validate()` accepted it, so the rest of the code can index fields
without defensive checks. A well-framed but invalid header raises `ProtocolError`, which names the
field and the peer; framing errors (bad length, oversize) are `FramingError` and close the connection.

Control messages are read as records (`decode`) and built as records (`Record.wire()`), in this
module only. Data frames (CHUNK, ACK, ACKS) stay plain validated dicts on the hot path, one per segment:
`chunk_header` and `acks_for` build them here all the same.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from core.classes import MAX_WEIGHT, NO_DEADLINE, PRIORITIES

from . import fieldcheck as fc
from .fieldcheck import MAX_ITEMS, MAX_NODE, MAX_TEXT  # noqa: F401 (re-exported: the wire's bounds)

NUM = (int, float)
INT = (int,)
STR = (str,)
BIN = (bytes,)
LIST = (list, tuple)
DICT = (dict,)
BOOL = (bool,)

class ProtocolError(Exception):
    """A well-framed message that breaks the schema; names the field and the peer."""

    def __init__(self, reason: str, *, field: str | None = None, peer: object = None,
                 msg_type: str | None = None) -> None:
        self.reason = reason
        self.field = field
        self.peer = peer
        self.msg_type = msg_type
        super().__init__(reason)

    @property
    def kind(self) -> str:
        """The kind of refusal, in our own words for a log's burst key: the message type and field
        when they are ours (the schema's), never a type name the peer made up."""
        if self.msg_type in _KNOWN_TYPES:
            return f"invalid {self.msg_type}" + (f".{self.field}" if self.field else "")
        return "invalid message"

    def __str__(self) -> str:
        """Built when shown, not when raised: the peer is often named only by whoever catches it."""
        where = f" field {self.field!r}" if self.field else ""
        of = f" in {self.msg_type}" if self.msg_type else ""
        return f"protocol error from peer {self.peer!r}{of}:{where} {self.reason}"


class FramingError(ProtocolError):
    """The byte stream itself is broken (length out of range, truncated); the connection closes."""


# field name -> (accepted python types, required)
Schema = Mapping[str, tuple[tuple[type, ...], bool]]


class Msg(enum.StrEnum):
    """Every message type, as it appears in a header's `t`."""

    HELLO = "HELLO"
    CHALLENGE = "CHALLENGE"
    AUTH = "AUTH"
    REGISTER = "REGISTER"
    PEERS = "PEERS"
    HEARTBEAT = "HEARTBEAT"
    REPORT = "REPORT"
    READY = "READY"
    JOB = "JOB"
    JOB_END = "JOB_END"
    GO = "GO"
    TASK = "TASK"
    DROP = "DROP"
    FENCE = "FENCE"
    AUX_UPDATE = "AUX_UPDATE"
    RATES = "RATES"
    TASK_DONE = "TASK_DONE"
    ABORT = "ABORT"
    CLOCK = "CLOCK"
    STATS = "STATS"
    COUNTERS = "COUNTERS"
    SHUTDOWN = "SHUTDOWN"
    EMU = "EMU"
    ATTACH = "ATTACH"
    ATTACHED = "ATTACHED"
    LEAVE = "LEAVE"
    PROBE = "PROBE"
    PROBE_DONE = "PROBE_DONE"
    CHUNK = "CHUNK"
    ACK = "ACK"
    ACKS = "ACKS"


_KNOWN_TYPES = frozenset(m.value for m in Msg)


def f(*checks: fc.Check, lo: float | None = None, hi: float | None = None, optional: bool = False) -> Any:
    """A record field: bounds of a number (lo <= value < hi), content checks beyond its type, and
    whether a header may omit it."""
    meta = {"checks": checks, "lo": lo, "hi": hi}
    return dataclasses.field(default=None, metadata=meta) if optional else dataclasses.field(metadata=meta)


_TYPES: dict[Any, tuple[type, ...]] = {int: INT, float: NUM, str: STR, bytes: BIN, bool: BOOL, list: LIST, dict: DICT}


class Record:
    """One message. `T` is its type; `wire()` its header; `of(header)` reads a validated header."""

    T: ClassVar[Msg]
    _fields: ClassVar[tuple[str, ...]] = ()
    SPEAKS_FOR: ClassVar[bool] = False  # its `node` names the agent that sends it (must be the connection's)

    def wire(self) -> dict[str, Any]:
        h: dict[str, Any] = {"t": self.T.value}
        for name in self._fields:
            v = getattr(self, name)
            if v is not None:
                h[name] = v
        return h

    @classmethod
    def of(cls, h: Mapping[str, Any]) -> Record:
        return cls(**{k: h[k] for k in cls._fields if k in h})

    @staticmethod
    def cross_check(h: dict[str, Any], peer: object) -> None:
        """Rules between fields (a record may add its own); raise ProtocolError."""


RECORDS: dict[str, type[Record]] = {}
SCHEMAS: dict[str, Schema] = {}  # derived from the records: what validate() enforces
# per type, what validate() checks field by field: (name, types, required, lo, hi, content checks)
_Spec = tuple[str, tuple[type, ...], bool, float | None, float | None, tuple[fc.Check, ...]]
_SPECS: dict[str, tuple[_Spec, ...]] = {}


def message(cls: type) -> type:
    """Register a record class: a frozen, keyword-only dataclass whose fields are its schema."""
    dc = dataclass(frozen=True, kw_only=True, slots=True)(cls)
    hints = typing.get_type_hints(dc)
    schema: dict[str, tuple[tuple[type, ...], bool]] = {}
    specs: list[_Spec] = []
    for fld in dataclasses.fields(dc):
        hint = hints[fld.name]
        if isinstance(hint, types.UnionType):  # X | None: an optional field of type X
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        base = typing.get_origin(hint) or hint
        schema[fld.name] = (_TYPES[base], fld.default is dataclasses.MISSING)
        m = fld.metadata
        specs.append((fld.name, *schema[fld.name], m.get("lo"), m.get("hi"), m.get("checks", ())))
    dc._fields = tuple(schema)  # type: ignore[attr-defined]
    RECORDS[dc.T.value] = dc  # type: ignore[attr-defined]
    SCHEMAS[dc.T.value] = schema  # type: ignore[attr-defined]
    _SPECS[dc.T.value] = tuple(specs)  # type: ignore[attr-defined]
    return dc


def _node(optional: bool = False) -> Any:
    """A node id: a bit of a contributor bitmap, so small."""
    return f(lo=0, hi=fc.MAX_NODE, optional=optional)


def _count(optional: bool = False) -> Any:
    return f(lo=0, optional=optional)


# --- handshake (either direction; overlay.auth drives it) ----------------------------------------------------
@message
class Hello(Record):
    T = Msg.HELLO
    node: int = f(fc.node_or_scheduler)
    cluster: str = f(fc.text(256))
    role: str = f(fc.text(32))
    nonce: bytes | None = f(optional=True)
    epoch: int | None = _count(optional=True)


@message
class Challenge(Record):
    T = Msg.CHALLENGE
    nonce: bytes = f()
    mac: bytes | None = f(optional=True)


@message
class Auth(Record):
    T = Msg.AUTH
    mac: bytes = f()


# --- control plane: agent -> scheduler -----------------------------------------------------------------------
@message
class Register(Record):
    T = Msg.REGISTER
    SPEAKS_FOR = True
    node: int = _node()
    host: str = f(fc.text(255))
    port: int = f(lo=0, hi=65536)
    neighbors: list[int] = f(fc.list_of(fc.node, "neighbours"))
    pid: int | None = _count(optional=True)
    seen_job: int | None = _count(optional=True)  # what this agent saw of an earlier scheduler
    seen_version: int | None = _count(optional=True)
    clock_offset: float | None = f(lo=-1e9, hi=1e9, optional=True)  # this host's clock vs the scheduler's (s)
    clock_error: float | None = f(lo=0, hi=1e9, optional=True)  # its bound: half the best exchange's round trip
    # this node's configured caps (a big-switch topology), where it has them: the scheduler shares them
    # between traffic classes by per-flow rates (core.capshare)
    uplink_mbps: float | None = f(fc.positive, hi=fc.MAX_MBPS, optional=True)
    downlink_mbps: float | None = f(fc.positive, hi=fc.MAX_MBPS, optional=True)


@message
class Heartbeat(Record):
    """Liveness and progress: data bytes received so far; peers whose chunks wait unacknowledged."""

    T = Msg.HEARTBEAT
    SPEAKS_FOR = True
    node: int = _node()
    time: float = f(lo=0)
    rx: int | None = _count(optional=True)
    stuck: list[list[float]] | None = f(fc.list_of(fc.pair(fc.node, fc.non_negative), "stuck links"),
                                        optional=True)


@message
class Report(Record):
    """Passive link samples: [src, dst, bytes, seconds] of chunk transfers into this node; and of this
    node's own caps (a big switch's ports): [kind (0 uplink, 1 downlink), bytes, seconds busy]."""

    T = Msg.REPORT
    SPEAKS_FOR = True
    node: int = _node()
    samples: list[list[float]] = f(fc.list_of(fc.sample, "samples"))
    caps: list[list[float]] | None = f(fc.list_of(fc.cap_sample, "cap samples"), optional=True)
    # the rates this node's caps run at now, when they changed (a trace: a big switch's fluctuating ports)
    declared: list[float | None] | None = f(fc.declared_caps, optional=True)


@message
class Ready(Record):
    """A worker computed iteration `round` and is ready to synchronize it. Under BSP every member's
    READY for round r is the round's barrier (and the first one freezes its plan version: NetStorm's
    per-iteration topology request)."""

    T = Msg.READY
    job: int = _count()
    round: int = _count()
    attempt: int | None = _count(optional=True)
    have: list[int] | None = f(fc.list_of(fc.count, "versions"), optional=True)  # plan versions it holds
    progress: float | None = f(lo=0, optional=True)


@message
class TaskDone(Record):
    """This node's part of a task is done: a receiver holds the result (digest of its bytes), a node
    that only contributed, aggregated or replicated has sent everything it had to."""

    T = Msg.TASK_DONE
    SPEAKS_FOR = True
    node: int = _node()
    job: int = _count()
    task: int = _count()
    attempt: int = _count()
    version: int = _count()
    ok: bool = f()
    t_start: float = f()
    t_end: float = f()
    t_compute: float = f()
    digest: bytes | None = f(fc.text(64), optional=True)  # receivers only
    t_wait: float | None = f(optional=True)
    error: str | None = f(fc.text(), optional=True)
    # task -> [bytes of it received here when this task's first byte came, when its part was done]
    beside: dict[int, list[int]] | None = f(fc.task_counters, optional=True)


@message
class Stats(Record):
    T = Msg.STATS
    SPEAKS_FOR = True
    node: int = _node()
    job: int = _count()
    stats: dict[str, Any] = f(fc.plain)


@message
class Counters(Record):
    """Cumulative bytes sent per outgoing link (dst -> bytes) at `time` (synced clock)."""

    T = Msg.COUNTERS
    SPEAKS_FOR = True
    node: int = _node()
    time: float = f(lo=0)
    links: dict[int, int] = f(fc.counters)


# --- control plane: both ways, or scheduler -> agent -----------------------------------------------------------
@message
class Clock(Record):
    """Cristian's exchange: the agent's t0, the scheduler's t1 in the reply."""

    T = Msg.CLOCK
    t0: float = f()
    t1: float | None = f(optional=True)


@message
class Peers(Record):
    T = Msg.PEERS
    peers: dict[int, list[Any]] = f(fc.peers)  # node -> [host, port, epoch]


@message
class Job(Record):
    T = Msg.JOB
    job: int = _count()
    scheme: str = f()
    rounds: int = _count()
    params: int = _count()
    compute_s: float = f(lo=0)
    t0: float | None = f(optional=True)
    warmup: int | None = _count(optional=True)
    start: int | None = _count(optional=True)  # first round for an agent that rejoined mid-job
    ahead: int | None = _count(optional=True)  # tasks a node may receive ahead of the newest it began
    mode: str | None = f(fc.text(16), optional=True)  # "bsp" (default: rounds of its own) or "tasks" (served)
    # what a worker waits for before its next iteration: "result" (of the task holding its contribution:
    # BSP, a ready queue) or "bound" (a GO allowing it: SSP's staleness bound)
    rule: str | None = f(fc.text(16), optional=True)
    compute: str | None = f(fc.text(), optional=True)  # the compute model (core.compute spec); seeded by `seed`
    compute_scale: float | None = f(lo=0, optional=True)  # its times shrink by this (the run's --scale)
    seed: int | None = _count(optional=True)
    # what a member contributes: None, the synthetic integers (exact checks); else a workload spec the
    # agent runs (agents.training: real training, e.g. "digits:n=16,shard=iid")
    workload: str | None = f(fc.text(), optional=True)
    # multicast progress models: how many iterations older than its own a received model may be when a
    # worker applies it (agents/received.py); None: a worker applies only its own tasks' results
    staleness: int | None = _count(optional=True)
    # every worker contributes to and receives every round, and the next round forms only once all are
    # READY (BSP): a round's result is read by no one here once the next one begins
    barrier: bool | None = f(optional=True)


@message
class Attach(Record):
    """A training script attached to this node's agent (overlay.handoff): its model's layout, which
    the scheduler compares across ranks before any job moves it."""

    T = Msg.ATTACH
    SPEAKS_FOR = True
    node: int = _node()
    layout: dict[str, Any] = f(fc.plain)


@message
class Attached(Record):
    """Every rank attached: `ok` if their models agree (else `error` names the rank and the
    difference); `world`: how many ranks."""

    T = Msg.ATTACHED
    ok: bool = f()
    world: int = _count()
    error: str | None = f(fc.text(), optional=True)
    rejoin: bool | None = f(optional=True)  # the job runs: this rank comes back into it (the current model)


@message
class Leave(Record):
    """This node's training script is gone (it died, or stopped calling `step()`; `ended`: it said
    goodbye, its last contribution stands): the node leaves the running job until a script attaches
    again (agents.handoff says why, and how long is too long)."""

    T = Msg.LEAVE
    SPEAKS_FOR = True
    node: int = _node()
    why: str = f(fc.text())
    ended: bool | None = f(optional=True)


@message
class Go(Record):
    """This worker may compute every iteration up to `upto` (SSP: its own multicasts over, and the
    slowest worker's plus the bound)."""

    T = Msg.GO
    job: int = _count()
    upto: int = _count()


@message
class JobEnd(Record):
    """A job is over (the scheduler ended the tasks it formed, or recorded every round): nodes send
    their STATS if they have not, and stop waiting for it."""

    T = Msg.JOB_END
    job: int = _count()


@message
class Task(Record):
    """A task this node has a part in (member, receiver, aggregator, replicating node or relay): who
    contributes and who receives, the plan version, and the plan itself if this node lacks it."""

    T = Msg.TASK
    job: int = _count()
    task: int = _count()
    attempt: int = _count()
    version: int = _count()
    round: int = _count()  # the iteration whose contributions members send (a BSP round r is task r)
    members: list[int] = f(fc.list_of(fc.node, "members"))
    receivers: list[int] = f(fc.list_of(fc.node, "receivers"))
    plan: dict[str, Any] | None = f(optional=True)  # the plan's wire form, if the node lacks that version
    avoid: list[list[int]] | None = f(fc.list_of(fc.pair(fc.node, fc.node), "links"), optional=True)
    skip: bool | None = f(optional=True)  # this node's READY came after the task formed without it
    settled: int | None = _count(optional=True)  # every task below this one is over everywhere
    # member -> the iteration its contribution comes from, where it is not `round` (a ready queue groups
    # workers at different iterations)
    iters: dict[int, int] | None = f(fc.counters, optional=True)
    # [source, *joining]: this round hands the current model to nodes whose scripts (re)attached: the
    # source contributes its script's model, every other member zeros; the joining scripts receive it
    # as their first sync, the others' steps move on to the next round (agents.handoff)
    resync: list[int] | None = f(fc.list_of(fc.node, "nodes"), optional=True)


@message
class Drop(Record):
    """A receiver leaves a running task (SelMcast's shrink-only receiver sets): it applies nothing of
    it, the nodes that send to it stop unless it replicates for others (`replicates`), and the
    others go on."""

    T = Msg.DROP
    job: int = _count()
    task: int = _count()
    attempt: int = _count()
    node: int = _node()
    replicates: bool | None = f(optional=True)


@message
class Fence(Record):
    """A lost agent's incarnation: its connections are dropped and that epoch never accepted again."""

    T = Msg.FENCE
    node: int = _node()
    epoch: int = _count()


@message
class AuxUpdate(Record):
    T = Msg.AUX_UPDATE
    job: int = _count()
    version: int = _count()
    groups: list[Any] = f()  # per group: its auxiliary table's wire form


@message
class Rates(Record):
    """Per-flow rates a sender paces its classed flows to (overlay.classes), where flows of different
    senders meet at a node cap (core.capshare): [tree, a, b, Mbit/s] per tree edge a->b of this
    task's attempt; 0 holds the flow until a later RATES gives it a rate again."""

    T = Msg.RATES
    job: int = _count()
    task: int = _count()
    attempt: int = _count()
    rates: list[Any] = f(fc.list_of(fc.edge_rate, "rates"))


# An active probe of one idle link (scheduler/prober.py): real bytes through the link's shaper and kernel
# queues, discarded by the receiver (never held, never summed); bounded so an order cannot ask much.
MAX_PROBE_BYTES = 64 * 1024 * 1024
MAX_PROBE_CHUNKS = 64
MAX_PROBE_CHUNK_BYTES = 8 * 1024 * 1024
PROBE_JOB = 0  # the job id probe frames carry: no real job has it (the scheduler counts jobs from 1)


@message
class Probe(Record):
    """Send `size` bytes of probe data to neighbour `dst`, as `chunks` back-to-back chunks (scheduler -> agent)."""

    T = Msg.PROBE
    id: int = _count()
    dst: int = _node()
    size: int = f(lo=4, hi=MAX_PROBE_BYTES + 1)  # not `nbytes`: that field announces a frame's payload
    chunks: int = f(lo=1, hi=MAX_PROBE_CHUNKS + 1)

    @staticmethod
    def cross_check(h: dict[str, Any], peer: object) -> None:
        if h["size"] // h["chunks"] > MAX_PROBE_CHUNK_BYTES:
            raise ProtocolError(f"chunks over {MAX_PROBE_CHUNK_BYTES} bytes", field="chunks", peer=peer,
                                msg_type="PROBE")


@message
class ProbeDone(Record):
    """A probe's every chunk was acknowledged (ok), or it could not be sent (ok false, `error` says why):
    seconds from its first byte queued to its last ack, on the sender's clock (agent -> scheduler)."""

    T = Msg.PROBE_DONE
    SPEAKS_FOR = True
    node: int = _node()
    id: int = _count()
    dst: int = _node()
    sent: int = _count()  # probe bytes it sent
    seconds: float = f(lo=0)
    ok: bool = f()
    error: str | None = f(fc.text(MAX_TEXT), optional=True)


@message
class Abort(Record):
    T = Msg.ABORT
    job: int = _count()
    task: int = _count()
    attempt: int = f()  # -1: before any attempt (a request for a job that is not running)


@message
class Shutdown(Record):
    T = Msg.SHUTDOWN


EMU_OPS = ("rate", "down", "blackhole")


@message
class Emu(Record):
    """Emulation control: a link fault on the application backend (scheduler -> the link's agents)."""

    T = Msg.EMU
    op: str = f()
    src: int = _node()
    dst: int = _node()
    mbps: float | None = f(optional=True)
    on: bool | None = f(optional=True)

    @staticmethod
    def cross_check(h: dict[str, Any], peer: object) -> None:
        if h["op"] not in EMU_OPS:
            raise ProtocolError(f"unknown op {h['op']!r} (one of {', '.join(EMU_OPS)})", field="op", peer=peer,
                                msg_type="EMU")
        if h["src"] == h["dst"]:
            raise ProtocolError("src and dst must be two different node ids", field="dst", peer=peer,
                                msg_type="EMU")
        if h["op"] == "rate":
            mbps = h.get("mbps")
            if mbps is None or not 0 <= mbps < float("inf"):
                raise ProtocolError("rate needs a finite mbps >= 0 (0 = outage)", field="mbps", peer=peer,
                                    msg_type="EMU")
        elif "on" not in h:
            raise ProtocolError(f"{h['op']} needs on=true|false", field="on", peer=peer, msg_type="EMU")


# --- data plane: agent <-> agent -------------------------------------------------------------------------------
# Kinds of data frame: a partial sum going up a tree, a final value coming down, a source's own
# parameters (multicast schemes), or a probe that only measures a link.
CHUNK_KINDS = ("agg", "bcast", "mcast", "probe")
# The largest chunk a frame may belong to (relays reserve its size in their memory budget).
MAX_CHUNK_BYTES = 256 * 1024 * 1024


@message
class Chunk(Record):
    """One segment of a chunk transfer; `nbytes` payload bytes follow the header."""

    T = Msg.CHUNK
    job: int = _count()
    task: int = _count()  # the task it belongs to (a BSP round is task r)
    attempt: int = _count()
    version: int = _count()
    chunk: int = _count()
    kind: str = f()
    origin: int = _node()
    contributors: bytes = f(fc.text(MAX_NODE // 8))  # bitmap of the node ids summed in (overlay.messages.bitmap)
    t_send: float = f()
    path: list[int] = f(fc.list_of(fc.node, "hops"))  # the full source route
    hop: int = _count()
    off: int = _count()
    total: int = _count()
    nbytes: int = _count()
    # its traffic class, if its tree has one (overlay.classes): [tree, weight, priority, deadline]
    cls: list[Any] | None = f(fc.traffic_class, optional=True)

    @staticmethod
    def cross_check(h: dict[str, Any], peer: object) -> None:
        if h["kind"] not in CHUNK_KINDS:
            raise ProtocolError(f"unknown kind {h['kind']!r}", field="kind", peer=peer, msg_type="CHUNK")
        path = h["path"]
        if len(path) < 2:
            raise ProtocolError("must list at least two node ids", field="path", peer=peer, msg_type="CHUNK")
        if len(set(path)) != len(path):
            raise ProtocolError("visits a node twice", field="path", peer=peer, msg_type="CHUNK")
        if not 0 <= h["hop"] < len(path) - 1:
            raise ProtocolError("outside the path", field="hop", peer=peer, msg_type="CHUNK")
        if h["nbytes"] <= 0:
            raise ProtocolError("a data frame carries at least one byte", field="nbytes", peer=peer,
                                msg_type="CHUNK")
        if h["total"] > MAX_CHUNK_BYTES:
            raise ProtocolError(f"chunk of {h['total']} bytes exceeds {MAX_CHUNK_BYTES}", field="total", peer=peer,
                                msg_type="CHUNK")
        if h["off"] + h["nbytes"] > h["total"]:
            raise ProtocolError("segment outside the chunk", field="off", peer=peer, msg_type="CHUNK")
        if h["nbytes"] % 4 or h["off"] % 4 or h["total"] % 4:
            raise ProtocolError("not a whole number of float32", field="nbytes", peer=peer, msg_type="CHUNK")
        if h["kind"] == "probe" and (len(path) != 2 or h["total"] > MAX_PROBE_CHUNK_BYTES or h["job"] != PROBE_JOB):
            raise ProtocolError(f"a probe crosses one link, job {PROBE_JOB}, at most {MAX_PROBE_CHUNK_BYTES} bytes "
                                "a chunk", field="path", peer=peer, msg_type="CHUNK")


@message
class Ack(Record):
    """A hop received a whole chunk (keyed as in `chunk_key`)."""

    T = Msg.ACK
    job: int = _count()
    task: int = _count()
    attempt: int = _count()
    version: int = _count()
    chunk: int = _count()
    kind: str = f()
    origin: int = _node()
    dst: int = _node()

    @staticmethod
    def cross_check(h: dict[str, Any], peer: object) -> None:
        if h["kind"] not in CHUNK_KINDS:
            raise ProtocolError(f"unknown kind {h['kind']!r}", field="kind", peer=peer, msg_type="ACK")


# Chunk keys one ACKS frame may carry: ~15 bytes each, so a full frame stays far below MAX_HEADER.
MAX_ACK_KEYS = 256


def _ack_keys(v: Any) -> None:
    """ACKS.keys: 1..MAX_ACK_KEYS keys, each [job, task, attempt, version, chunk, kind, origin, dst] held to
    ACK's rules for those fields."""
    if not 0 < len(v) <= MAX_ACK_KEYS:
        raise fc.Bad(f"{len(v)} keys, not 1..{MAX_ACK_KEYS}")
    for k in v:
        if not _ack_key_ok(k):
            raise fc.Bad(f"{k!r:.100} is not [job, task, attempt, version, chunk, kind, origin, dst]")


@message
class Acks(Record):
    """Several hops' acks in one frame: the chunks whose last bytes a link's receive path took within
    one turn of the event loop (keys as in ACK and `chunk_key`). An ACK alone is one such key."""

    T = Msg.ACKS
    keys: list[Any] = f(_ack_keys)


# Which message types may carry payload bytes after the header.
PAYLOAD_TYPES = frozenset({Msg.CHUNK.value})


# --- the hot types' checks, inlined: exactly the rules of their records and cross checks above ----------------
# True only where the generic path accepts the header too (tests/test_hot_validation.py holds them to it);
# False (or KeyError/TypeError) hands the header to the generic path. `type(v) is int` keeps bools out.
_KINDS = frozenset(CHUNK_KINDS)
_CONTRIBUTORS_MAX = MAX_NODE // 8  # Chunk.contributors: fc.text(MAX_NODE // 8)
_isfinite = math.isfinite


def _chunk_ok(h: dict[str, Any]) -> bool:
    job, task, attempt, version, chunk = h["job"], h["task"], h["attempt"], h["version"], h["chunk"]
    origin, hop, off, total, nbytes = h["origin"], h["hop"], h["off"], h["total"], h["nbytes"]
    kind, contributors, t_send, path = h["kind"], h["contributors"], h["t_send"], h["path"]
    if not (type(job) is int and type(task) is int and type(attempt) is int and type(version) is int
            and type(chunk) is int and type(origin) is int and type(hop) is int and type(off) is int
            and type(total) is int and type(nbytes) is int and job >= 0 and task >= 0 and attempt >= 0
            and version >= 0 and chunk >= 0 and hop >= 0 and off >= 0 and 0 <= origin < MAX_NODE):
        return False
    if type(kind) is not str or kind not in _KINDS:
        return False
    if type(contributors) is not bytes or len(contributors) > _CONTRIBUTORS_MAX:
        return False
    if not ((type(t_send) is float and _isfinite(t_send)) or type(t_send) is int):
        return False
    if type(path) is not list:
        return False
    n = len(path)
    if not 2 <= n <= MAX_ITEMS or not 0 <= hop < n - 1:
        return False
    for x in path:
        if type(x) is not int or not 0 <= x < MAX_NODE:
            return False
    if len(set(path)) != n:
        return False
    if not (0 < nbytes and total <= MAX_CHUNK_BYTES and off + nbytes <= total and not (nbytes | off | total) & 3):
        return False
    if kind == "probe" and (n != 2 or total > MAX_PROBE_CHUNK_BYTES or job != PROBE_JOB):
        return False
    if "cls" in h:
        return _cls_ok(h["cls"])
    return True


def _cls_ok(v: Any) -> bool:
    """fc.traffic_class, inlined: [tree, weight in (0, MAX_WEIGHT], priority, deadline >= 0 or none]."""
    if type(v) is not list or len(v) != 4:
        return False
    tree, weight, prio, deadline = v
    if type(tree) is not int or not 0 <= tree < MAX_ITEMS:
        return False
    if not ((type(weight) is float and _isfinite(weight)) or type(weight) is int) or not 0 < weight <= MAX_WEIGHT:
        return False
    if type(prio) is not int or not 0 <= prio < PRIORITIES:
        return False
    if not ((type(deadline) is float and _isfinite(deadline)) or type(deadline) is int):
        return False
    return deadline >= 0 or deadline == NO_DEADLINE


def _ack_key_ok(k: Any) -> bool:
    """One key of ACKS: ACK's fields in chunk_key's order, as a list (msgpack) or tuple (built here)."""
    if type(k) is not list and type(k) is not tuple or len(k) != 8:
        return False
    job, task, attempt, version, chunk, kind, origin, dst = k
    return (type(job) is int and type(task) is int and type(attempt) is int and type(version) is int
            and type(chunk) is int and type(origin) is int and type(dst) is int and job >= 0 and task >= 0
            and attempt >= 0 and version >= 0 and chunk >= 0 and 0 <= origin < MAX_NODE and 0 <= dst < MAX_NODE
            and type(kind) is str and kind in _KINDS)


def _acks_ok(h: dict[str, Any]) -> bool:
    keys = h["keys"]
    if type(keys) is not list or not 0 < len(keys) <= MAX_ACK_KEYS or h.get("nbytes", 0):
        return False
    for k in keys:
        if not _ack_key_ok(k):
            return False
    return True


def _ack_ok(h: dict[str, Any]) -> bool:
    job, task, attempt, version, chunk = h["job"], h["task"], h["attempt"], h["version"], h["chunk"]
    kind, origin, dst = h["kind"], h["origin"], h["dst"]
    return (type(job) is int and type(task) is int and type(attempt) is int and type(version) is int
            and type(chunk) is int and type(origin) is int and type(dst) is int and job >= 0 and task >= 0
            and attempt >= 0 and version >= 0 and chunk >= 0 and 0 <= origin < MAX_NODE and 0 <= dst < MAX_NODE
            and type(kind) is str and kind in _KINDS and not h.get("nbytes", 0))


def validate(header: Any, peer: object = None) -> dict[str, Any]:
    """Return the header if it is a known, complete, well-typed message; raise ProtocolError if not.

    CHUNK, ACK and ACKS (nearly every frame of the data plane) first try a check of the well-formed
    case with every field's rule inlined; whatever it does not accept, the generic path below judges,
    and names the field."""
    if type(header) is dict:
        t = header.get("t")
        try:
            if ((t == "CHUNK" and _chunk_ok(header)) or (t == "ACK" and _ack_ok(header))
                    or (t == "ACKS" and _acks_ok(header))):
                return header
        except (KeyError, TypeError):  # a field missing or of an odd type: the generic path says which
            pass
    return _validate(header, peer)


def _validate(header: Any, peer: object) -> dict[str, Any]:
    """The generic path: every record's fields by its spec, then its cross checks."""
    if not isinstance(header, dict):
        raise ProtocolError(f"header is a {type(header).__name__}, not a map", peer=peer)
    t = header.get("t")
    if not isinstance(t, str):
        raise ProtocolError("missing or non-string message type", field="t", peer=peer)
    schema = SCHEMAS.get(t)
    if schema is None:
        raise ProtocolError(f"unknown message type {t!r}", field="t", peer=peer, msg_type=t)
    for name, accepted, required, lo, hi, checks in _SPECS[t]:
        if name not in header:
            if required:
                raise ProtocolError("missing", field=name, peer=peer, msg_type=t)
            continue
        value = header[name]
        # bool is an int subclass: keep integer fields honest
        if (isinstance(value, bool) and bool not in accepted) or not isinstance(value, accepted):
            raise ProtocolError(f"has type {type(value).__name__}", field=name, peer=peer, msg_type=t)
        if isinstance(value, float) and not math.isfinite(value):
            raise ProtocolError("must be a finite number", field=name, peer=peer, msg_type=t)
        if (lo is not None and value < lo) or (hi is not None and value >= hi):
            raise ProtocolError(f"{value!r} outside {lo}..{'' if hi is None else hi - 1}", field=name, peer=peer,
                                msg_type=t)
        try:
            for check in checks:
                check(value)
        except fc.Bad as bad:
            raise ProtocolError(str(bad), field=name, peer=peer, msg_type=t) from None
    nbytes = header.get("nbytes", 0)
    if nbytes and t not in PAYLOAD_TYPES:
        raise ProtocolError("payload on a message type that carries none", field="nbytes", peer=peer,
                            msg_type=t)
    RECORDS[t].cross_check(header, peer)
    return header


def decode(header: Mapping[str, Any]) -> Record:
    """A validated control header as its typed record."""
    return RECORDS[header["t"]].of(header)


def chunk_header(*, job: int, task: int, attempt: int, version: int, chunk: int, kind: str, origin: int,
                 contributors: bytes, path: Sequence[int] = (), hop: int = 0, total: int = 0) -> dict[str, Any]:
    """A CHUNK header without its segment fields (off, nbytes, t_send: the link sender adds them)."""
    return {"t": Msg.CHUNK.value, "job": job, "task": task, "attempt": attempt, "version": version,
            "chunk": chunk, "kind": kind, "origin": origin, "contributors": contributors, "t_send": 0.0,
            "path": list(path), "hop": hop, "total": total}


ChunkKey = tuple[int, int, int, int, int, str, int, int]  # job, task, attempt, version, chunk, kind, origin, dst


def chunk_key(h: Mapping[str, Any]) -> ChunkKey:
    """The identity of one chunk transfer: what duplicates, acks and resends are keyed by.

    (job, task, attempt, version, chunk, kind, origin, destination): one origin may send the
    same chunk to several destinations (a broadcast), possibly through the same relay."""
    dst = h["path"][-1] if "path" in h else h["dst"]
    return (h["job"], h["task"], h["attempt"], h["version"], h["chunk"], h["kind"], h["origin"], dst)


def ack_for(key: ChunkKey) -> dict[str, Any]:
    job, task, attempt, version, chunk, kind, origin, dst = key
    return {"t": Msg.ACK.value, "job": job, "task": task, "attempt": attempt, "version": version,
            "chunk": chunk, "kind": kind, "origin": origin, "dst": dst}


def acks_for(keys: Sequence[ChunkKey]) -> list[dict[str, Any]]:
    """The frames that acknowledge `keys`: one ACK for a single key, else ACKS of at most MAX_ACK_KEYS each."""
    if len(keys) == 1:
        return [ack_for(keys[0])]
    return [{"t": Msg.ACKS.value, "keys": list(keys[i:i + MAX_ACK_KEYS])} for i in range(0, len(keys), MAX_ACK_KEYS)]


def acked_keys(h: Mapping[str, Any]) -> list[ChunkKey]:
    """The chunk keys a validated ACK or ACKS acknowledges."""
    if h["t"] == Msg.ACK.value:
        return [chunk_key(h)]
    return [tuple(k) for k in h["keys"]]  # type: ignore[misc]


def bitmap(nodes: Any) -> bytes:
    """Contributor set as a little-endian bitmap of node ids (one bit per node, any cluster size)."""
    value = 0
    for n in nodes:
        value |= 1 << n
    return bitmap_bytes(value)


def bitmap_bytes(value: int) -> bytes:
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "little")


def bitmap_int(data: bytes) -> int:
    return int.from_bytes(data, "little")


def members(value: int) -> list[int]:
    out, n = [], 0
    while value:
        if value & 1:
            out.append(n)
        value >>= 1
        n += 1
    return out
