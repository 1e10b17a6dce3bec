"""What a field's content may be, beyond its type: the checks messages declare next to their fields.

A node id is a bit in a contributor bitmap, so it must be small; numbers must be finite; lists and
maps are bounded so that a handler's loop over them is bounded too. Each check raises `Bad`, which
validation turns into a ProtocolError naming the message type and the field.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from core.classes import MAX_WEIGHT, NO_DEADLINE, PRIORITIES

MAX_NODE = 1 << 16
MAX_ITEMS = 1 << 16  # entries of a list or map inside one control message
MAX_MBPS = 1e7  # the largest link or cap rate a message may name (10 Tbit/s)
MAX_TEXT = 4096  # characters of a free-text field (an error message, a host name)

Check = Callable[[Any], Any]


class Bad(ValueError):
    """A field's content is wrong; validation turns it into a ProtocolError naming the field."""


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def node(v: Any) -> int:
    if not is_int(v) or not 0 <= v < MAX_NODE:
        raise Bad(f"{v!r} is not a node id (0..{MAX_NODE - 1})")
    return v


def node_or_scheduler(v: Any) -> int:
    """HELLO's node: an agent's id, or -1 for the scheduler."""
    if v != -1:
        node(v)
    return v


def node_key(k: Any) -> int:
    """Map keys that name nodes: ints, or decimal strings (JSON-minded senders)."""
    if isinstance(k, str) and k.isdigit() and len(k) <= 6:
        k = int(k)
    return node(k)


def count(v: Any) -> None:
    if not is_int(v) or v < 0:
        raise Bad(f"{v!r} is not a non-negative int")


def non_negative(v: Any) -> None:
    if not is_num(v) or v < 0:
        raise Bad(f"{v!r} is not a finite non-negative number")


def _items(v: Any, what: str) -> Any:
    if len(v) > MAX_ITEMS:
        raise Bad(f"{len(v)} {what}, more than {MAX_ITEMS}")
    return v


def list_of(item: Check, what: str) -> Check:
    def check(v: Any) -> None:
        for x in _items(v, what):
            item(x)
    return check


def pair(first: Check, second: Check) -> Check:
    def check(v: Any) -> None:
        if not isinstance(v, list | tuple) or len(v) != 2:
            raise Bad(f"{v!r} is not a pair")
        first(v[0])
        second(v[1])
    return check


def text(limit: int = MAX_TEXT) -> Check:
    def check(v: Any) -> None:
        if len(v) > limit:
            raise Bad(f"{len(v)} characters, more than {limit}")
    return check


def sample(v: Any) -> None:
    """[src, dst, bytes, seconds(, probed)] of a link's busy time: bytes > 0, seconds finite and > 0,
    probed 1 where a probe kept the link busy (0 or absent: a plan's chunks)."""
    if not isinstance(v, list | tuple) or len(v) not in (4, 5):
        raise Bad(f"sample {v!r} is not [src, dst, bytes, seconds(, probed)]")
    if len(v) == 5 and (v[4] not in (0, 1) or isinstance(v[4], float)):
        raise Bad(f"sample's probed flag {v[4]!r} is not 0 or 1")
    node(v[0])
    node(v[1])
    if not is_int(v[2]) or v[2] <= 0:
        raise Bad(f"sample bytes {v[2]!r} is not a positive int")
    if not is_num(v[3]) or v[3] <= 0:
        raise Bad(f"sample seconds {v[3]!r} is not a finite positive number")


def cap_sample(v: Any) -> None:
    """[kind, bytes, seconds] of a node cap's busy time: kind 0 = uplink, 1 = downlink."""
    if not isinstance(v, list | tuple) or len(v) != 3:
        raise Bad(f"cap sample {v!r} is not [kind, bytes, seconds]")
    if v[0] not in (0, 1) or isinstance(v[0], bool):
        raise Bad(f"cap sample kind {v[0]!r} is not 0 (uplink) or 1 (downlink)")
    if not is_int(v[1]) or v[1] <= 0:
        raise Bad(f"cap sample bytes {v[1]!r} is not a positive int")
    if not is_num(v[2]) or v[2] <= 0:
        raise Bad(f"cap sample seconds {v[2]!r} is not a finite positive number")


def declared_caps(v: Any) -> None:
    """[uplink, downlink] Mbit/s a node runs its caps at now (None: no such cap)."""
    if not isinstance(v, list | tuple) or len(v) != 2:
        raise Bad(f"declared caps {v!r} are not [uplink, downlink]")
    for x in v:
        if x is not None and (not is_num(x) or not 0 < x < MAX_MBPS):
            raise Bad(f"declared cap {x!r} is not a positive rate below {MAX_MBPS:g} Mbit/s")


def counters(v: Any) -> None:
    for k, n in _items(v, "links").items():
        node_key(k)
        count(n)


def positive(v: Any) -> None:
    if not is_num(v) or v <= 0:
        raise Bad(f"{v!r} is not a finite number > 0")


def _per_tree(v: Any, fields: str) -> Any:
    """A 4-list whose first item is a tree index (a plan's group); returns it."""
    if not isinstance(v, list | tuple) or len(v) != 4:
        raise Bad(f"{v!r} is not [{fields}]")
    if not is_int(v[0]) or not 0 <= v[0] < MAX_ITEMS:
        raise Bad(f"tree {v[0]!r} is not an index 0..{MAX_ITEMS - 1}")
    return v


def edge_rate(v: Any) -> None:
    """[tree, a, b, Mbit/s] of a per-flow rate: a tree index, two node ids, a rate >= 0."""
    _, a, b, mbps = _per_tree(v, "tree, a, b, mbps")
    node(a)
    node(b)
    if a == b:
        raise Bad(f"edge {a}->{b} is not between two nodes")
    if not is_num(mbps) or not 0 <= mbps < MAX_MBPS:
        raise Bad(f"rate {mbps!r} is not a finite Mbit/s >= 0")


def task_counters(v: Any) -> None:
    """task id -> [count, count] (bytes at two moments): non-negative ints."""
    for k, pair_ in _items(v, "tasks").items():
        count(k)
        if not isinstance(pair_, list | tuple) or len(pair_) != 2:
            raise Bad(f"task {k}: {pair_!r} is not [bytes, bytes]")
        count(pair_[0])
        count(pair_[1])


def peers(v: Any) -> None:
    for k, addr in _items(v, "peers").items():
        node_key(k)
        if (not isinstance(addr, list | tuple) or len(addr) != 3 or not isinstance(addr[0], str)
                or len(addr[0]) > 255 or not is_int(addr[1]) or not 0 <= addr[1] < 65536 or not is_int(addr[2])):
            raise Bad(f"peer {k}: {addr!r} is not [host, port, epoch]")


def port(v: Any) -> None:
    if not 0 <= v < 65536:
        raise Bad(f"{v!r} is not a port")


def plain(v: Any, depth: int = 0) -> int:
    """Nested maps of finite numbers, booleans, None and short strings (job statistics); its size."""
    if isinstance(v, dict):
        if depth >= 4:
            raise Bad("nested too deep")
        size = 0
        for k, x in v.items():
            if not isinstance(k, str | int) or isinstance(k, bool):
                raise Bad(f"key {k!r} is not a name")
            size += 1 + plain(x, depth + 1)
            if size > MAX_ITEMS:
                raise Bad(f"more than {MAX_ITEMS} entries")
        return size
    if isinstance(v, list | tuple):
        if depth >= 4 or len(v) > MAX_ITEMS:
            raise Bad("list nested too deep or too long")
        return sum(1 + plain(x, depth + 1) for x in v)
    if v is None or isinstance(v, bool) or is_num(v) or (isinstance(v, str) and len(v) <= MAX_TEXT):
        return 0
    raise Bad(f"{type(v).__name__} value {v!r:.40} is not a finite number, bool, null or short text")


def traffic_class(v: Any) -> None:
    """A chunk's class (overlay.classes): [tree, weight in (0, MAX_WEIGHT], priority 0..7, deadline]."""
    _, weight, prio, deadline = _per_tree(v, "tree, weight, priority, deadline")
    if not is_num(weight) or not 0 < weight <= MAX_WEIGHT:
        raise Bad(f"weight {weight!r} is not a share in (0, {MAX_WEIGHT:g}]")
    if not is_int(prio) or not 0 <= prio < PRIORITIES:
        raise Bad(f"priority {prio!r} is not a level 0..{PRIORITIES - 1}")
    if not is_num(deadline) or (deadline < 0 and deadline != NO_DEADLINE):
        raise Bad(f"deadline {deadline!r} is not a time >= 0 (or {NO_DEADLINE:g}: none)")
