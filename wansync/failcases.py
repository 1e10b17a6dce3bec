"""The four failure cases of training through wansync, run for real (docs/training-failures.md): a
scheduler, one `wansync agent` process per node, one trainer process per rank over the hand-off
channel, a BSP job whose rounds are the trainers' steps, and one fault:

- `trainer_killed`: rank VICTIM's trainer SIGKILLs itself before step KILL_AT;
- `trainer_hung`: it stops calling step() before step KILL_AT (blocks until told), then steps late
  (its agent's --script-stall: `stall_s`, 8 s, above the barrier's 5 s floor for a silent member);
- `agent_killed`: rank VICTIM's agent is SIGKILLed after its trainer's step KILL_AT - 1;
- `trainer_restarted`: as `trainer_killed`, then a new incarnation of that trainer starts and rejoins.

The trainer (TRAINER) contributes integer-valued float32 vectors that name themselves: per rank r a
count (1), its step + 1 and its incarnation + 1 at slots r, W + r, 2W + r, then (r + 1) x a fixed
pattern. So any sum says exactly who is in it, from which step and incarnation, and whether
anyone is in twice; `judge` recomputes every sum the trainers printed from the members they were
told. Its "model" (a torch parameter of P values, as wt.Optimizer holds one) is the last result; its
first sync is wt.Optimizer's attach-time broadcast (wansync.torch.replica.broadcast): rank 0's
model, or for a restarted trainer the current model of a rank that stayed.

`run_case` returns what happened (every trainer's lines, the scheduler's timeline); `judge` says
whether it ended as specified; `run_all` runs the four (scripts/bench/train_failures.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.sketch import trailer_len
from overlay.auth import SECRET_ENV
from overlay.handoff import CHANNEL_ENV, TOKEN_ENV
from scheduler.service import Scheduler

from .backend import agent_command
from .cluster import agent_options_file
from .options import Options
from .procs import reap
from .runspec import resolve

CASES = ("trainer_killed", "trainer_hung", "agent_killed", "trainer_restarted")
EXTRA = ("agent_frozen",)  # tests only: the victim's agent frozen (SIGSTOP) until declared lost, then thawed
NODES, VICTIM, KILL_AT = 3, 2, 3
STEPS = 8  # the survivors' steps (trainer_restarted: until the newcomer was in BACK_ROUNDS of them)
BACK_ROUNDS = 4
P = 20_000  # values per contribution (a few chunks)
PATTERN_MOD = 7

TRAINER = r"""
import json, os, signal, sys, time
import numpy as np
import torch
from wansync.torch.channel import Channel
from wansync.torch.layout import Tensors
from wansync.torch.replica import broadcast
from wansync.torch.sync import SyncError
rank, world, inc = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["INCARNATION"])
P, steps, act = int(os.environ["VALUES"]), int(os.environ["STEPS"]), os.environ.get("ACT", "")
until_back = int(os.environ.get("UNTIL_BACK", "0"))
pattern = (np.arange(P - 3 * world) % 7 + 1).astype(np.float32)
def say(**kw):
    print(json.dumps(kw), flush=True)
net = torch.nn.Linear(P, 1, bias=False)  # the "model": the last result (P values), as wt.Optimizer holds one
with torch.no_grad():
    net.weight.fill_(5.0 if rank == 0 else float(rank + 100))  # only rank 0's may survive the broadcast
tensors = Tensors.of(net)
ch = Channel.from_env(tensors.layout)  # P values and the skip flag
broadcast(ch, tensors)  # what wt.Optimizer does at construction: rank 0's model, or the current one on a rejoin
model = net.weight.detach().numpy().ravel()  # a view: params_from below writes it
say(k=0, kind="bcast", digest=float(model.sum(dtype=np.float64)), inc=inc, rejoined=ch.rejoined)
back, after, gone, victim = 0, 0, False, int(os.environ["VICTIM"])
for k in range(1, steps + 1):
    if act == f"kill:{k}":
        os.kill(os.getpid(), signal.SIGKILL)
    if act == f"hang:{k}":
        say(k=k, hanging=True)
        sys.stdin.readline()  # stops calling step() until the runner says go on
    x = ch.buffer().numpy()  # P values, then the flag (0)
    x[:] = 0
    x[rank], x[world + rank], x[2 * world + rank] = 1, k + 1, inc + 1
    x[3 * world:P] = (rank + 1) * pattern
    try:
        red = ch.allreduce()
    except SyncError as exc:
        say(k=k, error=str(exc))
        sys.exit(4)
    tensors.params_from(red.result)
    r = red.result.numpy()[:P]
    say(k=k, members=list(red.members), weight=red.weight, counts=r[:world].tolist(),
        steps=r[world:2 * world].tolist(), incs=r[2 * world:3 * world].tolist(),
        bulk=r[3 * world:3 * world + 8].tolist(),
        bulk_sum=float(r[3 * world:].sum(dtype=np.float64)), digest=float(model.sum(dtype=np.float64)), inc=inc)
    if until_back:  # the rounds the victim is back in, after it was gone; then two more steps
        gone = gone or victim not in red.members
        back += gone and victim in red.members
        after += back >= until_back
        if after > 2:
            break
    time.sleep(float(os.environ.get("PACE_S", "0")))  # its compute: the rest of a training step
ch.close()
say(done=True)
"""


@dataclass
class CaseRun:
    case: str
    lines: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # "r<rank>.<incarnation>" -> lines
    timeline: list[dict[str, Any]] = field(default_factory=list)
    aborts: list[dict[str, Any]] = field(default_factory=list)
    lost: dict[int, Any] = field(default_factory=dict)
    error: str = ""  # the run itself failed (a deadline passed): the case did not end as specified
    seconds: float = 0.0


def pattern() -> np.ndarray:
    return (np.arange(P - 3 * NODES) % PATTERN_MOD + 1).astype(np.float64)


class _Run:
    """One case's processes: the scheduler here, agent and trainer processes, files in `work`."""

    def __init__(self, case: str, work: Path, stall_s: float) -> None:
        self.case, self.work = case, work
        self.chan = work / "chan"
        self.chan.mkdir(mode=0o700)
        self.token = secrets.token_urlsafe(16)
        self.secret = secrets.token_hex(16)
        opts = Options.make(topology="uniform:200", nodes=NODES, rounds=1, handoff_dir=str(self.chan),
                            script_stall_s=stall_s)
        self.cfg = resolve(opts)
        self.cluster = f"fail-{case}"
        self.sched = Scheduler(self.cluster, NODES, secret=self.secret.encode(), heartbeat_timeout=5.0)
        self.agents: dict[int, subprocess.Popen] = {}
        self.trainers: dict[str, subprocess.Popen] = {}

    async def start(self) -> None:
        port = await self.sched.start()
        options = agent_options_file(self.cfg, self.cluster)
        env = {**os.environ, SECRET_ENV: self.secret, TOKEN_ENV: self.token}
        for n in range(NODES):
            with open(self.work / f"agent-{n}.log", "ab") as err:
                self.agents[n] = subprocess.Popen(agent_command(options, n, f"127.0.0.1:{port}"), env=env,
                                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        await self.sched.wait_agents(60)

    def trainer(self, rank: int, inc: int, **env: Any) -> None:
        name = f"r{rank}.{inc}"
        e = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(NODES), "LOCAL_RANK": str(rank),
             "INCARNATION": str(inc), "VALUES": str(P), "STEPS": str(STEPS), "VICTIM": str(VICTIM),
             CHANNEL_ENV: str(self.chan / f"node-{rank}.sock"), TOKEN_ENV: self.token,
             **{k: str(v) for k, v in env.items()}}
        e.pop(SECRET_ENV, None)
        with open(self.work / f"{name}.jsonl", "wb") as out, open(self.work / f"{name}.err", "wb") as err:
            self.trainers[name] = subprocess.Popen([sys.executable, "-c", TRAINER], env=e, stdin=subprocess.PIPE,
                                                   stdout=out, stderr=err)

    def lines(self, name: str) -> list[dict[str, Any]]:
        path = self.work / f"{name}.jsonl"
        out = []
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a line still being written
        return out

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.sched.timeline if e["kind"] == kind]

    async def until(self, cond: Any, what: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise TimeoutError(f"waited {timeout:.0f} s for {what}")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        reap(list(self.trainers.values()), grace_s=1.0)
        await self.sched.shutdown()
        reap(list(self.agents.values()), grace_s=2.0)


async def run_case(case: str, work: Path | None = None, *, deadline_s: float = 150.0,
                   stall_s: float = 8.0) -> CaseRun:
    """Run one failure case end to end (every wait has `deadline_s`); what happened, for `judge`."""
    if case not in CASES + EXTRA:
        raise ValueError(f"case {case!r}: one of {', '.join(CASES + EXTRA)}")
    own = work is None
    work = Path(tempfile.mkdtemp(prefix=f"wansync-{case}-")) if work is None else work
    run = _Run(case, work, stall_s if case == "trainer_hung" else 120.0)
    out = CaseRun(case)
    t0 = time.monotonic()
    try:
        await run.start()
        survivors = {"UNTIL_BACK": BACK_ROUNDS, "STEPS": 100_000, "PACE_S": 0.02} if case == "trainer_restarted" else {}
        act = {"trainer_killed": f"kill:{KILL_AT}", "trainer_hung": f"hang:{KILL_AT}",
               "trainer_restarted": f"kill:{KILL_AT}"}.get(case, "")
        for r in range(NODES):
            run.trainer(r, 0, **({"ACT": act, **survivors} if r == VICTIM else survivors))
        layout = await asyncio.wait_for(run.sched.attached(deadline_s), deadline_s)
        values = layout["params"] + trailer_len(NODES)  # the model, the skip flag and the check trailer
        job = asyncio.ensure_future(run.sched.run_job("ring", rounds=1 << 40, params=values, chunk_params=8192,
                                                      workload="handoff"))
        victim = f"r{VICTIM}.0"
        if case == "trainer_hung":
            await run.until(lambda: run.events("script_left"), "the hung trainer's agent to report it", deadline_s)
            stdin = run.trainers[victim].stdin
            assert stdin is not None
            stdin.write(b"go on\n")
            stdin.flush()
        elif case == "agent_killed":
            await run.until(lambda: any(line.get("k") == KILL_AT - 1 for line in run.lines(victim)),
                            f"rank {VICTIM}'s step {KILL_AT - 1}", deadline_s)
            run.agents[VICTIM].send_signal(signal.SIGKILL)
        elif case == "agent_frozen":
            await run.until(lambda: any(line.get("k") == KILL_AT - 1 for line in run.lines(victim)),
                            f"rank {VICTIM}'s step {KILL_AT - 1}", deadline_s)
            run.agents[VICTIM].send_signal(signal.SIGSTOP)
            await run.until(lambda: VICTIM in run.sched.lost, f"node {VICTIM} to be declared lost", deadline_s)
            run.agents[VICTIM].send_signal(signal.SIGCONT)
        elif case == "trainer_restarted":
            await run.until(lambda: run.events("script_left"), "the killed trainer's agent to report it", deadline_s)
            await run.until(lambda: any(line.get("k", 0) >= KILL_AT + 2 for line in run.lines("r0.0")),
                            "the survivors to go on without it", deadline_s)
            run.trainer(VICTIM, 1, STEPS=BACK_ROUNDS)
        await run.until(lambda: all(p.poll() is not None for p in run.trainers.values()), "every trainer to end",
                        deadline_s)
        js = run.sched.current
        if js is not None and not js.finished.is_set():
            await run.sched.close_job(js, timeout=30)
        await asyncio.wait_for(job, 30)
    except (TimeoutError, RuntimeError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        out.seconds = time.monotonic() - t0
        out.lines = {name: run.lines(name) for name in run.trainers}
        out.timeline = list(run.sched.timeline)
        js = run.sched.current
        out.aborts = list(js.aborts) if js is not None else []
        out.lost = dict(run.sched.lost)
        await run.close()
        if own:
            shutil.rmtree(work, ignore_errors=True)
    return out


def check_sum(line: dict[str, Any], incarnation: dict[int, int]) -> str:
    """'' if a step's sum is exactly the members' contributions (each once, from this step and the
    member's current incarnation), else what is wrong."""
    members = sorted(line["members"])
    want_counts = [1.0 if r in members else 0.0 for r in range(NODES)]
    if line["counts"] != want_counts:
        return f"step {line['k']}: contributions per rank {line['counts']}, members {members} (doubled or missing)"
    for r in members:
        if line["incs"][r] != incarnation.get(r, 0) + 1:
            return f"step {line['k']}: rank {r}'s contribution from incarnation {line['incs'][r] - 1} (stale)"
    bulk = sum(r + 1 for r in members) * pattern()
    if line["bulk"] != bulk[:8].tolist() or line["bulk_sum"] != float(bulk.sum()):
        return f"step {line['k']}: the values are not the members' sum"
    if line["weight"] != len(members):
        return f"step {line['k']}: weight {line['weight']} for {len(members)} members"
    return ""


def judge(run: CaseRun) -> tuple[bool, str]:
    """Did the case end as specified? (ok, why not)"""
    if run.error:
        return False, run.error
    victim = f"r{VICTIM}.0"
    survivors = [f"r{r}.0" for r in range(NODES) if r != VICTIM]
    for name in survivors:
        lines = run.lines[name]
        if not lines or not lines[-1].get("done"):
            return False, f"{name} did not end its steps: {lines[-1:]}"
        if any("error" in line for line in lines):
            return False, f"{name} got an error: {[x for x in lines if 'error' in x]}"
        inc = {VICTIM: 1} if run.case == "trainer_restarted" else {}
        for line in lines:
            if "counts" in line and (why := check_sum(line, inc if VICTIM in line["members"] and line["k"] > KILL_AT
                                                      else {})):
                return False, f"{name}: {why}"
        steps = [x for x in lines if "counts" in x]
        if not any(VICTIM not in x["members"] for x in steps):
            return False, f"{name} never went on without rank {VICTIM}"
    mine = run.lines[victim]
    if run.case in ("trainer_killed", "trainer_restarted"):
        if [x.get("k") for x in mine if "counts" in x][-1:] != [KILL_AT - 1]:
            return False, f"the killed trainer's last step: {mine[-1:]}"
    if run.case == "trainer_hung":
        if not (mine and "stopped calling step()" in mine[-1].get("error", "")):
            return False, f"the hung trainer's late step() did not raise SyncError naming why: {mine[-1:]}"
    if run.case == "agent_killed":
        if not (mine and "agent" in mine[-1].get("error", "")):
            return False, f"the trainer of the killed agent got no SyncError naming it: {mine[-1:]}"
    if run.case == "trainer_restarted":
        return _judge_rejoin(run)
    return True, ""


def _judge_rejoin(run: CaseRun) -> tuple[bool, str]:
    """The new incarnation got the current model first, then took part in exact sums."""
    new = run.lines.get(f"r{VICTIM}.1", [])
    if not new or not new[-1].get("done") or new[0].get("kind") != "bcast" or not new[0].get("rejoined"):
        return False, f"the restarted trainer did not rejoin and end: {new[:1]} ... {new[-1:]}"
    for line in new[1:]:
        if "counts" in line and (why := check_sum(line, {VICTIM: 1})):
            return False, f"restarted trainer: {why}"
    steps = [x for x in run.lines["r0.0"] if "counts" in x]
    first = next((i for i, x in enumerate(steps) if VICTIM in x["members"] and x["k"] > KILL_AT), None)
    if first is None or first == 0:
        return False, "the survivors never summed with the restarted trainer"
    if new[0]["digest"] != steps[first - 1]["digest"]:
        return False, (f"the restarted trainer's first model (digest {new[0]['digest']}) is not the survivors' "
                       f"current one ({steps[first - 1]['digest']}, after their step {steps[first - 1]['k']})")
    return True, ""


async def run_all(cases: tuple[str, ...] = CASES, deadline_s: float = 150.0) -> list[tuple[str, bool, str, float]]:
    """Every case in turn: (case, ended as specified, why not, seconds)."""
    out = []
    for case in cases:
        run = await run_case(case, deadline_s=deadline_s)
        ok, why = judge(run)
        out.append((case, ok, why, run.seconds))
    return out
