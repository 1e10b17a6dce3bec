"""An agent process loads neither the scheduler nor the simulator, however it is started: two real
`wansync agent` processes (through `wansync.cli`, as every launcher starts them) register, run a round
of ring, and report every module they imported (`python -X importtime` writes each one, lazy imports
inside functions included, to stderr)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from overlay.auth import SECRET_ENV, generate_secret
from scheduler.service import Scheduler
from wansync.backend import agent_command
from wansync.cluster import agent_options_file
from wansync.options import Options
from wansync.runspec import resolve

pytestmark = pytest.mark.loopback

FORBIDDEN = ("scheduler", "sim")


def imported(stderr: str) -> set[str]:
    """Module names from -X importtime's lines (`import time: self | cumulative | name`)."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2} - {"imported package"}


async def test_a_running_agent_never_loads_the_scheduler_or_the_simulator(tmp_path):
    secret = generate_secret()
    cfg = resolve(Options.make(topology="uniform:50", nodes=2, scale=0.01, rounds=1, no_http=True))
    sched = Scheduler("imports", 2, secret=secret.encode())
    port = await sched.start()
    path = agent_options_file(cfg, "imports")
    procs = []
    for n in range(2):
        cmd = agent_command(path, n, f"127.0.0.1:{port}")
        procs.append(subprocess.Popen([cmd[0], "-X", "importtime", *cmd[1:]], stdin=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True, env={**os.environ, SECRET_ENV: secret}))
    try:
        await sched.wait_agents(180)
        js = await asyncio.wait_for(sched.run_job("ring", rounds=1, params=20_000, chunk_params=5_000), 120)
        assert js.records and all(r.ok for r in js.records)
    finally:
        await sched.shutdown()  # the agents leave when their scheduler goes
    for p in procs:
        _, err = p.communicate(timeout=60)
        mods = imported(err)
        assert "agents.agent" in mods and "agents.engine" in mods, sorted(mods)[:20]  # the parse works
        bad = sorted(m for m in mods if m.split(".")[0] in FORBIDDEN)
        assert not bad, f"an agent process loaded {bad}"
    assert sys.modules.get("scheduler.service") is not None  # (this test process is the scheduler)
