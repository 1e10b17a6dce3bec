"""The local hand-off channel between a training script and its node's agent: what crosses it, and
the checks that keep it from being a way in.

Bulk data never crosses the socket: at attach the agent creates one memfd, passes it over the socket
(SCM_RIGHTS) and both processes map it. It holds three regions of `slot` float32 values each (the
model's P values and the check trailer after them): two send slots, used by steps in turn (step k
writes slot k % 2, so a round the agent must redo after an abort still has its contribution while
the script writes the next one), and the result. Only small control messages cross the socket, each
a 4-byte big-endian length and a msgpack map:

    script -> agent   hello {token, rank, pid, layout, params}   once, first
                      step {k, sealed}      slot k % 2 holds step k's contribution (model values; with
                                            sealed, its check trailer after them, core.sketch.Folder)
                      log {metrics}         numbers for the run's results
                      bye {steps}           detach
    agent -> script   welcome {params, slot, world, flags} + the memfd     attached (every rank attached
                                            and their models agree), or
                      refused {error}       and the connection closes
                      done {k, ok, weight, members, error}   the result region holds step k's sum

Who may connect: the socket sits in a directory only the run's user can enter (0700) and is itself
0600; the agent also checks the peer's credentials (SO_PEERCRED: the same user) and a per-run token
(compared in constant time). The cluster secret never reaches user code. A frame longer than
MAX_FRAME is refused before anything is allocated for it.
"""

from __future__ import annotations

import hmac
import math
import socket
import struct
from collections.abc import Mapping
from typing import Any

import msgpack

from core.sketch import trailer_len

TOKEN_ENV = "WANSYNC_HANDOFF_TOKEN"
CHANNEL_ENV = "WANSYNC_CHANNEL"  # the socket's path, as the launcher gives it to the script
PROGRESS_ENV = "WANSYNC_PROGRESS"  # the run's progress model (wansync train sets it)
GROUPS_ENV = "WANSYNC_GROUPS"  # who a rank's result comes from: full, partial or multicast
MAX_FRAME = 1 << 20  # a layout of many tensors fits; a model's values never cross the socket
MAX_TENSORS = 8192  # a layout stays within one control message (overlay.fieldcheck.MAX_ITEMS)
MAX_PARAMS = 1 << 33  # elements of one model
MAX_METRICS = 64
SLOTS = 3  # send, send, result
SKETCH_SEED = 1  # the check's sign rows (core.sketch), the same for every rank and whoever seals a slot
HEADER = struct.Struct(">I")
DTYPES = ("float32", "float16", "bfloat16")


class HandoffError(ValueError):
    """A message that breaks the channel's rules (or a peer that may not use it); says which rule."""


def encode(msg: Mapping[str, Any]) -> bytes:
    body = msgpack.packb(dict(msg), use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise HandoffError(f"{msg.get('t')} message of {len(body)} bytes is over the channel's {MAX_FRAME}")
    return HEADER.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    """The length a frame announces, refused when over MAX_FRAME (before reading, let alone allocating)."""
    (n,) = HEADER.unpack(header)
    if n == 0 or n > MAX_FRAME:
        raise HandoffError(f"a frame announces {n} bytes (1..{MAX_FRAME} allowed)")
    return n


def decode(body: bytes) -> dict[str, Any]:
    try:
        msg = msgpack.unpackb(body, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise HandoffError(f"not msgpack: {type(exc).__name__}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
        raise HandoffError("a message must be a map with a string 't'")
    return msg


def _int(msg: Mapping[str, Any], key: str, lo: int = 0, hi: int = 1 << 62) -> int:
    v = msg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise HandoffError(f"{msg['t']}.{key} must be an integer in {lo}..{hi}, got {v!r}"[:200])
    return v


def _str(msg: Mapping[str, Any], key: str, limit: int = 256) -> str:
    v = msg.get(key)
    if not isinstance(v, str) or len(v) > limit:
        raise HandoffError(f"{msg['t']}.{key} must be a string of at most {limit} characters")
    return v


# --- what the script says --------------------------------------------------------------------------------
def check_hello(msg: Mapping[str, Any], token: str, rank: int) -> dict[str, Any]:
    """A hello that carries this run's token and this agent's rank, with a layout that makes sense.
    Returns the layout (names, shapes, dtypes, params)."""
    if msg["t"] != "hello":
        raise HandoffError(f"the first message must be hello, got {msg['t']!r}"[:100])
    got = msg.get("token")
    if not isinstance(got, str) or not hmac.compare_digest(got.encode(), token.encode()):
        raise HandoffError("wrong token (not this run's)")
    if (r := _int(msg, "rank", hi=1 << 16)) != rank:
        raise HandoffError(f"rank {r} attached to the agent of rank {rank}")
    _int(msg, "pid", 1)
    return check_layout(msg.get("layout"))


def check_layout(layout: Any) -> dict[str, Any]:
    """names, shapes, dtypes of the same length (<= MAX_TENSORS), shapes of non-negative ints, dtypes
    we sync; params = the sum of the shapes' products (must match what the script says)."""
    if not isinstance(layout, dict):
        raise HandoffError("hello.layout must be a map")
    names, shapes, dtypes = layout.get("names"), layout.get("shapes"), layout.get("dtypes")
    if not all(isinstance(v, list) for v in (names, shapes, dtypes)):
        raise HandoffError("hello.layout needs lists names, shapes, dtypes")
    assert isinstance(names, list) and isinstance(shapes, list) and isinstance(dtypes, list)
    if not len(names) == len(shapes) == len(dtypes) or not 0 < len(names) <= MAX_TENSORS:
        raise HandoffError(f"hello.layout: names, shapes and dtypes must have the same length, 1..{MAX_TENSORS}")
    total = 0
    for name, shape, dtype in zip(names, shapes, dtypes, strict=True):
        if not isinstance(name, str) or len(name) > 256:
            raise HandoffError("hello.layout: a name must be a string of at most 256 characters")
        if (not isinstance(shape, list) or len(shape) > 16
                or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape)):
            raise HandoffError(f"hello.layout: {name!r} has a shape that is not a list of sizes")
        if dtype not in DTYPES:
            raise HandoffError(f"hello.layout: {name!r} has dtype {dtype!r}; wansync syncs {', '.join(DTYPES)}")
        total += math.prod(shape)
        if total > MAX_PARAMS:
            raise HandoffError(f"hello.layout: more than {MAX_PARAMS} values")
    if total == 0:
        raise HandoffError("hello.layout: the model has no values")
    return {"names": names, "shapes": shapes, "dtypes": dtypes, "params": total}


def check_step(msg: Mapping[str, Any], expect: int) -> tuple[int, bool]:
    """The step's number (the one expected) and whether the script wrote the slot's trailer itself."""
    k = _int(msg, "k")
    if k != expect:
        raise HandoffError(f"step {k} announced, step {expect} expected (one step at a time, in order)")
    sealed = msg.get("sealed", False)
    if not isinstance(sealed, bool):
        raise HandoffError(f"step.sealed must be true or false, got {sealed!r}"[:100])
    return k, sealed


def check_log(msg: Mapping[str, Any]) -> dict[str, float]:
    metrics = msg.get("metrics")
    if not isinstance(metrics, dict) or len(metrics) > MAX_METRICS:
        raise HandoffError(f"log.metrics must be a map of at most {MAX_METRICS} numbers")
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if (not isinstance(k, str) or len(k) > 64 or k == "t" or not isinstance(v, int | float) or isinstance(v, bool)
                or not math.isfinite(v)):
            raise HandoffError("log.metrics: names of at most 64 characters (not 't'), finite numbers as values")
        out[k] = float(v)
    return out


# --- layouts across ranks --------------------------------------------------------------------------------
def difference(mine: Mapping[str, Any], other: Mapping[str, Any]) -> str | None:
    """How `other`'s model differs from `mine`, in words (None: the same layout)."""
    a, b = len(mine["names"]), len(other["names"])
    for i in range(min(a, b)):
        what = f"tensor {i} ({other['names'][i]!r})"
        if list(mine["shapes"][i]) != list(other["shapes"][i]):
            return f"{what} has shape {list(other['shapes'][i])}, rank 0's {list(mine['shapes'][i])}"
        if mine["dtypes"][i] != other["dtypes"][i]:
            return f"{what} is {other['dtypes'][i]}, rank 0's is {mine['dtypes'][i]}"
    if a != b:
        return f"{b} tensors ({other['params']:,} values), rank 0's model has {a} ({mine['params']:,})"
    return None


# --- the peer -------------------------------------------------------------------------------------------
def peer_uid(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def slot_values(params: int, flags: int) -> int:
    """Float32 values per region: the model, the check trailer (sketch, L1, one flag per rank),
    rounded up to 16 (64-byte aligned regions)."""
    return -(-(params + trailer_len(flags)) // 16) * 16
