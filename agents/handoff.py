"""The agent's end of the local hand-off channel (overlay.handoff): a training script attaches, its
steps become this node's contributions, and each round's result goes back to it.

One script at a time per agent. A connection is served only after the checks of overlay.handoff (the
same user, this run's token, this agent's rank, a layout that makes sense); then the scheduler
compares every rank's layout (ATTACH / ATTACHED), and only when they all agree does the script get
the memfd both processes map. A stranger, a wrong token or a malformed message costs one log line
and the connection; nothing is allocated from a size the peer announced.

Per step: the script fills send slot k % 2 with its P values and says `step k`; `contribution(k)`
appends the check trailer in place (core.sketch, and one flag per rank: a contribution that is not
finite is sent as zeros with its rank's flag set, so the sync fails naming the rank instead of
spreading NaN) and returns the slot as the round's contribution, without a copy. `deliver(k, ...)`
says `done k` once the round's sum is in the result region: received there in place (a BSP job's first
attempt of a round, `result_region`), else copied there.

Failures (docs/training-failures.md). A script that dies (its channel closes without `bye`) or
stops calling `step()` is reported through `on_gone`, and the agent tells the scheduler (LEAVE): its
node sits the job out until a script attaches again. "Stops calling" means: a round waits for its
next step longer than max(`stall_s`, STALL_FACTOR x the slowest step gap this script showed); that
script then gets an `error` frame naming why and its channel closes, so a late `step()` raises
`SyncError` instead of syncing into rounds that went on without it. Rounds and steps: round =
step + `offset` (a script that rejoins starts at step 0 in a later round); a round that hands the
current model to a rejoining script (`share`) moves the other scripts' steps one round on.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core import sketch
from overlay import handoff as wire

log = logging.getLogger("wansync.handoff")

HELLO_TIMEOUT_S = 10.0
STALL_S = 60.0  # a script idle this long while a round waits for its step is gone (at least; see below)
STALL_FACTOR = 4.0  # ... and at least this many times its slowest step gap so far
SHARE_TIMEOUT_S = 60.0  # a script asked for its model (a rank rejoins) answers within this

# the scheduler's verdict on every rank's layout: (ok, error, world[, rejoin: the job runs, this rank
# comes back into it and gets the current model])
AttachVerdict = Callable[[dict[str, Any]], Awaitable[tuple[Any, ...]]]


def socket_path(directory: str | Path, node: int) -> Path:
    return Path(directory) / f"node-{node}.sock"


@dataclass
class Script:
    """The attached script: its connection, the shared memory and where its steps are."""

    conn: socket.socket
    pid: int
    layout: dict[str, Any]
    world: int
    mem: mmap.mmap
    slot: int  # float32 values per region
    regions: list[np.ndarray] = field(default_factory=list)  # send 0, send 1, result
    step: int | None = None  # the step announced and not yet delivered
    next_step: int = 0
    delivered: int = -1
    metrics: list[dict[str, float]] = field(default_factory=list)  # {"t": synced time, name: value, ...}
    t_attach: float = 0.0
    nonfinite: int = 0
    seal_s: float = 0.0  # time sealing contributions (the check trailer) and copying results back
    deliver_s: float = 0.0
    sealed: dict[int, tuple[int, np.ndarray]] = field(default_factory=dict)  # slot -> (step, contribution)
    presealed: dict[int, int] = field(default_factory=dict)  # slot -> the step whose trailer the script wrote
    t_done: float = 0.0  # when the last `done` went out (or the script attached): its step gap starts
    slowest: float = 0.0  # its longest gap from a `done` to the next `step` so far (its compute time)
    bye: bool = False  # said goodbye: it ended, it did not die
    gone: str = ""  # why this agent gave up on it (it stopped calling step())
    shared: asyncio.Future | None = None  # a `share` request in flight: set when the script answers

    @property
    def params(self) -> int:
        return int(self.layout["params"])

    @property
    def values(self) -> int:
        """What the engine moves: the model and its trailer."""
        return self.params + sketch.trailer_len(self.world)


class Handoff:
    """The channel's server: listens on a Unix socket in the run's private directory."""

    def __init__(self, path: Path, token: str, node: int, verdict: AttachVerdict,
                 now: Callable[[], float] = time.time, *, stall_s: float = STALL_S,
                 on_gone: Callable[[str, bool], None] | None = None) -> None:
        """stall_s: the least idle time that counts as a hung script; on_gone(why, ended): the attached
        script died or hung (ended: it said goodbye) while this agent serves (not when the agent ends)."""
        if not token:
            raise ValueError("the hand-off channel needs a per-run token (WANSYNC_HANDOFF_TOKEN)")
        self.path, self.token, self.node = Path(path), token, node
        self.verdict = verdict
        self.now = now
        self.stall_s, self.on_gone = stall_s, on_gone
        self.offset = 0  # round = step + offset (the running job's first round for this script)
        self.attaching = False  # a script waits for the scheduler's verdict (it is about to attach)
        self._closing = False
        self.script: Script | None = None
        self.refused = 0
        self._sock: socket.socket | None = None
        self._tasks: set[asyncio.Task] = set()
        self._changed = asyncio.Event()  # a step arrived, or the script went away
        self._attached = asyncio.Event()

    # --- the socket ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Bind (only the run's user may connect: the directory is 0700, the socket 0600) and serve."""
        st = self.path.parent.stat()
        mode = st.st_mode & 0o777
        if mode & 0o077:
            raise PermissionError(f"{self.path.parent} is open to others (mode {mode:o}); the hand-off "
                                  "channel needs a private directory (0700)")
        if st.st_uid != os.geteuid():  # its owner could swap the socket for its own
            raise PermissionError(f"{self.path.parent} belongs to uid {st.st_uid}, not this run's "
                                  f"{os.geteuid()}; the hand-off channel needs a directory of its own")
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(4)
        sock.setblocking(False)
        self._sock = sock
        self._spawn(self._accept())

    def close(self) -> None:
        self._closing = True
        for t in self._tasks:
            t.cancel()
        if self._sock is not None:
            self._sock.close()
            self.path.unlink(missing_ok=True)
        self._detach("the agent ends")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            conn, _ = await loop.sock_accept(self._sock)
            conn.setblocking(False)
            self._spawn(self._serve(conn))

    async def _serve(self, conn: socket.socket) -> None:
        script: Script | None = None
        try:
            pid, uid = wire.peer_uid(conn)
            if uid != os.geteuid():
                raise wire.HandoffError(f"pid {pid} runs as uid {uid}, this run as uid {os.geteuid()}")
            if self.script is not None:
                raise wire.HandoffError(f"rank {self.node} already has a script attached (pid {self.script.pid})")
            hello = await asyncio.wait_for(self._recv(conn), HELLO_TIMEOUT_S)
            layout = wire.check_hello(hello, self.token, self.node)
            if self.script is not None:
                raise wire.HandoffError(f"rank {self.node} already has a script attached")
            self.attaching = True
            try:
                ok, error, world, *rejoin = await self.verdict(layout)
            finally:
                self.attaching = False
            if not ok:
                await self._send(conn, {"t": "refused", "error": error})
                log.warning("node %d: script pid %d refused: %s", self.node, pid, error)
                return
            script = self._attach(conn, pid, layout, world, bool(rejoin and rejoin[0]))  # the kernel's pid
            while True:
                msg = await self._recv(conn)
                if msg is None:
                    break
                if not self._on_message(script, msg):
                    break
        except (wire.HandoffError, TimeoutError) as exc:
            self.refused += 1
            why = str(exc) if isinstance(exc, wire.HandoffError) else "no hello in time"
            log.warning("node %d: hand-off channel: %s; connection closed", self.node, why)
            if script is None:
                await self._send(conn, {"t": "refused", "error": why}, quiet=True)
            elif not script.gone:  # cut off for what it said: gone all the same (said once, above)
                script.gone = f"rank {self.node}'s script (pid {script.pid}) was cut off: {why}"
                self._detach("the script detached")
                self._gone(script, script.gone, quiet=True)
        except OSError as exc:
            log.warning("node %d: hand-off channel: %s", self.node, exc)
        finally:
            conn.close()
            if script is not None and self.script is script:
                self._detach("the script detached")
                if script.bye and not self._closing:
                    self._gone(script, f"rank {self.node}'s script (pid {script.pid}) ended after "
                                       f"{script.next_step} steps", ended=True)
                elif not (script.gone or self._closing):
                    self._gone(script, f"rank {self.node}'s script (pid {script.pid}) died at step "
                                       f"{script.next_step} (its channel closed without a goodbye)")

    async def _recv(self, conn: socket.socket) -> dict[str, Any] | None:
        """One frame (None at a clean end between frames)."""
        header = await self._exactly(conn, wire.HEADER.size, eof_ok=True)
        if header is None:
            return None
        body = await self._exactly(conn, wire.frame_length(header))
        assert body is not None
        return wire.decode(body)

    @staticmethod
    async def _exactly(conn: socket.socket, n: int, eof_ok: bool = False) -> bytes | None:
        loop = asyncio.get_running_loop()
        buf = bytearray()
        while len(buf) < n:
            got = await loop.sock_recv(conn, min(n - len(buf), 1 << 16))
            if not got:
                if eof_ok and not buf:
                    return None
                raise wire.HandoffError("the script closed the channel in the middle of a message")
            buf += got
        return bytes(buf)

    async def _send(self, conn: socket.socket, msg: dict[str, Any], quiet: bool = False) -> None:
        try:
            await asyncio.get_running_loop().sock_sendall(conn, wire.encode(msg))
        except OSError:
            if not quiet:
                raise

    # --- attach and detach ------------------------------------------------------------------------------------
    def _attach(self, conn: socket.socket, pid: int, layout: dict[str, Any], world: int, rejoin: bool) -> Script:
        slot = wire.slot_values(int(layout["params"]), world)
        size = wire.SLOTS * slot * 4
        fd = os.memfd_create(f"wansync-rank{self.node}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            # paged in here (where the kernel can): the attach pays for the pages, not the first steps
            mem = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
            msg = wire.encode({"t": "welcome", "params": layout["params"], "slot": slot, "world": world,
                               "flags": world, "rows": sketch.ROWS, "rejoin": rejoin})
            conn.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(memoryview(
                np.array([fd], np.int32)).cast("B")))])
        finally:
            os.close(fd)  # the mapping and the script's copy keep the memory
        script = Script(conn, pid, layout, world, mem, slot, t_attach=self.now())
        whole = np.frombuffer(mem, np.float32)
        script.regions = [whole[i * slot:(i + 1) * slot] for i in range(wire.SLOTS)]
        script.t_done = time.monotonic()
        self.script = script
        self._attached.set()
        log.info("node %d: script pid %d attached (%d values, world %d)", self.node, pid, script.params, world)
        return script

    def _detach(self, why: str) -> None:
        script, self.script = self.script, None
        if script is not None and script.shared is not None and not script.shared.done():
            script.shared.set_result(False)
        if script is not None:
            log.info("node %d: %s after %d steps", self.node, why, script.next_step)
            self.last = script
        self._attached.clear()
        self._changed.set()

    last: Script | None = None  # the script that detached last (its metrics for the job's stats)

    async def attached(self) -> Script:
        """The script, once one is attached."""
        while self.script is None:
            await self._attached.wait()
        return self.script

    def _on_message(self, script: Script, msg: dict[str, Any]) -> bool:
        t = msg["t"]
        if t == "step":
            if script.step is not None:
                raise wire.HandoffError(f"step {msg.get('k')!r} announced while step {script.step} is not done")
            script.step, sealed = wire.check_step(msg, script.next_step)
            script.presealed[script.step % 2] = script.step if sealed else -1
            script.next_step += 1
            script.slowest = max(script.slowest, time.monotonic() - script.t_done)
            self._changed.set()
        elif t == "log":
            script.metrics.append({"t": self.now(), **wire.check_log(msg)})
            if len(script.metrics) > 100_000:
                del script.metrics[0]
        elif t == "bye":
            script.bye = True
            return False
        elif t == "shared":
            if script.shared is not None and not script.shared.done():
                script.shared.set_result(bool(msg.get("ok")))
        else:
            raise wire.HandoffError(f"unknown message {t!r:.40}")
        return True

    # --- the round loop's side ---------------------------------------------------------------------------------
    async def contribution(self, rnd: int) -> np.ndarray | None:
        """Round rnd's contribution: step k = rnd - offset, send slot k % 2 with its trailer (None: the
        script went away, or stopped calling step(), first). Asked again for the same step (an aborted
        attempt, a redone round), it is the same values."""
        script, k = self.script, rnd - self.offset
        t_ask = time.monotonic()
        while script is not None and k >= script.next_step:
            self._changed.clear()
            idle = time.monotonic() - max(script.t_done, t_ask)  # a round waits for this script
            limit = self.stall_limit(script)
            try:
                await asyncio.wait_for(self._changed.wait(), max(0.0, limit - idle))
            except TimeoutError:
                if k >= script.next_step and self.script is script:
                    self._hung(script, limit)
                    return None
            if self.script is not script:
                return None
        if script is None:
            return None
        done = script.sealed.get(k % 2)
        if done is not None and done[0] == k:
            return done[1]
        view = self._sealed(script, script.regions[k % 2], k, own=script.presealed.get(k % 2) == k)
        script.sealed[k % 2] = (k, view)
        return view

    def _sealed(self, script: Script, region: np.ndarray, k: int, own: bool = False) -> np.ndarray:
        """The slot with its trailer: the sketch and L1 of the values (computed here, or as the script
        wrote them: `own`), then this rank's flag if they were not finite (sent as zeros then). A
        trailer the script got wrong fails the sum's check at every receiver: loud, never wrong."""
        t = time.perf_counter()
        P, n = script.params, script.values
        x = region[:P]
        flags = region[P + sketch.ROWS + 1:n]
        flags[:] = 0
        trailer = (region[P:P + sketch.ROWS + 1].astype(np.float64) if own
                   else sketch.trailer(x, wire.SKETCH_SEED))
        if not np.isfinite(trailer).all():  # the fold of non-finite values is not finite
            script.nonfinite += 1
            log.error("node %d: step %d of the script holds non-finite values; it sends zeros and the sync fails",
                      self.node, k)
            x[:] = 0
            flags[self.node] = 1
            trailer[:] = 0
        region[P:P + sketch.ROWS + 1] = trailer
        script.seal_s += time.perf_counter() - t
        return region[:n]

    def stall_limit(self, script: Script) -> float:
        """How long a round waits for this script's next step before it counts as hung."""
        return max(self.stall_s, STALL_FACTOR * script.slowest)

    def _hung(self, script: Script, limit: float) -> None:
        """The script stopped calling step(): tell it (a late step() raises SyncError naming this), close
        its channel and report it."""
        why = (f"rank {self.node}'s script (pid {script.pid}) stopped calling step(): no step {script.next_step} "
               f"for {limit:.0f} s")
        log.error("node %d: %s", self.node, why)
        script.gone = why
        self._spawn(self._last_word(script.conn, f"dropped from the job: {why}"))
        self._detach("the script hung")
        self._gone(script, why)

    def drop(self, why: str) -> None:
        """Let go of the attached script (this agent was declared lost: the job went on without its
        steps): a late step() raises SyncError naming `why`; a script started again rejoins."""
        script = self.script
        if script is not None:
            script.gone = why
            self._spawn(self._last_word(script.conn, f"dropped from the job: {why}"))
            self._detach("the script was dropped")

    async def _last_word(self, conn: socket.socket, error: str) -> None:
        """An `error` frame, then the channel closes (the script reads the frame at its next step)."""
        await self._send(conn, {"t": "error", "error": error}, quiet=True)
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _gone(self, script: Script, why: str, ended: bool = False, quiet: bool = False) -> None:
        if not (ended or quiet):
            log.warning("node %d: %s; this node leaves the job until a script attaches again", self.node, why)
        if self.on_gone is not None:
            self.on_gone(why, ended)

    async def share(self, rnd: int) -> np.ndarray | None:
        """The script's current model (parameters and floating buffers, as it would broadcast them) as
        round rnd's contribution, with its trailer: this node is the source that hands the model to a
        rank that rejoined. None if the script cannot say (gone, or a data plane without a model)."""
        script = self.script
        if script is None:
            return None
        script.shared = asyncio.get_running_loop().create_future()
        await self._send(script.conn, {"t": "share"}, quiet=True)
        try:
            ok = await asyncio.wait_for(asyncio.shield(script.shared), SHARE_TIMEOUT_S)
        except TimeoutError:
            ok = False
        if not ok or self.script is not script:  # zeros with this rank's flag: the sync fails, named
            log.error("node %d: the script could not share its model for round %d", self.node, rnd)
            if self.script is not script:
                return None
            view = self._sealed(script, np.zeros(script.slot, np.float32), rnd - self.offset)
            view[script.params + sketch.ROWS + 1 + self.node] = 1
            return view
        model = np.empty(script.slot, np.float32)
        model[:script.params] = script.regions[2][:script.params]
        return self._sealed(script, model, rnd - self.offset)

    def result_region(self) -> np.ndarray | None:
        """Where a round's sum may land as it is received, so `deliver` copies nothing: the result region.
        Only for jobs whose rounds all wait for every rank (the caller's rule): the script reads the
        region between `done k` and its next step, and no round is summed here before that step."""
        script = self.script
        return None if script is None else script.regions[2][:script.values]

    def check(self, result: np.ndarray, members: int) -> tuple[bool, str]:
        """The receivers' check of a sum (the job's verifier): the sketch within the rounding bound."""
        script = self.script or self.last
        if script is None:
            return False, "no script attached"
        if result.shape != (script.values,):
            return False, f"result has {result.size} values, the attached model {script.values}"
        return sketch.check(result, script.params, members, wire.SKETCH_SEED)

    def deliver(self, rnd: int, result: np.ndarray | None, weight: float, members: list[int], error: str = "",
                weights: list[float] | None = None) -> None:
        """Round rnd's outcome to the script (its step k = rnd - offset): the sum into the result region,
        then `done k`. A rank that sent zeros for non-finite values fails the sync for everyone, named."""
        script, k = self.script, rnd - self.offset
        if script is None or k <= script.delivered:
            return  # gone, or a redone round the script already has
        ok = result is not None and not error
        if result is not None and ok:
            P = script.params
            bad = np.flatnonzero(result[P + sketch.ROWS + 1:script.values])
            if bad.size:
                ok, error = False, (f"rank(s) {', '.join(map(str, bad.tolist()))} contributed non-finite values "
                                    f"(or had no model to share) at step {k}; the sync is void")
            elif not np.may_share_memory(result, script.regions[2]):  # else it was received in place
                t = time.perf_counter()
                script.regions[2][:P] = result[:P]
                script.deliver_s += time.perf_counter() - t
        script.delivered, script.step = k, None
        script.t_done = time.monotonic()
        msg = {"t": "done", "k": k, "ok": ok, "weight": float(weight), "members": list(members),
               "error": error or None}
        if weights is not None:  # per member, in `members`' order (the script's Reduced.weights)
            msg["weights"] = [float(w) for w in weights]
        self._spawn(self._send(script.conn, msg, quiet=True))

    def stats(self) -> dict[str, Any]:
        script = self.script or self.last
        if script is None:
            return {"workload": "handoff", "steps": 0}
        return {"workload": "handoff", "steps": script.next_step, "params": script.params,
                "metrics": script.metrics, "t_attach": script.t_attach, "nonfinite": script.nonfinite,
                "seal_s": script.seal_s, "deliver_s": script.deliver_s,
                "refused_connections": self.refused}
