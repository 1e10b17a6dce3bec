"""What the data plane costs per chunk, and whether the fidelity guard can call runs valid because of it.

Five parts, one table each, in one invocation:
- capacity: the capacity benchmark's cases unchanged (scripts/bench/capacity.py: CREW's full mesh at
  --scale 0.05, mst, netstorm and ring plus the all-links pattern, today's 200,000-byte chunks) at
  N = 16 on the application backend and N = 24 on the tc backend. A case is valid when the guard
  judged every job valid and every round exact. CPU seconds per GB: every process of the run (the
  agents' own CPU and the launcher's, scheduler included) per GB the links delivered.
- dense tc: a 6-node full mesh at 200-900 Mbit/s (hetero:200-900, --seed 3) on the tc backend,
  10 MB: packing, NetStorm and BLINK must all be valid; packing's median round against T_LP.
- microbenchmark: a chunk's handling per hop (capacity.dataplane: chains of 3 and 8 agents, 4 KB
  chunks on links too fast to matter).
- unshaped: 4 nodes, 100 MB, delay 0, links declared at 10 Gbit/s, application backend: wansync's
  ring against torch.distributed's Gloo all_reduce on the same machine, runs interleaved; and against
  the least-Python ring all-reduce (blocking sockets, a sender thread, numpy adds, no framing, no
  checks, no event loop): the floor of any Python data plane here (`python_floor_vs_gloo`).
The full run repeats the capacity cases three times (median and spread reported); --quick is the
check's run (one pass, <= 9 min). The last stdout line is one JSON object.

    python scripts/bench/dataplane.py [--quick] [--parts capacity,dense,micro,unshaped]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import recv_exact  # noqa: E402
from capacity import (  # noqa: E402
    ALL_LINKS,
    N_QUICK,
    SCHEMES,
    Case,
    JobResult,
    all_links_factor,
    capacity_cases,
    dataplane,
    fast_mesh,
    print_jobs,
    run_case,
)
from packing import t_lp  # noqa: E402

from emulation.tc import unavailable  # noqa: E402
from emulation.topology import build  # noqa: E402

ALL_LINKS_MBPS = 800.0  # the capacity benchmark's default total rate of the all-links pattern
DENSE = ("hetero:200-900", 6, 3)  # topology, nodes, seed
DENSE_SCHEMES = ["packing", "netstorm", "blink"]
DENSE_PARAMS = 2_500_000  # 10 MB of float32
UNSHAPED_NODES, UNSHAPED_MBPS, UNSHAPED_PARAMS = 4, 10_000.0, 25_000_000  # 100 MB


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]" if xs else "-"


# --- capacity and dense meshes ------------------------------------------------------------------------------
def capacity_pass(backend: str, n: int) -> list[JobResult]:
    x = all_links_factor(f"crew:{n}", ALL_LINKS_MBPS)
    out: list[JobResult] = []
    for case in capacity_cases(backend, n, x, SCHEMES):
        out += run_case(case, views=False)
    return out


def dense_tc() -> tuple[list[JobResult], float]:
    spec, nodes, seed = DENSE
    case = Case(f"dense {spec}", spec, "tc", DENSE_SCHEMES, scale=1.0, rounds=4, warmup=2, nodes=nodes,
                model=str(DENSE_PARAMS), run_options={"seed": seed})
    results = run_case(case, views=False)
    bound = t_lp(build(spec, nodes, seed=seed), DENSE_PARAMS)
    return results, bound


# --- wansync's ring against Gloo, unshaped ---------------------------------------------------------------------
def _gloo_rank(rank: int, world: int, port: int, params: int, rounds: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    t = torch.randn(params, generator=torch.Generator().manual_seed(rank))
    times = []
    for _ in range(rounds + 1):  # the first is a warm-up (connections, buffers)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    # a round ends when the slowest rank has its result: the largest of the ranks' times
    all_times = [None] * world
    dist.all_gather_object(all_times, times[1:])
    if rank == 0:
        out.send([max(ts) for ts in zip(*all_times, strict=True)])
    dist.destroy_process_group()


def gloo_rounds(world: int, params: int, rounds: int) -> list[float]:
    ctx = mp.get_context("spawn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rx, tx = ctx.Pipe(duplex=False)
    procs = [ctx.Process(target=_gloo_rank, args=(r, world, port, params, rounds, tx), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    got = rx.recv() if rx.poll(300) else []
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
    if not got:
        raise SystemExit("gloo all_reduce printed nothing within 300 s")
    return got


def _floor_rank(rank: int, world: int, ports: list[int], params: int, rounds: int, barrier: Any, out: Any) -> None:
    """The same ring all-reduce in the least Python can do: blocking sockets, a thread sending each
    step's segment while the main thread receives the previous node's (reduce-scatter adds it with
    numpy, all-gather receives it in place), no framing, no checks, no event loop, no shaping."""
    import threading

    import numpy as np

    srv = socket.create_server(("127.0.0.1", ports[rank]))
    barrier.wait()
    nxt = socket.create_connection(("127.0.0.1", ports[(rank + 1) % world]))
    prv, _ = srv.accept()
    bounds = [params * i // world for i in range(world + 1)]
    t = np.empty(params, np.float32)
    scratch = np.empty(max(b - a for a, b in zip(bounds, bounds[1:], strict=False)), np.float32)

    def seg(i: int) -> np.ndarray:
        return t[bounds[i]:bounds[i + 1]]

    def step(send: int, recv_into: np.ndarray) -> None:
        th = threading.Thread(target=nxt.sendall, args=(memoryview(seg(send)).cast("B"),))
        th.start()
        recv_exact(prv, memoryview(recv_into).cast("B"))
        th.join()

    times = []
    for _ in range(rounds + 1):  # the first is a warm-up, as Gloo's
        t.fill(rank + 1)
        barrier.wait()
        t0 = time.perf_counter()
        for s in range(world - 1):  # reduce-scatter
            r = (rank - s - 1) % world
            part = scratch[:bounds[r + 1] - bounds[r]]
            step((rank - s) % world, part)
            np.add(seg(r), part, out=seg(r))
        for s in range(world - 1):  # all-gather
            step((rank + 1 - s) % world, seg((rank - s) % world))
        times.append(time.perf_counter() - t0)
        if not np.all(t == world * (world + 1) / 2):  # its own exact sum: 1 + 2 + ... + world
            out.put((rank, None))
            return
    out.put((rank, times[1:]))


def floor_rounds(world: int, params: int, rounds: int) -> list[float] | None:
    """Round times of the least-Python ring all-reduce (_floor_rank): the slowest rank's per round;
    None if a rank's sum was wrong."""
    ctx = mp.get_context("spawn")
    ports = []
    for _ in range(world):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    q, barrier = ctx.Queue(), ctx.Barrier(world)
    procs = [ctx.Process(target=_floor_rank, args=(r, world, ports, params, rounds, barrier, q), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    got = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    if any(ts is None for _, ts in got):
        return None
    return [max(ts[i] for _, ts in got) for i in range(rounds)]


def unshaped(pairs: int, rounds: int) -> dict[str, Any]:
    ring: list[float] = []
    gloo: list[float] = []
    floor: list[float] = []
    paired: list[float] = []  # per pair: ring's median round over Gloo's (Gloo's moves between process groups)
    wrong = 0
    with tempfile.TemporaryDirectory() as d:
        path = fast_mesh(UNSHAPED_NODES, UNSHAPED_MBPS, Path(d) / "fast.toml")
        for i in range(pairs):
            [r] = run_case(Case(f"unshaped ring #{i}", path, "app", ["ring"], scale=1.0, rounds=rounds, warmup=1,
                                model=str(UNSHAPED_PARAMS)), views=False, keep_rounds=True)
            ring += r.round_times
            wrong += r.rounds_wrong
            g = gloo_rounds(UNSHAPED_NODES, UNSHAPED_PARAMS, rounds)
            gloo += g
            paired.append(statistics.median(r.round_times) / statistics.median(g))
            fl = floor_rounds(UNSHAPED_NODES, UNSHAPED_PARAMS, rounds)
            if fl is None:
                wrong += 1
            else:
                floor += fl
    return {"ring": ring, "gloo": gloo, "floor": floor, "paired": paired, "rounds_wrong": wrong}


# --- the report ----------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one pass of the capacity cases; the check's run")
    ap.add_argument("--parts", default="capacity,dense,micro,unshaped")
    ap.add_argument("--passes", type=int, default=None, help="passes of the capacity cases (default 3, --quick 1)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    passes = args.passes or (1 if args.quick else 3)
    t_start = time.time()
    tc_why = unavailable()
    if tc_why:
        print(f"tc backend unavailable: {tc_why}", file=sys.stderr)
    results: list[JobResult] = []
    valid: dict[str, list[bool]] = {"app": [], "tc": []}
    cpu_gb: list[float] = []
    if "capacity" in parts:
        for p in range(passes):
            for backend in ("app", "tc"):
                if backend == "tc" and tc_why:
                    continue
                got = capacity_pass(backend, N_QUICK[backend])
                results += got
                valid[backend].append(all(r.valid for r in got))
                if backend == "app":
                    gb = sum(r.gb for r in got)
                    cpu = sum(r.cpu_s + r.launcher_cpu_s for r in got)
                    cpu_gb.append(cpu / gb if gb else float("nan"))
                print(f"capacity pass {p + 1} ({backend}) done at {time.time() - t_start:.0f} s", file=sys.stderr)
    dense: list[JobResult] = []
    dense_ratio = None
    if "dense" in parts and not tc_why:
        dense, bound = dense_tc()
        results += dense
        pk = [r for r in dense if r.scheme == "packing"]
        dense_ratio = pk[0].round_s / bound if pk else None
        print(f"dense tc done at {time.time() - t_start:.0f} s (T_LP {bound:.3f} s)", file=sys.stderr)
    print_jobs(results)
    costs: dict[str, float] = {}
    if "micro" in parts:
        costs = dataplane()
        print("\ndata plane per hop: " + ", ".join(f"{k} {v * 1e6:.0f} us" if k.endswith("_s") else f"{k} {v}"
                                                   for k, v in costs.items()))
    un: dict[str, Any] = {}
    if "unshaped" in parts:
        un = unshaped(pairs=4 if args.quick else 6, rounds=4 if args.quick else 6)
        print(f"\nunshaped, {UNSHAPED_NODES} nodes, {UNSHAPED_PARAMS * 4 / 1e6:.0f} MB, delay 0: wansync ring "
              f"{spread(un['ring'])} s, Gloo all_reduce {spread(un['gloo'])} s, the least-Python ring (blocking "
              f"sockets, numpy adds, nothing else) {spread(un['floor'])} s (median [min, max] over rounds); "
              f"ring over Gloo pair by pair: {', '.join(f'{x:.2f}' for x in un['paired'])}")
    print(f"\ncapacity valid: app {valid['app']}, tc {valid['tc']}; CPU s per GB (app) {cpu_gb}")
    ratio = (statistics.median(un["ring"]) / statistics.median(un["gloo"])) if un else None
    floor_ratio = (statistics.median(un["floor"]) / statistics.median(un["gloo"])) if un and un["floor"] else None
    print(json.dumps({
        "valid_16_app": bool(valid["app"]) and all(valid["app"]),
        "valid_24_tc": bool(valid["tc"]) and all(valid["tc"]),
        "valid_16_app_passes": valid["app"], "valid_24_tc_passes": valid["tc"],
        "crew16_chunk_bytes": max((r.chunk_bytes for r in results if r.case == f"crew:{N_QUICK['app']}"
                                   and r.backend == "app"), default=None),
        "dense_tc_valid": bool(dense) and all(r.valid for r in dense),
        "dense_tc_packing_vs_lp": None if dense_ratio is None else round(dense_ratio, 3),
        "cpu_s_per_gb_app": round(statistics.median(cpu_gb), 2) if cpu_gb else None,
        "cpu_s_per_gb_app_spread": [round(min(cpu_gb), 2), round(max(cpu_gb), 2)] if cpu_gb else None,
        "us_per_chunk_hop": round(costs["hop_handling_s"] * 1e6, 1) if costs else None,
        "unshaped_ring_vs_gloo": None if ratio is None else round(ratio, 3),
        "unshaped_ring_vs_gloo_per_pair": [round(x, 3) for x in un["paired"]] if un else None,
        # the same ring in the least Python can do, over Gloo: how near to Gloo any Python data plane gets
        "python_floor_vs_gloo": None if floor_ratio is None else round(floor_ratio, 3),
        "rounds_wrong": sum(r.rounds_wrong for r in results) + un.get("rounds_wrong", 0),
        "all_links": ALL_LINKS,
        "seconds": round(time.time() - t_start, 1),
    }))


if __name__ == "__main__":
    main()
