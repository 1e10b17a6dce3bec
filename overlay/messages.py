"""Every message type of the wire, with the schema that guards it.

A header is acted on only after `validate()` accepted it, so the rest of the code can index
fields without defensive checks. A well-framed but invalid header raises `ProtocolError`, which
names the field and the peer; framing errors (bad length, oversize) are `FramingError` and close
the connection instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

NUM = (int, float)
INT = (int,)
STR = (str,)
BIN = (bytes,)
LIST = (list, tuple)
DICT = (dict,)
BOOL = (bool,)
ANY = (object,)

# Kinds of data frame: a partial sum going up a tree, a final value coming down, a source's own
# parameters (multicast schemes), or a probe that only measures a link.
CHUNK_KINDS = ("agg", "bcast", "mcast", "probe")
# A relay allocates a chunk's `total` bytes when its first segment arrives: never more than this
# (the largest frame a connection takes, overlay.codec.MAX_PAYLOAD).
MAX_CHUNK_BYTES = 256 * 1024 * 1024


class ProtocolError(Exception):
    """A well-framed message that breaks the schema; names the field and the peer."""

    def __init__(self, reason: str, *, field: str | None = None, peer: object = None,
                 msg_type: str | None = None) -> None:
        self.reason = reason
        self.field = field
        self.peer = peer
        self.msg_type = msg_type
        where = f" field {field!r}" if field else ""
        of = f" in {msg_type}" if msg_type else ""
        super().__init__(f"protocol error from peer {peer!r}{of}:{where} {reason}")


class FramingError(ProtocolError):
    """The byte stream itself is broken (length out of range, truncated); the connection closes."""


# field name -> (accepted python types, required)
Schema = Mapping[str, tuple[tuple[type, ...], bool]]

_KEY: Schema = {
    "job": (INT, True), "round": (INT, True), "attempt": (INT, True), "version": (INT, True),
    "chunk": (INT, True), "kind": (STR, True), "origin": (INT, True),
}

SCHEMAS: dict[str, Schema] = {
    # handshake (either direction)
    "HELLO": {"node": (INT, True), "cluster": (STR, True), "role": (STR, True), "nonce": (BIN, False),
              "epoch": (INT, False)},
    "CHALLENGE": {"nonce": (BIN, True), "mac": (BIN, False)},
    "AUTH": {"mac": (BIN, True)},
    # control plane: agent <-> scheduler
    "REGISTER": {"node": (INT, True), "host": (STR, True), "port": (INT, True),
                 "neighbors": (LIST, True), "pid": (INT, False), "seen_job": (INT, False),
                 "seen_version": (INT, False)},  # seen_*: what this agent saw of an earlier scheduler
    "PEERS": {"peers": (DICT, True)},
    # rx: data bytes received so far; stuck: [[peer, seconds its chunks wait unacknowledged], ...]
    "HEARTBEAT": {"node": (INT, True), "time": (NUM, True), "rx": (INT, False), "stuck": (LIST, False)},
    "REPORT": {"node": (INT, True), "samples": (LIST, True)},
    "READY": {"round": (INT, True), "progress": (NUM, True)},
    "JOB": {"job": (INT, True), "scheme": (STR, True), "rounds": (INT, True), "params": (INT, True),
            "compute_s": (NUM, True), "t0": (NUM, False), "warmup": (INT, False),
            "start": (INT, False),  # start: first round for an agent that rejoined mid-job
            "ahead": (INT, False)},  # rounds a node may receive ahead of its own (its progress model's window)
    "TOPO_REQUEST": {"job": (INT, True), "round": (INT, True), "have": (LIST, False), "attempt": (INT, False)},
    "TOPO_REPLY": {"job": (INT, True), "round": (INT, True), "version": (INT, True),
                   "plan": (DICT, False), "attempt": (INT, False), "skip": (BOOL, False),
                   "avoid": (LIST, False)},  # avoid: links suspected dead, routed around this round
    # a lost agent's incarnation: its connections are dropped and that epoch is never accepted again
    "FENCE": {"node": (INT, True), "epoch": (INT, True)},
    "AUX_UPDATE": {"job": (INT, True), "version": (INT, True), "groups": (LIST, True)},  # per group: wire aux
    "ROUND_DONE": {"node": (INT, True), "job": (INT, True), "round": (INT, True),
                   "attempt": (INT, True), "version": (INT, True), "digest": (BIN, True),
                   "ok": (BOOL, True), "t_start": (NUM, True), "t_end": (NUM, True),
                   "t_compute": (NUM, True), "t_wait": (NUM, False), "error": (STR, False)},
    "ABORT": {"job": (INT, True), "round": (INT, True), "attempt": (INT, True)},
    "CLOCK": {"t0": (NUM, True), "t1": (NUM, False)},
    "STATS": {"node": (INT, True), "job": (INT, True), "stats": (DICT, True)},
    # cumulative bytes sent per outgoing link (dst -> bytes) at `time` (synced clock): live throughput, metrics
    "COUNTERS": {"node": (INT, True), "time": (NUM, True), "links": (DICT, True)},
    "SHUTDOWN": {},
    # emulation control (scheduler -> the agents owning a link; fault injection on the app backend)
    "EMU": {"op": (STR, True), "src": (INT, True), "dst": (INT, True), "mbps": (NUM, False), "on": (BOOL, False)},
    # data plane: agent <-> agent
    "CHUNK": {**_KEY, "contributors": (BIN, True), "t_send": (NUM, True), "path": (LIST, True),
              "hop": (INT, True), "off": (INT, True), "total": (INT, True), "nbytes": (INT, True)},
    "ACK": {**_KEY, "dst": (INT, True)},
}

# Which message types may carry payload bytes after the header.
PAYLOAD_TYPES = frozenset({"CHUNK"})

# Bounds on what a message may hold beyond its field types: a node id is a bit in a contributor
# bitmap, so it must be small; lists and maps are bounded so a handler's loop is too.
MAX_NODE = 1 << 16
MAX_ITEMS = 1 << 16  # entries of a list or map inside one control message
MAX_TEXT = 4096  # characters of a free-text field (an error message, a host name)


def validate(header: Any, peer: object = None) -> dict[str, Any]:
    """Return the header if it is a known, complete, well-typed message; raise ProtocolError if not."""
    if not isinstance(header, dict):
        raise ProtocolError(f"header is a {type(header).__name__}, not a map", peer=peer)
    t = header.get("t")
    if not isinstance(t, str):
        raise ProtocolError("missing or non-string message type", field="t", peer=peer)
    schema = SCHEMAS.get(t)
    if schema is None:
        raise ProtocolError(f"unknown message type {t!r}", field="t", peer=peer, msg_type=t)
    for name, (types, required) in schema.items():
        if name not in header:
            if required:
                raise ProtocolError("missing", field=name, peer=peer, msg_type=t)
            continue
        value = header[name]
        # bool is an int subclass: keep integer fields honest
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise ProtocolError(f"has type {type(value).__name__}", field=name, peer=peer, msg_type=t)
        if isinstance(value, float) and not math.isfinite(value):
            raise ProtocolError("must be a finite number", field=name, peer=peer, msg_type=t)
    nbytes = header.get("nbytes", 0)
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        raise ProtocolError("must be a non-negative int", field="nbytes", peer=peer, msg_type=t)
    if nbytes and t not in PAYLOAD_TYPES:
        raise ProtocolError("payload on a message type that carries none", field="nbytes", peer=peer,
                            msg_type=t)
    for name in _NODE_FIELDS & header.keys():
        if not -1 <= header[name] < MAX_NODE:
            raise ProtocolError(f"node id {header[name]} outside 0..{MAX_NODE - 1}", field=name, peer=peer,
                                msg_type=t)
    for name in _COUNT_FIELDS & header.keys():
        if header[name] < 0:
            raise ProtocolError("must not be negative", field=name, peer=peer, msg_type=t)
    try:
        for name, check in _CHECKS.get(t, {}).items():
            if name in header:
                check(header[name])
    except _Bad as bad:
        raise ProtocolError(str(bad), field=name, peer=peer, msg_type=t) from None
    if t == "CHUNK":
        _validate_chunk(header, peer)
    elif t == "EMU":
        _validate_emu(header, peer)
    elif t == "ACK" and header["kind"] not in CHUNK_KINDS:
        raise ProtocolError(f"unknown kind {header['kind']!r}", field="kind", peer=peer, msg_type=t)
    return header


# --- what field types alone cannot say ---------------------------------------------------------------
_NODE_FIELDS = frozenset({"node", "src", "dst", "origin"})  # -1: the scheduler (HELLO)
_COUNT_FIELDS = frozenset({"job", "round", "attempt", "version", "chunk", "rounds", "params", "warmup", "start",
                           "epoch", "rx", "pid", "seen_job", "seen_version", "hop", "off", "total", "port", "ahead",
                           "compute_s", "time"})


class _Bad(ValueError):
    """A field's content is wrong; validate() turns it into a ProtocolError naming the field."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _node(v: Any) -> int:
    if not _is_int(v) or not 0 <= v < MAX_NODE:
        raise _Bad(f"{v!r} is not a node id (0..{MAX_NODE - 1})")
    return v


def _node_key(k: Any) -> int:
    """Map keys that name nodes: ints, or decimal strings (JSON-minded senders)."""
    if isinstance(k, str) and k.isdigit() and len(k) <= 6:
        k = int(k)
    return _node(k)


def _items(v: Any, what: str) -> Any:
    if len(v) > MAX_ITEMS:
        raise _Bad(f"{len(v)} {what}, more than {MAX_ITEMS}")
    return v


def _list_of(item: Callable[[Any], Any], what: str) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        for x in _items(v, what):
            item(x)
    return check


def _pair(first: Callable[[Any], Any], second: Callable[[Any], Any]) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if not isinstance(v, list | tuple) or len(v) != 2:
            raise _Bad(f"{v!r} is not a pair")
        first(v[0])
        second(v[1])
    return check


def _sample(v: Any) -> None:
    """[src, dst, bytes, seconds] of one chunk transfer: bytes > 0, seconds finite and > 0."""
    if not isinstance(v, list | tuple) or len(v) != 4:
        raise _Bad(f"sample {v!r} is not [src, dst, bytes, seconds]")
    _node(v[0])
    _node(v[1])
    if not _is_int(v[2]) or v[2] <= 0:
        raise _Bad(f"sample bytes {v[2]!r} is not a positive int")
    if not _is_num(v[3]) or v[3] <= 0:
        raise _Bad(f"sample seconds {v[3]!r} is not a finite positive number")


def _non_negative(v: Any) -> None:
    if not _is_num(v) or v < 0:
        raise _Bad(f"{v!r} is not a finite non-negative number")


def _count(v: Any) -> None:
    if not _is_int(v) or v < 0:
        raise _Bad(f"{v!r} is not a non-negative int")


def _text(limit: int = MAX_TEXT) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if len(v) > limit:
            raise _Bad(f"{len(v)} characters, more than {limit}")
    return check


def _counters(v: Any) -> None:
    for k, n in _items(v, "links").items():
        _node_key(k)
        _count(n)


def _peers(v: Any) -> None:
    for k, addr in _items(v, "peers").items():
        _node_key(k)
        if (not isinstance(addr, list | tuple) or len(addr) != 3 or not isinstance(addr[0], str)
                or len(addr[0]) > 255 or not _is_int(addr[1]) or not 0 <= addr[1] < 65536 or not _is_int(addr[2])):
            raise _Bad(f"peer {k}: {addr!r} is not [host, port, epoch]")


def _plain(v: Any, depth: int = 0) -> int:
    """Nested maps of finite numbers, booleans, None and short strings (job statistics); its size."""
    if isinstance(v, dict):
        if depth >= 4:
            raise _Bad("nested too deep")
        size = 0
        for k, x in v.items():
            if not isinstance(k, str | int) or isinstance(k, bool):
                raise _Bad(f"key {k!r} is not a name")
            size += 1 + _plain(x, depth + 1)
            if size > MAX_ITEMS:
                raise _Bad(f"more than {MAX_ITEMS} entries")
        return size
    if isinstance(v, list | tuple):
        if depth >= 4 or len(v) > MAX_ITEMS:
            raise _Bad("list nested too deep or too long")
        return sum(1 + _plain(x, depth + 1) for x in v)
    if v is None or isinstance(v, bool) or _is_num(v) or (isinstance(v, str) and len(v) <= MAX_TEXT):
        return 0
    raise _Bad(f"{type(v).__name__} value {v!r:.40} is not a finite number, bool, null or short text")


_CHECKS: dict[str, dict[str, Callable[[Any], Any]]] = {
    "HELLO": {"cluster": _text(256), "role": _text(32)},
    "REGISTER": {"host": _text(255), "neighbors": _list_of(_node, "neighbours")},
    "PEERS": {"peers": _peers},
    "HEARTBEAT": {"stuck": _list_of(_pair(_node, _non_negative), "stuck links")},
    "REPORT": {"samples": _list_of(_sample, "samples")},
    "READY": {"progress": _non_negative},
    "TOPO_REQUEST": {"have": _list_of(_count, "versions")},
    "TOPO_REPLY": {"avoid": _list_of(_pair(_node, _node), "links")},
    "ROUND_DONE": {"digest": _text(64), "error": _text()},
    "STATS": {"stats": _plain},
    "COUNTERS": {"links": _counters},
    "CHUNK": {"path": _list_of(_node, "hops"), "contributors": _text(MAX_NODE // 8)},
}


EMU_OPS = ("rate", "down", "blackhole")


def _validate_emu(h: dict[str, Any], peer: object) -> None:
    if h["op"] not in EMU_OPS:
        raise ProtocolError(f"unknown op {h['op']!r} (one of {', '.join(EMU_OPS)})", field="op", peer=peer,
                            msg_type="EMU")
    if h["src"] == h["dst"] or h["src"] < 0 or h["dst"] < 0:
        raise ProtocolError("src and dst must be two different node ids", field="dst", peer=peer, msg_type="EMU")
    if h["op"] == "rate":
        mbps = h.get("mbps")
        if mbps is None or isinstance(mbps, bool) or not 0 <= mbps < float("inf"):
            raise ProtocolError("rate needs a finite mbps >= 0 (0 = outage)", field="mbps", peer=peer,
                                msg_type="EMU")
    elif "on" not in h:
        raise ProtocolError(f"{h['op']} needs on=true|false", field="on", peer=peer, msg_type="EMU")


def _validate_chunk(h: dict[str, Any], peer: object) -> None:
    if h["kind"] not in CHUNK_KINDS:
        raise ProtocolError(f"unknown kind {h['kind']!r}", field="kind", peer=peer, msg_type="CHUNK")
    path = h["path"]
    if len(path) < 2 or not all(isinstance(n, int) and not isinstance(n, bool) for n in path):
        raise ProtocolError("must list at least two node ids", field="path", peer=peer, msg_type="CHUNK")
    if len(set(path)) != len(path):
        raise ProtocolError("visits a node twice", field="path", peer=peer, msg_type="CHUNK")
    if not 0 <= h["hop"] < len(path) - 1:
        raise ProtocolError("outside the path", field="hop", peer=peer, msg_type="CHUNK")
    if h["nbytes"] <= 0:
        raise ProtocolError("a data frame carries at least one byte", field="nbytes", peer=peer, msg_type="CHUNK")
    if h["total"] > MAX_CHUNK_BYTES:
        raise ProtocolError(f"chunk of {h['total']} bytes exceeds {MAX_CHUNK_BYTES}", field="total", peer=peer,
                            msg_type="CHUNK")
    if h["off"] < 0 or h["off"] + h["nbytes"] > h["total"]:
        raise ProtocolError("segment outside the chunk", field="off", peer=peer, msg_type="CHUNK")
    if h["nbytes"] % 4 or h["off"] % 4 or h["total"] % 4:
        raise ProtocolError("not a whole number of float32", field="nbytes", peer=peer, msg_type="CHUNK")


ChunkKey = tuple[int, int, int, int, int, str, int, int]


def chunk_key(h: Mapping[str, Any]) -> ChunkKey:
    """The identity of one chunk transfer: what duplicates, acks and resends are keyed by.

    (job, round, attempt, version, chunk, kind, origin, destination): one origin may send the
    same chunk to several destinations (a broadcast), possibly through the same relay."""
    dst = h["path"][-1] if "path" in h else h["dst"]
    return (h["job"], h["round"], h["attempt"], h["version"], h["chunk"], h["kind"], h["origin"], dst)


def ack_for(key: ChunkKey) -> dict[str, Any]:
    job, rnd, attempt, version, chunk, kind, origin, dst = key
    return {"t": "ACK", "job": job, "round": rnd, "attempt": attempt, "version": version,
            "chunk": chunk, "kind": kind, "origin": origin, "dst": dst}


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
