"""The hand-off channel end to end: real training-script processes attach to real agents over Unix
sockets, their steps become the job's contributions, and each script gets back the sum, checked here
against a float64 reference this test computes (max_i |r_i - ref_i| / sum_j |x_ji| <= (m + 1) 2^-24)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from helpers.cluster import Cluster
from helpers.exact import assert_float_sum
from helpers.waiting import until

from core.sketch import trailer_len
from emulation.topology import uniform
from overlay.handoff import CHANNEL_ENV, TOKEN_ENV

pytestmark = [pytest.mark.loopback, pytest.mark.torch, pytest.mark.timeout(180)]
torch = pytest.importorskip("torch")

TOKEN = "test-run-token"
P = 50_000  # values: more than one chunk per link
STEPS = 3

SCRIPT = r"""
import json, os, sys
import numpy as np
from wansync.torch.channel import Channel
from wansync.torch.sync import SyncError
rank, steps, P, out = int(os.environ["RANK"]), int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
layout = {"names": ["w", "b"], "shapes": [[P - 10], [int(sys.argv[4])]], "dtypes": ["float32", "float32"]}
try:
    ch = Channel.from_env(layout)
except SyncError as exc:
    print(json.dumps({"refused": str(exc)}), flush=True)
    sys.exit(3)
results = []
for k in range(steps):
    x = np.random.default_rng([rank, k]).standard_normal(P).astype(np.float32) * (rank + 1)
    if os.environ.get("NAN_AT") == f"{rank}:{k}":
        x[5] = np.nan
    ch.buffer().numpy()[:] = x
    if os.environ.get("SEAL"):  # the trailer folded here, as wt.Optimizer's grad mode folds it while copying
        fold = ch.folder()
        if os.environ["SEAL"] == "half":  # a writer that folded only part of what it wrote: no seal, then
            fold.add(ch.buffer().numpy()[:P // 2], 0)
        else:
            fold.add(x + np.float32(1.0) if os.environ.get("LIE_AT") == f"{rank}:{k}" else ch.buffer().numpy(), 0)
    try:
        red = ch.allreduce()
    except SyncError as exc:
        print(json.dumps({"error": str(exc), "k": k}), flush=True)
        continue
    results.append(red.result.numpy().copy())
    ch.log(step=k, loss=float(k))
ch.close()
np.save(out, np.stack(results) if results else np.zeros((0, P), np.float32))
print(json.dumps({"done": len(results), "weight": red.weight if results else None}), flush=True)
"""


def contribution(rank: int, k: int) -> np.ndarray:
    return np.random.default_rng([rank, k]).standard_normal(P).astype(np.float32) * (rank + 1)


def start_scripts(nodes: int, d: Path, tmp: Path, env_extra: dict[str, str] | None = None,
                  steps: int = STEPS, bias: dict[int, int] | None = None) -> list[subprocess.Popen]:
    """One script per rank; `bias`: rank -> a bias length other than 10 (a model that differs)."""
    procs = []
    for r in range(nodes):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(nodes), LOCAL_RANK=str(r),
                   **{CHANNEL_ENV: str(d / f"node-{r}.sock"), TOKEN_ENV: TOKEN}, **(env_extra or {}))
        procs.append(subprocess.Popen([sys.executable, "-c", SCRIPT, str(steps), str(P), str(tmp / f"r{r}.npy"),
                                       str((bias or {}).get(r, 10))], env=env, stdout=subprocess.PIPE, text=True))
    return procs


async def wait_exit(procs: list[subprocess.Popen], timeout: float = 90) -> list[list[dict]]:
    """Every script's JSON lines, once all exited."""
    await until(lambda: all(p.poll() is not None for p in procs), "scripts to exit", timeout)
    return [[json.loads(line) for line in p.stdout.read().strip().splitlines()] for p in procs]


async def ring_job(name: str, nodes: int, d: Path, tmp: Path, env_extra: dict[str, str]) -> list[list[dict]]:
    """One script per rank (with `env_extra`) through a ring job until they exit; their JSON lines."""
    async with Cluster(name, uniform(nodes, 200.0, 0.0), handoff=(str(d), TOKEN)) as c:
        procs = start_scripts(nodes, d, tmp, env_extra)
        await c.sched.attached(60)
        job = asyncio.create_task(c.sched.run_job("ring", rounds=1_000_000, params=P + trailer_len(nodes),
                                                  chunk_params=8192, workload="handoff"))
        outs = await wait_exit(procs)
        await c.sched.close_job(c.sched.current, timeout=30)
        await job
    return outs


@pytest.fixture
def private_dir():
    with tempfile.TemporaryDirectory(prefix="wansync-handoff-") as d:
        os.chmod(d, 0o700)
        yield Path(d)


@pytest.mark.parametrize(("scheme", "seal"), [("ring", "1"), ("star", "half")])
async def test_scripts_get_the_sum_of_every_rank(private_dir, tmp_path, scheme, seal):
    """Scripts that fold the check trailer themselves (sealed) and scripts whose fold missed values (the
    channel then does not seal, and the agent folds); in both, the sum is received straight into the
    scripts' result region (a BSP job: no copy back)."""
    nodes = 3
    async with Cluster("h1", uniform(nodes, 200.0, 0.0), handoff=(str(private_dir), TOKEN)) as c:
        procs = start_scripts(nodes, private_dir, tmp_path, {"SEAL": seal})
        layout = await c.sched.attached(60)
        assert layout["params"] == P
        job = asyncio.create_task(c.sched.run_job(scheme, rounds=1_000_000, params=P + trailer_len(nodes),
                                                  chunk_params=8192, workload="handoff"))
        outs = await wait_exit(procs)
        js = await c.sched.close_job(c.sched.current, timeout=30)
        await job
    assert all(o[-1].get("done") == STEPS and o[-1]["weight"] == nodes for o in outs), outs
    for k in range(STEPS):
        for r in range(nodes):
            assert_float_sum(np.load(tmp_path / f"r{r}.npy")[k], [contribution(q, k) for q in range(nodes)])
    assert len(js.records) == STEPS and not any(rec.aborted for rec in js.records)
    metrics = [st["training"]["metrics"] for st in js.stats.values()]
    assert all([m["step"] for m in ms if "step" in m] == list(map(float, range(STEPS))) for ms in metrics)
    assert all(ms[-1]["steps"] == STEPS and 0 <= ms[-1]["sync_s"] <= ms[-1]["wall_s"] for ms in metrics)
    assert all(st["training"]["deliver_s"] == 0.0 for st in js.stats.values())  # received in place


async def test_a_trailer_a_script_got_wrong_fails_that_sync_and_no_other(private_dir, tmp_path):
    """The agent takes a sealed step's trailer as the script wrote it; one that does not match the values
    (folded from other values) fails that sync at every rank through the receivers' check, never a wrong
    sum; the other steps sum right."""
    nodes = 3
    outs = await ring_job("h4", nodes, private_dir, tmp_path, {"SEAL": "1", "LIE_AT": "2:1"})
    for r, o in enumerate(outs):
        assert o[-1]["done"] == STEPS - 1, o
        assert [e["k"] for e in o if "error" in e] == [1] and "sketch" in o[0]["error"], o
        got = np.load(tmp_path / f"r{r}.npy")
        for i, k in enumerate((0, 2)):
            assert_float_sum(got[i], [contribution(q, k) for q in range(nodes)])


async def test_a_rank_with_another_model_is_refused_by_name(private_dir, tmp_path):
    nodes = 3
    async with Cluster("h2", uniform(nodes, 200.0, 0.0), handoff=(str(private_dir), TOKEN)) as c:
        procs = start_scripts(nodes, private_dir, tmp_path, steps=1, bias={2: 12})
        with pytest.raises(Exception, match="rank 2") as err:
            await c.sched.attached(60)
        outs = await wait_exit(procs)
    assert "shape [12]" in str(err.value) and "[10]" in str(err.value)
    assert all("rank 2" in o[-1]["refused"] for o in outs), outs


async def test_a_non_finite_contribution_fails_that_sync_naming_the_rank(private_dir, tmp_path):
    nodes = 3
    outs = await ring_job("h3", nodes, private_dir, tmp_path, {"NAN_AT": "1:1"})
    for r, o in enumerate(outs):  # steps 0 and 2 synced; step 1 failed everywhere, naming rank 1
        assert o[-1]["done"] == STEPS - 1
        assert [e["k"] for e in o if "error" in e] == [1] and "rank(s) 1 " in o[0]["error"], o
        got = np.load(tmp_path / f"r{r}.npy")
        assert np.isfinite(got).all()
