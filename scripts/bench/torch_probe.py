"""A training script's stand-in for scripts/bench/torchtrain.py, run by `wansync train` on every rank.

    sums OUT P STEPS      each step syncs seeded random values (rank r, step k); saves every result
                          to OUT/{scheme}-r{rank}.npy, so the benchmark checks them against its own float64 sum
    handoff OUT P STEPS   a model of P parameters through wansync.torch's layout, as wt.Optimizer's grad
                          mode does it: times the script's scaled copy into the shared buffer (folding the
                          check trailer in the same pass) and its taking the mean back (views of the
                          result: no copy), per step (OUT/h{rank}.json)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from wansync.torch import plane
from wansync.torch.layout import Tensors
from wansync.torch.optimizer import fill_grads


def values(rank: int, k: int, n: int) -> np.ndarray:
    return np.random.default_rng([rank, k, 7]).standard_normal(n).astype(np.float32) * (rank + 1)


def main() -> None:
    mode, out, n, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    if mode == "sums":
        params = torch.nn.Parameter(torch.zeros(n))
        tensors = Tensors.of(None, [params])
        sync = plane.attach(plane.connect(tensors.layout))
        got = []
        for k in range(steps):
            buf = sync.buffer()
            buf.zero_()
            buf[:n] = torch.from_numpy(values(rank, k, n))
            got.append(sync.allreduce().result[:n].numpy().copy())
        np.save(out / f"{os.environ.get('WANSYNC_SCHEME', 'run')}-r{rank}.npy", np.stack(got))
    else:
        params = torch.nn.Parameter(torch.zeros(n))
        params.grad = torch.randn(n)
        tensors = Tensors.of(None, [params])
        sync = plane.attach(plane.connect(tensors.layout))
        copy_in = copy_out = 0.0
        for _ in range(steps):
            t = time.perf_counter()
            fill_grads(tensors, sync.buffer(), sync.world, False, None, sync.folder())  # wt.Optimizer's grad mode
            copy_in += time.perf_counter() - t
            red = sync.allreduce()
            t = time.perf_counter()
            tensors.grads_from(red.result, sync.world / red.weight)
            copy_out += time.perf_counter() - t
        (out / f"h{rank}.json").write_text(json.dumps({"copy_in_s": copy_in, "copy_out_s": copy_out,
                                                      "steps": steps, "params": n}))
    sync.close()


if __name__ == "__main__":
    main()
