"""A training script for tests/test_train_progress.py, run by `wansync train` on every rank: a small MLP
on random data in wt.Optimizer's model mode, recording per sync what this rank sent (its flat buffer)
and what came back (the result, members, weights), so the test computes every reference itself.

    recorded_train.py OUT_DIR STEPS [PACE_S]     rank r paces its steps to PACE_S * (1 + r) (stragglers)
"""

import os
import pickle
import sys
import time
from pathlib import Path

import torch

import wansync.torch as wt
from wansync.torch.channel import Channel
from wansync.torch.layout import Tensors

out, steps = Path(sys.argv[1]), int(sys.argv[2])
pace = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
rank = int(os.environ["RANK"])
torch.set_num_threads(1)
torch.manual_seed(rank)  # every rank differs: only the attach broadcast makes them start alike
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


records: list[dict] = []


class Recording:
    """The rank's channel (the Sync protocol), keeping a copy of every sync's input and outcome."""

    def __init__(self, inner: Channel) -> None:
        self.inner, self.rank, self.world, self.params = inner, inner.rank, inner.world, inner.params

    def buffer(self) -> torch.Tensor:
        return self.inner.buffer()

    def folder(self):
        return self.inner.folder()

    def allreduce(self) -> wt.Reduced:
        sent = self.inner.buffer().clone()
        r = self.inner.allreduce()
        records.append({"sent": sent.numpy(), "result": r.result.clone().numpy(), "members": list(r.members),
                        "weights": list(r.weights), "weight": r.weight})
        return r

    def log(self, **metrics: float) -> None:
        self.inner.log(**metrics)

    def close(self) -> None:
        self.inner.close()


sync = Recording(Channel.from_env(Tensors.of(model).layout))
opt = wt.Optimizer(torch.optim.SGD(model.parameters(), lr=0.05), model, mode="model", sync=sync)
g = torch.Generator().manual_seed(100 + rank)
for step in range(steps):
    t = time.perf_counter()
    x = torch.randn(16, 8, generator=g)
    loss = (model(x) - 1.0).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    time.sleep(max(0.0, pace * (1 + rank) - (time.perf_counter() - t)))
    opt.step()
    wt.log(step=step + 1, loss=loss.item())
with open(out / f"rank-{rank}.pkl", "wb") as fh:
    pickle.dump(records, fh)
