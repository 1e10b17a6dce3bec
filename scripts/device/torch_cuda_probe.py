"""A rank of the CUDA check (scripts/device/cuda_check.py): a model on the GPU, a few steps through
wansync.torch in one mode, its final parameters saved for the checker to compare with its own
reference. The model, the batches and the schedule are the checker's (`cuda_check.py`)."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_check import LR, STEPS, SYNC_EVERY, batch, device, make_model  # noqa: E402

import wansync.torch as wt  # noqa: E402

out, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
dev = device()
# a different seed per rank on purpose: the broadcast at attach must make rank 0's model the start
model = make_model(seed=rank, dtype=torch.bfloat16 if mode == "bf16" else torch.float32).to(dev)
if mode == "ddp":
    model = wt.ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
else:
    kind = "grad" if mode == "bf16" else mode
    opt = wt.Optimizer(torch.optim.SGD(model.parameters(), lr=LR), model, mode=kind,
                       sync_every=1 if kind == "grad" else SYNC_EVERY)
for k in range(STEPS):
    x, y = batch(rank, k, dev, next(model.parameters()).dtype)
    loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
state = (model.module if mode == "ddp" else model).state_dict()
torch.save({k: v.detach().float().cpu() for k, v in state.items()}, f"{out}/{mode}-r{rank}.pt")
