"""The script's end of the hand-off channel (overlay.handoff): `Sync` over this rank's wansync agent.

`wansync train` starts the script beside its agent with the socket's path in WANSYNC_CHANNEL and the
run's token in WANSYNC_HANDOFF_TOKEN (and RANK, WORLD_SIZE, LOCAL_RANK as torchrun does). Attaching
sends the model's layout and blocks until every rank attached and the scheduler found their models
alike (else `SyncError` naming the rank that differs); then the agent hands over the shared memory.
A step writes the flat values into send slot k % 2 (`buffer()`), says `step k`, and blocks until
`done k`: the sum is in the result region, which `allreduce` returns as a tensor view (no copy). A
writer that folded every value as it wrote it (`folder()`, wt.Optimizer's grad mode) has the check
trailer written here and the step says `sealed`: the agent then takes it as is instead of reading
the whole slot again.

Failures (docs/training-failures.md): the agent going away, or dropping this script (it stopped
calling step() for too long), raises `SyncError` naming it at the next step, never a hang. While a
step waits, the agent may ask for this rank's model (`share`: a rank rejoined and this one is its
source); `provide` (set by wt.Optimizer) writes it into the result region, which is free then.
"""

from __future__ import annotations

import mmap
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import torch

from core import sketch
from overlay import handoff as wire

from .sync import Reduced, SyncError

# where the kernel has it (Linux, as memfd itself): the attach, not the first steps, pays for the pages
POPULATE = getattr(mmap, "MAP_POPULATE", 0)
ATTACH_TIMEOUT_S = 600.0  # every rank must attach: scripts start at different speeds (imports, data)


class Channel:
    """This rank's data plane: its agent, over a Unix socket and a shared memfd."""

    def __init__(self, path: str, token: str, rank: int, layout: dict[str, Any], *,
                 timeout: float = ATTACH_TIMEOUT_S) -> None:
        self.rank, self.path = rank, path
        # the fold's compiled loop loaded now, before the agent hears of us: the gap from `welcome` to the
        # first step is part of what the agent learns of this script's pace (agents/handoff.py STALL_FACTOR)
        sketch.warm()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except OSError as exc:
            raise SyncError(f"rank {rank}: cannot reach its wansync agent at {path}: {exc}") from None
        hello_layout = {"names": [str(n) for n in layout["names"]],
                        "shapes": [[int(d) for d in s] for s in layout["shapes"]],
                        "dtypes": [str(d).removeprefix("torch.") for d in layout["dtypes"]]}
        self.layout = hello_layout
        self._send({"t": "hello", "token": token, "rank": rank, "pid": os.getpid(), "layout": hello_layout})
        welcome, fds = self._recv(with_fd=True)
        if welcome["t"] == "refused":
            self.sock.close()
            raise SyncError(f"rank {rank}: the agent refused to attach: {welcome.get('error')}")
        if welcome["t"] != "welcome" or len(fds) != 1:
            raise SyncError(f"rank {rank}: unexpected reply from the agent: {welcome['t']!r}")
        self.params, self.world = int(welcome["params"]), int(welcome["world"])
        self.rejoined = bool(welcome.get("rejoin"))  # a script attached to this agent before: the job runs
        self.provide: Callable[[torch.Tensor], bool] | None = None  # writes this rank's model (share)
        slot = int(welcome["slot"])
        try:  # pages in place now (MAP_POPULATE): a region's first touch inside a step cost ~70 ms per 47 MB
            self.mem = mmap.mmap(fds[0], wire.SLOTS * slot * 4, flags=mmap.MAP_SHARED | POPULATE)
        finally:
            os.close(fds[0])
        whole = torch.frombuffer(self.mem, dtype=torch.float32)
        self.regions = [whole[i * slot:i * slot + self.params] for i in range(wire.SLOTS)]
        self.trailers = [whole[i * slot + self.params:i * slot + self.params + sketch.ROWS + 1].numpy()
                         for i in range(2)]
        self._fold = sketch.Folder(self.params)  # the step's trailer, folded as the optimizer writes the slot
        self._fold_step = -1  # the step `folder()` last handed it out for
        self.sock.settimeout(None)  # a sync waits as long as the slowest rank computes
        self.step = 0
        self.closed = False
        self.sync_s = 0.0  # time spent in allreduce (reported at close: the run's sync vs compute time)
        self.t_attached = time.perf_counter()

    @classmethod
    def from_env(cls, layout: Any) -> Channel:
        """The channel `wansync train` set up for this process; `layout`: a wansync.torch.layout.Layout
        (its flat vector: parameters, floating buffers, the skip flag) or {names, shapes, dtypes}."""
        if not isinstance(layout, dict):
            specs = [*layout.params, *layout.buffers]
            layout = {"names": [s.name for s in specs] + ["wansync.skip_flag"],
                      "shapes": [list(s.shape) for s in specs] + [[1]],
                      "dtypes": [s.dtype for s in specs] + ["float32"]}
        path = os.environ.get(wire.CHANNEL_ENV)
        if not path:
            raise SyncError(f"not started by `wansync train` (no {wire.CHANNEL_ENV}); set WANSYNC_BASELINE=gloo "
                            "for plain torch.distributed")
        token = os.environ.get(wire.TOKEN_ENV, "")
        return cls(path, token, int(os.environ.get("RANK", "0")), layout)

    # --- Sync -------------------------------------------------------------------------------------------------
    def buffer(self) -> torch.Tensor:
        return self.regions[self.step % 2]

    def folder(self) -> sketch.Folder:
        self._fold.reset()
        self._fold_step = self.step
        return self._fold

    def allreduce(self) -> Reduced:
        k = self.step
        t = time.perf_counter()
        sealed = self._fold_step == k and self._fold.complete
        if sealed:  # the trailer is folded already: the agent seals without a pass of its own
            self.trailers[k % 2][:] = self._fold.trailer(wire.SKETCH_SEED)
        self._fold_step = -1
        self._send({"t": "step", "k": k, "sealed": sealed})
        msg, _ = self._recv()
        while msg["t"] == "share":  # a rank rejoins and gets its model from this one
            ok = self.provide is not None and bool(self.provide(self.regions[2]))
            self._send({"t": "shared", "ok": ok})
            msg, _ = self._recv()
        self.sync_s += time.perf_counter() - t
        if msg["t"] == "error":
            raise SyncError(f"rank {self.rank}: {msg.get('error')}")
        if msg["t"] != "done" or msg.get("k") != k:
            raise SyncError(f"rank {self.rank}: expected done {k} from the agent, got {msg['t']!r} {msg.get('k')!r}")
        self.step += 1
        if not msg.get("ok"):
            raise SyncError(f"rank {self.rank}: sync {k} failed: {msg.get('error') or 'no reason given'}")
        return Reduced(self.regions[2], float(msg["weight"]), tuple(int(m) for m in msg["members"]),
                       tuple(float(w) for w in msg.get("weights") or ()))

    def log(self, **metrics: float) -> None:
        self._send({"t": "log", "metrics": {k: float(v) for k, v in metrics.items()}})

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.log(steps=self.step, sync_s=self.sync_s, wall_s=time.perf_counter() - self.t_attached)
            self._send({"t": "bye", "steps": self.step})
        except SyncError:
            pass
        self.sock.close()

    # --- frames -------------------------------------------------------------------------------------------------
    def _send(self, msg: dict[str, Any]) -> None:
        try:
            self.sock.sendall(wire.encode(msg))
        except OSError as exc:
            raise SyncError(self._last_word() or f"rank {self.rank}: its wansync agent is gone: the channel "
                            f"to it ({self.path}) failed ({exc}): the agent died, or the job ended") from None

    def _last_word(self) -> str:
        """The agent's `error` frame, if it left one before closing the channel (it dropped this script)."""
        try:
            self.sock.settimeout(0.0)
            msg, _ = self._recv()
        except (SyncError, BlockingIOError):
            return ""
        return f"rank {self.rank}: {msg.get('error')}" if msg.get("t") == "error" else ""

    def _recv(self, with_fd: bool = False) -> tuple[dict[str, Any], list[int]]:
        fds: list[int] = []
        buf = b""
        try:
            while len(buf) < wire.HEADER.size:
                want = wire.HEADER.size - len(buf)  # never past this frame: the next one is not ours yet
                if with_fd and not fds:
                    got, fds, _, _ = socket.recv_fds(self.sock, want, 1)
                else:
                    got = self.sock.recv(want)
                if not got:
                    raise SyncError(f"rank {self.rank}: its wansync agent closed the channel ({self.path}): "
                                    "the agent died, or the job ended")
                buf += got
            n = wire.frame_length(buf[:wire.HEADER.size])
            while len(buf) < wire.HEADER.size + n:
                got = self.sock.recv(wire.HEADER.size + n - len(buf))
                if not got:
                    raise SyncError(f"rank {self.rank}: the agent closed the channel in a message")
                buf += got
        except BlockingIOError:
            raise
        except OSError as exc:
            raise SyncError(f"rank {self.rank}: its wansync agent's channel failed ({exc}): the agent died, "
                            "or the job ended") from None
        return wire.decode(buf[wire.HEADER.size:]), fds

